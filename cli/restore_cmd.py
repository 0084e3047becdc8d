"""``auditlog restore``: write a state_dict rebuilt from the record (safetensors or torch)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.tree_cmd import check_step_or_seq, step_options

from auditlog.core.errors import AuditlogError, UsageError

FORMATS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch"}


@click.command()
@store_option
@run_argument
@step_options
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="File to write (.safetensors, .pt, .pth; another extension needs --format). Its directory must exist.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["safetensors", "torch"]),
    default=None,
    help="Output format (default: from the file extension).",
)
@click.option(
    "--root",
    default=None,
    metavar="CLASS",
    help="Root module by class name (default: the one with the most parameters).",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Write what was snapshotted even if some tensors were not.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option(
    "--sign",
    is_flag=True,
    help=(
        "Also sign the file in the OpenSSF Model Signing format (FILE.sig) and attest it "
        "to the record (FILE.intoto.json); needs auditlog[compliance]."
    ),
)
@click.option(
    "--key",
    "key_path",
    default=None,
    metavar="PRIVATE",
    help=(
        "With --sign: the record's Ed25519 key for the attestation [default: "
        "$AUDITLOG_KEY or ~/.config/auditlog/signing_key]."
    ),
)
@click.option(
    "--model-signing-key",
    "model_key_path",
    default=None,
    metavar="PRIVATE",
    help=(
        "With --sign: the ECDSA key for the OpenSSF signature [default: "
        "$AUDITLOG_MODEL_SIGNING_KEY or ~/.config/auditlog/model_signing_key]."
    ),
)
def restore(
    store: str | None,
    run: str,
    step: int | None,
    seq: int | None,
    output: Path,
    fmt: str | None,
    root: str | None,
    allow_partial: bool,
    force: bool,
    sign: bool,
    key_path: str | None,
    model_key_path: str | None,
) -> None:
    """Rebuild RUN's state_dict at --step N (or --seq N, default: the end) into a file.

    The file is created as any new file is (mode from the umask). A .safetensors
    file lists its tensors sorted by name; the state_dict's own key order is kept
    in its metadata under "auditlog.key_order" (a JSON list). With --sign, FILE.sig
    is its OpenSSF model signature (`model_signing verify key FILE --signature
    FILE.sig --public_key PUB` accepts it) and FILE.intoto.json the attestation
    that ties it to the record (`auditlog verify-attestation --model-signature`).
    """
    from auditlog.read.api import open_store
    from auditlog.read.restore import write_restored

    check_step_or_seq(step, seq)
    if (key_path or model_key_path) and not sign:
        raise UsageError("--key and --model-signing-key are for --sign")
    if seq is not None and sign:
        raise UsageError("--sign attests a model at a step (or the end): not at a seq")
    signed_files = (Path(f"{output}.sig"), Path(f"{output}.intoto.json")) if sign else ()
    for extra in signed_files:
        if extra.exists() and not force:
            raise AuditlogError(f"{str(extra)!r} exists; pass --force to overwrite it")
    kind = fmt or FORMATS.get(output.suffix.lower())
    if kind is None:
        raise UsageError(
            f"cannot tell the format of {str(output)!r} from its extension: "
            "name it .safetensors, .pt or .pth, or give --format"
        )
    if output.exists() and not force:
        raise AuditlogError(f"{str(output)!r} exists; pass --force to overwrite it")
    parent = output.absolute().parent
    if not parent.is_dir():
        raise AuditlogError(f"directory {str(output.parent)!r} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=".auditlog-restore-", suffix=output.suffix, dir=parent)
    os.close(fd)
    try:
        with open_store(store) as opened:
            view = opened.run(run)
            count = write_restored(view, Path(tmp), kind, step, seq, root, allow_partial)
            wrapped = view.wrappers_at(step, seq, root)
        os.chmod(tmp, 0o666 & ~_umask())  # a new file as any program makes it, not mkstemp's 0600
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    when = (
        f"step {step}" if step is not None else (f"seq {seq}" if seq is not None else "end of run")
    )
    click.echo(f"wrote {count} tensors of run {view.run_id[:12]} at {when} to {output}")
    if sign:
        _sign(store, view.run_id, step, output, signed_files, key_path, model_key_path)
    if wrapped:
        keys = ", ".join(sorted(wrapped)[:5]) + (
            f" and {len(wrapped) - 5} more" if len(wrapped) > 5 else ""
        )
        click.echo(
            f"note: {keys} held a tensor subclass ({next(iter(wrapped.values())).get('type')}); the file has its "
            "first inner tensor: Run.state_dict() in Python, with that class imported, rebuilds it whole",
            err=True,
        )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _sign(
    store: str | None,
    run_id: str,
    step: int | None,
    output: Path,
    files: tuple[Path, ...],
    key_path: str | None,
    model_key_path: str | None,
) -> None:
    """The OpenSSF signature of ``output``, then the record's attestation naming it."""
    from auditlog.integrity.keys import default_model_signing_key_path, load_private_key
    from auditlog.read.api import open_store
    from auditlog.read.attest import attest
    from auditlog.read.modelsign import sign_file, signature_subject

    signature, attestation = files
    key = load_private_key(Path(key_path) if key_path else None)
    model_key = (
        Path(model_key_path).expanduser() if model_key_path else default_model_signing_key_path()
    )
    if not model_key.is_file():
        raise AuditlogError(
            f"no model signing key at {str(model_key)!r}: make one with `auditlog keygen --model-signing`"
        )
    sign_file(output, signature, model_key)
    with open_store(store) as opened:
        envelope = attest(
            opened.event_store,
            run_id,
            step,
            output,
            key,
            told=lambda line: click.echo(f"auditlog: {line}", err=True),
            also=[signature_subject(signature)],
        )
    attestation.write_text(json.dumps(envelope, indent=2) + "\n")
    click.echo(
        f"signed {output.name}: {signature} (OpenSSF model signature), {attestation} (attestation to the record)"
    )
