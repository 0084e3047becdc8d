"""``verify``: check every stream's hash chain and sequence, and say what broke.

Each link is checked against the *stored* hash of the event before it, so a
single edited event is reported as exactly that event and the rest of the chain
still verifies. When an event's hash does not match, nearby positions are tried
to tell a moved (reordered) event from an edited one. What a bare chain cannot
see (the newest events cut off, a whole chain rewritten with fresh hashes) needs
signed checkpoints, below.

Signed checkpoints are checked here too: each stored checkpoint's signature
against the trusted public keys (a checkpoint by an unknown key is reported,
never silently accepted) and its ``(seq, head_hash)`` against the chain, and so
is any exported head statement the caller holds (``verify --against``): the
chain must still have exactly that hash at that seq, which a cut-off tail or a
rewritten chain cannot fake without the private key.

Before any of that, ``verify_store`` runs the database's own structural check
(``EventStore.check_file``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from auditlog.core.chain import chain_hash, genesis_hash
from auditlog.core.errors import StoreError
from auditlog.integrity.keys import default_public_key_path, trusted_public_keys
from auditlog.integrity.signing import Checkpoint, HeadStatement, KeyRing, Verdict
from auditlog.integrity.snapshots import verify_snapshots
from auditlog.store.eventstore import EventStore

WINDOW = 32


@dataclass(frozen=True)
class Problem:
    """One integrity failure, pinned to an event or to the checkpoint that caught it.

    ``altered`` is True when the problem proves the record was changed, False when
    something could not be verified (a signature by a key nobody trusted, an
    exported statement that does not verify); both fail ``verify``.
    """

    run_id: str
    stream: int
    seq: int
    event_id: int | None
    kind: str | None
    what: str
    checkpoint_id: int | None = None
    altered: bool = True

    def describe(self) -> str:
        at = f"run {self.run_id[:12]} stream {self.stream} seq {self.seq}"
        if self.event_id is not None:
            at += f" (event id {self.event_id}, {self.kind})"
        if self.checkpoint_id is not None:
            at += f" (checkpoint {self.checkpoint_id})"
        return f"{at}: {self.what}"


@dataclass
class VerifyReport:
    """The outcome of verifying one run."""

    run_id: str
    events: int = 0
    streams: dict[int, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    checkpoints: int = 0
    statements: int = 0
    snapshots: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and self.events > 0

    def first_problem(self) -> Problem | None:
        """The problem to name first: the first proven alteration, else the first doubt."""
        for problem in self.problems:
            if problem.altered:
                return problem
        return self.problems[0] if self.problems else None


# A statement read from a file, with the name to report it by (the file path).
SourcedStatement = tuple[str, HeadStatement]


# Column -> allowed Python types of a stored event. Anyone with file access can
# store any SQLite value in any column; such a row is reported, never crashed on.
_EVENT_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "stream": (int,),
    "seq": (int,),
    "ts_ns": (int,),
    "kind": (str,),
    "step": (int, type(None)),
    "module_id": (int, type(None)),
    "tensor_id": (int, type(None)),
    "snapshot": (str, type(None)),
    "payload": (str,),
    "hash": (str,),
}


def _garbled_column(row: dict[str, Any]) -> str | None:
    """The first column of ``row`` holding a value the writer can never have stored."""
    for column, types in _EVENT_TYPES.items():
        value = row.get(column)
        if not isinstance(value, types) or isinstance(value, bool):
            return f"column {column} holds {type(value).__name__} {_short(value)}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _explain_mismatch(store: EventStore, row: dict[str, Any]) -> str:
    """Edited, or moved from another position? Try the neighbouring positions."""
    run_id, stream, seq = row["run_id"], row["stream"], int(row["seq"])
    hashes = store.hashes_between(run_id, stream, seq - WINDOW - 1, seq + WINDOW)
    for candidate in range(max(1, seq - WINDOW), seq + WINDOW + 1):
        if candidate == seq:
            continue
        prev = genesis_hash(run_id, stream) if candidate == 1 else hashes.get(candidate - 1)
        if prev is None:
            continue
        if chain_hash(prev, {**row, "seq": candidate}) == row["hash"]:
            return f"event was recorded as seq {candidate} and moved here (events reordered)"
    for position, stored in hashes.items():
        if position != seq - 1 and chain_hash(stored, row) == row["hash"]:
            return (
                f"event is intact but was chained after the event now at seq {position} "
                "(events reordered)"
            )
    # Moved together with its predecessor (a block shifted by an insertion or a
    # deletion followed by renumbering): any nearby seq after any nearby hash.
    for candidate in range(max(1, seq - WINDOW), seq + WINDOW + 1):
        shifted = {**row, "seq": candidate}
        for stored in hashes.values():
            if chain_hash(stored, shifted) == row["hash"]:
                return f"event was recorded as seq {candidate} and renumbered (events inserted or removed before it)"
    return "content does not match its recorded hash (the event or its hash was modified)"


def verify_stream(
    store: EventStore,
    run_id: str,
    stream: int,
    report: VerifyReport,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Check one stream, appending problems to ``report``."""
    expected = 1
    # prev: the stored hash of the previous event; recomputed: what that hash should
    # be given its own content. An event chained to either is intact, so editing
    # one event's hash column is reported once, not also at the next event.
    prev = recomputed = genesis_hash(run_id, stream)
    last_id = -1
    count = 0
    mismatched: list[dict[str, Any]] = []
    for row in store.iter_events(run_id, stream=stream):
        count += 1
        garbled = _garbled_column(row)
        if garbled is not None:
            seq_value = row.get("seq")
            at = seq_value if isinstance(seq_value, int) and not isinstance(seq_value, bool) else expected
            kind = row.get("kind") if isinstance(row.get("kind"), str) else None
            report.problems.append(
                Problem(run_id, stream, at, row.get("id"), kind, f"event is garbled: {garbled}")
            )
            if isinstance(row.get("hash"), str):
                prev = recomputed = row["hash"]
            expected = max(expected, at + 1)
            continue
        seq = int(row["seq"])
        if seq > expected:
            missing = f"seq {expected}" if seq == expected + 1 else f"seqs {expected}..{seq - 1}"
            report.problems.append(
                Problem(run_id, stream, expected, None, None, f"{missing} missing (events deleted)")
            )
            prev = recomputed = row["hash"]
        elif seq < expected:
            report.problems.append(
                Problem(run_id, stream, seq, row["id"], row["kind"], "duplicate sequence number (event inserted)")
            )
            continue
        else:
            computed = chain_hash(prev, row)
            if computed != row["hash"] and (
                recomputed == prev or chain_hash(recomputed, row) != row["hash"]
            ):
                mismatched.append(row)
            recomputed = computed
        if row["id"] < last_id:
            report.problems.append(
                Problem(run_id, stream, seq, row["id"], row["kind"], "stored out of order (events reordered)")
            )
        last_id = row["id"]
        prev = row["hash"]
        expected = seq + 1
        if progress is not None:
            progress(1)
    for row in mismatched[:50]:
        report.problems.append(
            Problem(run_id, stream, int(row["seq"]), row["id"], row["kind"], _explain_mismatch(store, row))
        )
    if len(mismatched) > 50:
        report.problems.append(
            Problem(run_id, stream, int(mismatched[50]["seq"]), None, None,
                    f"and {len(mismatched) - 50} more events whose hash does not match")
        )
    report.streams[stream] = count
    report.events += count


