"""The DuckDB read model (``auditlog.store.readmodel.cache``): answers, incremental refresh, rebuilds.

Runs are recorded in-process into a real store. Every view's answer is checked
against the same question asked in plain SQL (SQLite's own ``json_each``) of the
SQLite file, so the projection's flattening, the non-finite statistics and the
names from replay are all tested against the record itself.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
import torch
from helpers import load_example, query_session
from torch import nn

import auditlog
from auditlog.core.packed import is_packed, unpack_list
from auditlog.core.values import stat_float
from auditlog.read.runs import list_runs
from auditlog.store.eventstore import EventStore
from auditlog.store.readmodel import arrowcopy
from auditlog.store.readmodel.cache import PROJECTION_FILE, ReadModel
from auditlog.store.readmodel.querysession import QuerySession
from auditlog.store.readmodel.vectors import VECTORS
from auditlog.store.readmodel.views import VIEWS


class Recorded:
    def __init__(self, store: Path, mlp_id: str, nan_id: str) -> None:
        self.store = store
        self.mlp_id = mlp_id
        self.nan_id = nan_id

    def sqlite(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.store / 'events.db'}?mode=ro", uri=True)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    store = tmp_path_factory.mktemp("readmodel") / "store"
    mlp = load_example("train_mlp")
    with auditlog.record(store, name="mlp", argv=["train_mlp.py", "--epochs", "1"]) as first:
        mlp.main(["--epochs", "1"])
    torch.manual_seed(0)
    with auditlog.record(store, name="nan", argv=["nan.py"]) as second:
        model = nn.Sequential(nn.Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        x = torch.tensor([[1.0, float("nan"), 0.0], [float("inf"), 1.0, 2.0]])
        model(x).sum().backward()
        opt.step()
    assert first.run_id is not None and second.run_id is not None
    return Recorded(store, first.run_id, second.run_id)


@pytest.fixture
def session(rec: Recorded) -> Iterator[QuerySession]:
    with query_session(rec.store) as opened:
        yield opened


def rows(session: QuerySession, sql: str) -> list[tuple[Any, ...]]:
    return list(session.execute(sql).rows)


def same(a: float | None, b: float | None) -> bool:
    """Equal numbers, NaN equal to NaN (the record keeps non-finite values)."""
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == pytest.approx(b, rel=1e-12)


# --------------------------------------------------------------------------- answers equal plain SQL
def test_event_counts_equal_sqlite(rec: Recorded, session: QuerySession) -> None:
    got = rows(session, "select run_id, kind, count(*) from events group by all order by all")
    want = rec.sqlite("select run_id, kind, count(*) from events group by 1, 2 order by 1, 2")
    assert got == want
    assert rows(session, "select max(id), count(*) from events") == rec.sqlite(
        "select max(id), count(*) from events"
    )


def test_forward_stats_equal_sqlite_json(rec: Recorded, session: QuerySession) -> None:
    got = rows(
        session,
        "select run_id, seq, call, module_id, output, norm, mean, std, min, max, nan, inf, numel "
        "from forward_stats order by run_id, seq, call, output",
    )
    # the activity event's forward calls, expanded: one row per call and output tensor
    want = rec.sqlite(
        "select e.run_id, e.seq, c.key, json_extract(c.value, '$.module_id'), o.key, "
        "json_extract(o.value, '$.norm'), json_extract(o.value, '$.mean'), "
        "json_extract(o.value, '$.std'), json_extract(o.value, '$.min'), json_extract(o.value, '$.max'), "
        "json_extract(o.value, '$.nan'), json_extract(o.value, '$.inf'), json_extract(o.value, '$.numel') "
        "from events e, json_each(e.payload, '$.forward') c, json_each(c.value, '$.outputs') o "
        "where e.kind = 'activity' order by e.run_id, e.seq, c.key, o.key"
    )
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert g[:5] == w[:5]
        assert all(same(a, float(b)) for a, b in zip(g[5:10], w[5:10], strict=True)), (g, w)
        assert g[10:] == w[10:]


def test_non_finite_statistics_become_nan_and_inf(rec: Recorded, session: QuerySession) -> None:
    """Stored as the JSON strings "NaN"/"Infinity"; the views hold real NaN/inf doubles."""
    stored = rec.sqlite(
        "select count(*) from events e, json_each(e.payload, '$.forward') c, json_each(c.value, '$.outputs') o "
        "where e.run_id = ? and e.kind = 'activity' and json_extract(o.value, '$.norm') = 'NaN'",
        rec.nan_id,
    )[0][0]
    assert stored > 0
    nan_rows = rows(
        session,
        f"select norm, nan, inf from forward_stats where run_id = '{rec.nan_id}' and isnan(norm)",
    )
    assert len(nan_rows) == stored
    assert all(nan >= 1 for _, nan, _ in nan_rows)
    typed = rows(session, "select typeof(norm), typeof(nan) from forward_stats limit 1")
    assert typed == [("DOUBLE", "BIGINT")]


def test_backward_stats_equal_sqlite_json(rec: Recorded, session: QuerySession) -> None:
    got = rows(
        session,
        "select module_id, count(*), max(grad_norm), sum(numel) from backward_stats "
        f"where run_id = '{rec.mlp_id}' and direction = 'output' group by 1 order by 1",
    )
    want = rec.sqlite(
        "select json_extract(c.value, '$.module_id'), count(*), max(json_extract(g.value, '$.norm')), "
        "sum(json_extract(g.value, '$.numel')) from events e, json_each(e.payload, '$.backward') c, "
        "json_each(c.value, '$.grad_outputs') g "
        "where e.run_id = ? and e.kind = 'activity' and g.type = 'object' group by 1 order by 1",
        rec.mlp_id,
    )
    assert len(got) == len(want) > 5
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0] and g[1] == w[1] and g[3] == w[3]
        assert same(g[2], w[2])


def test_steps_equal_sqlite_json(rec: Recorded, session: QuerySession) -> None:
    got = rows(
        session,
        "select step, param_index, tensor_id, grad_norm, update_norm, param_norm, lr, weight_decay, "
        f"raw_grad_norm, grads_modified from steps where run_id = '{rec.mlp_id}' order by step, param_index",
    )
    # The vectors are stored packed (core.packed): decoded here by the standard
    # library's array module, in DuckDB from numpy (readmodel/vectors.py).
    want = []
    for step, text in rec.sqlite(
        "select step, payload from events where run_id = ? and kind = 'optimizer_step' order by step",
        rec.mlp_id,
    ):
        p = json.loads(text)
        assert is_packed(p["grad_norm"]) and (
            p["update_norm"] is None or is_packed(p["update_norm"])
        )
        p["tensor_ids"] = unpack_list(p["tensor_ids"])  # packed (core.packed)
        grads, updates, params = (
            unpack_list(p[k]) or [None] * len(p["tensor_ids"]) for k in VECTORS[:3]
        )
        assert (
            p["grads_modified"] is False and p.get("raw_grad_norm") is None
        )  # a plain loop: raw is used
        group = p["param_groups"][0]
        for i, tensor_id in enumerate(p["tensor_ids"]):
            want.append(
                (
                    step,
                    i,
                    tensor_id,
                    stat_float(grads[i]),
                    stat_float(updates[i]),
                    stat_float(params[i]),
                    group["lr"],
                    group["weight_decay"],
                    stat_float(grads[i]),
                    False,
                )
            )
    assert len(got) == len(want) == 8 * 14  # 8 steps x 14 parameters, one param group
    # default norms_every=10: update and parameter norms on the first step only
    assert {g[0] for g in got if g[4] is not None and g[5] is not None} == {1}
    for g, w in zip(got, want, strict=True):
        assert g[:3] == w[:3]
        assert all(same(a, b) for a, b in zip(g[3:], w[3:], strict=True)), (g, w)
    assert all(g[9] is False for g in got)
    momentum = rows(
        session, f"select distinct momentum, lr from steps where run_id = '{rec.nan_id}'"
    )
    assert momentum == [(0.9, 0.5)]
    assert rows(session, f"select distinct momentum from steps where run_id = '{rec.mlp_id}'") == [
        (None,)
    ]


def test_names_from_replay_equal_the_live_model(rec: Recorded, session: QuerySession) -> None:
    live = load_example("train_mlp").build_model()
    parameters = rows(
        session,
        f"select parameter, shape from parameters where run_id = '{rec.mlp_id}' order by tensor_id",
    )
    assert sorted(p for p, _ in parameters) == sorted(n for n, _ in live.named_parameters())
    assert {p: s for p, s in parameters} == {n: list(t.shape) for n, t in live.named_parameters()}
    modules = rows(session, f"select module, class_name from modules where run_id = '{rec.mlp_id}'")
    expected = {n or "(MLP)": type(m).__name__ for n, m in live.named_modules()}
    assert {m: c for m, c in modules if m != "(CrossEntropyLoss)"} == expected
    # events and statistics carry the same names
    forward = rows(
        session,
        f"select distinct module from forward_stats where run_id = '{rec.mlp_id}' and module like 'body.%'",
    )
    assert {m for (m,) in forward} == {f"body.{i}" for i in range(9)}
    tensors = rows(
        session,
        f"select tensor from events where run_id = '{rec.mlp_id}' and kind = 'parameter_registered'",
    )
    assert sorted(t for (t,) in tensors) == sorted(n for n, _ in live.named_parameters())
    top = rows(
        session,
        f"select parameter, module from steps where run_id = '{rec.mlp_id}' and step = 1 "
        "order by grad_norm desc limit 1",
    )
    assert top[0][0].startswith(top[0][1] + ".")


def test_runs_view_equals_list_runs(rec: Recorded, session: QuerySession) -> None:
    with auditlog.open(rec.store) as s:
        infos = {i.run_id: i for i in list_runs(s.event_store)}
    got = rows(
        session,
        "select run_id, name, status, steps, events, argv, exit_code from runs order by started",
    )
    assert [r[0] for r in got] == [rec.mlp_id, rec.nan_id]
    for run_id, name, status, steps, events, argv, exit_code in got:
        info = infos[run_id]
        assert (name, status, steps, events, argv, exit_code) == (
            info.name,
            info.status,
            info.steps,
            info.events,
            info.argv,
            info.exit_code,
        )


def test_every_view_has_its_documented_columns(session: QuerySession) -> None:
    for view in VIEWS:
        described = rows(session, f"describe {view.name}")
        assert [(r[0], r[1]) for r in described] == [(c.name, c.type) for c in view.columns], (
            view.name
        )


# --------------------------------------------------------------------------- refresh
def record_tiny(store: Path, name: str, steps: int = 1) -> str:
    torch.manual_seed(0)
    with auditlog.record(store, name=name, argv=[f"{name}.py"]) as rec:
        model = nn.Sequential(nn.Linear(2, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
    assert rec.run_id is not None
    return rec.run_id


def test_refresh_copies_only_new_events(store: Path) -> None:
    first = record_tiny(store, "first")
    event_store = EventStore.open(store)
    try:
        model = ReadModel(event_store)
        assert model.path == store / PROJECTION_FILE
        built = model.refresh()
        total = arrowcopy.max_event_id(event_store)
        assert built.rebuilt and built.copied == total > 0
        assert model.refresh().copied == 0
        assert model.is_fresh()

        # Edit an old event behind the projection's back: an incremental refresh
        # never reads it again, so the projection keeps what it copied.
        conn = sqlite3.connect(store / "events.db")
        with conn:
            conn.execute(
                "update events set payload = json_set(payload, '$.argv', json('[\"edited.py\"]')) "
                "where kind = 'run_started'"
            )
        conn.close()
        second = record_tiny(store, "second", steps=2)
        assert not model.is_fresh()
        newest = arrowcopy.max_event_id(event_store)
        again = model.refresh()
        assert not again.rebuilt
        assert again.copied == newest - total
        assert again.last_id == newest
    finally:
        event_store.close()

    event_store = EventStore.open(store)
    try:
        with QuerySession(ReadModel(event_store)) as session:
            assert rows(session, "select count(*), count(distinct id) from events") == [
                (newest, newest)
            ]
            argv = dict(rows(session, "select run_id, argv from runs"))
            assert argv == {first: ["first.py"], second: ["second.py"]}
            names = rows(
                session, f"select parameter from parameters where run_id = '{second}' order by 1"
            )
            assert names == [("0.bias",), ("0.weight",)]
            assert rows(session, f"select max(step) from steps where run_id = '{second}'") == [(2,)]
    finally:
        event_store.close()


def test_corrupt_or_foreign_projection_is_rebuilt(store: Path) -> None:
    record_tiny(store, "only")
    event_store = EventStore.open(store)
    try:
        model = ReadModel(event_store)
        model.refresh()
        model.path.write_bytes(b"not a duckdb file at all" * 100)
        report = model.refresh()
        assert report.rebuilt and "unreadable" in (report.reason or "")
        assert report.copied == arrowcopy.max_event_id(event_store)

        con = duckdb.connect(str(model.path))
        con.execute("update projection.meta set value = 'other-store' where key = 'store_id'")
        con.close()
        report = model.refresh()
        assert report.rebuilt and report.reason == "projection was made from another store"

        con = duckdb.connect(str(model.path))
        con.execute("update projection.meta set value = '0' where key = 'format'")
        con.close()
        assert not model.is_fresh()
        assert model.refresh().rebuilt
        assert model.is_fresh()
    finally:
        event_store.close()


def test_refuses_to_overwrite_a_file_that_is_not_a_projection(store: Path, tmp_path: Path) -> None:
    record_tiny(store, "only")
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    event_store = EventStore.open(store)
    try:
        with pytest.raises(auditlog.AuditlogError, match="not an auditlog read model"):
            ReadModel(event_store, precious).refresh()
    finally:
        event_store.close()
    assert precious.read_text() == "keep me"


def test_sqlite_copies_through_adbc_and_the_sqlalchemy_path_reads_the_same(
    rec: Recorded, tmp_path: Path
) -> None:
    """SQLite has one path to Arrow (ADBC); the dialect-neutral path other databases use
    reads the same rows, types and NULLs from the same store."""
    event_store = EventStore.open(rec.store)
    try:
        assert arrowcopy.copy_method(event_store) == "adbc"
        report = ReadModel(event_store, tmp_path / "rm.duckdb").refresh()
        assert report.method == "adbc"
        upto = arrowcopy.max_event_id(event_store)
        adbc = pa.Table.from_batches(
            list(arrowcopy.event_batches(event_store, 0, upto)), arrowcopy.EVENT_SCHEMA
        )
        neutral = pa.Table.from_batches(
            list(arrowcopy.sqlalchemy_batches(event_store, 0, upto)), arrowcopy.EVENT_SCHEMA
        )
    finally:
        event_store.close()
    assert adbc.num_rows == upto > 0
    assert adbc.equals(neutral)
    for name in ("module_id", "tensor_id"):  # nullable columns keep their NULLs
        assert adbc.column(name).null_count == neutral.column(name).null_count > 0


def test_progress_reports_every_event(store: Path) -> None:
    record_tiny(store, "only", steps=3)
    calls: list[tuple[int, int]] = []
    event_store = EventStore.open(store)
    try:
        ReadModel(event_store).refresh(progress=lambda done, total: calls.append((done, total)))
        total = arrowcopy.max_event_id(event_store)
    finally:
        event_store.close()
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_projection_location(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_tiny(store, "only")
    for spec in (str(store), f"sqlite:///{store / 'events.db'}"):
        event_store = EventStore.open(spec)
        try:
            assert ReadModel(event_store).path == store / PROJECTION_FILE, spec
        finally:
            event_store.close()
    monkeypatch.setenv("AUDITLOG_READMODEL", str(tmp_path / "elsewhere.duckdb"))
    event_store = EventStore.open(store)
    try:
        model = ReadModel(event_store)
        assert model.path == tmp_path / "elsewhere.duckdb"
        assert model.refresh().copied > 0 and model.path.is_file()
    finally:
        event_store.close()


def test_chunked_refresh_relabels_rows_copied_before_a_name_changed(
    rec: Recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Linear's parameters register before the Linear is attached to its parent:
    when a chunk ends in between, its rows are labelled as a root's, and the next
    chunk must rewrite them. Tiny chunks must give the one-shot answer."""
    event_store = EventStore.open(rec.store)
    try:
        ReadModel(event_store, tmp_path / "whole.duckdb").refresh()
        monkeypatch.setattr("auditlog.store.readmodel.cache.CHUNK_ROWS", 3)
        report = ReadModel(event_store, tmp_path / "chunked.duckdb").refresh()
        assert report.streams_replayed > 2
    finally:
        event_store.close()
    answers = []
    for name in ("whole", "chunked"):
        con = duckdb.connect(str(tmp_path / f"{name}.duckdb"), read_only=True)
        answers.append(
            [
                con.execute(
                    "select id, module, tensor from projection.events order by id"
                ).fetchall(),
                con.execute(
                    "select run_id, seq, output, module from projection.forward_stats order by all"
                ).fetchall(),
                con.execute(
                    "select run_id, seq, direction, index, module from projection.backward_stats order by all"
                ).fetchall(),
                con.execute(
                    "select run_id, seq, param_index, parameter, module from projection.steps order by all"
                ).fetchall(),
            ]
        )
        con.close()
    whole, chunked = answers
    assert whole == chunked
    assert ("0.weight" in {t for _, _, t in whole[0]}) or (
        "body.0.weight" in {t for _, _, t in whole[0]}
    )
