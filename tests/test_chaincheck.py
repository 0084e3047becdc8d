"""The inline chain check (``StreamCheck.feed``) reaches the verdicts of the general one.

``feed`` checks ordinary rows in a tight loop and hands anything else to
``StreamCheck.one``; here every row is also checked by ``one`` alone, and the
two must agree on every problem, the tree head and the tip. Agreement alone would
pass if both missed a damage, so each damaged stream must also be reported as the
finding it is, and the fast encoder must give the bytes of its JSON definition.
Every test runs on a stream of each chain format (``core.chain``): its first
event fixes it, and every fifth event of ``_stream`` is hashed in the other
format (formats never mix in a stream: both paths report each as a mismatch).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from auditlog.core.chain import (
    CHAIN_V1,
    CHAIN_V2,
    FORMATS,
    ChainFormat,
    canonical_payload,
    chained_row,
)
from auditlog.integrity.chaincheck import StreamCheck
from auditlog.integrity.findings import VerifyReport
from auditlog.store.queries import TUPLE_COLUMNS

RUN = "c" * 32


def _other(chain: ChainFormat) -> ChainFormat:
    return CHAIN_V1 if chain is CHAIN_V2 else CHAIN_V2


def _stream(payloads: list[Any], chain: ChainFormat) -> list[tuple[Any, ...]]:
    prev = chain.genesis(RUN, 0)
    rows = []
    for index, payload in enumerate(payloads, start=1):
        kind = (
            "run_started"
            if index == 1
            else ("run_ended" if index == len(payloads) else "annotation")
        )
        row, _ = chained_row(
            prev,
            RUN,
            0,
            index,
            1000 + index,
            kind,
            index // 2 or None,
            index if index % 3 else None,
            7 if index % 4 == 0 else None,
            canonical_payload(payload),
            # every fifth in the other format: a mismatch, reported by both paths
            chain=_other(chain) if index % 5 == 0 else chain,
        )
        prev = row["hash"]
        row["id"] = index * 2
        rows.append(tuple(row[c] for c in TUPLE_COLUMNS))
    return rows


PAYLOADS = [
    {"world_size": 1},
    {"text": 'quote " backslash \\ newline \n tab \t'},
    {"ctl": "\x00\x01\x1f"},
    {"unicode": "héllo 名前 \u2028"},
    {"del": "a\x7fb"},
    {"n": [1.5, -2, None, True]},
    {"x": "plain"},
    {"y": "plain"},
    {"z": "plain"},
    {"status": "completed"},
]


def _both(
    rows: list[tuple[Any, ...]], sizes: frozenset[int] = frozenset()
) -> tuple[StreamCheck, StreamCheck]:
    fast, slow = (
        StreamCheck(RUN, 0, VerifyReport(RUN), sizes),
        StreamCheck(RUN, 0, VerifyReport(RUN), sizes),
    )
    fast.feed(rows[:4])
    fast.feed(rows[4:])
    for row in rows:
        slow.one(slow._row(row))
    return fast, slow


def _same(fast: StreamCheck, slow: StreamCheck) -> None:
    assert fast.report.problems == slow.report.problems
    assert [r["seq"] for r in fast.mismatched] == [r["seq"] for r in slow.mismatched]
    assert fast.tree.root() == slow.tree.root() and fast.tree.size == slow.tree.size
    assert fast.tip == slow.tip
    assert (fast.count, fast.expected, fast.prev, fast.last_id) == (
        slow.count,
        slow.expected,
        slow.prev,
        slow.last_id,
    )


class _Counting(StreamCheck):
    calls = 0

    def one(self, row: dict[str, Any]) -> None:
        self.calls += 1
        super().one(row)


@pytest.mark.parametrize("chain", FORMATS)
def test_ordinary_rows_take_the_inline_path(chain: ChainFormat) -> None:
    rows = _stream(
        [{"world_size": 1}] + [{"x": i} for i in range(30)] + [{"status": "completed"}], chain
    )
    check = _Counting(RUN, 0, VerifyReport(RUN))
    check.feed(rows)
    # run_started, run_ended and the 6 rows hashed in the other format: the rest inline
    assert check.calls == 8 and check.chain is chain
    assert not check.report.problems and len(check.mismatched) == 6


@pytest.mark.parametrize("chain", FORMATS)
def test_intact_and_awkward_rows_agree(chain: ChainFormat) -> None:
    rows = _stream(PAYLOADS, chain)
    _same(*_both(rows, frozenset({3, 7, 10})))
    fast, _ = _both(rows)
    assert [r["seq"] for r in fast.mismatched] == [5, 10]


UNCHAINED = frozenset({5, 10, 15, 20, 25, 30})  # seqs ``_stream`` hashed in the other format

# What each damage must be reported as: problems (seq, what), hash mismatches beyond
# the rows hashed in the other format, and events found after run_ended.
FOUND: dict[str, tuple[list[tuple[int, str]], list[int], list[int]]] = {
    "edit": ([], [17], []),
    "delete": ([(14, "seqs 14..16 missing (events deleted)")], [], []),
    "duplicate": ([(14, "duplicate sequence number (event inserted)")], [], []),
    "swap": (
        [
            (12, "seq 12 missing (events deleted)"),
            (12, "duplicate sequence number (event inserted)"),
        ],
        [],
        [],
    ),
    "garble": ([(18, "event is garbled: column ts_ns holds str 'soon'")], [], []),
    "reorder_ids": ([(21, "stored out of order (events reordered)")], [], []),
    "after_end": ([], [], list(range(11, 31))),
}


def _found(check: StreamCheck) -> tuple[list[tuple[int, str]], list[int], list[int]]:
    return (
        [(p.seq, p.what) for p in check.report.problems],
        [r["seq"] for r in check.mismatched if r["seq"] not in UNCHAINED],
        [r["seq"] for r in check.after_end],
    )


@pytest.mark.parametrize("chain", FORMATS)
def test_an_intact_stream_has_no_finding_beyond_the_other_formats_rows(chain: ChainFormat) -> None:
    fast, slow = _both(_stream(PAYLOADS * 3, chain), frozenset({12, 20}))
    assert _found(fast) == _found(slow) == ([], [], [])
    assert {r["seq"] for r in fast.mismatched} == UNCHAINED
    assert fast.chain is slow.chain is chain


PAYLOAD = TUPLE_COLUMNS.index("payload")


@pytest.mark.parametrize("chain", FORMATS)
@pytest.mark.parametrize("damage", sorted(FOUND))
def test_each_damage_is_found_and_both_paths_agree(damage: str, chain: ChainFormat) -> None:
    rows = [list(r) for r in _stream(PAYLOADS * 3, chain)]
    if damage == "edit":
        edited = rows[16][PAYLOAD].replace("plain", "plan")
        assert edited != rows[16][PAYLOAD]  # the damage is real
        rows[16][PAYLOAD] = edited
    elif damage == "delete":
        del rows[13:16]
    elif damage == "duplicate":
        rows.insert(14, list(rows[13]))
    elif damage == "swap":
        rows[11], rows[12] = rows[12], rows[11]
    elif damage == "garble":
        rows[17][2] = "soon"
    elif damage == "reorder_ids":
        rows[20][0] = 1
    elif damage == "after_end":
        rows[9][3] = "run_ended"
    fast, slow = _both([tuple(r) for r in rows], frozenset({12, 20}))
    _same(fast, slow)
    assert _found(fast) == FOUND[damage]


@pytest.mark.parametrize("chain", FORMATS)
def test_a_first_event_that_matches_no_format_leaves_it_to_the_next(chain: ChainFormat) -> None:
    """An edited first event is the stream's finding; the format is then the one its next
    event links under, so the rest is checked as always (nothing else reported)."""
    rows = [list(r) for r in _stream([{"world_size": 1}] + [{"x": i} for i in range(8)], chain)]
    rows[0][PAYLOAD] = rows[0][PAYLOAD].replace("1", "2")
    fast, slow = _both([tuple(r) for r in rows])
    _same(fast, slow)
    assert [r["seq"] for r in fast.mismatched] == [1, 5]  # the edit, and seq 5 (other format)
    assert fast.chain is chain


@pytest.mark.parametrize("chain", FORMATS)
def test_a_first_event_whose_hash_was_edited_is_reported_once(chain: ChainFormat) -> None:
    rows = [list(r) for r in _stream([{"world_size": 1}] + [{"x": i} for i in range(3)], chain)]
    rows[0][-1] = "0" * 64
    fast, slow = _both([tuple(r) for r in rows])
    _same(fast, slow)
    assert [r["seq"] for r in fast.mismatched] == [1] and fast.chain is chain


@pytest.mark.parametrize("chain", FORMATS)
def test_a_given_format_is_the_streams(chain: ChainFormat) -> None:
    """The parallel check's child is given the format: rows of the other are mismatches."""
    rows = _stream([{"world_size": 1}] + [{"x": i} for i in range(3)], chain)
    wrong = StreamCheck(RUN, 0, VerifyReport(RUN), chain=_other(chain))
    wrong.feed(rows)
    assert [r["seq"] for r in wrong.mismatched] == [1, 2, 3, 4]


