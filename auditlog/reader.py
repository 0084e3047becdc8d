"""The Python read API: ``auditlog.open(store).run("latest")``.

A thin facade over the event store, run selection, replay and verification, so
notebooks and the CLI ask the same questions the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from auditlog.integrity import VerifyReport, verify_run
from auditlog.replay import CONSTRUCTION_KINDS, ModelState, replay
from auditlog.runs import RunInfo, list_runs, select_run
from auditlog.store.eventstore import EventStore
from auditlog.store.location import StoreLocation


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
        for row in self.store.iter_events(self.run_id, kinds=kinds, step_range=step_range, stream=stream):
            row["payload"] = json.loads(row["payload"])
            yield row

    def model_state(self, upto_seq: int | None = None, stream: int = 0) -> ModelState:
        """The module forest as of ``upto_seq`` (default: the end of the run)."""
        return replay(self.events(kinds=CONSTRUCTION_KINDS, stream=stream), upto_seq=upto_seq)

    def verify(self) -> VerifyReport:
        return verify_run(self.store, self.run_id)

    def info(self) -> RunInfo:
        for info in list_runs(self.store):
            if info.run_id == self.run_id:
                return info
        raise KeyError(self.run_id)


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
