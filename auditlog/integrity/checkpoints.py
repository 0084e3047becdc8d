"""Checkpoints: a run's tree heads signed into the store or exported, and checked against the chain.

**Signing.** ``checkpoint_head`` is what the recorder calls (at run end, and every N events
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

**Checking.** Each stored checkpoint's signature is checked against the trusted public keys
(a checkpoint by an unknown key is reported, never silently accepted) and its
``(seq, head_hash)`` against the chain; a v2 checkpoint (a signed tree head)
also its Merkle tree head at that size, its ``world_size`` against the run's,
and, when it signs the stream's end, that nothing follows it. An exported head
statement (``verify --against``) gets the same checks per stream, plus an RFC
9162 consistency proof from its tree head to today's (that the record extends
it), and when it was made after every stream ended, it lists the whole run: a
stream it does not list was added later.

``verify_coverage`` asks what a bare chain cannot answer: is every event of
every stream covered by a valid signature? With ``--key`` an uncovered event
fails verification; without, it becomes a note saying what was not shown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auditlog.core.errors import AuditlogError, IntegrityError, StoreError
from auditlog.integrity.findings import Problem, StreamTip, VerifyReport
from auditlog.integrity.keys import (
    KeyRing,
    Verdict,
    default_public_key_path,
    fingerprint,
    trusted_public_keys,
)
from auditlog.integrity.merkle import PackedLeaves, consistency_proof, verify_consistency
from auditlog.integrity.statements import (
    Checkpoint,
    HeadStatement,
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
        private_key,
        store_id(store),
        run_id,
        stream,
        tip.seq,
        tip.head_hash,
        tree_root=tip.tree_root,
        ended=tip.ended,
        world_size=world_size,
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


def export_heads(
    store: EventStore, private_key: Ed25519PrivateKey, report: VerifyReport
) -> HeadStatement:
    """A signed statement of every stream's current head and tree head (nothing is written to the store)."""
    heads = _heads(report)
    if not heads:
        raise AuditlogError(f"run {report.run_id[:12]} has no events to export a head of")
    return sign_heads(
        private_key, store_id(store), report.run_id, heads, world_size=report.world_size() or 1
    )


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


def require_intact(
    store: EventStore, run_id: str, key: Ed25519PrivateKey, told: Told | None = None
) -> VerifyReport:
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
        raise IntegrityError(
            f"refusing to sign run {run_id[:12]}: record altered: {altered[0].describe()}"
        )
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
        missing = (
            "no signature by a trusted key covers it"
            if covered == 0
            else (f"no signature by a trusted key covers seq {covered + 1}..{tip.seq}")
        )
        return (
            f"{recorded} and its recording signed its end, but {missing} (its checkpoints were deleted, "
            "or the chain was rewritten); check it against a head exported earlier "
            "(`auditlog verify --against HEAD`)"
        )
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
        return (
            f"signing {run}: every event is already covered by a signature by a trusted key; "
            "this signature extends them"
        )
    told = (
        f"signing {run} trusts on first signature {', '.join(first)}: no earlier signature by a trusted "
        "key covers them, so this signature vouches for them as they are now (a rewrite by someone with "
        "write access before now would be signed too; `verify --against` an older exported head shows one)"
    )
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


def signed_sizes(
    rows: Sequence[dict[str, Any]], statements: Sequence[HeadStatement]
) -> dict[int, set[int]]:
    """Per stream, the tree sizes whose heads signed statements name (computed in the chain pass)."""
    sizes: dict[int, set[int]] = {}
    for row in rows:
        stream, seq = row.get("stream"), row.get("seq")
        if row.get("format") and isinstance(stream, int) and isinstance(seq, int):
            sizes.setdefault(stream, set()).add(seq)
    for statement in statements:
        if statement.is_tree_head:
            for head in statement.heads:
                sizes.setdefault(head.stream, set()).add(head.seq)
    return sizes


def _off_chain(
    store: EventStore, run_id: str, stream: int, seq: int, head_hash: str, subject: str
) -> str | None:
    """Why the signed ``(seq, head_hash)`` named ``subject`` is not on the stored chain; None if it is."""
    stored = store.hashes_between(run_id, stream, seq, seq).get(seq)
    if stored == head_hash:
        return None
    if stored is not None:
        return (
            f"{subject} does not match the chain: event seq {seq} has hash {stored[:16]}, "
            f"the signed head is {head_hash[:16]} (the chain was rewritten)"
        )
    last = store.last_seq(run_id, stream)
    if last is None:
        return f"{subject} is at seq {seq}, but the stream has no events (deleted)"
    if last < seq:
        return f"{subject} is at seq {seq}, but the stream ends at seq {last}: newer events were cut off"
    return f"{subject} is at seq {seq}, but that event is missing (deleted)"


