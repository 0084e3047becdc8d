"""Ranks, streams and segments: how the processes of one distributed job share one run.

One job (all ranks started by one ``torchrun``) is one run; every process
writes its own stream, a hash chain of its own. The stream number is
``rank + STREAM_STRIDE * segment``: segment 0 is the first launch of the
workers, and each later segment is a new set of streams that never overwrites
or continues an earlier one (an elastic restart, ``TORCHELASTIC_RESTART_COUNT``
= 1, 2, ...; or a run id used again). A stream ends at its ``run_ended``; a
rank that runs again gets a new stream, so every chain stays a whole,
verifiable record of one process.

The status of a run comes from all its streams (``run_status``): the last
segment decides, a run is completed only when every rank of that segment
completed, and a failure names its rank. This module is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# 1,000,000 ranks per segment: larger than any job, and a stream still fits a
# 32-bit INTEGER column (PostgreSQL) for 2,147 segments.
STREAM_STRIDE = 1_000_000

# Which status names a multi-rank run when its ranks disagree: the first one in
# this order that any rank of the last segment has. A rank that crashed (killed,
# out of memory) is the cause: its peers then fail in their next collective
# ("Connection reset by peer") or are stopped by the launcher ("interrupted").
# A rank that failed with an exception comes next; torchrun stops the others.
_PRECEDENCE = ("running", "crashed", "failed", "incomplete", "interrupted", "completed")


def stream_number(rank: int, segment: int = 0) -> int:
    """The stream a rank writes in a segment (segment 0: the first launch)."""
    if not 0 <= rank < STREAM_STRIDE:
        raise ValueError(f"rank {rank} out of range 0..{STREAM_STRIDE - 1}")
    return rank + STREAM_STRIDE * segment


def split_stream(stream: int) -> tuple[int, int]:
    """``(segment, rank)`` of a stream number (the inverse of ``stream_number``)."""
    return divmod(stream, STREAM_STRIDE)


@dataclass(frozen=True)
class StreamStatus:
    """One stream's facts for the run status: who it was and how it ended."""

    stream: int
    rank: int
    segment: int
    world_size: int
    status: str
    host: str | None = None
    exception: dict[str, Any] | None = None

    def describe(self) -> str:
        where = f"rank {self.rank}" + (f" (segment {self.segment})" if self.segment else "")
        if self.exception and self.exception.get("type"):
            return f"{where} {self.status}: {self.exception.get('type')}: {self.exception.get('message')}"
        return f"{where} {self.status}"


@dataclass(frozen=True)
class RunStatus:
    """The status of a run from all its streams, and what to say about its ranks."""

    status: str
    detail: str | None = None
    ranks: tuple[int, ...] = ()
    world_size: int = 1
    segments: int = 1
    streams: tuple[StreamStatus, ...] = field(default_factory=tuple)


def stream_facts(stream: int, started: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """``(rank, segment, world_size)`` of a stream: from its chained ``run_started``
    payload when it says, else from the stream number."""
    segment, rank = split_stream(stream)
    world = 1
    if started:
        value = started.get("rank")
        if isinstance(value, int) and not isinstance(value, bool):
            rank = value
        value = started.get("segment")
        if isinstance(value, int) and not isinstance(value, bool):
            segment = value
        value = started.get("world_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            world = value
    return rank, segment, world


def run_status(streams: Iterable[StreamStatus]) -> RunStatus:
    """Combine the streams of one run into its status (see the module docstring).

    Only the last segment counts for the status (an elastic restart that finished
    completes the run); earlier segments are named in ``detail``. A segment with
    fewer streams than its ``world_size`` is ``incomplete`` unless some rank still
    runs: a rank never recorded anything.
    """
    items = sorted(streams, key=lambda s: (s.segment, s.rank))
    if not items:
        return RunStatus("incomplete", "no streams")
    last_segment = items[-1].segment
    last = [s for s in items if s.segment == last_segment]
    world = max(s.world_size for s in last)
    statuses = {s.status for s in last}
    missing = sorted(set(range(world)) - {s.rank for s in last}) if world > 1 else []
    status = next((name for name in _PRECEDENCE if name in statuses), sorted(statuses)[0])
    if missing and status in ("completed", "interrupted"):
        status = "incomplete"
    ranks = tuple(s.rank for s in last if s.status == status)
    notes: list[str] = []
    if world > 1 or len(last) > 1:
        notes.extend(s.describe() for s in last if s.status != "completed")
        if missing:
            notes.append(
                "no stream from rank" + ("s " if len(missing) > 1 else " ") + _ranks(missing)
            )
    earlier = [s for s in items if s.segment != last_segment and s.status != "completed"]
    if earlier:
        restarts = len({s.segment for s in items}) - 1
        notes.append(
            f"{restarts} restart{'s' if restarts != 1 else ''} before: "
            + "; ".join(s.describe() for s in earlier)
        )
    return RunStatus(
        status=status,
        detail="; ".join(notes) or None,
        ranks=ranks if (world > 1 or len(last) > 1) else (),
        world_size=world,
        segments=len({s.segment for s in items}),
        streams=tuple(items),
    )


def _ranks(values: list[int]) -> str:
    shown = ", ".join(str(v) for v in values[:8])
    return shown + (f" and {len(values) - 8} more" if len(values) > 8 else "")
