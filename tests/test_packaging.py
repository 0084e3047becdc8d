"""A plain, non-editable install carries the CLI and the migrations: a user installs auditlog
with pip, and the store schema's Alembic revisions ship inside the package
(docs/how-it-works.md, "Where data lives")."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO


def _source_copy(destination: Path) -> Path:
    """The source tree as a fresh clone would have it: building there leaves the work tree clean."""
    skip = shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".auditlog", ".*_cache"
    )
    shutil.copytree(REPO, destination, ignore=skip)
    return destination


@pytest.mark.slow
def test_non_editable_install_creates_and_upgrades_a_store(tmp_path: Path) -> None:
    target = tmp_path / "site"
    source = _source_copy(tmp_path / "src")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--target",
        str(target),
        str(source),
    ]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.insert(4, "--no-build-isolation")
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path, timeout=300)
    assert (target / "auditlog" / "cli" / "main.py").is_file()
    assert (target / "auditlog" / "migrations" / "versions" / "0001_initial.py").is_file()
    assert (target / "auditlog" / "migrations" / "script.py.mako").is_file()
    assert not (target / "cli").exists() and not (target / "migrations").exists()
    # every subpackage of the library is installed (pyproject lists them by hand)
    wanted = {p.parent.relative_to(REPO) for p in (REPO / "auditlog").rglob("__init__.py")}
    assert all((target / package / "__init__.py").is_file() for package in wanted), wanted
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("AUDITLOG_STORE", None)
    script = target / "bin" / "auditlog"
    assert script.is_file()
    store = tmp_path / "store"

    def auditlog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    created = auditlog("db", "upgrade", "--store", str(store))
    assert created.returncode == 0, created.stderr
    assert "created store at revision" in created.stdout
    current = auditlog("db", "current", "--store", str(store))
    assert current.returncode == 0 and "(current)" in current.stdout
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import auditlog, auditlog.cli; print(auditlog.__file__); print(auditlog.cli.__file__)",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(target) for p in where)
