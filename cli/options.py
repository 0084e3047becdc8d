"""Options shared by many commands, as decorator factories (the sqlite-utils way)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("table", "json", "csv")


def store_option(func: F) -> F:
    """``--store``: a store directory, database URL or store config file (env ``AUDITLOG_STORE``),
    and ``--snapshots``: where a database store keeps tensor snapshots (env ``AUDITLOG_SNAPSHOTS``).

    With ``--snapshots`` the command receives a resolved ``StoreLocation``, else the text.
    """
    func = click.option(
        "--store",
        envvar="AUDITLOG_STORE",
        default=None,
        metavar="DIR|URL|FILE.toml",
        callback=_with_snapshots,
        help="Store directory, SQLAlchemy URL (postgresql+psycopg://user@host/db) or store config "
        "file [env AUDITLOG_STORE; default ./.auditlog].",
    )(func)
    return click.option(
        "--snapshots",
        default=None,
        metavar="PATH",
        expose_value=False,
        is_eager=True,
        callback=_remember_snapshots,
        help="Snapshot directory of a database store (recorded in the store when it is created) "
        "[env AUDITLOG_SNAPSHOTS].",
    )(func)


def _remember_snapshots(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta["auditlog.snapshots"] = value


def _with_snapshots(ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    snapshots = ctx.meta.get("auditlog.snapshots")
    if snapshots is None:
        return value
    from auditlog.read.api import resolve_store

    return resolve_store(value, snapshots)


def format_option(func: F | None = None, *, formats: tuple[str, ...] = FORMATS) -> Any:
    """``--format table|json|csv``: human table by default, stable JSON/CSV for machines.

    A command whose output is not rows (a tree, a diff) offers only the formats
    it has: ``@format_option(formats=("table", "json"))``.
    """

    def decorate(command: F) -> F:
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(formats),
            default="table",
            show_default=True,
            help="Output format.",
        )(command)

    return decorate(func) if func is not None else decorate


def run_argument(func: F) -> F:
    """``RUN``: a run id, a unique id prefix, a run name, ``latest`` or ``latest~N``."""
    from auditlog.cli.complete import complete_runs

    return click.argument("run", default="latest", metavar="[RUN]", shell_complete=complete_runs)(
        func
    )


def rank_option(func: F) -> F:
    """``--rank N``: one rank of a multi-rank (torchrun) run: the streams it recorded."""
    return click.option(
        "--rank",
        type=click.IntRange(min=0),
        default=None,
        metavar="N",
        help="Only rank N of a multi-rank run (every segment it recorded).",
    )(func)
