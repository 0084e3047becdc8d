"""A recording signs its chain head when a key is configured; verify checks it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch
from helpers import invoke
from torch import nn

import auditlog


def test_recording_signs_heads_and_truncation_is_caught(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "keys" / "signing_key"
    assert invoke("keygen", "-o", str(key)).exit_code == 0
    monkeypatch.setenv("AUDITLOG_KEY", str(key))
    with auditlog.record(store) as run:
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
    conn = sqlite3.connect(store / "events.db")
    (count,) = conn.execute(
        "select count(*) from checkpoints where run_id=?", (run.run_id,)
    ).fetchone()
    (last,) = conn.execute("select max(seq) from events where run_id=?", (run.run_id,)).fetchone()
    (signed,) = conn.execute(
        "select max(seq) from checkpoints where run_id=?", (run.run_id,)
    ).fetchone()
    conn.close()
    assert count >= 1 and signed == last  # the run-end checkpoint signs the very last event
    public = str(key) + ".pub"
    ok = invoke("verify", "--store", str(store), "--key", public)
    assert ok.exit_code == 0 and "signed checkpoint" in ok.stdout
    conn = sqlite3.connect(store / "events.db")
    conn.execute("delete from events where run_id=? and seq>?", (run.run_id, last - 2))
    conn.commit()
    conn.close()
    cut = invoke("verify", "--store", str(store), "--key", public)
    assert cut.exit_code == 4 and "cut off" in cut.stderr
