"""Signing a run's current chain heads: checkpoints in the store, statements kept elsewhere.

``checkpoint_head`` is what the recorder calls (at run end, and every N events
or seconds when a key is configured) and what ``auditlog checkpoint`` calls for
a finished run. ``export_heads`` makes the statement ``auditlog export-head``
writes. Both only sign; whether a chain deserves a signature (it verifies) is
the caller's decision, because the recorder signs the chain it is writing
itself and must not pay for a full verification every N events.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auditlog.errors import AuditlogError
from auditlog.signing import Checkpoint, HeadStatement, StreamHead, sign_head, sign_heads
from auditlog.store.checkpoints import add_checkpoint
from auditlog.store.eventstore import EventStore


def store_id(store: EventStore) -> str:
    """The store's identity from ``auditlog_meta`` (part of every checkpoint's signed bytes)."""
    return store.meta().get("store_id", "")


def checkpoint_head(
    store: EventStore,
    private_key: Ed25519PrivateKey,
    run_id: str,
    stream: int,
    *,
    head: tuple[int, str] | None = None,
) -> Checkpoint:
    """Sign a stream's head and store the checkpoint; returns it with its row id.

    ``head``: the ``(seq, hash)`` to sign. The writer passes the head of the
    batch it has just committed (it knows it without a query, and it signs what
    it wrote, not whatever the table holds now); by default the stream's last
    stored event is read with ``EventStore.chain_head``. Raises ``AuditlogError``
    when the stream has no events, ``StoreError`` when the insert fails.
    """
    if head is None:
        head = store.chain_head(run_id, stream)
        if head is None:
            raise AuditlogError(f"run {run_id[:12]} stream {stream} has no events to checkpoint")
    seq, head_hash = head
    checkpoint = sign_head(private_key, store_id(store), run_id, stream, seq, head_hash)
    return add_checkpoint(store, checkpoint)


def current_heads(store: EventStore, run_id: str) -> list[StreamHead]:
    """The last ``(seq, hash)`` of every stream of a run."""
    heads: list[StreamHead] = []
    for stream in store.streams(run_id):
        head = store.chain_head(run_id, stream)
        if head is not None:
            heads.append(StreamHead(stream, head[0], head[1]))
    return heads


def export_heads(store: EventStore, private_key: Ed25519PrivateKey, run_id: str) -> HeadStatement:
    """A signed statement of every stream's current head of a run (nothing is written to the store)."""
    heads = current_heads(store, run_id)
    if not heads:
        raise AuditlogError(f"run {run_id[:12]} has no events to export a head of")
    return sign_heads(private_key, store_id(store), run_id, heads)
