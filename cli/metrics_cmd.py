"""``auditlog metrics`` and ``auditlog nonfinite``: the training curve and the first NaN, as text."""

from __future__ import annotations

import math
from typing import Any

import click
from auditlog.cli.options import format_option, run_argument, store_option
from auditlog.cli.output import echo_line, emit_json, emit_rows

from auditlog.core.replay import built_at


def _shown(value: Any) -> Any:
    """Numbers for a table: 6 significant digits; NaN/inf as their names."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return f"{value:.6g}"
    return value


@click.command()
@store_option
@format_option
@run_argument
def metrics(store: str | None, fmt: str, run: str) -> None:
    """RUN's loss and metrics per step, with learning rate and gradient norm.

    One row per step (optimizer steps completed before it: the first
    iteration is step 0): the loss recorded with no code change, values
    logged with auditlog.log(...) (the mean when a step has several), and the
    learning rate (first param group), global gradient L2 norm (grad_norm: as
    the update used it, after any clipping or unscaling; raw_grad_norm: as the
    last backward left it) and non-finite gradient count of the optimizer step
    that ended it. Says so on stderr when no loss was recorded.
    """
    from auditlog.read.api import open_store
    from auditlog.read.forensics import NO_LOSS_HINT, jsonable

    with open_store(store) as opened:
        columns, rows = opened.run(run).metrics()
    if "loss" not in columns:
        click.echo(f"note: no loss was recorded for this run ({NO_LOSS_HINT})", err=True)
    if fmt == "table":
        emit_rows(({k: _shown(v) for k, v in r.items()} for r in rows), columns, fmt)
    else:
        emit_rows((jsonable(r) for r in rows), columns, fmt)


@click.command()
@store_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@run_argument
def nonfinite(store: str | None, fmt: str, run: str) -> None:
    """Where RUN's first NaN/Inf came from: step, forward or backward, the module.

    Decides from what was recorded (module output and input NaN/Inf counts in
    call order, gradients, the loss, parameter norms): the producing module
    with the line that built it, and the modules that only propagated it. When
    the record cannot tell, says what to record next time. Exit 0 either way.
    """
    from auditlog.read.api import open_store

    with open_store(store) as opened:
        finding = opened.run(run).nonfinite()
    if fmt == "json":
        emit_json(finding.as_dict())
        return
    for line in finding.explanation:
        echo_line(line)
    if finding.producer is not None:
        p = finding.producer
        echo_line(f"producer: {p['module']} ({p.get('class') or '?'}) {built_at(p.get('source'))}")
    for label, calls in (("propagated by", finding.propagators), ("enclosing", finding.enclosing)):
        for c in calls:
            echo_line(
                f"{label}: {c['module']} ({c.get('class') or '?'}) {built_at(c.get('source'))}"
            )
    for param in finding.parameters:
        echo_line(f"non-finite gradient: {param['parameter']}")
