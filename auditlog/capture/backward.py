"""What no PyTorch hook shows: the scalar a ``backward()`` starts from, the moment it
returns, and the optimizer steps a ``GradScaler`` skips.

Torch has global hooks for module calls and optimizer steps but none for a
backward pass. Three facts of the record need one:

- the loss whatever computed it (``F.cross_entropy``, custom code): the scalar
  the user calls ``backward()`` on is what the model trains on;
- the gradients as backward left them, before the user clips or unscales them
  (the *raw* gradient norm beside the one the update used);
- the step a ``GradScaler`` skips because the gradients overflowed: it never
  calls ``optimizer.step()``, so no optimizer hook fires.

So while a recording is open, ``torch.autograd.backward`` (which
``Tensor.backward`` calls) and ``GradScaler.scale`` / ``GradScaler.step`` are
replaced by thin wrappers that call the originals with the same arguments and
return their results unchanged; on exit the originals are put back (only if the
attribute still holds our wrapper: code that wrapped it on top of us keeps its
wrapper, and ours then passes straight through). A wrapper never raises into
user code: the recorder's part runs under the recorder's fault handling.

Only the *outermost* backward counts: a backward started while another is
running (reentrant activation checkpointing calls ``torch.autograd.backward``
inside the outer backward, possibly on autograd's device threads) passes
straight through. Nothing is done while Dynamo traces (``torch.compile``) or a
``torch.func`` transform runs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from auditlog.capture.metrics import metric_value
from auditlog.capture.torch_compat import in_transform_or_compile


class LossListener(Protocol):
    """Told the scalar each outermost backward starts from (the recorder's metrics)."""

    def backward_started(self, root: torch.Tensor | None, scaled_from: Any) -> None: ...


class GradListener(Protocol):
    """Told when an outermost backward returned (the optimizer steps' ``StepNorms``)."""

    def backward_finished(self) -> None: ...


class StepListener(Protocol):
    """Told around each ``GradScaler.step`` (the recorder's optimizer steps)."""

    def scaler_step_began(self, optimizer: torch.optim.Optimizer) -> int: ...

    def scaler_step_ended(
        self, optimizer: torch.optim.Optimizer, before: int, scale: float
    ) -> None: ...


Fault = Callable[[str, BaseException], None]
"""Where the listeners' failures go: ``RecordingContext.fault`` (a ``recorder_error``)."""


SCALED_MAX = 64
"""Most ``GradScaler.scale`` results remembered until a backward starts from one (a
script that scales tensors it never differentiates must not grow memory)."""


class _Patch:
    """One attribute of a torch object replaced by a wrapper, and put back exactly."""

    __slots__ = ("name", "original", "owner", "wrapper")

    def __init__(
        self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        self.owner = owner
        self.name = name
        self.original = getattr(owner, name)
        self.wrapper = functools.wraps(self.original)(make(self.original))
        setattr(owner, name, self.wrapper)

    def restore(self) -> None:
        if getattr(self.owner, self.name, None) is self.wrapper:
            setattr(self.owner, self.name, self.original)


class BackwardWatch:
    """The wrappers of one recording (see the module docstring), and their state."""

    def __init__(
        self, losses: LossListener, grads: GradListener, steps: StepListener, fault: Fault
    ) -> None:
        self.losses = losses
        self.grads = grads
        self.steps = steps
        self.fault = fault
        self.active = False
        self._patches: list[_Patch] = []
        self._running = 0  # outermost backwards in progress (any thread)
        self._lock = threading.Lock()
        # id(result of GradScaler.scale) -> the unscaled loss it came from (its value
        # as a metric entry holds it, and its id: the loss module's output, say)
        self.scaled: dict[int, tuple[Any, int]] = {}

    def install(self) -> None:
        """Put the wrappers in place (recording starts)."""
        if self._patches:
            return
        self.active = True
        self._patches.append(_Patch(torch.autograd, "backward", self._wrap_backward))
        scaler = _grad_scaler_class()
        if scaler is not None:
            self._patches.append(_Patch(scaler, "scale", self._wrap_scale))
            self._patches.append(_Patch(scaler, "step", self._wrap_step))

    def remove(self) -> None:
        """Put the originals back (recording ends); a wrapper left behind passes through."""
        self.active = False
        while self._patches:
            self._patches.pop().restore()
        self.scaled.clear()

    # ------------------------------------------------------------------ wrappers
    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not self.active or in_transform_or_compile():
                return original(*args, **kwargs)
            with self._lock:
                outermost = self._running == 0
                self._running += 1
            try:
                if outermost:
                    self._started(args, kwargs)
                result = original(*args, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1
            if outermost:
                try:
                    self.grads.backward_finished()
                except Exception as exc:
                    self.fault("backward_finished", exc)
            return result

        return backward

    def _started(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            tensors = args[0] if args else kwargs.get("tensors")
            grads = (
                args[1]
                if len(args) > 1
                else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
            )
            if isinstance(tensors, (tuple, list)) and len(tensors) == 1:
                tensors = tensors[0]
            if isinstance(grads, (tuple, list)) and len(grads) == 1:
                grads = grads[0]
            root: torch.Tensor | None = None
            # A loss: one scalar, differentiated with the implicit gradient 1.
            if isinstance(tensors, torch.Tensor) and grads is None and tensors.numel() == 1:
                root = tensors
            scaled_from = (
                self.scaled.pop(id(root), None) if root is not None and self.scaled else None
            )
            self.losses.backward_started(root, scaled_from)
        except Exception as exc:
            self.fault("backward_started", exc)

    def _wrap_scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def scale(scaler: Any, outputs: Any) -> Any:
            result = original(scaler, outputs)
            if (
                self.active
                and isinstance(outputs, torch.Tensor)
                and isinstance(result, torch.Tensor)
            ):
                try:
                    if outputs.numel() == 1 and result is not outputs:
                        if len(self.scaled) >= SCALED_MAX:
                            self.scaled.clear()
                        self.scaled[id(result)] = (metric_value(outputs), id(outputs))
                except Exception as exc:
                    self.fault("grad_scaler_scale", exc)
            return result

        return scale

    def _wrap_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.active or not isinstance(optimizer, torch.optim.Optimizer):
                return original(scaler, optimizer, *args, **kwargs)
            before = -1
            try:
                before = self.steps.scaler_step_began(optimizer)
            except Exception as exc:
                self.fault("grad_scaler_step", exc)
            result = original(scaler, optimizer, *args, **kwargs)
            if before >= 0:
                try:
                    enabled = bool(getattr(scaler, "is_enabled", lambda: True)())
                    if enabled:
                        self.steps.scaler_step_ended(optimizer, before, float(scaler.get_scale()))
                except Exception as exc:
                    self.fault("grad_scaler_step", exc)
            return result

        return step


def _grad_scaler_class() -> Any:
    """``torch.amp.GradScaler`` (``torch.cuda.amp.GradScaler`` subclasses it), or None."""
    amp = getattr(torch, "amp", None)
    return getattr(amp, "GradScaler", None)
