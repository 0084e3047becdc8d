"""Shared fixtures: isolated cwd and environment, a fresh store path."""

from __future__ import annotations

import os
from pathlib import Path

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
