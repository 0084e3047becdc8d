"""``verify``: check every stream's hash chain, sequence, tree and end, and say what broke.

Each link is checked against the *stored* hash of the event before it, so a
single edited event is reported as exactly that event and the rest of the chain
still verifies. When an event's hash does not match, nearby positions are tried
to tell a moved (reordered) event from an edited one. In the same pass every
stream's Merkle tree (RFC 9162, ``merkle``) is computed over the same canonical
rows, with its head at every size a signed statement names.

A stream begins with its ``run_started`` and ends at its ``run_ended``: an event
after the end was appended to a finished stream, whatever its hash. Its
``run_started`` declares the run's ``world_size``: streams are numbered below
it, and every stream declares the same.

What a bare chain cannot see (the newest events cut off, a whole chain
rewritten with fresh hashes, a stream added with its own fresh chain) needs a
signature: ``signed`` checks stored checkpoints, exported heads and, with
``require_signed``, that every event is covered by one. ``runindex`` checks the
runs index against the chain, ``snapshots`` the snapshot files.

Before any of that, ``Store.verify`` runs the database's own structural check
(``EventStore.check_file``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from auditlog.core.chain import CURRENT, FORMATS, ChainFormat, chain_hash
from auditlog.core.errors import StoreError
from auditlog.core.ranks import split_stream
from auditlog.integrity.chaincheck import StreamCheck, short, stream_format
from auditlog.integrity.checkpoints import (
    signed_sizes,
    verify_checkpoints,
    verify_coverage,
    verify_statement,
)
from auditlog.integrity.findings import Problem, SourcedStatement, StreamTip, VerifyReport
from auditlog.integrity.keys import KeyRing, trusted_public_keys
from auditlog.integrity.merkle import PackedLeaves
from auditlog.integrity.parallel import check_split, split_point
from auditlog.integrity.runindex import verify_run_index
from auditlog.integrity.snapshots import ChecksAhead, check_files_ahead, verify_snapshots
from auditlog.store.eventstore import EventStore

__all__ = [
    "Problem",
    "SourcedStatement",
    "StreamTip",
    "VerifyReport",
    "verify_run",
    "verify_stream",
]

WINDOW = 32


def _explain_mismatch(store: EventStore, row: dict[str, Any], chain: ChainFormat) -> str:
    """Edited, moved from another position, or hashed in another chain format than its
    stream's (``chain``)? Try the neighbouring positions, then the other formats."""
    run_id, stream, seq = row["run_id"], row["stream"], int(row["seq"])
    hashes = store.hashes_between(run_id, stream, seq - WINDOW - 1, seq + WINDOW)
    for candidate in range(max(1, seq - WINDOW), seq + WINDOW + 1):
        if candidate == seq:
            continue
        prev = chain.genesis(run_id, stream) if candidate == 1 else hashes.get(candidate - 1)
        if prev is None:
            continue
        if chain_hash(prev, {**row, "seq": candidate}, chain=chain) == row["hash"]:
            return f"event was recorded as seq {candidate} and moved here (events reordered)"
    for position, stored in hashes.items():
        if position != seq - 1 and chain_hash(stored, row, chain=chain) == row["hash"]:
            return (
                f"event is intact but was chained after the event now at seq {position} "
                "(events reordered)"
            )
    # Moved together with its predecessor (a block shifted by an insertion or a
    # deletion followed by renumbering): any nearby seq after any nearby hash.
    for candidate in range(max(1, seq - WINDOW), seq + WINDOW + 1):
        shifted = {**row, "seq": candidate}
        for stored in hashes.values():
            if chain_hash(stored, shifted, chain=chain) == row["hash"]:
                return f"event was recorded as seq {candidate} and renumbered (events inserted or removed before it)"
    for other in FORMATS:
        prev = other.genesis(run_id, stream) if seq == 1 else hashes.get(seq - 1)
        if (
            other != chain
            and prev is not None
            and chain_hash(prev, row, chain=other) == row["hash"]
        ):
            return (
                f"event is hashed in chain format {other.version}, but its stream is in "
                f"{chain.version}, fixed by its first event: formats never mix in a stream "
                "(the event was added or rewritten)"
            )
    return "content does not match its recorded hash (the event or its hash was modified)"


