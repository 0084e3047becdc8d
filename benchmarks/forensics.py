"""What the forensic capture costs (issue #14), as ratios measured side by side in one run.

Workload: the 98-module MLP of ``benchlib`` trained with an ``nn.CrossEntropyLoss``
module (so the loss hooks are active), a fixed batch, SGD. Configurations run
interleaved in rounds; each round builds a fresh model inside the configuration,
warms up, then times ``--steps`` steps; the reported figure is the median over
rounds of (mean step time / the bare mean of the same round).

Rows:

- ``audit, loss=false`` vs ``audit``: what recording the loss every step costs
  (per-module hooks on the loss module and the root; one scalar per step);
- ``audit + nonfinite_check``: the gradient check before every update (a second
  norm pass; on CUDA also a sync);
- ``audit + keep_finite_state``: a copy of every parameter before every step;
- ``debug`` with and without the forensic statistics of sampled steps (input
  NaN/Inf checks and dead-unit counts; "without" patches them out here, there
  is no switch): what they add to a step whose activity is recorded;
- the one step whose FLOPs are counted (step 0), against step 0 with
  ``flops=false``.

Timings on a loaded machine are not the numbers to quote: rerun on a quiet one.

    python benchmarks/forensics.py --rounds 5 --steps 50
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from benchlib import machine_line, mlp
from torch import nn

import auditlog
from auditlog.capture import activity
from auditlog.core import tensors


@contextmanager
def without_forensic_stats() -> Iterator[None]:
    """``debug`` as it was before issue #14: no input checks, no dead units."""
    check = activity.ActivityHooks._input_check
    stats = activity.activity_stats
    activity.ActivityHooks._input_check = lambda self, args: None  # type: ignore[method-assign]
    activity.activity_stats = lambda t, full=True, units=False: tensors.activity_stats(t, full)  # type: ignore[assignment]
    try:
        yield
    finally:
        activity.ActivityHooks._input_check = check  # type: ignore[method-assign]
        activity.activity_stats = stats


def configs(tmp: Path) -> dict[str, Callable[[], AbstractContextManager[Any]]]:
    counter = iter(range(10**6))

    def rec(**options: Any) -> Callable[[], AbstractContextManager[Any]]:
        return lambda: auditlog.record(tmp / f"r{next(counter)}", **options)

    @contextmanager
    def debug_plain() -> Iterator[None]:
        with without_forensic_stats(), auditlog.record(tmp / f"r{next(counter)}", policy="debug"):
            yield

    return {
        "bare": lambda: nullcontext(),
        "audit, loss=false": rec(loss=False),
        "audit": rec(),
        "audit + nonfinite_check": rec(nonfinite_check=True),
        "audit + keep_finite_state": rec(keep_finite_state=True),
        "debug without forensic stats": debug_plain,
        "debug": rec(policy="debug"),
    }


def steps_timed(
    make: Callable[[], AbstractContextManager[Any]], steps: int, warmup: int
) -> tuple[float, float]:
    """(mean step time after warm-up, time of step 0)."""
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    loss_fn = nn.CrossEntropyLoss()
    times = []
    with make():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(warmup + steps):
            start = time.perf_counter()
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
    return statistics.fmean(times[warmup:]), times[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tmp = Path(tempfile.mkdtemp(prefix="auditlog-forensics-"))
    table = configs(tmp)
    ratios: dict[str, list[float]] = {name: [] for name in table}
    ms: dict[str, list[float]] = {name: [] for name in table}
    first_step: dict[str, list[float]] = {"flops": [], "no flops": []}
    for _ in range(args.rounds):
        means = {name: steps_timed(make, args.steps, args.warmup) for name, make in table.items()}
        for name, (mean, _first) in means.items():
            ratios[name].append(mean / means["bare"][0])
            ms[name].append(mean * 1e3)
        # step 0 with and without the FLOP count (minimal policy elsewhere, so step 0 differs only by it)
        first_step["flops"].append(
            steps_timed(
                lambda: auditlog.record(tmp / f"f{time.time_ns()}", policy="minimal"), 1, 0
            )[1]
        )
        first_step["no flops"].append(
            steps_timed(
                lambda: auditlog.record(tmp / f"n{time.time_ns()}", policy="minimal", flops=False),
                1,
                0,
            )[1]
        )
    print(machine_line())
    print(
        f"{args.rounds} rounds x {args.steps} steps, 98-module MLP, batch 64, CrossEntropyLoss module, SGD"
    )
    print(f"{'configuration':34} {'ms/step':>9} {'vs bare':>9}")
    for name in table:
        print(
            f"{name:34} {statistics.median(ms[name]):9.2f} {statistics.median(ratios[name]):9.3f}"
        )
    flops, plain = statistics.median(first_step["flops"]), statistics.median(first_step["no flops"])
    print(
        f"step 0 with FLOP counting: {flops * 1e3:.1f} ms, without: {plain * 1e3:.1f} ms "
        f"({flops / plain:.2f}x, once per run)"
    )


if __name__ == "__main__":
    main()
