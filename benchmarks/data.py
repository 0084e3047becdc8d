"""What recording the data costs (issue 31): per-step time of a tiny MLP fed by a
DataLoader, recorded vs not, with the data watch on and off; bytes per batch in
the store; the writer's time to fingerprint a folder of files.

Workload: a 2-layer MLP (32 -> 64 -> 10) on a ``TensorDataset`` of 4,096 samples,
batch 32, shuffled by a seeded generator, SGD: a step of ~0.3 ms, so any
per-batch cost of the data watch shows. Configurations run interleaved in
rounds; each round trains ``--steps`` steps per configuration after a warm-up
epoch; the figure is the median over rounds of the mean step time.

    python benchmarks/data.py --rounds 5 --steps 1024

``--iterable``: instead, the cost of an ``IterableDataset``'s batch hashes (policy
``batch_hash_every``): per batch of three sizes (4 KiB, 128 KiB, 1.5 MiB of float32),
the training thread's CPU time (``thread_time``) to iterate a loader whose fetch
costs nothing, bare, recorded without hashes and recorded with them; the wall time
per batch until the writer has hashed them all (``run.flush()``); and what hashing
the batch on the training thread would have cost (``auditlog.batch_hash``).

    python benchmarks/data.py --iterable --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from benchlib import machine_line
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import auditlog

CONFIGS = ("bare", "audit, data=false", "audit")


def _loader() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(4096, 32, generator=generator),
        torch.randint(0, 10, (4096,), generator=generator),
    )
    return DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(1))


def _steps(config: str, steps: int, store: Path) -> tuple[float, float]:
    """Mean (wall, CPU) seconds per step (data loading, forward, backward, step) after one
    warm-up epoch; CPU: every thread of this process (the writer's work counts), which a
    loaded machine disturbs less than wall time."""
    torch.manual_seed(0)
    context: Any = (
        nullcontext() if config == "bare" else auditlog.record(store, data=config == "audit")
    )
    with context as run:
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = _loader()

        def epoch(limit: int) -> int:
            done = 0
            while done < limit:
                for x, y in loader:
                    loss_fn(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                    done += 1
                    if done == limit:
                        break
            return done

        epoch(128)
        start, cpu = time.perf_counter(), time.process_time()
        epoch(steps)
        if run is not None:
            run.flush()  # the writer's share of these steps, in the CPU figure
        return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def _iteration_cost(rounds: int, batches: int = 2048) -> dict[str, float]:
    """Training-thread CPU (``thread_time``: neither the writer nor other processes) per
    batch of iterating a DataLoader whose fetch costs nothing, data watch on vs off; and
    the writer's packing per batch (``Batches.resolve``)."""
    import random

    from auditlog.capture.data import Batches

    class Cheap(torch.utils.data.Dataset[int]):
        def __len__(self) -> int:
            return 1 << 16

        def __getitem__(self, index: int) -> int:
            return index

    loader = DataLoader(
        Cheap(),
        batch_size=32,
        shuffle=True,
        collate_fn=len,
        generator=torch.Generator().manual_seed(0),
    )
    per: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name in ("off", "on") if r % 2 else ("on", "off"):
                with auditlog.record(
                    Path(tmp) / f"{r}{name}", data=name == "on", snapshot_final=False
                ):
                    it = iter(loader)
                    start = time.thread_time()
                    for _ in range(batches):
                        next(it)
                    per[name].append((time.thread_time() - start) / batches)
    sample = [(i, random.sample(range(4096), 32), True, None) for i in range(256)]
    start = time.perf_counter()
    for _ in range(20):
        Batches({}, list(sample)).resolve()
    return {
        "off_us": statistics.median(per["off"]) * 1e6,
        "on_us": statistics.median(per["on"]) * 1e6,
        "writer_us": (time.perf_counter() - start) / 20 / 256 * 1e6,
    }


ITERABLE_SHAPES = ((32, 32), (32, 1024), (32, 3, 64, 64))
ITERABLE_CONFIGS = ("bare", "batch_hash_every=0", "batch_hash_every=1")


def _iterable_cost(rounds: int, batches: int = 512) -> None:
    """Per-batch cost of hashing an IterableDataset's batches, side by side with bare."""
    for shape in ITERABLE_SHAPES:
        batch = {
            "x": torch.randn(*shape, generator=torch.Generator().manual_seed(0)),
            "y": torch.arange(shape[0]),
        }

        class Stream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
            def __init__(self, item: dict[str, torch.Tensor]) -> None:
                self.item = item

            def __iter__(self) -> Any:
                for _ in range(batches):
                    yield self.item

        loader = DataLoader(Stream(batch), batch_size=None)
        thread: dict[str, list[float]] = {c: [] for c in ITERABLE_CONFIGS}
        wall: dict[str, list[float]] = {c: [] for c in ITERABLE_CONFIGS}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                for config in ITERABLE_CONFIGS[r % 3 :] + ITERABLE_CONFIGS[: r % 3]:
                    every = None if config == "bare" else int(config.rsplit("=", 1)[1])
                    context: Any = (
                        nullcontext()
                        if every is None
                        else auditlog.record(
                            Path(tmp) / f"{r}-{config}",
                            batch_hash_every=every,
                            snapshot_final=False,
                        )
                    )
                    with context as run:
                        start, cpu = time.perf_counter(), time.thread_time()
                        for _ in loader:
                            pass
                        thread[config].append((time.thread_time() - cpu) / batches)
                        if run is not None:
                            run.flush()  # the writer has hashed every batch
                        wall[config].append((time.perf_counter() - start) / batches)
        start = time.perf_counter()
        for _ in range(64):
            auditlog.batch_hash(batch)
        inline = (time.perf_counter() - start) / 64
        nbytes = sum(t.numel() * t.element_size() for t in batch.values())
        med = {
            c: (statistics.median(thread[c]) * 1e6, statistics.median(wall[c]) * 1e6)
            for c in ITERABLE_CONFIGS
        }
        print(
            f"batch {nbytes / 1024:,.0f} KiB: training thread "
            + ", ".join(f"{c} {med[c][0]:.1f} us" for c in ITERABLE_CONFIGS)
            + f" (hashing +{med['batch_hash_every=1'][0] - med['batch_hash_every=0'][0]:.1f} us); wall to hashed "
            + ", ".join(f"{c} {med[c][1]:.1f} us" for c in ITERABLE_CONFIGS)
            + f"; batch_hash on the training thread {inline * 1e6:.1f} us"
        )


def _store_bytes(store: Path) -> tuple[int, int, int]:
    """(batches, payload bytes of the batches events, payload bytes of an optimizer_step)."""
    import sqlite3

    con = sqlite3.connect(store / "events.db")
    try:
        rows = con.execute("SELECT payload FROM events WHERE kind = 'batches'").fetchall()
        step = con.execute(
            "SELECT length(payload) FROM events WHERE kind = 'optimizer_step' LIMIT 1"
        ).fetchone()
    finally:
        con.close()
    count = sum(json.loads(r[0])["count"] for r in rows)
    return count, sum(len(r[0]) for r in rows), int(step[0]) if step else 0


def _fingerprint_time(root: Path, files: int, size: int) -> dict[str, Any]:
    """The writer's hashing of a folder dataset (``hashing`` of its dataset_seen)."""

    class Folder(torch.utils.data.Dataset[int]):
        def __init__(self) -> None:
            self.samples = [(str(root / f"{i}.bin"), 0) for i in range(files)]

        def __len__(self) -> int:
            return files

        def __getitem__(self, index: int) -> int:
            return index

    root.mkdir()
    for i in range(files):
        (root / f"{i}.bin").write_bytes(bytes([i % 256]) * size)
    store = root.parent / "fingerprint-store"
    start = time.perf_counter()
    with auditlog.record(store):
        iterator_start = time.perf_counter()
        next(iter(DataLoader(Folder(), batch_size=4)))
        on_training_thread = time.perf_counter() - iterator_start
    with auditlog.open(store) as s:
        (seen,) = [e["payload"] for e in s.run().events() if e["kind"] == "dataset_seen"]
    return {
        "training_thread_s": on_training_thread,
        "total_s": time.perf_counter() - start,
        **seen["identity"]["hashing"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument(
        "--iterable", action="store_true", help="the cost of batch hashes (IterableDataset)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_line())
    if args.iterable:
        _iterable_cost(args.rounds)
        return
    wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for config in CONFIGS[r % 3 :] + CONFIGS[: r % 3]:  # each configuration in each place
                w, c = _steps(config, args.steps, Path(tmp) / f"{r}-{config}")
                wall[config].append(w)
                cpu[config].append(c)
        for name, times in (("wall", wall), ("cpu", cpu)):
            bare = statistics.median(times["bare"])
            for config in CONFIGS:
                value = statistics.median(times[config])
                print(f"{name} {config:20s} {value * 1e3:7.3f} ms/step  {value / bare:5.2f}x bare")
            watch = statistics.median(times["audit"]) - statistics.median(
                times["audit, data=false"]
            )
            print(f"{name} data watch: {watch * 1e6:+.1f} us/step")
        cost = _iteration_cost(args.rounds)
        print(
            f"training thread per batch (cheap fetch): {cost['off_us']:.1f} us off, {cost['on_us']:.1f} us on "
            f"(+{cost['on_us'] - cost['off_us']:.1f} us); writer packing {cost['writer_us']:.1f} us per batch of 32"
        )
        batches, payload, step = _store_bytes(Path(tmp) / "0-audit")
        print(
            f"batches events: {batches} batches, {payload} bytes ({payload / batches:.0f} bytes/batch of 32 "
            f"indices); an optimizer_step event here: {step} bytes"
        )
        found = _fingerprint_time(Path(tmp) / "folder", files=2000, size=32 << 10)
        print("fingerprint of 2,000 files of 32 KiB (62.5 MiB): " + json.dumps(found))


if __name__ == "__main__":
    main()