def verify_stream(
    store: EventStore,
    run_id: str,
    stream: int,
    report: VerifyReport,
    progress: Callable[[int], None] | None = None,
    *,
    sizes: frozenset[int] = frozenset(),
    leaves: PackedLeaves | None = None,
    count: int | None = None,
) -> StreamTip:
    """Check one stream, appending problems to ``report``; returns what was read.

    ``sizes``: tree sizes whose heads signed statements name (recorded in the
    tip's ``roots``); ``leaves``: collects every leaf hash (for proofs);
    ``count``: how many events the stream holds, when known (a long one is
    checked in two processes, ``integrity.parallel``).
    """
    check = StreamCheck(run_id, stream, report, sizes, leaves)
    split = (
        split_point(count) if count is not None and store.location.database is not None else None
    )
    chain = stream_format(store, run_id, stream) if split is not None else None
    if split is not None and chain is not None:
        # a long stream of a SQLite file: its second half in a forked process, in the
        # format its first event fixes (the check of the first half finds it again)
        check_split(store, check, split, chain, progress)
    else:
        for rows in store.event_tuples(run_id, stream):
            check.feed(rows, progress)
    mismatched, after_end, tip = check.mismatched, check.after_end, check.tip
    for row in mismatched[:50]:
        report.problems.append(
            Problem(
                run_id,
                stream,
                int(row["seq"]),
                row["id"],
                row["kind"],
                _explain_mismatch(store, row, check.chain or CURRENT),
            )
        )
    if len(mismatched) > 50:
        report.problems.append(
            Problem(
                run_id,
                stream,
                int(mismatched[50]["seq"]),
                None,
                None,
                f"and {len(mismatched) - 50} more events whose hash does not match",
            )
        )
    if after_end:
        first = after_end[0]
        report.problems.append(
            Problem(
                run_id,
                stream,
                int(first["seq"]),
                first["id"],
                first["kind"],
                f"{len(after_end)} event(s) after the stream's run_ended at seq {tip.ended_at} "
                "(a stream ends at its run_ended: events were appended to a finished stream)",
            )
        )
    tip.tree_root = check.tree.root().hex()
    report.streams[stream] = check.count
    report.events += check.count
    report.tips[stream] = tip
    return tip


def _streams(store: EventStore, run_id: str, report: VerifyReport) -> dict[int, int]:
    """The run's stream numbers and event counts; events whose stream column is not a number are reported."""
    rows = store.stream_event_counts(run_id)
    streams: dict[int, int] = {}
    for value, count in rows:
        if isinstance(value, int) and not isinstance(value, bool):
            streams[value] = int(count)
        else:
            report.problems.append(
                Problem(
                    run_id,
                    0,
                    0,
                    None,
                    None,
                    f"{count} event(s) have stream {short(value)}, not a number (garbled)",
                )
            )
            report.events += int(count)
    return dict(sorted(streams.items()))


