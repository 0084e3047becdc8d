"""``auditlog snapshots``: which tensors were snapshotted when, sizes and deduplication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click
from auditlog.cli.options import format_option, run_argument, store_option
from auditlog.cli.output import emit_rows

COLUMNS = (
    "seq",
    "step",
    "trigger",
    "tag",
    "module",
    "tensors",
    "logical_bytes",
    "new_bytes",
    "write_s",
    "behind",
)


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


@click.command()
@store_option
@format_option
@run_argument
def snapshots(store: str | None, fmt: str, run: str) -> None:
    """List RUN's snapshots: when, what triggered them, bytes stored and deduplication.

    write_s is the writer's time to store a snapshot; behind counts the snapshots
    not yet stored when it was due (the writer could not keep up; none is skipped).
    """
    from auditlog.read.api import open_store

    with open_store(store) as opened:
        view = opened.run(run)
        rows, stored_total = view.snapshots()
    logical_total = sum(r["logical_bytes"] for r in rows)
    if fmt != "table":
        emit_rows(iter(rows), COLUMNS, fmt)
        return

    def shown() -> Iterator[dict[str, Any]]:
        for row in rows:
            write_s = row["write_s"]
            yield {
                **row,
                "logical_bytes": _human(row["logical_bytes"]),
                "new_bytes": _human(row["new_bytes"]),
                "write_s": "" if write_s is None else f"{write_s:.2f}",
            }

    emit_rows(shown(), COLUMNS, fmt, title=f"snapshots of run {view.run_id[:12]}")
    ratio = logical_total / stored_total if stored_total else 0.0
    click.echo(
        f"{len(rows)} snapshots, {_human(logical_total)} of tensor values, "
        f"{_human(stored_total)} distinct content stored (dedup {ratio:.1f}x)"
    )
    overran = sum(1 for r in rows if r["behind"])
    if overran:
        click.echo(
            f"{overran} snapshots were due before earlier ones were stored (the writer fell behind; "
            "none was skipped): see docs/snapshots.md"
        )
