"""The layers are kept by import-linter contracts (pyproject ``[tool.importlinter]``).

The check runs on a copy laid out as installed (``cli/`` as ``auditlog.cli``,
``tests/importcontracts.py``), as ``make lint-imports`` does; planted violations
prove that each contract can fail, and that each is reported as what it is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import REPO
from importcontracts import lint, stage, staged_contracts

LINT = Path(sys.executable).with_name("lint-imports")


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
@pytest.mark.slow
def test_import_contracts_are_kept(tmp_path: Path) -> None:
    done = lint(stage(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 kept, 0 broken" in done.stdout


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}  # planted\n")


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
@pytest.mark.slow
def test_a_layer_violation_is_reported_as_what_it_is(tmp_path: Path) -> None:
    root = stage(tmp_path)
    _plant(root / "auditlog" / "core" / "values.py", "from auditlog.store import schema")
    _plant(root / "auditlog" / "capture" / "buffer.py", "import sqlalchemy")
    _plant(root / "auditlog" / "capture" / "ids.py", "import hypothesis")  # on no deny-list
    _plant(
        root / "auditlog" / "read" / "runs.py", "import auditlog.cli.output"
    )  # the library above the CLI
    _plant(root / "auditlog" / "cli" / "output.py", "import duckdb")
    _plant(
        root / "auditlog" / "cli" / "runs_cmd.py", "from auditlog.store import eventstore"
    )  # past the read API
    _plant(
        root / "auditlog" / "read" / "restore.py",
        "from auditlog.store.blobcheck import verify_file",
    )  # a snapshot file checked past its one entry point (SnapshotStore)
    done = lint(root)
    assert done.returncode != 0
    assert "auditlog.core.values -> auditlog.store" in done.stdout
    assert "auditlog.capture.buffer -> sqlalchemy" in done.stdout
    assert "auditlog.capture.ids -> hypothesis" in done.stdout
    assert "auditlog.read is not allowed to import auditlog.cli" in done.stdout
    assert "auditlog.read.runs -> auditlog.cli.output" in done.stdout
    assert "auditlog.cli.output -> duckdb" in done.stdout
    assert "The CLI reaches the store only through the read API BROKEN" in done.stdout
    assert "auditlog.cli.runs_cmd -> auditlog.store.eventstore" in done.stdout
    assert "checked through one entry point (store.blobs.SnapshotStore) BROKEN" in done.stdout
    assert "auditlog.read.restore -> auditlog.store.blobcheck" in done.stdout
    assert "1 kept, 5 broken" in done.stdout  # the web UI contract: nothing planted


def test_the_staged_contracts_name_the_cli_as_installed() -> None:
    staged = staged_contracts((REPO / "pyproject.toml").read_text())
    assert 'root_packages = ["auditlog"]' in staged
    assert '"cli"' not in staged and '"auditlog.cli"' in staged
    assert "[tool.mypy" not in staged and '"duckdb"' in staged  # the section only
