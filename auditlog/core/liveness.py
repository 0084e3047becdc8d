"""Is the process that recorded a run still alive? Status derived, never trusted from a column.

A stream's ``run_ended`` event gives a run's status; without one, a run whose
process is gone is ``crashed`` (same host: the pid is dead or was reused, told
apart by the process start time) or ``incomplete`` (another host, no heartbeat
for ``STALE_AFTER_S``). A run is never shown as running forever.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

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


def derive_status(row: dict[str, Any], ended: dict[str, Any] | None, now_ns: int | None = None) -> str:
    """Status of a run from its ``run_ended`` payload and, failing that, liveness.

    ``row`` holds the run's ``host``, ``pid``, ``proc_start`` and ``last_seen_ns``.
    """
    if ended is not None:
        return str(ended.get("status", "completed"))
    if row["host"] == socket.gethostname():
        return "running" if process_alive(int(row["pid"]), row.get("proc_start")) else "crashed"
    now = now_ns if now_ns is not None else time.time_ns()
    return "running" if now - int(row["last_seen_ns"]) < STALE_AFTER_S * 1e9 else "incomplete"
