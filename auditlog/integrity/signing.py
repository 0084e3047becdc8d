"""Signed statements about chain heads: stored checkpoints and exported heads.

A signature is Ed25519 over the canonical JSON (sorted keys, no whitespace,
ASCII) of a statement object, so anyone can re-derive the signed bytes from the
fields alone. Two statements exist:

``auditlog-checkpoint-v1`` (a row of the ``checkpoints`` table)::

    {"format", "store_id", "run_id", "stream", "seq", "head_hash",
     "created_ns", "key_fingerprint"}

``store_id`` is not a column: it is read from the store's ``auditlog_meta`` at
verification, so a checkpoint row copied into another store does not verify.

``auditlog-head-v1`` (the file ``auditlog export-head`` writes, kept elsewhere)::

    {"format", "store_id", "run_id", "created_ns",
     "heads": [{"stream", "seq", "head_hash"}, ...],
     "key_fingerprint", "signature"}

signed over the object without its ``signature`` field. Its ``store_id`` says
where it came from; a copy of that store (a backup) verifies against it too,
because the chain itself names the run (its genesis hash includes the run id).

This module is pure: no store access, no files. ``auditlog.integrity.heads`` reads heads
from a store and signs them; ``auditlog.integrity.verify`` checks the signatures.
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from auditlog.core.errors import AuditlogError
from auditlog.integrity.keys import fingerprint

CHECKPOINT_FORMAT = "auditlog-checkpoint-v1"
HEAD_FORMAT = "auditlog-head-v1"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


def canonical_statement(fields: Mapping[str, Any]) -> bytes:
    """The bytes a statement's signature covers."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


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


# --------------------------------------------------------------------------- checkpoints
@dataclass(frozen=True)
class Checkpoint:
    """A signed ``(seq, head_hash)`` of one stream: a row of the ``checkpoints`` table."""

    run_id: str
    stream: int
    seq: int
    head_hash: str
    created_ns: int
    key_fingerprint: str
    signature: str
    id: int | None = None

    def statement(self, store_id: str) -> bytes:
        """The signed bytes; ``store_id`` comes from the store the checkpoint is in."""
        return canonical_statement(
            {
                "format": CHECKPOINT_FORMAT,
                "store_id": store_id,
                "run_id": self.run_id,
                "stream": self.stream,
                "seq": self.seq,
                "head_hash": self.head_hash,
                "created_ns": self.created_ns,
                "key_fingerprint": self.key_fingerprint,
            }
        )

    def as_row(self) -> dict[str, Any]:
        """Column values for an insert (the id is the store's to assign)."""
        return {
            "run_id": self.run_id,
            "stream": self.stream,
            "seq": self.seq,
            "head_hash": self.head_hash,
            "created_ns": self.created_ns,
            "key_fingerprint": self.key_fingerprint,
            "signature": self.signature,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Checkpoint:
        """Typed checkpoint from a stored row; ``ValueError`` naming the garbled column.

        The table can be edited by anyone with file access, so nothing about a row
        is assumed: verification reports a garbled row instead of crashing on it.
        """
        ints = {}
        for column in ("stream", "seq", "created_ns"):
            value = row[column]
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"column {column} holds {value!r}, not an integer")
            ints[column] = value
        texts = {}
        for column in ("run_id", "head_hash", "key_fingerprint", "signature"):
            value = row[column]
            if not isinstance(value, str):
                raise ValueError(f"column {column} holds {type(value).__name__}, not text")
            texts[column] = value
        return cls(
            run_id=texts["run_id"],
            stream=ints["stream"],
            seq=ints["seq"],
            head_hash=texts["head_hash"],
            created_ns=ints["created_ns"],
            key_fingerprint=texts["key_fingerprint"],
            signature=texts["signature"],
            id=row.get("id"),
        )


def sign_head(
    private_key: Ed25519PrivateKey,
    store_id: str,
    run_id: str,
    stream: int,
    seq: int,
    head_hash: str,
    created_ns: int | None = None,
) -> Checkpoint:
    """A checkpoint of ``(seq, head_hash)`` signed by ``private_key`` (not stored yet)."""
    unsigned = Checkpoint(
        run_id=run_id,
        stream=stream,
        seq=seq,
        head_hash=head_hash,
        created_ns=time.time_ns() if created_ns is None else created_ns,
        key_fingerprint=fingerprint(private_key),
        signature="",
    )
    signature = private_key.sign(unsigned.statement(store_id)).hex()
    return replace(unsigned, signature=signature)


