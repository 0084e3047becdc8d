"""The inline chain check (``StreamCheck.feed``) reaches the verdicts of the general one.

``feed`` checks ordinary rows in a tight loop and hands anything else to
``StreamCheck.one``; here every row is also checked by ``one`` alone, and the
two must agree on every problem, the tree head and the tip. Agreement alone would
pass if both missed a damage, so each damaged stream must also be reported as the
finding it is, and the fast encoder must give the bytes of its JSON definition.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from auditlog.core.chain import canonical_payload, chained_row, genesis_hash
from auditlog.core.eventrow import HASHED_COLUMNS
from auditlog.integrity.chaincheck import StreamCheck
from auditlog.integrity.report import VerifyReport
from auditlog.store.queries import TUPLE_COLUMNS

RUN = "c" * 32


def _stream(payloads: list[Any], **overrides: Any) -> list[tuple[Any, ...]]:
    prev = genesis_hash(RUN, 0)
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
        )
        if index % 5 == 0:
            row["snapshot"] = "ab" * 32  # not chained with it: reported as a mismatch by both paths
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


def test_ordinary_rows_take_the_inline_path() -> None:
    rows = _stream([{"world_size": 1}] + [{"x": i} for i in range(30)] + [{"status": "completed"}])
    check = _Counting(RUN, 0, VerifyReport(RUN))
    check.feed(rows)
    # run_started, run_ended and the 6 rows whose snapshot column was set unchained: the rest inline
    assert check.calls == 8
    assert not check.report.problems and len(check.mismatched) == 6


def test_intact_and_awkward_rows_agree() -> None:
    rows = _stream(PAYLOADS)
    _same(*_both(rows, frozenset({3, 7, 10})))
    fast, _ = _both(rows)
    assert [r["seq"] for r in fast.mismatched] == [5, 10]


UNCHAINED = frozenset(
    {5, 10, 15, 20, 25, 30}
)  # seqs whose snapshot column ``_stream`` set unchained

# What each damage must be reported as: problems (seq, what), hash mismatches beyond
# the unchained snapshot columns, and events found after run_ended.
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


def test_an_intact_stream_has_no_finding_beyond_the_unchained_columns() -> None:
    fast, slow = _both(_stream(PAYLOADS * 3), frozenset({12, 20}))
    assert _found(fast) == _found(slow) == ([], [], [])
    assert {r["seq"] for r in fast.mismatched} == UNCHAINED


@pytest.mark.parametrize("damage", sorted(FOUND))
def test_each_damage_is_found_and_both_paths_agree(damage: str) -> None:
    rows = [list(r) for r in _stream(PAYLOADS * 3)]
    if damage == "edit":
        edited = rows[16][8].replace("plain", "plan")
        assert edited != rows[16][8]  # the damage is real
        rows[16][8] = edited
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


@pytest.mark.parametrize(
    "text", ["plain", 'q"uote', "back\\slash", "nl\n tab\t cr\r", "\x00\x01\x1f\x1b", "/slash", ""]
)
def test_inline_encoding_is_the_canonical_row(text: str) -> None:
    from auditlog.core.chain import canonical_row, canonical_row_reference

    for snapshot in (None, text):
        row = {
            "run_id": RUN,
            "stream": 3,
            "seq": 7,
            "ts_ns": -5,
            "kind": text or "k",
            "step": None,
            "module_id": 2**63 - 1,
            "tensor_id": 0,
            "snapshot": snapshot,
            "payload": text,
        }
        fast, slow = _Counting(RUN, 3, VerifyReport(RUN)), StreamCheck(RUN, 3, VerifyReport(RUN))
        prev = genesis_hash(RUN, 3)
        first, _ = chained_row(prev, RUN, 3, 1, 1, "run_started", None, None, None, "{}")
        stored, _ = chained_row(
            first["hash"], RUN, 3, 2, row["ts_ns"], row["kind"], None, row["module_id"], 0, text
        )
        stored["snapshot"] = snapshot
        stored["hash"] = _relinked(first["hash"], stored)
        for encoded in (row, stored):  # the fast encoder writes the bytes its definition gives
            assert canonical_row(encoded) == canonical_row_reference(encoded)
            assert json.loads(canonical_row(encoded)) == [encoded[c] for c in HASHED_COLUMNS]
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


def _relinked(prev: str, row: dict[str, Any]) -> str:
    from auditlog.core.chain import chain_hash

    return chain_hash(prev, row)
