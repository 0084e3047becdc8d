"""The recorder's shared state and the one way records leave the capture layer (``emit``).

``Recorder`` (``recorder.py``) is assembled from one mixin per concern:
construction (``construction.py``), roots and snapshots (``roots.py``),
structural checks (``structure.py``), module activity (``activity.py``) and
optimizer steps (``optimizer.py``). They share the state defined here; the few
calls that cross concerns are declared here and implemented by their mixin.

Forensics: metrics (``metrics.py``: the loss every step, user-logged values),
FLOPs of one step (``flops.py``) and the first non-finite gradient
(``nonfinite.py``) are mixins too.

Rules every hook follows (docs/how-it-works.md, docs/hooks.md):
- return ``None``: a non-None return value would replace the tensor or parameter;
- never raise into user code: faults become ``recorder_error`` records and one
  warning per place;
- never change numerics or touch the RNG: statistics run on detached tensors and
  are only read back on the writer thread;
- stay cheap: no SQL, JSON, hashing or I/O; a record is a tuple.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.hostbuffers import HostBuffers
from auditlog.capture.ids import ObjectIds, TensorIds
from auditlog.capture.norms import PlanCache
from auditlog.capture.registrations import PENDING_MAX, Registrations
from auditlog.capture.source import Site, construction_or_attach_site
from auditlog.capture.torch_compat import buffers_of, parameters_of
from auditlog.core.chain import Clean
from auditlog.core.policy import Policy
from auditlog.core.replay import STATE_KINDS, ModelState, apply

if TYPE_CHECKING:
    from auditlog.capture.payloads import SnapshotItems

MAX_TENSORS = 4
# Activity entries held before they are emitted anyway (a loop of forward calls
# without optimizer steps, e.g. evaluation, must not grow memory without bound).
ACTIVITY_FLUSH = 4096


INERT_EVENT = "auditlog.inert_hook"


def inert_hook() -> Callable[..., None]:
    """A hook that does nothing and returns None, built from the standard library only.

    What a recorder's hook on a user's module or tensor becomes in a copy or a
    pickle of it (``copy.deepcopy(model)``, ``torch.save(model)`` during a
    recording): the copy must not call into the recorder, must not need auditlog
    to be loaded, and must not fail to pickle because the recorder holds locks.
    ``sys.audit`` with an event name of ours ignores its arguments.
    """
    return functools.partial(sys.audit, INERT_EVENT)


class InertWhenCopied:
    """For hook objects the recorder leaves on user objects: copies and pickles are inert."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (functools.partial, (sys.audit, INERT_EVENT))

    def __copy__(self) -> Callable[..., None]:
        return inert_hook()

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        return inert_hook()


class ModuleTap(InertWhenCopied):
    """The recorder's hook on one of the user's modules (loss modules, roots): calls ``target``."""

    __slots__ = ("target",)

    def __init__(self, target: Callable[..., None]) -> None:
        self.target = target

    def __call__(self, *args: Any) -> None:
        return self.target(*args)


