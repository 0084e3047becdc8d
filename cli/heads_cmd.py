"""``auditlog checkpoint`` and ``auditlog export-head``: sign a run's current chain heads.

Both refuse to sign a record that does not verify, or one recorded for signing
that has lost its signatures: a signature over an edited chain would certify
the edit. Both say on stderr, in one line, what the signature trusts.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from auditlog.cli.complete import complete_runs_or_all
from auditlog.cli.options import run_argument, store_option

from auditlog.core.errors import AuditlogError, IntegrityError

KEY_HELP = "Private key [default: $AUDITLOG_KEY or ~/.config/auditlog/signing_key]."


def tell(line: str) -> None:
    """A signing command's line about what it trusts (stderr: stdout may be the statement)."""
    click.echo(f"auditlog: {line}", err=True)


@click.command()
@store_option
@click.option("--key", "key_path", default=None, metavar="PRIVATE", help=KEY_HELP)
@click.argument("run", default="latest", metavar="[RUN|all]", shell_complete=complete_runs_or_all)
def checkpoint(store: str | None, key_path: str | None, run: str) -> None:
    """Sign the current chain heads of RUN (default: latest; 'all') and store the checkpoints.

    Streams whose head this key has already signed are left alone. A run whose
    record does not verify, or that was recorded for signing and has lost its
    signatures, is not signed (exit 4). Events no earlier signature covers are
    trusted on first signature: one line on stderr says which.
    """
    from auditlog.integrity.keys import fingerprint, load_private_key
    from auditlog.read.api import open_store

    key = load_private_key(Path(key_path) if key_path else None)
    mine = fingerprint(key)[:16]
    refused: list[IntegrityError] = []
    with open_store(store) as opened:
        opened.check_file()
        run_ids = [info.run_id for info in opened.runs()] if run == "all" else [opened.select(run)]
        for run_id in run_ids:
            try:
                signed = opened.run(run_id).checkpoint(key, told=tell)
            except IntegrityError as exc:
                refused.append(exc)
                click.echo(
                    f"run {run_id[:12]}: not signed, "
                    + (
                        "record altered"
                        if "record altered" in str(exc)
                        else "its signatures were lost"
                    )
                )
                continue
            for head in signed:
                where = f"run {run_id[:12]} stream {head.stream}"
                if head.already_signed:
                    click.echo(f"{where}: seq {head.seq} already signed by this key")
                else:
                    click.echo(
                        f"{where}: signed seq {head.seq} (head {head.head_hash[:16]}, "
                        f"checkpoint {head.checkpoint_id}, key {mine})"
                    )
    if refused:
        raise refused[0]


@click.command("export-head")
@store_option
@click.option("--key", "key_path", default=None, metavar="PRIVATE", help=KEY_HELP)
@click.option(
    "-o",
    "--output",
    default=None,
    metavar="FILE",
    help="Write to FILE (never overwritten) instead of stdout.",
)
@run_argument
def export_head(store: str | None, key_path: str | None, output: str | None, run: str) -> None:
    """Print a signed statement of RUN's chain heads (default: latest) to keep outside the store.

    `auditlog verify --against FILE` later proves the record still extends it:
    it catches the newest events cut off and a chain rewritten with fresh
    hashes, which the chain alone cannot. A run whose record does not verify,
    or that was recorded for signing and has lost its signatures, is not signed
    (exit 4). Events no earlier signature covers are trusted on first
    signature: one line on stderr says which.
    """
    from auditlog.integrity.keys import load_private_key
    from auditlog.read.api import open_store

    key = load_private_key(Path(key_path) if key_path else None)
    with open_store(store) as opened:
        opened.check_file()
        run_id = opened.select(run)
        statement = opened.run(run_id).export_head(key, told=tell)
    text = statement.to_json()
    if output is None:
        click.echo(text, nl=False)
        return
    _write_new(Path(output), text)
    heads = ", ".join(f"stream {h.stream} seq {h.seq}" for h in statement.heads)
    click.echo(f"wrote the signed head of run {run_id[:12]} ({heads}) to {output}", err=True)


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` with ``text``; an existing file (an older statement) is never replaced."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise AuditlogError(f"{str(path)!r} already exists; choose another file name") from None
    except OSError as exc:
        raise AuditlogError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
