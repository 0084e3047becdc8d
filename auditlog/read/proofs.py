"""Making proof documents from a store: ``auditlog prove`` (inclusion and consistency).

The documents and their checks are pure (``auditlog.integrity.proofs``); this
reads what they are made of: the stream's events (leaf hashes) and the newest
stored signed tree head (an ``auditlog-checkpoint-v2`` checkpoint). A proof is
only made when the stored record still has that signed tree head, so a proof
never vouches for an altered record.
"""

from __future__ import annotations

from typing import Any

from auditlog.core.chain import ChainFormat, canonical_row
from auditlog.core.errors import AuditlogError, IntegrityError
from auditlog.integrity.chaincheck import stream_format
from auditlog.integrity.checkpoints import checkpoints_for, store_id
from auditlog.integrity.keys import KeyRing
from auditlog.integrity.merkle import (
    PackedLeaves,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root,
)
from auditlog.integrity.proofs import consistency_document, inclusion_document, signed_tree_head
from auditlog.integrity.statements import Checkpoint
from auditlog.store.eventstore import EventStore


def stream_leaves(
    store: EventStore, run_id: str, stream: int, seq: int | None = None
) -> tuple[PackedLeaves, dict[str, Any] | None, ChainFormat]:
    """Every leaf hash of a stream (each event's canonical row in the stream's chain
    format), the stored event at ``seq`` (when asked), and that format."""
    chain = stream_format(store, run_id, stream)
    if chain is None:
        raise IntegrityError(
            f"run {run_id[:12]} stream {stream}: its first event matches no chain format "
            "(it was edited or deleted; run `auditlog verify`)"
        )
    leaves = PackedLeaves()
    found = None
    for row in store.iter_events(run_id, stream=stream):
        leaves.append(leaf_hash(canonical_row(row, chain=chain)))
        if row["seq"] == seq:
            found = row
    return leaves, found, chain


def _newest_tree_head(store: EventStore, run_id: str, stream: int, covering: int = 1) -> Checkpoint:
    heads = [
        c
        for c in checkpoints_for(store, run_id)
        if c.is_tree_head and c.stream == stream and c.seq >= covering
    ]
    if not heads:
        raise AuditlogError(
            f"no signed tree head of run {run_id[:12]} stream {stream} covers seq {covering} "
            f"(sign one with `auditlog checkpoint {run_id[:12]}`)"
        )
    return max(heads, key=lambda c: (c.seq, c.id or 0))


def _signed(store: EventStore, checkpoint: Checkpoint) -> dict[str, Any]:
    return {**checkpoint.fields(store_id(store)), "signature": checkpoint.signature}


def _require_root(leaves: PackedLeaves, size: int, expected: str, what: str, run_id: str) -> None:
    if size > len(leaves) or root(leaves, size).hex() != expected:
        raise IntegrityError(
            f"run {run_id[:12]}: the record no longer matches {what} at tree size {size} "
            "(events were changed or cut off; run `auditlog verify`)"
        )


def prove_inclusion(store: EventStore, run_id: str, seq: int, stream: int = 0) -> dict[str, Any]:
    """An inclusion proof of event ``seq`` of a stream under its newest signed tree head."""
    head = _newest_tree_head(store, run_id, stream, seq)
    leaves, event, chain = stream_leaves(store, run_id, stream, seq)
    if event is None:
        raise AuditlogError(f"run {run_id[:12]} stream {stream} has no event seq {seq}")
    assert head.tree_root is not None
    _require_root(leaves, head.seq, head.tree_root, "its signed tree head", run_id)
    path = inclusion_proof(leaves, seq - 1, head.seq)
    return inclusion_document(event, seq - 1, head.seq, path, _signed(store, head), chain)


def prove_consistency(
    store: EventStore, run_id: str, old_statement: dict[str, Any], stream: int = 0
) -> dict[str, Any]:
    """A consistency proof from an older signed tree head (an exported head, say) to the newest stored one."""
    problems: list[str] = []
    old = signed_tree_head(old_statement, stream, KeyRing(), problems, "the old head")
    if old is None:
        raise AuditlogError(problems[0] if problems else "the old head is not a signed tree head")
    if old.run_id != run_id:
        raise AuditlogError(f"the old head is about run {old.run_id[:12]}, not run {run_id[:12]}")
    new = _newest_tree_head(store, run_id, stream, old.size)
    leaves, _, _ = stream_leaves(store, run_id, stream)
    _require_root(leaves, old.size, old.root, "the old signed tree head", run_id)
    assert new.tree_root is not None
    _require_root(leaves, new.seq, new.tree_root, "its newest signed tree head", run_id)
    proof = consistency_proof(leaves, old.size, new.seq)
    return consistency_document(
        run_id, stream, old_statement, _signed(store, new), old.size, new.seq, proof
    )
