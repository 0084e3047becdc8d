"""The recorder's fixed cost per optimizer step, as CPU time on each thread.

Wall-clock ratios of a sub-millisecond step move by tens of percent on a shared
2-CPU machine; CPU time spent by one thread moves much less. With one torch
thread (all of training's work on the training thread), this trains a
workload of ``benchlib.WORKLOADS`` bare and under each preset, in rounds, and
prints per step: the training thread's CPU time, the part of it inside
auditlog's hooks (``benchlib.HOOKS``, outermost call only) and the writer
thread's CPU time (``Writer._drain_once``). Hooks plus writer is what the GIL
serializes with training; the training thread's excess over bare also holds
what no hook shows (the ``backward()`` wrapper's own frame, cache effects).

    python benchmarks/hookcpu.py --models fast --presets minimal,audit
    PYTHONPATH=/path/to/other/checkout python benchmarks/hookcpu.py ...   # the same on another commit
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import WORKLOADS, hook_methods, machine_line

import auditlog
from auditlog.recording import writer as writer_module

SPENT: dict[str, float] = {"hooks": 0.0, "writer": 0.0}
_DEPTH = [0]


def _timed(function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _DEPTH[0]:
            return function(*args, **kwargs)
        _DEPTH[0] = 1
        began = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT["hooks"] += time.thread_time() - began
            _DEPTH[0] = 0

    return wrapper


def _install() -> None:
    for owner, name in hook_methods():
        setattr(owner, name, _timed(getattr(owner, name)))
    drain = writer_module.Writer._drain_once

    def timed_drain(writer: Any) -> bool:
        began = time.thread_time()
        try:
            return drain(writer)
        finally:
            SPENT["writer"] += time.thread_time() - began

    writer_module.Writer._drain_once = timed_drain  # type: ignore[method-assign]


def run(
    preset: str, workload: str, steps: int, warmup: int = 20
) -> tuple[float, float, float, float]:
    """(training thread CPU, in hooks, writer CPU, wall), ms per step over ``steps`` steps."""
    w = WORKLOADS[workload]
    torch.manual_seed(0)
    x, y = w.batch()
    with tempfile.TemporaryDirectory(prefix="auditlog-hookcpu-") as scratch:
        recording = (
            auditlog.record(Path(scratch) / "store", policy=preset) if preset != "bare" else None
        )
        if recording is not None:
            recording.__enter__()
        model = w.build()
        optimizer = w.optimizer(model.parameters())
        cpu0 = wall0 = 0.0
        for i in range(steps + warmup):
            if i == warmup:
                if recording is not None:
                    recording.flush(None)
                SPENT.update(hooks=0.0, writer=0.0)
                cpu0, wall0 = time.thread_time(), time.perf_counter()
            loss = w.loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
        if recording is not None:
            recording.flush(None)
        hooks, writer = SPENT["hooks"], SPENT["writer"]
        if recording is not None:
            recording.__exit__(None, None, None)
    return cpu / steps * 1e3, hooks / steps * 1e3, writer / steps * 1e3, wall / steps * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="fast")
    parser.add_argument("--presets", default="minimal,audit")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    _install()
    print(machine_line())
    print(
        "command: python benchmarks/hookcpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    rows = ["bare", *args.presets.split(",")]
    for workload in args.models.split(","):
        results: dict[str, list[tuple[float, float, float, float]]] = {row: [] for row in rows}
        for _ in range(args.rounds):
            for row in rows:
                results[row].append(run(row, workload, args.steps))
        print(
            f"\n{workload}: ms per step, medians of {args.rounds} rounds of {args.steps} steps, 1 torch thread\n"
        )
        print("| preset | training thread CPU | in hooks | writer CPU | hooks + writer | wall |")
        print("|---|---:|---:|---:|---:|---:|")
        for row in rows:
            cpu, hooks, writer, wall = (
                statistics.median(r[i] for r in results[row]) for i in range(4)
            )
            print(
                f"| {row} | {cpu:.3f} | {hooks:.3f} | {writer:.3f} | {hooks + writer:.3f} | {wall:.3f} |"
            )


if __name__ == "__main__":
    main()
