"""``auditlog keygen`` and ``auditlog.integrity.keys``: where keys live, permissions, and bad key files.

A key file that is missing, unreadable or malformed must give one ``Error:``
line naming it (exit 1), never a traceback, whichever command reads it.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import assert_one_line_error, file_digest, invoke
from integrity_support import isolate_keys

from auditlog.integrity.keys import (
    configured_private_key,
    default_private_key_path,
    default_public_key_path,
    fingerprint,
    load_private_key,
    load_public_key,
)


@pytest.fixture(autouse=True)
def config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return isolate_keys(monkeypatch, tmp_path)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --------------------------------------------------------------------------- keygen
def test_keygen_writes_a_private_key_only_its_owner_can_read(config: Path) -> None:
    result = invoke("keygen")
    assert result.exit_code == 0, result.stderr
    private = config / "auditlog" / "signing_key"
    public = config / "auditlog" / "signing_key.pub"
    assert default_private_key_path() == private
    assert default_public_key_path() == public
    assert mode(private) == 0o600
    assert mode(public) == 0o644
    assert mode(private.parent) == 0o700
    key = load_private_key(private)
    assert fingerprint(load_public_key(public)) == fingerprint(key)
    assert f"fingerprint: {fingerprint(key)}" in result.stdout
    assert str(private) in result.stdout and str(public) in result.stdout
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def test_keygen_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        result = invoke("keygen", "-o", str(tmp_path / "k"))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.stderr
    assert mode(tmp_path / "k") == 0o600
    assert "export AUDITLOG_KEY=" in result.stdout  # not the default path: says how to use it


@pytest.mark.parametrize("existing", ["k", "k.pub"])
def test_keygen_refuses_to_overwrite(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_text("precious\n")
    before = file_digest(tmp_path / existing)
    line = assert_one_line_error(invoke("keygen", "-o", str(tmp_path / "k")), 1, "already exists")
    assert str(tmp_path / existing) in line
    assert file_digest(tmp_path / existing) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("k")) == [existing]


def test_keygen_twice_keeps_the_first_key(config: Path) -> None:
    assert invoke("keygen").exit_code == 0
    first = load_private_key()
    assert_one_line_error(invoke("keygen"), 1, "already exists", "refusing to overwrite")
    assert fingerprint(load_private_key()) == fingerprint(first)


def test_auditlog_key_environment_variable_moves_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "team" / "audit.key"
    monkeypatch.setenv("AUDITLOG_KEY", str(target))
    result = invoke("keygen")
    assert result.exit_code == 0, result.stderr
    assert target.is_file() and (tmp_path / "team" / "audit.key.pub").is_file()
    assert default_public_key_path() == tmp_path / "team" / "audit.key.pub"
    configured = configured_private_key()
    assert configured is not None
    assert fingerprint(configured) == fingerprint(load_private_key(target))


def test_configured_private_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no key set up: nothing to sign with, and no error
    assert configured_private_key() is None
    # AUDITLOG_KEY names a key that is not there: the user asked for signing, so it is an error
    monkeypatch.setenv("AUDITLOG_KEY", str(tmp_path / "missing.key"))
    with pytest.raises(Exception, match="no private key at"):
        configured_private_key()


def test_keygen_into_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(invoke("keygen", "-o", str(blocker / "k")), 1, "cannot write key")


# --------------------------------------------------------------------------- malformed keys
def _pem(key: object, private: bool = True) -> bytes:
    if private:
        return key.private_bytes(  # type: ignore[attr-defined,no-any-return]
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    return key.public_bytes(  # type: ignore[attr-defined,no-any-return]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


BAD_PRIVATE = {
    "empty": (b"", "is empty"),
    "text": (b"my grocery list\n", "not a valid private key"),
    "binary": (bytes(range(256)) * 3, "not a valid private key"),
    "truncated-pem": (_pem(Ed25519PrivateKey.generate())[:60], "not a valid private key"),
    "rsa": (_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "RSA"),
    "ec": (_pem(ec.generate_private_key(ec.SECP256R1())), "elliptic-curve"),
    "public-instead": (
        _pem(Ed25519PrivateKey.generate().public_key(), private=False),
        "is a public key",
    ),
    "encrypted": (
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        ),
        "encrypted",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PRIVATE))
@pytest.mark.parametrize("command", ["checkpoint", "export-head"])
def test_malformed_private_key_is_one_line(tmp_path: Path, case: str, command: str) -> None:
    data, words = BAD_PRIVATE[case]
    path = tmp_path / "bad.key"
    path.write_bytes(data)
    # the key is read before the store is opened: no store needed to see the error
    line = assert_one_line_error(invoke(command, "--key", str(path)), 1, words)
    assert str(path) in line


def test_missing_or_unreadable_private_key_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.key"
    assert_one_line_error(
        invoke("checkpoint", "--key", str(missing)), 1, "no private key at", str(missing)
    )
    directory = tmp_path / "dir.key"
    directory.mkdir()
    assert_one_line_error(invoke("checkpoint", "--key", str(directory)), 1, "is a directory")
    (tmp_path / "blocker").write_text("x")
    through_a_file = tmp_path / "blocker" / "k"  # ENOTDIR: unreadable even for root
    assert_one_line_error(
        invoke("checkpoint", "--key", str(through_a_file)),
        1,
        "cannot read private key",
        "Not a directory",
    )


def test_default_private_key_missing_points_to_keygen() -> None:
    line = assert_one_line_error(invoke("export-head"), 1, "no private key at", "auditlog keygen")
    assert str(default_private_key_path()) in line


BAD_PUBLIC = {
    "empty": (b"", "is empty"),
    "text": (b"not a key at all\n", "not a valid public key"),
    "binary": (os.urandom(300), "not a valid public key"),
    "rsa": (
        _pem(rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key(), False),
        "RSA",
    ),
    "bad-ssh": (b"ssh-ed25519 AAAAnotbase64!!\n", "not a valid public key"),
}


@pytest.mark.parametrize("case", sorted(BAD_PUBLIC))
def test_malformed_public_key_for_verify_is_one_line(tmp_path: Path, case: str) -> None:
    data, words = BAD_PUBLIC[case]
    path = tmp_path / "bad.pub"
    path.write_bytes(data)
    line = assert_one_line_error(invoke("verify", "--key", str(path)), 1, words)
    assert str(path) in line
    assert_one_line_error(
        invoke("verify", "--key", str(tmp_path / "nope.pub")), 1, "no public key at"
    )


def test_public_key_formats_accepted(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    ssh = tmp_path / "id.pub"
    ssh.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b" me@host\n"
    )
    private = tmp_path / "k"
    private.write_bytes(_pem(key))
    assert fingerprint(load_public_key(ssh)) == fingerprint(key)
    # a private key file given where a public key is wanted yields its public half
    assert fingerprint(load_public_key(private)) == fingerprint(key)
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint(key))
