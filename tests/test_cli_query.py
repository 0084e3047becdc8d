"""``auditlog runs`` and ``auditlog events``: what the query commands print.

Two real runs are recorded in-process with ``auditlog.record`` (a failing one,
then the MLP example for one epoch); the CLI is invoked in-process and its
table, JSON and CSV output is checked against the read API.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke, load_example
from torch import nn

import auditlog

MLP_STEPS = 8  # 512 samples / batch 64, one epoch
EVENT_COLUMNS = [
    "run_id",
    "stream",
    "seq",
    "time",
    "kind",
    "step",
    "module_id",
    "module",
    "tensor_id",
    "tensor",
    "hash",
    "chain_ok",
    "payload",
]


class Recorded:
    def __init__(self, store: Path, failed_id: str, mlp_id: str) -> None:
        self.store = store
        self.failed_id = failed_id
        self.mlp_id = mlp_id

    def cli(self, *args: str) -> Any:
        result = invoke(*args[:1], "--store", str(self.store), *args[1:])
        assert result.exit_code == 0, result.stdout + result.stderr
        return result

    def json(self, *args: str) -> list[dict[str, Any]]:
        return json.loads(self.cli(*args, "--format", "json").stdout)

    def api_events(self, kinds: list[str] | None = None) -> list[dict[str, Any]]:
        with auditlog.open(self.store) as s:
            return list(s.run(self.mlp_id).events(kinds=kinds))


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    store = tmp_path_factory.mktemp("query") / "store"

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="broken on purpose"):
        with auditlog.record(store, name="oops", argv=["broken.py", "--flag"]) as first:
            loss = model(torch.randn(8, 4)).sum()
            loss.backward()
            opt.step()
            raise ValueError("broken on purpose")
    assert first.run_id is not None

    mlp = load_example("train_mlp")
    with auditlog.record(
        store, name="mlp", argv=["examples/train_mlp.py", "--epochs", "1"], activity_every=1
    ) as second:
        mlp.main(["--epochs", "1"])
    assert second.run_id is not None
    return Recorded(store, first.run_id, second.run_id)


# --------------------------------------------------------------------------- runs
def test_runs_table(rec: Recorded) -> None:
    out = rec.cli("runs").stdout
    lines = out.splitlines()
    failed_line = [line for line in lines if rec.failed_id[:12] in line]
    mlp_line = [line for line in lines if rec.mlp_id[:12] in line]
    assert len(failed_line) == 1 and len(mlp_line) == 1
    assert "failed" in failed_line[0] and "broken.py" in failed_line[0]
    assert "completed" in mlp_line[0] and "train_mlp.py" in mlp_line[0]
    assert "oops" in failed_line[0] and "mlp" in mlp_line[0]
    assert rec.failed_id not in out  # only the short id is shown


def test_runs_json(rec: Recorded) -> None:
    rows = rec.json("runs")
    assert len(rows) == 2
    for row in rows:
        assert {"run_id", "status", "steps", "events", "git_commit"} <= set(row)
    assert [r["run_id"] for r in rows] == [rec.failed_id, rec.mlp_id]  # oldest first
    assert [r["status"] for r in rows] == ["failed", "completed"]
    assert [r["steps"] for r in rows] == [1, MLP_STEPS]
    assert rows[0]["exception"]["type"] == "ValueError"
    assert rows[1]["argv"] == ["examples/train_mlp.py", "--epochs", "1"]
    assert rows[1]["events"] == len(rec.api_events())


def test_runs_csv(rec: Recorded) -> None:
    out = rec.cli("runs", "--format", "csv").stdout
    table = list(csv.reader(io.StringIO(out)))
    header, body = table[0], table[1:]
    assert {"run_id", "status", "steps", "events", "git_commit"} <= set(header)
    assert len(body) == 2
    assert all(len(row) == len(header) for row in body)
    records = [dict(zip(header, row, strict=True)) for row in body]
    assert [r["run_id"] for r in records] == [rec.failed_id, rec.mlp_id]
    assert [r["status"] for r in records] == ["failed", "completed"]
    assert records[1]["steps"] == str(MLP_STEPS)
    assert json.loads(records[1]["argv"]) == ["examples/train_mlp.py", "--epochs", "1"]


def test_runs_limit_shows_newest(rec: Recorded) -> None:
    out = rec.cli("runs", "--limit", "1").stdout
    assert rec.mlp_id[:12] in out
    assert rec.failed_id[:12] not in out
    rows = rec.json("runs", "--limit", "1")
    assert [r["run_id"] for r in rows] == [rec.mlp_id]


# --------------------------------------------------------------------------- events
def test_events_kind_filter(rec: Recorded) -> None:
    rows = rec.json("events", "latest", "--kind", "module_registered")
    assert rows
    assert all(r["kind"] == "module_registered" for r in rows)
    assert all(r["run_id"] == rec.mlp_id for r in rows)
    assert [r["seq"] for r in rows] == [e["seq"] for e in rec.api_events(["module_registered"])]
    children = {r["payload"]["name"] for r in rows}
    assert {"body", "dropout", "head", "0", "8"} <= children


def test_events_kind_filter_is_repeatable_and_selects_by_name(rec: Recorded) -> None:
    rows = rec.json("events", "oops", "--kind", "run_started", "--kind", "run_ended")
    assert [r["kind"] for r in rows] == ["run_started", "run_ended"]
    assert all(r["run_id"] == rec.failed_id for r in rows)
    assert rows[1]["payload"]["status"] == "failed"
    assert rows[1]["payload"]["exception"]["message"] == "broken on purpose"


def test_events_module_glob(rec: Recorded) -> None:
    """``--module GLOB`` keeps events of modules whose qualified name matches; a
    ``module_registered`` event also matches through the child it registers
    (README: "for module_registered the parent or the registered child")."""
    rows = rec.json("events", "latest", "--module", "body.*")
    assert rows

    with auditlog.open(rec.store) as s:
        state = s.run(rec.mlp_id).model_state()
    names = state.module_names()
    root = state.root_by_class("MLP")
    ids = {mid for name, mid in state.named_modules(root) if fnmatch.fnmatchcase(name, "body.*")}
    assert len(ids) == 9  # body.0 .. body.8

    def calls_in(payload: dict[str, Any]) -> set[int]:
        return {c["module_id"] for d in ("forward", "backward") for c in payload.get(d) or []}

    for r in rows:
        if r["kind"] == "activity":
            assert r["module"] is None and calls_in(r["payload"]) & ids, (
                r
            )  # it holds a call of body.*
        elif r["kind"] == "module_registered" and not fnmatch.fnmatchcase(r["module"], "body.*"):
            child = r["payload"]["child_id"]
            assert any(fnmatch.fnmatchcase(n, "body.*") for n in names[child]), r
        else:
            assert fnmatch.fnmatchcase(r["module"], "body.*"), r
    modules = {r["module"] for r in rows if r["kind"] != "activity"}
    # the Linear and LayerNorm children own parameters; the GELUs (body.2/5/8) have
    # no events of their own: their calls are inside activity events
    assert modules == {"body", "body.0", "body.1", "body.3", "body.4", "body.6", "body.7"}
    assert "head" not in modules and "dropout" not in modules
    assert {r["kind"] for r in rows} == {"parameter_registered", "module_registered", "activity"}
    activity = [e for e in rec.api_events() if e["kind"] == "activity"]
    assert activity and [r["seq"] for r in rows if r["kind"] == "activity"] == [
        e["seq"] for e in activity
    ]
    # body's own forward is not about body.*; only its registrations of body.N are
    assert all(r["kind"] == "module_registered" for r in rows if r["module"] == "body")
    assert sorted(r["payload"]["name"] for r in rows if r["module"] == "body") == [
        str(i) for i in range(9)
    ]

    expected = [
        e["seq"]
        for e in rec.api_events()
        if e["module_id"] in ids
        or (e["kind"] == "module_registered" and e["payload"].get("child_id") in ids)
        or (e["kind"] == "activity" and calls_in(e["payload"]) & ids)
    ]
    assert [r["seq"] for r in rows] == expected
    # a module never called matches no activity event
    never = rec.json("events", "latest", "--module", "body.0", "--kind", "run_started")
    assert never == []

    # a glob naming only leaves of body picks exactly their events
    leaf_rows = rec.json("events", "latest", "--module", "body.0", "--kind", "parameter_registered")
    assert leaf_rows and all(r["module"] == "body.0" for r in leaf_rows)
    assert [r["payload"]["name"] for r in leaf_rows] == ["weight", "bias"]


def test_events_single_step(rec: Recorded) -> None:
    rows = rec.json("events", "latest", "--step", "2")
    assert rows
    assert all(r["step"] == 2 for r in rows)
    assert [r["seq"] for r in rows] == [e["seq"] for e in rec.api_events() if e["step"] == 2]
    assert "optimizer_step" in {r["kind"] for r in rows}


def test_events_step_range(rec: Recorded) -> None:
    rows = rec.json("events", "latest", "--step", "1:3")
    assert {r["step"] for r in rows} == {1, 2, 3}
    assert [r["seq"] for r in rows] == [e["seq"] for e in rec.api_events() if 1 <= e["step"] <= 3]


def test_events_limit(rec: Recorded) -> None:
    rows = rec.json("events", "latest", "--limit", "5")
    assert len(rows) == 5
    assert [r["seq"] for r in rows] == [e["seq"] for e in rec.api_events()][:5]
    table = rec.cli("events", "latest", "--limit", "5").stdout
    assert "run_started" in table
    assert str(rows[-1]["seq"]) in table


def test_events_csv_parses(rec: Recorded) -> None:
    out = rec.cli("events", "latest", "--kind", "parameter_registered", "--format", "csv").stdout
    reader = csv.DictReader(io.StringIO(out))
    assert reader.fieldnames == EVENT_COLUMNS
    csv_rows = list(reader)
    json_rows = rec.json("events", "latest", "--kind", "parameter_registered")
    assert (
        len(csv_rows) == len(json_rows) == 14
    )  # 3 Linear + 3 LayerNorm (weight, bias) + head (weight, bias)
    for c, j in zip(csv_rows, json_rows, strict=True):
        assert int(c["seq"]) == j["seq"]
        assert c["kind"] == "parameter_registered"
        assert c["module"] == j["module"]
        assert c["tensor"] == j["tensor"]
        assert json.loads(c["payload"]) == j["payload"]


def test_events_name_columns(rec: Recorded) -> None:
    rows = rec.json("events", "latest", "--kind", "parameter_registered")
    by_tensor = {r["tensor"]: r for r in rows}
    assert by_tensor["head.weight"]["module"] == "head"
    assert by_tensor["head.weight"]["payload"]["name"] == "weight"
    assert by_tensor["head.weight"]["payload"]["shape"] == [4, 64]
    assert by_tensor["head.bias"]["module"] == "head"
    assert by_tensor["body.0.weight"]["module"] == "body.0"
    assert by_tensor["body.4.bias"]["module"] == "body.4"

    live = load_example("train_mlp").build_model()
    assert sorted(by_tensor) == sorted(name for name, _ in live.named_parameters())

    table = rec.cli("events", "latest", "--kind", "parameter_registered").stdout
    head_lines = [line for line in table.splitlines() if "head.weight" in line]
    assert len(head_lines) == 1
    assert "head" in head_lines[0].replace("head.weight", "") and "[4, 64]" in head_lines[0]
