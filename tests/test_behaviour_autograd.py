"""Autograd hook behaviours on module outputs (test/test_autograd.py covers them in PyTorch),
torch.func, optimizer hooks and randomness, identical with and without a recording
open (the ``twice`` fixture).

The recorder puts its own gradient hook on module outputs (``backward="grad"``):
these tests are where that could show, with user hooks on the same tensors,
in-place changes after views, and function transforms.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import optimizer as optim_module

Twice = Callable[[Callable[[], Any]], Any]


class Clone(nn.Module):
    """Returns a new tensor with its own autograd node (a module boundary)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def test_tensor_hooks_before_and_after_an_in_place_change(twice: Twice) -> None:
    """A hook registered before an in-place op sees the gradient of the old version,
    one registered after sees the new version's."""

    def behaviour() -> Any:
        seen: list[torch.Tensor] = []
        a = torch.tensor([1.0], requires_grad=True)
        b = Clone()(a)

        def first(grad: torch.Tensor) -> torch.Tensor:
            seen.append(grad.clone())
            return grad * 2

        def second(grad: torch.Tensor) -> torch.Tensor:
            seen.append(grad.clone())
            return grad * 2

        b.register_hook(first)
        b.mul_(2)
        b.register_hook(second)
        b.sum().backward()
        return seen, a.grad

    seen, grad = twice(behaviour)
    assert [float(g) for g in seen] == [1.0, 4.0] and float(grad) == 8.0


def test_retain_grad_on_views_after_an_in_place_change(twice: Twice) -> None:
    def behaviour() -> Any:
        base = Clone()(torch.tensor([1.0, 2.0], requires_grad=True))
        view, other = base[:1], base[:1]
        view.retain_grad()
        other.retain_grad()
        view.mul_(2)
        (view + other).sum().backward()
        return view.grad, other.grad

    view_grad, other_grad = twice(behaviour)
    assert torch.equal(view_grad, other_grad) and torch.equal(view_grad, torch.tensor([1.0]))


def test_in_place_ops_on_views_of_module_outputs(twice: Twice) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(
            nn.Linear(4, 4),
            nn.ReLU(inplace=True),
            nn.Linear(4, 4),
            nn.ReLU(inplace=True),
            nn.Linear(4, 4),
        )
        x = torch.randn(3, 4, requires_grad=True)
        out = model(x)
        out[0].mul_(3)
        out.transpose(0, 1)[1].add_(1)
        out.sum().backward()
        return out, x.grad, [p.grad for p in model.parameters()]

    out, grad, _ = twice(behaviour)
    assert out.grad_fn is not None and grad is not None


def test_a_user_hook_on_a_module_output_changes_the_gradient(twice: Twice) -> None:
    def behaviour() -> Any:
        lin = nn.Linear(3, 3)
        x = torch.randn(2, 3, requires_grad=True)
        out = lin(x)
        out.register_hook(lambda grad: grad * 3)
        out.sum().backward()
        return x, x.grad, lin.weight.grad, lin.weight

    x, grad, weight_grad, weight = twice(behaviour)
    assert torch.allclose(weight_grad, 3 * torch.ones(3, 2) @ x.detach())
    assert torch.allclose(grad, 3 * torch.ones(2, 3) @ weight.detach())


def test_post_accumulate_grad_hooks_step_in_backward(twice: Twice) -> None:
    """The optimizer-in-backward pattern: each parameter updated as its gradient lands."""

    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
        optimizers = {p: torch.optim.SGD([p], lr=0.1) for p in model.parameters()}
        order: list[int] = []
        names = {p: i for i, p in enumerate(model.parameters())}

        def step(param: torch.Tensor) -> None:
            order.append(names[param])
            optimizers[param].step()
            optimizers[param].zero_grad()

        for param in model.parameters():
            param.register_post_accumulate_grad_hook(step)
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
        return order, [p.detach().clone() for p in model.parameters()]

    order, _ = twice(behaviour)
    assert sorted(order) == sorted(list(range(4)) * 2)


def test_node_hooks_and_tensor_hooks_order(twice: Twice) -> None:
    def behaviour() -> Any:
        order: list[str] = []
        x = torch.randn(3, requires_grad=True)
        out = Clone()(x * 2)
        assert out.grad_fn is not None
        out.grad_fn.register_prehook(lambda grad_outputs: order.append("node pre"))
        out.grad_fn.register_hook(lambda grad_inputs, grad_outputs: order.append("node post"))
        out.register_hook(lambda grad: order.append("tensor"))
        out.sum().backward()
        return order, x.grad

    order, _ = twice(behaviour)
    assert order == ["tensor", "node pre", "node post"]


def test_multi_grad_hooks_on_module_outputs(twice: Twice) -> None:
    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x * 3

    def behaviour() -> Any:
        seen: list[Any] = []
        x = torch.randn(3, requires_grad=True)
        a, b = Pair()(x)
        torch.autograd.graph.register_multi_grad_hook(
            (a, b), lambda grads: seen.append(["all", len(grads)])
        )
        torch.autograd.graph.register_multi_grad_hook(
            (a, b), lambda grad: seen.append(["any", grad.shape]), mode="any"
        )
        (a.sum() + b.sum()).backward()
        return seen, x.grad

    seen, grad = twice(behaviour)
    assert sorted(map(str, seen)) == sorted(map(str, [["all", 2], ["any", torch.Size([3])]]))
    assert torch.equal(grad, torch.full((3,), 5.0))


