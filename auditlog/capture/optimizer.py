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

Beside them, the *raw* norms: the gradients as the last ``backward()`` left them
(``backward.py`` calls ``backward_finished``), before any clipping or unscaling. If
no gradient was replaced or changed in place since (``grad_fingerprint``), the
two are one measurement, taken once; otherwise both are recorded.

The pre hook also copies the parameters when exact update norms are due; the
post hook counts the step, emits the step's module activity, runs the periodic
structural check and snapshot, and then the ``optimizer_step`` event, so "the
state after step N" is exactly the events up to that event. It also decides
whether the next step is sampled (per-call hooks present) or not. A step a
``GradScaler`` skips is a ``step_skipped`` event, not a step.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, NamedTuple

import torch

from auditlog.capture.base import RecorderBase, class_name
from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.norms import NormPlan, norms_of
from auditlog.capture.payloads import StackedNorms, StepPayload
from auditlog.capture.torch_compat import compile_guard, local_view, tensor_version
from auditlog.core.chain import Clean
from auditlog.core.errors import RecordingFailedError, one_line
from auditlog.core.packed import pack_ints
from auditlog.core.policy import Policy


class OptimizerHooks(RecorderBase):
    """The optimizer step pre and post hooks, and the gradients each backward left."""

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        super().__init__(buffer, policy)
        # Optimizers seen stepping (weakly): the ones whose raw norms a backward takes.
        # (id -> weak reference: a lookup per hook, where a WeakSet made a new reference
        # with a callback at every add)
        self._stepping: dict[int, weakref.ref[torch.optim.Optimizer]] = {}
        # Per optimizer, the gradients the last backward left (``_Raw``), until its step.
        self._raw: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Raw] = (
            weakref.WeakKeyDictionary()
        )
        # The same for trainable parameters of the roots that no optimizer seen so far
        # holds (the first step of each optimizer), by parameter id.
        self._unbound: _Unbound | None = None
        self._all_bound: object = (
            None  # the structure at which every trainable parameter had an optimizer
        )
        self._post_calls = 0  # post hooks run (GradScaler.step: did the optimizer step?)
        # ids of the optimizers whose step() is running, outermost first: a step inside
        # another's (ZeroRedundancyOptimizer's local optimizer, Lookahead's base) is part of
        # the outer one and is not recorded apart
        self._running: list[int] = []

    # ------------------------------------------------------------------ backward
    def backward_finished(self) -> None:
        """An outermost ``backward()`` returned: measure the gradients it left (raw norms)."""
        if not self.policy.grad_norms:
            return
        with torch.no_grad():
            known = self._stepping_now()
            covered: set[int] = set()
            sizes = []
            for optimizer in known:
                params = [p for group in optimizer.param_groups for p in group["params"]]
                if id(optimizer) not in self._param_ids:
                    self._ids_of(optimizer, params)
                self._raw[optimizer] = _Raw(
                    self._grad_norms(optimizer, params), grad_fingerprint(params)
                )
                covered.update(map(id, params))
                sizes.append(len(params))
            # Looking for parameters no optimizer holds walks every root: only until none
            # is left, and again once the structure or the optimizers change.
            structure = (self._registrations, tuple(map(id, known)), tuple(sizes))
            if structure == self._all_bound:
                self._unbound = None
                return
            self._unbound = self._measure_unbound(covered)
            self._all_bound = structure if self._unbound is None and known else None

    def _note_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        ref = self._stepping.get(id(optimizer))
        if ref is None or ref() is not optimizer:  # new, or a dead one's id reused
            self._stepping[id(optimizer)] = weakref.ref(optimizer)

    def _stepping_now(self) -> list[torch.optim.Optimizer]:
        """The optimizers seen stepping that are alive, in the order first seen."""
        known = []
        dead = []
        for key, ref in self._stepping.items():
            optimizer = ref()
            if optimizer is None:
                dead.append(key)
            else:
                known.append(optimizer)
        for key in dead:
            del self._stepping[key]
        return known

    def _measure_unbound(self, covered: set[int]) -> _Unbound | None:
        """Raw norms of the roots' trainable parameters that no known optimizer holds."""
        params: list[torch.Tensor] = []
        seen = set(covered)
        for root in self.live_roots():
            for p in root.parameters():
                if (
                    id(p) not in seen
                    and p.requires_grad
                    and p.grad is not None
                    and p.grad.layout is _STRIDED
                ):
                    seen.add(id(p))
                    params.append(p)
        if not params:
            return None
        grads: list[torch.Tensor] = [local_view(p.grad) for p in params]  # type: ignore[arg-type]
        norms = norms_of(grads)
        assert norms is not None
        return _Unbound(
            norms,
            {id(p): i for i, p in enumerate(params)},
            dict(zip(map(id, params), grad_fingerprint(params), strict=True)),
        )

    def _raw_of(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> _Raw | None:
        """What the last backward left for this optimizer's parameters, or None (no backward
        since its last step: gradients set by other means, or a new optimizer's parameters
        the roots do not hold)."""
        raw = self._raw.pop(optimizer, None)
        if raw is not None:
            return raw if raw.norms.size == len(params) else None
        unbound = self._unbound
        if unbound is None or not params:
            return None
        index = unbound.positions
        positions = [index.get(id(p)) for p in params]
        present = [i for i, pos in enumerate(positions) if pos is not None]
        if not present:
            return None
        picked = torch.tensor(
            [positions[i] for i in present], dtype=torch.long, device=unbound.norms.device
        )
        fingerprint = tuple(unbound.fingerprint.get(id(p)) for p in params)
        norms = StackedNorms(
            unbound.norms[picked], len(params), None if len(present) == len(params) else present
        )
        return _Raw(norms, fingerprint)

    def _used_grad_norms(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> _Grads:
        """The norms of the gradients the update consumes now, and the raw ones beside them."""
        raw = self._raw_of(optimizer, params)
        scale = getattr(
            optimizer, "grad_scale", None
        )  # set by GradScaler.step for fused optimizers
        modified: bool | None
        if raw is not None and grad_fingerprint(params) == raw.fingerprint:
            used, modified = raw.norms, False
        else:
            used, modified = self._grad_norms(optimizer, params), (None if raw is None else True)
        if isinstance(scale, torch.Tensor) and used.norms is not None:
            with torch.no_grad():
                unscaled = used.norms / scale.detach().to(used.norms.device, torch.float32)
            used, modified = StackedNorms(unscaled, used.size, used.present), True
        return _Grads(used, raw.norms if raw is not None and modified else None, modified)

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
        self._raw.pop(optimizer, None)
        self._pending_steps.pop(optimizer, None)
        optimizer_id, _ = self.optimizers.get(optimizer)
        self.flush_metrics(skipped=True)
        self.flush_activity()
        self.emit(
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
        try:
            if self._nested(optimizer):
                return None
            self.call_stack().clear()  # a forward that died on BaseException left stale entries
            self._note_stepping(optimizer)
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
            # With a closure they do not exist yet: the post hook measures them.
            closure = _has_closure(args, kwargs)
            grads = (
                self._used_grad_norms(optimizer, params)
                if (policy.grad_norms or policy.nonfinite_check) and not closure
                else None
            )
            if not closure:
                self.check_before_step(
                    optimizer, params, grads.used if grads is not None else None
                )  # nonfinite.py
            due = (policy.update_norms or policy.param_norms) and policy.norms_due(self.step)
            before = self._copy_before(optimizer, params) if due and policy.update_norms else None
            self._pending_steps[optimizer] = _Pending(
                params, ids, before, due, grads if policy.grad_norms else None, closure
            )
        except Exception as exc:
            self.fault("optimizer_step_pre_hook", exc)
        return None

    def _param_plan(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> tuple[NormPlan, list[torch.Tensor]]:
        """The plan of the optimizer's parameters (norms, copies, differences) and the
        tensors it works on: the parameters themselves, or each DTensor's local shard."""
        key = id(optimizer)
        tensors = [local_view(p.detach()) for p in params] if key in self._sharded else params
        return self._param_plans.plan(optimizer, self._param_ids[key][0], tensors), tensors

    def _copy_before(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> list[torch.Tensor] | None:
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
            self._post_calls += 1
            if self._ended_nested(optimizer):
                return None
            self._note_stepping(optimizer)
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
            self.step += 1
            self._step_time()
            optimizer_id, _ = self.optimizers.get(optimizer)
            count = self._optimizer_steps.get(optimizer_id, 0) + 1
            self._optimizer_steps[optimizer_id] = count
            pending = self._pending_steps.pop(optimizer, None)
            if pending is not None and len(pending.params) == sum(
                len(g["params"]) for g in optimizer.param_groups
            ):
                params, ids = pending.params, pending.ids
            else:  # the pre hook did not run (or the groups changed inside the step)
                params = [p for group in optimizer.param_groups for p in group["params"]]
                ids = self._ids_of(optimizer, params)
                pending = _Pending(params, ids, None, False, None, True)
            if self.policy.grad_norms and (pending.closure or _has_closure(args, kwargs)):
                # The closure ran inside step(): its last evaluation's gradients are the ones used.
                pending = pending._replace(grads=self._used_grad_norms(optimizer, params))
            payload = self._step_payload(optimizer, params, ids, pending, optimizer_id, count)
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
        to the next one (``Policy.check_interval``; its cost on a wide model:
        docs/performance.md)."""
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
            tensor_keys = [key for key, value in hyper.items() if isinstance(value, torch.Tensor)]
            for key in tensor_keys:  # a tensor hyperparameter (lr as a tensor) may change in place
                hyper[key] = hyper[key].detach().clone()
            groups.append(hyper)
        policy = self.policy
        with torch.no_grad():
            grad_norms: StackedNorms | None = None
            raw_norms: StackedNorms | None = None
            modified: bool | None = None
            if policy.grad_norms:
                grads = pending.grads
                if grads is None or grads.used.size != len(params):
                    grads = self._used_grad_norms(optimizer, params)
                grad_norms, raw_norms, modified = grads.used, grads.raw, grads.modified
                if (
                    policy.activity
                    and policy.sample_nonfinite
                    and not self._nonfinite
                    and _on_cpu(grad_norms)
                    and grad_norms.any_nonfinite()
                ):
                    self.flag_nonfinite()  # the next step is sampled (the writer would say so later)
            param_norms: StackedNorms | None = None
            update_norms: StackedNorms | None = None
            if pending.due:
                plan, tensors = self._param_plan(optimizer, params)
                try:
                    if policy.param_norms:
                        param_norms = StackedNorms(plan.norms(tensors), len(params))
                    if pending.before is not None:  # before := before - after, in place
                        update_norms = StackedNorms(
                            plan.difference_norms(pending.before, tensors), len(params)
                        )
                except RuntimeError:  # a parameter changed shape or dtype inside the step
                    self._param_plans.forget(optimizer)
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
            self.flag_nonfinite,
        )

    def _grad_norms(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> StackedNorms:
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
                except (
                    RuntimeError
                ):  # the plan no longer fits (a shape changed in place), or mixed layouts
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
            return StackedNorms(
                self._norm_plans.norms(plan_key, identity, grads),  # type: ignore[arg-type]
                len(params),
                present,
            )

    def _ids_of(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> tuple[Clean, list[Clean]]:
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
        group_ids = [
            Clean(pack_ints([ids.get(p, optimizer)[0] for p in group["params"]]))
            for group in optimizer.param_groups
        ]
        self._param_ids[id(optimizer)] = (key, tensor_ids, group_ids)
        if any(local_view(p) is not p for p in params):
            self._sharded.add(id(optimizer))
        else:
            self._sharded.discard(id(optimizer))
        return tensor_ids, group_ids


_STRIDED = torch.strided


class _Raw(NamedTuple):
    """The gradients one backward left for one optimizer: their norms, and which gradient
    objects at which in-place versions they were (``grad_fingerprint``)."""

    norms: StackedNorms
    fingerprint: tuple[tuple[int, int] | None, ...]


class _Unbound(NamedTuple):
    """Raw norms of parameters no optimizer seen so far holds, by ``id`` of the parameter."""

    norms: torch.Tensor
    positions: dict[int, int]  # id of the parameter -> its row of ``norms``
    fingerprint: dict[int, tuple[int, int] | None]


class _Grads(NamedTuple):
    """A step's gradient norms: ``used`` (what the update consumed), ``raw`` (what the last
    backward left, only when it differs), ``modified`` (changed between the two: True;
    unchanged: False; no backward seen since the last step: None)."""

    used: StackedNorms
    raw: StackedNorms | None
    modified: bool | None


class _Pending(NamedTuple):
    """What the pre hook found for one optimizer's step, for its post hook."""

    params: list[torch.Tensor]
    ids: tuple[Clean, list[Clean]]
    before: list[torch.Tensor] | None  # the parameters before the step (``NormPlan.copy``)
    due: bool  # parameter and update norms this step
    grads: _Grads | None
    closure: bool  # step(closure): the gradients are measured after the step


def grad_fingerprint(params: list[torch.Tensor]) -> tuple[tuple[int, int] | None, ...]:
    """Which gradient object each parameter holds and its in-place version counter: equal
    fingerprints mean no gradient was replaced or changed in place since
    (``clip_grad_norm_``, ``GradScaler.unscale_``, ``p.grad.mul_`` all bump the counter;
    a change through ``.data`` has its own counter and is not seen)."""
    return tuple(None if (g := p.grad) is None else (id(g), tensor_version(g)) for p in params)


def _has_closure(args: Any, kwargs: Any) -> bool:
    """Was ``step()`` given a closure? (``args`` hold the optimizer first.)"""
    if isinstance(kwargs, dict) and kwargs.get("closure") is not None:
        return True
    return isinstance(args, tuple) and len(args) > 1 and callable(args[1])


def _on_cpu(norms: StackedNorms) -> bool:
    return norms.norms is None or norms.norms.device.type == "cpu"
