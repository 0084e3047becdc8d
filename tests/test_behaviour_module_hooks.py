"""Module hook behaviours PyTorch guarantees (test/nn/test_module_hooks.py covers them there),
identical with and without a recording open (the ``twice`` fixture: tests/behaviour_support.py).

Our own tests of the same user-visible behaviours: firing order with ``prepend``,
kwargs hooks, ``always_call``, hooks that replace values, state-dict hooks with
and without parameter swapping, global hooks next to the recorder's own, and the
values registration hooks return.
"""

from __future__ import annotations

import gc
import pickle
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

Twice = Callable[[Callable[[], Any]], Any]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
        self.second = nn.Sequential(nn.Linear(6, 6), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@contextmanager
def swap_flag(on: bool) -> Iterator[None]:
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(on)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def _order(
    register: str, where: Callable[[Stack], nn.Module], pattern: list[bool], backward: bool
) -> Any:
    fired: list[int] = []
    model = Stack()
    target = where(model)
    for number, prepend in enumerate(pattern):
        getattr(target, register)(lambda *args, n=number: fired.append(n), prepend=prepend)
    x = torch.randn(3, 6, requires_grad=True)
    out = model(x)
    after_forward = list(fired)
    out.sum().backward()
    after_backward = list(fired)
    model(x).sum().backward()
    return {
        "after_forward": after_forward,
        "after_backward": after_backward,
        "all": fired,
        "grad": x.grad,
    }


def test_forward_hooks_fire_in_prepend_order(twice: Twice) -> None:
    out = twice(
        lambda: _order(
            "register_forward_hook", lambda m: m.a.second, [False, True, False, False, True], False
        )
    )
    assert out["after_forward"] == [4, 1, 0, 2, 3] and out["all"] == [4, 1, 0, 2, 3] * 2


def test_forward_pre_hooks_fire_in_prepend_order(twice: Twice) -> None:
    out = twice(
        lambda: _order(
            "register_forward_pre_hook",
            lambda m: m.b.first,
            [True, False, False, False, True],
            False,
        )
    )
    assert out["after_forward"] == [4, 0, 1, 2, 3]


def test_full_backward_hooks_fire_in_prepend_order(twice: Twice) -> None:
    out = twice(
        lambda: _order(
            "register_full_backward_hook", lambda m: m.a, [False, False, False, True, True], True
        )
    )
    assert out["after_forward"] == [] and out["after_backward"] == [4, 3, 0, 1, 2]


def test_full_backward_pre_hooks_fire_in_prepend_order(twice: Twice) -> None:
    out = twice(
        lambda: _order(
            "register_full_backward_pre_hook",
            lambda m: m.a,
            [True, True, False, False, False],
            True,
        )
    )
    assert out["after_backward"] == [1, 0, 2, 3, 4]


def test_backward_pre_hook_replaces_the_gradient(twice: Twice) -> None:
    def behaviour() -> Any:
        lin = nn.Linear(3, 3)
        lin.register_full_backward_pre_hook(lambda m, grad_output: (grad_output[0] * 0,))
        x = torch.ones(2, 3, requires_grad=True)
        lin(x).sum().backward()
        return x.grad, lin.weight.grad

    grad, weight_grad = twice(behaviour)
    assert torch.equal(grad, torch.zeros(2, 3)) and torch.equal(weight_grad, torch.zeros(3, 3))


def test_mixed_hooks_fire_in_phase_order(twice: Twice) -> None:
    def behaviour() -> Any:
        fired: list[str] = []
        model = Stack()
        model.register_forward_pre_hook(lambda m, a: fired.append("pre"))
        model.register_forward_hook(lambda m, a, o: fired.append("forward"))
        model.register_full_backward_pre_hook(lambda m, g: fired.append("backward_pre"))
        model.register_full_backward_hook(lambda m, gi, go: fired.append("backward"))
        model(torch.randn(2, 6, requires_grad=True)).sum().backward()
        return fired

    assert twice(behaviour) == ["pre", "forward", "backward_pre", "backward"]


class WithBias(nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return x if bias is None else x + bias


def test_kwargs_hooks_change_arguments_and_output(twice: Twice) -> None:
    def behaviour() -> Any:
        model = WithBias()

        def pre(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
            return args, {"bias": kwargs["bias"] * 2}

        def post(
            module: nn.Module, args: Any, kwargs: dict[str, Any], out: torch.Tensor
        ) -> torch.Tensor:
            return out + kwargs["bias"]

        x, bias = torch.ones(2, 2), torch.ones(2, 2)
        pre_handle = model.register_forward_pre_hook(pre, with_kwargs=True)
        post_handle = model.register_forward_hook(post, with_kwargs=True)
        both = model(x, bias=bias)
        post_handle.remove()
        only_pre = model(x, bias=bias)
        pre_handle.remove()
        none = model(x, bias=bias)
        left = (
            post_handle.id in model._forward_hooks_with_kwargs,
            pre_handle.id in model._forward_pre_hooks_with_kwargs,
        )
        return both, only_pre, none, left

    both, only_pre, none, left = twice(behaviour)
    assert torch.equal(both, torch.full((2, 2), 5.0)) and torch.equal(
        only_pre, torch.full((2, 2), 3.0)
    )
    assert torch.equal(none, torch.full((2, 2), 2.0)) and left == (False, False)


class FailsOnRequest(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, fail: bool = True) -> torch.Tensor:
        if fail:
            raise RuntimeError("forward failed")
        return self.inner(x)


def test_always_called_forward_hooks(twice: Twice) -> None:
    """Module and global always_call hooks run when forward or a pre hook raises, once,
    and the first error is the one raised. The recorder's own forward hook is an
    always_call hook too: a recording adds exactly one entry to torch's global
    always-called table while its per-call hooks are present (docs/hooks.md), so
    this test counts entries relative to what it found."""

    def behaviour() -> Any:
        log: list[str] = []
        model = FailsOnRequest()
        errors: list[str] = []
        x = torch.ones(1, 2)

        def attempt(**kwargs: Any) -> None:
            try:
                model(x, **kwargs)
            except RuntimeError as exc:
                errors.append(str(exc))

        pre = model.register_forward_pre_hook(lambda m, a: log.append("enter"))
        post = model.register_forward_hook(lambda m, a, o: log.append("exit"), always_call=True)
        attempt()
        attempt(fail=False)
        pre.remove()

        def failing_pre(m: nn.Module, a: Any) -> None:
            log.append("enter")
            raise RuntimeError("pre hook failed")

        model.register_forward_pre_hook(failing_pre)
        attempt(fail=False)

        def throwing(m: nn.Module, a: Any, o: Any) -> None:
            raise RuntimeError("always hook failed")

        thrower = model.register_forward_hook(throwing, prepend=True, always_call=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            attempt(fail=False)
        silenced = [str(w.message) for w in caught]
        post.remove()
        thrower.remove()
        local_left = len(model._forward_hooks_always_called)
        table = nn_module._global_forward_hooks_always_called
        before = len(table)
        handle = nn_module.register_module_forward_hook(
            lambda m, a, o: log.append("global exit"), always_call=True
        )
        added = len(table) - before
        attempt(fail=False)
        handle.remove()
        removed = before - len(table)
        attempt()
        return log, errors, silenced, local_left, added, removed

    log, errors, silenced, local_left, added, removed = twice(behaviour)
    # the first error is the one raised; an always_call hook runs once per call,
    # also when forward, a pre hook or another always_call hook raised
    assert errors == ["forward failed"] + ["pre hook failed"] * 4
    assert log == ["enter", "exit"] * 4 + ["enter", "global exit", "enter"]
    assert len(silenced) == 1 and "always hook failed" in silenced[0]
    assert (local_left, added, removed) == (0, 1, 0)


def test_backward_hooks_warn_for_a_dict_output(twice: Twice) -> None:
    class DictOut(nn.Module):
        def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {"y": torch.softmax(inputs["x"], dim=0)}

    def behaviour() -> Any:
        counts = {"forward": 0, "backward": 0}
        model = DictOut()
        model.register_forward_pre_hook(
            lambda m, a: counts.__setitem__("forward", counts["forward"] + 1)
        )
        model.register_full_backward_hook(
            lambda m, gi, go: counts.__setitem__("backward", counts["backward"] + 1)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model({"x": torch.ones(2, requires_grad=True)})["y"].sum().backward()
        return counts, [str(w.message) for w in caught if "Tensor or a tuple" in str(w.message)]

    counts, messages = twice(behaviour)
    assert counts == {"forward": 1, "backward": 0} and len(messages) == 1


def _two_linears() -> tuple[nn.Linear, dict[str, torch.Tensor]]:
    source = nn.Linear(4, 4)
    return nn.Linear(4, 4), source.state_dict()


@pytest.mark.parametrize("swap", [False, True])
def test_load_state_dict_pre_hooks(twice: Twice, swap: bool) -> None:
    def behaviour() -> Any:
        with swap_flag(swap):
            target, state = _two_linears()
            weight = target.weight
            calls: list[str] = []
            target._register_load_state_dict_pre_hook(
                lambda sd, prefix, *rest: calls.append(f"plain:{sorted(sd)}")
            )
            target._register_load_state_dict_pre_hook(
                lambda module, sd, prefix, *rest: calls.append(f"module:{module is target}"), True
            )
            target.register_load_state_dict_pre_hook(
                lambda module, sd, *rest: calls.append("public")
            )
            target.load_state_dict(state)
            return calls, target.weight is weight, target.weight, target.weight.dtype

    calls, same_object, _, _ = twice(behaviour)
    assert calls == ["plain:['bias', 'weight']", "module:True", "public"] and same_object


@pytest.mark.parametrize("swap", [False, True])
def test_load_state_dict_post_hook_edits_incompatible_keys(twice: Twice, swap: bool) -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.foo = nn.Parameter(torch.rand(5))

    def behaviour() -> Any:
        with swap_flag(swap):
            nested = Holder()
            wrapped = nn.ModuleList([nested])

            def add_keys(module: nn.Module, keys: Any) -> None:
                keys.missing_keys.append("foo")
                keys.unexpected_keys.append("bar")

            handle = nested.register_load_state_dict_post_hook(add_keys)
            loose = wrapped.load_state_dict(wrapped.state_dict(), strict=False)
            try:
                wrapped.load_state_dict(wrapped.state_dict(), strict=True)
                strict_error = ""
            except RuntimeError as exc:
                strict_error = str(exc)
            handle.remove()

            def clear_keys(module: nn.Module, keys: Any) -> None:
                keys.missing_keys.clear()
                keys.unexpected_keys.clear()

            nested.register_load_state_dict_post_hook(clear_keys)
            extra = wrapped.state_dict()
            extra["extra"] = torch.ones(1)
            cleared = wrapped.load_state_dict(extra, strict=True)
            return (
                (loose.missing_keys, loose.unexpected_keys),
                strict_error,
                (cleared.missing_keys, cleared.unexpected_keys),
            )

    loose, strict_error, cleared = twice(behaviour)
    assert loose == (["foo"], ["bar"]) and "foo" in strict_error and "bar" in strict_error
    assert cleared == ([], [])


def test_state_dict_pre_and_post_hooks(twice: Twice) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        seen: list[str] = []
        model[1].register_state_dict_pre_hook(
            lambda module, prefix, keep_vars: seen.append(f"pre:{prefix}")
        )

        def post(
            module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any
        ) -> None:
            state[prefix + "note"] = torch.tensor(7)

        model[1].register_state_dict_post_hook(post)
        state = model.state_dict()
        return seen, sorted(state), state["1.note"]

    seen, keys, note = twice(behaviour)
    assert seen == ["pre:1."] and "1.note" in keys and int(note) == 7


def test_a_hooked_module_is_freed_without_the_garbage_collector(twice: Twice) -> None:
    def noop(*args: Any) -> None:
        return None

    def behaviour() -> Any:
        gc.disable()
        try:
            lin = nn.Linear(3, 3)
            lin._register_load_state_dict_pre_hook(noop, True)
            lin(torch.randn(1, 3))
            ref = weakref.ref(lin)
            del lin
            return ref() is None
        finally:
            gc.enable()

    assert twice(behaviour) is True


def _pickle_hook(*args: Any) -> None:
    return None


def test_a_module_with_hooks_pickles(twice: Twice) -> None:
    def behaviour() -> Any:
        lin = nn.Linear(3, 3)
        lin._register_load_state_dict_pre_hook(_pickle_hook, True)
        lin.register_forward_hook(_pickle_hook)
        copy = pickle.loads(pickle.dumps(lin))
        return copy.weight, len(copy._forward_hooks)

    weight, hooks = twice(behaviour)
    assert hooks == 1 and weight.shape == (3, 3)


def test_global_hooks_count_calls_beside_the_recorder(twice: Twice) -> None:
    def behaviour() -> Any:
        counter = {"forward": 0, "backward": 0}
        modules = [nn.Sigmoid() for _ in range(3)]
        x = torch.ones(5, 5, requires_grad=True)

        def forward_hook(step: int) -> Callable[..., None]:
            return lambda m, i, o: counter.__setitem__("forward", counter["forward"] + step)

        def backward_hook(step: int) -> Callable[..., None]:
            return lambda m, gi, go: counter.__setitem__("backward", counter["backward"] + step)

        history = []
        first_forward = nn_module.register_module_forward_hook(forward_hook(1))
        for m in modules:
            m(x)
        first_backward = nn_module.register_module_backward_hook(backward_hook(1))
        outs = [m(x) for m in modules]
        for out in outs:
            out.backward(torch.ones(5, 5) * 2, retain_graph=True)
        history.append(dict(counter))
        second_forward = nn_module.register_module_forward_hook(forward_hook(2))
        second_backward = nn_module.register_module_backward_hook(backward_hook(2))
        modules[0](x).backward(torch.ones(5, 5))
        history.append(dict(counter))
        second_backward.remove()
        second_forward.remove()
        modules[1](x).backward(torch.ones(5, 5))
        history.append(dict(counter))
        first_forward.remove()
        first_backward.remove()
        nn_module._global_is_full_backward_hook = (
            None  # torch never resets it (tests leave it as found)
        )
        return history, x.grad

    history, _ = twice(behaviour)
    assert history == [
        {"forward": 6, "backward": 3},
        {"forward": 9, "backward": 6},
        {"forward": 10, "backward": 7},
    ]


def test_global_backward_hook_invalid_outputs_raise(twice: Twice) -> None:
    def behaviour() -> Any:
        module = nn.Sigmoid()
        x = torch.randn(5, 5, requires_grad=True)
        errors = []
        for bad in (lambda m, gi, go: gi[:-1], lambda m, gi, go: (*gi, torch.randn(2, 2))):
            with nn_module.register_module_backward_hook(bad):
                try:
                    module(x).sum().backward()
                except RuntimeError as exc:
                    errors.append(str(exc).split(":")[-1].strip())
        nn_module._global_is_full_backward_hook = None
        return errors

    errors = twice(behaviour)
    assert (
        len(errors) == 2
        and "got 0, but expected 1" in errors[0]
        and "got 2, but expected 1" in errors[1]
    )


def test_global_hooks_replace_values(twice: Twice) -> None:
    def behaviour() -> Any:
        module = nn.Sigmoid()
        x = torch.randn(5, 5, requires_grad=True)
        handles = [
            nn_module.register_module_forward_pre_hook(lambda m, a: torch.relu(a[0])),
            nn_module.register_module_forward_hook(lambda m, a, o: -o),
            nn_module.register_module_backward_hook(lambda m, gi, go: tuple(g * 2 for g in gi)),
        ]
        try:
            out = module(x)
            out.backward(torch.ones(5, 5))
            return out, x.grad
        finally:
            for handle in handles:
                handle.remove()
            nn_module._global_is_full_backward_hook = None

    out, grad = twice(behaviour)
    assert (out <= 0).all() and grad is not None


def test_hooks_removing_themselves_while_called(twice: Twice) -> None:
    def behaviour() -> Any:
        module = nn.Sigmoid()
        handles: list[Any] = []
        handles.append(module.register_forward_pre_hook(lambda m, a: handles[0].remove()))
        handles.append(module.register_forward_pre_hook(lambda m, a: handles[1].remove()))
        handles.append(module.register_forward_hook(lambda m, a, o: handles[2].remove()))
        sizes = [len(h.hooks_dict_ref()) for h in handles]
        x = torch.randn(2, 2)
        out = module(x)
        return sizes, [len(h.hooks_dict_ref()) for h in handles], torch.equal(out, torch.sigmoid(x))

    sizes, after, same = twice(behaviour)
    assert sizes == [2, 2, 1] and after == [0, 0, 0] and same


def test_global_hooks_run_before_module_hooks(twice: Twice) -> None:
    def behaviour() -> Any:
        order: list[str] = []
        module = nn.Sigmoid()
        handles = [
            nn_module.register_module_forward_pre_hook(lambda m, a: order.append("global pre")),
            module.register_forward_pre_hook(lambda m, a: order.append("local pre")),
            nn_module.register_module_forward_hook(lambda m, a, o: order.append("global post")),
            module.register_forward_hook(lambda m, a, o: order.append("local post")),
        ]
        module(torch.randn(2, 2))
        for handle in handles:
            handle.remove()
        return order

    assert twice(behaviour) == ["global pre", "local pre", "global post", "local post"]


def test_module_backward_hooks_refuse_in_place_changes(twice: Twice) -> None:
    class KeepsInput(nn.Module):
        def forward(self, inp: torch.Tensor, in_place: bool) -> torch.Tensor:
            self.inp = inp
            if in_place:
                inp += 1
            return inp.clone()

    def behaviour() -> Any:
        messages: list[str] = []
        module = KeepsInput()
        x = torch.rand(4, requires_grad=True)

        def attempt(action: Callable[[], Any]) -> None:
            try:
                action()
                messages.append("ok")
            except RuntimeError as exc:
                messages.append(str(exc).split(".")[0])

        with module.register_full_backward_hook(lambda m, gi, go: None):
            attempt(lambda: module(x, False).sum().backward())
            attempt(lambda: module(x.clone(), True))
            local = x.clone()
            module(local, False)
            local[0] *= 1
            attempt(lambda: module.inp + 2)
            out = module(x, False)

            def add_in_place() -> None:
                out.add_(1)

            attempt(add_in_place)
        return messages

    messages = twice(behaviour)
    assert messages[0] == "ok" and len(messages) == 4
    assert all(m.startswith("Output 0 of BackwardHookFunction is a view") for m in messages[1:])


def test_full_backward_hook_sees_none_for_inputs_without_grad(twice: Twice) -> None:
    def behaviour() -> Any:
        lin = nn.Linear(2, 3)
        seen: list[Any] = []
        mode = {"return": None}

        def hook(m: nn.Module, grad_input: Any, grad_output: Any) -> Any:
            seen.append(([g is None for g in grad_input], [tuple(g.shape) for g in grad_output]))
            return grad_input if mode["return"] == "same" else None

        lin.register_full_backward_hook(hook)
        x = torch.rand(1, 2)
        lin(x).sum().backward()
        mode["return"] = "same"
        lin(x).sum().backward()
        return seen, lin.weight.grad

    seen, _ = twice(behaviour)
    assert seen == [([True], [(1, 3)])] * 2


@pytest.mark.parametrize("returns", [False, True])
def test_registration_hooks_see_and_may_return_members(twice: Twice, returns: bool) -> None:
    """User registration hooks run after the recorder's, see every member and may
    return it (or None); a returned replacement is what the module holds."""

    def behaviour() -> Any:
        seen: list[str] = []
        replacements: list[nn.Parameter] = []

        def on_parameter(module: nn.Module, name: str, param: Any) -> Any:
            seen.append(f"parameter {name}")
            if name == "weight" and isinstance(module, nn.Linear) and returns:
                replacements.append(nn.Parameter(param.detach().clone()))
                return replacements[-1]
            return param if returns else None

        def on_buffer(module: nn.Module, name: str, buffer: Any) -> Any:
            seen.append(f"buffer {name}")
            return buffer if returns else None

        def on_module(module: nn.Module, name: str, child: Any) -> Any:
            seen.append(f"module {name}")
            return child if returns else None

        handles = [
            nn_module.register_module_parameter_registration_hook(on_parameter),
            nn_module.register_module_buffer_registration_hook(on_buffer),
            nn_module.register_module_module_registration_hook(on_module),
        ]
        try:
            model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
            model.register_parameter("nothing", None)
            model.register_buffer("scratch", torch.zeros(1), persistent=False)
        finally:
            for handle in handles:
                handle.remove()
        out = model(torch.randn(4, 2))
        replaced = bool(replacements) and model[0].weight is replacements[0]
        return seen, replaced, sorted(model.state_dict()), out, model[0].weight

    seen, replaced, keys, _, _ = twice(behaviour)
    # hooks do not see None members (register_parameter(name, None))
    assert seen == [
        "parameter weight", "parameter bias", "parameter weight", "parameter bias",
        "buffer running_mean", "buffer running_var", "buffer num_batches_tracked",
        "module 0", "module 1", "buffer scratch",
    ]  # fmt: skip
    assert "scratch" not in keys and "nothing" not in keys
    assert replaced == returns
