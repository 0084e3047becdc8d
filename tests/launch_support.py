"""Real processes the tests launch: a ``torchrun`` job of two ranks, and recording
workers that write into one store at the same moment (the concurrency tests of
SQLite and PostgreSQL stores share them)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import REPO

AUDITLOG = Path(sys.executable).with_name("auditlog")


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def torchrun(
    tmp_path: Path,
    *auditlog_args: str,
    module: bool = False,
    torchrun_args: tuple[str, ...] = (),
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node=2 [--no-python auditlog | -m auditlog] ARGS``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUDITLOG_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    launcher = ["-m", "auditlog"] if module else ["--no-python", str(AUDITLOG)]
    # A port of its own: torchrun's default (29500) is shared by every job on the machine,
    # so two test processes (or a user's job) would meet in one rendezvous.
    port = (
        ()
        if any(a.startswith("--master") for a in torchrun_args)
        else (f"--master-port={free_port()}",)
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            *port,
            *torchrun_args,
            *launcher,
            *auditlog_args,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


WORKERS = 4

WORKER = r"""
import os, sys, time
from pathlib import Path

store, go, key_path, index = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
import torch
from torch import nn

import auditlog
from auditlog.integrity.checkpoints import checkpoint_head
from auditlog.integrity.keys import load_private_key
from auditlog.store.eventstore import EventStore

key = load_private_key(Path(key_path))
Path(f"{go}.ready{index}").touch()
deadline = time.time() + 60
while not go.exists():
    if time.time() > deadline:
        sys.exit("no start signal")
    time.sleep(0.002)
with auditlog.record(store=store, name=f"worker-{index}") as run:
    torch.manual_seed(index)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.flush()  # one committed batch per step: more interleaved transactions
if run.run_id is None:
    sys.exit("not recorded")
event_store = EventStore.open(store)
try:
    made = checkpoint_head(event_store, key, run.run_id, run.stream)
finally:
    event_store.close()
print(run.run_id, made.seq)
"""


def start_workers(store: Path, key: Path, tmp_path: Path) -> list[tuple[str, int]]:
    """Start the workers, release them together, and return (run id, signed seq) of each."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    go = tmp_path / "go"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AUDITLOG_STORE", "AUDITLOG_RUN_ID", "RANK")
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(store), str(go), str(key), str(i)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    deadline = time.time() + 60
    while not all((tmp_path / f"go.ready{i}").exists() for i in range(WORKERS)):
        assert time.time() < deadline, "workers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "database is locked" not in err, err
        assert "cannot write to store" not in err, err
        assert "cannot record" not in err, err
        run_id, seq = out.split()
        results.append((run_id, int(seq)))
    return results
