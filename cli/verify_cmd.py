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
from auditlog.cli.output import echo_line, emit_rows

from auditlog.core.errors import AuditlogError, IntegrityError, UsageError

if TYPE_CHECKING:
    from auditlog.integrity.keys import KeyRing
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
@click.option(
    "--archive",
    "archive",
    default=None,
    type=click.Path(path_type=Path, file_okay=False),
    metavar="DIR",
    help="Verify an archive written by `auditlog export` instead of a store (no store needed).",
)
@click.argument(
    "run", required=False, default=None, metavar="[RUN|all]", shell_complete=complete_runs_or_all
)
def verify(
    store: str | None,
    fmt: str,
    key_paths: tuple[str, ...],
    against: tuple[str, ...],
    archive: Path | None,
    run: str | None,
) -> None:
    """Verify that RUN's record (default: latest; 'all' for every run) was not edited.

    Checks every event's hash link, sequence number and Merkle tree, that each
    stream ends at its run_ended and belongs to the run (world_size), the runs
    index against the chain, snapshot files, every stored signed checkpoint
    (its signature by a trusted key, and that its chain and tree head are on
    the record), and with --against an exported head statement (with a
    consistency proof that the record extends it). With --key every event must
    be covered by a signature by that key; without, what a bare chain cannot
    show is printed as notes.

    The verdict says what was proven: "intact, unsigned" (the chain detects
    accidental damage and naive edits, not a rewrite by someone with write
    access), "intact, signed" (every event under a trusted signature), or
    "intact, signed and checked against an exported head". Exit 0 when intact;
    exit 4 naming the first problem otherwise.
    """
    from auditlog.integrity.keys import KeyRing, trusted_public_keys
    from auditlog.read.api import open_store

    # Given keys must load now; the default key is read only if a signature needs it.
    keys = KeyRing(trusted_public_keys(tuple(Path(p) for p in key_paths))) if key_paths else None
    if archive is not None:
        if against or run is not None:
            raise UsageError("--archive verifies the archive alone: no RUN and no --against")
        _verify_archive(archive, keys, fmt)
        return
    statements = [_read_statement(source) for source in against]
    with open_store(store) as opened, _progress() as progress:
        reports = opened.verify(run, keys=keys, statements=statements, progress=progress)
    if fmt == "table":
        if not reports:
            click.echo(f"no runs in {opened.location.display()}: nothing to verify")
        for report in reports:
            state = report.verdict
            counted = f"{report.events} events in {len(report.streams)} stream(s)"
            if report.checkpoints:
                counted += f", {report.checkpoints} signed checkpoint(s)"
            if report.statements:
                counted += f", {report.statements} exported head(s)"

            echo_line(f"run {report.run_id[:12]}: {counted}: {state}")
            for problem in report.problems[:20]:
                echo_line(f"  {problem.describe()}")
            for line in report.consistency:
                echo_line(f"  proven: {line}")
            for note in report.notes:
                echo_line(f"  note: {note}")
    else:
        emit_rows(
            (
                {
                    "run_id": r.run_id,
                    "ok": r.ok,
                    "verdict": r.assurance,
                    "events": r.events,
                    "checkpoints": r.checkpoints,
                    "exported_heads": r.statements,
                    "problems": [p.__dict__ for p in r.problems],
                    "consistency": r.consistency,
                    "notes": r.notes,
                }
                for r in reports
            ),
            [
                "run_id",
                "ok",
                "verdict",
                "events",
                "checkpoints",
                "exported_heads",
                "problems",
                "consistency",
                "notes",
            ],
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
    from auditlog.integrity.statements import HeadStatement, StatementError

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
        raise StatementError(
            f"{source!r} is not an auditlog head statement (not UTF-8 text)"
        ) from None
    except OSError as exc:
        raise StatementError(
            f"cannot read head statement {source!r}: {exc.strerror or exc}"
        ) from exc
    return source, HeadStatement.parse(text, source)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str], Callable[[int], None]] | None]:
    """A per-run progress bar on a terminal; nothing in pipes (and rich not imported)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    # A run id is data (a tampered store can hold anything there): never markup.
    columns = (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TaskProgressColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=True) as bar:

        def for_run(run_id: str) -> Callable[[int], None]:
            task = bar.add_task(f"verifying {run_id[:12]}", total=None)
            return lambda n: bar.advance(task, n)

        yield for_run


def _verify_archive(directory: Path, keys: KeyRing | None, fmt: str) -> None:
    """``verify --archive DIR``: one line (or a JSON/CSV row), problems, exit 4 when any."""
    from auditlog.archive.check import verify_archive
    from auditlog.integrity.keys import KeyRing, trusted_public_keys

    if keys is None:
        try:
            keys = KeyRing(trusted_public_keys())
        except AuditlogError:
            keys = KeyRing()
    report = verify_archive(directory, keys)
    if fmt == "table":
        counted = (
            f"{report.events} events in {len(report.streams)} stream(s), {report.files} files, "
            f"{report.tensors} tensor(s), {report.signatures} signature(s)"
        )
        echo_line(
            f"archive {directory} (run {(report.run_id or '?')[:12]}): {counted}: {'intact' if report.ok else 'FAILED'}"
        )
        for problem in report.problems[:20]:
            echo_line(f"  {problem}")
    else:
        row = {
            "archive": str(directory),
            "run_id": report.run_id,
            "ok": report.ok,
            "events": report.events,
            "files": report.files,
            "tensors": report.tensors,
            "signatures": report.signatures,
            "problems": report.problems,
        }
        emit_rows([row], list(row), fmt)
    if not report.ok:
        first = report.problems[0] if report.problems else "the archive holds no events"
        raise IntegrityError(f"archive not verified: {first}")