@pytest.mark.parametrize("chain", FORMATS)
@pytest.mark.parametrize(
    "text", ["plain", 'q"uote', "back\\slash", "nl\n tab\t cr\r", "\x00\x01\x1f\x1b", "/slash", ""]
)
def test_inline_encoding_is_the_canonical_row(text: str, chain: ChainFormat) -> None:
    from auditlog.core.chain import canonical_row, canonical_row_reference

    row = {
        "run_id": RUN,
        "stream": 3,
        "seq": 7,
        "ts_ns": -5,
        "kind": text or "k",
        "step": None,
        "module_id": 2**63 - 1,
        "tensor_id": 0,
        "payload": text,
    }
    # a v1 row of an archive written before revision 0005 holds its ``snapshot``
    for encoded in (row, {**row, "snapshot": None}, {**row, "snapshot": text}):
        assert canonical_row(encoded, chain=chain) == canonical_row_reference(encoded, chain)
        held = {"snapshot": None, **encoded}
        assert json.loads(canonical_row(encoded, chain=chain)) == [held[c] for c in chain.columns]
    fast, slow = _Counting(RUN, 3, VerifyReport(RUN)), StreamCheck(RUN, 3, VerifyReport(RUN))
    first, _ = chained_row(
        chain.genesis(RUN, 3), RUN, 3, 1, 1, "run_started", None, None, None, "{}", chain=chain
    )
    stored, _ = chained_row(
        first["hash"],
        RUN,
        3,
        2,
        row["ts_ns"],
        row["kind"],
        None,
        row["module_id"],
        0,
        text,
        chain=chain,
    )
    rows = [
        tuple({**first, "id": 1}[c] for c in TUPLE_COLUMNS),
        tuple({**stored, "id": 2}[c] for c in TUPLE_COLUMNS),
    ]
    fast.feed(rows)
    for r in rows:
        slow.one(slow._row(r))
    assert not fast.mismatched and not slow.mismatched
    assert fast.calls == 1  # run_started only: the event itself was checked inline
    assert fast.tree.root() == slow.tree.root()
    assert fast.chain is slow.chain is chain
