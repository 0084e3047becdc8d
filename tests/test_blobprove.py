"""Small snapshot files checked on worker processes before a verdict (issue 33).

``auditlog ui`` starts worker processes (``auditlog.read.api.parallel_file_checks``)
so that its first verdict on a run of thousands of small files does not check
them one by one. A worker's pass is kept as this process keeps its own
(``blobcheck.PROVEN``: name, SHA-256 of the bytes, facts); the verdict still reads
and hashes every file. These tests hold the verdicts to be exactly those of a
process without workers: the same findings, word for word, for every damage,
including a file changed after a worker checked it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import auditlog
from auditlog.read.api import parallel_file_checks
from auditlog.store import blobprove
from auditlog.store.blobcheck import PROVEN
from auditlog.store.blobs import SnapshotStore

LAYERS = 40  # 80 small files: over blobprove.MIN_FILES


def record(store: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=2):
        model = nn.Sequential(*(nn.Linear(3, 3) for _ in range(LAYERS)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()


def snapshot_files(store: Path) -> list[Path]:
    return sorted((store / "snapshots").glob("*/*.parquet"))


def findings(store: Path) -> list[str]:
    with auditlog.open(store) as opened:
        return [p.describe() for p in opened.run().verify().problems]


@pytest.fixture(params=["fork", "forkserver"])
def workers(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Two workers, forked (``auditlog ui`` before it serves) or from a fresh interpreter."""
    assert blobprove.start(2, request.param)
    try:
        provers = blobprove.active()
        yield provers is not None and provers.ready(60)
    finally:
        blobprove.stop()


def test_workers_check_the_files_of_a_verdict_and_later_ones_recall_them(
    store: Path, workers: bool
) -> None:
    record(store)
    files = snapshot_files(store)
    assert workers and len(files) >= blobprove.MIN_FILES
    assert findings(store) == []
    # Every file was checked for that verdict by a worker (or by this process, taking the
    # parts no worker had started) and kept; nothing was recalled yet.
    assert all(PROVEN.known(path.stem) for path in files) and PROVEN.hits == 0
    assert findings(store) == []  # the next verdict reads, hashes and recalls each file
    assert PROVEN.hits >= len(files) and PROVEN.misses == 0


def test_what_a_worker_found_is_what_this_process_finds(store: Path, workers: bool) -> None:
    record(store)
    names = [path.stem for path in snapshot_files(store)]
    snapshots = SnapshotStore(store / "snapshots")
    pending = snapshots.check_ahead(names)
    provers = blobprove.active()
    assert pending is not None and provers is not None
    deadline = time.monotonic() + 60
    while 1 not in provers._claims[: len(names)] and time.monotonic() < deadline:
        time.sleep(0.01)  # a worker begins a part (the claims are shared with it)
    passed = pending.passes()
    assert 1 in provers._claims[: len(names)]
    assert sorted(passed) == sorted(names)
    recalled = [snapshots.verify(name) for name in names]
    assert recalled == [passed[name] for name in names]
    assert PROVEN.hits == len(names)
    PROVEN.clear()
    assert [snapshots.verify(name) for name in names] == recalled  # checked here, in full
    assert PROVEN.hits == 0


def flip_inside(path: Path) -> None:
    data = bytearray(path.read_bytes())
    values = pq.read_table(path).column("value").to_numpy().tobytes()
    where = bytes(data).find(values)
    assert where > 0
    data[where + len(values) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def flip_outside(path: Path) -> None:
    data = bytearray(path.read_bytes())
    where = bytes(data).find(b"parquet-cpp-arrow version")
    assert where > 0
    data[where] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-9])


def test_damage_is_worded_as_a_process_without_workers_words_it(store: Path, workers: bool) -> None:
    record(store)
    files = snapshot_files(store)
    flip_inside(files[0])
    flip_outside(files[1])
    truncate(files[2])
    with_workers = findings(store)
    assert len(with_workers) >= 3  # each damaged file is reported (some more than once)
    assert any("does not match its name" in line for line in with_workers)
    assert any("the file's bytes hash to" in line for line in with_workers)
    assert any("unreadable" in line for line in with_workers)
    blobprove.stop()  # no workers: every file checked here
    PROVEN.clear()
    assert findings(store) == with_workers


def test_a_file_changed_after_a_worker_checked_it_is_checked_again(
    store: Path, workers: bool
) -> None:
    record(store)
    files = snapshot_files(store)
    pending = SnapshotStore(store / "snapshots").check_ahead([path.stem for path in files])
    assert pending is not None and len(pending.passes()) == len(files)
    flip_inside(files[0])  # after the worker's pass, before the verdict reads it
    problems = findings(store)
    assert problems and all(files[0].stem[:16] in line for line in problems)
    assert any("does not match its name" in line for line in problems)


