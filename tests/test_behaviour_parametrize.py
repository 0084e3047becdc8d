"""Parametrizations and parameter swapping (test/nn/test_parametrization.py covers them in
PyTorch), identical with and without a recording open (the ``twice`` fixture).

With ``torch.__future__.set_swap_module_params_on_conversion(True)`` torch writes
parameters through ``torch.utils.swap_tensors`` (registering a parametrization
with a right inverse, removing one with ``leave_parametrized=True``,
``load_state_dict``, ``Module.to``), which refuses a tensor with a weak
reference: each behaviour runs with swapping off and on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

Twice = Callable[[Callable[[], Any]], Any]
SWAP = pytest.mark.parametrize("swap", [False, True], ids=["assign", "swap"])


@contextmanager
def swap_flag(on: bool) -> Iterator[None]:
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(on)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


class Skew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lower = x.tril(-1)
        return lower - lower.T


class Cayley(nn.Module):
    """Skew-symmetric in, orthogonal out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(x.size(0), dtype=x.dtype)
        return torch.linalg.solve(eye + x, eye - x).contiguous()


class FirstRow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[[0]]


class ZeroFirst(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.new_zeros(1), x[1:]])


def _sgd_step(
    model: nn.Module, opt: torch.optim.Optimizer, loss: Callable[[], torch.Tensor]
) -> None:
    opt.zero_grad()
    loss().backward()
    opt.step()


