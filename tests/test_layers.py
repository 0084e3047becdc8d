"""The layers are kept by import-linter contracts (pyproject ``[tool.importlinter]``).

The check runs on a copy of the source tree, where ``cli/`` is the top-level
package ``cli`` (installed as ``auditlog.cli``), as a plain ``lint-imports`` in a
checkout does; a planted violation proves the check can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

LINT = Path(sys.executable).with_name("lint-imports")


def _stage(root: Path) -> Path:
    shutil.copytree(REPO / "auditlog", root / "auditlog", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "cli", root / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "migrations", root / "migrations", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT)], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
@pytest.mark.slow
def test_import_contracts_are_kept(tmp_path: Path) -> None:
    done = _lint(_stage(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 kept, 0 broken" in done.stdout


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is a dev dependency")
@pytest.mark.slow
def test_a_layer_violation_is_reported(tmp_path: Path) -> None:
    root = _stage(tmp_path)
    core = root / "auditlog" / "core" / "values.py"
    core.write_text(core.read_text() + "\nfrom auditlog.store import schema  # planted\n")
    capture = root / "auditlog" / "capture" / "buffer.py"
    capture.write_text(capture.read_text() + "\nimport sqlalchemy  # planted\n")
    read = root / "auditlog" / "read" / "runs.py"
    read.write_text(read.read_text() + "\nimport auditlog.cli.output  # planted: the library above the CLI\n")
    command = root / "cli" / "output.py"
    command.write_text(command.read_text() + "\nimport duckdb  # planted\n")
    done = _lint(root)
    assert done.returncode != 0
    assert "auditlog.core.values -> auditlog.store" in done.stdout
    assert "auditlog.capture.buffer -> sqlalchemy" in done.stdout
    assert "cli.output -> duckdb" in done.stdout
    assert "auditlog.read.runs -> auditlog" in done.stdout
