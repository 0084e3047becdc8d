"""The ``checkpoints`` table: store and read signed chain heads (SQLAlchemy Core).

Checkpoints are append-only like events; nothing here updates or deletes one.
Reads return the raw rows as well as typed ones, because verification must
report a row someone garbled instead of failing on it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select

from auditlog.errors import StoreError
from auditlog.signing import Checkpoint
from auditlog.store import schema
from auditlog.store.eventstore import EventStore


def add_checkpoint(store: EventStore, checkpoint: Checkpoint) -> Checkpoint:
    """Insert ``checkpoint``; returns it with the id the store gave it."""
    with store.guard("storing a checkpoint"), store.engine.begin() as conn:
        result = conn.execute(schema.checkpoints.insert().values(**checkpoint.as_row()))
        key = result.inserted_primary_key
    new_id = None if key is None else key[0]
    return replace(checkpoint, id=None if new_id is None else int(new_id))


def checkpoint_rows(store: EventStore, run_id: str) -> list[dict[str, Any]]:
    """The stored rows of a run's checkpoints, oldest first, exactly as stored."""
    cp = schema.checkpoints
    with store.guard("reading checkpoints"), store.engine.connect() as conn:
        rows = conn.execute(select(cp).where(cp.c.run_id == run_id).order_by(cp.c.id)).mappings()
        return [dict(r) for r in rows]


def checkpoints_for(store: EventStore, run_id: str) -> list[Checkpoint]:
    """A run's checkpoints, oldest first; a garbled row is a ``StoreError``."""
    out: list[Checkpoint] = []
    for row in checkpoint_rows(store, run_id):
        try:
            out.append(Checkpoint.from_row(row))
        except ValueError as exc:
            raise StoreError(
                f"store {store.location.display()!r}: checkpoint {row.get('id')} is garbled: {exc}"
            ) from exc
    return out


def checkpointed_run_ids(store: EventStore) -> list[str]:
    """Every run id that has checkpoints (``verify all`` also checks runs whose events are gone)."""
    cp = schema.checkpoints
    with store.guard("reading checkpoints"), store.engine.connect() as conn:
        rows = conn.execute(select(cp.c.run_id).distinct())
        return sorted(str(r[0]) for r in rows)
