"""What every part of the recorder shares, and the one way records leave the capture layer.

The recorder (``recorder.py``) is a few components, each owning its state and
its hooks: construction (``construction.py``), roots and snapshots
(``roots.py``), structural checks (``structure.py``), module activity
(``activity.py``), optimizer steps (``optimizer.py``), metrics (``metrics.py``),
FLOPs (``flops.py``) and non-finite values (``nonfinite.py``). What they all
need is here, in one ``RecordingContext``, and nothing else is: the buffer and
``emit`` (with the deferred registrations of ``registrations.py`` and the
replayed state they fold into), the run's ids, the policy, the step count and
whether the step is sampled, the thread's call stack, and fault reporting.

Rules every hook follows (docs/how-it-works.md, docs/hooks.md):
- return ``None``: a non-None return value would replace the tensor or parameter;
- never raise into user code: faults become ``recorder_error`` records and one
  warning per place (``RecordingContext.fault``);
- never change numerics or touch the RNG: statistics run on detached tensors and
  are only read back on the writer thread;
- stay cheap: no SQL, JSON, hashing or I/O; a record is a tuple.
"""

from __future__ import annotations

import collections
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.ids import ObjectIds, TensorIds
from auditlog.capture.registrations import PENDING_MAX, Registrations
from auditlog.capture.source import construction_or_attach_site
from auditlog.core.policy import Policy
from auditlog.core.replay import STATE_KINDS, ModelState, apply


class RecordingContext:
    """State shared by the recorder's components, ``emit`` and fault handling.

    ``emit`` puts ``(kind, ts_ns, step, module_id, tensor_id, payload)`` tuples on
    the buffer; payload values may be lazy objects (``StatsRecord``, ``SealItems``,
    ``StackedNorms``) that the writer resolves off the training thread.
    """

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        self.buffer = buffer
        # Replaced, not changed, when backward=full gives way to gradient hooks
        # (Recorder.check_in_place): components read it here each time.
        self.policy = policy or Policy()
        # Modules and optimizers are held weakly; tensors not at all (ids.py: swap_tensors
        # refuses a tensor with a weak reference).
        self.modules = ObjectIds()
        self.tensors = TensorIds()
        self.tensors.ref_of = self.modules.entry  # places share the module's weak reference
        self.optimizers = ObjectIds()
        # optimizer.step() calls that have returned (optimizer.py counts them), and
        # whether the coming step's module activity is recorded (the per-call hooks
        # are in torch's tables: recorder.update_call_hooks)
        self.step = 0
        self.sampling = True
        # A compiled module was seen: the per-call hooks stay in torch's tables from
        # then on (dynamo guards on those tables and would compile again at every
        # change; recorder.update_call_hooks).
        self.compiled_seen = False
        self._local = threading.local()
        # Registrations not yet handed to the writer, and batches handed over and not
        # yet folded into ``state`` (registrations.py); deques: appends are atomic.
        self._pending: collections.deque[Any] = collections.deque()
        self._pending_count = 0
        self._settling = False
        self._unfolded: collections.deque[Registrations] = collections.deque()
        self._folding = False
        # The state our own events describe (replay.apply), for structural checks.
        self._state = ModelState()
        # places already warned about (once each), and faults so far
        self.warned: set[str] = set()
        self.faults = 0
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
            if where not in self.warned:
                self.warned.add(where)
                warnings.warn(
                    f"auditlog: recorder fault in {where}: {type(exc).__name__}: {exc} "
                    "(recorded as recorder_error; training continues)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        except Exception:  # -W error turns the warning into an exception: swallow it
            pass

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

    def clear_call_stack(self) -> None:
        """Forget the calls in progress on this thread (an optimizer step: none is)."""
        stack = getattr(self._local, "stack", None)
        if stack:
            stack.clear()

    def call_stack(self) -> list[torch.nn.Module]:
        """The modules whose forward is running on this thread, outermost first."""
        stack: list[torch.nn.Module] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack
