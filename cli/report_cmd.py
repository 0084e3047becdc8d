"""``auditlog report``: one self-contained HTML page about a run, or comparing two."""

from __future__ import annotations

from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.output import write_document

from auditlog.core.errors import UsageError


@click.command()
@store_option
@click.option(
    "-o", "--output", required=True, metavar="FILE.html", help="Write the page here ('-': stdout)."
)
@click.option(
    "--compare",
    "other",
    default=None,
    metavar="RUN_B",
    help="Compare RUN with RUN_B (auditlog diff as a page).",
)
@run_argument
def report(store: str | None, output: str, other: str | None, run: str) -> None:
    """Write one HTML page about RUN: what it was and how it went.

    Run metadata and code version, the integrity verdict (verify, signatures
    included), outcome (also of failed and crashed runs), the module tree with
    the line that built each module and parameter counts, training FLOPs per
    step, annotations, loss / learning-rate curves and the gradient-norm
    heatmap (pictures need auditlog[plot]), metrics and non-finite findings.
    The file is self-contained: inline styles and images, no scripts, no
    network access when opened.
    """
    from auditlog.present.report import run_report
    from auditlog.present.report_compare import compare_report
    from auditlog.read.api import open_store

    if output != "-" and Path(output).is_dir():
        raise UsageError(f"{output!r} is a directory; give a file name such as report.html")
    with open_store(store) as opened:
        text = compare_report(opened, run, other) if other else run_report(opened.run(run))
    write_document(output, text)
