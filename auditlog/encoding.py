"""Canonical encoding of events and the per-stream SHA-256 hash chain.

An event's hash covers every stored column except the autoincrement ``id``:
``sha256(prev_hash_hex || "\\n" || canonical_row)`` where ``canonical_row`` is the
compact JSON array ``[run_id, stream, seq, ts_ns, kind, step, module_id,
tensor_id, snapshot, payload]`` and ``payload`` is the stored payload text
verbatim. Verification therefore needs no knowledge of payload structure: any
change to any byte of a stored event changes its hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

CHAIN_VERSION = "auditlog-chain-v1"


def genesis_hash(run_id: str, stream: int) -> str:
    """The hash the first event of a stream chains from."""
    return hashlib.sha256(f"{CHAIN_VERSION}:{run_id}:{stream}".encode()).hexdigest()


def canonical_row(row: dict[str, Any]) -> bytes:
    """The bytes that are hashed for one stored event."""
    return json.dumps(
        [
            row["run_id"],
            row["stream"],
            row["seq"],
            row["ts_ns"],
            row["kind"],
            row["step"],
            row["module_id"],
            row["tensor_id"],
            row["snapshot"],
            row["payload"],
        ],
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()


def chain_hash(prev_hash: str, row: dict[str, Any]) -> str:
    """Hash of one event given the hash of the event before it in its stream."""
    digest = hashlib.sha256(prev_hash.encode())
    digest.update(b"\n")
    digest.update(canonical_row(row))
    return digest.hexdigest()


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
