"""Every event the read model copies is checked against the chain before it is kept (issue 29).

The read model answers from copies of events. Copied by ``id`` alone, a copy
could differ from the chained event: someone edits a payload in ``events.db``
(hash column untouched), lets one ``query`` build the read model, then puts
``events.db`` back byte for byte; every chain head is as before, so the seal
holds and the cache would go on answering the edited values while ``verify``
passes. So each copied row's link is recomputed here, exactly as ``verify``
does: ``sha256(prev_hash || "\\n" || canonical_row)`` (``auditlog.core.chain``)
must equal its stored hash, where ``prev_hash`` is the stored hash of the event
just before it in its stream (in the same chunk, or the stream's last event
already in the read model, or the stream's genesis hash for seq 1), and its seq
must be the next one. The canonical row and genesis are the stream's chain
format's (``core.chain``): the one its seq 1 event links under, kept with the
stream's head (``Heads``), so every later event is checked in that format alone.
A row that fails is never stored: the refresh refuses, naming the event
(``IntegrityError``, exit 4, as ``verify``'s verdict on it).

Together with the seal (``trust``: the chain head of every stream the read
model holds, as stored in the event store, under an HMAC) this binds the read
model's content to the chain: its rows of a stream are exactly the events whose
recomputed hashes chain from the genesis hash to the sealed head, and that head
must still be on the store's chain before any answer. A read model whose rows
differ from the chained events therefore cannot exist without a SHA-256
collision: it is refused when built, or rebuilt when the head moved.

The loop is ``verify``'s inline check (``integrity.chaincheck.StreamCheck.feed``)
without the Merkle leaf: orjson writes the canonical row of a row whose text is
plain ASCII (all but a few events), ``canonical_row`` the rest; rows are turned
into Python values a slice at a time, never a whole chunk.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pyarrow as pa

from auditlog.core.chain import (
    CHAIN_V1,
    CURRENT,
    ChainFormat,
    canonical_row,
    first_event_format,
    link_hash,
    row_prefix,
)
from auditlog.core.errors import CorruptRecordError, IntegrityError
from auditlog.core.eventrow import ALL_COLUMNS
from auditlog.core.payloadlimits import event_label, limit_error, limit_problem

SLICE_ROWS = 8192

Heads = dict[tuple[str, int], tuple[int, str, ChainFormat]]
"""``(run_id, stream) -> (seq, stored hash, chain format)`` of the last event of each stream
checked so far, and the stream's format."""
_NULL = (None,)  # a chain-v1 row's ``snapshot``

_COLUMNS = ALL_COLUMNS  # the order the loop below unpacks (core.eventrow)


def _plain(text: Any) -> bool:
    """ASCII without DEL: orjson escapes such text exactly as ``canonical_row`` does."""
    return text is None or (text.isascii() and "\x7f" not in text)


def held_heads(heads: list[tuple[Any, ...]], firsts: list[tuple[Any, ...]]) -> Heads:
    """``Heads`` of the streams a read model holds, from its rows: ``(run_id, stream, seq,
    hash)`` of each stream's last event and each stream's first event (``ALL_COLUMNS``), whose
    chain format it links under (checked when it was copied) is the stream's."""
    formats = {
        (str(row[1]), int(row[2])): first_event_format(dict(zip(_COLUMNS, row, strict=True)))
        for row in firsts
    }
    return {
        (str(r), int(s)): (int(q), str(h), formats.get((str(r), int(s))) or CURRENT)
        for r, s, q, h in heads
    }


def check_links(table: pa.Table, heads: Heads, shown: str = "") -> None:
    """Raise ``IntegrityError`` naming the first event of ``table`` (in id order) whose
    stored hash is not its recomputed link from the event before it; ``heads`` is
    advanced past every event checked (it is the caller's running state)."""
    sha256 = hashlib.sha256
    dumps = orjson.dumps
    prefixes: dict[tuple[str, int], bytes] = {}
    for offset in range(0, table.num_rows, SLICE_ROWS):
        part = table.slice(offset, SLICE_ROWS)
        columns = [part.column(name).to_pylist() for name in _COLUMNS]
        for eid, run_id, stream, seq, ts, kind, step, mid, tid, payload, stored in zip(
            *columns, strict=True
        ):
            key = (run_id, stream)
            head = heads.get(key)
            found: ChainFormat | None
            if head is None:  # the stream's first event fixes its chain format
                found = (
                    first_event_format(
                        _row(run_id, stream, seq, ts, kind, step, mid, tid, payload, stored)
                    )
                    if seq == 1
                    else None
                )
                chain = found or CURRENT
                prev_seq, prev = 0, chain.genesis(run_id, stream)
            else:
                prev_seq, prev, chain = head
                found = chain
            if seq != prev_seq + 1:
                _refuse(
                    shown,
                    eid,
                    run_id,
                    stream,
                    seq,
                    kind,
                    f" follows seq {prev_seq} of its stream (events deleted, inserted or reordered)",
                )
            prefix = prefixes.get(key)
            if prefix is None:
                prefix = prefixes[key] = row_prefix(run_id, stream).encode("ascii")
            if found is None:
                computed = ""  # a first event linking under no format (or no seq 1): refused below
            elif _plain(kind) and _plain(payload):
                values = (seq, ts, kind, step, mid, tid)
                values += (*_NULL, payload) if chain is CHAIN_V1 else (payload,)
                computed = sha256(
                    b"%s\n%s%s" % (prev.encode(), prefix, dumps(values)[1:])
                ).hexdigest()
            else:
                row = _row(run_id, stream, seq, ts, kind, step, mid, tid, payload, stored)
                computed = link_hash(prev, canonical_row(row, chain=chain))
            if computed != stored:
                _refuse(
                    shown,
                    eid,
                    run_id,
                    stream,
                    seq,
                    kind,
                    ": its content does not match its recorded hash (the event or its hash was modified)",
                )
            _check_limits(
                payload,
                shown,
                {"id": eid, "run_id": run_id, "stream": stream, "seq": seq, "kind": kind},
            )
            heads[key] = (seq, stored, chain)


def _row(
    run_id: Any,
    stream: Any,
    seq: Any,
    ts: Any,
    kind: Any,
    step: Any,
    mid: Any,
    tid: Any,
    payload: Any,
    stored: Any,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "stream": stream,
        "seq": seq,
        "ts_ns": ts,
        "kind": kind,
        "step": step,
        "module_id": mid,
        "tensor_id": tid,
        "payload": payload,
        "hash": stored,
    }


def _check_limits(payload: Any, shown: str, event: dict[str, Any]) -> None:
    """A payload past the size or depth limit is never copied: DuckDB would parse it
    (and every Python reader after it), so the refresh refuses it by name (exit 4)."""
    if not isinstance(payload, str):
        return
    try:
        problem = limit_problem(payload)
    except (
        ValueError
    ) as exc:  # its quotes or brackets do not pair: malformed, as readers say (exit 3)
        raise CorruptRecordError(
            f"{event_label(event, shown)}: its payload is not JSON ({exc}); run `auditlog verify`"
        ) from None
    if problem is not None:
        raise limit_error(problem, event, shown)


def _refuse(shown: str, eid: int, run_id: str, stream: int, seq: int, kind: str, why: str) -> None:
    where = f" in store {shown!r}" if shown else ""
    raise IntegrityError(
        f"record altered: event id {eid}{where} (run {run_id[:12]!r} stream {stream} seq {seq}, "
        f"kind {kind!r}){why}; the read model answers only from events that match the chain "
        "(run `auditlog verify`)"
    )
