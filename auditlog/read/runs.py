"""Runs as the read side sees them: summary rows with derived status, and selection.

Status comes from ``auditlog.core.liveness``: never trusted from a mutable
column, never "running" forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from auditlog.core.errors import RunNotFoundError
from auditlog.core.liveness import run_liveness
from auditlog.core.values import iso
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object


@dataclass
class RunInfo:
    """One row of ``auditlog runs``.

    A run of several processes (torchrun ranks) has one stream per rank;
    ``status`` combines them (``auditlog.core.ranks.run_status``) and
    ``status_detail`` names the ranks that did not complete. ``argv``, git and
    ``host``/``pid`` come from the lowest stream (rank 0).
    """

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
    world_size: int = 1
    streams: int = 1
    status_detail: str | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)

    def ranks_named(self) -> list[int]:
        """The ranks of the last segment whose status is the run's (a multi-rank run)."""
        if self.world_size <= 1 and self.streams <= 1:
            return []
        last = max((r["segment"] for r in self.ranks), default=0)
        return sorted(r["rank"] for r in self.ranks if r["segment"] == last and r["status"] == self.status)

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
            "status_detail": self.status_detail,
            "exit_code": self.exit_code,
            "argv": self.argv,
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "events": self.events,
            "steps": self.steps,
            "host": self.host,
            "pid": self.pid,
            "world_size": self.world_size,
            "streams": self.streams,
            "ranks": self.ranks,
            "exception": self.exception,
        }


def list_runs(store: EventStore) -> list[RunInfo]:
    """All runs, oldest first, with derived status."""
    counts = store.run_event_counts()
    # Summaries tolerate damaged rows (verify names them); nothing here may crash.
    started: dict[str, dict[int, dict[str, Any]]] = {}
    for event in store.events_of_kind("run_started"):
        if isinstance(event["run_id"], str) and isinstance(event["stream"], int):
            started.setdefault(event["run_id"], {})[event["stream"]] = payload_object(event["payload"])
    ended: dict[str, dict[int, dict[str, Any]]] = {}
    ended_at: dict[str, dict[int, int]] = {}
    for event in store.events_of_kind("run_ended"):
        if isinstance(event["run_id"], str) and isinstance(event["stream"], int) and isinstance(event["ts_ns"], int):
            ended.setdefault(event["run_id"], {})[event["stream"]] = payload_object(event["payload"])
            ended_at.setdefault(event["run_id"], {})[event["stream"]] = event["ts_ns"]
    out: list[RunInfo] = []
    for row in store.run_rows():
        run_id = row["run_id"]
        begun, finished = started.get(run_id, {}), ended.get(run_id, {})
        live = run_liveness(row, begun, finished)
        first = min(begun) if begun else None
        meta = begun.get(first, {}) if first is not None else {}
        last_segment = [s.stream for s in live.streams if s.segment == (live.streams[-1].segment if live.streams else 0)]
        ends = [ended_at.get(run_id, {}).get(stream) for stream in last_segment]
        cause = next((s for s in live.streams if s.rank in live.ranks and s.status == live.status), None)
        deciding = finished.get(cause.stream) if cause is not None else finished.get(first) if first is not None else None
        git = meta.get("git") or {}
        n_events, max_step = counts.get(run_id, (0, None))
        steps = max([_int((e or {}).get("steps")) for e in finished.values()] + [0]) or max_step or 0
        out.append(
            RunInfo(
                run_id=run_id,
                name=row.get("name"),
                started_ns=int(row["started_ns"]),
                ended_ns=_last_end(live.status, ends),
                status=live.status,
                exit_code=None if deciding is None else deciding.get("exit_code"),
                argv=list(meta.get("argv") or []),
                git_commit=git.get("commit"),
                git_dirty=git.get("dirty"),
                events=n_events,
                steps=int(steps),
                host=str(meta.get("host") or row["host"]),
                pid=int(meta["pid"]) if isinstance(meta.get("pid"), int) else int(row["pid"]),
                last_seen_ns=int(row["last_seen_ns"]),
                exception=None if deciding is None else deciding.get("exception"),
                world_size=live.world_size,
                streams=len(live.streams) or 1,
                status_detail=live.detail,
                ranks=[
                    {"stream": s.stream, "rank": s.rank, "segment": s.segment, "status": s.status, "host": s.host}
                    for s in live.streams
                ],
            )
        )
    return out


def _last_end(status: str, ends: list[int | None]) -> int | None:
    """When a run ended: the last end among its last segment's streams (a crashed
    stream has none until it is closed), None while any rank still runs."""
    known = [e for e in ends if e is not None]
    return max(known) if known and status != "running" else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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
