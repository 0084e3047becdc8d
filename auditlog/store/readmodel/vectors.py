"""Packed per-parameter vectors of ``optimizer_step`` events, decoded for the ``steps`` table.

The recorder stores each vector (``grad_norm``, ``update_norm``, ``param_norm``)
as base64 of little-endian float32 (``auditlog.core.packed``). DuckDB has no
way to reinterpret bytes as floats, and decoding them with string functions is
quadratic (its ``substr`` counts characters from the start, so a long vector
costs more per value: docs/performance.md). So the refresh decodes them here with numpy
(a ``frombuffer`` per vector) into the Arrow table ``new_vectors`` (``id`` and
one ``DOUBLE[]`` per vector, absent positions NULL), which the ``steps``
derivation joins; list-form payloads (older records) are read there as before.
The packed tensor ids (``tensor_ids`` and each param group's ``params``, int16,
int32 or int64) are decoded here the same way, into ``tensor_ids BIGINT[]`` and
``group_params BIGINT[][]`` (one entry per param group, NULL where a group
holds the list form).
"""

from __future__ import annotations

import base64
from typing import Any, cast

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from auditlog.core.packed import NORM_VECTORS, packed_ints_key

VECTORS = NORM_VECTORS

SCHEMA = pa.schema(
    [("id", pa.int64())]
    + [(name, pa.list_(pa.float64())) for name in VECTORS]
    + [("tensor_ids", pa.list_(pa.int64())), ("group_params", pa.list_(pa.list_(pa.int64())))]
)
_INT_DTYPES = {"i16": "<i2", "i32": "<i4", "i64": "<i8"}
_MARKERS = ('"f32"', '"i16"', '"i32"', '"i64"')


def decode(value: Any) -> np.ndarray | None:
    """A packed vector as float64 values (NaN where absent, masked by the caller); None otherwise."""
    if not isinstance(value, dict) or not isinstance(value.get("f32"), str):
        return None
    data = np.frombuffer(base64.b64decode(value["f32"], validate=True), dtype="<f4").astype(
        np.float64
    )
    return data


def decode_ids(value: Any) -> np.ndarray | None:
    """A packed integer list as int64 values; None when ``value`` is not one or is damaged
    (the SQL then reads the list form, or NULL)."""
    key = packed_ints_key(value)
    if key is None:
        return None
    try:
        raw = base64.b64decode(value[key], validate=True)
        return np.frombuffer(raw, dtype=_INT_DTYPES[key]).astype(np.int64)
    except ValueError:  # binascii.Error, and a length that is not whole values
        return None


def new_vectors(table: pa.Table) -> pa.Table:
    """``id``, the decoded vectors and tensor ids of the chunk's ``optimizer_step``
    events whose payload packs some (events with none packed are left out: the SQL
    reads their lists)."""
    steps = table.filter(pc.equal(table["kind"], "optimizer_step"))
    ids: list[int] = []
    columns: dict[str, list[pa.Array | None]] = {name: [] for name in VECTORS}
    tensor_ids: list[np.ndarray | None] = []
    group_params: list[list[np.ndarray | None] | None] = []
    for event_id, text in zip(steps["id"].to_pylist(), steps["payload"].to_pylist(), strict=True):
        if not isinstance(text, str) or not any(marker in text for marker in _MARKERS):
            continue
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue  # a damaged payload: the SQL derivation reads what it can, as for any event
        ids.append(int(event_id))
        payload = payload if isinstance(payload, dict) else {}
        tensor_ids.append(decode_ids(payload.get("tensor_ids")))
        groups = payload.get("param_groups")
        group_params.append(
            [decode_ids(g.get("params")) if isinstance(g, dict) else None for g in groups]
            if isinstance(groups, list)
            else None
        )
        for name in VECTORS:
            value = payload.get(name)
            try:
                values = decode(value)
            except (ValueError, TypeError):
                values = None
            if values is None or not isinstance(value, dict):
                columns[name].append(None)
                continue
            mask = np.zeros(len(values), dtype=bool)
            try:
                absent = [int(i) for i in value.get("absent") or () if 0 <= int(i) < len(values)]
            except (ValueError, TypeError):
                absent = []
            mask[absent] = True
            columns[name].append(pa.array(values, type=pa.float64(), mask=mask if absent else None))
    arrays: list[pa.Array] = [pa.array(ids, type=pa.int64())]
    for name in VECTORS:
        arrays.append(_lists(columns[name]))
    arrays.append(pa.array(tensor_ids, type=pa.list_(pa.int64())))
    arrays.append(pa.array(cast(list[Any], group_params), type=pa.list_(pa.list_(pa.int64()))))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _lists(items: list[pa.Array | None]) -> pa.Array:
    """One ``DOUBLE[]`` array from per-row value arrays (None: a NULL list)."""
    offsets = [0]
    valid: list[bool] = []
    for item in items:
        offsets.append(offsets[-1] + (len(item) if item is not None else 0))
        valid.append(item is not None)
    values = [item for item in items if item is not None]
    flat = pa.concat_arrays(values) if values else pa.array([], type=pa.float64())
    mask = pa.array([not v for v in valid], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), flat, mask=mask)
