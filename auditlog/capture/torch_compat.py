"""Every private PyTorch internal auditlog touches, in one place.

Public hook APIs cover registration, calls and optimizer steps, but not all the
facts a faithful record needs (whether a buffer is persistent, which kind of
global backward hook torch thinks is installed, the module torch.compile
wrapped). Each such access is a function here, with the torch versions it was
checked against, so that a torch upgrade breaks one module, loudly
(``tests/test_torch_compat.py`` fails naming the torch version), instead of
silently recording less.

Checked against torch 2.4 through 2.13 (CPU builds; 2.13 also with CUDA).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.autograd import forward_ad as _forward_ad
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils import _python_dispatch

from auditlog.capture.flopkeys import flop_key as _flop_key

F = TypeVar("F", bound=Callable[..., Any])
_Tensors = tuple[torch.Tensor, ...] | list[torch.Tensor]

_is_compiling = torch.compiler.is_compiling


def compile_guard(hook: F) -> F:
    """Make a hook record nothing while dynamo traces it (torch.compile).

    Dynamo traces global hooks inline; anything a hook does then would be
    compiled into the user's graph or break it. ``torch.compiler.is_compiling``
    is public; the compiled graph still fires the hooks of the eager wrapper.
    """

    @functools.wraps(hook)
    def guarded(*args: Any) -> None:
        if _is_compiling():
            return None
        return hook(*args)  # type: ignore[no-any-return]

    return guarded  # type: ignore[return-value]


_functorch_active = torch._C._are_functorch_transforms_active


def call_guard(hook: F) -> F:
    """``compile_guard``, and record nothing while a ``torch.func`` transform runs.

    Inside ``torch.func.grad``/``vmap``/``jacrev`` a module's calls see wrapped
    tensors (``functional_call`` puts them in the module itself): reading their
    values fails under vmap ("calling .item() on a Tensor"), and they are
    transient values of the transform, not the model's. The check is
    ``torch._C._are_functorch_transforms_active()`` (the transforms' dispatch keys
    in this thread's included set; torch 2.0-2.13, what ``torch.autograd.backward``
    itself asks), cheap enough for every call. Not
    ``torch._C._functorch.peek_interpreter_stack()``: its first call creates this
    thread's functorch state, and from then on the autograd engine deep-copies that
    state at each of its thread-local-state switches, in every backward of the
    user's program (~19 K instructions a step on the fast MLP, more the larger the
    graph: docs/performance.md).
    """

    @functools.wraps(hook)
    def guarded(*args: Any) -> None:
        if _is_compiling() or _functorch_active():
            return None
        return hook(*args)  # type: ignore[no-any-return]

    return guarded  # type: ignore[return-value]


def dynamo_frames_compiled() -> int:
    """Frames ``torch.compile`` (dynamo) has compiled in this process so far: its own
    counter (``torch._dynamo.utils.counters["frames"]["ok"]``, torch 2.0-2.13), read
    without adding a key to it; 0 while dynamo was never imported (asking never imports
    it) or where the counter is not found (best effort: a fact for the record, not a check)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        frames = utils.counters.get("frames") if utils is not None else None
        return int(frames.get("ok", 0)) if frames else 0
    except Exception:
        return 0


def in_transform_or_compile() -> bool:  # call_guard's test, for wrappers that must call through
    return bool(_is_compiling() or _functorch_active())


# --------------------------------------------------------------------------- torch.compile
def skip_guards_at_frame_level() -> None:
    """Have dynamo run the hook guards above as plain Python when it meets them as frames.

    The ``OptimizedModule`` wrapper's own ``_call_impl`` runs our global hooks with
    dynamo's frame callback set: the guard was one more compiled frame (no graph)
    than in the unrecorded run. A recursive skip (``set_code_exec_strategy``, what
    ``skip_code`` does for one frame; torch 2.4-2.13) leaves the guard and all it
    calls alone; tracing that inlines a hook still folds it to ``return None``.
    Called at the first compiled module, so that recording never imports dynamo.
    """
    types = _dynamo().types
    skip = types.FrameExecStrategy(types.FrameAction.SKIP, types.FrameAction.SKIP)
    for guard in (compile_guard, call_guard):
        for const in guard.__code__.co_consts:
            if isinstance(const, type(guard.__code__)) and const.co_name == "guarded":
                _dynamo().eval_frame.set_code_exec_strategy(const, skip)