_TREE = "Merkle tree head"


def _tree_and_end(
    report: VerifyReport,
    stream: int,
    seq: int,
    tree_root: str | None,
    ended: bool,
    world_size: int | None,
    subject: str,
) -> list[str]:
    """What a signed tree head (on the chain at ``seq``) says that the stream no longer shows."""
    tip = report.tips.get(stream, StreamTip(stream))
    found: list[str] = []
    if tree_root is not None and tip.roots.get(seq) != tree_root:
        found.append(
            f"{subject}'s {_TREE} at size {seq} does not match the stream's tree "
            "(events up to it were changed)"
        )
    if ended and tip.seq > seq:
        found.append(
            f"{subject} signs the stream's end at seq {seq} (its run_ended), but the stream "
            f"goes on to seq {tip.seq}: events were appended after the run ended"
        )
    world = tip.world_size  # the stream's own (an elastic restart may change it between segments)
    if world_size is not None and world is not None and world_size != world:
        found.append(
            f"{subject} signs world_size {world_size}, the run's run_started says {world} "
            "(run_started was replaced)"
        )
    return found


def _cover(report: VerifyReport, stream: int, seq: int) -> None:
    report.covered[stream] = max(report.covered.get(stream, 0), seq)


def no_key_hint(keys: KeyRing) -> str:
    if keys:
        return "pass its public key with --key"
    return (
        f"no public key given: pass --key PUBLIC or keep it at {str(default_public_key_path())!r}"
    )


def verify_checkpoints(
    store: EventStore,
    run_id: str,
    report: VerifyReport,
    keys: KeyRing,
    store_id: str,
    rows: list[dict[str, Any]] | None = None,
) -> None:
    """Check every stored checkpoint of a run: its signature, and that it is on the chain and tree."""
    for row in store.checkpoint_rows(run_id) if rows is None else rows:
        report.checkpoints += 1
        row_id = row.get("id")
        try:
            checkpoint = Checkpoint.from_row(row)
        except ValueError as exc:
            stream, seq = row.get("stream"), row.get("seq")
            report.problems.append(
                Problem(
                    run_id,
                    stream if isinstance(stream, int) else 0,
                    seq if isinstance(seq, int) else 0,
                    None,
                    None,
                    f"checkpoint row is garbled: {exc}",
                    checkpoint_id=row_id,
                )
            )
            continue
        verdict = keys.check(
            checkpoint.key_fingerprint, checkpoint.statement(store_id), checkpoint.signature
        )

        def problem(what: str, altered: bool, cp: Checkpoint = checkpoint) -> Problem:
            return Problem(
                run_id, cp.stream, cp.seq, None, None, what, checkpoint_id=cp.id, altered=altered
            )

        if verdict is Verdict.INVALID:
            report.problems.append(
                problem(
                    f"checkpoint signature by key {checkpoint.key_fingerprint[:16]} does not verify "
                    "(the checkpoint was edited, or copied from another store)",
                    True,
                )
            )
            continue
        if verdict is Verdict.UNKNOWN_KEY:
            report.problems.append(
                problem(
                    f"checkpoint is signed by key {checkpoint.key_fingerprint[:16]}, which is not trusted "
                    f"({no_key_hint(keys)})",
                    False,
                )
            )
        proven = verdict is Verdict.VALID
        why = _off_chain(
            store, run_id, checkpoint.stream, checkpoint.seq, checkpoint.head_hash, "signed head"
        )
        if why is not None:
            report.problems.append(problem(why, proven))
            continue
        found = []
        if checkpoint.is_tree_head:
            found = _tree_and_end(
                report,
                checkpoint.stream,
                checkpoint.seq,
                checkpoint.tree_root,
                checkpoint.ended,
                checkpoint.world_size,
                "signed head",
            )
        for what in found:
            report.problems.append(problem(what, proven))
        if proven and not any(_TREE in what for what in found):
            _cover(report, checkpoint.stream, checkpoint.seq)


