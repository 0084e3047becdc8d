"""Shared fixtures: isolated cwd and environment, a fresh store path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI replays the same examples every time (a failure there is reproducible and
# never flaky); local runs explore new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own cwd with no AUDITLOG_STORE leaking in."""
    monkeypatch.delenv("AUDITLOG_STORE", raising=False)
    monkeypatch.delenv("AUDITLOG_RUN_ID", raising=False)
    monkeypatch.delenv("AUDITLOG_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))  # no user's signing key leaks in
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A path for a store that does not exist yet."""
    return tmp_path / "store"


@pytest.fixture(params=["debug", "audit"])
def twice(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """``twice(behaviour)``: run it plain and under one ``auditlog.record`` (each
    policy preset in turn); assert the outcomes are identical and return it
    (tests/behaviour_support.py)."""
    from behaviour_support import run_twice

    policy = request.param
    return lambda behaviour: run_twice(behaviour, tmp_path / f"store-{policy}", policy)
