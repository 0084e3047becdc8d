"""Signed statements about chain heads: stored checkpoints and exported heads.

A signature is Ed25519 over the canonical JSON (sorted keys, no whitespace,
ASCII) of a statement object, so anyone can re-derive the signed bytes from the
fields alone. Two statements exist:

``auditlog-checkpoint-v2`` (a row of the ``checkpoints`` table; a signed tree head)::

    {"format", "store_id", "run_id", "stream", "seq", "head_hash", "tree_root",
     "ended", "world_size", "created_ns", "key_fingerprint"}

``tree_root`` is the RFC 9162 Merkle tree head of the stream's first ``seq``
events (``auditlog.integrity.merkle``); ``ended`` says the event at ``seq`` is
the stream's ``run_ended`` (a stream ends there: nothing may follow it);
``world_size`` is the run's from ``run_started`` (how many streams the run has).
``auditlog-checkpoint-v1`` rows (no tree root, no end, no world size) from
older versions still verify: ``{"format", "store_id", "run_id", "stream",
"seq", "head_hash", "created_ns", "key_fingerprint"}``.

``store_id`` is not a column: it is read from the store's ``auditlog_meta`` at
verification, so a checkpoint row copied into another store does not verify.

``auditlog-head-v2`` (the file ``auditlog export-head`` writes, kept elsewhere)::

    {"format", "store_id", "run_id", "created_ns", "world_size",
     "heads": [{"stream", "seq", "head_hash", "tree_root", "ended"}, ...],
     "key_fingerprint", "signature"}

``auditlog-head-v1`` files (no ``world_size``, heads without ``tree_root`` and
``ended``) still verify.

signed over the object without its ``signature`` field. Its ``store_id`` says
where it came from; a copy of that store (a backup) verifies against it too,
because the chain itself names the run (its genesis hash includes the run id).

This module is pure: no store access, no files. ``auditlog.integrity.checkpoints`` reads
heads from a store, signs them and checks stored and exported ones against the chain;
the trusted keys are ``auditlog.integrity.keys.KeyRing``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auditlog.core.errors import AuditlogError
from auditlog.core.payloadlimits import loads_bounded
from auditlog.integrity.keys import fingerprint

CHECKPOINT_FORMAT_V1 = "auditlog-checkpoint-v1"
CHECKPOINT_FORMAT = "auditlog-checkpoint-v2"
HEAD_FORMAT_V1 = "auditlog-head-v1"
HEAD_FORMAT = "auditlog-head-v2"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")


def canonical_statement(fields: Mapping[str, Any]) -> bytes:
    """The bytes a statement's signature covers."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


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
    format: str = CHECKPOINT_FORMAT
    tree_root: str | None = None
    ended: bool = False
    world_size: int | None = None

    @property
    def is_tree_head(self) -> bool:
        """A v2 checkpoint: it signs a Merkle tree head, the stream's end and the world size."""
        return self.format == CHECKPOINT_FORMAT

    def fields(self, store_id: str) -> dict[str, Any]:
        """The signed statement as an object (``store_id`` from the store it is in)."""
        fields: dict[str, Any] = {
            "format": self.format,
            "store_id": store_id,
            "run_id": self.run_id,
            "stream": self.stream,
            "seq": self.seq,
            "head_hash": self.head_hash,
            "created_ns": self.created_ns,
            "key_fingerprint": self.key_fingerprint,
        }
        if self.is_tree_head:
            fields.update(tree_root=self.tree_root, ended=self.ended, world_size=self.world_size)
        return fields

    def statement(self, store_id: str) -> bytes:
        """The signed bytes; ``store_id`` comes from the store the checkpoint is in."""
        return canonical_statement(self.fields(store_id))

    def as_row(self) -> dict[str, Any]:
        """Column values for an insert (the id is the store's to assign)."""
        row: dict[str, Any] = {
            "run_id": self.run_id,
            "stream": self.stream,
            "seq": self.seq,
            "head_hash": self.head_hash,
            "created_ns": self.created_ns,
            "key_fingerprint": self.key_fingerprint,
            "signature": self.signature,
        }
        if self.is_tree_head:
            row.update(
                format=self.format,
                tree_root=self.tree_root,
                ended=int(self.ended),
                world_size=self.world_size,
            )
        return row

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
        version = row.get("format") or CHECKPOINT_FORMAT_V1
        extra: dict[str, Any] = {}
        if version == CHECKPOINT_FORMAT:
            root, ended, world = row.get("tree_root"), row.get("ended"), row.get("world_size")
            if not isinstance(root, str) or not _HEX64.fullmatch(root):
                raise ValueError(f"column tree_root holds {root!r}, not a hash")
            if ended not in (0, 1) or isinstance(ended, float):
                raise ValueError(f"column ended holds {ended!r}, not 0 or 1")
            if not isinstance(world, int) or isinstance(world, bool) or world < 1:
                raise ValueError(f"column world_size holds {world!r}, not a positive integer")
            extra = {"tree_root": root, "ended": bool(ended), "world_size": world}
        elif version != CHECKPOINT_FORMAT_V1:
            raise ValueError(f"column format holds {version!r}, not a known checkpoint format")
        return cls(
            run_id=texts["run_id"],
            stream=ints["stream"],
            seq=ints["seq"],
            head_hash=texts["head_hash"],
            created_ns=ints["created_ns"],
            key_fingerprint=texts["key_fingerprint"],
            signature=texts["signature"],
            id=row.get("id"),
            format=version,
            **extra,
        )


