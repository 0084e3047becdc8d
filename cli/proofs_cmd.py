"""``auditlog prove`` and ``auditlog verify-proof``: show one event (or a log's growth) to someone
without the store, and check such a proof with nothing but a public key."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.output import echo_line

from auditlog.core.errors import AuditlogError, IntegrityError
from auditlog.core.payloadlimits import loads_bounded
from auditlog.core.values import iso

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


def read_json(source: str, what: str) -> Any:
    """A JSON document from a file ('-': stdin); one error line naming the file otherwise."""
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            path = Path(source)
            if path.is_dir() or path.stat().st_size > MAX_DOCUMENT_BYTES:
                raise AuditlogError(f"{source!r} is not {what}")
            text = path.read_text(encoding="utf-8")
        return loads_bounded(text)  # nested past 64 levels: ValueError, as for no JSON
    except FileNotFoundError:
        raise AuditlogError(f"no {what} at {source!r}") from None
    except (UnicodeDecodeError, ValueError):
        raise AuditlogError(f"{source!r} is not {what} (not JSON)") from None
    except OSError as exc:
        raise AuditlogError(f"cannot read {source!r}: {exc.strerror or exc}") from exc


def write_new(path: str, document: dict[str, Any]) -> None:
    """Write a JSON document to a new file ('-': stdout); an existing file is never replaced."""
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise AuditlogError(f"{path!r} already exists; choose another file name") from None
    except OSError as exc:
        raise AuditlogError(f"cannot write {path!r}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


@click.command()
@store_option
@run_argument
@click.option(
    "--seq", type=int, default=None, help="The event to prove (its sequence number in the stream)."
)
@click.option(
    "--stream", type=int, default=0, show_default=True, help="The stream (rank) of the event."
)
@click.option(
    "--consistency-from",
    "old",
    default=None,
    metavar="HEAD",
    help="Instead: prove the record extends this older signed head (from `auditlog export-head`).",
)
@click.option(
    "-o",
    "--output",
    required=True,
    metavar="FILE",
    help="Write the proof here (never overwritten; '-': stdout).",
)
def prove(
    store: str | None, run: str, seq: int | None, stream: int, old: str | None, output: str
) -> None:
    """Write a proof about RUN that `auditlog verify-proof` checks without the store.

    With --seq N: an inclusion proof of that one event (its content, its leaf
    index, the audit path and the newest signed tree head of its stream), so an
    auditor can be shown a dataset annotation or a hyperparameter change without
    the rest of the record. With --consistency-from HEAD: a consistency proof
    that the record, as signed now, extends an older signed head.
    """
    from auditlog.read.api import open_store

    if (seq is None) == (old is None):
        raise click.UsageError("give exactly one of --seq N and --consistency-from HEAD")
    old_head = read_json(old, "a signed head statement") if old is not None else None
    with open_store(store) as opened:
        view = opened.run(run)
        if old_head is not None:
            document = view.prove_consistency(old_head, stream)
        else:
            assert seq is not None
            document = view.prove(seq, stream)
    write_new(output, document)
    if output != "-":
        what = (
            f"event seq {seq} of stream {stream}"
            if seq is not None
            else f"stream {stream} from tree size {document['old_size']} to {document['new_size']}"
        )
        click.echo(f"wrote a proof of run {view.run_id[:12]} {what} to {output}", err=True)


@click.command("verify-proof")
@click.option(
    "--key",
    "key_paths",
    multiple=True,
    required=True,
    metavar="PUBLIC",
    help="Trust signatures by this public key (repeatable).",
)
@click.argument("proof", metavar="PROOF")
def verify_proof(key_paths: tuple[str, ...], proof: str) -> None:
    """Check a proof from `auditlog prove` without the store (exit 4 if it does not hold).

    An inclusion proof shows its event, and that it is in the tree whose head
    the trusted key signed; a consistency proof, that the newer signed tree
    extends the older one.
    """
    from auditlog.integrity.keys import KeyRing, trusted_public_keys
    from auditlog.integrity.proofs import check_document

    keys = KeyRing(trusted_public_keys(tuple(Path(p) for p in key_paths)))
    check = check_document(read_json(proof, "an auditlog proof"), keys)
    if not check.ok:
        raise IntegrityError(f"proof {proof!r} does not hold: {check.problems[0]}")
    if check.kind == "inclusion":
        event, head = check.event or {}, check.heads[0]
        echo_line(
            f"proof holds: run {head.run_id[:12]} stream {head.stream} event seq {event.get('seq')} "
            f"is leaf {int(event.get('seq') or 0) - 1} of the tree of {head.size} events signed by key "
            f"{head.key_fingerprint[:16]} at {iso(head.created_ns)}"
        )
        echo_line(
            f"{event.get('kind')} at step {event.get('step')} ({iso(int(event.get('ts_ns') or 0))}): "
            f"{event.get('payload')}"
        )
    else:
        old, new = check.heads
        click.echo(
            f"proof holds: run {new.run_id[:12]} stream {new.stream}: the tree of {new.size} events "
            f"(signed at {iso(new.created_ns)}) extends the tree of {old.size} events "
            f"(signed at {iso(old.created_ns)})"
        )
