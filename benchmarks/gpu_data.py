"""CUDA checks of the data capture (docs/data.md), for a machine with a GPU (not part of the
CPU suite).

1. An ``IterableDataset`` whose batches are CUDA tensors, produced by long kernel chains
   on a side stream (the loop runs under ``torch.cuda.stream(s)``): the recorded content
   hash of every batch equals ``auditlog.batch_hash`` computed by the script, and the step
   that trained on it is the script's. Without the stream event the writer's copy (on the
   default stream) could read a batch before its kernels finished: the same loop with
   the writer not waiting (``side_stream_without_events``) shows whether it does here.
2. The same loop on the default stream with ``torch.cuda.set_sync_debug_mode("warn")``:
   synchronizations on the training thread with and without recording (recording must
   add none: batches are hashed on the writer).
3. A map-style ``DataLoader`` with ``pin_memory=True``, batches moved with
   ``non_blocking=True``: the recorded sample indices of every step equal the sampler's,
   and the parameters are bitwise equal to an unrecorded run.
4. A CUDA batch changed in place right after it was drawn: its recorded hash is the
   script's hash of the batch as drawn, or absent with the reason; never another hash.

    python benchmarks/gpu_data.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import warnings
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import auditlog

DEV = "cuda"


class DeviceStream(IterableDataset[dict[str, torch.Tensor]]):
    """Batches made on the GPU by a chain of ``work`` large matrix products (milliseconds of
    queued kernels), the last of which writes the batch's values."""

    def __init__(self, batches: int, work: int) -> None:
        self.batches, self.work = batches, work

    def __iter__(self) -> Any:
        g = torch.Generator(device=DEV).manual_seed(3)
        big = torch.randn(4096, 4096, device=DEV, generator=g) / 64
        for i in range(self.batches):
            acc = big
            for _ in range(self.work):
                acc = acc @ big
            x = acc[:16, :32].contiguous() + i  # written by the last kernels of the chain
            yield {"x": x, "y": (x.sum(1) > 0).float()}


def hashes_recorded(store: Path) -> list[tuple[int, str | None, str | None]]:
    """(step, hash, reason) of every batch of the run's ``batches`` events."""
    out: list[tuple[int, str | None, str | None]] = []
    with auditlog.open(store) as s:
        for e in s.run().events(kinds=["batches"]):
            p = e["payload"]
            errors = {item["position"]: item["reason"] for item in p.get("hash_errors") or []}
            for n, (step, digest) in enumerate(zip(p["steps"], p["hashes"], strict=True)):
                out.append((step + 1, digest, errors.get(n) if digest is None else None))
    return out


