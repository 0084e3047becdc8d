"""``auditlog verify``: check hash chains, signed checkpoints and exported heads."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click
from auditlog.cli.complete import complete_runs_or_all
from auditlog.cli.options import format_option, store_option
from auditlog.cli.output import emit_rows

from auditlog.core.errors import IntegrityError

if TYPE_CHECKING:
    from auditlog.integrity.verify import SourcedStatement


@click.command()
@store_option
@format_option
@click.option(
    "--key",
    "key_paths",
    multiple=True,
    metavar="PUBLIC",
    help="Trust signatures by this public key (repeatable) "
    "[default: $AUDITLOG_KEY.pub or ~/.config/auditlog/signing_key.pub].",
)
@click.option(
    "--against",
    "against",
    multiple=True,
    metavar="FILE",
    help="Also prove the record still extends this head statement from `auditlog export-head` "
    "('-' reads stdin; repeatable). RUN defaults to the statement's run.",
)
@click.argument("run", required=False, default=None, metavar="[RUN|all]", shell_complete=complete_runs_or_all)
def verify(
    store: str | None, fmt: str, key_paths: tuple[str, ...], against: tuple[str, ...], run: str | None
) -> None:
    """Verify that RUN's record (default: latest; 'all' for every run) was not edited.

    Checks every event's hash link and sequence number, every stored signed
    checkpoint (its signature by a trusted key, and that its head is on the
    chain), and with --against an exported head statement, which also catches
    the newest events cut off or the whole chain rewritten.

    Exit 0 when intact; exit 4 naming the first problem otherwise.
    """
    from auditlog.integrity.keys import trusted_public_keys
    from auditlog.integrity.signing import KeyRing
    from auditlog.read.api import open_store

    # Given keys must load now; the default key is read only if a signature needs it.
    keys = KeyRing(trusted_public_keys(tuple(Path(p) for p in key_paths))) if key_paths else None
    statements = [_read_statement(source) for source in against]
    with open_store(store) as opened, _progress() as progress:
        reports = opened.verify(run, keys=keys, statements=statements, progress=progress)
    if fmt == "table":
        if not reports:
            click.echo(f"no runs in {opened.location.display()}: nothing to verify")
        for report in reports:
            state = "intact" if report.ok else "FAILED"
            counted = f"{report.events} events in {len(report.streams)} stream(s)"
            if report.checkpoints:
                counted += f", {report.checkpoints} signed checkpoint(s)"
            if report.statements:
                counted += f", {report.statements} exported head(s)"

            click.echo(f"run {report.run_id[:12]}: {counted}: {state}")
            for problem in report.problems[:20]:
                click.echo(f"  {problem.describe()}")
    else:
        emit_rows(
            (
                {
                    "run_id": r.run_id,
                    "ok": r.ok,
                    "events": r.events,
                    "checkpoints": r.checkpoints,
                    "exported_heads": r.statements,
                    "problems": [p.__dict__ for p in r.problems],
                }
                for r in reports
            ),
            ["run_id", "ok", "events", "checkpoints", "exported_heads", "problems"],
            fmt,
        )
    failed = [r for r in reports if not r.ok]
    if failed:
        firsts = [p for p in (r.first_problem() for r in failed) if p is not None]
        first = next((p for p in firsts if p.altered), firsts[0])
        verdict = "record altered" if first.altered else "record not verified"
        raise IntegrityError(f"{verdict}: {first.describe()}")


def _read_statement(source: str) -> SourcedStatement:
    """Read and parse one ``--against`` file; a bad file is one error line naming it."""
    from auditlog.integrity.signing import HeadStatement, StatementError

    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            path = Path(source)
            if path.is_dir():
                raise StatementError(f"{source!r} is a directory, not a head statement")
            if path.stat().st_size > 16 * 1024 * 1024:
                raise StatementError(f"{source!r} is too large to be a head statement")
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StatementError(f"no head statement at {source!r}") from None
    except UnicodeDecodeError:
        raise StatementError(f"{source!r} is not an auditlog head statement (not UTF-8 text)") from None
    except OSError as exc:
        raise StatementError(f"cannot read head statement {source!r}: {exc.strerror or exc}") from exc
    return source, HeadStatement.parse(text, source)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str], Callable[[int], None]] | None]:
    """A per-run progress bar on a terminal; nothing in pipes."""
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    if not sys.stderr.isatty():
        yield None
        return
    # A run id is data (a tampered store can hold anything there): never markup.
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:

        def for_run(run_id: str) -> Callable[[int], None]:
            task = bar.add_task(f"verifying {run_id[:12]}", total=None)
            return lambda n: bar.advance(task, n)

        yield for_run