def _streams(store: EventStore, run_id: str, report: VerifyReport) -> list[int]:
    """The run's stream numbers; events whose stream column is not a number are reported."""
    rows = store.stream_event_counts(run_id)
    streams: list[int] = []
    for value, count in rows:
        if isinstance(value, int) and not isinstance(value, bool):
            streams.append(value)
        else:
            report.problems.append(
                Problem(run_id, 0, 0, None, None,
                        f"{count} event(s) have stream {_short(value)}, not a number (garbled)")
            )
            report.events += int(count)
    return sorted(streams)


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


def _no_key_hint(keys: KeyRing) -> str:
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
    """Check every stored checkpoint of a run: its signature, and that it is on the chain."""
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
                f"({_no_key_hint(keys)})", False))
        why = _off_chain(
            store, run_id, checkpoint.stream, checkpoint.seq, checkpoint.head_hash, "signed head"
        )
        if why is not None:
            report.problems.append(problem(why, verdict is Verdict.VALID))


def verify_statement(
    store: EventStore, report: VerifyReport, source: str, statement: HeadStatement, keys: KeyRing
) -> None:
    """Check an exported head statement: its signature, and that the chain still extends it."""
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
            f"not trusted ({_no_key_hint(keys)})", altered=False))
    proven = verdict is Verdict.VALID
    if report.events == 0:
        report.problems.append(Problem(
            run_id, first.stream, first.seq, None, None,
            f"exported head {source!r}: the run has no events in this store (deleted, or this is "
            f"not the store it was exported from: store id {statement.store_id})", altered=proven))
        return
    for head in statement.heads:
        why = _off_chain(
            store, run_id, head.stream, head.seq, head.head_hash, f"exported head {source!r}"
        )
        if why is not None:
            report.problems.append(Problem(run_id, head.stream, head.seq, None, None, why, altered=proven))


