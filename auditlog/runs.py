"""Runs as the read side sees them: summary rows, derived status, and selection.

Status is derived, never trusted from a mutable column: a stream's ``run_ended``
event gives it; without one, a run whose process is gone is ``crashed`` (same
host: the pid is dead or was reused) or ``incomplete`` (another host, no
heartbeat for ``STALE_AFTER_S``). A run is never shown as running forever.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from auditlog.encoding import canonical_payload, chain_hash
from auditlog.errors import RunNotFoundError
from auditlog.metadata import process_start_ticks
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object

STALE_AFTER_S = 300


@dataclass
class RunInfo:
    """One row of ``auditlog runs``."""

    run_id: str
    name: str | None
    started_ns: int
    ended_ns: int | None
    status: str
    exit_code: int | None
    argv: list[str]
    git_commit: str | None
    git_dirty: bool | None
    events: int
    steps: int
    host: str
    pid: int
    last_seen_ns: int
    exception: dict[str, Any] | None

    @property
    def duration_s(self) -> float:
        end = self.ended_ns if self.ended_ns is not None else self.last_seen_ns
        return max(0.0, (end - self.started_ns) / 1e9)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "started": iso(self.started_ns),
            "ended": iso(self.ended_ns) if self.ended_ns else None,
            "duration_s": round(self.duration_s, 3),
            "status": self.status,
            "exit_code": self.exit_code,
            "argv": self.argv,
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "events": self.events,
            "steps": self.steps,
            "host": self.host,
            "pid": self.pid,
            "exception": self.exception,
        }


def iso(ns: int) -> str:
    """UTC ISO-8601 with milliseconds and a Z."""
    seconds = ns / 1e9
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(ns % 1_000_000_000) // 1_000_000:03d}Z"


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
    """Status of a run from its ``run_ended`` payload and, failing that, liveness."""
    if ended is not None:
        return str(ended.get("status", "completed"))
    if row["host"] == socket.gethostname():
        return "running" if process_alive(int(row["pid"]), row.get("proc_start")) else "crashed"
    now = now_ns if now_ns is not None else time.time_ns()
    return "running" if now - int(row["last_seen_ns"]) < STALE_AFTER_S * 1e9 else "incomplete"


def list_runs(store: EventStore) -> list[RunInfo]:
    """All runs, oldest first, with derived status."""
    counts = store.run_event_counts()
    # Summaries tolerate damaged rows (verify names them); nothing here may crash.
    started = {e["run_id"]: payload_object(e["payload"]) for e in store.events_of_kind("run_started") if e["stream"] == 0}
    ended_events = {
        e["run_id"]: e for e in store.events_of_kind("run_ended") if e["stream"] == 0 and isinstance(e["ts_ns"], int)
    }
    out: list[RunInfo] = []
    for row in store.run_rows():
        run_id = row["run_id"]
        meta = started.get(run_id, {})
        end_event = ended_events.get(run_id)
        ended = payload_object(end_event["payload"]) if end_event else None
        git = meta.get("git") or {}
        n_events, max_step = counts.get(run_id, (0, None))
        out.append(
            RunInfo(
                run_id=run_id,
                name=row.get("name"),
                started_ns=int(row["started_ns"]),
                ended_ns=int(end_event["ts_ns"]) if end_event else None,
                status=derive_status(row, ended),
                exit_code=None if ended is None else ended.get("exit_code"),
                argv=list(meta.get("argv") or []),
                git_commit=git.get("commit"),
                git_dirty=git.get("dirty"),
                events=n_events,
                steps=int((ended or {}).get("steps") or max_step or 0),
                host=row["host"],
                pid=int(row["pid"]),
                last_seen_ns=int(row["last_seen_ns"]),
                exception=None if ended is None else ended.get("exception"),
            )
        )
    return out


def select_run(store: EventStore, selector: str) -> str:
    """Resolve ``latest``, a full id, a unique id prefix or a run name to a run id."""
    rows = store.run_rows()
    if not rows:
        raise RunNotFoundError(f"store {store.location.display()!r} has no runs yet")
    if selector == "latest":
        return str(rows[-1]["run_id"])
    if selector.startswith("latest~"):
        back = selector[len("latest~") :]
        if not back.isdigit() or int(back) >= len(rows):
            raise RunNotFoundError(f"no run {selector!r} (the store has {len(rows)} runs)")
        return str(rows[-1 - int(back)]["run_id"])
    ids = [str(r["run_id"]) for r in rows]
    if selector in ids:
        return selector
    matches = [i for i in ids if i.startswith(selector.lower())] if selector else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        shown = ", ".join(m[:12] for m in matches[:5])
        raise RunNotFoundError(f"run prefix {selector!r} is ambiguous: matches {len(matches)} runs ({shown})")
    named = [str(r["run_id"]) for r in rows if r.get("name") == selector]
    if named:
        return named[-1]
    raise RunNotFoundError(f"no run matches {selector!r} (use an id, a unique id prefix, a name or 'latest')")


def close_crashed_runs(store: EventStore, detected_by: str) -> list[str]:
    """Append ``run_ended(status=crashed)`` to streams of this host whose process died.

    Called when a new recording starts, so a crash becomes part of the record
    ("crashed, detected later") instead of a status only derived at read time.
    Two recorders racing to close the same stream are arbitrated by the unique
    (run, stream, seq) constraint: the loser's insert fails and is ignored.
    """
    host = socket.gethostname()
    ended = store.ended_streams()
    closed: list[str] = []
    for row in store.run_rows():
        if row["host"] != host or process_alive(int(row["pid"]), row.get("proc_start")):
            continue
        for stream in store.streams(row["run_id"]):
            if (row["run_id"], stream) in ended:
                continue
            head = store.chain_head(row["run_id"], stream)
            if head is None:
                continue
            seq, prev = head
            last_step = store.max_step(row["run_id"], stream)
            event = {
                "run_id": row["run_id"],
                "stream": stream,
                "seq": seq + 1,
                "ts_ns": time.time_ns(),
                "kind": "run_ended",
                "step": last_step,
                "module_id": None,
                "tensor_id": None,
                "snapshot": None,
                "payload": canonical_payload(
                    {
                        "status": "crashed",
                        "exit_code": None,
                        "exception": None,
                        "signal": None,
                        "steps": last_step or 0,
                        "detected_by": detected_by,
                        "last_seen": iso(int(row["last_seen_ns"])),
                    }
                ),
            }
            event["hash"] = chain_hash(prev, event)
            try:
                store.append([event], row["run_id"], heartbeat=False)
            except Exception:
                continue
            closed.append(row["run_id"])
    return closed
