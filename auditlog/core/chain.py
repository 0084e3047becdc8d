"""Canonical encoding of events and the per-stream SHA-256 hash chain.

An event's hash covers every stored column except the autoincrement ``id``:
``sha256(prev_hash_hex || "\\n" || canonical_row)`` where ``canonical_row`` is the
compact JSON array ``[run_id, stream, seq, ts_ns, kind, step, module_id,
tensor_id, snapshot, payload]`` (the hashed columns of ``core.eventrow``) and ``payload`` is the stored payload text
verbatim. Verification therefore needs no knowledge of payload structure: any
change to any byte of a stored event changes its hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from json.encoder import encode_basestring_ascii
from typing import Any

import orjson

from auditlog.core.eventrow import HASHED_COLUMNS

CHAIN_VERSION = "auditlog-chain-v1"


class Clean(dict[str, Any]):
    """A dict whose values are JSON-ready already: str keys, finite floats (or
    their text, ``finite_or_text``), ints, str, None and lists/dicts of those.

    The writer hands it to the encoder without walking it (activity statistics
    built on CPU are made this way; walking the hundreds of them a step holds cost
    more than encoding them).
    """

    __slots__ = ()


class CleanList(list[Any]):
    """A list of JSON-ready values (as for ``Clean``): not walked by the writer."""

    __slots__ = ()


def genesis_hash(run_id: str, stream: int) -> str:
    """The hash the first event of a stream chains from."""
    return hashlib.sha256(f"{CHAIN_VERSION}:{run_id}:{stream}".encode()).hexdigest()


def _int_or_null(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def row_prefix(run_id: str, stream: int) -> str:
    """The start of every canonical row of one stream (computed once per writer)."""
    return f"[{encode_basestring_ascii(run_id)},{int(stream)},"


def canonical_row(row: dict[str, Any], prefix: str | None = None) -> bytes:
    """The bytes that are hashed for one stored event.

    Byte-for-byte the compact, ASCII-escaped JSON array described above (what
    ``json.dumps(..., separators=(",", ":"), ensure_ascii=True)`` gives, which
    ``canonical_row_reference`` keeps as the definition), assembled directly: the
    same C escaping function for the strings, ``str`` for the integers. That is
    several times faster (docs/performance.md), and it is paid once per event.
    """
    snapshot = row["snapshot"]
    if prefix is None:
        prefix = row_prefix(row["run_id"], row["stream"])
    return (
        f"{prefix}{int(row['seq'])},"
        f"{int(row['ts_ns'])},{encode_basestring_ascii(row['kind'])},{_int_or_null(row['step'])},"
        f"{_int_or_null(row['module_id'])},{_int_or_null(row['tensor_id'])},"
        f"{'null' if snapshot is None else encode_basestring_ascii(snapshot)},"
        f"{_escaped(row['payload'])}]"
    ).encode("ascii")


def _escaped(text: str) -> str:
    """``encode_basestring_ascii(text)``; for ASCII text without DEL (what payloads
    almost always are) orjson writes the same escapes faster."""
    if text.isascii() and "\x7f" not in text:
        return orjson.dumps(text).decode("ascii")
    return str(encode_basestring_ascii(text))


def canonical_row_reference(row: dict[str, Any]) -> bytes:
    """The definition of ``canonical_row`` (slower; tests check they agree)."""
    return json.dumps(
        [row[name] for name in HASHED_COLUMNS],
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()


def chain_hash(prev_hash: str, row: dict[str, Any], prefix: str | None = None) -> str:
    """Hash of one event given the hash of the event before it in its stream
    (``prefix``: ``row_prefix`` of the row's stream, when the caller has it)."""
    return link_hash(prev_hash, canonical_row(row, prefix))


def link_hash(prev_hash: str, row_bytes: bytes) -> str:
    """``chain_hash`` from the canonical row already encoded (the Merkle leaf uses the same bytes)."""
    digest = hashlib.sha256(prev_hash.encode())
    digest.update(b"\n")
    digest.update(row_bytes)
    return digest.hexdigest()


def chained_row(
    prev_hash: str,
    run_id: str,
    stream: int,
    seq: int,
    ts_ns: int,
    kind: str,
    step: int | None,
    module_id: int | None,
    tensor_id: int | None,
    payload: str,
    prefix: str | None = None,
) -> tuple[dict[str, Any], bytes]:
    """A stored event row (every column but the autoincrement ``id``) with its chain hash,
    and the canonical row bytes (the stream's Merkle tree hashes the same bytes as its leaf).

    The one place rows are built: the writer, and the recording that closes a
    crashed run's stream, both append through it.
    """
    row: dict[str, Any] = {
        "run_id": run_id,
        "stream": stream,
        "seq": seq,
        "ts_ns": ts_ns,
        "kind": kind,
        "step": step,
        "module_id": module_id,
        "tensor_id": tensor_id,
        "snapshot": None,
        "payload": payload,
    }
    encoded = canonical_row(row, prefix)
    row["hash"] = link_hash(prev_hash, encoded)
    return row, encoded


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def canonical_payload(payload: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, no NaN/Infinity literals."""
    return json.dumps(
        _clean(payload), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def encode_clean(payload: Any) -> str:
    """JSON text of a payload that is clean already (see ``Clean``; the writer's
    ``materialize`` makes every payload so): sorted keys, no whitespace.

    orjson is several times faster than the standard library here
    (docs/performance.md). It writes NaN as ``null`` without complaint, which is why only clean payloads come here;
    anything orjson refuses (a non-JSON type, an integer beyond 64 bits) goes
    through ``canonical_payload``. Exponents are written ``1e-7`` rather than
    Python's ``1e-07``: the same number, and the chain covers the stored text
    verbatim, so the encoder's choice is free.
    """
    try:
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return canonical_payload(payload)
