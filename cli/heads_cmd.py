"""``auditlog checkpoint`` and ``auditlog export-head``: sign a run's current chain heads.

Both refuse to sign a record that does not verify: a signature over an edited
chain would certify the edit.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auditlog.errors import AuditlogError, IntegrityError
from auditlog.heads import checkpoint_head, current_heads, export_heads
from auditlog.integrity import check_database_file, verify_run
from auditlog.keys import fingerprint, load_private_key, trusted_public_keys
from auditlog.runs import select_run
from auditlog.signing import KeyRing
from auditlog.store.checkpoints import checkpoints_for
from auditlog.store.eventstore import EventStore

KEY_HELP = "Private key [default: $AUDITLOG_KEY or ~/.config/auditlog/signing_key]."


def _require_intact(store: EventStore, run_id: str, key: Ed25519PrivateKey) -> None:
    """Raise ``IntegrityError`` when the run's record is proven altered (doubts do not block)."""
    keys = KeyRing([key.public_key(), *_default_keys()])
    report = verify_run(store, run_id, keys=keys)
    altered = [p for p in report.problems if p.altered]
    if altered:
        raise IntegrityError(f"refusing to sign run {run_id[:12]}: record altered: {altered[0].describe()}")


def _default_keys() -> list[Ed25519PublicKey]:
    try:
        return list(trusted_public_keys())
    except AuditlogError:  # a broken default public key does not matter when signing
        return []


@click.command()
@store_option
@click.option("--key", "key_path", default=None, metavar="PRIVATE", help=KEY_HELP)
@click.argument("run", default="latest", metavar="RUN|all")
def checkpoint(store: str | None, key_path: str | None, run: str) -> None:
    """Sign the current chain heads of RUN (default: latest; 'all') and store the checkpoints.

    Streams whose head this key has already signed are left alone. A run whose
    record does not verify is not signed (exit 4).
    """
    key = load_private_key(Path(key_path) if key_path else None)
    event_store = EventStore.open(store)
    try:
        check_database_file(event_store)
        if run == "all":
            run_ids = [str(r["run_id"]) for r in event_store.run_rows()]
        else:
            run_ids = [select_run(event_store, run)]
        refused: list[IntegrityError] = []
        for run_id in run_ids:
            try:
                _require_intact(event_store, run_id, key)
            except IntegrityError as exc:
                refused.append(exc)
                click.echo(f"run {run_id[:12]}: not signed, record altered")
                continue
            _checkpoint_run(event_store, run_id, key)
    finally:
        event_store.close()
    if refused:
        raise refused[0]


def _checkpoint_run(store: EventStore, run_id: str, key: Ed25519PrivateKey) -> None:
    existing = checkpoints_for(store, run_id)
    mine = fingerprint(key)
    signed = {(c.stream, c.seq, c.head_hash) for c in existing if c.key_fingerprint == mine}
    heads = current_heads(store, run_id)
    if not heads:
        raise AuditlogError(f"run {run_id[:12]} has no events to checkpoint")
    for head in heads:
        where = f"run {run_id[:12]} stream {head.stream}"
        if (head.stream, head.seq, head.head_hash) in signed:
            click.echo(f"{where}: seq {head.seq} already signed by this key")
            continue
        made = checkpoint_head(store, key, run_id, head.stream, head=(head.seq, head.head_hash))
        click.echo(
            f"{where}: signed seq {head.seq} (head {head.head_hash[:16]}, checkpoint {made.id}, "
            f"key {mine[:16]})"
        )


@click.command("export-head")
@store_option
@click.option("--key", "key_path", default=None, metavar="PRIVATE", help=KEY_HELP)
@click.option(
    "-o", "--output", default=None, metavar="FILE", help="Write to FILE (never overwritten) instead of stdout."
)
@run_argument
def export_head(store: str | None, key_path: str | None, output: str | None, run: str) -> None:
    """Print a signed statement of RUN's chain heads (default: latest) to keep outside the store.

    `auditlog verify --against FILE` later proves the record still extends it:
    it catches the newest events cut off and a chain rewritten with fresh
    hashes, which the chain alone cannot. A run whose record does not verify is
    not signed (exit 4).
    """
    key = load_private_key(Path(key_path) if key_path else None)
    event_store = EventStore.open(store)
    try:
        check_database_file(event_store)
        run_id = select_run(event_store, run)
        _require_intact(event_store, run_id, key)
        statement = export_heads(event_store, key, run_id)
    finally:
        event_store.close()
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
