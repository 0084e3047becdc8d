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

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.nn.modules import module as nn_module

F = TypeVar("F", bound=Callable[..., Any])

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


# --------------------------------------------------------------------------- torch.compile
def unwrap_compiled(module: torch.nn.Module) -> torch.nn.Module:
    """The user's module behind ``torch.compile``'s ``OptimizedModule`` wrapper (``_orig_mod``;
    torch 2.0-2.13), so that a compiled model's calls count once, as the model's."""
    if type(module).__name__ == "OptimizedModule":
        return module._orig_mod  # type: ignore[return-value]
    return module


def is_compiled_wrapper(module: torch.nn.Module) -> bool:
    """Is this torch.compile's ``OptimizedModule`` (not part of the model's structure)?"""
    return type(module).__name__ == "OptimizedModule"


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
def tensor_version(tensor: torch.Tensor) -> int:
    """The in-place version counter (``_version``): equal means not modified in place since."""
    return tensor._version


def foreach_norm(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """L2 norms of many tensors in one fused call (``torch._foreach_norm``, torch 1.10-2.13)."""
    return tuple(torch._foreach_norm(tensors))


def foreach_copy_(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``targets[i].copy_(sources[i])`` for all i in one call (``torch._foreach_copy_``, 2.1-2.13)."""
    torch._foreach_copy_(targets, sources)


def foreach_sub_(targets: list[torch.Tensor], others: list[torch.Tensor]) -> None:
    """``targets[i] -= others[i]`` for all i in one call (``torch._foreach_sub_``, 1.7-2.13)."""
    torch._foreach_sub_(targets, others)


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


# The attributes above, for the test that fails loudly when torch drops one.
REQUIRED = {
    "torch.nn.modules.module._global_is_full_backward_hook": lambda: nn_module._global_is_full_backward_hook,
    "torch.nn.modules.module._global_backward_hooks": lambda: nn_module._global_backward_hooks,
    "torch.nn.Module._modules": lambda: torch.nn.Module()._modules,
    "torch.nn.Module._parameters": lambda: torch.nn.Module()._parameters,
    "torch.nn.Module._buffers": lambda: torch.nn.Module()._buffers,
    "torch.nn.Module._non_persistent_buffers_set": lambda: torch.nn.Module()._non_persistent_buffers_set,
    "torch.nn.Module.register_buffer(persistent=...)": lambda: torch.nn.Module.register_buffer.__code__.co_varnames.index("persistent"),
    "torch.Tensor._version": lambda: torch.zeros(1)._version,
    "torch._foreach_norm": lambda: torch._foreach_norm,
    "torch._foreach_copy_": lambda: torch._foreach_copy_,
    "torch._foreach_sub_": lambda: torch._foreach_sub_,
    "torch.compiler.is_compiling": lambda: torch.compiler.is_compiling,
    "torch.nn.modules.loss._Loss": lambda: torch.nn.modules.loss._Loss,
    "torch.utils._python_dispatch._get_current_dispatch_mode": innermost_dispatch_mode,
}