def sign_head(
    private_key: Ed25519PrivateKey,
    store_id: str,
    run_id: str,
    stream: int,
    seq: int,
    head_hash: str,
    created_ns: int | None = None,
    *,
    tree_root: str,
    ended: bool,
    world_size: int,
) -> Checkpoint:
    """A signed tree head of one stream at ``seq`` by ``private_key`` (not stored yet)."""
    unsigned = Checkpoint(
        run_id=run_id,
        stream=stream,
        seq=seq,
        head_hash=head_hash,
        created_ns=time.time_ns() if created_ns is None else created_ns,
        key_fingerprint=fingerprint(private_key),
        signature="",
        tree_root=tree_root,
        ended=ended,
        world_size=world_size,
    )
    signature = private_key.sign(unsigned.statement(store_id)).hex()
    return replace(unsigned, signature=signature)


# --------------------------------------------------------------------------- exported heads
class StatementError(AuditlogError):
    """An exported-head file cannot be read or is not a well-formed statement. Exit code 1."""


@dataclass(frozen=True)
class StreamHead:
    """One stream's head in a statement: ``(seq, hash)``, and in v2 its tree head and end."""

    stream: int
    seq: int
    head_hash: str
    tree_root: str | None = None
    ended: bool = False

    def as_dict(self, version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"stream": self.stream, "seq": self.seq, "head_hash": self.head_hash}
        if version == HEAD_FORMAT:
            out.update(tree_root=self.tree_root, ended=self.ended)
        return out


