"""Optimizer steps: hyperparameters of every param group and per-parameter norms.

The pre hook sees the gradients before the step (and copies the parameters when
exact update norms are due); the post hook counts the step, emits the step's
module activity, runs the periodic structural check and snapshot, and then the
``optimizer_step`` event, so "the state after step N" is exactly the events up
to that event. It also decides whether the next step is sampled (per-call hooks
present) or not.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch

from auditlog.capture.base import RecorderBase, class_name
from auditlog.capture.norms import NormPlan
from auditlog.capture.payloads import NonFiniteCount, StackedNorms
from auditlog.capture.torch_compat import compile_guard, local_view
from auditlog.core.chain import Clean
from auditlog.core.errors import RecordingFailedError, one_line
from auditlog.core.packed import pack_ints


class OptimizerHooks(RecorderBase):
    """The optimizer step pre and post hooks."""

    @compile_guard
    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self.call_stack().clear()  # a forward that died on BaseException left stale entries
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if self._step_scanned != self._registrations or self._lazy:
                # The structure changed since the last step: per-call hooks may be
                # absent, so find the models these parameters belong to from here.
                self._step_scanned = self._registrations
                self.track_owners(params)
                if self._lazy:
                    self.materialized("optimizer_step")
                if self._unsealed:
                    self.seal(None, "optimizer_step", tensors=params)
            policy = self.policy
            ids = self._ids_of(optimizer, params)  # once per step: the post hook reuses them
            # The gradients the update uses, measured once: for the step record and
            # for nonfinite_check (debug took them twice, here and after the step).
            grad_norms = (
                self._grad_norms(optimizer, params) if policy.grad_norms or policy.nonfinite_check else None
            )
            self.check_before_step(optimizer, params, grad_norms)  # nonfinite.py
            due = (policy.update_norms or policy.param_norms) and policy.norms_due(self.step)
            before = self._copy_before(optimizer, params) if due and policy.update_norms else None
            self._pending_steps[optimizer] = _Pending(
                params, ids, before, due, grad_norms if policy.grad_norms else None
            )
        except Exception as exc:
            self.fault("optimizer_step_pre_hook", exc)
        return None

    def _param_plan(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[NormPlan, list[torch.Tensor]]:
        """The plan of the optimizer's parameters (norms, copies, differences) and the
        tensors it works on: the parameters themselves, or each DTensor's local shard."""
        key = id(optimizer)
        tensors = [local_view(p.detach()) for p in params] if key in self._sharded else params
        return self._param_plans.plan(optimizer, self._param_ids[key][0], tensors), tensors

    def _copy_before(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The parameters' values before the step, for exact update norms
        (``NormPlan.copy``: stacked per group, into buffers the plan keeps on CPU)."""
        with torch.no_grad():
            plan, tensors = self._param_plan(optimizer, params)
            try:
                return plan.copy(tensors)
            except RuntimeError:  # a parameter changed shape or dtype in place (``.data = ``)
                self._param_plans.forget(optimizer)
                plan, tensors = self._param_plan(optimizer, params)
                return plan.copy(tensors)

    @compile_guard
    def _on_step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self.step += 1
            self._step_time()
            optimizer_id, _ = self.optimizers.get(optimizer)
            count = self._optimizer_steps.get(optimizer_id, 0) + 1
            self._optimizer_steps[optimizer_id] = count
            pending = self._pending_steps.pop(optimizer, None)
            if pending is not None and len(pending.params) == sum(len(g["params"]) for g in optimizer.param_groups):
                params, ids = pending.params, pending.ids
            else:  # the pre hook did not run (or the groups changed inside the step)
                params = [p for group in optimizer.param_groups for p in group["params"]]
                ids = self._ids_of(optimizer, params)
                pending = _Pending(params, ids, None, False, None)
            payload = self._step_payload(optimizer, params, ids, pending)
            payload.update(
                optimizer_id=optimizer_id,
                optimizer_class=class_name(optimizer),
                optimizer_step=count,
            )
            # Structure check and snapshot come before the optimizer_step event, so
            # "the state after step N" is exactly the events up to that event.
            self.check_after_step(optimizer, params)  # nonfinite.py (keep_finite_state)
            self.flush_metrics()  # this step's losses and module activity, before its optimizer_step
            self.flush_activity()
            every = self.policy.snapshot_every
            snap = every > 0 and self.step % every == 0
            if snap or self.step % self._check_interval == 0:
                self._timed_check()
            if snap:
                self.snapshot(self.live_roots(), "step")
            self.emit("optimizer_step", None, None, payload)
            # Decide the next step: per-call hooks only where activity is sampled.
            self.sampling = self.policy.samples(self.step) or (
                self.policy.activity and self.policy.sample_nonfinite and self._nonfinite
            )
            self.update_call_hooks()
            if self.step_barrier is not None:
                self.step_barrier()
        except Exception as exc:
            self.fault("optimizer_step_post_hook", exc)
        if self.policy.on_error == "fail":
            failure = self.failure()
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
        to the next one (``Policy.check_interval``: 26-50 ms at 5,000 modules, measured,
        2-4% of a 140 ms step when taken every 10 steps)."""
        began = time.perf_counter()
        self.check(None, "optimizer_step")
        cost = time.perf_counter() - began
        self._check_s = cost if self._check_s == 0 else 0.7 * self._check_s + 0.3 * cost
        self._check_interval = self.policy.check_interval(self._check_s, self._step_s)

    def _step_payload(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        ids: tuple[Clean, list[Clean]],
        pending: _Pending,
    ) -> dict[str, Any]:
        """The ``optimizer_step`` payload: hyperparameters and per-parameter norms.

        Gradient norms every step (measured by the pre hook: the gradients the
        update used; taken here only when the pre hook did not run); parameter and
        update norms on the steps ``norms_every`` selects. On CPU the norms are read
        at once (no device to wait for; the writer then only encodes), elsewhere
        they stay on the device until the writer reads them.
        """
        tensor_ids, group_ids = ids
        groups: list[dict[str, Any]] = []
        for group, members in zip(optimizer.param_groups, group_ids, strict=True):
            hyper = {
                key: (value.detach().clone() if isinstance(value, torch.Tensor) else value)
                for key, value in group.items()
                if key != "params"
            }
            hyper["params"] = members
            groups.append(hyper)
        policy = self.policy
        with torch.no_grad():
            grad_norms: Clean | StackedNorms | None = None
            nonfinite: int | NonFiniteCount | None = None
            if policy.grad_norms:
                stacked = pending.grad_norms
                if stacked is None or stacked.size != len(params):
                    stacked = self._grad_norms(optimizer, params)
                if _on_cpu(stacked):
                    grad_norms = stacked.resolve()
                    nonfinite = stacked.nonfinite()
                    if nonfinite:
                        self.flag_nonfinite()
                else:
                    grad_norms, nonfinite = stacked, NonFiniteCount(stacked, self.flag_nonfinite)
            param_norms: Clean | StackedNorms | None = None
            update_norms: Clean | StackedNorms | None = None
            if pending.due:
                plan, tensors = self._param_plan(optimizer, params)
                try:
                    if policy.param_norms:
                        param_norms = _read_if_cpu(StackedNorms(plan.norms(tensors), len(params)))
                    if pending.before is not None:  # before := before - after, in place
                        update_norms = _read_if_cpu(
                            StackedNorms(plan.difference_norms(pending.before, tensors), len(params))
                        )
                except RuntimeError:  # a parameter changed shape or dtype inside the step
                    self._param_plans.forget(optimizer)
        return {
            "param_groups": groups,
            "tensor_ids": tensor_ids,
            "grad_norm": grad_norms,
            "nonfinite_grads": nonfinite,
            "update_norm": update_norms,
            "param_norm": param_norms,
        }

    def _grad_norms(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> StackedNorms:
        """The norms of the parameters' gradients (absent ones marked), plan cached.

        Read straight from the parameters through their plan when every gradient
        is present and strided (``NormPlan.grad_norms``); otherwise the gradients
        present get a plan of their own."""
        key = id(optimizer)
        identity = self._param_ids[key][0]  # set by _ids_of (the pre hook calls it first)
        with torch.no_grad():
            if key not in self._sharded:
                try:
                    norms = self._param_plan(optimizer, params)[0].grad_norms(params)
                except RuntimeError:  # the plan no longer fits (a shape changed in place), or mixed layouts
                    self._param_plans.forget(optimizer)
                    norms = None
                if norms is not None:
                    return StackedNorms(norms, len(params))
            grads = [p.grad for p in params]
            present: list[int] | None = None
            if not all(g is not None and g.layout is _STRIDED for g in grads):
                present = [i for i, g in enumerate(grads) if g is not None and g.layout is _STRIDED]
                grads = [grads[i] for i in present]
                plan_key: object = (key, "grad", tuple(present))
            else:
                plan_key = (key, "grad")
            if key in self._sharded:
                grads = [local_view(g) for g in grads]  # type: ignore[arg-type]
            return StackedNorms(self._norm_plans.norms(plan_key, identity, grads), len(params), present)  # type: ignore[arg-type]

    def _ids_of(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[Clean, list[Clean]]:
        """Tensor ids of the optimizer's parameters, in order and per group, packed
        (``core.packed.pack_ints``) and cached: a step then costs nothing for them.

        The cache key is the identity of every parameter object: the optimizer
        holds them alive, so an unchanged key means unchanged objects.
        """
        key = tuple(map(id, params)) + tuple(len(g["params"]) for g in optimizer.param_groups)
        cached = self._param_ids.get(id(optimizer))
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        ids = self.tensors
        ids.note_optimizer(optimizer, params)  # a tensor no module holds is known by its optimizer
        tensor_ids = Clean(pack_ints([ids.get(p, optimizer)[0] for p in params]))
        group_ids = [Clean(pack_ints([ids.get(p, optimizer)[0] for p in group["params"]])) for group in optimizer.param_groups]
        self._param_ids[id(optimizer)] = (key, tensor_ids, group_ids)
        if any(local_view(p) is not p for p in params):
            self._sharded.add(id(optimizer))
        else:
            self._sharded.discard(id(optimizer))
        return tensor_ids, group_ids


_STRIDED = torch.strided


class _Pending(NamedTuple):
    """What the pre hook found for one optimizer's step, for its post hook."""

    params: list[torch.Tensor]
    ids: tuple[Clean, list[Clean]]
    before: list[torch.Tensor] | None  # the parameters before the step (``NormPlan.copy``)
    due: bool  # parameter and update norms this step
    grad_norms: StackedNorms | None


def _on_cpu(norms: StackedNorms) -> bool:
    return norms.norms is None or norms.norms.device.type == "cpu"


def _read_if_cpu(norms: StackedNorms) -> Clean | StackedNorms:
    """CPU norms are read now (nothing to wait for); device norms stay lazy for the writer."""
    return norms.resolve() if _on_cpu(norms) else norms