def verify_run(
    store: EventStore,
    run_id: str,
    progress: Callable[[int], None] | None = None,
    *,
    keys: KeyRing | None = None,
    statements: Sequence[SourcedStatement] = (),
) -> VerifyReport:
    """Verify every stream of a run, its checkpoints and the given exported heads.

    ``keys``: the public keys whose signatures are trusted; None means the
    default public key (see ``auditlog.integrity.keys``), if there is one, read only when
    there is a signature to check. Problems are sorted so the first bad event
    is first.
    """
    report = VerifyReport(run_id)
    for stream in _streams(store, run_id, report):
        verify_stream(store, run_id, stream, report, progress)
    mine = [(source, st) for source, st in statements if st.run_id == run_id]
    if report.events == 0:
        # A run known only from a statement: the statement's problem says it better.
        if not mine or store.has_run_row(run_id):
            report.problems.append(Problem(run_id, 0, 1, None, None, "run has no events (all deleted)"))
    elif not store.has_run_row(run_id):
        report.problems.append(Problem(
            run_id, 0, 1, None, None, "run has events but its row in the runs index was deleted"))
    rows = store.checkpoint_rows(run_id)
    if keys is None:
        # Read the default key only when there is a signature to check: a broken
        # key file must not fail verification of stores that never used signing.
        keys = KeyRing(trusted_public_keys()) if rows or mine else KeyRing()
    verify_checkpoints(store, run_id, report, keys, store.meta().get("store_id", ""), rows)
    for source, statement in mine:
        verify_statement(store, report, source, statement, keys)
    if report.events:
        _verify_snapshot_files(store, run_id, report)
    report.problems.sort(key=lambda p: (p.stream, p.seq))
    return report


def _verify_snapshot_files(store: EventStore, run_id: str, report: VerifyReport) -> None:
    """Every snapshot the run references must still hold the content its hash names."""
    try:
        report.snapshots, found = verify_snapshots(store, run_id)
    except StoreError:
        return  # a malformed event: already reported by the chain check above
    for problem in found:
        report.problems.append(
            Problem(
                run_id,
                0,
                problem.seq,
                problem.event_id,
                "snapshot",
                f"snapshot of {problem.tensor} "
                f"({'file snapshots/' + problem.file if problem.file else 'no catalog entry'}): {problem.what}",
            )
        )