def verify_statement(
    store: EventStore,
    report: VerifyReport,
    source: str,
    statement: HeadStatement,
    keys: KeyRing,
    leaves: dict[int, PackedLeaves] | None = None,
) -> None:
    """Check an exported head statement: its signature, and that the record still extends it."""
    report.statements += 1
    run_id = statement.run_id
    first = statement.heads[0]
    verdict = keys.check(statement.key_fingerprint, statement.message(), statement.signature)
    if verdict is Verdict.INVALID:
        report.problems.append(
            Problem(
                run_id,
                first.stream,
                first.seq,
                None,
                None,
                f"exported head {source!r}: signature by key {statement.key_fingerprint[:16]} does not "
                "verify (the statement was edited)",
                altered=False,
            )
        )
        return
    if verdict is Verdict.UNKNOWN_KEY:
        report.problems.append(
            Problem(
                run_id,
                first.stream,
                first.seq,
                None,
                None,
                f"exported head {source!r} is signed by key {statement.key_fingerprint[:16]}, which is "
                f"not trusted ({no_key_hint(keys)})",
                altered=False,
            )
        )
    proven = verdict is Verdict.VALID
    if report.events == 0:
        report.problems.append(
            Problem(
                run_id,
                first.stream,
                first.seq,
                None,
                None,
                f"exported head {source!r}: the run has no events in this store (deleted, or this is "
                f"not the store it was exported from: store id {statement.store_id})",
                altered=proven,
            )
        )
        return
    subject = f"exported head {source!r}"
    for head in statement.heads:
        why = _off_chain(store, run_id, head.stream, head.seq, head.head_hash, subject)
        found = [why] if why is not None else []
        if why is None and statement.is_tree_head:
            found = _tree_and_end(
                report,
                head.stream,
                head.seq,
                head.tree_root,
                head.ended,
                statement.world_size,
                subject,
            )
            if not found:
                found = _consistency(report, head, (leaves or {}).get(head.stream), subject)
        for what in found:
            report.problems.append(
                Problem(run_id, head.stream, head.seq, None, None, what, altered=proven)
            )
        if (
            proven
            and why is None
            and not any(_TREE in what or "does not extend" in what for what in found)
        ):
            _cover(report, head.stream, head.seq)
    if statement.complete:
        listed = {h.stream for h in statement.heads}
        for stream in sorted(set(report.tips) - listed):
            report.problems.append(
                Problem(
                    run_id,
                    stream,
                    1,
                    None,
                    None,
                    f"stream {stream} is not in {subject}, which lists every stream of the ended run "
                    "(a stream was added after the run ended)",
                    altered=proven,
                )
            )


def _consistency(
    report: VerifyReport, head: StreamHead, leaves: PackedLeaves | None, subject: str
) -> list[str]:
    """An RFC 9162 consistency proof from the exported tree head to today's, made and checked."""
    tip = report.tips.get(head.stream)
    if leaves is None or tip is None or head.tree_root is None or head.seq > len(leaves):
        return []
    proof = consistency_proof(leaves, head.seq, len(leaves))
    if verify_consistency(
        head.seq, len(leaves), bytes.fromhex(head.tree_root), bytes.fromhex(tip.tree_root), proof
    ):
        report.consistency.append(
            f"stream {head.stream}: the record extends {subject} (consistency proof from tree size "
            f"{head.seq} to {len(leaves)}, {len(proof)} hashes)"
        )
        return []
    return [
        f"the record does not extend {subject}: the consistency proof from tree size {head.seq} "
        f"to {len(leaves)} fails (events up to seq {head.seq} were changed)"
    ]


def verify_coverage(report: VerifyReport, required: bool) -> list[Problem]:
    """Is every event covered by a valid signature? Required: problems (returned, to be
    named after any more specific ones); otherwise notes."""
    found: list[Problem] = []
    for stream, tip in sorted(report.tips.items()):
        covered = report.covered.get(stream, 0)
        if tip.seq == 0 or covered >= tip.seq:
            continue
        if covered == 0:
            what = (
                "no signature by a trusted key covers this stream (an unsigned run, its checkpoints "
                "deleted, or a stream added); a bare chain cannot show that newer events were not "
                "cut off, that the chain was not rewritten, or that the stream belongs to the run"
            )
        else:
            what = (
                f"events seq {covered + 1}..{tip.seq} are not covered by any signature by a trusted "
                "key (recorded after the last checkpoint, or appended later); a bare chain cannot "
                "show they are genuine"
            )
        if required:
            found.append(
                Problem(report.run_id, stream, covered + 1, None, None, what, altered=False)
            )
        else:
            report.notes.append(f"stream {stream}: {what}")
    return found
