"""The recorder's cost per training step in CPU instructions, counted by valgrind.

Wall-clock and even CPU-time ratios of a sub-millisecond step move by tens of
percent on a shared 2-CPU machine (other processes evict the caches, the clock
changes speed). An instruction count does not: the same code on the same inputs
executes the same instructions whatever else runs. So this benchmark trains a
``benchlib.WORKLOADS`` workload under ``valgrind --tool=callgrind`` with
instrumentation off, switches it on (``callgrind_control -i on``) for exactly
``--steps`` training steps, then for the writer's flush of those steps' records,
and reads the counts per thread (``--separate-threads``): the training thread's
instructions per step, and every other thread's (auditlog's writer).

Configurations: ``bare``; ``floor`` (bare plus what every preset must compute on
the training thread with nothing recorded: the gradient norms of every step with
the library's norm plan, one ``_foreach_norm`` for a small model, and the loss
read as a number); ``record-floor`` (the same plus
the two events of a step built, chained and inserted with the library's own
functions and nothing else: ``recordfloor.py``; ``record-floor-single``: one event a
step, the loss inside ``optimizer_step``); ``debug-floor``
(``overhead_configs.DebugStatisticsFloor``: ``debug``'s statistics computed
with the library's own functions in plain hooks, nothing recorded); the presets. The writer's
batching follows wall time (a batch every 0.1 s), which valgrind slows ~50x: its
interval is raised to 5 s so that its batches hold as many steps as in real time.

Instructions are not seconds (a cache miss costs more than an add), so this is
the measure for comparing two versions of the code, beside the wall-clock
ratios of ``overhead.py``. Needs valgrind; ~1.5 minutes per configuration of the
fast workload. A workload whose step is mostly arithmetic (the 98-module MLP)
runs ~50x slower under valgrind than natively: hours, not minutes.

    python benchmarks/instructions.py --models fast --configs bare,floor,minimal,audit
    python benchmarks/instructions.py --models deep --configs bare,debug-floor,debug --steps 50
    PYTHONPATH=/path/to/other/checkout python benchmarks/instructions.py ...  # another commit
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import WORKLOADS, machine_line, record_options
from overhead_configs import DebugStatisticsFloor
from recordfloor import RecordFloor

import auditlog
from auditlog.capture.norms import PlanCache

WARMUP = 30


def child(model: str, config: str, steps: int) -> None:
    """Train under the configuration; print GO when the counted steps start, DONE after."""
    torch.set_num_threads(1)
    work = WORKLOADS[model]
    if config == "debug-floor":
        DebugStatisticsFloor().begin(Path(tempfile.gettempdir()))
    floor = (
        RecordFloor(
            Path(tempfile.mkdtemp(prefix="auditlog-instr-")), single=config.endswith("-single")
        )
        if config.startswith("record-floor")
        else None
    )
    recording = (
        None
        if config in ("bare", "floor", "debug-floor") or floor is not None
        else auditlog.record(tempfile.mkdtemp(prefix="auditlog-instr-"), **record_options(config))
    )
    run = recording.__enter__() if recording is not None else None
    if run is not None and run.writer is not None:
        run.writer.interval = 5.0  # batches as large as in real time under valgrind
    torch.manual_seed(0)
    model_ = work.build()
    opt = work.optimizer(model_.parameters())
    x, y = work.batch()
    params = [p for group in opt.param_groups for p in group["params"]]
    # the library's norm plan, kept per optimizer and used as the recorder uses it for
    # gradients (one ``_foreach_norm`` for a small model; stacked groups for thousands
    # of small tensors)
    plans, identity = PlanCache(), tuple(map(id, params))

    def step() -> None:
        opt.zero_grad()
        loss = work.loss(model_(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        if config == "floor":
            with torch.no_grad():
                grads = [p.grad for p in params]
                plans.plan(id(opt), identity, grads).grad_norms(grads)
            loss.item()
        elif floor is not None:
            floor.step(opt, params, loss.item())
        opt.step()

    for _ in range(WARMUP):
        step()
    if run is not None:
        run.flush()
    print("GO", flush=True)
    time.sleep(2.0)  # the parent switches the counting on
    for _ in range(steps):
        step()
    if run is not None:
        run.flush()  # the writer's share of these steps
    if floor is not None:
        floor.close()  # its last rows inserted
    print("DONE", flush=True)
    time.sleep(2.0)
    if recording is not None:
        recording.__exit__(None, None, None)


def measure(model: str, config: str, steps: int, keep: Path | None = None) -> dict[str, float]:
    """Instructions per step: the training thread's and the other threads' (the writer).

    ``keep``: a folder for callgrind's files (``<model>-<config>.cg.out-<thread>``), to
    read per function with ``callgrind_annotate --inclusive=yes``; otherwise deleted."""
    out = Path(tempfile.mkdtemp(prefix="auditlog-callgrind-"))
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--separate-threads=yes",
        f"--callgrind-out-file={out}/cg.out",
        sys.executable,
        __file__,
        "--child",
        model,
        config,
        str(steps),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(("GO", "DONE")):
            action = "on" if line.startswith("GO") else "off"
            subprocess.run(
                ["callgrind_control", "-i", action, str(proc.pid)], capture_output=True, check=True
            )
    if proc.wait() != 0:
        raise RuntimeError(f"{config}: the training under valgrind failed (exit {proc.returncode})")
    threads = {}
    for path in out.glob("cg.out-*"):
        total = re.search(r"^totals:\s+(\d+)", path.read_text(errors="replace"), re.M)
        threads[int(path.name.rsplit("-", 1)[1])] = int(total.group(1)) if total else 0
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for path in out.glob("cg.out-*"):
            shutil.move(path, keep / f"{model}-{config}.{path.name}")
    shutil.rmtree(out, ignore_errors=True)
    training = threads.pop(1, 0)
    return {"training": training / steps, "others": sum(threads.values()) / steps}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="fast")
    parser.add_argument("--configs", default="bare,floor,minimal,audit")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2, help="configurations measured at once")
    parser.add_argument(
        "--keep", type=Path, help="keep callgrind's files here (callgrind_annotate reads them)"
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (callgrind_control): apt-get install valgrind")
    print(machine_line())
    print(f"command: python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}")
    configs = args.configs.split(",")
    for model in args.models.split(","):
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            runs = [
                pool.submit(measure, model, config, args.steps, args.keep) for config in configs
            ]
            found: dict[str, Any] = {c: r.result() for c, r in zip(configs, runs, strict=True)}
        base = found.get("bare")
        print(
            f"\n{model}: {WORKLOADS[model].description}; instructions per step, {args.steps} steps\n"
        )
        print(
            "| configuration | training thread | writer and other threads | total | total vs bare |"
        )
        print("|---|---:|---:|---:|---:|")
        for config, got in found.items():
            total = got["training"] + got["others"]
            ratio = f"{total / (base['training'] + base['others']):.3f}x" if base else "-"
            cells = " | ".join(f"{c / 1e3:,.0f} K" for c in (got["training"], got["others"], total))
            print(f"| {config} | {cells} | {ratio} |")


if __name__ == "__main__":
    main()
