"""Read commands start without importing what they do not need (torch above all).

Not a timing test: each command runs in a fresh interpreter, and the test
checks which heavy modules ended up in ``sys.modules``. ``benchmarks/startup.py``
measures the seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import record_run

PROBE = """
import json, sys
from auditlog.cli.main import main
sys.argv = ["auditlog", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = ("torch", "duckdb", "pyarrow", "alembic", "numpy", "rich.table", "sqlalchemy", "pandas")
print(json.dumps({"code": code, "loaded": [m for m in heavy if m in sys.modules]}), file=sys.stderr)
"""


def loaded(args: list[str], cwd: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr
    return list(report["loaded"])


@pytest.mark.slow
def test_help_and_version_import_nothing_heavy(tmp_path: Path) -> None:
    assert loaded(["--help"], tmp_path) == []
    assert loaded(["--version"], tmp_path) == []
    assert loaded(["runs", "--help"], tmp_path) == []


@pytest.mark.slow
def test_read_commands_do_not_import_torch_or_duckdb(tmp_path: Path) -> None:
    store = tmp_path / "store"
    record_run(store, steps=3, snapshot_initial=False, snapshot_final=False)
    for args in (["runs"], ["events", "--limit", "5"], ["verify"], ["tree"], ["snapshots"]):
        heavy = loaded(
            [*args, "--store", str(store), "--format", "json"]
            if args[0] != "verify"
            else [*args, "--store", str(store)],
            tmp_path,
        )
        assert "torch" not in heavy and "duckdb" not in heavy and "pyarrow" not in heavy, (
            args,
            heavy,
        )
        # A SQLite store is read with the stdlib sqlite3 module (store/sqlread.py).
        assert "sqlalchemy" not in heavy, (args, heavy)


@pytest.mark.slow
def test_query_imports_duckdb_but_not_torch(tmp_path: Path) -> None:
    store = tmp_path / "store"
    record_run(store, steps=2, snapshot_initial=False, snapshot_final=False)
    heavy = loaded(
        ["query", "--store", str(store), "--format", "json", "select 1 as one"], tmp_path
    )
    assert "duckdb" in heavy and "torch" not in heavy
    # Warm: the read model is fresh, so neither pyarrow (nor pandas, which pyarrow
    # imports for a table built from Python lists) nor SQLAlchemy is needed.
    heavy = loaded(
        ["query", "--store", str(store), "--format", "json", "select count(*) from runs"], tmp_path
    )
    assert not {"torch", "pyarrow", "pandas", "numpy", "sqlalchemy"} & set(heavy), heavy


@pytest.mark.slow
def test_verify_of_a_store_with_snapshots_imports_no_torch(tmp_path: Path) -> None:
    """verify checks every snapshot file's content hash with pyarrow and numpy (issue 18)."""
    store = tmp_path / "store"
    record_run(store, steps=3, snapshot_every=1)  # default policy, plus a snapshot every step
    heavy = loaded(["verify", "--store", str(store)], tmp_path)
    assert "pyarrow" in heavy  # it did read the snapshot files
    assert "torch" not in heavy, heavy
    # A warm query over snapshotted runs checks each verified file's identity (a stat),
    # not its bytes: no pyarrow unless a file changed.
    sql = "select count(*) from tensor_values"
    loaded(["query", "--store", str(store), "--format", "json", sql], tmp_path)
    heavy = loaded(["query", "--store", str(store), "--format", "json", sql], tmp_path)
    assert "pyarrow" not in heavy and "torch" not in heavy, heavy
