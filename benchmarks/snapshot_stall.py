"""How long training waits for a periodic snapshot: the host copy, with and without kept buffers.

A snapshot costs the training thread its host copy (the writer hashes and
writes afterwards, while training goes on: ``benchmarks/snapshots.py``). This
times that wait in a real recording: an optimizer over a ``--gib`` state (one
large float32 parameter and 64 small ones) recorded with ``snapshot_every=1``
and policy ``minimal``. Every step is ``optimizer.step()`` with no gradients (the
update does nothing, so the step is the recorder's hooks and the snapshot), then
``Recording.flush()`` so the writer has stored the snapshot before the next one
(no overrun: only the host copy is timed). Rows, each in its own process,
interleaved over ``--rounds`` rounds (best round shown):

- ``kept buffers``: the recorder as it is (``capture/hostbuffers.py``: from the
  second snapshot on, the host copy goes into the last snapshot's buffers);
- ``fresh buffers``: the same with every host copy a fresh ``clone()`` (the
  behaviour before kept buffers);
- ``no snapshot``: ``snapshot_every=0``, the hooks alone;
- ``torch.save``: what a checkpoint written on the training thread makes it
  wait, for scale (same state, into the page cache).

The wait per snapshot is a snapshot step's time minus the ``no snapshot`` step
time, median over the ``--steps`` snapshots after the first (which the first,
untimed step takes, with the initial values: fresh memory in every row).

    python benchmarks/snapshot_stall.py                 # 0.5 GiB, 12 snapshots, 3 rounds
    python benchmarks/snapshot_stall.py --gib 2 --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = ("kept buffers", "fresh buffers", "no snapshot", "torch.save")


def _state(gib: float) -> dict[str, object]:
    import torch

    torch.manual_seed(0)
    small = 64 * 4096
    large = max(1, int(gib * 2**30 / 4) - 64 * small)
    state: dict[str, object] = {"large": torch.nn.Parameter(torch.randn(large))}
    for i in range(64):
        state[f"small{i}"] = torch.nn.Parameter(torch.randn(small))
    return state


def child(row: str, gib: float, steps: int) -> dict[str, object]:
    """One row, in this process: per-step times of ``optimizer.step()`` (seconds)."""
    import torch

    import auditlog
    from auditlog.capture import hostbuffers

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="auditlog-stall-") as scratch:
        if row == "torch.save":
            model = torch.nn.ParameterDict(_state(gib))
            for step in range(steps):
                began = time.perf_counter()
                torch.save(model.state_dict(), Path(scratch) / f"{step % 2}.pt")
                times.append(time.perf_counter() - began)
            return {"times": times}
        if row == "fresh buffers":  # every host copy a fresh clone, as before kept buffers
            hostbuffers.HostBuffers.copy_of = lambda self, source: source.clone(  # type: ignore[method-assign]
                memory_format=torch.contiguous_format
            )
        every = 0 if row == "no snapshot" else 1
        with auditlog.record(
            Path(scratch) / "store.db", policy="minimal", snapshot_every=every, snapshot_final=False
        ) as recording:
            model = torch.nn.ParameterDict(_state(gib))  # built while recording: registered
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            optimizer.step()  # the first step seals the initial values: not timed
            recording.flush(timeout=600)
            for _ in range(steps):
                began = time.perf_counter()
                optimizer.step()
                times.append(time.perf_counter() - began)
                recording.flush(timeout=600)
    return {"times": times}


def _run(row: str, gib: float, steps: int) -> list[float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", row, "--gib", str(gib), "--steps", str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"{row}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        )
    return list(json.loads(done.stdout.strip().splitlines()[-1])["times"])


def report(gib: float, steps: int, rounds: int) -> None:
    best: dict[str, list[float]] = {}
    for turn in range(rounds):
        order = ROWS[turn % len(ROWS) :] + ROWS[: turn % len(ROWS)]  # rotated: no row always first
        for row in order:
            times = _run(row, gib, steps)
            if row not in best or statistics.median(times) < statistics.median(best[row]):
                best[row] = times
    hooks = statistics.median(best["no snapshot"])
    save = statistics.median(best["torch.save"])
    waits = {row: statistics.median(best[row]) - hooks for row in ("kept buffers", "fresh buffers")}
    print(
        f"\n{gib:g} GiB state, {steps} snapshots after the first, best of {rounds} rounds "
        f"(a step without a snapshot: {hooks * 1e3:.1f} ms)\n"
    )
    print("| row | training waits per snapshot (median) | vs fresh buffers | vs torch.save |")
    print("|---|---:|---:|---:|")
    for row, wait in waits.items():
        print(
            f"| {row} | {wait:.3f} s | {wait / waits['fresh buffers']:.2f}x | {wait / save:.2f}x |"
        )
    print(f"| torch.save (the whole checkpoint, for scale) | {save:.3f} s | | 1.00x |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", type=float, default=0.5, help="state size in GiB")
    parser.add_argument("--steps", type=int, default=12, help="snapshots timed per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.gib, args.steps)))
        return
    report(args.gib, args.steps, args.rounds)


if __name__ == "__main__":
    main()
