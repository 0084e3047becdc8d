"""Signing a run's current tree heads: checkpoints in the store, statements kept elsewhere.

``checkpoint_head`` is what the recorder calls (at run end, and every N events
or seconds when a key is configured) and what ``auditlog checkpoint`` calls for
a finished run. ``export_heads`` makes the statement ``auditlog export-head``
writes. Both sign v2 statements: chain head, Merkle tree head, whether the
stream has ended, and the run's world size. Both only sign; whether a chain deserves a signature (it verifies) is
the caller's decision, because the recorder signs the chain it is writing
itself and must not pay for a full verification every N events.

**What a signing command trusts** (issue 29). A signature vouches for the
record as it is when it is made. Where earlier signatures by a trusted key
cover a stream, the new one only extends them (``require_intact`` refuses a
record they prove altered); where none does, it trusts those events on first
signature: they may have been rewritten by anyone with write access before,
and only a head exported earlier (``verify --against``) could tell.
``trust_line`` says which, in one line, and every signing command prints it.
A stream whose ``run_started`` names the key it was recorded for signing with
(``signing_key``) had its end signed by its recording: when such a stream was
ended by its recording and no signature covers it to that end, its signatures
were lost (deleted with a rewrite), and ``require_intact`` refuses to sign it.
(A live stream, or a crashed one whose end a later process wrote, may have
events no signature covers: those are trusted on first signature, and said.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auditlog.core.errors import AuditlogError, IntegrityError, StoreError
from auditlog.integrity.keys import fingerprint, trusted_public_keys
from auditlog.integrity.report import StreamTip, VerifyReport
from auditlog.integrity.signing import (
    Checkpoint,
    HeadStatement,
    KeyRing,
    StreamHead,
    sign_head,
    sign_heads,
)
from auditlog.store.eventstore import EventStore


def store_id(store: EventStore) -> str:
    """The store's identity from ``auditlog_meta`` (part of every checkpoint's signed bytes)."""
    return store.meta().get("store_id", "")


def checkpoint_head(
    store: EventStore,
    private_key: Ed25519PrivateKey,
    run_id: str,
    stream: int,
    tip: StreamTip | None = None,
    world_size: int | None = None,
) -> Checkpoint:
    """Sign a stream's tree head at ``tip`` and store the checkpoint; returns it with its row id.

    The writer passes the tip of the batch it has just committed (it keeps the
    tree's frontier as it writes, and signs what it wrote, not whatever the table
    holds now); ``checkpoint_run`` passes what ``verify`` read. Without ``tip``,
    the stream is read now (its current head). Raises ``AuditlogError`` when the
    stream has no events, ``StoreError`` when the insert fails.
    """
    if tip is None or world_size is None:
        from auditlog.integrity.verify import verify_run

        report = verify_run(store, run_id, keys=KeyRing(), require_signed=False)
        tip = report.tips.get(stream) if tip is None else tip
        world_size = report.world_size() or 1 if world_size is None else world_size
        if tip is None or tip.seq == 0:
            raise AuditlogError(f"run {run_id[:12]} stream {stream} has no events to checkpoint")
    checkpoint = sign_head(
        private_key, store_id(store), run_id, stream, tip.seq, tip.head_hash,
        tree_root=tip.tree_root, ended=tip.ended, world_size=world_size,
    )
    return replace(checkpoint, id=store.add_checkpoint(checkpoint.as_row()))


def checkpoints_for(store: EventStore, run_id: str) -> list[Checkpoint]:
    """A run's checkpoints, oldest first; a garbled row is a ``StoreError``."""
    out: list[Checkpoint] = []
    for row in store.checkpoint_rows(run_id):
        try:
            out.append(Checkpoint.from_row(row))
        except ValueError as exc:
            raise StoreError(
                f"store {store.location.display()!r}: checkpoint {row.get('id')} is garbled: {exc}"
            ) from exc
    return out


def _heads(report: VerifyReport) -> list[StreamHead]:
    return [
        StreamHead(t.stream, t.seq, t.head_hash, t.tree_root, t.ended)
        for t in sorted(report.tips.values(), key=lambda t: t.stream)
        if t.seq > 0
    ]


def export_heads(store: EventStore, private_key: Ed25519PrivateKey, report: VerifyReport) -> HeadStatement:
    """A signed statement of every stream's current head and tree head (nothing is written to the store)."""
    heads = _heads(report)
    if not heads:
        raise AuditlogError(f"run {report.run_id[:12]} has no events to export a head of")
    return sign_heads(private_key, store_id(store), report.run_id, heads, world_size=report.world_size() or 1)


@dataclass(frozen=True)
class SignedHead:
    """What ``checkpoint_run`` did for one stream: signed now (``checkpoint_id``) or already signed."""

    run_id: str
    stream: int
    seq: int
    head_hash: str
    checkpoint_id: int | None
    already_signed: bool


Told = Callable[[str], None]
"""Where a signing command's one line about what it trusts goes (the CLI: stderr)."""


