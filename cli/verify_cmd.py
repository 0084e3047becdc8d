"""``auditlog verify``: check the hash chains of one run or of every run."""

from __future__ import annotations

import sys

import click
from auditlog.cli.options import format_option, store_option
from auditlog.cli.output import emit_rows
from rich.progress import Progress

from auditlog.errors import IntegrityError
from auditlog.integrity import VerifyReport, verify_run
from auditlog.runs import select_run
from auditlog.store.eventstore import EventStore


@click.command()
@store_option
@format_option
@click.argument("run", default="latest", metavar="RUN|all")
def verify(store: str | None, fmt: str, run: str) -> None:
    """Verify that RUN's record (default: latest; 'all' for every run) was not edited.

    Exit 0 when intact; exit 4 naming the first bad event otherwise.
    """
    event_store = EventStore.open(store)
    try:
        if run == "all":
            run_ids = [r["run_id"] for r in event_store.run_rows()]
        else:
            run_ids = [select_run(event_store, run)]
        reports = [_verify(event_store, run_id) for run_id in run_ids]
    finally:
        event_store.close()
    problems = [p for r in reports for p in r.problems]
    if fmt == "table":
        for report in reports:
            state = "intact" if report.ok else "FAILED"
            click.echo(f"run {report.run_id[:12]}: {report.events} events in {len(report.streams)} stream(s): {state}")
            for problem in report.problems[:20]:
                click.echo(f"  {problem.describe()}")
    else:
        emit_rows(
            (
                {
                    "run_id": r.run_id,
                    "ok": r.ok,
                    "events": r.events,
                    "problems": [p.__dict__ for p in r.problems],
                }
                for r in reports
            ),
            ["run_id", "ok", "events", "problems"],
            fmt,
        )
    if problems:
        raise IntegrityError(f"record altered: {problems[0].describe()}")


def _verify(store: EventStore, run_id: str) -> VerifyReport:
    if not sys.stderr.isatty():
        return verify_run(store, run_id)
    with Progress(transient=True) as progress:
        task = progress.add_task(f"verifying {run_id[:12]}", total=None)
        return verify_run(store, run_id, progress=lambda n: progress.advance(task, n))
