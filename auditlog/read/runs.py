"""Runs as the read side sees them: summary rows with derived status, and selection.

Status comes from ``auditlog.core.liveness``: never trusted from a mutable
column, never "running" forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditlog.core.errors import RunNotFoundError
from auditlog.core.liveness import derive_status
from auditlog.core.values import iso
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object


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
        """Start to end; a crashed run ends when it was last seen (its last event or
        heartbeat), not when a later recording noticed the crash."""
        if self.ended_ns is not None and self.status != "crashed":
            end = self.ended_ns
        else:
            end = self.last_seen_ns
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


def list_runs(store: EventStore) -> list[RunInfo]:
    """All runs, oldest first, with derived status."""
    counts = store.run_event_counts()
    activity = store.last_activity_ns()
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
                last_seen_ns=max(int(row["last_seen_ns"]), activity.get(run_id, 0)),
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
    if len(named) == 1:
        return named[0]
    if named:  # never guess which one was meant: an audit answer must name its run
        shown = ", ".join(n[:12] for n in named[-5:])
        raise RunNotFoundError(
            f"run name {selector!r} is ambiguous: {len(named)} runs have it ({shown}, newest last); "
            "select one by id"
        )
    raise RunNotFoundError(f"no run matches {selector!r} (use an id, a unique id prefix, a name or 'latest')")