def unwrap_compiled(module: torch.nn.Module) -> torch.nn.Module:
    """The user's module behind ``torch.compile``'s ``OptimizedModule`` wrapper (``_orig_mod``;
    torch 2.0-2.13), so that a compiled model's calls count once, as the model's."""
    if type(module).__name__ == "OptimizedModule":
        return module._orig_mod  # type: ignore[return-value]
    return module


def is_compiled_wrapper(module: torch.nn.Module) -> bool:
    """Is this torch.compile's ``OptimizedModule`` (not part of the model's structure)?"""
    return type(module).__name__ == "OptimizedModule"


def compiled_modules(root: torch.nn.Module, limit: int = 8) -> list[str]:
    """Qualified names (``""``: the root) of the modules under ``root`` that are an
    ``OptimizedModule``, were compiled in place (``Module.compile()``:
    ``_compiled_call_impl``, torch 2.2-2.13) or have a compiled ``forward``
    (``_torchdynamo_orig_callable``, torch 2.0-2.13); at most ``limit``. A compiled
    function that ``forward`` calls cannot be seen here (``flop_counting_mode``)."""
    found: list[str] = []
    for name, module in root.named_modules(remove_duplicate=True):
        forward = getattr(module, "forward", None)
        if (
            is_compiled_wrapper(module)
            or getattr(module, "_compiled_call_impl", None) is not None
            or getattr(forward, "_torchdynamo_orig_callable", None) is not None
        ):
            found.append(name)
            if len(found) >= limit:
                break
    return found


