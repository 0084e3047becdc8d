"""Test helpers: the real CLI (in-process and as a subprocess), examples, file digests."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from auditlog.cli.main import cli
from click.testing import CliRunner
from torch import nn

import auditlog

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def invoke(*args: str) -> CliResult:
    """Run the CLI in-process (Click's runner), stdout and stderr apart."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


def run_auditlog(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the real ``auditlog`` command in a subprocess."""
    full_env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "auditlog.cli.main", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` by path (examples are scripts, not a package)."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def file_digest(path: Path) -> str:
    """SHA-256 of a file, to prove a refused store was left byte-for-byte untouched."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    """Digest of every file under ``root`` (relative path -> sha256)."""
    return {
        str(p.relative_to(root)): file_digest(p) for p in sorted(root.rglob("*")) if p.is_file()
    }


def record_run(
    store_path: Path | str | None, steps: int = 2, name: str | None = None, **options: Any
) -> str:
    """Record a tiny model training for ``steps`` optimizer steps; return the run id.

    ``options`` go to ``auditlog.record`` (``run_id=``, policy keys).
    """
    with auditlog.record(store=store_path, name=name, **options) as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


@contextmanager
def tamper(store: Path) -> Iterator[sqlite3.Connection]:
    """A plain read-write sqlite3 connection to the store; commits and folds the WAL back."""
    conn = sqlite3.connect(store / "events.db")
    try:
        yield conn
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def assert_one_line_error(result: CliResult, code: int, *words: str) -> str:
    """Exit ``code``, exactly one ``Error: ...`` line on stderr containing ``words``, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert "internal error" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@contextmanager
def query_session(store_path: Path) -> Iterator[Any]:
    """A refreshed, locked-down DuckDB query session over a store (closed afterwards)."""
    from auditlog.store.eventstore import EventStore
    from auditlog.store.readmodel.cache import ReadModel
    from auditlog.store.readmodel.querysession import QuerySession

    event_store = EventStore.open(store_path)
    opened, _ = QuerySession.open(ReadModel(event_store))
    try:
        yield opened
    finally:
        opened.close()
        event_store.close()
