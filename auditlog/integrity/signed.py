"""Signed statements against the chain: checkpoints, exported heads, coverage.

Each stored checkpoint's signature is checked against the trusted public keys
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

from collections.abc import Sequence
from typing import Any

from auditlog.integrity.keys import default_public_key_path
from auditlog.integrity.merkle import PackedLeaves, consistency_proof, verify_consistency
from auditlog.integrity.report import Problem, StreamTip, VerifyReport
from auditlog.integrity.signing import Checkpoint, HeadStatement, KeyRing, StreamHead, Verdict
from auditlog.store.eventstore import EventStore


def signed_sizes(rows: Sequence[dict[str, Any]], statements: Sequence[HeadStatement]) -> dict[int, set[int]]:
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
    report: VerifyReport, stream: int, seq: int, tree_root: str | None, ended: bool, world_size: int | None,
    subject: str,
) -> list[str]:
    """What a signed tree head (on the chain at ``seq``) says that the stream no longer shows."""
    tip = report.tips.get(stream, StreamTip(stream))
    found: list[str] = []
    if tree_root is not None and tip.roots.get(seq) != tree_root:
        found.append(f"{subject}'s {_TREE} at size {seq} does not match the stream's tree "
                     "(events up to it were changed)")
    if ended and tip.seq > seq:
        found.append(f"{subject} signs the stream's end at seq {seq} (its run_ended), but the stream "
                     f"goes on to seq {tip.seq}: events were appended after the run ended")
    world = tip.world_size  # the stream's own (an elastic restart may change it between segments)
    if world_size is not None and world is not None and world_size != world:
        found.append(f"{subject} signs world_size {world_size}, the run's run_started says {world} "
                     "(run_started was replaced)")
    return found


def _cover(report: VerifyReport, stream: int, seq: int) -> None:
    report.covered[stream] = max(report.covered.get(stream, 0), seq)


def no_key_hint(keys: KeyRing) -> str:
    if keys:
        return "pass its public key with --key"
    return f"no public key given: pass --key PUBLIC or keep it at {str(default_public_key_path())!r}"


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
                Problem(run_id, stream if isinstance(stream, int) else 0, seq if isinstance(seq, int) else 0,
                        None, None, f"checkpoint row is garbled: {exc}", checkpoint_id=row_id)
            )
            continue
        verdict = keys.check(checkpoint.key_fingerprint, checkpoint.statement(store_id), checkpoint.signature)

        def problem(what: str, altered: bool, cp: Checkpoint = checkpoint) -> Problem:
            return Problem(run_id, cp.stream, cp.seq, None, None, what, checkpoint_id=cp.id, altered=altered)

        if verdict is Verdict.INVALID:
            report.problems.append(problem(
                f"checkpoint signature by key {checkpoint.key_fingerprint[:16]} does not verify "
                "(the checkpoint was edited, or copied from another store)", True))
            continue
        if verdict is Verdict.UNKNOWN_KEY:
            report.problems.append(problem(
                f"checkpoint is signed by key {checkpoint.key_fingerprint[:16]}, which is not trusted "
                f"({no_key_hint(keys)})", False))
        proven = verdict is Verdict.VALID
        why = _off_chain(store, run_id, checkpoint.stream, checkpoint.seq, checkpoint.head_hash, "signed head")
        if why is not None:
            report.problems.append(problem(why, proven))
            continue
        found = []
        if checkpoint.is_tree_head:
            found = _tree_and_end(report, checkpoint.stream, checkpoint.seq, checkpoint.tree_root,
                                  checkpoint.ended, checkpoint.world_size, "signed head")
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
        report.problems.append(Problem(
            run_id, first.stream, first.seq, None, None,
            f"exported head {source!r}: signature by key {statement.key_fingerprint[:16]} does not "
            "verify (the statement was edited)", altered=False))
        return
    if verdict is Verdict.UNKNOWN_KEY:
        report.problems.append(Problem(
            run_id, first.stream, first.seq, None, None,
            f"exported head {source!r} is signed by key {statement.key_fingerprint[:16]}, which is "
            f"not trusted ({no_key_hint(keys)})", altered=False))
    proven = verdict is Verdict.VALID
    if report.events == 0:
        report.problems.append(Problem(
            run_id, first.stream, first.seq, None, None,
            f"exported head {source!r}: the run has no events in this store (deleted, or this is "
            f"not the store it was exported from: store id {statement.store_id})", altered=proven))
        return
    subject = f"exported head {source!r}"
    for head in statement.heads:
        why = _off_chain(store, run_id, head.stream, head.seq, head.head_hash, subject)
        found = [why] if why is not None else []
        if why is None and statement.is_tree_head:
            found = _tree_and_end(report, head.stream, head.seq, head.tree_root, head.ended,
                                  statement.world_size, subject)
            if not found:
                found = _consistency(report, head, (leaves or {}).get(head.stream), subject)
        for what in found:
            report.problems.append(Problem(run_id, head.stream, head.seq, None, None, what, altered=proven))
        if proven and why is None and not any(_TREE in what or "does not extend" in what for what in found):
            _cover(report, head.stream, head.seq)
    if statement.complete:
        listed = {h.stream for h in statement.heads}
        for stream in sorted(set(report.tips) - listed):
            report.problems.append(Problem(
                run_id, stream, 1, None, None,
                f"stream {stream} is not in {subject}, which lists every stream of the ended run "
                "(a stream was added after the run ended)", altered=proven))


def _consistency(report: VerifyReport, head: StreamHead, leaves: PackedLeaves | None, subject: str) -> list[str]:
    """An RFC 9162 consistency proof from the exported tree head to today's, made and checked."""
    tip = report.tips.get(head.stream)
    if leaves is None or tip is None or head.tree_root is None or head.seq > len(leaves):
        return []
    proof = consistency_proof(leaves, head.seq, len(leaves))
    if verify_consistency(head.seq, len(leaves), bytes.fromhex(head.tree_root), bytes.fromhex(tip.tree_root), proof):
        report.consistency.append(
            f"stream {head.stream}: the record extends {subject} (consistency proof from tree size "
            f"{head.seq} to {len(leaves)}, {len(proof)} hashes)")
        return []
    return [f"the record does not extend {subject}: the consistency proof from tree size {head.seq} "
            f"to {len(leaves)} fails (events up to seq {head.seq} were changed)"]


def verify_coverage(report: VerifyReport, required: bool) -> list[Problem]:
    """Is every event covered by a valid signature? Required: problems (returned, to be
    named after any more specific ones); otherwise notes."""
    found: list[Problem] = []
    for stream, tip in sorted(report.tips.items()):
        covered = report.covered.get(stream, 0)
        if tip.seq == 0 or covered >= tip.seq:
            continue
        if covered == 0:
            what = ("no signature by a trusted key covers this stream (an unsigned run, its checkpoints "
                    "deleted, or a stream added); a bare chain cannot show that newer events were not "
                    "cut off, that the chain was not rewritten, or that the stream belongs to the run")
        else:
            what = (f"events seq {covered + 1}..{tip.seq} are not covered by any signature by a trusted "
                    "key (recorded after the last checkpoint, or appended later); a bare chain cannot "
                    "show they are genuine")
        if required:
            found.append(Problem(report.run_id, stream, covered + 1, None, None, what, altered=False))
        else:
            report.notes.append(f"stream {stream}: {what}")
    return found
