"""``auditlog keygen``: create the Ed25519 key pair that signs checkpoints and exported heads."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "-o",
    "--output",
    default=None,
    metavar="PATH",
    help="Private key file [default: $AUDITLOG_KEY or ~/.config/auditlog/signing_key]; "
    "the public key goes to PATH.pub.",
)
@click.option(
    "--model-signing",
    is_flag=True,
    help="An ECDSA P-256 pair for OpenSSF Model Signing (`restore --sign`) instead "
    "[default path: $AUDITLOG_MODEL_SIGNING_KEY or ~/.config/auditlog/model_signing_key].",
)
def keygen(output: str | None, model_signing: bool) -> None:
    """Create an Ed25519 key pair for signing checkpoints and exported heads.

    The private key is written with mode 0600 and never overwritten. Keep it
    away from the store and from whoever could edit the store: anyone holding
    it can sign a rewritten record. The public key, at the same path plus
    .pub, is what `auditlog verify --key` needs. With --model-signing, the
    pair `restore --sign` signs model files with (the OpenSSF format accepts
    NIST curves only); `model_signing verify key --public_key PATH.pub` checks them.
    """
    from auditlog.integrity.keys import (
        KEY_ENV,
        MODEL_KEY_ENV,
        default_model_signing_key_path,
        default_private_key_path,
        generate_key_pair,
    )

    path = Path(output) if output else None
    pair = generate_key_pair(path, model_signing=model_signing)
    click.echo(f"private key: {pair.private_path} (mode 0600; keep it secret and backed up)")
    click.echo(f"public key:  {pair.public_path} (give it to whoever verifies)")
    click.echo(f"fingerprint: {pair.fingerprint}")
    default, env = (
        (default_model_signing_key_path(), MODEL_KEY_ENV)
        if model_signing
        else (default_private_key_path(), KEY_ENV)
    )
    if path is not None and path.expanduser().absolute() != default.absolute():
        click.echo(f"to sign with it by default: export {env}={pair.private_path}")
