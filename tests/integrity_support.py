"""Support for the signing tests: a tiny recorded run, key isolation, and attacks on a store.

The attacks use plain ``sqlite3`` the way someone with file access would, and a
full-chain rewrite recomputes every hash with auditlog's own published chain
function, so the rewritten chain is indistinguishable from a genuine one
without a signature made before the rewrite.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

import auditlog
from auditlog.encoding import chain_hash, genesis_hash

CHAINED = ("run_id", "stream", "seq", "ts_ns", "kind", "step", "module_id", "tensor_id", "snapshot", "payload")


def isolate_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point the default key location into ``tmp_path``; returns the config directory."""
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv("AUDITLOG_KEY", raising=False)
    return config


def record_run(store_path: Path | str, steps: int = 2, name: str | None = None) -> str:
    """Record a tiny model training for ``steps`` optimizer steps; return the run id."""
    with auditlog.record(store=store_path, name=name) as run:
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


def last_seq(store: Path, run_id: str, stream: int = 0) -> int:
    with tamper(store) as conn:
        (value,) = conn.execute(
            "select max(seq) from events where run_id=? and stream=?", (run_id, stream)
        ).fetchone()
    return int(value)


def truncate(store: Path, run_id: str, k: int, stream: int = 0) -> None:
    """Delete the newest ``k`` events of a stream: what a bare chain cannot notice."""
    with tamper(store) as conn:
        (top,) = conn.execute(
            "select max(seq) from events where run_id=? and stream=?", (run_id, stream)
        ).fetchone()
        conn.execute(
            "delete from events where run_id=? and stream=? and seq>?", (run_id, stream, top - k)
        )


def rewrite_chain(store: Path, run_id: str, seq: int, stream: int = 0) -> None:
    """Change event ``seq``'s payload and recompute every hash of the stream from genesis."""
    with tamper(store) as conn:
        conn.row_factory = sqlite3.Row
        rows = [
            dict(r)
            for r in conn.execute(
                "select * from events where run_id=? and stream=? order by seq", (run_id, stream)
            )
        ]
        assert any(r["seq"] == seq for r in rows)
        prev = genesis_hash(run_id, stream)
        for row in rows:
            if row["seq"] == seq:
                row["payload"] = row["payload"][:-1] + ',"forged":true}'
            new_hash = chain_hash(prev, {c: row[c] for c in CHAINED})
            conn.execute(
                "update events set payload=?, hash=? where id=?", (row["payload"], new_hash, row["id"])
            )
            prev = new_hash
