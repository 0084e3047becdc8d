"""``auditlog runs``: the table of runs."""

from __future__ import annotations

import os

import click
from auditlog.cli.options import format_option, store_option
from auditlog.cli.output import emit_rows, fmt_duration

from auditlog.core.values import iso

COLUMNS = (
    "run",
    "name",
    "started",
    "duration",
    "status",
    "ranks",
    "script",
    "commit",
    "steps",
    "events",
)


@click.command()
@store_option
@format_option
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Show only the newest N runs."
)
def runs(store: str | None, fmt: str, limit: int | None) -> None:
    """List recorded runs: id, start, duration, status, script, git commit, steps, events.

    JSON and CSV carry every field of a run, also its exit code, host, pid, ranks
    and seed (torch.initial_seed() at the start, an exact unsigned 64-bit integer).
    """
    from auditlog.read.api import open_store

    with open_store(store) as opened:
        infos = opened.runs()
    if limit is not None:
        infos = infos[-limit:]
    if fmt != "table":
        emit_rows(
            (i.as_dict() for i in infos), list(infos[0].as_dict()) if infos else ["run_id"], fmt
        )
        return
    rows = []
    for info in infos:
        commit = (info.git_commit or "")[:10]
        if commit and info.git_dirty:
            commit += "+dirty"
        script = os.path.basename(info.argv[0]) if info.argv else ""
        rows.append(
            {
                "run": info.run_id[:12],
                "name": info.name,
                "started": iso(info.started_ns)[:19].replace("T", " "),
                "duration": fmt_duration(info.duration_s),
                "status": _status(info.status, info.ranks_named()),
                "ranks": info.world_size,
                "script": " ".join([script, *info.argv[1:]])[:60],
                "commit": commit,
                "steps": info.steps,
                "events": info.events,
            }
        )
    emit_rows(rows, COLUMNS, fmt, title=f"runs in {opened.location.display()}")


def _status(status: str, ranks: list[int]) -> str:
    """``crashed (rank 1)``: a multi-rank run names the ranks its status is about."""
    if not ranks or status in ("completed", "running"):
        return status
    return f"{status} (rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)})"
