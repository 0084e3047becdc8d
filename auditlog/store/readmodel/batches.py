"""Packed ``batches`` events decoded for the ``batches`` table: one row per batch.

A ``batches`` event (``capture/data.py``) packs per batch the optimizer steps
completed when it left the loader (``steps``), the number of its indices
(``sizes``) and every batch's indices concatenated (``indices``), each as base64
of little-endian int16/int32/int64 (``core.packed``). DuckDB cannot reinterpret
bytes as integers, so the refresh decodes them here with numpy (one
``frombuffer`` per list, as ``vectors.py`` does for the norm vectors) into the
Arrow table ``new_batches``: event ``id``, ``position`` in the event, ``after_step``,
``size``, ``indices BIGINT[]`` (NULL for iterable datasets and for batches whose
indices were not integers), ``no_grad`` and ``hash`` (an iterable dataset's batch:
its content hash, NULL when not hashed; a ``hashes`` list of another length than
the batches, or an entry that is no SHA-256 hex, gives NULL: ``verify`` says what
was altered). An event whose lists are damaged or
disagree (sizes that do not add up to the indices) yields no rows: ``verify``
is the place that says what was altered.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from auditlog.store.readmodel.vectors import decode_ids

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("position", pa.int32()),
        ("after_step", pa.int64()),
        ("size", pa.int64()),
        ("indices", pa.list_(pa.int64())),
        ("no_grad", pa.bool_()),
        ("hash", pa.string()),
    ]
)
_HASH = re.compile("[0-9a-f]{64}")


def _hashes(value: Any, count: int) -> list[str | None]:
    if not isinstance(value, list) or len(value) != count:
        return [None] * count
    return [h if isinstance(h, str) and _HASH.fullmatch(h) else None for h in value]


def _positions(value: Any, count: int) -> set[int]:
    if not isinstance(value, list):
        return set()
    return {int(i) for i in value if isinstance(i, int) and 0 <= i < count}


def new_batches(table: pa.Table) -> pa.Table:
    """One row per batch of the chunk's ``batches`` events (numpy per event, no loop per index)."""
    events = table.filter(pc.equal(table["kind"], "batches"))
    ids: list[np.ndarray] = []
    positions: list[np.ndarray] = []
    after: list[np.ndarray] = []
    sizes_out: list[np.ndarray] = []
    flats: list[np.ndarray] = []
    valid: list[np.ndarray] = []
    no_grads: list[np.ndarray] = []
    hashes: list[str | None] = []
    for event_id, text in zip(events["id"].to_pylist(), events["payload"].to_pylist(), strict=True):
        try:
            payload = orjson.loads(text) if isinstance(text, str) else None
        except orjson.JSONDecodeError:
            continue
        if not isinstance(payload, dict):
            continue
        steps = decode_ids(payload.get("steps"))
        if steps is None:
            continue
        count = len(steps)
        sizes = decode_ids(payload.get("sizes"))
        flat = decode_ids(payload.get("indices"))
        if sizes is not None and (
            flat is None
            or len(sizes) != count
            or (sizes < 0).any()
            or int(sizes.sum()) != len(flat)
        ):
            continue
        has = np.zeros(count, dtype=bool) if sizes is None else np.ones(count, dtype=bool)
        has[sorted(_positions(payload.get("opaque"), count))] = False
        flag = np.zeros(count, dtype=bool)
        flag[sorted(_positions(payload.get("no_grad"), count))] = True
        ids.append(np.full(count, int(event_id), dtype=np.int64))
        positions.append(np.arange(count, dtype=np.int32))
        after.append(steps)
        sizes_out.append(sizes if sizes is not None else np.full(count, -1, dtype=np.int64))
        flats.append(flat if flat is not None else np.zeros(0, dtype=np.int64))
        valid.append(has)
        no_grads.append(flag)
        hashes += _hashes(payload.get("hashes"), count)

    def joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    size = joined(sizes_out, np.int64)
    lengths = np.where(size < 0, 0, size)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    mask = ~joined(valid, bool)
    indices = pa.LargeListArray.from_arrays(
        pa.array(offsets, type=pa.int64()),
        pa.array(joined(flats, np.int64), type=pa.int64()),
        mask=pa.array(mask, type=pa.bool_()),
    ).cast(pa.list_(pa.int64()))
    arrays = [
        pa.array(joined(ids, np.int64), type=pa.int64()),
        pa.array(joined(positions, np.int32), type=pa.int32()),
        pa.array(joined(after, np.int64), type=pa.int64()),
        pa.array(size, type=pa.int64(), mask=mask),
        indices,
        pa.array(joined(no_grads, bool), type=pa.bool_()),
        pa.array(hashes, type=pa.string()),
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
