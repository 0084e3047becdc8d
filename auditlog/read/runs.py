"""Runs as the read side sees them: summary rows with derived status, and selection.

Everything shown and every selector (``latest``, names, id prefixes) comes from
the chained ``run_started`` / ``run_ended`` events, never from the ``runs``
table: that table is an index that ``verify`` checks against the chain, and
the home of liveness (``last_seen_ns``, ``proc_start``), which is not evidence.
Status comes from ``auditlog.core.liveness``: the chained ``run_ended`` when
there is one, else the process table; never "running" forever.
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
    seed: int | None = None

    def ranks_named(self) -> list[int]:
        """The ranks of the last segment whose status is the run's (a multi-rank run)."""
        if self.world_size <= 1 and self.streams <= 1:
            return []
        last = max((r["segment"] for r in self.ranks), default=0)
        return sorted(
            r["rank"] for r in self.ranks if r["segment"] == last and r["status"] == self.status
        )

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
            "status_detail": self.status_detail,
            "exit_code": self.exit_code,
            "argv": self.argv,
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "seed": self.seed,
            "events": self.events,
            "steps": self.steps,
            "host": self.host,
            "pid": self.pid,
            "world_size": self.world_size,
            "streams": self.streams,
            "ranks": self.ranks,
            "exception": self.exception,
        }


@dataclass(frozen=True)
class ChainedRun:
    """A run as its chained ``run_started`` (lowest stream) says it began."""

    run_id: str
    stream: int
    started_ns: int
    meta: dict[str, Any]

    @property
    def name(self) -> str | None:
        name = self.meta.get("name")
        return name if isinstance(name, str) else None


