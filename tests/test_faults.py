"""Faults in the recorder do not become faults in training (unless on_error=fail)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import auditlog
from auditlog.capture.buffer import RecordBuffer

TRAIN = """
import os, sys, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, STEPS + 1):
    model(torch.randn(16, 32)).sum().backward()
    opt.step()
    opt.zero_grad()
    HOOK
    print(f"step {step}", flush=True)
print("trained", flush=True)
"""


def script(tmp: Path, steps: int = 30, hook: str = "pass", prelude: str = "") -> Path:
    path = tmp / "train_fault.py"
    path.write_text(
        textwrap.dedent(prelude) + TRAIN.replace("STEPS", str(steps)).replace("HOOK", hook)
    )
    return path


def auditlog_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "auditlog.cli.main", *args]


def run(args: list[str], cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180, **kwargs
    )  # type: ignore[call-overload,no-any-return]


DISK_FULL = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))
"""


@pytest.mark.slow
def test_disk_full_training_continues_and_is_reported_once(tmp_path: Path) -> None:
    store = tmp_path / "store"
    train = script(tmp_path, steps=40, prelude=DISK_FULL)
    done = run(
        auditlog_cmd("run", "--store", str(store), "--policy", "debug", str(train)), tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    assert done.stderr.count("auditlog: cannot write to store") == 1, done.stderr
    assert "Traceback" not in done.stderr
    with auditlog.open(store) as s:  # what was written before the disk filled up is intact
        assert s.run().verify().ok


@pytest.mark.slow
def test_disk_full_with_on_error_fail_stops_training(tmp_path: Path) -> None:
    store = tmp_path / "store"
    train = script(tmp_path, steps=5000, prelude=DISK_FULL)
    done = run(
        auditlog_cmd(
            "run", "--store", str(store), "--policy", "debug", "--on-error", "fail", str(train)
        ),
        tmp_path,
    )
    assert done.returncode == 5, (done.returncode, done.stderr)
    assert "trained" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: recording failed") and "on_error=fail" in last


@pytest.mark.slow
def test_deleted_store_is_reported_and_training_continues(tmp_path: Path) -> None:
    store = tmp_path / "store"
    # retried: the recorder's writer may create a file (a WAL, a lock) while rmtree
    # empties the directory, and then rmdir fails in the user's script, not in auditlog
    hook = (
        f"import shutil; [shutil.rmtree({str(store)!r}, ignore_errors=True) for _ in range(50) "
        f"if os.path.exists({str(store)!r})] if step == 5 else None"
    )
    train = script(tmp_path, steps=30, hook=hook)
    done = run(
        auditlog_cmd("run", "--store", str(store), "--policy", "debug", str(train)), tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    assert done.stderr.count("was deleted") == 1, done.stderr


def _read_only_bind(source: Path, target: Path) -> bool:
    """Mount ``source`` read-only at ``target`` (root ignores file modes, not ro mounts)."""
    target.mkdir()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if done.returncode != 0:
        return False
    ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], capture_output=True)
    if ro.returncode != 0:
        subprocess.run(["umount", str(target)], check=False)
        return False
    return True


@pytest.mark.slow
def test_read_only_store(tmp_path: Path) -> None:
    source = tmp_path / "store"
    first = run(auditlog_cmd("db", "upgrade", "--store", str(source)), tmp_path)
    assert first.returncode == 0, first.stderr
    store = tmp_path / "readonly"
    if not _read_only_bind(source, store):
        pytest.skip("cannot make a read-only mount here (needs mount privileges)")
    try:
        train = script(tmp_path, steps=5)
        before = (source / "events.db").read_bytes()
        done = run(auditlog_cmd("run", "--store", str(store), str(train)), tmp_path)
        assert done.returncode == 0, done.stderr
        assert "trained" in done.stdout
        assert "cannot record" in done.stderr and "running without recording" in done.stderr
        failed = run(
            auditlog_cmd("run", "--store", str(store), "--on-error", "fail", str(train)), tmp_path
        )
        assert failed.returncode == 3, failed.stderr
        assert failed.stderr.strip().startswith("Error: ") and "trained" not in failed.stdout
        assert (source / "events.db").read_bytes() == before
    finally:
        subprocess.run(["umount", str(store)], check=False)


def test_buffer_drops_instead_of_blocking_when_the_writer_is_gone() -> None:
    buffer = RecordBuffer(maxsize=10)
    buffer.consumer_alive = lambda: False
    started = time.perf_counter()
    for i in range(25):
        buffer.put(("forward", i))
    assert time.perf_counter() - started < 1.0
    assert len(buffer) == 10 and buffer.dropped == 15


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill9_with_step_durability_keeps_every_acknowledged_step(
    tmp_path: Path, seed: int
) -> None:
    """With --durability step, every step the program saw complete is in the store."""
    store = tmp_path / "store"
    train = script(tmp_path, steps=10_000)
    env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
    proc = subprocess.Popen(
        auditlog_cmd("run", "--store", str(store), "--durability", "step", str(train)),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kill_after = random.Random(seed).randrange(3, 40)
    seen = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step "):
            seen = int(line.split()[1])
            if seen >= kill_after:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with auditlog.open(store) as s:
        run_view = s.run()
        info = run_view.info()
        report = run_view.verify()
        steps = [e["step"] for e in run_view.events(kinds=["optimizer_step"])]
    assert info.status == "crashed"
    assert report.ok, [p.describe() for p in report.problems]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= seen


def test_failure_found_at_close_still_fails_a_compliance_run(tmp_path: Path) -> None:
    """on_error=fail: a store that fails only at the final flush still fails the run."""
    store = tmp_path / "store"
    recording = auditlog.record(store, on_error="fail")
    recording.start()
    assert recording.writer is not None
    recording.writer.failure = OSError("disk full")  # what the writer sets when a write fails
    with pytest.raises(auditlog.AuditlogError, match=r"recording failed .*disk full"):
        recording.stop()
    assert auditlog.current() is None
