"""CUDA checks of the recorder, for a machine with a GPU (not part of the CPU suite).

1. Host-device synchronizations caused by recording, counted with
   ``torch.cuda.set_sync_debug_mode("warn")`` and attributed to the thread that
   synchronized: the training thread must see none per hook call (statistics stay
   on the device; host copies for snapshots are non-blocking into pinned memory;
   the writer thread does the reading).
2. A CNN with BatchNorm trained on CUDA with a snapshot every step: the restored
   state_dict at several steps is bitwise equal to copies taken in the loop.
3. Step time of bare / minimal / audit / debug on a GPU MLP, as ratios.

    python benchmarks/gpu_check.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import warnings
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

import auditlog

DEV = "cuda"


def mlp(width: int = 1024, depth: int = 24) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10)).to(DEV)


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).to(DEV)


def train(model: nn.Module, steps: int, batch: torch.Tensor, target: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(batch), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


def count_syncs(ctx: Any, steps: int) -> Counter[str]:
    """Synchronizations per thread while training ``steps`` steps under ``ctx``."""
    seen: Counter[str] = Counter()
    original = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if "synchroniz" in str(message).lower():
            seen[threading.current_thread().name] += 1

    torch.manual_seed(0)
    x = torch.randn(256, 1024, device=DEV)
    y = torch.randint(0, 10, (256,), device=DEV)
    with ctx:
        model = mlp()
        torch.cuda.synchronize()
        warnings.showwarning = show
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                train(model, steps, x, y)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = original
    warnings.showwarning = original
    return seen


def check_restore(store: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    gen = torch.Generator(device=DEV).manual_seed(1)
    copies: dict[int, dict[str, torch.Tensor]] = {}
    with auditlog.record(store, snapshot_every=1, policy="debug"):
        model = cnn()
        copies[0] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(1, 6):
            x = torch.randn(8, 3, 16, 16, device=DEV, generator=gen)
            nn.functional.cross_entropy(model(x), torch.zeros(8, dtype=torch.long, device=DEV)).backward()
            opt.step()
            opt.zero_grad()
            copies[step] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    results = {}
    with auditlog.open(store) as s:
        run = s.run()
        for step in (0, 1, 3, 5):
            restored = run.state_dict(step=step)
            same = list(restored) == list(copies[step]) and all(
                torch.equal(restored[k].reshape(-1).view(torch.uint8), copies[step][k].reshape(-1).view(torch.uint8))
                for k in copies[step]
            )
            results[f"step {step}"] = same
        results["verify"] = run.verify().ok
        started = next(run.events(kinds=["run_started"]))["payload"]
        results["cuda_version"] = started["cuda"]
    return results


def timing(tmp: Path, steps: int, rounds: int) -> dict[str, float]:
    counter = iter(range(1000))
    configs = {
        "bare": lambda: nullcontext(),
        "minimal": lambda: auditlog.record(tmp / f"t{next(counter)}", policy="minimal"),
        "audit": lambda: auditlog.record(tmp / f"t{next(counter)}"),
        "debug": lambda: auditlog.record(tmp / f"t{next(counter)}", policy="debug"),
    }
    samples: dict[str, list[float]] = {k: [] for k in configs}
    x = torch.randn(256, 1024, device=DEV)
    y = torch.randint(0, 10, (256,), device=DEV)
    for _ in range(rounds):
        for name, make in configs.items():
            torch.manual_seed(0)
            with make():
                model = mlp()
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                for i in range(steps + 5):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    loss = nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    torch.cuda.synchronize()
                    if i >= 5:
                        samples[name].append(time.perf_counter() - start)
    bare = statistics.median(samples["bare"])
    return {"bare_ms": bare * 1e3, **{k: statistics.median(v) / bare for k, v in samples.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=".")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    tmp = Path(tempfile.mkdtemp(prefix="auditlog-gpu-"))
    steps = args.steps
    out["syncs_bare"] = dict(count_syncs(nullcontext(), steps))
    out["syncs_debug"] = dict(count_syncs(auditlog.record(tmp / "sync-debug", policy="debug"), steps))
    out["syncs_audit_snapshots"] = dict(
        count_syncs(auditlog.record(tmp / "sync-audit", snapshot_every=5), steps)
    )
    print(json.dumps(out, indent=1), flush=True)
    out["restore"] = check_restore(tmp / "restore")
    print(json.dumps(out["restore"], indent=1), flush=True)
    out["timing"] = timing(tmp, steps=40, rounds=3)
    print(json.dumps(out["timing"], indent=1), flush=True)
    Path(args.out, "gpu_check.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
