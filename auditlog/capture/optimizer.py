"""Optimizer steps: hyperparameters of every param group and per-parameter norms.

The pre hook sees the gradients before the step (and copies the parameters when
exact update norms are due); the post hook counts the step, emits the step's
module activity, runs the periodic structural check and snapshot, and then the
``optimizer_step`` event, so "the state after step N" is exactly the events up
to that event. It also decides whether the next step is sampled (per-call hooks
present) or not.
"""

from __future__ import annotations

from typing import Any

import torch

from auditlog.capture.base import RecorderBase, class_name
from auditlog.capture.payloads import NonFiniteCount, StackedNorms
from auditlog.capture.torch_compat import compile_guard, foreach_copy_, foreach_sub_, local_view
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
            self.check_before_step(optimizer, params)  # nonfinite.py
            policy = self.policy
            due = (policy.update_norms or policy.param_norms) and policy.norms_due(self.step)
            before = self._copy_before(optimizer, params) if due and policy.update_norms else None
            self._pending_steps[id(optimizer)] = (before, due)
        except Exception as exc:
            self.fault("optimizer_step_pre_hook", exc)
        return None

    def _copy_before(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The parameters' values before the step, for exact update norms.

        CPU: copied into buffers kept per optimizer (a fresh clone of every
        parameter cost ~7x more, measured on the 98-parameter MLP: each new
        allocation of a large block faults its pages in). Other devices: clones,
        so the caching allocator reuses their memory and nothing stays resident
        between steps.
        """
        with torch.no_grad():
            detached = [local_view(p.detach()) for p in params]  # a DTensor: this rank's shard
            if not detached or any(p.device.type != "cpu" for p in detached):
                return [p.clone() for p in detached]
            buffers = self._before_buffers.get(optimizer)
            if buffers is None or len(buffers) != len(detached) or any(
                b.shape != p.shape or b.dtype != p.dtype for b, p in zip(buffers, detached, strict=True)
            ):
                buffers = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in detached]
                self._before_buffers[optimizer] = buffers
            foreach_copy_(buffers, detached)
            return buffers

    @compile_guard
    def _on_step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        try:
            self.step += 1
            optimizer_id, _ = self.optimizers.get(optimizer)
            count = self._optimizer_steps.get(optimizer_id, 0) + 1
            self._optimizer_steps[optimizer_id] = count
            before, due = self._pending_steps.pop(id(optimizer), (None, False))
            params = [p for group in optimizer.param_groups for p in group["params"]]
            payload = self._step_payload(optimizer, params, before, due)
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
            if snap or self.step % self.policy.check_every == 0:
                self.check(None, "optimizer_step")
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

    def _step_payload(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        before: list[torch.Tensor] | None,
        due: bool,
    ) -> dict[str, Any]:
        """The ``optimizer_step`` payload: hyperparameters and per-parameter norms.

        Gradient norms every step (one fused pass); parameter and update norms on
        the steps ``norms_every`` selects. On CPU the norms are read at once (no
        device to wait for; the writer then only encodes), elsewhere they stay on
        the device until the writer reads them.
        """
        tensor_ids, group_ids = self._ids_of(optimizer, params)
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
        plans = self._norm_plans
        key = id(optimizer)
        identity = self._param_ids[key][0]  # set by _ids_of above: the parameters' identity
        with torch.no_grad():
            grad_norms: Clean | StackedNorms | None = None
            nonfinite: int | NonFiniteCount | None = None
            if policy.grad_norms:
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
                stacked = StackedNorms(plans.norms(plan_key, identity, grads), len(params), present)  # type: ignore[arg-type]
                if _on_cpu(stacked):
                    grad_norms = stacked.resolve()
                    nonfinite = stacked.nonfinite()
                    if nonfinite:
                        self.flag_nonfinite()
                else:
                    grad_norms, nonfinite = stacked, NonFiniteCount(stacked, self.flag_nonfinite)
            param_norms: Clean | StackedNorms | None = None
            update_norms: Clean | StackedNorms | None = None
            if due:
                detached = [local_view(p.detach()) for p in params]
                if policy.param_norms:
                    param_norms = _read_if_cpu(StackedNorms(plans.norms((key, "param"), identity, detached), len(params)))
                if before is not None and len(before) == len(detached):
                    if detached:
                        foreach_sub_(before, detached)  # before := before - after, in place
                    update_norms = _read_if_cpu(
                        StackedNorms(plans.norms((key, "update"), identity, before), len(params))
                    )
        return {
            "param_groups": groups,
            "tensor_ids": tensor_ids,
            "grad_norm": grad_norms,
            "nonfinite_grads": nonfinite,
            "update_norm": update_norms,
            "param_norm": param_norms,
        }

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


def _on_cpu(norms: StackedNorms) -> bool:
    return norms.norms is None or norms.norms.device.type == "cpu"


def _read_if_cpu(norms: StackedNorms) -> Clean | StackedNorms:
    """CPU norms are read now (nothing to wait for); device norms stay lazy for the writer."""
    return norms.resolve() if _on_cpu(norms) else norms
