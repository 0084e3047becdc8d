"""Support for the signing tests: a tiny recorded run, key isolation, and attacks on a store.

The attacks use plain ``sqlite3`` the way someone with file access would, and a
full-chain rewrite recomputes every hash with auditlog's own published chain
function, so the rewritten chain is indistinguishable from a genuine one
without a signature made before the rewrite.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from helpers import record_run, tamper  # noqa: F401  (re-exported for the integrity tests)

from auditlog.core.chain import chain_hash, genesis_hash
from auditlog.core.eventrow import HASHED_COLUMNS

CHAINED = HASHED_COLUMNS  # the canonical row of the current chain format


def isolate_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point the default key location into ``tmp_path``; returns the config directory."""
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv("AUDITLOG_KEY", raising=False)
    return config


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
                "update events set payload=?, hash=? where id=?",
                (row["payload"], new_hash, row["id"]),
            )
            prev = new_hash
