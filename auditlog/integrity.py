"""``verify``: check every stream's hash chain and sequence, and say what broke.

Each link is checked against the *stored* hash of the event before it, so a
single edited event is reported as exactly that event and the rest of the chain
still verifies. When an event's hash does not match, nearby positions are tried
to tell a moved (reordered) event from an edited one. What a bare chain cannot
see (the newest events cut off, a whole chain rewritten with fresh hashes) needs
signed checkpoints held outside the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from auditlog.encoding import chain_hash, genesis_hash
from auditlog.store import schema
from auditlog.store.eventstore import EventStore

WINDOW = 32


@dataclass(frozen=True)
class Problem:
    """One integrity failure, pinned to an event."""

    run_id: str
    stream: int
    seq: int
    event_id: int | None
    kind: str | None
    what: str

    def describe(self) -> str:
        at = f"run {self.run_id[:12]} stream {self.stream} seq {self.seq}"
        if self.event_id is not None:
            at += f" (event id {self.event_id}, {self.kind})"
        return f"{at}: {self.what}"


@dataclass
class VerifyReport:
    """The outcome of verifying one run."""

    run_id: str
    events: int = 0
    streams: dict[int, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.events > 0


def _stream_rows(store: EventStore, run_id: str, stream: int) -> Iterator[dict[str, Any]]:
    return store.iter_events(run_id, stream=stream)


def _window(store: EventStore, run_id: str, stream: int, low: int, high: int) -> dict[int, str]:
    ev = schema.events
    with store.guard("verifying"), store.engine.connect() as conn:
        rows = conn.execute(
            select(ev.c.seq, ev.c.hash).where(
                ev.c.run_id == run_id, ev.c.stream == stream, ev.c.seq >= low, ev.c.seq <= high
            )
        )
        return {int(r[0]): str(r[1]) for r in rows}


def _explain_mismatch(store: EventStore, row: dict[str, Any]) -> str:
    """Edited, or moved from another position? Try the neighbouring positions."""
    run_id, stream, seq = row["run_id"], row["stream"], int(row["seq"])
    hashes = _window(store, run_id, stream, seq - WINDOW - 1, seq + WINDOW)
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
    for row in _stream_rows(store, run_id, stream):
        count += 1
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


def verify_run(
    store: EventStore, run_id: str, progress: Callable[[int], None] | None = None
) -> VerifyReport:
    """Verify every stream of a run; problems are sorted so the first bad event is first."""
    report = VerifyReport(run_id)
    for stream in store.streams(run_id):
        verify_stream(store, run_id, stream, report, progress)
    if report.events == 0:
        report.problems.append(Problem(run_id, 0, 1, None, None, "run has no events (all deleted)"))
    report.problems.sort(key=lambda p: (p.stream, p.seq))
    return report