def class_name(obj: object) -> str:
    """Qualified class name, as events record it (``torch.nn.modules.linear.Linear``)."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class RecorderBase:
    """State shared by the hook mixins, ``emit`` and fault handling.

    ``emit`` puts ``(kind, ts_ns, step, module_id, tensor_id, payload)`` tuples on
    the buffer; payload values may be lazy objects (``StatsRecord``, ``SealItems``,
    ``StackedNorms``) that the writer resolves off the training thread.
    """

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        self.buffer = buffer
        self.policy = policy or Policy()
        # Modules and optimizers are held weakly; tensors not at all (ids.py: swap_tensors
        # refuses a tensor with a weak reference).
        self.modules = ObjectIds()
        self.tensors = TensorIds()
        self.tensors.ref_of = self.modules.entry  # places share the module's weak reference
        self.optimizers = ObjectIds()
        self.step = 0
        self.sampling = True
        # A compiled module was seen: the per-call hooks stay in torch's tables from
        # then on (dynamo guards on those tables and would compile again at every
        # change; recorder.update_call_hooks).
        self.compiled_seen = False
        self._local = threading.local()
        # construction: tensors registered and not sealed yet; how many registrations
        # so far (a structure version), and the version each root was last scanned at
        self._unsealed: set[int] = set()
        # Tensor ids registered uninitialized (lazy modules) and not sealed yet: the
        # optimizer's pre hook looks for their materialization (a hookless shape change).
        self._lazy: set[int] = set()
        self._registrations = 0
        self._step_scanned = -1
        self._scanned: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
        # Registrations not yet handed to the writer, and batches handed over and not
        # yet folded into ``state`` (registrations.py); deques: appends are atomic.
        self._pending: collections.deque[Any] = collections.deque()
        self._pending_count = 0
        self._settling = False
        self._unfolded: collections.deque[Registrations] = collections.deque()
        self._folding = False
        # optimizer steps: what the pre hook found, per optimizer (its parameters, the
        # copies it made, the gradient norms it took; popped by the post hook, and
        # weakly keyed: a step that raised leaves nothing alive past its optimizer); the
        # plan of each optimizer's parameters with its reusable buffers for the
        # pre-step copy (norms.py; weakly keyed: gone with the optimizer); the ids of
        # its parameters
        self._pending_steps: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._param_plans = PlanCache(weak=True)
        self._param_ids: dict[int, tuple[tuple[int, ...], Clean, list[Clean]]] = {}
        # how to compute each optimizer's per-parameter norms in a few ops (norms.py);
        # the optimizers whose parameters include DTensors (norms of local shards)
        self._norm_plans = PlanCache()
        self._sharded: set[int] = set()
        self._optimizer_steps: dict[int, int] = {}
        # structural checks spaced by their cost (Policy.check_interval): smoothed
        # seconds per check and per step (between optimizer post hooks), the
        # interval in use, and when the last post hook ran
        self._check_s = 0.0
        self._step_s = 0.0
        self._check_interval = self.policy.check_every
        self._last_post: float | None = None
        # Module activity of sampled steps: (step, "forward" | "backward", entry),
        # emitted as one ``activity`` event per step (deque: appends from autograd's
        # device threads are safe against the flush).
        self._activity: collections.deque[tuple[int, str, Any]] = collections.deque()
        # Handles of the gradient hooks put on leaf tensors that modules returned
        # (removed at the step's end: a parameter outlives its step).
        self._leaf_taps: list[Any] = []
        # input NaN/Inf checks of the calls in progress, by (id(module), depth in the call stack)
        self._inputs: dict[tuple[int, int], Any] = {}
        self._selected: dict[int, bool] = {}
        self._names: dict[int, list[str]] = {}
        self._selected_at = -1
        self._nonfinite = False
        self._warned: set[str] = set()
        self.faults = 0
        # The state our own events describe (replay.apply), for structural checks,
        # and per tensor id the (shape, dtype, device, requires_grad) last found equal to it.
        self._state = ModelState()
        self.checked_facts: dict[int, tuple[Any, ...]] = {}
        # roots seen, and the finalizers that snapshot a root when it is released
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._finalizers: list[weakref.finalize[Any, Any]] = []
        # snapshots emitted and not yet stored by the writer (roots.py: overruns, back-pressure)
        self._in_flight: list[SnapshotItems] = []
        # host copies of the last stored periodic snapshot, for the next one (hostbuffers.py)
        self._host_buffers = HostBuffers()
        self._finished = False
        # Set by the session: durability step/strict waits for the writer after each
        # step; on_error=fail stops training when the writer has failed.
        self.step_barrier: Callable[[], Any] | None = None
        self.failure: Callable[[], BaseException | None] = lambda: None

    # ------------------------------------------------------------------ emit
    def emit(
        self,
        kind: str,
        module_id: int | None = None,
        tensor_id: int | None = None,
        payload: Any = None,
        step: int | None = None,
    ) -> None:
        """Queue one record (the only way anything leaves the capture layer).

        Registrations still pending go first: the stream keeps the hooks' order."""
        if self._pending:
            self.settle()
        self.buffer.put(
            (
                kind,
                time.time_ns(),
                self.step if step is None else step,
                module_id,
                tensor_id,
                payload,
            )
        )
        if kind in STATE_KINDS:
            apply(
                self.state,
                {"kind": kind, "module_id": module_id, "tensor_id": tensor_id, "payload": payload},
            )

    def defer(self, values: tuple[Any, ...]) -> None:
        """Queue a registration's facts, flat (registrations.py); its event is built later.

        ``values``: one record's run of values, kind, time and step first."""
        pending = self._pending
        pending.extend(values)
        self._pending_count += 1
        if len(pending) >= PENDING_MAX:
            self.settle()

    def settle(self) -> None:
        """Hand the pending registrations to the writer, as one record, in order."""
        pending = self._pending
        size = len(pending)  # whole records: each was added by one extend
        if not size or self._settling:
            # Re-entered (a finalizer that reads the state, run by a collection
            # during the pops below): the outer call ships these, in order.
            return
        self._settling = True
        try:
            pop = pending.popleft
            flat = [pop() for _ in range(size)]
            count, self._pending_count = self._pending_count, 0
            batch = Registrations(flat, count)
            self._unfolded.append(batch)
            self.buffer.put(batch)
        finally:
            self._settling = False

    @property
    def state(self) -> ModelState:
        """The state our own events describe (replay.apply), registrations folded in."""
        if self._pending:
            self.settle()
        if self._unfolded and not self._folding:
            self._folding = True  # a finalizer reading the state mid-fold sees it as it stands
            try:
                unfolded, state = self._unfolded, self._state
                while unfolded:
                    batch = unfolded.popleft()
                    batch.fold_into(state)
            finally:
                self._folding = False
        return self._state

    def fault(self, where: str, exc: BaseException) -> None:
        """Record a recorder fault; warn once per place; never raise."""
        self.faults += 1
        try:
            self.emit(
                "recorder_error",
                payload={"where": where, "type": type(exc).__name__, "message": str(exc)[:2000]},
            )
            if where not in self._warned:
                self._warned.add(where)
                warnings.warn(
                    f"auditlog: recorder fault in {where}: {type(exc).__name__}: {exc} "
                    "(recorded as recorder_error; training continues)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        except Exception:  # -W error turns the warning into an exception: swallow it
            pass

    # ------------------------------------------------------------------ backward=full safety
    def check_in_place(self, module: torch.nn.Module, subtree: bool) -> None:
        """With ``backward="full"``, an in-place module (``ReLU(inplace=True)``) would make
        torch stop training ("Output 0 of BackwardHookFunction is a view and is being
        modified inplace"). Seen before it runs, backward is recorded with gradient
        hooks instead (``grad``), with one notice and a ``recorder_error`` event."""
        if self.policy.backward != "full":
            return
        for found in module.modules() if subtree else (module,):
            if getattr(found, "inplace", False) is True:
                culprit = f"{type(found).__name__}(inplace=True)"
                message = (
                    f"backward=full cannot record a model with an in-place module ({culprit}); "
                    "recording backward with gradient hooks (backward=grad) instead"
                )
                self.drop_full_backward_hooks()
                self.emit(
                    "recorder_error",
                    payload={"where": "backward", "type": "InPlaceModule", "message": message},
                )
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"auditlog: {message}\n")
                return

    def drop_full_backward_hooks(self) -> None:
        """Switch to ``backward="grad"`` (the recorder removes its full backward hooks)."""
        self.policy = dataclasses.replace(self.policy, backward="grad")

    # ------------------------------------------------------------------ identity
    def module_id(self, module: torch.nn.Module) -> int:
        """Id of a module; on first sight, remember where it was constructed."""
        number: int = self.module_ref(module, depth=3)[0].number
        return number

    def module_ref(self, module: torch.nn.Module, depth: int = 2) -> tuple[Any, bool]:
        """``(reference carrying the id and construction site, is_new)`` of a module
        (ids.py); on first sight, the site is searched from ``depth`` frames up
        (2: the caller of this method)."""
        ref, new = self.modules.get_ref(module)
        if new and ref.code is None:
            # Not noted at construction (constructors.py: built before recording, a
            # deepcopy, C++): the caller of its __init__ if that is on the stack, else
            # the line attaching it, labelled so. Kept on the id's weak reference
            # (ids.py): no second table per module.
            site, constructed = construction_or_attach_site(module, depth=depth)
            if site is not None:
                ref.code, ref.line = site
                ref.attached = not constructed
        return ref, new

    def on_constructed(self, module: torch.nn.Module, site: Site | None) -> None:
        """``constructors`` listener: ``module`` was just constructed at ``site``."""
        try:
            if site is not None:
                self.modules.note(module, site)
        except Exception as exc:
            self.fault("construction_site", exc)

    def call_stack(self) -> list[torch.nn.Module]:
        """The modules whose forward is running on this thread, outermost first."""
        stack: list[torch.nn.Module] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def flag_nonfinite(self) -> None:
        """Called by the writer when a step's gradients were not finite."""
        self._nonfinite = True

    # ------------------------------------------------------------------ across concerns
    # Implemented by the mixin that owns each concern (see the module docstring).
    def adopt(self, root: torch.nn.Module) -> None:
        raise NotImplementedError

    def register_child(
        self,
        parent: torch.nn.Module,
        name: str,
        child: torch.nn.Module | None,
        adopted: bool = False,
        detected_at: str | None = None,
    ) -> None:
        raise NotImplementedError

    def register_tensor(
        self,
        module: torch.nn.Module,
        name: str,
        tensor: torch.Tensor | None,
        member: str,
        source: Site | None = None,
        persistent: bool | None = None,
        adopted: bool = False,
        detected_at: str | None = None,
    ) -> None:
        raise NotImplementedError

    def seal(self, root: torch.nn.Module | None, trigger: str, tensors: Any = None) -> None:
        raise NotImplementedError

    def check_structure(self, roots: list[torch.nn.Module], where: str) -> int:
        raise NotImplementedError

    def materialized(self, trigger: str) -> None:
        raise NotImplementedError

    def check(self, roots: list[torch.nn.Module] | None, where: str) -> None:
        raise NotImplementedError

    def live_roots(self) -> list[torch.nn.Module]:
        raise NotImplementedError

    def snapshot(self, roots: list[torch.nn.Module], trigger: str, tag: str | None = None) -> None:
        raise NotImplementedError

    def track_root(self, root: torch.nn.Module) -> None:
        raise NotImplementedError

    def track_owners(self, params: list[torch.Tensor]) -> None:
        raise NotImplementedError

    def flush_activity(self) -> None:
        raise NotImplementedError

    def update_call_hooks(self) -> None:
        raise NotImplementedError

    def watch_call(self, called: torch.nn.Module, root_call: bool) -> None:
        raise NotImplementedError

    def root_entered(self, module: torch.nn.Module) -> None:
        raise NotImplementedError

    def root_left(self, module: torch.nn.Module, output: Any) -> None:
        raise NotImplementedError

    def flush_metrics(self, skipped: bool = False) -> None:
        raise NotImplementedError

    def flops_root_started(self, module: torch.nn.Module) -> None:
        raise NotImplementedError

    def flops_root_finished(self, module: torch.nn.Module) -> None:
        raise NotImplementedError

    def stop_flops(self, closed_by: str) -> None:
        raise NotImplementedError

    def uncounted(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def check_before_step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grad_norms: Any = None
    ) -> None:
        raise NotImplementedError

    def check_after_step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
    ) -> None:
        raise NotImplementedError

    def last_loss(self) -> Any:
        raise NotImplementedError


def module_tensors(root: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Every parameter and buffer under ``root`` (shared ones once per owner)."""
    for module in root.modules():
        for param in parameters_of(module).values():
            if param is not None:
                yield param
        for buf in buffers_of(module).values():
            if buf is not None:
                yield buf


def module_members(
    root: torch.nn.Module,
) -> Iterator[tuple[torch.nn.Module, str, str, torch.Tensor]]:
    """Every parameter and buffer under ``root`` with its place: ``(module, member, name, tensor)``."""
    for module in root.modules():
        for name, param in parameters_of(module).items():
            if param is not None:
                yield module, "parameter", name, param
        for name, buf in buffers_of(module).items():
            if buf is not None:
                yield module, "buffer", name, buf