def running(pid: int) -> bool:
    """Whether the process is alive (a zombie, killed and not yet reaped, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="watches /proc")
def test_workers_that_never_begin_cost_a_verdict_nothing(store: Path, workers: bool) -> None:
    """Stopped workers (hung, swapped out) begin no part: this process takes every part
    back and checks it, with the same findings, at once."""
    record(store)
    provers = blobprove.active()
    assert workers and provers is not None
    pids = started_workers(provers)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        assert findings(store) == []
        took = time.monotonic() - began
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert took < blobprove.WAIT_S
    assert all(PROVEN.known(path.stem) for path in snapshot_files(store))


def _stuck_in_workers(parent: int, check: Any) -> Any:
    def prove(root: str, names: list[str]) -> Any:
        if os.getpid() != parent:
            time.sleep(3600)  # a worker that began its part and never ends it
        return check(root, names)

    return prove


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="watches /proc")
def test_a_worker_stuck_in_its_part_delays_a_verdict_by_the_wait_only_and_is_killed(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that began a part and does not end it costs ``WAIT_S``, not a hang: its
    files are left to the verdict's own check (the same findings), and the workers are
    killed, so nothing waits for them later (the server's exit included)."""
    record(store)
    monkeypatch.setattr(
        blobprove, "prove_chunk", _stuck_in_workers(os.getpid(), blobprove.prove_chunk)
    )
    monkeypatch.setattr(blobprove, "WAIT_S", 1.0)
    assert blobprove.start(2, "fork")  # forked: the workers run the stuck check
    try:
        provers = blobprove.active()
        assert provers is not None
        pids = started_workers(provers)
        files = snapshot_files(store)
        pending = SnapshotStore(store / "snapshots").check_ahead([path.stem for path in files])
        assert pending is not None
        deadline = time.monotonic() + 30
        while 1 not in provers._claims[: len(files)] and time.monotonic() < deadline:
            time.sleep(0.01)  # until a worker has begun a part
        began = time.monotonic()
        passed = pending.passes()
        took = time.monotonic() - began
        assert 1.0 <= took < 30.0
        assert 0 < len(passed) < len(files)  # the parts taken back, not the stuck ones
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(map(running, pids)):
            time.sleep(0.05)
        assert not any(map(running, pids))
        assert SnapshotStore(store / "snapshots").check_ahead([path.stem for path in files]) is None
        assert findings(store) == []  # every file not passed is checked here
    finally:
        blobprove.stop()


def _failing_in_workers(parent: int, check: Any) -> Any:
    def prove(root: str, names: list[str]) -> Any:
        if os.getpid() != parent:
            raise KeyError("a failure of our own in a worker")
        return check(root, names)

    return prove


def test_a_part_that_fails_in_a_worker_is_checked_by_the_verdict(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a worker raises, the verdict stands: the part's files are checked here."""
    record(store)
    monkeypatch.setattr(
        blobprove, "prove_chunk", _failing_in_workers(os.getpid(), blobprove.prove_chunk)
    )
    assert blobprove.start(2, "fork")
    try:
        provers = blobprove.active()
        assert provers is not None
        started_workers(provers)
        files = snapshot_files(store)
        pending = SnapshotStore(store / "snapshots").check_ahead([path.stem for path in files])
        assert pending is not None
        deadline = time.monotonic() + 30
        while 1 not in provers._claims[: len(files)] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(pending.passes()) < len(files)  # the failed parts passed nothing
        assert findings(store) == []
        assert all(PROVEN.known(path.stem) for path in files)
    finally:
        blobprove.stop()


def started_workers(provers: blobprove.Provers) -> list[int]:
    assert provers.ready(60)
    deadline = time.monotonic() + 60
    while len(provers.pids()) < provers.workers and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = provers.pids()
    assert len(pids) == provers.workers
    return pids


def test_no_workers_on_one_cpu_and_none_after_the_block(store: Path) -> None:
    with parallel_file_checks(workers=1) as running:
        assert running is False
    record(store)
    names = [path.stem for path in snapshot_files(store)]
    assert SnapshotStore(store / "snapshots").check_ahead(names) is None
    assert findings(store) == [] and PROVEN.hits == 0  # every file checked here, in full


@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="watches /proc")
def test_workers_end_with_a_process_killed_outright(tmp_path: Path, method: str) -> None:
    """SIGKILL runs no cleanup: each worker watches the process that started it."""
    script = (
        "import sys, time\n"
        "from auditlog.store import blobprove\n"
        f"blobprove.start(2, {method!r})\n"
        "provers = blobprove.active()\n"
        "assert provers is not None and provers.ready(60)\n"
        "deadline = time.monotonic() + 60\n"
        "while len(provers.pids()) < 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(*provers.pids(), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
