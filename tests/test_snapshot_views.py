"""The ``snapshots`` and ``tensor_values`` views, and the query session's file access.

Two small runs (one with a bfloat16 buffer, stored as raw bytes) are recorded
in-process with a snapshot every step. The views are checked against the Python
read API (``Run.events``, ``Run.state_dict``), and the session must read the
store's snapshot files and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import invoke, query_session, tree_digest
from torch import nn

import auditlog
from auditlog.store.eventstore import EventStore
from auditlog.store.readmodel.cache import ReadModel
from auditlog.store.readmodel.querysession import QueryError, QuerySession


class Recorded:
    def __init__(self, path: Path, first: str, second: str) -> None:
        self.path = path
        self.first = first
        self.second = second


def _train(store: Path, name: str, seed: int) -> str:
    torch.manual_seed(seed)
    with auditlog.record(store, name=name, argv=[f"{name}.py"], snapshot_every=1) as rec:
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        model[2].register_buffer("scale", torch.full((5,), 1.5, dtype=torch.bfloat16))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(6, 3)).pow(2).mean().backward()
            opt.step()
    assert rec.run_id is not None
    return rec.run_id


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    path = tmp_path_factory.mktemp("snapviews") / "store"
    return Recorded(path, _train(path, "first", 0), _train(path, "second", 1))


@pytest.fixture
def session(rec: Recorded) -> Iterator[QuerySession]:
    with query_session(rec.path) as opened:
        yield opened


def rows(session: QuerySession, sql: str) -> list[tuple[Any, ...]]:
    return list(session.execute(sql).rows)


def test_snapshots_view_equals_the_snapshot_events(rec: Recorded, session: QuerySession) -> None:
    with auditlog.open(rec.path) as store:
        run = store.run(rec.first)
        want = []
        for event in run.events(kinds=["construction_sealed", "snapshot_taken"]):
            payload = event["payload"]
            if event["kind"] == "construction_sealed":
                if not payload.get("stored"):
                    continue
                trigger, tag, items = "sealed", None, payload["tensors"]
            else:
                trigger, tag, items = (
                    payload["trigger"],
                    payload["tag"],
                    payload["snapshot"]["tensors"],
                )
            for item in items:
                want.append(
                    (event["seq"], event["step"], trigger, tag, item["tensor_id"], item["sha256"])
                )
        catalog = store.event_store.blob_rows()
    got = rows(
        session,
        f"select seq, step, trigger, tag, tensor_id, sha256, dtype, shape, numel, nbytes, file "
        f"from snapshots where run_id = '{rec.first}' order by seq, tensor_id",
    )
    assert [g[:6] for g in got] == sorted(want, key=lambda w: (w[0], w[4]))
    assert {g[2] for g in got} == {"sealed", "step", "run_end"}
    assert {g[1] for g in got if g[2] == "step"} == {1, 2, 3}
    for g in got:  # the catalog's facts, for every row
        blob = catalog[g[5]]
        assert (g[6], g[8], g[9], g[10]) == (
            blob["dtype"],
            blob["numel"],
            blob["nbytes"],
            blob["file"],
        )
        assert str(g[7]).replace(" ", "") == blob["shape"].replace(" ", "")
    names = {
        t
        for (t,) in rows(
            session, f"select distinct tensor from snapshots where run_id = '{rec.first}'"
        )
    }
    assert names == {
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
        "2.weight",
        "2.bias",
        "2.scale",
    }


@pytest.mark.parametrize("name", ["0.weight", "1.running_var", "1.num_batches_tracked"])
def test_tensor_values_are_the_parameter_at_a_step(
    rec: Recorded, session: QuerySession, name: str
) -> None:
    with auditlog.open(rec.path) as store:
        expected = store.run(rec.first).state_dict(step=2)[name]
    (sha,) = rows(
        session,
        f"select distinct sha256 from snapshots where run_id = '{rec.first}' and step = 2 "
        f"and trigger = 'step' and tensor = '{name}'",
    )[0]
    values = rows(
        session, f"select index, value from tensor_values where sha256 = '{sha}' order by index"
    )
    assert [i for i, _ in values] == list(range(expected.numel()))
    got = torch.tensor([v for _, v in values], dtype=torch.float64).reshape(expected.shape)
    assert torch.equal(got, expected.to(torch.float64))


def test_raw_layout_values_are_null_one_row_per_element(
    rec: Recorded, session: QuerySession
) -> None:
    got = rows(
        session,
        "select count(*), count(value), max(index) from tensor_values where sha256 in "
        f"(select sha256 from snapshots where tensor = '2.scale' and run_id = '{rec.first}')",
    )
    assert got == [(5, 0, 4)]  # bfloat16 is stored as raw bytes: no DOUBLE values


def test_a_sha256_filter_opens_one_file(rec: Recorded, session: QuerySession) -> None:
    (sha,) = rows(session, "select sha256 from snapshots where dtype = 'float32' limit 1")[0]
    plan = "\n".join(
        str(r[-1])
        for r in rows(
            session, f"explain analyze select * from tensor_values where sha256 = '{sha}'"
        )
    )
    assert "Total Files Read: 1" in plan


def test_run_option_scopes_the_snapshot_views(rec: Recorded) -> None:
    def json_rows(*args: str) -> list[dict[str, Any]]:
        result = invoke("query", "--store", str(rec.path), "--format", "json", *args)
        assert result.exit_code == 0, result.stderr
        return list(json.loads(result.stdout))

    first = {
        r["sha256"] for r in json_rows("--run", "first", "select distinct sha256 from snapshots")
    }
    second = {
        r["sha256"] for r in json_rows("--run", "second", "select distinct sha256 from snapshots")
    }
    assert first - second and second - first  # different seeds: different contents
    scoped = {
        r["sha256"]
        for r in json_rows("--run", "first", "select distinct sha256 from tensor_values")
    }
    assert scoped == first


def test_file_access_is_the_snapshots_directory_only(rec: Recorded, tmp_path: Path) -> None:
    assert (
        invoke("query", "--store", str(rec.path), "select count(*) from tensor_values").exit_code
        == 0
    )
    before = tree_digest(rec.path)
    outside = tmp_path / "outside.parquet"
    pq.write_table(pa.table({"value": [1.0, 2.0]}), outside)
    refused = [
        "select * from read_csv('/etc/passwd')",
        f"select * from read_parquet('{outside}')",
        f"select * from read_blob('{rec.path}/events.db')",
        f"select * from read_parquet('{rec.path}/snapshots/../outside.parquet')",
    ]
    for sql in refused:
        result = invoke("query", "--store", str(rec.path), sql)
        assert result.exit_code == 1, sql
        assert "Permission Error" in result.stderr, (sql, result.stderr)
    # The snapshots directory itself is readable (that is what the view needs) ...
    direct = invoke(
        "query",
        "--store",
        str(rec.path),
        "--format",
        "csv",
        f"select count(*) as n from read_parquet('{rec.path}/snapshots/*/*.parquet', union_by_name = true)",
    )
    assert direct.exit_code == 0, direct.stderr
    assert int(direct.stdout.splitlines()[1]) > 0
    # ... but not writable, and nothing in the store changed.
    copy = invoke(
        "query", "--store", str(rec.path), f"copy (select 1) to '{rec.path}/snapshots/x.csv'"
    )
    assert copy.exit_code == 2
    assert tree_digest(rec.path) == before


def test_session_still_refuses_in_python(rec: Recorded) -> None:
    event_store = EventStore.open(rec.path)
    try:
        with (
            QuerySession(ReadModel(event_store)) as session,
            pytest.raises(QueryError, match="Permission Error"),
        ):
            list(session.execute("select * from read_text('/etc/hostname')").rows)
    finally:
        event_store.close()
