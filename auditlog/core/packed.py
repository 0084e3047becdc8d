"""Per-parameter vectors packed as float32: ``{"f32": BASE64, "absent": [i, ...]}``.

An ``optimizer_step`` of a model with thousands of parameter tensors carries
thousands of norms per vector. As a JSON list each number is a Python float
built, walked and printed on every step: the bulk of the recorder's per-step
cost for a model of thousands of tensors (docs/performance.md). Packed, a vector
is one ``bytes`` object:

- ``f32``: the standard base64 (RFC 4648, with padding) of the values as
  little-endian IEEE-754 float32, one per parameter, in ``tensor_ids`` order.
  The norms are computed in float32, so this loses nothing: each decodes to the
  same double the list form held. NaN and infinities are stored as their bits.
- ``absent`` (only when some are): the ascending positions whose value is
  missing (a parameter without a gradient); their slots hold 0.0 and decode to
  ``None``.

The tensor ids of the step (``tensor_ids`` and each param group's ``params``)
are packed the same way, ``{"i16": BASE64}``: the standard base64 of the ids as
little-endian int16, in order, when all fit in int16 (a model of fewer than
~32,000 tensors), else ``{"i32": ...}`` (int32) or ``{"i64": ...}`` (int64),
the narrowest that holds every id. The recorder packs them once per optimizer (they change only
when its parameters do), so a step costs one string per list, not an int per
parameter to encode and hash.

Decoders accept the list form too (records written before, and payloads with
no vector to pack). The read model decodes the same bytes with numpy
(``auditlog.store.readmodel.vectors``) into the same view columns.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from auditlog.core.kinds import KINDS
from auditlog.core.values import finite_or_text

PACKED_KEY = "f32"
ABSENT_KEY = "absent"
# Packed integer lists: key -> (array typecode of that width, bytes per value).
INT_KEYS = {"i16": ("h", 2), "i32": ("i", 4), "i64": ("q", 8)}


NORM_VECTORS = KINDS["optimizer_step"].packed("f32")
"""The per-parameter vectors of an ``optimizer_step`` payload, stored packed (``pack_f32``):
its fields of type ``F32`` in ``core.kinds`` (grad_norm, update_norm, param_norm, raw_grad_norm)."""


def pack_f32(data: bytes, absent: Sequence[int] = ()) -> dict[str, Any]:
    """The packed form of a vector given as little-endian float32 bytes; ``absent``:
    positions with no value (their slots should hold 0.0)."""
    packed: dict[str, Any] = {PACKED_KEY: base64.b64encode(data).decode("ascii")}
    if len(absent):
        packed[ABSENT_KEY] = [int(i) for i in absent]
    return packed


def is_packed(value: Any) -> bool:
    """Whether a payload value is a packed vector (a dict with ``f32``)."""
    return isinstance(value, dict) and isinstance(value.get(PACKED_KEY), str)


def unpack_floats(value: dict[str, Any]) -> list[float]:
    """The values of a packed vector as Python floats (absent slots included).

    The standard library only (``array``): read commands start without numpy.
    Raises ``ValueError`` on text that is not base64 of whole float32 values.
    """
    raw = base64.b64decode(value[PACKED_KEY], validate=True)
    if len(raw) % 4:
        raise ValueError(f"packed float32 vector of {len(raw)} bytes")
    values = array("f", raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def pack_ints(values: Sequence[int]) -> dict[str, Any]:
    """The packed form of a list of integers (tensor ids): the narrowest of int16,
    int32 and int64 that holds them all."""
    ints = [int(v) for v in values]
    low, high = (min(ints), max(ints)) if ints else (0, 0)
    key = next(
        k
        for k, (_, width) in INT_KEYS.items()
        if -(2 ** (8 * width - 1)) <= low and high < 2 ** (8 * width - 1)
    )
    data = array(INT_KEYS[key][0], ints)
    if data.itemsize != INT_KEYS[key][1]:  # a platform whose C int/long long differ: be exact
        raise ValueError(f"array typecode {INT_KEYS[key][0]!r} is {data.itemsize} bytes here")
    if sys.byteorder == "big":
        data.byteswap()
    return {key: base64.b64encode(data.tobytes()).decode("ascii")}


def packed_ints_key(value: Any) -> str | None:
    """``"i16"``, ``"i32"`` or ``"i64"`` when a payload value is a packed integer list, else None."""
    if isinstance(value, dict) and len(value) == 1:
        for key in INT_KEYS:
            if isinstance(value.get(key), str):
                return key
    return None


def unpack_ints(value: dict[str, Any]) -> list[int]:
    """The integers of a packed integer list; raises ``ValueError`` on text that is
    not base64 of whole values of its width."""
    key = packed_ints_key(value)
    if key is None:
        raise ValueError("not a packed integer list")
    code, width = INT_KEYS[key]
    raw = base64.b64decode(value[key], validate=True)
    if len(raw) % width:
        raise ValueError(f"packed {key} list of {len(raw)} bytes")
    values = array(code, raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def packed_count(value: Any) -> int:
    """How many entries a list, a packed vector or a packed integer list holds
    (from the base64 length: nothing decoded); 0 for anything else."""
    if isinstance(value, list):
        return len(value)
    key = PACKED_KEY if is_packed(value) else packed_ints_key(value)
    if key is None:
        return 0
    width = 4 if key == PACKED_KEY else INT_KEYS[key][1]
    text = value[key]
    return (len(text) // 4 * 3 - len(text[-2:]) + len(text[-2:].rstrip("="))) // width


def unpack_list(value: Any) -> Any:
    """A packed vector as the list form (floats, non-finite ones as text, None where
    absent), a packed integer list as its list of ints; anything else is returned
    as it is (the list form already, or None)."""
    if packed_ints_key(value) is not None:
        return unpack_ints(value)
    if not is_packed(value):
        return value
    out: list[Any] = [v if v - v == 0.0 else finite_or_text(v) for v in unpack_floats(value)]
    for i in value.get(ABSENT_KEY) or ():
        out[int(i)] = None
    return out
