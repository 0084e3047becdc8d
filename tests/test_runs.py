"""Run status is derived from the record and liveness; crashes become part of the record."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import auditlog
from auditlog.core.liveness import STALE_AFTER_S, derive_status

CRASHER = textwrap.dedent(
    """
    import os, sys, torch, auditlog
    from torch import nn
    rec = auditlog.record(sys.argv[1], name="doomed").start()
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        model(torch.randn(2, 3)).sum().backward(); opt.step()
    rec.flush()
    os._exit(9)  # dies without any cleanup: no run_ended, no atexit
    """
)


@pytest.mark.slow
def test_dead_process_shows_crashed_then_is_closed_by_next_run(store: Path, tmp_path: Path) -> None:
    script = tmp_path / "crasher.py"
    script.write_text(CRASHER)
    done = subprocess.run(
        [sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 9, done.stderr
    with auditlog.open(store) as s:
        info = s.run("doomed").info()
        assert info.status == "crashed"
        assert info.steps == 4
        assert s.run("doomed").verify().ok
        ended = list(s.run("doomed").events(kinds=["run_ended"]))
    assert ended == []  # derived at read time only, so far
    with auditlog.record(store, name="next") as rec:
        pass
    with auditlog.open(store) as s:
        doomed = s.run("doomed")
        ended = [e["payload"] for e in doomed.events(kinds=["run_ended"])]
        assert doomed.verify().ok
        assert s.run("next").info().status == "completed"
    assert len(ended) == 1
    assert ended[0]["status"] == "crashed" and ended[0]["detected_by"] == rec.run_id
    assert ended[0]["steps"] == 4


def test_status_of_unfinished_run_on_another_host_goes_stale() -> None:
    now = time.time_ns()
    row = {
        "host": "elsewhere.example",
        "pid": 1,
        "proc_start": None,
        "last_seen_ns": now - 5 * 10**9,
    }
    assert derive_status(row, None, now_ns=now) == "running"
    row["last_seen_ns"] = now - (STALE_AFTER_S + 1) * 10**9
    assert derive_status(row, None, now_ns=now) == "incomplete"
    assert derive_status(row, {"status": "failed"}, now_ns=now) == "failed"


def test_live_run_shows_running(store: Path) -> None:
    with auditlog.record(store, name="live") as rec:
        rec.flush()
        with auditlog.open(store) as s:
            assert s.run("live").info().status == "running"
    with auditlog.open(store) as s:
        assert s.run("live").info().status == "completed"


def _last_seen(store: Path, run_id: str) -> int:
    import sqlite3

    conn = sqlite3.connect(store / "events.db")
    try:
        return int(
            conn.execute("select last_seen_ns from runs where run_id = ?", (run_id,)).fetchone()[0]
        )
    finally:
        conn.close()


def test_heartbeat_is_refreshed_while_idle_and_at_most_once_per_period_while_busy(
    store: Path, monkeypatch: Any
) -> None:
    """The writer refreshes ``last_seen_ns`` every ``HEARTBEAT_S`` even with no
    events (a long evaluation must not look stale), and not with every batch."""
    from torch import nn

    import auditlog.recording.writer as writer_module

    monkeypatch.setattr(writer_module, "HEARTBEAT_S", 0.3)
    with auditlog.record(store, name="idle") as rec:
        rec.flush()
        first = _last_seen(store, rec.run_id)
        deadline = time.monotonic() + 10
        while _last_seen(store, rec.run_id) == first and time.monotonic() < deadline:
            time.sleep(0.1)  # no events at all: only the idle heartbeat can move it
        assert _last_seen(store, rec.run_id) > first
    monkeypatch.setattr(writer_module, "HEARTBEAT_S", 3600.0)
    with auditlog.record(store, name="busy") as rec:
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        rec.flush()
        beat = _last_seen(store, rec.run_id)
        assert rec.writer is not None
        written = rec.writer.written
        for _ in range(5):
            model(torch.randn(2, 3)).sum().backward()
            optimizer.step()
            rec.flush()  # a committed batch each time
        assert rec.writer.written >= written + 5
        assert _last_seen(store, rec.run_id) == beat
