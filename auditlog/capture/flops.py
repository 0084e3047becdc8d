"""Training FLOPs of one step, counted by ``torch.utils.flop_counter.FlopCounterMode``.

When: the first root forward with gradients enabled (step 0, normally) enters a
``FlopCounterMode``; the first optimizer step's pre hook leaves it. So the count
covers everything between: every forward of that step (gradient accumulation
included), the loss and the backward, and not the optimizer's own update; that
is what "training FLOPs per step" means (about 6 x parameters x tokens for a
transformer). The result is one ``flops`` event. Counting runs every aten op of
that one step through a Python dispatch mode: that step is slower (measured in
``benchmarks/forensics.py``); every other step is untouched.

Where torch gives no clean window the count is closed anyway: after
``FORWARD_LIMIT`` root forwards with no optimizer step (a script that updates
parameters by hand), or at the end of the recording (``closed_by`` says which).
A compiled model (``torch.compile``) is not counted: dynamo would trace the mode.

A dispatch mode lives on the thread that entered it, and leaving one pops the
innermost mode of that thread; so the count is left only on the thread that
entered it and only while it is the innermost mode (a mode the user entered
after it is never popped by mistake). Where neither holds, it is tried again at
the next chance.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from auditlog.capture.base import RecorderBase
from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.torch_compat import innermost_dispatch_mode, is_compiled_wrapper
from auditlog.core.policy import Policy

FORWARD_LIMIT = 64


class FlopCounting(RecorderBase):
    """Enters and leaves the one ``FlopCounterMode`` of a run."""

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        super().__init__(buffer, policy)
        self._flop_counter: Any = None
        self._flop_thread = 0
        self._flop_step = 0
        self._flop_forwards = 0
        self._flops_done = not self.policy.flops

    def flops_root_started(self, module: torch.nn.Module) -> None:
        """A root's forward begins: start counting (once), or count the forward."""
        if self._flops_done:
            return
        if self._flop_counter is not None:
            self._flop_forwards += 1
            if self._flop_forwards > FORWARD_LIMIT:
                self.stop_flops("forward_limit")
            return
        if not torch.is_grad_enabled() or is_compiled_wrapper(module):
            return
        from torch.utils.flop_counter import FlopCounterMode

        self._flops_done = True  # one attempt: a failure here is recorded, never retried every step
        counter = FlopCounterMode(display=False)
        counter.__enter__()  # type: ignore[no-untyped-call]
        self._flops_done = False
        self._flop_counter = counter
        self._flop_thread = threading.get_ident()
        self._flop_step = self.step
        self._flop_forwards = 1

    def stop_flops(self, closed_by: str) -> None:
        """Leave the counting mode, if this thread can, and emit the ``flops`` event."""
        counter = self._flop_counter
        if counter is None or threading.get_ident() != self._flop_thread:
            return
        try:
            if innermost_dispatch_mode() is not counter.mode:
                return  # someone's mode is inside ours: leaving now would pop theirs
            self._flop_counter = None
            self._flops_done = True
            counter.__exit__(None, None, None)
        except Exception as exc:  # never into user code (recorder.remove calls this too)
            self.fault("flop_counter", exc)
            return
        by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
        self.emit(
            "flops",
            None,
            None,
            {
                "flops": int(counter.get_total_flops()),
                "by_operator": dict(sorted(by_op.items())),
                "forwards": self._flop_forwards,
                "closed_by": closed_by,
            },
            step=self._flop_step,
        )
