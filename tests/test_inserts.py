"""The events INSERT per pattern of NULLs (``store/inserts.py``): what is stored is what was
appended, row for row and in order, whichever columns were NULL."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from auditlog.core.eventrow import STORED_COLUMNS
from auditlog.store.eventstore import EventStore
from auditlog.store.inserts import Inserts, insert_statement


def _row(seq: int, **nulls: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": "a" * 32,
        "stream": 0,
        "seq": seq,
        "ts_ns": 1_700_000_000_000_000_000 + seq,
        "kind": "annotation",
        "step": seq // 3,
        "module_id": seq + 100,
        "tensor_id": seq + 200,
        "payload": f'{{"n":{seq}}}',
        "hash": f"{seq:064x}",
    }
    row.update(nulls)
    return row


def _mixed_rows() -> list[dict[str, Any]]:
    """Runs of rows with the same NULLs, patterns alternating, and every nullable column NULL
    somewhere (``step`` included)."""
    rows = []
    for seq in range(1, 41):
        nulls: dict[str, Any] = {}
        if seq % 5 in (1, 2):
            nulls.update(module_id=None, tensor_id=None)
        elif seq % 5 == 3:
            nulls.update(tensor_id=None)
        if seq % 7 == 0:
            nulls.update(step=None)
        if seq == 40:
            nulls.update(step=None, module_id=None, tensor_id=None)
        rows.append(_row(seq, **nulls))
    return rows


def test_a_batch_with_nulls_is_stored_row_for_row_in_order(tmp_path: Path) -> None:
    opened = EventStore.open(str(tmp_path / "store"), create=True)
    database = opened.location.database
    assert database is not None
    rows = _mixed_rows()
    try:
        opened.append(rows[:25], "a" * 32, heartbeat=False)
        opened.append(rows[25:], "a" * 32, heartbeat=False)
    finally:
        opened.close()
    with sqlite3.connect(database) as conn:
        stored = conn.execute(
            f"SELECT id, {', '.join(STORED_COLUMNS)} FROM events ORDER BY id"
        ).fetchall()
    assert [r[0] for r in stored] == list(range(1, 41))  # insertion order: seq order
    assert [dict(zip(STORED_COLUMNS, r[1:], strict=True)) for r in stored] == rows
    assert sum(r[STORED_COLUMNS.index("module_id") + 1] is None for r in stored) == 17


def test_nulls_are_left_out_of_the_statement_and_runs_keep_their_order() -> None:
    rows = _mixed_rows()[:6]  # patterns: none-none, none-none, tensor null, full, full, none-none
    batches = list(Inserts("qmark").batches(rows))
    assert [len(values) for _, values in batches] == [2, 1, 2, 1]
    first_sql, first_values = batches[0]
    assert "module_id" not in first_sql and "tensor_id" not in first_sql
    assert first_sql.count("?") == len(STORED_COLUMNS) - 2 == len(first_values[0])
    assert None not in first_values[0]
    full_sql, full_values = batches[2]
    assert full_sql == insert_statement("qmark")
    assert [v[STORED_COLUMNS.index("seq")] for v in full_values] == [4, 5]
    assert batches[3][0] == first_sql  # the statement of a pattern is made once
    assert insert_statement("format", ["seq", "kind"]).endswith("(seq, kind) VALUES (%s, %s)")
    assert insert_statement("numeric", ["seq", "kind"]).endswith("VALUES (:1, :2)")