# --------------------------------------------------------------------------- sharded tensors
def is_dtensor(tensor: torch.Tensor) -> bool:
    """Is this a ``torch.distributed.tensor.DTensor`` (FSDP2, tensor parallel)? By class name and
    the public attributes, so that checking imports nothing."""
    return (
        type(tensor).__name__ == "DTensor"
        and hasattr(tensor, "to_local")
        and hasattr(tensor, "placements")
    )


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def local_view(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor the recorder reads for ``tensor``: statistics, norms, copies and
    hashes work on this, and never run a tensor subclass's own code.

    - a plain tensor or Parameter: itself; a DTensor: its local shard (``to_local()``,
      no communication: a reduction would start collectives from a hook);
    - a traceable wrapper subclass (``__tensor_flatten__``: TwoTensor, Float8-like):
      its first inner tensor, flattened again while a wrapper (``subclass_parts``
      has all). Its own ``__torch_dispatch__`` may call back into module code (a
      RecursionError, measured on PyTorch's own parametrization tests);
    - any other subclass: the same memory as a plain ``Tensor`` (``as_subclass``).
    """
    cls = type(tensor)
    if cls is torch.Tensor or cls is torch.nn.Parameter:
        return tensor
    if cls.__name__ == "DTensor":
        return tensor.to_local()  # type: ignore[attr-defined, no-any-return]
    with torch._C.DisableTorchFunctionSubclass():
        for _ in range(8):  # nested wrappers; never loops forever
            if not _is_wrapper(tensor):
                break
            names, _ctx = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
            if not names:
                break
            tensor = getattr(tensor, names[0])
        if type(tensor) not in _PLAIN_TYPES and not _is_wrapper(tensor):
            tensor = tensor.as_subclass(torch.Tensor)
    return tensor


def _is_wrapper(tensor: torch.Tensor) -> bool:
    return bool(_python_dispatch.is_traceable_wrapper_subclass(tensor))


def _dynamo() -> Any:
    import torch._dynamo.eval_frame
    import torch._dynamo.types

    return torch._dynamo


def subclass_parts(tensor: torch.Tensor) -> tuple[str, dict[str, torch.Tensor], Any] | None:
    """A wrapper subclass's public representation: its qualified class, its inner
    tensors by attribute (``__tensor_flatten__`` order; nested ones as ``"a.b"``) and
    the flatten context. None for plain tensors, DTensors (``shard_facts``) and
    subclasses that are no wrapper."""
    cls = type(tensor)
    if cls in _PLAIN_TYPES or cls.__name__ == "DTensor" or not _is_wrapper(tensor):
        return None
    inner: dict[str, torch.Tensor] = {}
    with torch._C.DisableTorchFunctionSubclass():
        names, ctx = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
        for name in names:
            part = getattr(tensor, name)
            nested = subclass_parts(part)
            if nested is None:
                inner[name] = local_view(part)
            else:
                inner.update({f"{name}.{k}": v for k, v in nested[1].items()})
    return f"{cls.__module__}.{cls.__qualname__}", inner, ctx


def transform_value(tensor: Any) -> bool:
    """Is this a functorch transform's value (vmap's and the legacy BatchedTensor,
    a grad/jvp level's wrapper: ``is_functorch_wrapped_tensor``,
    ``is_legacy_batchedtensor``, torch 2.0-2.13) or a forward-AD dual (a dual level
    is open, ``forward_ad._current_level``, and it has a tangent)?

    Transient values of a transform, not the model's: reading them fails ("Batching
    rule not implemented for aten::detach" under batched gradcheck). Skipped.
    """
    if not isinstance(tensor, torch.Tensor):
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(
        tensor
    ) or torch._C._functorch.is_legacy_batchedtensor(tensor):
        return True  # (legacy: torch._vmap_internals' BatchedTensor, which batched gradcheck uses)
    if _forward_ad._current_level >= 0:
        return _forward_ad.unpack_dual(tensor).tangent is not None  # type: ignore[no-untyped-call]
    return False


def shard_facts(tensor: torch.Tensor) -> dict[str, Any] | None:
    """Where a DTensor's local shard lies in the global tensor (None for a plain tensor).

    ``placements`` per mesh dimension (``Shard(dim=0)``, ``Replicate()``), the
    mesh shape and this process's coordinate in it, the global and local shapes,
    and the local shard's ``offset`` in the global tensor, following DTensor's
    even sharding (``torch.chunk`` sizes: a later shard may be smaller or empty),
    applied mesh dimension by mesh dimension. ``offset`` is None when the local
    shape does not follow that rule (an uneven layout restore cannot place).
    """
    if not is_dtensor(tensor):
        return None
    mesh = tensor.device_mesh  # type: ignore[attr-defined]
    placements = list(tensor.placements)  # type: ignore[attr-defined]
    coordinate = mesh.get_coordinate()
    mesh_shape = [int(n) for n in mesh.shape]
    global_shape = [int(n) for n in tensor.shape]
    local_shape = [int(n) for n in local_view(tensor).shape]
    offset: list[int] | None = [0] * len(global_shape)
    sizes = list(global_shape)
    if coordinate is None:
        offset = None
    else:
        for mesh_dim, placement in enumerate(placements):
            if placement.is_shard():
                dim = int(placement.dim)
                chunk = -(-sizes[dim] // mesh_shape[mesh_dim]) if sizes[dim] else 0
                start = min(coordinate[mesh_dim] * chunk, sizes[dim])
                assert offset is not None
                offset[dim] += start
                sizes[dim] = max(0, min(chunk, sizes[dim] - start))
            elif not placement.is_replicate():
                offset = None  # Partial: the local values are not a piece of the global tensor
                break
        if offset is not None and sizes != local_shape:
            offset = None
    return {
        "placements": [repr(p) for p in placements],
        "mesh_shape": mesh_shape,
        "coordinate": None if coordinate is None else [int(c) for c in coordinate],
        "global_shape": global_shape,
        "local_shape": local_shape,
        "offset": offset,
    }


# --------------------------------------------------------------------------- module members
def children_of(module: torch.nn.Module) -> dict[str, torch.nn.Module | None]:
    """``module._modules``: the registered children, None entries included (which
    ``named_children`` hides; ``register_module(name, None)`` leaves one)."""
    return module._modules


def parameters_of(module: torch.nn.Module) -> dict[str, Any]:
    """``module._parameters``: own parameters by name, None entries included."""
    return module._parameters


def buffers_of(module: torch.nn.Module) -> dict[str, Any]:
    """``module._buffers``: own buffers by name, None entries included."""
    return module._buffers


def is_persistent_buffer(module: torch.nn.Module, name: str) -> bool:
    """Is the buffer part of ``state_dict``? (``_non_persistent_buffers_set``, torch 1.6-2.13)."""
    return name not in module._non_persistent_buffers_set


def registering_persistent() -> bool | None:
    """``persistent`` of the ``register_buffer`` call that fired the buffer hook, or None.

    The buffer registration hook is not told whether the buffer is persistent;
    ``Module.register_buffer``, a few frames up (the hook and its guard between),
    holds it in its local ``persistent`` (torch 2.0-2.13).
    """
    frame = sys._getframe(1)
    for _ in range(6):
        if frame.f_code.co_name == "register_buffer":
            value = frame.f_locals.get("persistent")
            return bool(value) if value is not None else None
        if frame.f_back is None:
            return None
        frame = frame.f_back
    return None


# --------------------------------------------------------------------------- tensors
def is_uninitialized(tensor: torch.Tensor) -> bool:
    """A lazy module's ``UninitializedParameter``/``UninitializedBuffer``: no shape, no values yet.

    Reading its shape raises; it is materialized in place (same object, no hook)
    by the module's first forward (``torch.nn.parameter.is_lazy``, torch 1.8-2.13).
    """
    return bool(torch.nn.parameter.is_lazy(tensor))


tensor_version: Callable[[torch.Tensor], int] = operator.attrgetter("_version")
"""The in-place version counter (``_version``): equal, not modified in place since (C getter)."""


def tensor_hooks(tensor: torch.Tensor) -> dict[int, Any] | None:
    """The tensor's own gradient hooks (``Tensor._backward_hooks``: what ``register_hook``
    adds to; reset to None by an in-place op, torch 1.0-2.13)."""
    return tensor._backward_hooks


# Fused calls over lists of tensors, bound once (no Python frame per step): the L2 norm of
# each (torch 1.10-2.13); ``targets[i].copy_(sources[i])`` (2.1-2.13); ``targets[i] -=
# others[i]`` (1.7-2.13).
foreach_norm: Callable[[list[torch.Tensor]], _Tensors] = torch._foreach_norm
foreach_copy_: Callable[[list[torch.Tensor], list[torch.Tensor]], None] = torch._foreach_copy_
foreach_sub_: Callable[[list[torch.Tensor], list[torch.Tensor]], None] = torch._foreach_sub_

set_grad_mode: Callable[[bool], None] = torch._C._set_grad_enabled
"""Autograd recording on or off on this thread: what ``torch.set_grad_enabled`` does,
without building its context-manager object (torch 1.0-2.13)."""


# --------------------------------------------------------------------------- losses and FLOPs
def is_loss_module(module: torch.nn.Module) -> bool:
    """Is this one of torch's loss modules (``torch.nn.modules.loss._Loss``, the base of
    ``CrossEntropyLoss``, ``MSELoss`` ...; private by name, torch 1.0-2.13)?"""
    return isinstance(module, _LOSS)


_LOSS = torch.nn.modules.loss._Loss


def innermost_dispatch_mode() -> Any:
    """The innermost active ``TorchDispatchMode`` on this thread, or None
    (``torch.utils._python_dispatch._get_current_dispatch_mode``, torch 2.0-2.13).

    A mode entered in one hook and left in another must be the innermost one
    when it is left: leaving pops whatever is innermost.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


