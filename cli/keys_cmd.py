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
def keygen(output: str | None) -> None:
    """Create an Ed25519 key pair for signing checkpoints and exported heads.

    The private key is written with mode 0600 and never overwritten. Keep it
    away from the store and from whoever could edit the store: anyone holding
    it can sign a rewritten record. The public key, at the same path plus
    .pub, is what `auditlog verify --key` needs.
    """
    from auditlog.integrity.keys import KEY_ENV, default_private_key_path, generate_key_pair

    path = Path(output) if output else None
    pair = generate_key_pair(path)
    click.echo(f"private key: {pair.private_path} (mode 0600; keep it secret and backed up)")
    click.echo(f"public key:  {pair.public_path} (give it to whoever verifies)")
    click.echo(f"fingerprint: {pair.fingerprint}")
    if path is not None and path.expanduser().absolute() != default_private_key_path().absolute():
        click.echo(f"to sign with it by default: export {KEY_ENV}={pair.private_path}")