def chained_runs(store: EventStore) -> list[ChainedRun]:
    """Every run with events, oldest first by its chained start time.

    A run whose ``run_started`` is gone (deleted: ``verify`` says so) is still a
    run of the record, dated by its earliest event and nameless.
    """
    found: dict[str, ChainedRun] = {}
    for event in store.events_of_kind("run_started"):
        run_id, stream, ts = event.get("run_id"), event.get("stream"), event.get("ts_ns")
        if not isinstance(run_id, str) or not isinstance(stream, int) or not isinstance(ts, int):
            continue  # garbled: verify names it
        known = found.get(run_id)
        if known is None or stream < known.stream:
            found[run_id] = ChainedRun(
                run_id, stream, ts, payload_object(event.get("payload"), event, strict=False)
            )
    for run_id, first in store.run_first_times().items():
        if run_id not in found:
            found[run_id] = ChainedRun(run_id, 0, first, {})
    # A script's own record(name=...) joining `auditlog run` names the run in the
    # chain with an ``auditlog.record`` annotation (when run_started had no name).
    for event in store.events_of_kind("annotation"):
        known = found.get(event.get("run_id"))  # type: ignore[arg-type]
        payload = payload_object(event.get("payload"), event, strict=False)
        value = payload.get("fields")
        fields: dict[str, Any] = value if isinstance(value, dict) else {}
        if known is not None and known.name is None and payload.get("key") == "auditlog.record":
            name = fields.get("name")
            if isinstance(name, str):
                found[known.run_id] = ChainedRun(
                    known.run_id, known.stream, known.started_ns, {**known.meta, "name": name}
                )
    return sorted(found.values(), key=lambda r: (r.started_ns, r.run_id))


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def start_seed(meta: dict[str, Any]) -> int | None:
    """``torch.initial_seed()`` at the start, exact: an unsigned 64-bit value (a
    process's random seed is >= 2^63 half the time), None if absent or garbled."""
    seeds = meta.get("seeds")
    value = seeds.get("torch_initial_seed") if isinstance(seeds, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64:
        return value
    return None


def list_runs(store: EventStore) -> list[RunInfo]:
    """All runs, oldest first by their chained start, with status from every stream.

    Who ran what (name, argv, host, pid, git) comes from the chained
    ``run_started`` of the lowest stream; liveness (heartbeat, process start
    time) from the runs index, which is not evidence.
    """
    counts = store.run_event_counts()
    activity = store.last_activity_ns()
    # Summaries tolerate damaged rows (verify names them); nothing here may crash.
    started: dict[str, dict[int, dict[str, Any]]] = {}
    for event in store.events_of_kind("run_started"):
        if isinstance(event["run_id"], str) and isinstance(event["stream"], int):
            started.setdefault(event["run_id"], {})[event["stream"]] = payload_object(
                event["payload"], event
            )
    ended: dict[str, dict[int, dict[str, Any]]] = {}
    ended_at: dict[str, dict[int, int]] = {}
    for event in store.events_of_kind("run_ended"):
        if (
            isinstance(event["run_id"], str)
            and isinstance(event["stream"], int)
            and isinstance(event["ts_ns"], int)
        ):
            ended.setdefault(event["run_id"], {})[event["stream"]] = payload_object(
                event["payload"], event
            )
            ended_at.setdefault(event["run_id"], {})[event["stream"]] = event["ts_ns"]
    index = {str(r["run_id"]): r for r in store.run_rows()}
    out: list[RunInfo] = []
    for run in chained_runs(store):
        run_id, meta = run.run_id, run.meta
        begun, finished = started.get(run_id, {}), ended.get(run_id, {})
        indexed = index.get(run_id) or {}
        host, pid = str(meta.get("host") or ""), _int(meta.get("pid"))
        row: dict[str, Any] = {
            "host": host,
            "pid": pid,
            "proc_start": indexed.get("proc_start"),
            "last_seen_ns": _int(indexed.get("last_seen_ns"), run.started_ns),
        }
        live = run_liveness(row, begun, finished)
        last = live.streams[-1].segment if live.streams else 0
        ends = [ended_at.get(run_id, {}).get(s.stream) for s in live.streams if s.segment == last]
        cause = next(
            (s for s in live.streams if s.rank in live.ranks and s.status == live.status), None
        )
        deciding = finished.get(cause.stream) if cause is not None else finished.get(run.stream)
        git_value = meta.get("git")
        git: dict[str, Any] = git_value if isinstance(git_value, dict) else {}
        n_events, max_step = counts.get(run_id, (0, None))
        steps = (
            max([_int((e or {}).get("steps")) for e in finished.values()] + [0]) or max_step or 0
        )
        argv = meta.get("argv")
        out.append(
            RunInfo(
                run_id=run_id,
                name=run.name,
                started_ns=run.started_ns,
                ended_ns=_last_end(live.status, ends),
                status=live.status,
                exit_code=None if deciding is None else deciding.get("exit_code"),
                argv=[str(a) for a in argv] if isinstance(argv, list) else [],
                git_commit=git.get("commit"),
                git_dirty=git.get("dirty"),
                events=n_events,
                steps=int(steps),
                host=host,
                pid=pid,
                last_seen_ns=max(int(row["last_seen_ns"]), activity.get(run_id, 0)),
                exception=None if deciding is None else deciding.get("exception"),
                world_size=live.world_size,
                streams=len(live.streams) or 1,
                status_detail=live.detail,
                seed=start_seed(meta),
                ranks=[
                    {
                        "stream": s.stream,
                        "rank": s.rank,
                        "segment": s.segment,
                        "status": s.status,
                        "host": s.host,
                    }
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


def select_run(store: EventStore, selector: str) -> str:
    """Resolve ``latest``, a full id, a unique id prefix or a run name to a run id (from the chain)."""
    rows = chained_runs(store)
    if not rows:
        raise RunNotFoundError(f"store {store.location.display()!r} has no runs yet")
    if selector == "latest":
        return rows[-1].run_id
    if selector.startswith("latest~"):
        back = selector[len("latest~") :]
        if not back.isdigit() or int(back) >= len(rows):
            raise RunNotFoundError(f"no run {selector!r} (the store has {len(rows)} runs)")
        return rows[-1 - int(back)].run_id
    ids = [r.run_id for r in rows]
    if selector in ids:
        return selector
    matches = [i for i in ids if i.startswith(selector.lower())] if selector else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        shown = ", ".join(m[:12] for m in matches[:5])
        raise RunNotFoundError(
            f"run prefix {selector!r} is ambiguous: matches {len(matches)} runs ({shown})"
        )
    named = [r.run_id for r in rows if r.name == selector]
    if len(named) == 1:
        return named[0]
    if named:  # never guess which one was meant: an audit answer must name its run
        shown = ", ".join(n[:12] for n in named[-5:])
        raise RunNotFoundError(
            f"run name {selector!r} is ambiguous: {len(named)} runs have it ({shown}, newest last); "
            "select one by id"
        )
    raise RunNotFoundError(
        f"no run matches {selector!r} (use an id, a unique id prefix, a name or 'latest')"
    )