@dataclass(frozen=True)
class HeadStatement:
    """A signed statement of a run's chain heads, for keeping outside the store."""

    store_id: str
    run_id: str
    created_ns: int
    heads: tuple[StreamHead, ...]
    key_fingerprint: str
    signature: str
    format: str = HEAD_FORMAT
    world_size: int | None = None

    @property
    def is_tree_head(self) -> bool:
        return self.format == HEAD_FORMAT

    @property
    def complete(self) -> bool:
        """Made after every stream of the run ended: it lists the run's whole record.

        Then a stream it does not list, or an event past one of its heads, was
        added after the statement was made.
        """
        return (
            self.is_tree_head
            and self.world_size is not None
            and {h.stream for h in self.heads} == set(range(self.world_size))
            and all(h.ended for h in self.heads)
        )

    def unsigned(self) -> dict[str, Any]:
        """Every field except the signature: what the signature covers."""
        out: dict[str, Any] = {
            "format": self.format,
            "store_id": self.store_id,
            "run_id": self.run_id,
            "created_ns": self.created_ns,
            "heads": [h.as_dict(self.format) for h in self.heads],
            "key_fingerprint": self.key_fingerprint,
        }
        if self.is_tree_head:
            out["world_size"] = self.world_size
        return out

    def message(self) -> bytes:
        return canonical_statement(self.unsigned())

    def to_json(self) -> str:
        """The file's text: indented for people, sorted keys, one trailing newline."""
        return (
            json.dumps({**self.unsigned(), "signature": self.signature}, indent=2, sort_keys=True)
            + "\n"
        )

    @classmethod
    def parse(cls, text: str, source: str) -> HeadStatement:
        """Read a statement strictly; ``StatementError`` names the file and what is wrong."""
        try:
            data = loads_bounded(text)
        except ValueError as exc:
            raise StatementError(
                f"{source!r} is not an auditlog head statement (not JSON: {exc})"
            ) from exc
        if not isinstance(data, dict):
            raise StatementError(
                f"{source!r} is not an auditlog head statement (not a JSON object)"
            )
        return cls.from_object(data, source)

    @classmethod
    def from_object(cls, data: dict[str, Any], source: str) -> HeadStatement:
        """A statement from its parsed JSON object (also embedded in proofs)."""
        version = data.get("format")
        if version not in (HEAD_FORMAT, HEAD_FORMAT_V1):
            raise StatementError(
                f"{source!r} is not an auditlog head statement "
                f"(format {version!r}, expected {HEAD_FORMAT!r})"
            )
        v2 = version == HEAD_FORMAT
        expected = {
            "format",
            "store_id",
            "run_id",
            "created_ns",
            "heads",
            "key_fingerprint",
            "signature",
        }
        if v2:
            expected.add("world_size")
        if set(data) != expected:
            odd = sorted(set(data) ^ expected)
            raise StatementError(
                f"{source!r}: malformed head statement (unexpected or missing fields: {', '.join(odd)})"
            )

        def bad(what: str) -> StatementError:
            return StatementError(f"{source!r}: malformed head statement ({what})")

        for name in ("store_id", "run_id"):
            if not isinstance(data[name], str) or not data[name]:
                raise bad(f"{name} must be a non-empty string")
        if not _is_int(data["created_ns"]):
            raise bad("created_ns must be an integer")
        if v2 and (not _is_int(data["world_size"]) or data["world_size"] < 1):
            raise bad("world_size must be a positive integer")
        if not isinstance(data["key_fingerprint"], str) or not _HEX64.fullmatch(
            data["key_fingerprint"]
        ):
            raise bad("key_fingerprint must be 64 lowercase hex digits")
        if not isinstance(data["signature"], str) or not _HEX128.fullmatch(data["signature"]):
            raise bad("signature must be 128 lowercase hex digits")
        if not isinstance(data["heads"], list) or not data["heads"]:
            raise bad("heads must be a non-empty list")
        fields = (
            {"stream", "seq", "head_hash", "tree_root", "ended"}
            if v2
            else {"stream", "seq", "head_hash"}
        )
        heads: list[StreamHead] = []
        for item in data["heads"]:
            if not isinstance(item, dict) or set(item) != fields:
                raise bad("each head must be an object with " + ", ".join(sorted(fields)))
            if not _is_int(item["stream"]) or item["stream"] < 0:
                raise bad("stream must be a non-negative integer")
            if not _is_int(item["seq"]) or item["seq"] < 1:
                raise bad("seq must be a positive integer")
            if not isinstance(item["head_hash"], str) or not _HEX64.fullmatch(item["head_hash"]):
                raise bad("head_hash must be 64 lowercase hex digits")
            if v2 and (
                not isinstance(item["tree_root"], str) or not _HEX64.fullmatch(item["tree_root"])
            ):
                raise bad("tree_root must be 64 lowercase hex digits")
            if v2 and not isinstance(item["ended"], bool):
                raise bad("ended must be true or false")
            heads.append(
                StreamHead(
                    item["stream"],
                    item["seq"],
                    item["head_hash"],
                    item.get("tree_root"),
                    bool(item.get("ended", False)),
                )
            )
        if len({h.stream for h in heads}) != len(heads):
            raise bad("a stream is listed twice")
        return cls(
            store_id=data["store_id"],
            run_id=data["run_id"],
            created_ns=data["created_ns"],
            heads=tuple(heads),
            key_fingerprint=data["key_fingerprint"],
            signature=data["signature"],
            format=version,
            world_size=data.get("world_size"),
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sign_heads(
    private_key: Ed25519PrivateKey,
    store_id: str,
    run_id: str,
    heads: Iterable[StreamHead],
    created_ns: int | None = None,
    *,
    world_size: int,
) -> HeadStatement:
    """A head statement (v2: with tree heads) for ``heads`` signed by ``private_key``."""
    unsigned = HeadStatement(
        store_id=store_id,
        run_id=run_id,
        created_ns=time.time_ns() if created_ns is None else created_ns,
        heads=tuple(sorted(heads, key=lambda h: h.stream)),
        key_fingerprint=fingerprint(private_key),
        signature="",
        world_size=world_size,
    )
    signature = private_key.sign(unsigned.message()).hex()
    return replace(unsigned, signature=signature)
