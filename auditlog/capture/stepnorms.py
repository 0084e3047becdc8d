"""What optimizer steps record of their parameters: ids, and norms through cached plans.

The optimizer's hooks (``optimizer.py``) ask this part for each step's numbers.
Per optimizer it keeps the tensor ids of its parameters, packed once
(``core.packed.pack_ints``), and the plans that compute per-parameter norms in a
few ops (``norms.py``): gradient norms, parameter norms, the copy before the
step and the update norms after it.

It also measures the *raw* gradient norms: the gradients as the last
``backward()`` left them (``backward.py`` calls ``backward_finished``), before any
clipping or unscaling. The step then uses them as the norms of the gradients
the update consumed when no gradient was replaced or changed in place since
(``fingerprint_of``); otherwise it measures again, and both are recorded.

Until every trainable parameter has an optimizer seen stepping, each backward also
notes the in-place versions of the parameters none holds: if they changed by the next
backward with no optimizer step seen in between, something updated them where no hook
could see it (an optimizer step inside ``torch.compile``, which traces the step hooks
away; an update by hand), and the record says so (``untracked_updates``) rather than
look complete.
"""

from __future__ import annotations

import operator
import sys
import warnings
import weakref
from itertools import chain
from pathlib import Path
from typing import NamedTuple

import torch

from auditlog.capture.byobject import ByObject
from auditlog.capture.construction import ConstructionHooks
from auditlog.capture.context import RecordingContext
from auditlog.capture.norms import NONE_ID, NormPlan, PlanCache, norms_of
from auditlog.capture.payloads import StackedNorms
from auditlog.capture.roots import RootTracking
from auditlog.capture.torch_compat import local_view, set_grad_mode, tensor_version
from auditlog.core.chain import Clean
from auditlog.core.packed import pack_ints


