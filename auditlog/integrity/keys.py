"""Ed25519 signing keys held by the user: where they live, making them, reading them.

Signed checkpoints exist because a bare hash chain cannot see its newest events
cut off or the whole chain rewritten with fresh hashes; only a signature made
with a key the attacker does not hold can. So the private key belongs to the
user, outside the store: by default ``~/.config/auditlog/signing_key`` (or
``$XDG_CONFIG_HOME/auditlog/signing_key``), or wherever ``$AUDITLOG_KEY``
points. The public key sits beside it as ``<private>.pub``.

Files are PEM (PKCS#8 private key, unencrypted, mode 0600; SubjectPublicKeyInfo
public key); a public key may also be given as an OpenSSH ``ssh-ed25519`` line.
Every failure to read a key is one ``AuditlogError`` line naming the file.
"""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auditlog.core.errors import AuditlogError

KEY_ENV = "AUDITLOG_KEY"
KEY_FILE = "signing_key"
MODEL_KEY_ENV = "AUDITLOG_MODEL_SIGNING_KEY"
MODEL_KEY_FILE = "model_signing_key"  # ECDSA P-256, for OpenSSF Model Signing (``read.modelsign``)
PUBLIC_SUFFIX = ".pub"
# A key file is a few hundred bytes; refusing big files keeps a wrong path (a
# dataset, a checkpoint) from being read into memory just to be rejected.
MAX_KEY_BYTES = 64 * 1024


class KeyFileError(AuditlogError):
    """A key file is missing, unreadable, malformed or would be overwritten. Exit code 1."""


def default_private_key_path() -> Path:
    """``$AUDITLOG_KEY``, else ``$XDG_CONFIG_HOME/auditlog/signing_key`` (``~/.config`` by default)."""
    return _configured(KEY_ENV, KEY_FILE)


def _configured(env: str, name: str) -> Path:
    """The path in ``$env``, else ``name`` in ``$XDG_CONFIG_HOME/auditlog`` (``~/.config`` by default)."""
    configured = os.environ.get(env)
    if configured:
        return Path(configured).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home).expanduser() / "auditlog" / name


def public_key_path(private_path: Path) -> Path:
    """Where the public half of ``private_path`` is kept: the same name plus ``.pub``."""
    return private_path.with_name(private_path.name + PUBLIC_SUFFIX)


def default_public_key_path() -> Path:
    """The public key that ``verify`` trusts when no ``--key`` is given."""
    return public_key_path(default_private_key_path())


def fingerprint(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """SHA-256 (hex) of the raw 32-byte public key: names a key in checkpoints and messages."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class KeyPair:
    """Where ``generate_key_pair`` wrote the two halves, and the key's fingerprint."""

    private_path: Path
    public_path: Path
    fingerprint: str


def default_model_signing_key_path() -> Path:
    """``$AUDITLOG_MODEL_SIGNING_KEY``, else ``$XDG_CONFIG_HOME/auditlog/model_signing_key``."""
    return _configured(MODEL_KEY_ENV, MODEL_KEY_FILE)


def generate_key_pair(private_path: Path | None = None, model_signing: bool = False) -> KeyPair:
    """Create a new key pair; never overwrites an existing file.

    Ed25519 for the record's signatures; with ``model_signing`` an ECDSA P-256 pair
    for OpenSSF Model Signing, whose format accepts only NIST curves
    (``read.modelsign``). The private key is created with ``O_EXCL`` and mode 0600 in
    one step, so it is never readable by others, not even for an instant, and a key
    that already exists (which may have signed checkpoints) cannot be replaced by accident.
    """
    default = default_model_signing_key_path() if model_signing else default_private_key_path()
    private_path = (private_path or default).expanduser()
    public_path = public_key_path(private_path)
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise KeyFileError(
                f"{str(path)!r} already exists; refusing to overwrite a key "
                "(checkpoints signed with it would no longer verify); choose another path (`auditlog keygen -o PATH`)"
            )
    key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey = (
        ec.generate_private_key(ec.SECP256R1()) if model_signing else Ed25519PrivateKey.generate()
    )
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        if not private_path.parent.exists():
            private_path.parent.mkdir(mode=0o700, parents=True)
        _write_new(private_path, private_pem, 0o600)
        try:
            _write_new(public_path, public_pem, 0o644)
        except BaseException:
            private_path.unlink()
            raise
    except OSError as exc:
        raise KeyFileError(
            f"cannot write key {str(exc.filename or private_path)!r}: {exc.strerror or exc}"
        ) from exc
    if isinstance(key, Ed25519PrivateKey):
        return KeyPair(private_path, public_path, fingerprint(key))
    return KeyPair(private_path, public_path, hashlib.sha256(public_pem).hexdigest())


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; never widened past `mode`
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_key_file(path: Path, what: str) -> bytes:
    shown = str(path)
    try:
        if path.is_dir():
            raise KeyFileError(f"{what} {shown!r} is a directory, not a key file")
        with path.open("rb") as handle:
            data = handle.read(MAX_KEY_BYTES + 1)
    except FileNotFoundError:
        # Only a signer is helped by making a key; a verifier needs the signer's public key.
        hint = " (create a key pair with `auditlog keygen`)" if what == "private key" else ""
        raise KeyFileError(f"no {what} at {shown!r}: no such file{hint}") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} {shown!r}: {exc.strerror or exc}") from exc
    if len(data) > MAX_KEY_BYTES:
        raise KeyFileError(f"{what} {shown!r} is too large to be a key file")
    if not data.strip():
        raise KeyFileError(f"{what} {shown!r} is empty")
    return data


