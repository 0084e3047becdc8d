"""``auditlog diff``: what differs between two runs, as a colored summary or JSON."""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING

import click
from auditlog.cli.complete import complete_runs
from auditlog.cli.options import format_option, store_option
from auditlog.cli.progress import progress_bar

from auditlog.core.errors import UsageError

if TYPE_CHECKING:
    from auditlog.read.diff_values import ValuesDiff


@click.command()
@store_option
@format_option(formats=("table", "json"))
@click.option(
    "--exit-code",
    "exit_code",
    is_flag=True,
    help="Exit 1 when the runs differ and 0 when they do not, as `git diff --exit-code`.",
)
@click.option(
    "--values",
    "values",
    is_flag=True,
    help="Also find the first step and tensor whose snapshotted values differ.",
)
@click.option(
    "--atol", type=float, default=None, help="With --values: absolute tolerance (torch.allclose)."
)
@click.option(
    "--rtol", type=float, default=None, help="With --values: relative tolerance (torch.allclose)."
)
@click.argument("run_a", default="latest~1", metavar="[RUN_A]", shell_complete=complete_runs)
@click.argument("run_b", default="latest", metavar="[RUN_B]", shell_complete=complete_runs)
def diff(
    store: str | None,
    fmt: str,
    exit_code: bool,
    values: bool,
    atol: float | None,
    rtol: float | None,
    run_a: str,
    run_b: str,
) -> None:
    """How RUN_B differs from RUN_A (default: the last two runs).

    Construction (modules, parameters, buffers: added, removed, renamed, changed
    class, shape, dtype, requires_grad, initial values, source line),
    hyperparameters, code version (git commit, dirty) and run metadata.
    A source line that only moved (same file) is listed as moved, apart from
    real changes. With --exit-code: exit 1 when anything differs (moves and
    redrawn initial values included), else 0.
    With --values, also the first divergence of the stored tensor values over
    the steps both runs snapshotted (bitwise, or beyond --atol/--rtol).
    """
    from auditlog.read.api import open_store

    if (atol is not None or rtol is not None) and not values:
        raise UsageError("--atol/--rtol compare values; add --values")
    for option, given in (("--atol", atol), ("--rtol", rtol)):
        if given is not None and not (given >= 0.0 and math.isfinite(given)):
            raise UsageError(f"{option} must be a finite number >= 0, got {given}")
    found: ValuesDiff | None = None
    with open_store(store) as opened:
        with progress_bar("reading runs") as progress:
            result = opened.diff(run_a, run_b, progress)
        if values:
            with progress_bar("comparing values", unit="tensors") as progress:
                found = opened.diff_values(run_a, run_b, atol, rtol, progress)
    if fmt == "json":
        document = result.as_dict()
        if found is not None:
            document["values"] = found.as_dict()
            document["identical"] = result.identical and found.identical
        sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2, default=str) + "\n")
    else:
        from auditlog.cli.output import console

        from auditlog.present.diff_text import render

        render(result, found, console())
    if exit_code and not (result.identical and (found is None or found.identical)):
        click.get_current_context().exit(1)