def train_stream(store: Path | None, side: bool, batches: int, work: int) -> dict[str, Any]:
    torch.manual_seed(0)
    loader = DataLoader(DeviceStream(batches, work), batch_size=None)
    stream = torch.cuda.Stream() if side else None
    truth: list[tuple[int, str]] = []
    ctx: AbstractContextManager[Any] = (
        auditlog.record(store, batch_hash_every=1) if store else nullcontext()
    )
    with ctx as run, torch.cuda.stream(stream) if stream is not None else nullcontext():
        model = nn.Linear(32, 1).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for batch in loader:
            digest = auditlog.batch_hash(batch)  # the truth: on the loop's own stream
            (model(batch["x"]).squeeze(1) - batch["y"]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            truth.append((run.step if run is not None else 0, digest))
        torch.cuda.synchronize()
    if store is None:
        return {"batches": len(truth)}
    got = hashes_recorded(store)
    wrong = [
        i
        for i, ((s, h, _), (ts, th)) in enumerate(zip(got, truth, strict=True))
        if (s, h) != (ts, th)
    ]
    return {"batches": len(truth), "recorded": len(got), "mismatched": wrong, "ok": not wrong}


def without_stream_events(tmp: Path, batches: int, work: int) -> dict[str, Any]:
    """The side-stream loop with the writer not waiting for the batch's stream (the code
    before the fix): shows whether the race is real on this machine."""
    from auditlog.core import batchhash

    original = batchhash.BatchContent.hexdigest

    def hexdigest(self: batchhash.BatchContent) -> str:
        self.events = {}
        return original(self)

    batchhash.BatchContent.hexdigest = hexdigest  # type: ignore[method-assign]
    try:
        return train_stream(tmp / "unordered", True, batches, work)
    finally:
        batchhash.BatchContent.hexdigest = original  # type: ignore[method-assign]


def count_syncs(store: Path | None, batches: int) -> Counter[str]:
    seen: Counter[str] = Counter()

    def show(message: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message).lower():
            seen[threading.current_thread().name] += 1

    torch.manual_seed(0)
    loader = DataLoader(DeviceStream(batches, 1), batch_size=None)
    ctx: AbstractContextManager[Any] = (
        auditlog.record(store, batch_hash_every=1) if store else nullcontext()
    )
    with ctx:
        model = nn.Linear(32, 1).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        original = warnings.showwarning
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for batch in loader:
                    (model(batch["x"]).squeeze(1) - batch["y"]).pow(2).mean().backward()
                    opt.step()
                    opt.zero_grad()
            finally:
                torch.cuda.set_sync_debug_mode("default")
                warnings.showwarning = original
        torch.cuda.synchronize()
    return seen


class Indexed(TensorDataset):
    """A TensorDataset whose samples also carry their index: the truth of what was drawn."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return (*super().__getitem__(index), torch.tensor(index))


def pinned_map_style(tmp: Path) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    data = Indexed(torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g))
    finals = []
    drawn: list[list[int]] = []
    for store in (None, tmp / "pinned"):
        torch.manual_seed(0)
        drawn = []
        ctx: AbstractContextManager[Any] = auditlog.record(store) if store else nullcontext()
        with ctx:
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(DEV)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            loader = DataLoader(
                data,
                batch_size=8,
                shuffle=True,
                pin_memory=True,
                generator=torch.Generator().manual_seed(1),
            )
            for x, y, index in loader:
                drawn.append(index.tolist())
                x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
            finals.append([p.detach().cpu().clone() for p in model.parameters()])
    same = all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(*finals, strict=True)
    )
    with auditlog.open(tmp / "pinned") as s:
        rows = s.query("select step, batch, indices from batches order by seq, batch")
    recorded = [list(r["indices"]) for r in rows]
    steps_ok = [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return {
        "parameters_bitwise_equal": same,
        "indices_equal": recorded == drawn,
        "steps_equal": steps_ok,
        "batches": len(recorded),
        "ok": same and recorded == drawn and steps_ok,
    }


def changed_in_place(tmp: Path) -> dict[str, Any]:
    """Each batch is scaled in place right after it is drawn (version bump when queued)."""
    torch.manual_seed(0)
    truth: list[str] = []
    with auditlog.record(tmp / "inplace", batch_hash_every=1):
        model = nn.Linear(32, 1).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for batch in DataLoader(DeviceStream(6, 4), batch_size=None):
            truth.append(auditlog.batch_hash(batch))
            batch["x"].mul_(2)
            (model(batch["x"]).squeeze(1) - batch["y"]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
    got = hashes_recorded(tmp / "inplace")
    wrong = [
        i for i, ((_, h, _), t) in enumerate(zip(got, truth, strict=True)) if h not in (None, t)
    ]
    return {
        "batches": len(got),
        "hashed": sum(h is not None for _, h, _ in got),
        "reasons": sorted({r for _, h, r in got if h is None and r}),
        "wrong_hashes": wrong,
        "ok": not wrong and all(r for _, h, r in got if h is None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=".")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--work", type=int, default=24, help="matrix products per batch")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    tmp = Path(tempfile.mkdtemp(prefix="auditlog-gpu-data-"))
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    checks = (
        ("side_stream", lambda: train_stream(tmp / "side", True, args.batches, args.work)),
        ("side_stream_without_events", lambda: without_stream_events(tmp, args.batches, args.work)),
        ("default_stream", lambda: train_stream(tmp / "default", False, args.batches, args.work)),
        ("syncs_bare", lambda: dict(count_syncs(None, args.batches))),
        ("syncs_recorded", lambda: dict(count_syncs(tmp / "syncs", args.batches))),
        ("pinned_map_style", lambda: pinned_map_style(tmp)),
        ("changed_in_place", lambda: changed_in_place(tmp)),
    )
    for name, check in checks:
        try:
            out[name] = check()
        except Exception as exc:  # report and go on: one device call must bring back every answer
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(out[name]), flush=True)
        Path(args.out, "gpu_data.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
