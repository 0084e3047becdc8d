"""Options shared by many commands, as decorator factories (the sqlite-utils way)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("table", "json", "csv")


def store_option(func: F) -> F:
    """``--store``: a store directory or database URL (env ``AUDITLOG_STORE``)."""
    return click.option(
        "--store",
        envvar="AUDITLOG_STORE",
        default=None,
        metavar="DIR|URL",
        help="Store directory or SQLAlchemy URL [env AUDITLOG_STORE; default ./.auditlog].",
    )(func)


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

    return click.argument("run", default="latest", metavar="[RUN]", shell_complete=complete_runs)(func)