def require_intact(store: EventStore, run_id: str, key: Ed25519PrivateKey, told: Told | None = None) -> VerifyReport:
    """The run's verify report; ``IntegrityError`` when it is proven altered, or recorded for
    signing and has lost its signatures (other doubts do not block). ``told`` gets the
    ``trust_line`` of what the signature will vouch for.

    A signature over an edited chain would certify the edit, so nothing is
    signed before the chain verifies.
    """
    from auditlog.integrity.verify import verify_run

    keys = KeyRing([key.public_key(), *default_keys()])
    report = verify_run(store, run_id, keys=keys, require_signed=False)
    altered = [p for p in report.problems if p.altered]
    if altered:
        raise IntegrityError(f"refusing to sign run {run_id[:12]}: record altered: {altered[0].describe()}")
    lost = lost_signatures(report, keys)
    if lost is not None:
        raise IntegrityError(f"refusing to sign run {run_id[:12]}: {lost}")
    if told is not None:
        told(trust_line(report))
    return report


def lost_signatures(report: VerifyReport, keys: KeyRing) -> str | None:
    """Why a stream recorded for signing (``run_started.signing_key``) has lost its signatures:
    its recording ended it (and signed that end), yet no valid signature by a trusted key
    covers it to its end. A crashed stream's end is written by a later process and may be
    unsigned, a live stream's newest events are signed within 60 s: neither is lost. None:
    nothing lost."""
    for stream, tip in sorted(report.tips.items()):
        if tip.signing_key is None or not tip.ended or tip.end_status == "crashed":
            continue
        covered = report.covered.get(stream, 0)
        if covered >= tip.seq:
            continue
        recorded = f"stream {stream} was recorded for signing by key {tip.signing_key[:16]}"
        if tip.signing_key not in keys.keys:
            recorded += " (not a key trusted here: sign with that key)"
        missing = "no signature by a trusted key covers it" if covered == 0 else (
            f"no signature by a trusted key covers seq {covered + 1}..{tip.seq}")
        return (f"{recorded} and its recording signed its end, but {missing} (its checkpoints were deleted, "
                "or the chain was rewritten); check it against a head exported earlier "
                "(`auditlog verify --against HEAD`)")
    return None


def trust_line(report: VerifyReport) -> str:
    """One line: what a signature made now vouches for that earlier signatures did not."""
    first: list[str] = []
    extended: list[str] = []
    for stream, tip in sorted(report.tips.items()):
        if tip.seq == 0:
            continue
        covered = report.covered.get(stream, 0)
        if covered >= tip.seq:
            extended.append(f"stream {stream}")
        else:
            first.append(f"stream {stream} seq {covered + 1}..{tip.seq}")
    run = f"run {report.run_id[:12]}"
    if not first:
        return (f"signing {run}: every event is already covered by a signature by a trusted key; "
                "this signature extends them")
    told = (f"signing {run} trusts on first signature {', '.join(first)}: no earlier signature by a trusted "
            "key covers them, so this signature vouches for them as they are now (a rewrite by someone with "
            "write access before now would be signed too; `verify --against` an older exported head shows one)")
    if extended:
        told += f"; {', '.join(extended)} already covered"
    return told


def default_keys() -> list[Ed25519PublicKey]:
    """The default public key, if one is configured (a broken one is left out, not an error)."""
    try:
        return list(trusted_public_keys())
    except AuditlogError:  # a broken default public key does not matter when signing
        return []


def checkpoint_run(
    store: EventStore, run_id: str, key: Ed25519PrivateKey, told: Told | None = None
) -> list[SignedHead]:
    """Sign every stream's tree head of a run that ``key`` has not signed yet (after ``require_intact``)."""
    report = require_intact(store, run_id, key, told)
    mine = fingerprint(key)
    signed = {
        (c.stream, c.seq, c.head_hash)
        for c in checkpoints_for(store, run_id)
        if c.key_fingerprint == mine and c.is_tree_head
    }
    tips = [t for _, t in sorted(report.tips.items()) if t.seq > 0]
    if not tips:
        raise AuditlogError(f"run {run_id[:12]} has no events to checkpoint")
    world = report.world_size() or 1
    out: list[SignedHead] = []
    for tip in tips:
        if (tip.stream, tip.seq, tip.head_hash) in signed:
            out.append(SignedHead(run_id, tip.stream, tip.seq, tip.head_hash, None, True))
            continue
        made = checkpoint_head(store, key, run_id, tip.stream, tip, world)
        out.append(SignedHead(run_id, tip.stream, tip.seq, tip.head_hash, made.id, False))
    return out


def export_intact_heads(
    store: EventStore, run_id: str, key: Ed25519PrivateKey, told: Told | None = None
) -> HeadStatement:
    """``export_heads`` of a record that verifies (``require_intact`` first)."""
    return export_heads(store, key, require_intact(store, run_id, key, told))
