"""Per-parameter vectors packed as float32: ``{"f32": BASE64, "absent": [i, ...]}``.

An ``optimizer_step`` of a model with thousands of parameter tensors carries
thousands of norms per vector. As a JSON list each number is a Python float
built, walked and printed on every step (measured: the bulk of the recorder's
per-step cost at 5,000 tensors). Packed, a vector is one ``bytes`` object:

- ``f32``: the standard base64 (RFC 4648, with padding) of the values as
  little-endian IEEE-754 float32, one per parameter, in ``tensor_ids`` order.
  The norms are computed in float32, so this loses nothing: each decodes to the
  same double the list form held. NaN and infinities are stored as their bits.
- ``absent`` (only when some are): the ascending positions whose value is
  missing (a parameter without a gradient); their slots hold 0.0 and decode to
  ``None``.

Decoders accept the list form too (records written before, and payloads with
no vector to pack). The read model decodes the same bytes in SQL
(``auditlog.store.readmodel.tables``) into the same view columns.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from auditlog.core.values import finite_or_text

PACKED_KEY = "f32"
ABSENT_KEY = "absent"


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


def unpack_list(value: Any) -> Any:
    """A packed vector as the list form (floats, non-finite ones as text, None where
    absent); anything else is returned as it is (the list form already, or None)."""
    if not is_packed(value):
        return value
    out: list[Any] = [v if v - v == 0.0 else finite_or_text(v) for v in unpack_floats(value)]
    for i in value.get(ABSENT_KEY) or ():
        out[int(i)] = None
    return out
