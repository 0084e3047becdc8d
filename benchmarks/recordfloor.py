"""The floor of recording a training step: its numbers computed and two chained events stored.

Every preset computes each step's gradient norms and reads the loss (the
``floor`` configuration of ``instructions.py``), and stores two events a step:
``metrics`` (the loss) and ``optimizer_step`` (hyperparameters, the parameters'
ids, the norms). ``RecordFloor`` does exactly that with the library's own
functions and nothing else: one JSON payload each (``encode_clean``), the
stored row and its SHA-256 chain link (``chained_row``), and a batch insert into
a real store's ``events`` table (same schema and indexes, WAL,
``synchronous=NORMAL``; ``store.inserts``) every 100 events. No hooks, no queue,
no writer thread, no policy, no checks: what a recorder of this event model in
Python cannot go below. Its payloads hold fewer keys than the recorder's (no
raw norms, no non-finite count, no group ids), so it errs low, as a floor
should. ``python benchmarks/instructions.py --configs
bare,floor,record-floor,minimal``.

``single=True`` (``record-floor-single``) stores one event a step instead, the
loss inside ``optimizer_step``: what the floor would be if the event model
carried a step's loss in its step event (it does not: ``metrics`` is its own
event, docs/events.md).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import torch

from auditlog.capture.norms import PlanCache
from auditlog.core.chain import Clean, chained_row, encode_clean, genesis_hash, row_prefix
from auditlog.core.packed import pack_f32, pack_ints
from auditlog.store.eventstore import EventStore
from auditlog.store.inserts import Inserts

RUN_ID = "f" * 32
BATCH = 100


class RecordFloor:
    """Per step: norms and loss (``step``), two payloads, two chained rows, batched inserts."""

    def __init__(self, directory: Path, single: bool = False) -> None:
        self.single = single
        store = EventStore.open(str(directory / "store"), create=True)
        database = store.location.database
        store.close()
        assert database is not None
        self.conn = sqlite3.connect(database)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.inserts = Inserts("qmark")
        self.head = genesis_hash(RUN_ID, 0)
        self.prefix = row_prefix(RUN_ID, 0)
        self.seq = 0
        self.steps = 0
        self.rows: list[dict[str, Any]] = []
        self.ids: Clean | None = None
        self.plans = PlanCache()  # the library's norm plan, kept and used as the recorder does
        self.identity: tuple[int, ...] = ()

    def step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], loss: float
    ) -> None:
        """After ``backward()``: the norms of the gradients and the two events of the step."""
        if not self.identity:
            self.identity = tuple(map(id, params))
        with torch.no_grad():
            grads = [p.grad for p in params]
            plan = self.plans.plan(id(optimizer), self.identity, grads)  # type: ignore[arg-type]
            norms = plan.grad_norms(grads)
        assert norms is not None
        self.steps += 1
        entries = [{"name": "loss", "value": loss}]
        if not self.single:
            self._event("metrics", Clean({"entries": entries}))
        if self.ids is None:
            self.ids = Clean(pack_ints(list(range(1, len(params) + 1))))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        payload = {
            "optimizer_id": 1,
            "optimizer_class": type(optimizer).__name__,
            "count": self.steps,
            "param_groups": groups,
            "tensor_ids": self.ids,
            "grad_norms": pack_f32(norms.numpy().tobytes()),
        }
        if self.single:
            payload["metrics"] = entries
        self._event("optimizer_step", Clean(payload))
        if len(self.rows) >= BATCH:
            self.flush()

    def _event(self, kind: str, payload: Clean) -> None:
        self.seq += 1
        row, _ = chained_row(
            self.head,
            RUN_ID,
            0,
            self.seq,
            time.time_ns(),
            kind,
            self.steps,
            None,
            None,
            encode_clean(payload),
            self.prefix,
        )
        self.head = row["hash"]
        self.rows.append(row)

    def flush(self) -> None:
        """Insert the rows held, in one transaction."""
        with self.conn:
            for statement, values in self.inserts.batches(self.rows):
                self.conn.executemany(statement, values)
        self.rows.clear()

    def close(self) -> None:
        self.flush()
        self.conn.close()
