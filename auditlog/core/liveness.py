"""Is the process that recorded a run still alive? Status derived, never trusted from a column.

A stream's ``run_ended`` event gives its status; without one, a stream whose
process is gone is ``crashed`` (same host: the pid is dead or was reused, told
apart by the process start time) or ``incomplete`` (another host, no heartbeat
for ``STALE_AFTER_S``). A run is never shown as running forever. Each stream is
judged by its own process (``run_started`` names host, pid and start time), and
a run's status combines its streams (``auditlog.core.ranks.run_status``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from auditlog.core.ranks import RunStatus, StreamStatus, run_status, stream_facts

STALE_AFTER_S = 300


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux), to tell reused pids apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, proc_start: int | None) -> bool:
    """Is the process that recorded this run still the one running under ``pid``?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if proc_start is None:
        return True
    return process_start_ticks(pid) == proc_start


def derive_status(
    row: dict[str, Any], ended: dict[str, Any] | None, now_ns: int | None = None
) -> str:
    """Status of a run from its ``run_ended`` payload and, failing that, liveness.

    ``row`` holds the run's ``host``, ``pid``, ``proc_start`` and ``last_seen_ns``.
    """
    if ended is not None:
        return str(ended.get("status", "completed"))
    if row["host"] == socket.gethostname():
        return "running" if process_alive(int(row["pid"]), row.get("proc_start")) else "crashed"
    now = now_ns if now_ns is not None else time.time_ns()
    return "running" if now - int(row["last_seen_ns"]) < STALE_AFTER_S * 1e9 else "incomplete"


def stream_liveness(
    row: Mapping[str, Any],
    started: Mapping[str, Any] | None,
    ended: Mapping[str, Any] | None,
    now_ns: int | None = None,
) -> str:
    """Status of one stream: its ``run_ended``, else the liveness of the process
    its ``run_started`` names (older records: the run's index row)."""
    if ended is not None:
        return str(ended.get("status", "completed"))
    facts = dict(row)
    if started and isinstance(started.get("pid"), int):
        facts.update(
            host=started.get("host"), pid=started["pid"], proc_start=started.get("proc_start")
        )
    return derive_status(facts, None, now_ns)


def run_liveness(
    row: Mapping[str, Any],
    started: Mapping[int, Mapping[str, Any]],
    ended: Mapping[int, Mapping[str, Any]],
    now_ns: int | None = None,
) -> RunStatus:
    """The status of a run from every stream's ``run_started``/``run_ended`` payloads.

    ``row`` is the run's index row (host, pid, proc_start, last_seen_ns): the
    fallback for streams whose ``run_started`` does not say, and the heartbeat.
    """
    streams = sorted(set(started) | set(ended))
    if not streams:
        return RunStatus(derive_status(dict(row), None, now_ns))
    items = []
    for stream in streams:
        begun = started.get(stream)
        rank, segment, world = stream_facts(stream, begun)
        end = ended.get(stream)
        exception = end.get("exception") if end is not None else None
        items.append(
            StreamStatus(
                stream=stream,
                rank=rank,
                segment=segment,
                world_size=world,
                status=stream_liveness(row, begun, end, now_ns),
                host=(begun or {}).get("host"),
                exception=exception if isinstance(exception, dict) else None,
            )
        )
    return run_status(items)