class StepNorms:
    """Per optimizer: its parameters' ids and norm plans, and the gradients the last
    backward left. The optimizer steps' part (``OptimizerHooks.norms``); it reads the
    structure version (``construction``) and the live roots (``roots``)."""

    def __init__(
        self, ctx: RecordingContext, construction: ConstructionHooks, roots: RootTracking
    ) -> None:
        self.ctx = ctx
        self.construction = construction
        self.roots = roots
        # the plan of each optimizer's parameters with its reusable buffers for the
        # pre-step copy (norms.py; weakly keyed: gone with the optimizer); the ids of
        # its parameters
        self._param_plans = PlanCache(weak=True)
        self._param_ids: dict[int, tuple[tuple[int, ...], Clean, list[Clean]]] = {}
        # how to compute each optimizer's per-parameter norms in a few ops (norms.py);
        # the optimizers whose parameters include DTensors (norms of local shards)
        self._norm_plans = PlanCache()
        self._sharded: set[int] = set()
        # Optimizers seen stepping (weakly): the ones whose raw norms a backward takes.
        # (id -> weak reference: a lookup per hook, where a WeakSet made a new reference
        # with a callback at every add)
        self._stepping: dict[int, weakref.ref[torch.optim.Optimizer]] = {}
        # Per optimizer, the gradients the last backward left (``_Raw``), until its step.
        self._raw: ByObject[_Raw] = ByObject()
        # The same for trainable parameters of the roots that no optimizer seen so far
        # holds (the first step of each optimizer), by parameter id.
        self._unbound: _Unbound | None = None
        self._all_bound: object = (
            None  # the structure at which every trainable parameter had an optimizer
        )
        # Updates no step hook saw (``_look_for_untracked``): backward passes after which
        # some were found, the step count at the first, the tensor ids at the last.
        self._untracked_backwards = 0
        self._untracked_first = 0
        self._untracked_last: list[int] = []

    def forget_plan(self, optimizer: torch.optim.Optimizer) -> None:
        """The plan of the optimizer's parameters no longer fits them (a shape or dtype
        changed in place): the next use builds a new one."""
        self._param_plans.forget(optimizer)

    def forget_raw(self, optimizer: torch.optim.Optimizer) -> None:
        """The step these raw norms were for was skipped: they are nobody's now."""
        self._raw.pop(optimizer)

    def backward_finished(self) -> None:
        """An outermost ``backward()`` returned: measure the gradients it left (raw norms)."""
        if not self.ctx.policy.grad_norms:
            return
        enabled = grad_disabled()
        try:
            known = self._stepping_now()
            measured = []
            for optimizer in known:
                params = optimizer_params(optimizer)
                if id(optimizer) not in self._param_ids:
                    self.ids_of(optimizer, params)
                # Read once for both (a parameter's ``.grad`` costs ~0.5 us: 5,000 of them
                # were read twice here and once more by the pre hook)
                grads = list(map(_GRAD, params))
                self._raw.set(
                    optimizer,
                    _Raw(self.grad_norms(optimizer, params, grads), fingerprint_of(grads)),
                )
                measured.append(params)
            # Looking for parameters no optimizer holds walks every root: only until none
            # is left, and again once the structure or the optimizers change.
            structure = (
                self.construction.registrations,
                tuple(map(id, known)),
                tuple(map(len, measured)),
            )
            if structure == self._all_bound:
                self._unbound = None
                return
            covered = {id(p) for params in measured for p in params}
            self._unbound = self._measure_unbound(covered, self._unbound)
            self._all_bound = structure if self._unbound is None and known else None
        finally:
            grad_restored(enabled)

    def untracked_summary(self) -> None:
        """Run end: if parameters were found updated with no step seen more than once,
        one ``untracked_updates`` event with the totals (the first finding had its own)."""
        if self._untracked_backwards > 1:
            self._emit_untracked(self._untracked_last, "run_end")

    def _look_for_untracked(
        self, params: list[torch.Tensor], versions: dict[int, int], previous: _Unbound | None
    ) -> None:
        """Did parameters no known optimizer holds change in place since the last backward,
        with no optimizer step seen in between (the step count unmoved)? Then the record
        misses those updates, and says so (``untracked_updates``)."""
        if previous is None or previous.step != self.ctx.step:
            return  # a step was seen in between (or this is the first look)
        before = previous.versions
        changed = [p for p in params if before.get(id(p), versions[id(p)]) != versions[id(p)]]
        if not changed:
            return
        self._untracked_backwards += 1
        lookup = self.ctx.tensors.lookup
        self._untracked_last = [n for n in map(lookup, changed) if n is not None]
        if self._untracked_backwards == 1:
            self._untracked_first = self.ctx.step
            self._emit_untracked(self._untracked_last, "backward")
            self._warn_untracked(len(changed))

    def _emit_untracked(self, tensor_ids: list[int], where: str) -> None:
        self.ctx.emit(
            "untracked_updates",
            payload={
                "tensor_ids": Clean(pack_ints(tensor_ids)),
                "backwards": self._untracked_backwards,
                "first_step": self._untracked_first,
                "detected_at": where,
            },
        )

    def _warn_untracked(self, count: int) -> None:
        warned = self.ctx.warned
        if "untracked_updates" in warned:
            return
        warned.add("untracked_updates")
        try:
            warnings.warn(
                f"auditlog: {count} parameter(s) changed between two backward() passes with no "
                "optimizer step auditlog saw (an optimizer step inside torch.compile, or an "
                "update by hand?): those updates are not recorded as optimizer steps "
                "(recorded as an untracked_updates event; warned once)",
                RuntimeWarning,
                stacklevel=_outside_stacklevel(),
            )
        except Exception:  # -W error: the event is the record
            pass

    def note_stepping(self, optimizer: torch.optim.Optimizer) -> None:
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

    def _measure_unbound(self, covered: set[int], previous: _Unbound | None) -> _Unbound | None:
        """Raw norms of the roots' trainable parameters that no known optimizer holds, and
        their in-place versions: changed since ``previous`` (the last backward's) with no
        step in between, they were updated where no step hook saw it (``_look_for_untracked``)."""
        params: list[torch.Tensor] = []
        seen = set(covered)
        for root in self.roots.live_roots():
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
        held = list(map(_GRAD, params))
        norms = norms_of([local_view(g) for g in held])
        assert norms is not None
        versions = dict(zip(map(id, params), map(tensor_version, params), strict=True))
        self._look_for_untracked(params, versions, previous)
        grad_ids, grad_versions = fingerprint_of(held)
        return _Unbound(
            norms,
            {id(p): i for i, p in enumerate(params)},
            dict(zip(map(id, params), zip(grad_ids, grad_versions, strict=True), strict=True)),
            versions,
            self.ctx.step,
        )

    def _raw_of(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> _Raw | None:
        """What the last backward left for this optimizer's parameters, or None (no backward
        since its last step: gradients set by other means, or a new optimizer's parameters
        the roots do not hold)."""
        raw = self._raw.pop(optimizer)
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
        # (a parameter not measured had no gradient)
        pairs = [unbound.fingerprint.get(id(p), _ABSENT) for p in params]
        grad_ids, grad_versions = zip(*pairs, strict=True)
        fingerprint = (grad_ids, grad_versions)
        norms = StackedNorms(
            unbound.norms[picked], len(params), None if len(present) == len(params) else present
        )
        return _Raw(norms, fingerprint)

    def used_grad_norms(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> Grads:
        """The norms of the gradients the update consumes now, and the raw ones beside them."""
        raw = self._raw_of(optimizer, params)
        scale = getattr(
            optimizer, "grad_scale", None
        )  # set by GradScaler.step for fused optimizers
        modified: bool | None
        grads = list(map(_GRAD, params))
        if raw is not None and fingerprint_of(grads) == raw.fingerprint:
            used, modified = raw.norms, False
        else:
            used = self.grad_norms(optimizer, params, grads)
            modified = None if raw is None else True
        if isinstance(scale, torch.Tensor) and used.norms is not None:
            with torch.no_grad():
                unscaled = used.norms / scale.detach().to(used.norms.device, torch.float32)
            used, modified = StackedNorms(unscaled, used.size, used.present), True
        return Grads(used, raw.norms if raw is not None and modified else None, modified)

    def param_plan(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> tuple[NormPlan, list[torch.Tensor]]:
        """The plan of the optimizer's parameters (norms, copies, differences) and the
        tensors it works on: the parameters themselves, or each DTensor's local shard."""
        key = id(optimizer)
        tensors = [local_view(p.detach()) for p in params] if key in self._sharded else params
        return self._param_plans.plan(optimizer, self._param_ids[key][0], tensors), tensors

    def grad_norms(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        grads: list[torch.Tensor | None],
    ) -> StackedNorms:
        """The norms of the parameters' gradients ``grads`` (read from ``params`` by the
        caller, once; absent ones marked), plan cached.

        Through the parameters' plan when every gradient is present and strided
        (``NormPlan.grad_norms``); otherwise the gradients present get a plan of
        their own."""
        key = id(optimizer)
        identity = self._param_ids[key][0]  # set by ids_of (the pre hook calls it first)
        enabled = grad_disabled()
        try:
            if key not in self._sharded:
                try:
                    norms = self.param_plan(optimizer, params)[0].grad_norms(grads)
                except (
                    RuntimeError
                ):  # the plan no longer fits (a shape changed in place), or mixed layouts
                    self._param_plans.forget(optimizer)
                    norms = None
                if norms is not None:
                    return StackedNorms(norms, len(params))
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
        finally:
            grad_restored(enabled)

    def ids_of(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> tuple[Clean, list[Clean]]:
        """Tensor ids of the optimizer's parameters, in order and per group, packed
        (``core.packed.pack_ints``) and cached: a step then costs nothing for them.

        The cache key is the identity of every parameter object: the optimizer
        holds them alive, so an unchanged key means unchanged objects.
        """
        key = tuple(map(id, params)) + tuple(map(len, map(_PARAMS, optimizer.param_groups)))
        cached = self._param_ids.get(id(optimizer))
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        ids = self.ctx.tensors
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
_GRAD = operator.attrgetter("grad")
_PARAMS = operator.itemgetter("params")


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter of the optimizer's groups, in order. The iteration runs in C: as a
    comprehension it cost ~5 bytecodes per parameter, three times a step."""
    return list(chain.from_iterable(map(_PARAMS, optimizer.param_groups)))


class _Raw(NamedTuple):
    """The gradients one backward left for one optimizer: their norms, and which gradient
    objects at which in-place versions they were (``fingerprint_of``)."""

    norms: StackedNorms
    fingerprint: Fingerprint


class _Unbound(NamedTuple):
    """Raw norms of parameters no optimizer seen so far holds, by ``id`` of the parameter."""

    norms: torch.Tensor
    positions: dict[int, int]  # id of the parameter -> its row of ``norms``
    fingerprint: dict[int, tuple[int, int]]  # id of the parameter -> (id, version) of its gradient
    versions: dict[int, int]  # id of the parameter -> its in-place version counter
    step: int  # the run's step count when measured


class Grads(NamedTuple):
    """A step's gradient norms: ``used`` (what the update consumed), ``raw`` (what the last
    backward left, only when it differs), ``modified`` (changed between the two: True;
    unchanged: False; no backward seen since the last step: None)."""

    used: StackedNorms
    raw: StackedNorms | None
    modified: bool | None


_INSIDE = (str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).resolve().parent))


def _outside_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, for the caller's caller, that names the first frame
    outside auditlog and torch: the user's ``loss.backward()``."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level


def grad_disabled() -> bool:
    """Turn autograd recording off on this thread, as ``torch.no_grad()`` does, without
    its objects (the step hooks do this every step; ``torch.set_grad_enabled`` builds
    a context manager too); returns the mode to give ``grad_restored``."""
    enabled = torch.is_grad_enabled()
    if enabled:
        set_grad_mode(False)
    return enabled


def grad_restored(enabled: bool) -> None:
    """Put back the mode ``grad_disabled`` returned."""
    if enabled:
        set_grad_mode(True)


Fingerprint = tuple[tuple[int, ...], tuple[int, ...]]
"""``fingerprint_of``: the ids of the gradient objects and their in-place versions."""

_ABSENT = (NONE_ID, -1)
"""A gradient that is None, in a ``Fingerprint``."""


def fingerprint_of(grads: list[torch.Tensor | None]) -> Fingerprint:
    """Which gradient object each parameter holds and its in-place version counter: equal
    fingerprints mean no gradient was replaced or changed in place since
    (``clip_grad_norm_``, ``GradScaler.unscale_``, ``p.grad.mul_`` all bump the counter;
    a change through ``.data`` has its own counter and is not seen). Two flat tuples of
    ints, where a pair per gradient made 5,000 tuples a call for a model of 5,000
    parameters (garbage-collector work at every step); the iterations run in C."""
    ids = tuple(map(id, grads))
    if NONE_ID not in ids:  # (ints compared: ``None in grads`` would call Tensor.__eq__)
        return ids, tuple(map(tensor_version, grads))  # type: ignore[arg-type]
    version = tensor_version
    return ids, tuple(-1 if g is None else version(g) for g in grads)