# --------------------------------------------------------------------------- exported heads
class StatementError(AuditlogError):
    """An exported-head file cannot be read or is not a well-formed statement. Exit code 1."""


@dataclass(frozen=True)
class StreamHead:
    """The last ``(seq, hash)`` of one stream at the time of the statement."""

    stream: int
    seq: int
    head_hash: str


@dataclass(frozen=True)
class HeadStatement:
    """A signed statement of a run's chain heads, for keeping outside the store."""

    store_id: str
    run_id: str
    created_ns: int
    heads: tuple[StreamHead, ...]
    key_fingerprint: str
    signature: str

    def unsigned(self) -> dict[str, Any]:
        """Every field except the signature: what the signature covers."""
        return {
            "format": HEAD_FORMAT,
            "store_id": self.store_id,
            "run_id": self.run_id,
            "created_ns": self.created_ns,
            "heads": [
                {"stream": h.stream, "seq": h.seq, "head_hash": h.head_hash} for h in self.heads
            ],
            "key_fingerprint": self.key_fingerprint,
        }

    def message(self) -> bytes:
        return canonical_statement(self.unsigned())

    def to_json(self) -> str:
        """The file's text: indented for people, sorted keys, one trailing newline."""
        return json.dumps({**self.unsigned(), "signature": self.signature}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str, source: str) -> HeadStatement:
        """Read a statement strictly; ``StatementError`` names the file and what is wrong."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise StatementError(f"{source!r} is not an auditlog head statement (not JSON: {exc})") from exc
        if not isinstance(data, dict):
            raise StatementError(f"{source!r} is not an auditlog head statement (not a JSON object)")
        if data.get("format") != HEAD_FORMAT:
            raise StatementError(
                f"{source!r} is not an auditlog head statement "
                f"(format {data.get('format')!r}, expected {HEAD_FORMAT!r})"
            )
        expected = {"format", "store_id", "run_id", "created_ns", "heads", "key_fingerprint", "signature"}
        if set(data) != expected:
            odd = sorted(set(data) ^ expected)
            raise StatementError(f"{source!r}: malformed head statement (unexpected or missing fields: {', '.join(odd)})")

        def bad(what: str) -> StatementError:
            return StatementError(f"{source!r}: malformed head statement ({what})")

        for name in ("store_id", "run_id"):
            if not isinstance(data[name], str) or not data[name]:
                raise bad(f"{name} must be a non-empty string")
        if not _is_int(data["created_ns"]):
            raise bad("created_ns must be an integer")
        if not isinstance(data["key_fingerprint"], str) or not _HEX64.fullmatch(data["key_fingerprint"]):
            raise bad("key_fingerprint must be 64 lowercase hex digits")
        if not isinstance(data["signature"], str) or not _HEX128.fullmatch(data["signature"]):
            raise bad("signature must be 128 lowercase hex digits")
        if not isinstance(data["heads"], list) or not data["heads"]:
            raise bad("heads must be a non-empty list")
        heads: list[StreamHead] = []
        for item in data["heads"]:
            if not isinstance(item, dict) or set(item) != {"stream", "seq", "head_hash"}:
                raise bad("each head must be an object with stream, seq and head_hash")
            if not _is_int(item["stream"]) or item["stream"] < 0:
                raise bad("stream must be a non-negative integer")
            if not _is_int(item["seq"]) or item["seq"] < 1:
                raise bad("seq must be a positive integer")
            if not isinstance(item["head_hash"], str) or not _HEX64.fullmatch(item["head_hash"]):
                raise bad("head_hash must be 64 lowercase hex digits")
            heads.append(StreamHead(item["stream"], item["seq"], item["head_hash"]))
        if len({h.stream for h in heads}) != len(heads):
            raise bad("a stream is listed twice")
        return cls(
            store_id=data["store_id"],
            run_id=data["run_id"],
            created_ns=data["created_ns"],
            heads=tuple(heads),
            key_fingerprint=data["key_fingerprint"],
            signature=data["signature"],
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sign_heads(
    private_key: Ed25519PrivateKey,
    store_id: str,
    run_id: str,
    heads: Iterable[StreamHead],
    created_ns: int | None = None,
) -> HeadStatement:
    """A head statement for ``heads`` signed by ``private_key``."""
    unsigned = HeadStatement(
        store_id=store_id,
        run_id=run_id,
        created_ns=time.time_ns() if created_ns is None else created_ns,
        heads=tuple(sorted(heads, key=lambda h: h.stream)),
        key_fingerprint=fingerprint(private_key),
        signature="",
    )
    signature = private_key.sign(unsigned.message()).hex()
    return replace(unsigned, signature=signature)
