"""Shared fixtures: isolated cwd and environment, a fresh store path."""

from __future__ import annotations

import os
from collections.abc import Iterator
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
    monkeypatch.delenv("AUDITLOG_SNAPSHOTS", raising=False)
    monkeypatch.delenv("AUDITLOG_SHARD", raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        "XDG_CONFIG_HOME", str(tmp_path / ".config")
    )  # no user's signing key leaks in
    monkeypatch.chdir(tmp_path)
    # Files proven in this process are forgotten between tests (each test's stores are
    # its own; a test may patch the file layout's constants).
    from auditlog.store.blobcheck import PROVEN

    PROVEN.clear()


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


# --------------------------------------------------------------------------- PostgreSQL
# The server CI starts (.ci/run): trust auth on 127.0.0.1:5432. Each test gets a
# database of its own, created here and dropped afterwards.
PG_ADMIN = os.environ.get("AUDITLOG_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_unavailable() -> str | None:
    """Why PostgreSQL tests cannot run here (None: they can)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'auditlog[postgres]')"
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=3).close()
    except Exception as exc:
        return f"no PostgreSQL server reachable at {PG_ADMIN} ({str(exc).strip().splitlines()[0]})"
    return None


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A SQLAlchemy URL of a fresh, empty PostgreSQL database (dropped after the test)."""
    reason = _pg_unavailable()
    if reason is not None:
        pytest.skip(reason)
    import uuid

    import psycopg

    name = f"auditlog_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
