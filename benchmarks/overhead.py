"""Step-time overhead of recording, as ratios to bare training measured side by side.

Model (issue #5's reference): 24 x [Linear(256), LayerNorm, GELU] + head, batch 64,
SGD, 2 CPU threads. Configurations run interleaved in rounds so machine noise hits
them alike; the table shows the median step time of each relative to bare.

    python benchmarks/overhead.py [--steps 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

import auditlog


def build() -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(24):
        layers += [nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


class EmptyHooks(AbstractContextManager[None]):
    """Empty global forward pre/post hooks: the floor for any module-hook capture."""

    def __enter__(self) -> None:
        self.handles = [
            nn_module.register_module_forward_pre_hook(lambda m, a: None),
            nn_module.register_module_forward_hook(lambda m, a, o: None),
        ]

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()


def time_steps(ctx: Callable[[], AbstractContextManager[Any]], steps: int) -> list[float]:
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    y = torch.randint(0, 10, (64,))
    with ctx():
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        times = []
        for i in range(steps + 3):
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 3:  # warm-up steps (first forward seals the model)
                times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="auditlog-bench-")
    counter = iter(range(10_000))

    def rec(**options: Any) -> Callable[[], AbstractContextManager[Any]]:
        return lambda: auditlog.record(f"{tmp}/s{next(counter)}", **options)

    configs: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "bare": nullcontext,
        "empty forward hooks": EmptyHooks,
        "auditlog, activity every step": rec(),
        "auditlog, activity every 10th step": rec(activity_every=10),
        "auditlog, no backward activity": rec(backward="none"),
        "auditlog, steps only (activity off)": rec(activity_every=10**9),
    }
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, ctx in configs.items():
            samples[name].extend(time_steps(ctx, args.steps))
    bare = statistics.median(samples["bare"])
    print(f"median step time, bare: {bare * 1e3:.2f} ms ({args.rounds} rounds x {args.steps} steps)")
    print("| configuration | step time vs bare |\n|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values) / bare:.2f}x |")


if __name__ == "__main__":
    main()
