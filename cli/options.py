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


def format_option(func: F) -> F:
    """``--format table|json|csv``: human table by default, stable JSON/CSV for machines."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="Output format.",
    )(func)


def run_argument(func: F) -> F:
    """``RUN``: a run id, a unique id prefix, a run name, ``latest`` or ``latest~N``."""
    return click.argument("run", default="latest", metavar="RUN")(func)


def rank_option(func: F) -> F:
    """``--rank N``: one rank of a multi-rank (torchrun) run: the streams it recorded."""
    return click.option(
        "--rank",
        type=click.IntRange(min=0),
        default=None,
        metavar="N",
        help="Only rank N of a multi-rank run (every segment it recorded).",
    )(func)
