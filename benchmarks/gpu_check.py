"""CUDA checks of the recorder, for a machine with a GPU (not part of the CPU suite).

1. Host-device synchronizations caused by recording, counted with
   ``torch.cuda.set_sync_debug_mode("warn")`` and attributed to the thread that
   synchronized: the training thread must see none per hook call (statistics stay
   on the device; host copies for snapshots are non-blocking into pinned memory;
   the writer thread does the reading).
2. A CNN with BatchNorm trained on CUDA with a snapshot every step: the restored
   state_dict at several steps is bitwise equal to copies taken in the loop.
3. Recorded (debug, snapshots) vs unrecorded training: parameters bitwise equal.
4. Gradient and update norms recorded on CUDA equal norms computed from copies.
5. Step time of bare / minimal / audit / debug on a GPU MLP, as ratios.

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
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
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

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
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


def check_bitwise(tmp: Path, steps: int) -> dict[str, Any]:
    """Recorded (debug, snapshots every step) vs unrecorded training: parameters bitwise equal?"""
    finals = []
    for ctx in (nullcontext(), auditlog.record(tmp / "bitwise", policy="debug", snapshot_every=2)):
        torch.manual_seed(0)
        x = torch.randn(256, 1024, device=DEV)
        y = torch.randint(0, 10, (256,), device=DEV)
        with ctx:
            model = mlp()
            train(model, steps, x, y)
            torch.cuda.synchronize()
            finals.append([p.detach().cpu().clone() for p in model.parameters()])
    same = all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(*finals, strict=True)
    )
    return {"parameters_bitwise_equal": same, "tensors": len(finals[0])}


def check_update_norms(tmp: Path) -> dict[str, Any]:
    """update_norm/grad_norm recorded on CUDA vs computed here from copies around opt.step()."""
    torch.manual_seed(0)
    expected_update: list[list[float]] = []
    expected_grad: list[list[float]] = []
    with auditlog.record(tmp / "norms", policy="debug"):
        model = mlp(width=256, depth=4)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(64, 256, device=DEV)
        y = torch.randint(0, 10, (64,), device=DEV)
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            before = [p.detach().clone() for p in model.parameters()]
            expected_grad.append([float(p.grad.norm()) for p in model.parameters()])
            opt.step()
            expected_update.append(
                [
                    float((p.detach() - b).norm())
                    for p, b in zip(model.parameters(), before, strict=True)
                ]
            )
    with auditlog.open(tmp / "norms") as s:
        steps = [e["payload"] for e in s.run().events(kinds=["optimizer_step"])]
    worst = 0.0
    for payload, upd, grad in zip(steps, expected_update, expected_grad, strict=True):
        for got, want in zip(
            payload["update_norm"] + payload["grad_norm"], upd + grad, strict=True
        ):
            worst = max(worst, abs(got - want) / max(abs(want), 1e-12))
    return {"steps": len(steps), "worst_relative_error": worst, "ok": worst < 1e-4}


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
            nn.functional.cross_entropy(
                model(x), torch.zeros(8, dtype=torch.long, device=DEV)
            ).backward()
            opt.step()
            opt.zero_grad()
            copies[step] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    results = {}
    with auditlog.open(store) as s:
        run = s.run()
        for step in (0, 1, 3, 5):
            restored = run.state_dict(step=step)
            same = list(restored) == list(copies[step]) and all(
                torch.equal(
                    restored[k].reshape(-1).view(torch.uint8),
                    copies[step][k].reshape(-1).view(torch.uint8),
                )
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
    # Means, not medians: a median of single steps would hide the sampled ones.
    bare = statistics.fmean(samples["bare"])
    return {"bare_ms": bare * 1e3, **{k: statistics.fmean(v) / bare for k, v in samples.items()}}


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
    out["syncs_debug"] = dict(
        count_syncs(auditlog.record(tmp / "sync-debug", policy="debug"), steps)
    )
    out["syncs_audit"] = dict(count_syncs(auditlog.record(tmp / "sync-audit"), steps))
    out["syncs_audit_snapshots"] = dict(
        count_syncs(auditlog.record(tmp / "sync-audit-snap", snapshot_every=5), steps)
    )
    print(json.dumps(out, indent=1), flush=True)
    checks = (
        ("restore", lambda: check_restore(tmp / "restore")),
        ("bitwise", lambda: check_bitwise(tmp, steps)),
        ("update_norms", lambda: check_update_norms(tmp)),
        ("timing", lambda: timing(tmp, steps=100, rounds=3)),
    )
    for name, check in checks:
        try:
            out[name] = check()
        except Exception as exc:  # report and go on: one device call must bring back every answer
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(out[name], indent=1), flush=True)
        Path(args.out, "gpu_check.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
