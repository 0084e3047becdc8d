"""The read questions give the same answers through ``sqlite3`` and through SQLAlchemy.

Each question of ``EventQueries`` is one SQL text (``store/queries.py``); a SQLite
store runs it on the stdlib ``sqlite3`` module, other stores through a SQLAlchemy
engine (``store/sqlread.py``). This runs every question both ways on the same
real store, including one with rows a reader must tolerate, and checks the
column lists the questions name against the tables of ``schema.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import record_run, tamper

from auditlog.core.errors import StoreError, StoreUnavailableError
from auditlog.store import queries, schema
from auditlog.store.eventstore import EventStore
from auditlog.store.opening import make_engine
from auditlog.store.sqlread import EngineReads, SqliteReads, in_list


def test_column_lists_match_the_schema() -> None:
    assert tuple(c.name for c in schema.events.columns) == queries.EVENT_FIELDS
    assert tuple(c.name for c in schema.runs.columns) == queries.RUN_FIELDS
    assert tuple(c.name for c in schema.checkpoints.columns) == queries.CHECKPOINT_FIELDS
    assert tuple(c.name for c in schema.snapshot_blobs.columns) == queries.BLOB_FIELDS
    assert set(queries.TUPLE_COLUMNS) <= set(queries.EVENT_FIELDS)


def test_in_list_never_matches_when_empty() -> None:
    assert in_list("k", []) == ("(NULL)", {})
    assert in_list("k", ["a", "b"]) == ("(:k_0, :k_1)", {"k_0": "a", "k_1": "b"})


def _answers(store: EventStore, run_ids: list[str]) -> dict[str, Any]:
    """Every question of ``EventQueries`` asked of ``store``."""
    out: dict[str, Any] = {
        "meta": store.meta(),
        "run_rows": store.run_rows(),
        "recorded": store.recorded_run_ids(),
        "counts": store.run_event_counts(),
        "first": store.run_first_times(),
        "activity": store.last_activity_ns(),
        "started": store.events_of_kind("run_started"),
        "ended": store.ended_streams(),
        "checkpointed": store.checkpointed_run_ids(),
        "max_id": store.max_event_id(),
        "hash_1": store.event_hash(1),
        "hash_none": store.event_hash(10**9),
        "blobs": store.blob_rows(),
        "no_blobs": store.blob_rows([]),
    }
    hashes = sorted(out["blobs"])
    out["some_blobs"] = store.blob_rows([*hashes[:3], "../../etc/passwd"])
    out["among"] = store.blobs_among([*hashes[:2], "f" * 64])
    out["has_blob"] = [store.has_blob(h) for h in hashes[:2]] + [store.has_blob("0" * 64)]
    for run_id in run_ids:
        streams = store.streams(run_id)
        out[f"{run_id}:row"] = store.run_row(run_id)
        out[f"{run_id}:started"] = store.run_started_event(run_id)
        out[f"{run_id}:has_row"] = store.has_run_row(run_id)
        out[f"{run_id}:streams"] = streams
        out[f"{run_id}:stream_counts"] = sorted(store.stream_event_counts(run_id), key=repr)
        out[f"{run_id}:refs"] = store.snapshot_references(run_id)
        out[f"{run_id}:checkpoints"] = store.checkpoint_rows(run_id)
        out[f"{run_id}:all"] = list(store.iter_events(run_id, batch=7))
        out[f"{run_id}:filtered"] = list(
            store.iter_events(
                run_id,
                kinds=["optimizer_step", "run_ended"],
                stream=0,
                step_range=(1, 2),
                prev_hash=True,
            )
        )
        out[f"{run_id}:rare"] = list(store.iter_events(run_id, kinds=["run_started"], rare=True))
        out[f"{run_id}:count"] = store.count_events(run_id, ["optimizer_step"])
        for stream in streams:
            key = f"{run_id}:{stream}"
            out[f"{key}:head"] = store.chain_head(run_id, stream)
            out[f"{key}:last_seq"] = store.last_seq(run_id, stream)
            out[f"{key}:between"] = store.hashes_between(run_id, stream, 2, 5)
            out[f"{key}:tuples"] = [list(b) for b in store.event_tuples(run_id, stream, batch=5)]
            out[f"{key}:upto"] = [list(b) for b in store.event_tuples(run_id, stream, upto=4)]
            out[f"{key}:after"] = [list(b) for b in store.event_tuples(run_id, stream, after=4)]
            out[f"{key}:resume"] = [
                list(b) for b in store.event_tuples(run_id, stream, resume=(3, 3))
            ]
            out[f"{key}:max_step"] = store.max_step(run_id, stream)
            out[f"{key}:step_seq"] = store.step_seq(run_id, stream, 1)
            out[f"{key}:step_seqs"] = store.step_seqs(run_id, stream)
            out[f"{key}:from_step"] = store.first_seq_from_step(run_id, stream, 1)
            head = store.chain_head(run_id, stream)
            if head is not None:
                out[f"{key}:heads"] = store.stream_head_hashes(
                    [(run_id, stream, head[0]), (run_id, stream, 10**6)]
                )
    return out


def _through_engine(store: EventStore) -> EventStore:
    engine = make_engine(store.location)
    return EventStore(store.location, store.revision, engine=engine)


@pytest.fixture
def store_dir(tmp_path: Path) -> tuple[Path, list[str]]:
    store = tmp_path / "store"
    ids = [
        record_run(store, steps=3, name="a"),
        record_run(store, steps=2, name="b", snapshot_every=1),
    ]
    return store, ids


def test_sqlite3_and_sqlalchemy_give_the_same_answers(store_dir: tuple[Path, list[str]]) -> None:
    path, ids = store_dir
    store = EventStore.open(path)
    assert isinstance(store.reads, SqliteReads)
    engine_store = _through_engine(store)
    assert isinstance(engine_store.reads, EngineReads)
    try:
        fast, slow = _answers(store, ids), _answers(engine_store, ids)
        assert fast["started"] and fast["blobs"] and fast[f"{ids[0]}:filtered"]
        assert fast == slow
    finally:
        store.close()
        engine_store.close()


def test_garbled_rows_read_the_same_both_ways(store_dir: tuple[Path, list[str]]) -> None:
    """Rows an edit left with values of the wrong type come back as stored, both ways."""
    path, ids = store_dir
    with tamper(path) as conn:
        conn.execute(
            "UPDATE events SET stream = 'x', step = 'nine' WHERE run_id = ? AND seq = 3", (ids[0],)
        )
        conn.execute(
            "UPDATE events SET payload = ? WHERE run_id = ? AND seq = 4", (b"\x00blob", ids[0])
        )
        conn.execute("UPDATE runs SET pid = 'p' WHERE run_id = ?", (ids[1],))
    store = EventStore.open(path)
    engine_store = _through_engine(store)
    try:
        fast, slow = _answers(store, ids), _answers(engine_store, ids)
        assert any(row["stream"] == "x" for row in fast[f"{ids[0]}:all"])
        assert fast == slow
    finally:
        store.close()
        engine_store.close()


def test_driver_errors_become_the_same_store_errors(tmp_path: Path) -> None:
    """A text value that is not UTF-8: the same one-line error, the same class, both ways."""
    path = tmp_path / "store"
    run_id = record_run(path, steps=1)
    with tamper(path) as conn:
        conn.execute(
            "UPDATE events SET kind = CAST(? AS TEXT) WHERE run_id = ? AND seq = 1",
            (b"\xff\xfe", run_id),
        )
    store = EventStore.open(path)
    engine_store = _through_engine(store)
    messages = []
    try:
        for opened in (store, engine_store):
            with pytest.raises(StoreError) as caught:
                list(opened.iter_events(run_id))
            messages.append((type(caught.value), str(caught.value)))
    finally:
        store.close()
        engine_store.close()
    assert messages[0] == messages[1], messages
    assert messages[0][0] is StoreUnavailableError


def test_reading_a_sqlite_store_does_not_import_sqlalchemy(
    store_dir: tuple[Path, list[str]],
) -> None:
    import subprocess

    path, ids = store_dir
    probe = (
        "import json, sys\n"
        "from auditlog.read.api import open_store\n"
        f"with open_store({str(path)!r}) as s:\n"
        "    infos = s.runs()\n"
        f"    events = list(s.run({ids[0]!r}).events())\n"
        "    reports = s.verify('all')\n"
        "print(json.dumps([len(infos), len(events), all(r.ok for r in reports), 'sqlalchemy' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        2,
        len(list(EventStore.open(path).iter_events(ids[0]))),
        True,
        False,
    ]


def test_a_result_left_half_read_does_not_pin_later_questions(tmp_path: Path) -> None:
    """A result left half read (its iterator still alive) goes back to the pool without
    its read transaction: the next question on that connection sees later commits."""
    import sqlite3

    db = tmp_path / "t.db"
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x INTEGER)")
    writer.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    reads = SqliteReads(str(db))
    try:
        with reads.connection() as conn:
            _keys, parts = conn.batches("SELECT x FROM t", {}, 2)
            assert next(parts) == [(0,), (1,)]
        writer.execute("INSERT INTO t VALUES (10)")
        with reads.connection() as conn:  # the same pooled connection
            assert conn.rows("SELECT count(*) FROM t") == [(11,)]
        del parts
    finally:
        reads.close()
        writer.close()
