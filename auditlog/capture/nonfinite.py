"""The first non-finite gradient or loss, caught on the step it happens.

By default (``sample_nonfinite``) a step with non-finite gradients turns module
activity on from the *next* step: the writer learns of the NaN only after the
step. With ``nonfinite_check`` the optimizer's pre hook looks before the
update, which is as early as torch lets a hook see gradients: the forward and
backward of that step are over (their module statistics exist only if the step
was sampled), the update is not done yet. At the first non-finite gradient (or
a non-finite training loss whose value is already on the host) it records, on
that same step:

- a ``nonfinite_found`` event with full statistics (norm, mean, std, min, max,
  NaN and Inf counts) of every parameter's gradient;
- a snapshot of every parameter and buffer (trigger ``last_finite``): the
  values before the update that would spread the NaN, i.e. the last finite state
  when the parameters were still finite;
- module activity from the next step on.

Cost: the gradient norms are taken in the pre hook anyway (the step record's
norms are those of the gradients the update used); the check reads them at once:
free on CPU, one host-device sync per step on CUDA (why it is opt-in; ``debug``
turns it on).

``keep_finite_state`` covers the other way parameters go bad: a finite but huge
update. It copies the parameters before every step (one copy of the parameters
in memory, plus a copy per step: measured in ``benchmarks/forensics.py``),
checks them after the step, and if the step left any non-finite it stores the
copy (parameters only, trigger ``last_finite``, at the previous step).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from auditlog.capture.context import RecordingContext
from auditlog.capture.metrics import MetricHooks
from auditlog.capture.norms import norms_of
from auditlog.capture.payloads import HostCopy, Scalar, SnapshotItems, StackedNorms
from auditlog.capture.roots import RootTracking
from auditlog.capture.torch_compat import foreach_copy_
from auditlog.core.tensors import activity_stats


def _finite(norms: torch.Tensor | None) -> bool:
    """Are all these norms finite? (A read: a sync on a device.)"""
    return norms is None or bool(torch.isfinite(norms).all())


def _grads_finite(measured: StackedNorms | None, grads: list[torch.Tensor]) -> bool:
    """Are all gradient norms finite? From the pre hook's norms when it took them
    (on CPU already read; on a device, a sync), else from norms taken now."""
    if measured is None:
        return _finite(norms_of(grads))
    if measured.norms is None or measured.norms.device.type == "cpu":
        return measured.nonfinite() == 0
    return _finite(measured.norms)


def _loss_nonfinite(value: Any) -> bool:
    """Is a recorded loss NaN/Inf, when its value is on the host already (never waits)?"""
    if isinstance(value, Scalar):
        if not value.ready():
            return False
        value = value.resolve()
    if isinstance(value, str):
        return True
    return isinstance(value, float) and not math.isfinite(value)


class NonFiniteWatch:
    """Checks before and after optimizer steps (``nonfinite_check``, ``keep_finite_state``),
    and whether gradients were found non-finite (``flagged``: module activity is sampled
    from the next step on, ``sample_nonfinite``).

    The loss it looks at is the metrics' (``metrics``); the snapshot it takes is
    of the live roots (``roots``)."""

    def __init__(self, ctx: RecordingContext, metrics: MetricHooks, roots: RootTracking) -> None:
        self.ctx = ctx
        self.metrics = metrics
        self.roots = roots
        self.flagged = False
        self._nonfinite_found = False
        self._finite_copies: weakref.WeakKeyDictionary[
            torch.optim.Optimizer, list[torch.Tensor]
        ] = weakref.WeakKeyDictionary()

    def flag_nonfinite(self) -> None:
        """A step's gradients were not finite (found here, by the optimizer's post hook
        on CPU, or by the writer reading a device's norms): sample from the next step."""
        self.flagged = True

    def check_before_step(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        grad_norms: StackedNorms | None = None,
    ) -> None:
        """Optimizer pre hook: gradients (and the loss) of this step, before the update.

        ``grad_norms``: the gradient norms the pre hook took for the step record
        (taken here when it did not)."""
        policy = self.ctx.policy
        if self._nonfinite_found or not (policy.nonfinite_check or policy.keep_finite_state):
            return
        with torch.no_grad():
            present = [p for p in params if p.grad is not None and p.grad.layout == torch.strided]
            grads: list[torch.Tensor] = [p.grad for p in present]  # type: ignore[misc]
            loss = self.metrics.last_loss()
            bad_loss = loss is not None and _loss_nonfinite(loss)
            if policy.nonfinite_check and (bad_loss or not _grads_finite(grad_norms, grads)):
                self._found_before_step(present, grads, loss, "loss" if bad_loss else "gradients")
                return
            if policy.keep_finite_state:
                copies = self._finite_copies.get(optimizer)
                if (
                    copies is None
                    or len(copies) != len(params)
                    or any(
                        c.shape != p.shape or c.dtype != p.dtype or c.device != p.device
                        for c, p in zip(copies, params, strict=True)
                    )
                ):
                    copies = [
                        torch.empty_like(p, memory_format=torch.contiguous_format) for p in params
                    ]
                    self._finite_copies[optimizer] = copies
                if params:
                    foreach_copy_(copies, [p.detach() for p in params])

    def _found_before_step(
        self, present: list[torch.Tensor], grads: list[torch.Tensor], loss: Any, where: str
    ) -> None:
        self._nonfinite_found = True
        gradients = [
            {"tensor_id": self.ctx.tensors.get(p)[0], "stats": activity_stats(g, True)}
            for p, g in zip(present, grads, strict=True)
        ]
        roots = self.roots.live_roots()
        self.ctx.emit(
            "nonfinite_found",
            payload={
                "where": where,
                "loss": loss,
                "gradients": gradients,
                "parameters": [],
                "snapshot": bool(roots),
            },
        )
        if roots:
            self.roots.snapshot(roots, "last_finite")
        self.flag_nonfinite()  # activity from the next step on (sample_nonfinite)

    def check_after_step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> None:
        """Optimizer post hook (``keep_finite_state``): did this step make parameters non-finite?"""
        if not self.ctx.policy.keep_finite_state:
            return  # no copies (a weak-keyed lookup makes a weak reference: not every step)
        copies = self._finite_copies.get(optimizer)
        if self._nonfinite_found or copies is None or len(copies) != len(params):
            return
        with torch.no_grad():
            norms = norms_of([p.detach() for p in params])
            if norms is None or _finite(norms):
                return
            self._nonfinite_found = True
            flags = torch.isfinite(norms).tolist()
            bad = sorted(
                {self.ctx.tensors.get(p)[0] for p, ok in zip(params, flags, strict=True) if not ok}
            )
            items = []
            seen: set[int] = set()
            for param, copy in zip(params, copies, strict=True):
                tensor_id = self.ctx.tensors.get(param)[0]
                if tensor_id not in seen:
                    seen.add(tensor_id)
                    items.append((tensor_id, HostCopy(copy)))
        before = self.ctx.step - 1  # the copy holds the state after the previous step
        self.ctx.emit(
            "nonfinite_found",
            payload={
                "where": "parameters",
                "loss": None,
                "gradients": [],
                "parameters": bad,
                "snapshot": True,
            },
            step=before,
        )
        self.ctx.emit(
            "snapshot_taken",
            None,
            None,
            {"trigger": "last_finite", "tag": None, "snapshot": SnapshotItems(items)},
            step=before,
        )
        self._finite_copies.pop(optimizer, None)
        self.flag_nonfinite()
