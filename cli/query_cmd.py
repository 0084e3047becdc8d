"""``auditlog query`` and ``auditlog schema``: DuckDB SQL over the record's documented views."""

from __future__ import annotations

import datetime
import json
import math
import sys
from collections.abc import Iterator
from typing import Any

import click
from auditlog.cli.complete import complete_runs, complete_views
from auditlog.cli.options import format_option, rank_option, store_option
from auditlog.cli.output import emit_rows
from auditlog.cli.progress import progress_bar

from auditlog.core.errors import UsageError
from auditlog.core.hashing import shown_hash
from auditlog.core.payloadlimits import loads_bounded

TABLE_ROWS = 1000


@click.command()
@store_option
@format_option
@click.option(
    "--run",
    default=None,
    metavar="RUN",
    shell_complete=complete_runs,
    help="Restrict every view to one run (id, prefix, name, latest, latest~N).",
)
@rank_option
@click.option(
    "--rebuild", is_flag=True, help="Rebuild the read model from the store before answering."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Cancel the query after this many seconds (exit 1). Ctrl-C cancels it too (exit 130).",
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=0),
    default=TABLE_ROWS,
    show_default=True,
    help="Table format: show at most N rows (0: all). JSON and CSV stream every row.",
)
@click.argument("sql", metavar="SQL")
def query(
    store: str | None,
    fmt: str,
    run: str | None,
    rank: int | None,
    rebuild: bool,
    timeout: float | None,
    max_rows: int,
    sql: str,
) -> None:
    """Answer SQL over the record with DuckDB (read-only; '-' reads SQL from stdin).

    The views and their columns: `auditlog schema`. New events are copied into
    the read model (a DuckDB file beside the store) before the query runs; it
    is rebuilt when it no longer matches the store's chain heads or its seal.
    The read model is a cache, not evidence: `auditlog verify` is. Rows are
    printed as DuckDB produces them.

    \b
    auditlog query "select kind, count(*) from events group by 1"
    auditlog query --run latest "select module, max(grad_norm) from backward_stats group by 1"
    """
    from auditlog.read.api import open_store

    if sql == "-":
        sql = sys.stdin.read()
    with open_store(store) as opened:
        with progress_bar("updating read model") as progress:
            session = opened.query_session(run, progress, rank, rebuild=rebuild)
        with session:
            if session.left_out and "tensor_values" in sql.lower():
                for sha, why in sorted(session.left_out.items()):
                    click.echo(
                        f"warning: snapshot {shown_hash(sha)} left out of tensor_values: {why} "
                        "(run `auditlog verify`)",
                        err=True,
                    )
            result = session.execute(sql, timeout=timeout)
            columns = _unique(result.columns)
            json_columns = {c for c, t in zip(columns, result.types, strict=True) if t == "JSON"}

            def rows() -> Iterator[dict[str, Any]]:
                for row in result.rows:
                    record = dict(zip(columns, row, strict=True))
                    yield record if fmt == "table" else _machine(record, json_columns, fmt)

            emit_rows(
                rows(),
                columns,
                fmt,
                cap=max_rows or None,
                more_hint=" (--max-rows N, 0 for all; --format csv or json streams every row)",
            )


@click.command()
@format_option
@click.argument("view", required=False, metavar="[VIEW]", shell_complete=complete_views)
def schema(fmt: str, view: str | None) -> None:
    """The views `auditlog query` answers from: their columns, types and meaning."""
    from auditlog.read.api import views

    by_name = {v.name: v for v in views()}
    if view is not None and view not in by_name:
        raise UsageError(f"unknown view {view!r}; views: {', '.join(by_name)}")
    chosen = [by_name[view]] if view is not None else list(by_name.values())
    if fmt == "json":
        document = [
            {
                "view": v.name,
                "doc": v.doc,
                "columns": [{"name": c.name, "type": c.type, "doc": c.doc} for c in v.columns],
            }
            for v in chosen
        ]
        sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
        return
    if fmt == "csv":
        rows = (
            {"view": v.name, "column": c.name, "type": c.type, "meaning": c.doc}
            for v in chosen
            for c in v.columns
        )
        emit_rows(rows, ("view", "column", "type", "meaning"), "csv")
        return
    for v in chosen:
        emit_rows(
            ({"column": c.name, "type": c.type, "meaning": c.doc} for c in v.columns),
            ("column", "type", "meaning"),
            "table",
            title=f"{v.name}: {v.doc}",
        )


def _unique(columns: list[str]) -> list[str]:
    """Column names made unique (``select a, a`` gives ``a`` and ``a_2``)."""
    seen: dict[str, int] = {}
    out = []
    for name in columns:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def _machine(record: dict[str, Any], json_columns: set[str], fmt: str) -> dict[str, Any]:
    """Values for JSON/CSV: JSON columns decoded (JSON output), non-finite floats as the
    store writes them ('NaN', 'Infinity', '-Infinity'), times in ISO 8601, bytes in hex."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in json_columns and isinstance(value, str) and fmt == "json":
            try:
                value = loads_bounded(value)
            except ValueError:
                pass
        out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
