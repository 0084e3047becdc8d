"""``auditlog query`` and ``auditlog schema`` through the real CLI.

The store holds two tiny runs recorded in-process. Statements that write,
attach, copy, install or read files outside the record must be refused with a
one-line error and leave every file of the store byte-for-byte as it was.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from auditlog.cli.main import cli
from click.testing import CliRunner
from helpers import invoke, tree_digest
from torch import nn

import auditlog
from auditlog.store.eventstore import EventStore
from auditlog.store.readmodel.cache import ReadModel
from auditlog.store.readmodel.querysession import QueryRefusedError, QuerySession
from auditlog.store.readmodel.views import VIEWS


class Store:
    def __init__(self, path: Path, first: str, second: str) -> None:
        self.path = path
        self.first = first
        self.second = second

    def query(self, *args: str) -> Any:
        return invoke("query", "--store", str(self.path), *args)

    def json(self, *args: str) -> list[dict[str, Any]]:
        result = self.query("--format", "json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def st(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path = tmp_path_factory.mktemp("query") / "store"
    ids = []
    for name, poison in (("clean", False), ("poisoned", True)):
        torch.manual_seed(0)
        with auditlog.record(path, name=name, argv=[f"{name}.py"]) as rec:
            model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                x = torch.ones(2, 3)
                if poison:
                    x[0, 0] = float("inf")
                model(x).sum().backward()
                opt.step()
        assert rec.run_id is not None
        ids.append(rec.run_id)
    return Store(path, ids[0], ids[1])


def test_query_builds_the_projection_silently_in_a_pipe(st: Store) -> None:
    result = st.query("select kind, count(*) as n from events group by 1 order by 1")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""  # no progress bar outside a terminal
    assert (st.path / "readmodel.duckdb").is_file()
    counts = {
        r["kind"]: r["n"] for r in st.json("select kind, count(*) as n from events group by 1")
    }
    assert counts["optimizer_step"] == 4 and counts["run_started"] == 2
    table = result.stdout
    assert "optimizer_step" in table and "run_started" in table


def test_run_option_scopes_every_view(st: Store) -> None:
    for view in ("events", "steps", "forward_stats", "modules", "parameters", "runs"):
        rows = st.json("--run", "poisoned", f"select distinct run_id from {view}")
        assert rows == [{"run_id": st.second}], view
    joined = st.json(
        "--run",
        st.first[:8],
        "select count(*) as n from steps s join parameters p using (run_id, tensor_id)",
    )
    assert joined == [{"n": 2 * 4}]  # 2 steps x 4 parameters, only the first run's
    assert st.query("--run", "nope", "select 1").exit_code == 1


def test_json_output_decodes_json_columns_and_keeps_non_finite_values(st: Store) -> None:
    rows = st.json(
        "--run",
        "poisoned",
        "select seq, call, output, kind, norm, max, payload from forward_stats join events using (run_id, stream, seq) "
        "where inf > 0 order by seq, call, output limit 1",
    )
    assert rows, "the poisoned run has infinite activations"
    row = rows[0]
    assert row["kind"] == "activity" and row["call"] == 0  # the first Linear, fed +inf
    assert row["max"] == "Infinity"
    assert row["norm"] in ("Infinity", "NaN")
    assert isinstance(row["payload"], dict)  # JSON column decoded, not a string
    assert row["payload"]["forward"][row["call"]]["outputs"][row["output"]]["max"] == "Infinity"


def test_csv_output(st: Store) -> None:
    result = st.query("--format", "csv", "select run_id, name, argv from runs order by started")
    assert result.exit_code == 0
    records = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["name"] for r in records] == ["clean", "poisoned"]
    assert json.loads(records[0]["argv"]) == ["clean.py"]


def test_sql_errors_are_one_line(st: Store) -> None:
    result = st.query("select no_such_column from events")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: Binder Error:")
    assert result.stderr.count("\n") == 1 and "no_such_column" in result.stderr
    assert "Traceback" not in result.stderr
    syntax = st.query("selec 1")
    assert syntax.exit_code == 1 and syntax.stderr.startswith("Error: Parser Error:")


def test_sql_from_stdin(st: Store) -> None:
    result = CliRunner().invoke(
        cli,
        ["query", "--store", str(st.path), "--format", "json", "-"],
        input="select 41 + 1 as answer",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"answer": 42}]


ESCAPES = [
    ("delete from events", 2, "DELETE"),
    ("update projection.events set kind = 'x'", 2, "UPDATE"),
    ("insert into projection.meta values ('a', 'b')", 2, "INSERT"),
    ("create table t as select 1", 2, "CREATE"),
    ("drop view events", 2, "DROP"),
    ("attach '{tmp}/other.duckdb' as other", 2, "ATTACH"),
    ("copy (select * from events) to '{tmp}/out.csv'", 2, "COPY"),
    ("install sqlite", 2, "INSTALL"),
    ("load sqlite", 2, "LOAD"),
    ("set enable_external_access = true", 2, "SET"),
    ("pragma enable_profiling", 2, "PRAGMA"),
    ("checkpoint", 2, "CHECKPOINT"),
    ("export database '{tmp}/dump'", 2, "EXPORT"),
    ("explain analyze delete from events", 2, "DELETE"),
    ("select 1; delete from events", 2, "one statement at a time"),
    ("select * from read_csv('/etc/passwd')", 1, "Permission Error"),
    ("select * from read_text('/etc/passwd')", 1, "Permission Error"),
    ("select * from read_blob('{store}/events.db')", 1, "Permission Error"),
    ("select * from glob('{store}/*')", 1, "Permission Error"),
    ("select * from query('delete from events')", 1, "SELECT"),
]


@pytest.mark.parametrize(("sql", "code", "message"), ESCAPES, ids=[e[0][:30] for e in ESCAPES])
def test_writing_or_escaping_statements_are_refused_and_change_nothing(
    st: Store, tmp_path: Path, sql: str, code: int, message: str
) -> None:
    assert st.query("select count(*) from events").exit_code == 0  # the projection exists
    before = tree_digest(st.path)
    result = st.query(sql.format(tmp=tmp_path, store=st.path))
    assert result.exit_code == code, result.stderr
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert tree_digest(st.path) == before
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere else either


def test_explain_of_a_select_is_allowed(st: Store) -> None:
    result = st.query("explain select count(*) from events")
    assert result.exit_code == 0 and "explain" in result.stdout.lower()


def test_session_configuration_is_locked(st: Store) -> None:
    """Even SQL that bypassed the statement check could not reopen file access."""
    event_store = EventStore.open(st.path)
    try:
        with QuerySession(ReadModel(event_store)) as session:
            with pytest.raises(QueryRefusedError):
                session.execute("set lock_configuration = false")
            for statement in (
                "SET enable_external_access = true",
                "SET lock_configuration = false",
            ):
                with pytest.raises(Exception, match="locked"):
                    session.con.execute(statement)
            with pytest.raises(Exception, match="read-only"):
                session.con.execute("insert into projection.meta values ('x', 'y')")
            assert session.con.execute(
                "select current_setting('enable_external_access')"
            ).fetchone() == (False,)
            # DuckDB's own progress bar would print into pipes
            assert session.con.execute(
                "select current_setting('enable_progress_bar')"
            ).fetchone() == (False,)
    finally:
        event_store.close()


# --------------------------------------------------------------------------- schema
def test_schema_lists_every_view_and_column() -> None:
    result = invoke("schema", "--format", "json")
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert [v["view"] for v in document] == [v.name for v in VIEWS]
    assert {
        "runs",
        "events",
        "modules",
        "parameters",
        "buffers",
        "steps",
        "forward_stats",
        "backward_stats",
    } <= {v["view"] for v in document}
    steps = next(v for v in document if v["view"] == "steps")
    assert {"grad_norm", "update_norm", "param_norm", "lr", "parameter"} <= {
        c["name"] for c in steps["columns"]
    }
    assert all(c["doc"] and c["type"] for v in document for c in v["columns"])

    one = invoke("schema", "backward_stats")
    assert one.exit_code == 0 and "grad_norm" in one.stdout and "forward_stats" not in one.stdout
    csv_rows = list(csv.DictReader(io.StringIO(invoke("schema", "--format", "csv").stdout)))
    assert len(csv_rows) == sum(len(v.columns) for v in VIEWS)
    unknown = invoke("schema", "nope")
    assert unknown.exit_code == 2 and "unknown view 'nope'" in unknown.stderr


def test_new_commands_have_help() -> None:
    for command in ("query", "schema", "diff"):
        result = invoke(command, "--help")
        assert result.exit_code == 0
        assert len(result.stdout.splitlines()) > 3
