"""``auditlog bom``: the run as a CycloneDX ML-BOM or an SPDX 3 AI document (or the facts as JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.output import write_document

from auditlog.core.errors import UsageError


@click.command()
@store_option
@click.option(
    "--step",
    type=int,
    default=None,
    metavar="N",
    help="The weights at optimizer step N (default: the end of the run).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["cyclonedx", "spdx", "json"]),
    default="cyclonedx",
    show_default=True,
    help=(
        "cyclonedx: CycloneDX 1.6 ML-BOM; spdx: SPDX 3.0.1 JSON-LD (AI and Dataset "
        "profiles); json: the documentation facts with their evidence."
    ),
)
@click.option(
    "-o",
    "--output",
    default="-",
    show_default=True,
    metavar="FILE",
    help="Write the document here ('-': stdout).",
)
@run_argument
def bom(store: str | None, step: int | None, fmt: str, output: str, run: str) -> None:
    """Write RUN's bill of materials: the model, its weights' hashes, datasets, code and compute.

    Every fact comes from the record (architecture, parameter count, training
    FLOPs, time, hardware, energy where counters were read, datasets, code
    version, frameworks, hyperparameters, metrics, the weights' content hashes
    at --step, the verify verdict) and names the events it came from; what the
    record cannot hold (intended purpose, evaluation, licence, limitations) is
    taken from annotations of those names, or marked as missing. cyclonedx and
    spdx need the optional extra auditlog[compliance]; the CycloneDX document
    is validated against the 1.6 schema before it is written.
    """
    from auditlog.read.api import open_store
    from auditlog.read.bom import bom_document
    from auditlog.read.docfacts import documentation_facts

    if output != "-" and Path(output).is_dir():
        raise UsageError(f"{output!r} is a directory; give a file name such as bom.json")
    with open_store(store) as opened:
        facts = documentation_facts(opened.run(run), step=step)
        document = facts.as_json() if fmt == "json" else bom_document(facts, fmt)
    write_document(output, json.dumps(document, indent=2, sort_keys=False, default=str) + "\n", fmt)