@contextlib.contextmanager
def outside_mode(mode: Any) -> Iterator[None]:
    """Run the block with ``mode`` popped off this thread's dispatch mode stack, when it
    is the innermost mode (``torch.utils._python_dispatch._pop_mode_temporarily``,
    torch 2.0-2.13); otherwise as it is (a mode of the user's inside ours stays).

    The recorder's own statistics during the counted first forward went through
    the FLOP-counting mode op by op: Python dispatch per op, seconds of a large
    model's first step under ``audit`` (docs/performance.md).
    They are not the model's FLOPs (no formula counts a norm or a sum), so they
    run outside it.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    if mode is None or _get_current_dispatch_mode() is not mode:
        yield
        return
    with _pop_mode_temporarily():
        yield


def flop_counting_mode() -> Any:
    """A dispatch mode that counts FLOPs per aten operator with torch's own formulas
    (``torch.utils.flop_counter.flop_registry``, torch 2.1-2.13), and nothing else.

    ``FlopCounterMode`` itself also tracks modules with global module hooks that
    it adds and removes; leaving it from inside a module hook changes the hook
    tables while torch iterates them (the always-called hooks of a forward that
    raised are then skipped). This mode adds no hook: it can be left anywhere.
    """
    from collections import defaultdict

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class FlopCount(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # Without it dynamo runs the code eagerly for the whole run ("non-infra torch
            # dispatch mode present"; a compiled child then trained with other numerics).
            # With it, dynamo compiles as without the mode, and dispatches only some ops
            # through it (flops.py skips the count when it sees compiled modules).
            return True

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.counts: dict[Any, int] = defaultdict(int)

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                # The formulas read shapes and plain arguments only, through a pytree
                # walk (slow per call): a model of many equal layers asks the same
                # question thousands of times.
                key = _flop_key(func, args, kwargs, out)
                count = None if key is None else known.get(key)
                if count is None:
                    count = int(formula(*args, **kwargs, out_val=out))
                    if key is not None:
                        known[key] = count
                self.counts[func._overloadpacket] += count
            return out

    known: dict[Any, int] = {}
    return FlopCount()


# --------------------------------------------------------------------------- global hook state
class FullBackwardFlag:
    """torch's module-level note of which kind of global backward hook is in use.

    ``_global_is_full_backward_hook`` is set when a global backward hook is
    registered and never cleared on removal (torch 1.9-2.13); a stale value
    makes torch refuse the other kind. ``save_and_clear`` treats it as unset
    when no global backward hook exists any more; ``restore`` puts back exactly
    what was found, so recording leaves torch's state as it was.
    """

    def __init__(self) -> None:
        self.saved: Any = None
        self.held = False

    def save_and_clear(self) -> None:
        self.saved = nn_module._global_is_full_backward_hook
        self.held = True
        if not nn_module._global_backward_hooks:
            nn_module._global_is_full_backward_hook = None

    def restore(self) -> None:
        if self.held:
            nn_module._global_is_full_backward_hook = self.saved
            self.held = False


# --------------------------------------------------------------------------- global hook tables
# Torch reads these module-level dicts at every call (``Module._call_impl``,
# ``register_parameter``, ``Optimizer.step``'s wrapper), looking the name up each
# time: code that assigns a fresh dict to one (PyTorch's own
# TestModuleGlobalHooks.tearDown does) takes every hook in it out of use. The
# ``register_*`` functions are public; the tables are not (torch 2.0-2.13; the
# always-called table since 2.1). ``backward`` holds full and legacy backward hooks alike.
GLOBAL_HOOK_TABLES: dict[str, Callable[[], dict[int, Any]]] = {
    "module_registration": lambda: nn_module._global_module_registration_hooks,
    "parameter_registration": lambda: nn_module._global_parameter_registration_hooks,
    "buffer_registration": lambda: nn_module._global_buffer_registration_hooks,
    "forward_pre": lambda: nn_module._global_forward_pre_hooks,
    "forward": lambda: nn_module._global_forward_hooks,
    "forward_always_called": lambda: nn_module._global_forward_hooks_always_called,
    "backward_pre": lambda: nn_module._global_backward_pre_hooks,
    "backward": lambda: nn_module._global_backward_hooks,
    "optimizer_step_pre": lambda: optim_module._global_optimizer_pre_hooks,
    "optimizer_step_post": lambda: optim_module._global_optimizer_post_hooks,
}


def global_hook_table(table: str) -> dict[int, Any]:
    """The global hook table torch uses now (one of ``GLOBAL_HOOK_TABLES``), by hook id."""
    return GLOBAL_HOOK_TABLES[table]()


def in_backward() -> bool:
    """Is this code running inside an autograd backward pass (a tensor or
    post-accumulate-grad hook: the optimizer-in-backward pattern)?

    The engine saves and restores the thread's dispatch-mode stack around the
    backward, so a mode popped inside it stays pushed for the caller; the FLOP
    counter is closed only outside (``torch._C._current_graph_task_id``: -1
    outside a backward, torch 2.0-2.13).
    """
    return bool(torch._C._current_graph_task_id() != -1)


# The attributes above, for the test that fails loudly when torch drops one.
REQUIRED = {
    "torch._C._current_graph_task_id": lambda: torch._C._current_graph_task_id(),
    "torch.nn.modules.module._global_is_full_backward_hook": lambda: (
        nn_module._global_is_full_backward_hook
    ),
    "torch.nn.modules.module._global_backward_hooks": lambda: nn_module._global_backward_hooks,
    "torch.nn.Module._modules": lambda: torch.nn.Module()._modules,
    "torch.nn.Module._parameters": lambda: torch.nn.Module()._parameters,
    "torch.nn.Module._buffers": lambda: torch.nn.Module()._buffers,
    "torch.nn.Module._non_persistent_buffers_set": lambda: (
        torch.nn.Module()._non_persistent_buffers_set
    ),
    "torch.nn.Module.register_buffer(persistent=...)": lambda: (
        torch.nn.Module.register_buffer.__code__.co_varnames.index("persistent")
    ),
    "torch.Tensor._version": lambda: torch.zeros(1)._version,
    "torch.Tensor._backward_hooks": lambda: torch.zeros(1, requires_grad=True)._backward_hooks,
    **{f"global hook table {name}": accessor for name, accessor in GLOBAL_HOOK_TABLES.items()},
    "torch._foreach_norm": lambda: torch._foreach_norm,
    "torch._C._set_grad_enabled": lambda: torch._C._set_grad_enabled,
    "torch._foreach_copy_": lambda: torch._foreach_copy_,
    "torch._foreach_sub_": lambda: torch._foreach_sub_,
    "torch.compiler.is_compiling": lambda: torch.compiler.is_compiling,
    "torch._C._are_functorch_transforms_active": lambda: (
        torch._C._are_functorch_transforms_active()
    ),
    "torch._C._functorch.is_functorch_wrapped_tensor": lambda: (
        torch._C._functorch.is_functorch_wrapped_tensor
    ),
    "torch._C._functorch.is_legacy_batchedtensor": lambda: (
        torch._C._functorch.is_legacy_batchedtensor
    ),
    "torch.autograd.forward_ad._current_level": lambda: _forward_ad._current_level,
    "torch._C.DisableTorchFunctionSubclass": lambda: torch._C.DisableTorchFunctionSubclass,
    "torch.utils._python_dispatch.is_traceable_wrapper_subclass": lambda: _is_wrapper(
        torch.zeros(1)
    ),
    "TorchDispatchMode.ignore_compile_internals": lambda: (
        _python_dispatch.TorchDispatchMode.ignore_compile_internals
    ),
    "Module._compiled_call_impl": lambda: torch.nn.Module()._compiled_call_impl,
    "torch._dynamo.eval_frame.set_code_exec_strategy": lambda: (
        _dynamo().eval_frame.set_code_exec_strategy
    ),
    "torch._dynamo.types.FrameAction.SKIP": lambda: _dynamo().types.FrameAction.SKIP,
    "torch.nn.modules.loss._Loss": lambda: torch.nn.modules.loss._Loss,
    "torch.utils._python_dispatch._get_current_dispatch_mode": innermost_dispatch_mode,
    "torch.utils.flop_counter.flop_registry": lambda: (
        __import__("torch.utils.flop_counter").utils.flop_counter.flop_registry
    ),
}
