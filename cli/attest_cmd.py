"""``auditlog attest`` and ``auditlog verify-attestation``: signed provenance of a model file.

The attestation is an in-toto Statement v1 with a SLSA provenance v1 predicate
in a DSSE envelope signed with the Ed25519 key (docs/integrity.md).
"""

from __future__ import annotations

from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.output import echo_line
from auditlog.cli.proofs_cmd import read_json, write_new

from auditlog.core.errors import IntegrityError, UsageError

KEY_HELP = "Private key [default: $AUDITLOG_KEY or ~/.config/auditlog/signing_key]."


@click.command()
@store_option
@run_argument
@click.option(
    "--step",
    type=int,
    default=None,
    help="The step the model is from (default: the end of the run).",
)
@click.option(
    "--model",
    "model",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The model file (.safetensors or a torch state_dict file) to attest.",
)
@click.option("--key", "key_path", default=None, metavar="PRIVATE", help=KEY_HELP)
@click.option(
    "-o",
    "--output",
    required=True,
    metavar="FILE",
    help="Write the envelope here, e.g. model.intoto.json.",
)
def attest(
    store: str | None, run: str, step: int | None, model: Path, key_path: str | None, output: str
) -> None:
    """Sign that MODEL came out of RUN at --step N: an in-toto/SLSA provenance statement in DSSE.

    Refused (exit 4) when the record does not verify, was recorded for signing
    and has lost its signatures, or the model file does not hold exactly the
    recorded tensors at that step. The run's current tree heads are signed
    (stored as checkpoints) if this key has not signed them. One line on stderr
    says what the signature trusts: events no earlier signature covers are
    trusted on first signature.
    """
    from auditlog.integrity.keys import load_private_key
    from auditlog.read.api import open_store
    from auditlog.read.attest import attest as make_attestation

    key = load_private_key(Path(key_path) if key_path else None)
    with open_store(store) as opened:
        opened.check_file()
        run_id = opened.select(run)
        envelope = make_attestation(opened.event_store, run_id, step, model, key, told=_tell)
    write_new(output, envelope)
    if output != "-":
        click.echo(
            f"wrote an attestation of {model.name} from run {run_id[:12]} to {output}", err=True
        )


def _tell(line: str) -> None:
    click.echo(f"auditlog: {line}", err=True)


@click.command("verify-attestation")
@click.option(
    "--key",
    "key_paths",
    multiple=True,
    required=True,
    metavar="PUBLIC",
    help="Trust signatures by this public key (repeatable).",
)
@click.option(
    "--model",
    "model",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also check this is the attested model file.",
)
@click.option(
    "--store",
    "store",
    default=None,
    metavar="DIR|URL",
    help="Also check the record in this store still holds what was attested.",
)
@click.option(
    "--model-signature",
    "model_signature",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help=(
        "Also check this OpenSSF model signature (from `restore --sign`) of --model, and "
        "that the attestation names it."
    ),
)
@click.option(
    "--model-signing-key",
    "model_signing_key",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The ECDSA public key (PEM) the model signature must verify with (`keygen --model-signing` wrote PATH.pub).",
)
@click.argument("attestation", metavar="FILE")
def verify_attestation(
    key_paths: tuple[str, ...],
    model: Path | None,
    store: str | None,
    model_signature: Path | None,
    model_signing_key: Path | None,
    attestation: str,
) -> None:
    """Check an attestation from `auditlog attest`: its signature, and with --model / --store the
    model file and the record (exit 4 when anything does not hold); with --model-signature and
    --model-signing-key, the file's OpenSSF model signature too, tied to the attestation."""
    from auditlog.integrity.keys import KeyRing, trusted_public_keys
    from auditlog.read.api import open_store
    from auditlog.read.attest import verify_attestation as check_attestation

    if (model_signature is None) != (model_signing_key is None):
        raise UsageError("--model-signature and --model-signing-key go together")
    signed = (model_signature, model_signing_key) if model_signature and model_signing_key else None
    keys = KeyRing(trusted_public_keys(tuple(Path(p) for p in key_paths)))
    envelope = read_json(attestation, "a DSSE envelope")
    if store is not None:
        with open_store(store) as opened:
            check = check_attestation(envelope, keys, model, opened.event_store, signed)
    else:
        check = check_attestation(envelope, keys, model, None, signed)
    if check.problems:
        raise IntegrityError(f"attestation {attestation!r} does not hold: {check.problems[0]}")
    echo_line(f"attestation holds: {check.model} from run {str(check.run_id)[:12]}")
    for line in check.checked:
        echo_line(f"  checked: {line}")
