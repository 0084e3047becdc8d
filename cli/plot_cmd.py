"""``auditlog plot``: a picture of a run (PNG), or the numbers behind it (CSV)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import click
from auditlog.cli.options import store_option

from auditlog.core.errors import AuditlogError, UsageError
from auditlog.read.series import MAX_ROWS, PLOTS


@click.command(epilog="Pictures: " + "; ".join(f"{k}: {v}" for k, v in PLOTS.items()) + ".")
@store_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["png", "csv"]),
    default="png",
    show_default=True,
    help="png: the picture (needs auditlog[plot]); csv: its data (panel, series, step, value).",
)
@click.option(
    "-o", "--output", default=None, metavar="FILE", help="Write here [png: required; csv: stdout]."
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=2),
    default=MAX_ROWS,
    show_default=True,
    help="Heatmap rows before modules are grouped by name prefix.",
)
@click.argument("run", metavar="RUN")
@click.argument("what", type=click.Choice(list(PLOTS)), metavar="WHAT")
def plot(
    store: str | None, fmt: str, output: str | None, max_rows: int, run: str, what: str
) -> None:
    """Draw WHAT for RUN: loss, metrics, lr, grad-norm, param-norm, update-ratio,
    activations, dead-units.

    Heatmaps show modules x steps; past --max-rows modules they are grouped by
    name prefix (norms combine as the L2 norm of the group's parameters).
    NaN/Inf cells are red, steps without data grey.
    """
    from auditlog.present.plots import render_png
    from auditlog.read.api import open_store

    if fmt == "png" and output is None:
        raise UsageError("plot writes a PNG file: give -o FILE.png (or --format csv for the data)")
    with open_store(store) as opened:
        selected = opened.run(run)
        panels = selected.plot_panels(what, max_rows)
        run_id = selected.run_id
    if what == "loss" and all(panel.empty for panel in panels):
        from auditlog.read.forensics import NO_LOSS_HINT

        raise AuditlogError(f"run {run_id[:12]} recorded no loss ({NO_LOSS_HINT}); nothing written")
    if fmt == "csv":
        handle = open(output, "w", newline="", encoding="utf-8") if output else sys.stdout  # noqa: SIM115
        try:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["panel", "series", "step", "value"])
            for panel in panels:
                for row in panel.long_rows():
                    writer.writerow([row["panel"], row["series"], row["step"], repr(row["value"])])
        finally:
            if handle is not sys.stdout:
                handle.close()
        return
    assert output is not None
    png = render_png(panels, f"{what} - run {run_id[:12]}")
    Path(output).write_bytes(png)
    click.echo(f"wrote {output}", err=True)