def load_private_key(path: Path | None = None) -> Ed25519PrivateKey:
    """Read an unencrypted Ed25519 private key (PEM, or OpenSSH) from ``path`` (default key)."""
    path = (path or default_private_key_path()).expanduser()
    data = _read_key_file(path, "private key")
    shown = str(path)
    if b"PUBLIC KEY" in data[:64] or data.lstrip().startswith(b"ssh-"):
        raise KeyFileError(f"{shown!r} is a public key; signing needs the private key")
    try:
        key: object
        if b"OPENSSH PRIVATE KEY" in data[:64]:
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # raised by cryptography for a password-protected key
        raise KeyFileError(
            f"private key {shown!r} is encrypted; auditlog needs an unencrypted key "
            "protected by file permissions (0600)"
        ) from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(
            f"{shown!r} is not a valid private key (expected Ed25519 in PEM format)"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{shown!r} holds {_algorithm(key)} key; auditlog signs with Ed25519")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Read an Ed25519 public key (PEM or an ``ssh-ed25519`` line); a private key file gives its public half."""
    path = path.expanduser()
    data = _read_key_file(path, "public key")
    shown = str(path)
    try:
        if data.lstrip().startswith(b"ssh-"):
            key: object = serialization.load_ssh_public_key(data.strip())
        elif b"PRIVATE KEY" in data[:64]:
            key = load_private_key(path).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(
            f"{shown!r} is not a valid public key (expected Ed25519 in PEM format)"
        ) from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(
            f"{shown!r} holds {_algorithm(key)} key; auditlog verifies Ed25519 signatures"
        )
    return key


def _algorithm(key: object) -> str:
    """A human name for the kind of key found instead of Ed25519."""
    kinds: list[tuple[tuple[type, ...], str]] = [
        ((rsa.RSAPrivateKey, rsa.RSAPublicKey), "an RSA"),
        ((ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey), "an elliptic-curve (ECDSA)"),
        ((dsa.DSAPrivateKey, dsa.DSAPublicKey), "a DSA"),
        ((ed448.Ed448PrivateKey, ed448.Ed448PublicKey), "an Ed448"),
    ]
    for types, name in kinds:
        if isinstance(key, types):
            return name
    return "a non-Ed25519"


def configured_private_key() -> Ed25519PrivateKey | None:
    """The key a recording should sign with, or None when the user has not set one up.

    ``$AUDITLOG_KEY`` set: that key, and a missing or bad file is an error (the
    user asked for signing). Otherwise the default key if it exists: running
    ``auditlog keygen`` is how a user opts in.
    """
    if os.environ.get(KEY_ENV):
        return load_private_key(default_private_key_path())
    path = default_private_key_path()
    if not path.exists():
        return None
    return load_private_key(path)


def trusted_public_keys(paths: list[Path] | tuple[Path, ...] = ()) -> list[Ed25519PublicKey]:
    """The public keys ``verify`` accepts signatures from.

    Given paths must all load. With none, the default public key if it exists;
    otherwise no key at all, so every signature is reported as unverifiable
    rather than silently accepted.
    """
    if paths:
        return [load_public_key(p) for p in paths]
    default = default_public_key_path()
    if default.exists():
        return [load_public_key(default)]
    return []


class Verdict(enum.Enum):
    """What checking one signature found."""

    VALID = "valid"
    INVALID = "invalid"
    UNKNOWN_KEY = "unknown key"


class KeyRing:
    """The public keys whose signatures are trusted, by fingerprint."""

    def __init__(self, keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self.keys: dict[str, Ed25519PublicKey] = {fingerprint(k): k for k in keys}

    def __bool__(self) -> bool:
        return bool(self.keys)

    def check(self, key_fingerprint: str, message: bytes, signature_hex: str) -> Verdict:
        """Is ``signature_hex`` a valid signature of ``message`` by the named, trusted key?"""
        key = self.keys.get(key_fingerprint)
        if key is None:
            return Verdict.UNKNOWN_KEY
        try:
            key.verify(bytes.fromhex(signature_hex), message)
        except (InvalidSignature, ValueError, TypeError):
            return Verdict.INVALID
        return Verdict.VALID
