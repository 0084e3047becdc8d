"""Decode stored event rows, refusing malformed ones with a clear error.

The store is a file someone may have edited. Every reader goes through
``decode_event`` so that a garbled row (text where a number belongs, a payload
that is not a JSON object) becomes one ``CorruptRecordError`` naming the event,
never a crash deep in replay or formatting. ``auditlog verify`` then says what
exactly was altered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from auditlog.core.errors import CorruptRecordError, PayloadLimitError
from auditlog.core.kinds import KINDS
from auditlog.core.packed import NORM_VECTORS, is_packed, packed_ints_key, unpack_ints, unpack_list
from auditlog.core.payloadlimits import parse_payload

_INT_COLUMNS = ("stream", "seq", "ts_ns")
_OPTIONAL_INT_COLUMNS = ("step", "module_id", "tensor_id")
# Per-parameter vectors of optimizer_step events, stored packed (``core.packed``).
_PACKED_VECTORS = NORM_VECTORS
# The packed integer lists of a ``batches`` event (``capture/data.py``): its ``INTS`` fields.
BATCH_LISTS = KINDS["batches"].packed("ints")


def decode_event(row: dict[str, Any], shown: str = "") -> dict[str, Any]:
    """A copy of ``row`` with the payload parsed; raises ``CorruptRecordError`` if malformed.

    Packed per-parameter vectors and tensor id lists of ``optimizer_step`` events,
    and the packed steps, sizes and indices of ``batches`` events, come back as the lists they
    stand for (``core.packed``), so readers see one
    form whatever the record's age; ``verify`` hashes the stored text, never this.
    A payload past the size or depth limit (``core.payloadlimits``) raises
    ``PayloadLimitError`` (exit 4) naming the event, before it is parsed.
    """
    where = f"store {shown!r}: " if shown else ""

    def bad(what: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"{where}event id {row.get('id')} (seq {row.get('seq')!r}) is malformed: {what}; "
            "run `auditlog verify` to see what was altered"
        )

    event = dict(row)
    for column in _INT_COLUMNS:
        if not isinstance(event.get(column), int) or isinstance(event.get(column), bool):
            raise bad(f"{column} is {event.get(column)!r}, not an integer")
    for column in _OPTIONAL_INT_COLUMNS:
        value = event.get(column)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise bad(f"{column} is {value!r}, not an integer")
    if not isinstance(event.get("kind"), str) or not isinstance(event.get("run_id"), str):
        raise bad("kind or run_id is not text")
    payload = event.get("payload")
    if isinstance(payload, str):
        try:
            payload = parse_payload(payload, row, shown)
        except ValueError:
            raise bad("payload is not JSON") from None
    if not isinstance(payload, dict):
        raise bad("payload is not a JSON object")
    if event["kind"] == "optimizer_step":
        for name in _PACKED_VECTORS:
            value = payload.get(name)
            if is_packed(value):
                try:
                    payload[name] = unpack_list(value)
                except (ValueError, TypeError, IndexError):
                    raise bad(f"{name} is not a packed float32 vector") from None
        _unpack_ids(payload, bad)
    elif event["kind"] == "batches":
        for name in BATCH_LISTS:
            value = payload.get(name)
            if isinstance(value, dict) and packed_ints_key(value) is not None:
                try:
                    payload[name] = unpack_ints(value)
                except (ValueError, TypeError):
                    raise bad(f"{name} is not a packed integer list") from None
    event["payload"] = payload
    return event


def _unpack_ids(payload: dict[str, Any], bad: Callable[[str], CorruptRecordError]) -> None:
    """``tensor_ids`` and each param group's ``params``, packed, as lists of ints (in place)."""
    where: list[tuple[dict[str, Any], str, str]] = [(payload, "tensor_ids", "tensor_ids")]
    groups = payload.get("param_groups")
    if isinstance(groups, list):
        where += [
            (g, "params", f"param_groups[{i}].params")
            for i, g in enumerate(groups)
            if isinstance(g, dict)
        ]
    for holder, key, shown in where:
        value = holder.get(key)
        if isinstance(value, dict) and packed_ints_key(value) is not None:
            try:
                holder[key] = unpack_ints(value)
            except (ValueError, TypeError):
                raise bad(f"{shown} is not a packed integer list") from None


def payload_object(
    text: Any, event: Mapping[str, Any] | None = None, shown: str = "", *, strict: bool = True
) -> dict[str, Any]:
    """A payload as a dict, or {} when it is not a JSON object (summaries that tolerate damage).

    Past the size or depth limit it is no damage a summary can skip: that raises
    ``PayloadLimitError`` naming ``event`` (its row, when the caller has it);
    ``strict=False`` gives {} then too (``verify``, whose chain check names it).
    """
    try:
        value = parse_payload(text, event, shown) if isinstance(text, str) else text
    except PayloadLimitError:
        if strict:
            raise
        return {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
