"""Canonical encoding of events and the per-stream SHA-256 hash chain, in every chain format.

An event's hash covers its hashed columns (``core.eventrow``):
``sha256(prev_hash_hex || "\\n" || canonical_row)``, where ``canonical_row`` is the
compact JSON array of those columns and ``payload`` is the stored payload text
verbatim, so verification needs no knowledge of payload structure: any change to
any byte of a stored event changes its hash. The first event of a stream chains
from the genesis hash ``sha256("<version>:<run_id>:<stream>")``.

Two chain formats (docs/integrity.md, "The hash chain"):

- ``auditlog-chain-v2`` (``CHAIN_V2``, written since revision 0005):
  ``[run_id, stream, seq, ts_ns, kind, step, module_id, tensor_id, payload]``;
- ``auditlog-chain-v1`` (``CHAIN_V1``, every record before):
  ``[run_id, stream, seq, ts_ns, kind, step, module_id, tensor_id, snapshot, payload]``,
  ``snapshot`` being NULL in every stored row (the table no longer has it: a v1
  row is hashed with that NULL in its place).

**A stream's format is fixed by its first event**: its version is in the genesis
hash, so the stream's seq 1 event links under exactly one format
(``first_event_format``; two canonical rows of different formats are never the same
bytes, their arrays have different lengths). Every later event of the stream is
checked under that format alone, and whatever appends to an existing stream (a
crashed run's ``run_ended``) continues it in that format. New streams are written
in ``CURRENT``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

import orjson

from auditlog.core.eventrow import CHAIN_NUMBERS, RETIRED, hashed_columns, retired_columns


@dataclass(frozen=True)
class ChainFormat:
    """One chain format: its version string (in the genesis hash), number, canonical row
    (``columns``) and the retired columns of it the table no longer has (NULL in every row)."""

    version: str
    number: int
    columns: tuple[str, ...]
    retired: tuple[str, ...] = ()

    def genesis(self, run_id: str, stream: int) -> str:
        """The hash the first event of a stream of this format chains from."""
        return hashlib.sha256(f"{self.version}:{run_id}:{stream}".encode()).hexdigest()

    def __repr__(self) -> str:
        return f"ChainFormat({self.version!r})"


def _format(number: int) -> ChainFormat:
    return ChainFormat(
        f"auditlog-chain-v{number}", number, hashed_columns(number), retired_columns(number)
    )


CHAIN_V1 = _format(1)
CHAIN_V2 = _format(2)
FORMATS: tuple[ChainFormat, ...] = (CHAIN_V2, CHAIN_V1)
"""Every chain format, newest first (the order a stream's first event is tried in)."""
CURRENT = FORMATS[0]
"""The format new streams are written in."""
CHAIN_VERSION = CURRENT.version
assert tuple(sorted(f.number for f in FORMATS)) == CHAIN_NUMBERS
assert all(r.before == "payload" for r in RETIRED)  # where ``canonical_row`` writes them


def chain_format(version: Any) -> ChainFormat | None:
    """The format of a version string (``auditlog-chain-v1``), None for anything else."""
    return next((f for f in FORMATS if f.version == version), None)


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


def genesis_hash(run_id: str, stream: int, chain: ChainFormat = CURRENT) -> str:
    """The hash the first event of a stream chains from (in the format ``chain``)."""
    return chain.genesis(run_id, stream)


def _int_or_null(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def row_prefix(run_id: str, stream: int) -> str:
    """The start of every canonical row of one stream, in every format (computed once per writer)."""
    return f"[{encode_basestring_ascii(run_id)},{int(stream)},"


def canonical_row(
    row: dict[str, Any], prefix: str | None = None, chain: ChainFormat = CURRENT
) -> bytes:
    """The bytes that are hashed for one stored event of a stream of format ``chain``.

    Byte-for-byte the compact, ASCII-escaped JSON array described above (what
    ``json.dumps(..., separators=(",", ":"), ensure_ascii=True)`` gives, which
    ``canonical_row_reference`` keeps as the definition), assembled directly: the
    same C escaping function for the strings, ``str`` for the integers. That is
    several times faster (docs/performance.md), and it is paid once per event.
    A v1 row's ``snapshot`` is the row's own when it has one (an archive written
    before revision 0005), else NULL, the value every stored row held.
    """
    if prefix is None:
        prefix = row_prefix(row["run_id"], row["stream"])
    retired = ""
    for name in chain.retired:  # v1: ``snapshot``, just before the payload
        held = row.get(name)
        retired += "null," if held is None else f"{encode_basestring_ascii(held)},"
    return (
        f"{prefix}{int(row['seq'])},"
        f"{int(row['ts_ns'])},{encode_basestring_ascii(row['kind'])},{_int_or_null(row['step'])},"
        f"{_int_or_null(row['module_id'])},{_int_or_null(row['tensor_id'])},{retired}"
        f"{_escaped(row['payload'])}]"
    ).encode("ascii")


def _escaped(text: str) -> str:
    """``encode_basestring_ascii(text)``; for ASCII text without DEL (what payloads
    almost always are) orjson writes the same escapes faster."""
    if text.isascii() and "\x7f" not in text:
        return orjson.dumps(text).decode("ascii")
    return str(encode_basestring_ascii(text))


def canonical_row_reference(row: dict[str, Any], chain: ChainFormat = CURRENT) -> bytes:
    """The definition of ``canonical_row`` (slower; tests check they agree in every format)."""
    held = {**dict.fromkeys(chain.retired), **row}
    return json.dumps(
        [held[name] for name in chain.columns],
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()


def chain_hash(
    prev_hash: str, row: dict[str, Any], prefix: str | None = None, chain: ChainFormat = CURRENT
) -> str:
    """Hash of one event given the hash of the event before it in its stream
    (``prefix``: ``row_prefix`` of the row's stream, when the caller has it)."""
    return link_hash(prev_hash, canonical_row(row, prefix, chain))


def link_hash(prev_hash: str, row_bytes: bytes) -> str:
    """``chain_hash`` from the canonical row already encoded (the Merkle leaf uses the same bytes)."""
    digest = hashlib.sha256(prev_hash.encode())
    digest.update(b"\n")
    digest.update(row_bytes)
    return digest.hexdigest()


def first_event_format(row: dict[str, Any]) -> ChainFormat | None:
    """The format of the stream whose seq 1 event is ``row`` (as stored, with its hash):
    the one whose genesis hash and canonical row give its stored hash, or None (the
    event was edited, its hash too, or it is not a seq 1 event)."""
    stored = row.get("hash")
    if row.get("seq") != 1 or not isinstance(stored, str):
        return None
    for chain in FORMATS:
        try:
            computed = chain_hash(chain.genesis(row["run_id"], row["stream"]), row, chain=chain)
        except (TypeError, ValueError, KeyError, AttributeError):
            return None  # garbled: no format can be told from it
        if computed == stored:
            return chain
    return None


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
    chain: ChainFormat = CURRENT,
) -> tuple[dict[str, Any], bytes]:
    """A stored event row (every column but the autoincrement ``id``) with its chain hash
    in the stream's format ``chain``, and the canonical row bytes (the stream's Merkle
    tree hashes the same bytes as its leaf).

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
        "payload": payload,
    }
    encoded = canonical_row(row, prefix, chain)
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