def verify_run(
    store: EventStore,
    run_id: str,
    progress: Callable[[int], None] | None = None,
    *,
    keys: KeyRing | None = None,
    statements: Sequence[SourcedStatement] = (),
    require_signed: bool | None = None,
    keep_leaves: bool = False,
    snapshot_files: bool = True,
) -> VerifyReport:
    """Verify every stream of a run, its checkpoints, the given exported heads and its index row.

    ``keys``: the public keys whose signatures are trusted; None means the
    default public key (see ``auditlog.integrity.keys``), if there is one, read only when
    there is a signature to check. ``require_signed`` (default: keys were given):
    every event of every stream must be covered by a valid signature by one of
    them, or the run fails as not verified. Problems are sorted so the first bad
    event is first. ``snapshot_files=False`` leaves the snapshot files out (a
    restore checks each file it reads itself).
    """
    report = VerifyReport(run_id)
    # Snapshot files handed to worker processes first, where started: checked meanwhile.
    ahead = check_files_ahead(store, run_id) if snapshot_files else None
    mine = [(source, st) for source, st in statements if st.run_id == run_id]
    rows = store.checkpoint_rows(run_id)
    sizes = signed_sizes(rows, [st for _, st in mine])
    leaves: dict[int, PackedLeaves] = {}
    for stream, count in _streams(store, run_id, report).items():
        kept = (
            leaves.setdefault(stream, PackedLeaves())
            if keep_leaves or _needs_leaves(mine, stream)
            else None
        )
        verify_stream(
            store,
            run_id,
            stream,
            report,
            progress,
            sizes=frozenset(sizes.get(stream, ())),
            leaves=kept,
            count=count,
        )
    _check_streams(report)
    if report.events == 0:
        # A run known only from a statement: the statement's problem says it better.
        if not mine or store.has_run_row(run_id):
            report.problems.append(
                Problem(run_id, 0, 1, None, None, "run has no events (all deleted)")
            )
    else:
        verify_run_index(store, run_id, report)
    explicit = keys is not None
    if keys is None:
        # Read the default key only when there is a signature to check: a broken
        # key file must not fail verification of stores that never used signing.
        keys = KeyRing(trusted_public_keys()) if rows or mine else KeyRing()
    verify_checkpoints(store, run_id, report, keys, store.meta().get("store_id", ""), rows)
    for source, statement in mine:
        verify_statement(store, report, source, statement, keys, leaves)
    uncovered: list[Problem] = []
    if report.events:
        uncovered = verify_coverage(report, explicit if require_signed is None else require_signed)
        if snapshot_files:
            _verify_snapshot_files(store, run_id, report, ahead)
    report.problems.sort(key=lambda p: (p.stream, p.seq))
    report.problems.extend(uncovered)  # after the problems that may explain them
    return report


def _needs_leaves(statements: Sequence[SourcedStatement], stream: int) -> bool:
    """A consistency proof is made for a stream an exported tree head names."""
    return any(
        st.is_tree_head and any(h.stream == stream for h in st.heads) for _, st in statements
    )


def _check_streams(report: VerifyReport) -> None:
    """Within each segment (one launch of the job; an elastic restart starts the next),
    the streams agree on the world size and are ranks below it.

    A stream's number is ``rank + STREAM_STRIDE * segment`` (``auditlog.core.ranks``).
    """
    segments: dict[int, dict[int, int | None]] = {}
    for stream, tip in report.tips.items():
        segment, _rank = split_stream(stream)
        segments.setdefault(segment, {})[stream] = tip.world_size
    for segment, members in sorted(segments.items()):
        declared = {s: w for s, w in members.items() if w is not None}
        if len(set(declared.values())) > 1:
            lowest = min(declared)
            for stream, size in sorted(declared.items()):
                if size != declared[lowest]:
                    report.problems.append(
                        Problem(
                            report.run_id,
                            stream,
                            1,
                            None,
                            "run_started",
                            f"run_started says world_size {size}, stream {lowest}'s says {declared[lowest]} "
                            "(a stream was added or its run_started replaced)",
                        )
                    )
            continue
        if not declared:
            continue
        world = next(iter(declared.values()))
        assert world is not None
        ranks = {split_stream(s)[1]: s for s in members}
        for rank, stream in sorted(ranks.items()):
            if rank >= world:
                report.problems.append(
                    Problem(
                        report.run_id,
                        stream,
                        1,
                        None,
                        None,
                        f"stream {stream} is not a stream of this run: its run_started declares world_size "
                        f"{world} (ranks 0..{world - 1}; a stream was added)",
                    )
                )
        missing = sorted(set(range(world)) - set(ranks))
        if missing:
            where = f" of segment {segment}" if segment else ""
            report.notes.append(
                f"world_size {world}, but no events of rank(s) {', '.join(map(str, missing))}{where} "
                "(ranks that were not recorded, or whose events were deleted)"
            )


def _verify_snapshot_files(
    store: EventStore, run_id: str, report: VerifyReport, ahead: ChecksAhead | None
) -> None:
    """Every snapshot the run references must still hold the content its hash names."""
    try:
        report.snapshots, found = verify_snapshots(store, run_id, ahead)
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
                f"snapshot of {problem.tensor} ({problem.place}): {problem.what}",
            )
        )