def test_saved_tensors_hooks_see_only_the_programs_tensors(twice: Twice) -> None:
    def behaviour() -> Any:
        packed: list[tuple[int, ...]] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            packed.append(tuple(tensor.shape))
            return tensor

        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        x = torch.randn(3, 4, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
        out.sum().backward()
        return packed, x.grad

    packed, _ = twice(behaviour)
    assert packed  # the recorder's statistics save nothing for backward


def test_functional_call_uses_the_given_tensors_only(twice: Twice) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        replaced = {k: torch.ones_like(v) for k, v in model.named_parameters()}
        x = torch.randn(4, 3)
        out = torch.func.functional_call(model, replaced, (x,))
        params_unchanged = all(torch.equal(v, before[k]) for k, v in model.named_parameters())
        try:
            torch.func.functional_call(model, {"nonexistent": torch.ones(1)}, (x,), strict=True)
            strict = ""
        except RuntimeError as exc:
            strict = str(exc)
        return out, params_unchanged, strict, model[0].weight is model._modules["0"].weight

    out, unchanged, strict, _ = twice(behaviour)
    assert unchanged and "nonexistent" in strict and out.shape == (4, 3)


def test_functional_call_with_tied_weights(twice: Twice) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encode = nn.Linear(3, 3, bias=False)
            self.decode = nn.Linear(3, 3, bias=False)
            self.decode.weight = self.encode.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.decode(self.encode(x))

    def behaviour() -> Any:
        model = Tied()
        x = torch.randn(2, 3)
        out = torch.func.functional_call(
            model, {"encode.weight": torch.eye(3) * 2}, (x,), tie_weights=True
        )
        return out, x

    out, x = twice(behaviour)
    assert torch.allclose(out, 4 * x)


def test_torch_func_grad_and_vmap_over_a_module(twice: Twice) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        params = {k: v.detach() for k, v in model.named_parameters()}
        x = torch.randn(5, 3)

        def loss(p: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(model, p, (inputs,)).pow(2).sum()

        grads = torch.func.grad(loss)(params, x)
        per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(
            params, x.unsqueeze(1)
        )
        model(x).pow(2).sum().backward()
        return grads, per_sample, {k: v.grad for k, v in model.named_parameters()}

    grads, per_sample, autograd = twice(behaviour)
    for key, value in grads.items():
        assert torch.allclose(value, autograd[key], atol=1e-6)
        assert torch.allclose(per_sample[key].sum(0), value, atol=1e-5)


def test_optimizer_hooks_order_and_replaced_arguments(twice: Twice) -> None:
    def behaviour() -> Any:
        order: list[str] = []
        lin = nn.Linear(2, 2)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        handles = [
            optim_module.register_optimizer_step_pre_hook(
                lambda o, a, k: order.append("global pre")
            ),
            optim_module.register_optimizer_step_post_hook(
                lambda o, a, k: order.append("global post")
            ),
            opt.register_step_pre_hook(lambda o, a, k: order.append("own pre")),
            opt.register_step_post_hook(lambda o, a, k: order.append("own post")),
        ]
        closure_calls: list[int] = []

        def closure() -> torch.Tensor:
            closure_calls.append(1)
            opt.zero_grad()
            loss = lin(torch.ones(1, 2)).sum()
            loss.backward()
            return loss

        def pass_closure(o: Any, args: Any, kwargs: Any) -> Any:
            return args, {"closure": closure}  # args hold the optimizer itself

        handles.append(opt.register_step_pre_hook(pass_closure))
        loss = opt.step()
        for handle in handles:
            handle.remove()
        return order, len(closure_calls), loss, lin.weight

    order, closures, loss, _ = twice(behaviour)
    assert (
        order == ["global pre", "own pre", "own post", "global post"]
        and closures == 1
        and loss is not None
    )


def test_dropout_and_random_init_draw_the_same_numbers(twice: Twice) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outs = []
        for _ in range(3):
            out = model(torch.randn(4, 8))
            out.sum().backward()
            opt.step()
            opt.zero_grad()
            outs.append(out)
        return outs, torch.get_rng_state(), [p.detach().clone() for p in model.parameters()]

    twice(behaviour)


def test_deepcopy_of_a_hooked_trained_model(twice: Twice) -> None:
    def behaviour() -> Any:
        fired: list[str] = []
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        model.register_forward_hook(lambda m, a, o: fired.append("hook"))
        model(torch.randn(4, 3)).sum().backward()
        twin = copy.deepcopy(model)
        x = torch.randn(4, 3)
        same = torch.equal(twin(x), model(x))
        return fired, same, [p.grad for p in twin.parameters()], twin.state_dict()

    fired, same, _, _ = twice(behaviour)
    assert fired == ["hook"] * 3 and same


_NO_FUNCTORCH_STATE = """
import sys
import torch
from torch import nn

calls = []
peek = torch._C._functorch.peek_interpreter_stack


def spy():
    calls.append(1)
    return peek()


torch._C._functorch.peek_interpreter_stack = spy  # before auditlog binds anything
import auditlog

for preset in ("minimal", "audit", "debug"):
    with auditlog.record(sys.argv[1] + "/" + preset, policy=preset):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            loss = nn.functional.mse_loss(model(torch.randn(5, 4)), torch.randn(5, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
print("peeks", len(calls))
"""


def test_recording_never_creates_functorch_state(tmp_path: Path) -> None:
    """The hooks tell a ``torch.func`` transform by its dispatch keys, never by
    ``peek_interpreter_stack``: that call creates the thread's functorch state, which
    the autograd engine then copies at every node of every later backward (the user's
    backward made dearer: docs/performance.md). Every preset, a whole training loop, in
    a fresh process with the call watched from before auditlog is imported."""
    done = subprocess.run(
        [sys.executable, "-c", _NO_FUNCTORCH_STATE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["peeks", "0"], done.stdout
