"""Training FLOPs per step: one root forward measured with torch's FLOP formulas.

When: the first forward of a root module with gradients enabled on a sampled
step (step 0, normally) is run inside a counting dispatch mode
(``torch_compat.flop_counting_mode``: ``torch.utils.flop_counter``'s formulas,
without ``FlopCounterMode``'s module tracking),
entered in the root's forward pre hook and left in its post hook. The count
therefore covers exactly that forward (the loss too when the model computes
it), and nothing of the user's code around it: an open dispatch mode changes
what the program can do (it holds references to the tensors it sees, and
``torch.utils.swap_tensors`` then refuses the parameters: measured with torch
2.13), so it is never left open across user code. The backward is not
measured (no hook runs before it starts, and a mode entered inside the
autograd engine does not outlive the node that entered it); training FLOPs per
step are recorded as 3 x the forward (backward ~ 2 x forward, the usual
estimate, e.g. 6 x parameters x tokens for a transformer), beside the
measured forward count. One ``flops`` event; every other forward is untouched.

A dispatch mode lives on the thread that entered it, and leaving one pops the
innermost mode of that thread; so the count is left only on that thread and
only while it is the innermost mode (a mode the user entered inside the
forward is never popped by mistake).

Compiled code is never counted, and never stopped from compiling: when the
root or any module under it is compiled (``torch_compat.compiled_modules``:
torch.compile's wrapper, ``Module.compile()``, a compiled ``forward``), no mode
is entered and one ``flops`` event says why (``skipped``, ``compiled``: the
modules). A dispatch mode that dynamo sees makes it refuse to compile and run
that code eagerly for the whole run, with other numerics (measured with torch
2.13: a compiled child under an eager parent); and the ops of compiled code
reach a mode only in part (fused kernels do not), so a count would be wrong.
A compiled function that a forward calls cannot be seen from the module tree:
the mode declares ``ignore_compile_internals``, so dynamo compiles it exactly
as without the mode (what its compiled code dispatches is counted, fused
kernels are not).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from auditlog.capture.context import RecordingContext
from auditlog.capture.torch_compat import (
    compiled_modules,
    flop_counting_mode,
    in_backward,
    innermost_dispatch_mode,
    is_compiled_wrapper,
    outside_mode,
)

BACKWARD_FACTOR = 2  # backward FLOPs estimated as this many forwards


class FlopCounting:
    """Enters and leaves the one ``FlopCounterMode`` of a run, around one root forward."""

    def __init__(self, ctx: RecordingContext) -> None:
        self.ctx = ctx
        self._flop_counter: Any = None
        self._flop_thread = 0
        self._flop_step = 0
        self._flop_root: int | None = None
        self._flops_done = not ctx.policy.flops

    def flops_root_started(self, module: torch.nn.Module) -> None:
        """A root's forward begins: count it (the first with gradients enabled)."""
        if self._flops_done or self._flop_counter is not None:
            return
        if not torch.is_grad_enabled() or in_backward():
            return
        self._flops_done = True  # one attempt: a failure here is recorded, never retried every step
        compiled = compiled_modules(module)
        if compiled or is_compiled_wrapper(module):
            self.ctx.emit(
                "flops",
                None,
                None,
                {
                    "skipped": "compiled code in the model: a FLOP-counting dispatch mode would stop "
                    "dynamo from compiling it, and compiled kernels cannot be counted op by op",
                    "compiled": [name or "(root)" for name in compiled] or ["(root)"],
                },
                step=self.ctx.step,
            )
            return
        counter = flop_counting_mode()
        counter.__enter__()
        self._flop_counter = counter
        self._flop_thread = threading.get_ident()
        self._flop_step = self.ctx.step
        self._flop_root = id(module)

    def flops_root_finished(self, module: torch.nn.Module) -> None:
        """A root's forward returned (or raised): leave the mode when it is the counted one."""
        if self._flop_counter is not None and id(module) == self._flop_root:
            self.stop_flops("forward")

    def uncounted(self) -> contextlib.AbstractContextManager[None]:
        """Where the recorder's own tensor work runs while a forward is counted: outside
        the counting mode (``torch_compat.outside_mode``), so it costs no dispatch."""
        counter = self._flop_counter
        if counter is None or threading.get_ident() != self._flop_thread:
            return contextlib.nullcontext()
        return outside_mode(counter)

    def flops_counting(self) -> bool:
        """Is a root forward being counted right now?"""
        return self._flop_counter is not None

    def stop_flops(self, closed_by: str) -> None:
        """Leave the counting mode, if this thread can, and emit the ``flops`` event."""
        counter = self._flop_counter
        if counter is None or threading.get_ident() != self._flop_thread or in_backward():
            return  # inside a backward, leaving the mode would not pop it for the caller
        try:
            if innermost_dispatch_mode() is not counter:
                return  # someone's mode is inside ours: leaving now would pop theirs
            self._flop_counter = None
            counter.__exit__(None, None, None)
        except Exception as exc:  # never into user code (recorder.remove calls this too)
            self.ctx.fault("flop_counter", exc)
            return
        forward = sum(counter.counts.values())
        by_op = {str(op): int(n) for op, n in counter.counts.items()}
        self.ctx.emit(
            "flops",
            None,
            None,
            {
                "flops": forward * (1 + BACKWARD_FACTOR),
                "forward_flops": forward,
                "backward": f"estimated as {BACKWARD_FACTOR} x forward",
                "by_operator": dict(sorted(by_op.items())),
                "forwards": 1,
                "closed_by": closed_by,
            },
            step=self._flop_step,
        )
