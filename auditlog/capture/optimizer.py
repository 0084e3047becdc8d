"""Optimizer steps: hyperparameters of every param group and per-parameter norms.

Gradient norms are taken where the update consumes the gradients
(docs/events.md, "When each number is taken"):

- a plain step (``zero_grad; backward; [clip]; step()``): in the pre hook, the
  gradients as ``step()`` finds them;
- ``step(closure)`` (LBFGS, Lightning's automatic optimization): the gradients
  exist only once ``step()`` has run the closure, so they are read in the post
  hook (the closure's last evaluation; torch's optimizers never change ``.grad``);
- a fused optimizer handed a ``GradScaler``'s scale (``optimizer.grad_scale``): the
  norms divided by that scale, as the fused kernel unscales them.

Beside them, the *raw* norms: the gradients as the last ``backward()`` left them,
before any clipping or unscaling. If no gradient was replaced or changed in place
since, the two are one measurement, taken once; otherwise both are recorded. The
ids and norms of an optimizer's parameters, raw ones included, are this
component's ``StepNorms`` (``stepnorms.py``).

The pre hook also copies the parameters when exact update norms are due; the
post hook counts the step, emits the step's module activity, runs the periodic
structural check and snapshot, and then the ``optimizer_step`` event, so "the
state after step N" is exactly the events up to that event. It also decides
whether the next step is sampled (per-call hooks present) or not. A step a
``GradScaler`` skips is a ``step_skipped`` event, not a step.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from auditlog.capture.activity import ActivityHooks
from auditlog.capture.byobject import ByObject
from auditlog.capture.construction import ConstructionHooks
from auditlog.capture.context import RecordingContext
from auditlog.capture.metrics import MetricHooks
from auditlog.capture.nonfinite import NonFiniteWatch
from auditlog.capture.payloads import StackedNorms, StepPayload
from auditlog.capture.registrations import class_name
from auditlog.capture.roots import RootTracking
from auditlog.capture.stepnorms import (
    Grads,
    StepNorms,
    grad_disabled,
    grad_restored,
    optimizer_params,
)
from auditlog.capture.structure import StructureChecks
from auditlog.capture.torch_compat import compile_guard
from auditlog.core.chain import Clean
from auditlog.core.errors import RecordingFailedError, one_line


class OptimizerHooks:
    """The optimizer step pre and post hooks, and the gradients each backward left.

    A step is where the other components' held records leave (``metrics``,
    ``activity``), where the structure is checked (``structure``) and snapshots
    are taken (``roots``), and where non-finite values are looked for
    (``nonfinite``); ``update_call_hooks`` (the Recorder's) then sets up the
    per-call hooks for the next step."""

    def __init__(
        self,
        ctx: RecordingContext,
        construction: ConstructionHooks,
        roots: RootTracking,
        structure: StructureChecks,
        activity: ActivityHooks,
        metrics: MetricHooks,
        nonfinite: NonFiniteWatch,
        update_call_hooks: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self.construction = construction
        self.roots = roots
        self.structure = structure
        self.activity = activity
        self.metrics = metrics
        self.nonfinite = nonfinite
        self.update_call_hooks = update_call_hooks
        # ids, norm plans and raw gradient norms of each optimizer's parameters
        self.norms = StepNorms(ctx, construction, roots)
        # What the pre hook found, per optimizer (its parameters, the copies it made,
        # the gradient norms it took; popped by the post hook, and weakly keyed: a step
        # that raised leaves nothing alive past its optimizer)
        self._pending_steps: ByObject[_Pending] = ByObject()
        self._optimizer_steps: dict[int, int] = {}
        # the structure version (construction.registrations) the pre hook last looked at
        self._step_scanned = -1
        # structural checks spaced by their cost (Policy.check_interval): smoothed
        # seconds per check and per step (between optimizer post hooks), the
        # interval in use, and when the last post hook ran
        self._check_s = 0.0
        self._step_s = 0.0
        self._check_interval = ctx.policy.check_every
        self._last_post: float | None = None
        self._post_calls = 0  # post hooks run (GradScaler.step: did the optimizer step?)
        # ids of the optimizers whose step() is running, outermost first: a step inside
        # another's (ZeroRedundancyOptimizer's local optimizer, Lookahead's base) is part of
        # the outer one and is not recorded apart
        self._running: list[int] = []

    def scaler_step_began(self, optimizer: torch.optim.Optimizer) -> int:
        """``GradScaler.step`` is about to run: the post-hook count to compare after it."""
        return self._post_calls

    def scaler_step_ended(
        self, optimizer: torch.optim.Optimizer, before: int, scale: float
    ) -> None:
        """``GradScaler.step`` returned; if the optimizer did not step, the scaler skipped it."""
        if self._post_calls == before:
            self._skipped(
                optimizer, "inf or NaN in the gradients: GradScaler skipped optimizer.step()", scale
            )

    def _skipped(self, optimizer: torch.optim.Optimizer, reason: str, scale: float | None) -> None:
        """A step that updated nothing: its metrics and activity leave marked, then ``step_skipped``."""
        self.norms.forget_raw(optimizer)
        self._pending_steps.pop(optimizer)
        optimizer_id, _ = self.ctx.optimizers.get(optimizer)
        self.metrics.flush_metrics(skipped=True)
        self.activity.flush_activity()
        self.ctx.emit(
            "step_skipped",
            None,
            None,
            {
                "optimizer_id": optimizer_id,
                "optimizer_class": class_name(optimizer),
                "reason": reason,
                "scale": scale,
            },
        )

    # ------------------------------------------------------------------ hooks
    def _nested(self, optimizer: torch.optim.Optimizer) -> bool:
        """Pre hook: note this step as running; is it inside another optimizer's step?"""
        running = self._running
        if id(optimizer) in running:
            running.clear()  # its last step raised before its post hook: nothing is running
        running.append(id(optimizer))
        return len(running) > 1

    def _ended_nested(self, optimizer: torch.optim.Optimizer) -> bool:
        """Post hook: this step is over; was it inside another optimizer's step?"""
        running = self._running
        key = id(optimizer)
        if key not in running:
            return False
        del running[len(running) - 1 - running[::-1].index(key)]
        return bool(running)

    @compile_guard
    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        ctx = self.ctx
        try:
            if self._nested(optimizer):
                return None
            ctx.clear_call_stack()  # a forward that died on BaseException left stale entries
            self.norms.note_stepping(optimizer)
            params = optimizer_params(optimizer)
            construction = self.construction
            if self._step_scanned != construction.registrations or construction.lazy:
                # The structure changed since the last step: per-call hooks may be
                # absent, so find the models these parameters belong to from here.
                self._step_scanned = construction.registrations
                self.roots.track_owners(params)
                if construction.lazy:
                    construction.materialized("optimizer_step")
                if construction.unsealed:
                    construction.seal(None, "optimizer_step", tensors=params)
            policy = ctx.policy
            ids = self.norms.ids_of(optimizer, params)  # once per step: the post hook reuses them
            # The gradients the update uses, measured once: for the step record and
            # for nonfinite_check (debug took them twice, here and after the step).
            # With a closure they do not exist yet: the post hook measures them.
            closure = _has_closure(args, kwargs)
            grads = (
                self.norms.used_grad_norms(optimizer, params)
                if (policy.grad_norms or policy.nonfinite_check) and not closure
                else None
            )
            if not closure:
                self.nonfinite.check_before_step(
                    optimizer, params, grads.used if grads is not None else None
                )  # nonfinite.py
            due = (policy.update_norms or policy.param_norms) and policy.norms_due(ctx.step)
            before = self._copy_before(optimizer, params) if due and policy.update_norms else None
            self._pending_steps.set(
                optimizer,
                _Pending(params, ids, before, due, grads if policy.grad_norms else None, closure),
            )
        except Exception as exc:
            ctx.fault("optimizer_step_pre_hook", exc)
        return None

    def _copy_before(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> list[torch.Tensor] | None:
        """The parameters' values before the step, for exact update norms
        (``NormPlan.copy``: stacked per group, into buffers the plan keeps on CPU)."""
        with torch.no_grad():
            plan, tensors = self.norms.param_plan(optimizer, params)
            try:
                return plan.copy(tensors)
            except RuntimeError:  # a parameter changed shape or dtype in place (``.data = ``)
                self.norms.forget_plan(optimizer)
                plan, tensors = self.norms.param_plan(optimizer, params)
                return plan.copy(tensors)

    @compile_guard
    def _on_step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        ctx = self.ctx
        try:
            self._post_calls += 1
            if self._ended_nested(optimizer):
                return None
            self.norms.note_stepping(optimizer)
            found_inf = getattr(optimizer, "found_inf", None)  # GradScaler with a fused optimizer
            if isinstance(found_inf, torch.Tensor) and bool(found_inf.detach().sum().item()):
                scale = getattr(optimizer, "grad_scale", None)
                value = (
                    float(scale.detach().reshape(-1)[0])
                    if isinstance(scale, torch.Tensor)
                    else None
                )
                self._skipped(
                    optimizer,
                    "inf or NaN in the gradients: the fused optimizer skipped the update (GradScaler found_inf)",
                    value,
                )
                return None
            ctx.step += 1
            self._step_time()
            optimizer_id, _ = ctx.optimizers.get(optimizer)
            count = self._optimizer_steps.get(optimizer_id, 0) + 1
            self._optimizer_steps[optimizer_id] = count
            pending = self._pending_steps.pop(optimizer)
            if pending is not None and len(pending.params) == sum(
                map(len, map(_PARAMS, optimizer.param_groups))
            ):
                params, ids = pending.params, pending.ids
            else:  # the pre hook did not run (or the groups changed inside the step)
                params = optimizer_params(optimizer)
                ids = self.norms.ids_of(optimizer, params)
                pending = _Pending(params, ids, None, False, None, True)
            if ctx.policy.grad_norms and pending.closure:  # (the pre hook looked at these args)
                # The closure ran inside step(): its last evaluation's gradients are the ones used.
                pending = pending._replace(grads=self.norms.used_grad_norms(optimizer, params))
            payload = self._step_payload(optimizer, params, ids, pending, optimizer_id, count)
            # Structure check and snapshot come before the optimizer_step event, so
            # "the state after step N" is exactly the events up to that event.
            self.nonfinite.check_after_step(optimizer, params)  # nonfinite.py (keep_finite_state)
            self.metrics.flush_metrics()  # this step's losses and module activity, before its optimizer_step
            self.activity.flush_activity()
            every = ctx.policy.snapshot_every
            snap = every > 0 and ctx.step % every == 0
            if snap or ctx.step % self._check_interval == 0:
                self._timed_check()
            if snap:
                self.roots.snapshot(self.roots.live_roots(), "step")
            ctx.emit("optimizer_step", None, None, payload)
            # Decide the next step: per-call hooks only where activity is sampled.
            policy = ctx.policy
            ctx.sampling = policy.samples(ctx.step) or (
                policy.activity and policy.sample_nonfinite and self.nonfinite.flagged
            )
            self.update_call_hooks()
            if ctx.step_barrier is not None:
                ctx.step_barrier()
        except Exception as exc:
            ctx.fault("optimizer_step_post_hook", exc)
        if ctx.policy.on_error == "fail":
            failure = ctx.failure()
            if failure is not None:
                # The one place a hook raises: the user asked for training to stop
                # rather than run unrecorded (compliance runs).
                raise RecordingFailedError(
                    f"recording failed ({one_line(failure)}); training stopped because on_error=fail"
                )
        return None

    def _step_time(self) -> None:
        """Smooth the time between optimizer post hooks (the step time the structural
        checks' cost is weighed against)."""
        now = time.perf_counter()
        if self._last_post is not None:
            elapsed = now - self._last_post
            self._step_s = elapsed if self._step_s == 0 else 0.8 * self._step_s + 0.2 * elapsed
        self._last_post = now

    def _timed_check(self) -> None:
        """The periodic structural check, timed: its smoothed cost sets the interval
        to the next one (``Policy.check_interval``; its cost on a wide model:
        docs/performance.md)."""
        began = time.perf_counter()
        self.structure.check(None, "optimizer_step")
        cost = time.perf_counter() - began
        self._check_s = cost if self._check_s == 0 else 0.7 * self._check_s + 0.3 * cost
        self._check_interval = self.ctx.policy.check_interval(self._check_s, self._step_s)

    def _step_payload(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        ids: tuple[Clean, list[Clean]],
        pending: _Pending,
        optimizer_id: int,
        count: int,
    ) -> StepPayload:
        """The ``optimizer_step`` payload's raw values: hyperparameters and per-parameter norms.

        Gradient norms every step (measured by the pre hook: the gradients the
        update used; taken here only when the pre hook did not run); parameter and
        update norms on the steps ``norms_every`` selects. Every number is taken
        here; the writer builds the event from them (``StepPayload``), so a step
        costs the training thread no dict, packing or read-back. Only whether the
        gradients were finite is looked at now on CPU, where it decides whether the
        next step's activity is sampled (``sample_nonfinite``).
        """
        tensor_ids, group_ids = ids
        groups: list[dict[str, Any]] = []
        for group in optimizer.param_groups:
            hyper = group.copy()  # shallow, as the event's values were
            hyper.pop(
                "params", None
            )  # the writer puts the ids there; a record never holds a parameter
            # The types of the values, gathered in C: a group of plain values (the usual
            # case) needs no look at each one.
            if not _PLAIN_VALUES.issuperset(map(type, hyper.values())):
                # a tensor hyperparameter (lr as a tensor) may change in place: copied
                tensor_keys = [k for k, value in hyper.items() if isinstance(value, torch.Tensor)]
                for key in tensor_keys:
                    hyper[key] = hyper[key].detach().clone()
            groups.append(hyper)
        policy = self.ctx.policy
        grad_norms: StackedNorms | None = None
        raw_norms: StackedNorms | None = None
        modified: bool | None = None
        if policy.grad_norms:
            grads = pending.grads
            if grads is None or grads.used.size != len(params):
                grads = self.norms.used_grad_norms(optimizer, params)
            grad_norms, raw_norms, modified = grads.used, grads.raw, grads.modified
            if (
                policy.activity
                and policy.sample_nonfinite
                and not self.nonfinite.flagged
                and _on_cpu(grad_norms)
                and grad_norms.any_nonfinite()
            ):
                self.nonfinite.flag_nonfinite()  # the next step is sampled (the writer would say so later)
        param_norms: StackedNorms | None = None
        update_norms: StackedNorms | None = None
        if pending.due:
            plan, tensors = self.norms.param_plan(optimizer, params)
            enabled = grad_disabled()  # norms of parameters: no graph
            try:
                if policy.param_norms:
                    param_norms = StackedNorms(plan.norms(tensors), len(params))
                if pending.before is not None:  # before := before - after, in place
                    update_norms = StackedNorms(
                        plan.difference_norms(pending.before, tensors), len(params)
                    )
            except RuntimeError:  # a parameter changed shape or dtype inside the step
                self.norms.forget_plan(optimizer)
            finally:
                grad_restored(enabled)
        return StepPayload(
            groups,
            group_ids,
            tensor_ids,
            len(params),
            grad_norms,
            raw_norms,
            modified,
            param_norms,
            update_norms,
            optimizer_id,
            type(optimizer),
            count,
            self.nonfinite.flag_nonfinite,
        )


class _Pending(NamedTuple):
    """What the pre hook found for one optimizer's step, for its post hook."""

    params: list[torch.Tensor]
    ids: tuple[Clean, list[Clean]]
    before: list[torch.Tensor] | None  # the parameters before the step (``NormPlan.copy``)
    due: bool  # parameter and update norms this step
    grads: Grads | None
    closure: bool  # step(closure): the gradients are measured after the step


# Types of hyperparameter values that are never a tensor (a tuple's items are kept as
# they are: only a tensor value itself is copied).
_PLAIN_VALUES = frozenset({float, int, bool, str, type(None), tuple, list})
_PARAMS = operator.itemgetter("params")


def _has_closure(args: Any, kwargs: Any) -> bool:
    """Was ``step()`` given a closure? (``args`` hold the optimizer first.)"""
    if isinstance(kwargs, dict) and kwargs.get("closure") is not None:
        return True
    return isinstance(args, tuple) and len(args) > 1 and callable(args[1])


def _on_cpu(norms: StackedNorms) -> bool:
    return norms.norms is None or norms.norms.is_cpu
