"""The Python read API: ``auditlog.open(store).run("latest")``.

A thin facade over the event store, run selection, replay and verification, so
notebooks and the CLI ask the same questions the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from sqlalchemy import func, select

from auditlog.errors import AuditlogError, CorruptRecordError, UsageError
from auditlog.integrity import VerifyReport, verify_run
from auditlog.replay import CONSTRUCTION_KINDS, ModelState, replay
from auditlog.runs import RunInfo, list_runs, select_run
from auditlog.snapshots import SnapshotError, SnapshotStore, blob_from_row
from auditlog.store import schema
from auditlog.store.eventstore import EventStore
from auditlog.store.location import StoreLocation
from auditlog.store.rows import decode_event


class Run:
    """One recorded run."""

    def __init__(self, store: EventStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def events(
        self,
        kinds: Sequence[str] | None = None,
        step_range: tuple[int | None, int | None] | None = None,
        stream: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Events in (stream, seq) order with the payload decoded."""
        shown = self.store.location.display()
        for row in self.store.iter_events(self.run_id, kinds=kinds, step_range=step_range, stream=stream):
            yield decode_event(row, shown)

    def module_calls(
        self,
        direction: str | None = None,
        step_range: tuple[int | None, int | None] | None = None,
        stream: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Recorded module calls, one dict per call, from the ``activity`` events.

        Each: ``kind`` ("forward" | "backward"), ``seq`` and ``stream`` of the
        activity event, ``step``, ``call`` (position in the event), ``module_id``
        and ``payload`` (the call's entry: outputs / grad_outputs / ... ).
        ``direction`` keeps one of the two.
        """
        for event in self.events(kinds=["activity"], step_range=step_range, stream=stream):
            payload = event["payload"]
            for kind in ("forward", "backward"):
                if direction is not None and kind != direction:
                    continue
                for call, entry in enumerate(payload.get(kind) or []):
                    yield {
                        "kind": kind,
                        "seq": event["seq"],
                        "stream": event["stream"],
                        "step": event["step"],
                        "call": call,
                        "module_id": entry.get("module_id"),
                        "payload": {k: v for k, v in entry.items() if k != "module_id"},
                    }

    def model_state(self, upto_seq: int | None = None, stream: int = 0) -> ModelState:
        """The module forest as of ``upto_seq`` (default: the end of the run)."""
        events = self.events(kinds=CONSTRUCTION_KINDS, stream=stream)
        try:
            return replay(events, upto_seq=upto_seq)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecordError(
                f"store {self.store.location.display()!r}: run {self.run_id[:12]} has a construction "
                f"event that cannot be replayed ({type(exc).__name__}: {exc}); run `auditlog verify`"
            ) from exc
        finally:
            # Close the half-read cursor now: an open one keeps its connection checked
            # out, and SQLite then leaves -wal/-shm files beside a store we only read.
            events.close()  # type: ignore[attr-defined]

    def boundary(self, step: int | None = None, seq: int | None = None, stream: int = 0) -> int | None:
        """The last seq of "the state right after the N-th optimizer.step() returned".

        Step 0 is the sealed initial state: every event before the first one of
        step 1. ``seq`` is taken as given. Neither: None (the end of the run).
        """
        if seq is not None:
            if seq < 1:
                raise UsageError(f"bad seq {seq}: sequence numbers start at 1")
            return seq
        if step is None:
            return None
        if step < 0:
            raise UsageError(f"bad step {step}: steps are >= 0")
        ev = schema.events
        where = (ev.c.run_id == self.run_id, ev.c.stream == stream)
        with self.store.guard("finding a step"), self.store.engine.connect() as conn:
            if step == 0:
                first = conn.execute(select(func.min(ev.c.seq)).where(*where, ev.c.step >= 1)).scalar()
                if first is not None:
                    return int(first) - 1
                return conn.execute(select(func.max(ev.c.seq)).where(*where)).scalar()
            found = conn.execute(
                select(ev.c.seq).where(*where, ev.c.kind == "optimizer_step", ev.c.step == step)
            ).scalar()
            if found is None:
                last = conn.execute(select(func.max(ev.c.step)).where(*where)).scalar() or 0
                raise UsageError(f"run {self.run_id[:12]} has no step {step} (it recorded steps 0..{last})")
            return int(found)

    def state_at(self, step: int | None = None, seq: int | None = None) -> ModelState:
        """The module forest as of a step or a seq (see ``boundary``)."""
        return self.model_state(upto_seq=self.boundary(step, seq))

    def state_dict(
        self,
        step: int | None = None,
        seq: int | None = None,
        root: str | None = None,
        allow_partial: bool = False,
    ) -> dict[str, torch.Tensor]:
        """A ``state_dict`` rebuilt from snapshots, bitwise equal to the live one then.

        Values for step N come from snapshots recorded at step N (taken in that
        step's post hook, or later before step N+1: explicit and run-end
        snapshots). A tensor with no such snapshot is an error naming it, unless
        ``allow_partial`` (then it is left out).
        """
        plan = self.restore_plan(step, seq, root)
        missing = [key for key, sha in plan if sha is None]
        if missing and not allow_partial:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            when = f"step {step}" if step is not None else (f"seq {seq}" if seq is not None else "the end")
            raise AuditlogError(
                f"no snapshot of {shown} at {when} (record with --snapshot-every, or pass --allow-partial)"
            )
        wanted = {sha for _, sha in plan if sha is not None}
        rows = self.store.blob_rows(sorted(wanted))
        snapshots = SnapshotStore(self.store.location.snapshots)
        loaded: dict[str, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}
        for key, sha in plan:
            if sha is None:
                continue
            if sha not in rows:
                raise SnapshotError(f"snapshot {sha[:16]}... of {key} is not in the catalog")
            if sha not in loaded:
                loaded[sha] = snapshots.get(blob_from_row(rows[sha]))
            out[key] = loaded[sha]
        return out

    def restore_plan(
        self, step: int | None = None, seq: int | None = None, root: str | None = None
    ) -> list[tuple[str, str | None]]:
        """``(state_dict key, snapshot hash or None)`` for the chosen root at a step/seq."""
        upto = self.boundary(step, seq)
        full = self.model_state()
        state = self.model_state(upto_seq=upto)
        try:
            root_id = state.root_by_class(root) if root else state.main_root()
        except KeyError:
            raise UsageError(f"no root module {root!r} in run {self.run_id[:12]}") from None
        end = upto if upto is not None else full.last_seq
        limit = self._next_step_seq(step) if step is not None else None
        plan: list[tuple[str, str | None]] = []
        for key, tensor_id in state.state_dict_keys(root_id):
            history = full.tensors[tensor_id].history if tensor_id in full.tensors else []
            plan.append((key, pick_snapshot(history, step, end, limit)))
        return plan

    def _next_step_seq(self, step: int) -> int | None:
        ev = schema.events
        with self.store.guard("finding a step"), self.store.engine.connect() as conn:
            found = conn.execute(
                select(ev.c.seq).where(
                    ev.c.run_id == self.run_id, ev.c.kind == "optimizer_step", ev.c.step == step + 1
                )
            ).scalar()
        return None if found is None else int(found)

    def verify(self) -> VerifyReport:
        return verify_run(self.store, self.run_id)

    def info(self) -> RunInfo:
        for info in list_runs(self.store):
            if info.run_id == self.run_id:
                return info
        raise KeyError(self.run_id)


def pick_snapshot(history: list[tuple[int, int, str]], step: int | None, end: int, limit: int | None) -> str | None:
    """The snapshot hash that holds a tensor's value at the boundary ``end``."""
    if step is None:  # by seq or at the end: the latest snapshot at or before it
        before = [h for h in history if h[1] <= end]
        return before[-1][2] if before else None
    same = [h for h in history if h[0] == step and (limit is None or h[1] < limit)]
    at_or_before = [h for h in same if h[1] <= end]
    if at_or_before:
        return at_or_before[-1][2]
    return same[0][2] if same else None


class Store:
    """An open store for reading."""

    def __init__(self, store: EventStore) -> None:
        self.event_store = store

    def runs(self) -> list[RunInfo]:
        return list_runs(self.event_store)

    def run(self, selector: str = "latest") -> Run:
        return Run(self.event_store, select_run(self.event_store, selector))

    def close(self) -> None:
        self.event_store.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(store: str | os.PathLike[str] | StoreLocation | None = None) -> Store:
    """Open an existing store for reading (default ``AUDITLOG_STORE`` or ``./.auditlog``)."""
    spec = store if isinstance(store, StoreLocation) or store is None else os.fspath(store)
    return Store(EventStore.open(spec, create=False))
