"""Device checks of the forensic capture (issue #14), for a machine with a GPU.

1. Synchronizations on the training thread while the loss is recorded every step
   (``audit``, an ``nn.CrossEntropyLoss`` module, steps 2..N counted with
   ``torch.cuda.set_sync_debug_mode("warn")``): expected none; and with
   ``nonfinite_check``: expected one per step (the documented cost).
2. The recorded losses equal the loss tensors read after training.
3. The ``flops`` event's forward count equals ``FlopCounterMode`` over the same forward on
   the device (the step's FLOPs are recorded as 3 x forward: the backward is estimated).
4. A NaN planted at step 7 on the device is named (producer, step) by
   ``auditlog nonfinite``; ``nonfinite_check`` catches it before the update.
5. Step time of bare / audit with loss=false / audit / nonfinite_check /
   keep_finite_state, as ratios (the cost of one scalar per step, of the check,
   of the copy).

    python benchmarks/gpu_forensics.py --out DIR            # CUDA
    python benchmarks/gpu_forensics.py --device cpu          # the same logic on CPU (no sync counts)
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
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

import auditlog

DEV = "cuda"


def model_and_data(
    width: int = 1024, depth: int = 12
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(DEV)
    return model, torch.randn(256, width, device=DEV), torch.randint(0, 10, (256,), device=DEV)


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def count_syncs(store: Path, steps: int, **options: Any) -> dict[str, Any]:
    """Syncs per thread during steps 2..N, and the losses recorded vs read afterwards."""
    seen: Counter[str] = Counter()
    original = warnings.showwarning

    def show(message: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message).lower():
            seen[threading.current_thread().name] += 1

    losses: list[torch.Tensor] = []
    with auditlog.record(store, **options):
        model, x, y = model_and_data()
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(steps):
            if step == 2 and DEV == "cuda":
                sync()
                warnings.simplefilter("always")
                warnings.showwarning = show
                torch.cuda.set_sync_debug_mode("warn")
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        if DEV == "cuda":
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = original
        sync()
    with auditlog.open(store) as s:
        recorded = [
            r["value"]
            for r in s.query(
                "select value from metrics where name = 'loss' order by seq", run="latest"
            )
        ]
    expected = [float(t.item()) for t in losses]
    return {
        "syncs_by_thread_steps_2_on": dict(seen),
        "losses_equal": recorded == expected,
        "losses": len(recorded),
    }


def check_flops(store: Path) -> dict[str, Any]:
    """The recorded forward count equals ``FlopCounterMode`` over the same forward; the
    step's training FLOPs are recorded as 3 x forward (capture/flops.py: the backward is
    estimated), shown beside the measured forward + backward for how close that is."""
    from torch.utils.flop_counter import FlopCounterMode

    model, x, y = model_and_data(width=256, depth=4)
    with FlopCounterMode(display=False) as counter:
        model(x)
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(model(x), y).backward()
    measured_step = counter.get_total_flops()
    with auditlog.record(store, policy="minimal"):
        model, x, y = model_and_data(width=256, depth=4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with auditlog.open(store) as s:
        events = [e["payload"] for e in s.run().events(kinds=["flops"])]
    return {
        "forward_recorded": [e.get("forward_flops") for e in events],
        "forward_expected": forward,
        "step_recorded": [e.get("flops") for e in events],
        "step_measured_forward_and_backward": measured_step,
        "ok": [(e.get("forward_flops"), e.get("flops")) for e in events]
        == [(forward, 3 * forward)],
    }


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def check_nonfinite(store: Path, **options: Any) -> dict[str, Any]:
    with auditlog.record(store, **options):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(4, 8), Log(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)
        ).to(DEV)
        with torch.no_grad():
            model[0].weight.zero_()
            model[0].bias.fill_(1.0)
        model[0].requires_grad_(False)
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        for step in range(10):
            if step == 7:
                with torch.no_grad():
                    model[0].bias.fill_(-1.0)
            loss = loss_fn(
                model(torch.randn(16, 4, device=DEV)), torch.randint(0, 3, (16,), device=DEV)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    with auditlog.open(store) as s:
        run = s.run()
        found = run.nonfinite().as_dict()
        caught = [(e["step"], e["payload"]["where"]) for e in run.events(kinds=["nonfinite_found"])]
    producer = found["producer"] or {}
    return {
        "step": found["step"],
        "phase": found["phase"],
        "producer": producer.get("module"),
        "caught": caught,
        "ok": found["step"] == 7 and (producer.get("module") == "1" or not options.get("policy")),
    }


def timing(tmp: Path, steps: int, rounds: int) -> dict[str, Any]:
    counter = iter(range(10**6))

    def rec(**options: Any) -> Any:
        return lambda: auditlog.record(tmp / f"t{next(counter)}", **options)

    configs: dict[str, Any] = {
        "bare": lambda: nullcontext(),
        "audit, loss=false": rec(loss=False),
        "audit": rec(),
        "audit + nonfinite_check": rec(nonfinite_check=True),
        "audit + keep_finite_state": rec(keep_finite_state=True),
    }
    samples: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(rounds):
        for name, make in configs.items():
            ctx: AbstractContextManager[Any] = make()
            with ctx:
                model, x, y = model_and_data()
                loss_fn = nn.CrossEntropyLoss()
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                for i in range(steps + 5):
                    if i == 5:
                        sync()
                        start = time.perf_counter()
                    loss = loss_fn(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                sync()
                samples[name].append((time.perf_counter() - start) / steps)
    bare = statistics.median(samples["bare"])
    return {
        "bare_ms": bare * 1e3,
        **{k: round(statistics.median(v) / bare, 4) for k, v in samples.items()},
    }


def main() -> None:
    global DEV
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=".")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    DEV = args.device
    if DEV == "cuda":
        assert torch.cuda.is_available(), "needs a CUDA device"
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if DEV == "cuda" else DEV,
        "torch": torch.__version__,
    }
    tmp = Path(tempfile.mkdtemp(prefix="auditlog-gpu-forensics-"))
    checks = (
        ("syncs_audit", lambda: count_syncs(tmp / "s1", 20)),
        ("syncs_nonfinite_check", lambda: count_syncs(tmp / "s2", 20, nonfinite_check=True)),
        ("flops", lambda: check_flops(tmp / "flops")),
        ("nonfinite_debug", lambda: check_nonfinite(tmp / "n1", policy="debug")),
        ("nonfinite_check", lambda: check_nonfinite(tmp / "n2", nonfinite_check=True)),
        ("timing", lambda: timing(tmp, args.steps, args.rounds)),
    )
    for name, check in checks:
        try:
            out[name] = check()
        except Exception as exc:  # one device call must bring back every answer
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(out[name]), flush=True)
        Path(args.out, "gpu_forensics.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