@SWAP
def test_register_and_remove_parametrizations(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            model = nn.Linear(5, 5)
            weight_id, bias_id = id(model.weight), id(model.bias)
            initial = model.weight.detach().clone()
            facts: list[Any] = []
            try:
                parametrize.register_parametrization(model, "weight", FirstRow())
            except ValueError as exc:
                facts.append(str(exc).split(".")[0])
            parametrize.register_parametrization(model, "weight", FirstRow(), unsafe=True)
            facts.append(tuple(model.weight.shape))
            parametrize.remove_parametrizations(model, "weight", leave_parametrized=False)
            facts.append(
                (
                    id(model.weight) == weight_id,
                    torch.equal(model.weight, initial),
                    type(model).__name__,
                )
            )
            parametrize.register_parametrization(model, "weight", Skew())
            parametrize.register_parametrization(model, "weight", Cayley())
            parametrize.register_parametrization(model, "bias", ZeroFirst())
            facts.append(
                (
                    parametrize.is_parametrized(model),
                    "weight" in model._parameters,
                    len(list(model.parameters())),
                )
            )
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(2):
                _sgd_step(
                    model,
                    opt,
                    lambda: (model.weight.T @ model.bias).sum() + model(torch.randn(3, 5)).sum(),
                )
            orthogonal = model.weight.detach()
            parametrize.remove_parametrizations(model, "weight", leave_parametrized=True)
            parametrize.remove_parametrizations(model, "bias", leave_parametrized=False)
            facts.append(
                (id(model.weight) == weight_id, id(model.bias) == bias_id, type(model).__name__)
            )
            _sgd_step(model, opt, lambda: model(torch.randn(3, 5)).sum())
            return facts, orthogonal, model.weight, model.bias

    facts, orthogonal, _, _ = twice(behaviour)
    assert facts[0].startswith(
        "Registering a parametrization may not change the shape of the tensor"
    )
    assert facts[1] == (1, 5) and facts[2] == (True, True, "Linear")
    assert facts[3] == (True, False, 2) and facts[4] == (True, True, "Linear")
    assert torch.allclose(orthogonal.T @ orthogonal, torch.eye(5), atol=1e-5)


@SWAP
def test_nested_parametrization(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            model = nn.Linear(4, 4)
            parametrize.register_parametrization(model, "weight", Skew())
            inner = model.parametrizations.weight
            parametrize.register_parametrization(inner, "original", Skew())
            nested = inner.original.detach().clone()
            out = model(torch.randn(2, 4))
            parametrize.remove_parametrizations(inner, "original", leave_parametrized=False)
            parametrize.remove_parametrizations(model, "weight", leave_parametrized=False)
            return nested, out, type(inner).__name__, type(model).__name__

    nested, _, inner_class, outer_class = twice(behaviour)
    assert (
        torch.equal(nested, -nested.T)
        and inner_class == "ParametrizationList"
        and outer_class == "Linear"
    )


@SWAP
def test_buffer_parametrization(twice: Twice, swap: bool) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.arange(4.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    def behaviour() -> Any:
        with swap_flag(swap):
            model = Scaled()
            parametrize.register_parametrization(model, "scale", ZeroFirst())
            parametrized = model.scale.clone()
            original_is_buffer = "original" in model.parametrizations.scale._buffers
            out = model(torch.ones(4))
            parametrize.remove_parametrizations(model, "scale", leave_parametrized=True)
            return parametrized, original_is_buffer, out, model.scale, sorted(model.state_dict())

    parametrized, original_is_buffer, _, _, keys = twice(behaviour)
    assert parametrized[0] == 0 and original_is_buffer and keys == ["scale"]


def test_cached_parametrization_is_computed_once(twice: Twice) -> None:
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x * 2

    def behaviour() -> Any:
        model = nn.Linear(3, 3)
        counting = Counting()
        parametrize.register_parametrization(model, "weight", counting)
        x = torch.randn(2, 3)
        registered = counting.calls  # registration checks the parametrization once
        with parametrize.cached():
            out = model(x) + model(x)
            inside = counting.calls - registered
        model(x)
        return inside, counting.calls - registered, out

    inside, total, _ = twice(behaviour)
    assert inside == 1 and total == 2


@SWAP
def test_weight_norm_trains_and_round_trips(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
            parametrizations.weight_norm(model[0])
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            for _ in range(3):
                _sgd_step(model, opt, lambda: model(torch.randn(5, 4)).pow(2).mean())
            state = model.state_dict()
            fresh = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
            parametrizations.weight_norm(fresh[0])
            g = fresh[0].parametrizations.weight.original0
            fresh.load_state_dict(state)
            x = torch.randn(2, 4)
            return (
                sorted(state),
                fresh[0].parametrizations.weight.original0 is g,
                model(x),
                fresh(x),
            )

    keys, same_object, a, b = twice(behaviour)
    assert "0.parametrizations.weight.original0" in keys and same_object and torch.equal(a, b)


@SWAP
def test_orthogonal_trains_loads_and_moves(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            model = nn.Linear(4, 4)
            parametrizations.orthogonal(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                _sgd_step(model, opt, lambda: model(torch.randn(3, 4)).sum())
            q = model.weight.detach().clone()
            other = nn.Linear(4, 4)
            parametrizations.orthogonal(other)
            other.load_state_dict(model.state_dict())
            original = model.parametrizations.weight.original
            model.to(torch.float64)
            moved = (model.parametrizations.weight.original is original, original.dtype)
            return q, other.weight, moved, model(torch.randn(2, 4, dtype=torch.float64))

    q, loaded, moved, _ = twice(behaviour)
    assert torch.allclose(q.T @ q, torch.eye(4), atol=1e-5) and torch.allclose(loaded, q, atol=1e-6)
    assert moved == (True, torch.float64)


def test_spectral_norm_updates_its_vectors_only_in_training(twice: Twice) -> None:
    def behaviour() -> Any:
        model = parametrizations.spectral_norm(nn.Linear(5, 5))
        plist = model.parametrizations.weight
        u0 = plist[0]._u.clone()
        model(torch.randn(2, 5))
        u_train = plist[0]._u.clone()
        model.eval()
        model(torch.randn(2, 5))
        u_eval = plist[0]._u.clone()
        sigma = torch.linalg.matrix_norm(model.weight.detach(), ord=2)
        return (
            torch.equal(u0, u_train),
            torch.equal(u_train, u_eval),
            sigma,
            sorted(model.state_dict()),
        )

    trained_same, eval_same, sigma, keys = twice(behaviour)
    assert not trained_same and eval_same and abs(float(sigma) - 1.0) < 0.1
    assert "parametrizations.weight.0._u" in keys


@SWAP
def test_module_to_keeps_parameter_objects_and_gradients(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
            weight = model[0].weight
            model(torch.randn(4, 3)).sum().backward()
            grad = weight.grad.clone()
            model.to(torch.float64)
            return (
                model[0].weight is weight,
                weight.dtype,
                weight.grad,
                grad,
                model[1].running_mean.dtype,
            )

    same, dtype, moved_grad, grad, buffer_dtype = twice(behaviour)
    assert same and dtype == buffer_dtype == torch.float64
    assert moved_grad.dtype == torch.float64 and torch.equal(moved_grad.float(), grad)


@SWAP
def test_load_state_dict_with_assign(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            target = nn.Linear(3, 3)
            source = nn.Linear(3, 3).double()
            weight = target.weight
            target.load_state_dict(source.state_dict(), assign=True)
            return (
                target.weight is weight,
                target.weight.dtype,
                isinstance(target.weight, nn.Parameter),
                target.weight,
            )

    same, dtype, is_parameter, _ = twice(behaviour)
    assert dtype == torch.float64 and is_parameter and same == swap


def test_a_traceable_subclass_is_swapped_in_without_the_flag(twice: Twice) -> None:
    """Module._apply swaps whenever the new value is a traceable wrapper subclass
    (DTensor is one): sharded models swap parameters with no flag set."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")

    def wrap(t: torch.Tensor) -> torch.Tensor:
        plain = t.detach()
        return two_tensor.TwoTensor(plain, plain.clone())  # type: ignore[no-any-return]

    def behaviour() -> Any:
        with swap_flag(False):
            model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
            model(torch.randn(3, 2))
            weight = model[0].weight
            model._apply(wrap)
            return (
                model[0].weight is weight,
                type(weight).__name__,
                isinstance(weight, nn.Parameter),
            )

    assert twice(behaviour) == (True, "TwoTensor", True)
