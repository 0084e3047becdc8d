"""``readmodel.links``: the read model's check of every copied row against the chain.

The rows are chained with the *reference* encoder (``canonical_row_reference``,
the definition of the canonical row), so the check's fast orjson path and its
fallback are both held to the definition, on text of every awkward kind, in
every chain format (a stream's first event fixes its format).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from auditlog.core.chain import (
    CHAIN_V1,
    CHAIN_V2,
    CURRENT,
    FORMATS,
    ChainFormat,
    canonical_row_reference,
    link_hash,
)
from auditlog.core.errors import IntegrityError
from auditlog.store.readmodel.arrowcopy import EVENT_SCHEMA
from auditlog.store.readmodel.links import SLICE_ROWS, Heads, check_links, held_heads

AWKWARD = [
    '{"a":1}',
    '{"q":"say \\"hi\\""}',
    "back\\slash",
    "tab\there",
    "new\nline",
    "del\x7f",
    "caf\u00e9",
    "\u2028sep",
    "emoji \U0001f600",
    "nul\x00",
    "",
    "</script>",
    "esc\x1b[31m",
]


def chained(
    run_id: str,
    stream: int,
    payloads: list[str],
    first_id: int = 1,
    start: tuple[int, str] | None = None,
    chain: ChainFormat = CURRENT,
) -> list[dict[str, Any]]:
    seq, prev = start if start is not None else (0, chain.genesis(run_id, stream))
    rows = []
    for i, payload in enumerate(payloads):
        seq += 1
        row: dict[str, Any] = {
            "run_id": run_id,
            "stream": stream,
            "seq": seq,
            "ts_ns": 1_700_000_000_000_000_000 + i,
            "kind": "annotation" if i % 3 else "k\u00efnd\x7f",
            "step": None if i % 2 else i,
            "module_id": None if i % 4 else 2**62,
            "tensor_id": -i,
            "payload": payload,
        }
        row["hash"] = prev = link_hash(prev, canonical_row_reference(row, chain))
        row["id"] = first_id + i
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)


@pytest.mark.parametrize("chain", FORMATS)
def test_rows_chained_by_the_reference_encoder_pass_and_advance_the_heads(
    chain: ChainFormat,
) -> None:
    a = chained("a" * 32, 0, AWKWARD * 3, chain=chain)
    b = chained("b" * 32, 1, list(reversed(AWKWARD)), first_id=100, chain=CHAIN_V1)
    heads: Heads = {}
    check_links(table(sorted(a + b, key=lambda r: r["id"])), heads)
    assert heads == {
        ("a" * 32, 0): (len(a), a[-1]["hash"], chain),
        ("b" * 32, 1): (len(b), b[-1]["hash"], CHAIN_V1),
    }
    more = chained("a" * 32, 0, ["next"], first_id=200, start=heads[("a" * 32, 0)][:2], chain=chain)
    check_links(table(more), heads)  # continues from the head a previous chunk left
    assert heads[("a" * 32, 0)] == (len(a) + 1, more[0]["hash"], chain)


@pytest.mark.parametrize("chain", FORMATS)
def test_an_event_of_the_other_format_is_refused(chain: ChainFormat) -> None:
    """A stream's format is its first event's: an event appended in the other format (its
    link correct there) is refused, in the same chunk and in a later one."""
    other = CHAIN_V1 if chain is CHAIN_V2 else CHAIN_V2
    rows = chained("f" * 32, 0, ["a", "b"], chain=chain)
    extra = chained("f" * 32, 0, ["c"], first_id=3, start=(2, rows[-1]["hash"]), chain=other)
    with pytest.raises(IntegrityError, match=r"event id 3 .* seq 3, .*does not match"):
        check_links(table(rows + extra), {})
    heads: Heads = {}
    check_links(table(rows), heads)
    with pytest.raises(IntegrityError, match=r"event id 3 .* seq 3, .*does not match"):
        check_links(table(extra), heads)


def test_a_first_event_of_no_format_is_refused() -> None:
    rows = chained("f" * 32, 0, ["a", "b"])
    rows[0]["hash"] = link_hash("0" * 64, canonical_row_reference(rows[0]))
    with pytest.raises(IntegrityError, match=r"event id 1 .* seq 1, .*does not match"):
        check_links(table(rows), {})


def test_held_streams_keep_the_format_of_their_first_event() -> None:
    a = chained("a" * 32, 0, ["x", "y", "z"], chain=CHAIN_V1)
    b = chained("b" * 32, 0, ["x"], first_id=10)
    columns = EVENT_SCHEMA.names
    firsts = [tuple(r[c] for c in columns) for r in (a[0], b[0])]
    heads = held_heads([("a" * 32, 0, 3, a[-1]["hash"]), ("b" * 32, 0, 1, b[0]["hash"])], firsts)
    assert heads == {
        ("a" * 32, 0): (3, a[-1]["hash"], CHAIN_V1),
        ("b" * 32, 0): (1, b[0]["hash"], CHAIN_V2),
    }


@pytest.mark.parametrize("index", range(len(AWKWARD)))
def test_any_edited_payload_is_refused_by_id(index: int) -> None:
    rows = chained("c" * 32, 0, AWKWARD)
    rows[index]["payload"] += " "
    with pytest.raises(
        IntegrityError,
        match=rf"^record altered: event id {index + 1} \(run 'cccccccccccc' "
        rf"stream 0 seq {index + 1}, kind .*\): its content does not match",
    ):
        check_links(table(rows), {})


def test_a_hash_chained_from_the_wrong_head_is_refused() -> None:
    rows = chained("d" * 32, 0, ["x", "y"], start=(4, "0" * 64))
    with pytest.raises(
        IntegrityError, match=r"event id 1 .* seq 5, .* follows seq 0 of its stream"
    ):
        check_links(
            table(rows), {}
        )  # the read model holds nothing of this stream: seq 5 follows nothing
    with pytest.raises(IntegrityError, match=r"event id 1 .* seq 5, .*its content does not match"):
        check_links(table(rows), {("d" * 32, 0): (4, "1" * 64, CURRENT)})  # seq follows, hash not
    check_links(table(rows), {("d" * 32, 0): (4, "0" * 64, CURRENT)})


def test_a_chunk_larger_than_a_slice_is_checked_across_slices() -> None:
    rows = chained("e" * 32, 0, [f'{{"i":{i}}}' for i in range(SLICE_ROWS + 5)])
    check_links(table(rows), {})
    rows[SLICE_ROWS + 2]["payload"] = '{"i":0}'
    with pytest.raises(IntegrityError, match=f"event id {SLICE_ROWS + 3} "):
        check_links(table(rows), {})
