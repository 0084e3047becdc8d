"""Step-time overhead of recording, beside its peers, as ratios to bare training.

Issue #5's table: on two models (the 98-module MLP of the issue, and a small
transformer, see ``benchlib.WORKLOADS``), every configuration trains the same
fixed batch; configurations run interleaved in rounds (in a shuffled order per
round) so machine noise hits them alike. Each round builds a fresh model inside
the configuration (so auditlog records construction and sealing too), runs
``--warmup`` steps, waits for auditlog's writer to finish the one-off work of
construction (hashing and storing the sealed initial values: the "startup
writer drain" column), then times ``--steps`` steps in blocks of 100. A block
holds exactly one period of every periodic configuration (auditlog's default
samples module activity every 100th step, update norms and structural checks
every 10th; wandb and TensorBoard log every 10th), so the block mean is the
honest per-step cost (a median of single steps would hide the sampled ones).
Within a round every configuration runs between two bare runs (bare, c1, bare,
c2, bare, ...): this machine's speed drifts in phases of seconds, so a
configuration is compared with the bare training right before and after it.
"vs bare" is the median over rounds of (the configuration's median block / the
mean of the two neighbouring bare runs' median blocks); "ms/step" is the median
block.

Other processes on a 2-CPU machine (a test suite) do not slow all
configurations alike (OpenMP's spinning workers suffer most), so the benchmark
measures their CPU use during every round and only counts clean rounds; it runs
rounds until ``--rounds`` clean ones are in or ``--budget`` minutes have passed.

Rows: bare; empty global forward pre+post hooks (the floor for any module-hook
capture); the same plus empty global full backward pre+post hooks; two floors
that compute auditlog's numbers with nothing recorded (per-step gradient norms,
which every preset keeps; ``debug``'s statistics of every module output and
gradient plus gradient/parameter/update norms every step); auditlog's
minimal / audit / debug presets (``benchlib.PRESETS``); wandb.watch(log="all")
offline at log_freq 10 and 1 (each step also calls ``run.log``, which commits
the histograms as a training loop would; the "wandb.log only" row is that call
alone); TensorBoard ``add_histogram`` of every parameter and gradient every 10
steps. wandb and tensorboard are optional (``pip install -e '.[bench]'``); rows
whose package is missing print "not installed". wandb runs with
WANDB_MODE=offline, its files in a temporary directory, no console capture, no
system statistics, no git or code saving: it never reaches the network or
prompts.

    python benchmarks/overhead.py                     # both models, ~7 minutes on a quiet 2-CPU machine
    python benchmarks/overhead.py --rounds 2 --models mlp   # quick look
    python benchmarks/overhead.py --profile           # cProfile of each preset's hot path

With ``--profile`` no table is made: each auditlog preset (and bare) trains
``--profile-steps`` steps under cProfile on the training thread, and the
functions costing most per step are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    WORKLOADS,
    Workload,
    cpu_sample,
    foreign_load,
    hook_methods,
    machine_line,
    preset_note,
    wait_for_quiet,
)
from overhead_configs import (
    Auditlog,
    Config,
    DebugStatisticsFloor,
    Floor,
    GradientNormsFloor,
    WandbLogOnly,
    WandbRun,
    configurations,
    quiet_offline_wandb_environment,
)

import auditlog.recording.writer as writer_module

R = TypeVar("R")
T = TypeVar("T")

BLOCK = 100  # steps per timing block: a whole period of every periodic configuration here


# ---------------------------------------------------------------------- timing
@dataclass
class Samples:
    """One configuration's timings: per round, the per-step mean of each block of BLOCK steps."""

    blocks: list[list[float]] = field(default_factory=list)
    foreign: list[float] = field(default_factory=list)  # other processes' CPU use, per round
    details: list[dict[str, Any]] = field(default_factory=list)
    ratios: list[float] = field(
        default_factory=list
    )  # per round: vs the bare runs right before and after

    def used(self, clean: list[bool]) -> list[int]:
        """Indices of the rounds that count: the clean ones, or all when none was clean."""
        chosen = [i for i, ok in enumerate(clean) if ok]
        return chosen or list(range(len(clean)))


def train(
    workload: Workload,
    config: Config,
    scratch: Path,
    warmup: int,
    steps: int,
    start: Callable[[], None] = lambda: None,
    stop: Callable[[], None] = lambda: None,
    written: Callable[[], None] | None = None,
) -> tuple[list[float], float, dict[str, Any]]:
    """Build a model under ``config``, train ``warmup + steps`` steps, time the last ``steps``.

    Returns the per-step means of each block of ``BLOCK`` steps, the window's wall
    time and the configuration's details. ``start`` runs right before the window,
    ``stop`` right after it, ``written`` (when given) once the writer has written
    the window's records.
    """
    gc.collect()
    torch.manual_seed(0)
    x, y = workload.batch()
    blocks: list[float] = []
    config.begin(scratch)
    try:
        model = workload.build()
        optimizer = workload.optimizer(model.parameters())
        config.attach(model)
        began = block_start = time.perf_counter()
        for i in range(warmup + steps):
            if i == warmup:
                config.settle()
                start()
                began = block_start = time.perf_counter()
            loss = workload.loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            config.after_step(i, model)
            done = i + 1 - warmup
            if done > 0 and done % BLOCK == 0:
                now = time.perf_counter()
                blocks.append((now - block_start) / BLOCK)
                block_start = now
        wall = time.perf_counter() - began
        stop()
        config.window_end()
        if written is not None:
            config.settle()
            written()
    finally:
        details = config.end()
    return blocks, wall, details


def workload_targets(workload: Workload) -> dict[str, float]:
    """The ratio each preset is held to: issue 34's for the fast workload, issue 5's for
    the others."""
    if workload.name == "fast":
        return {"minimal": 1.10, "audit": 1.15}
    return {"audit": 1.05, "debug": 1.5}


def timed_steps(workload: Workload, args: argparse.Namespace) -> int:
    """Steps timed per round: ``--steps``, else the workload's own (``Workload.timed_steps``:
    a window in which the writer's batches run, so that their cost is in the figure)."""
    return int(args.steps) if args.steps is not None else workload.timed_steps


def bracketed(
    rows: list[R], run: Callable[[R], T], run_bare: Callable[[], T]
) -> Iterator[tuple[R, T, T, T]]:
    """Run bare, row 1, bare, row 2, bare, ...; yield ``(row, result, bare before, bare after)``.

    This machine's speed drifts in phases of seconds (measured: 100-step windows
    of bare training at 9-10 ms/step for a while, then at 14-15 ms); a round of
    every configuration takes a minute, so a single bare run per round was often
    in another phase than the row it was compared with.
    """
    before = run_bare()
    for row in rows:
        result = run(row)
        after = run_bare()
        yield row, result, before, after
        before = after


def measure(
    workload: Workload, configs: list[Config], args: argparse.Namespace
) -> tuple[dict[str, Samples], list[bool]]:
    """Interleaved rounds until ``--rounds`` clean ones are in (or the time budget is spent).

    Other processes (a test suite, say) on a 2-CPU machine do not slow every
    configuration alike: OpenMP's spinning workers suffer far more than threads
    that sleep, so a round run beside them gives wrong ratios, not just noisy
    ones. Before each round the benchmark waits up to ``--wait-quiet`` seconds for
    a quiet machine, measures the other processes' CPU use while each
    configuration runs, and calls the round clean when it stayed under
    ``--max-foreign`` CPUs. Rounds go on until ``--rounds`` clean rounds are in,
    or ``--budget`` minutes have passed (at least ``--rounds`` rounds are run).
    The table uses the clean rounds only (all rounds when there is none, and says so).
    """
    samples = {c.name: Samples() for c in configs}
    clean: list[bool] = []
    bare_config = next(c for c in configs if c.name == "bare")
    order = [c for c in configs if c is not bare_config]
    rng = random.Random(args.seed)
    deadline = time.perf_counter() + args.budget * 60

    def run(config: Config) -> tuple[list[float], float]:
        with tempfile.TemporaryDirectory(prefix="auditlog-bench-") as scratch:
            before = cpu_sample()
            blocks, _wall, details = train(
                workload, config, Path(scratch), args.warmup, timed_steps(workload, args)
            )
            load = foreign_load(before, cpu_sample())
        samples[config.name].details.append(details)
        return blocks, load

    while sum(clean) < args.rounds and (len(clean) < args.rounds or time.perf_counter() < deadline):
        rng.shuffle(order)
        if args.wait_quiet > 0:
            wait_for_quiet(args.max_foreign, args.wait_quiet)
        began = time.perf_counter()
        round_bare: list[float] = []
        worst = 0.0
        for config, (blocks, load), (before, before_load), (after, after_load) in bracketed(
            order, run, lambda: run(bare_config)
        ):
            worst = max(worst, load, before_load, after_load)
            s = samples[config.name]
            s.blocks.append(blocks)
            s.foreign.append(load)
            reference = (statistics.median(before) + statistics.median(after)) / 2
            s.ratios.append(statistics.median(blocks) / reference)
            round_bare += after if round_bare else before + after
        samples["bare"].blocks.append(round_bare)
        samples["bare"].foreign.append(worst)
        clean.append(worst <= args.max_foreign)
        print(
            f"  {workload.name}: round {len(clean)} ({sum(clean)}/{args.rounds} clean) took "
            f"{time.perf_counter() - began:.1f}s; other processes used up to {worst:.2f} CPUs"
            + ("" if clean[-1] else " (noisy: not counted)"),
            file=sys.stderr,
        )
    return samples, clean


def report(
    workload: Workload,
    configs: list[Config],
    skipped: dict[str, str],
    measured: tuple[dict[str, Samples], list[bool]],
    args: argparse.Namespace,
) -> None:
    samples, clean = measured
    bare = samples["bare"]
    used = bare.used(clean)
    base = statistics.median(x for i in used for x in bare.blocks[i])
    print(f"\n### {workload.name}: {workload.description}\n")
    counted = (
        f"{len(used)} clean rounds"
        if any(clean)
        else f"all {len(used)} rounds, NONE clean: ratios unreliable"
    )
    print(
        f"bare: {base * 1e3:.2f} ms/step; {counted} of {len(clean)} run (a round is clean when other "
        f"processes used <= {args.max_foreign} CPUs), each {timed_steps(workload, args)} timed steps "
        f"after {args.warmup} warm-up\n"
    )
    print("| configuration | ms/step | vs bare | per-round ratios | target | #5 measured |")
    print("|---|---:|---:|---:|---|---:|")
    for config in configs:
        if config.name in skipped:
            print(f"| {config.name} | | {skipped[config.name]} | | | {config.reported} |")
            continue
        s = samples[config.name]
        value = statistics.median(x for i in used for x in s.blocks[i])
        per_round = [s.ratios[i] for i in used] if s.ratios else [1.0]
        ratio = statistics.median(per_round)
        target = ""
        wanted = workload_targets(workload).get(config.name.removeprefix("auditlog "))
        if wanted is not None:
            target = f"<= {wanted:.2f}x " + ("(met)" if ratio <= wanted else "(NOT met)")
        print(
            f"| {config.name} | {value * 1e3:.2f} | {ratio:.2f}x | "
            f"{min(per_round):.2f}-{max(per_round):.2f}x | {target} | {config.reported} |"
        )
    rows = [c for c in configs if isinstance(c, Auditlog) and c.name not in skipped]
    if not rows:
        return
    print(
        "\n| auditlog | events/step | optimizer_step records | payload bytes/step | "
        "startup writer drain | queued at window end | closing (flush) | producer blocked |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for config in rows:
        details = samples[config.name].details
        d = details[-1]
        steps = d["steps"]
        opt_ok = all(x["kinds"].get("optimizer_step", 0) == x["steps"] for x in details)
        events = sum(d["kinds"].values()) / steps
        print(
            f"| {config.name.removeprefix('auditlog ')} | {events:.1f} | "
            f"{d['kinds'].get('optimizer_step', 0)}/{steps} {'complete' if opt_ok else 'INCOMPLETE'} | "
            f"{d['payload_bytes'] / steps:,.0f} | "
            f"{statistics.median(x['startup'] for x in details) * 1e3:.0f} ms | "
            f"{statistics.median(x['backlog'] for x in details):.0f} | "
            f"{statistics.median(x['closing'] for x in details) * 1e3:.0f} ms | "
            f"{max(x['blocked'] for x in details):.3f} s |"
        )


# ---------------------------------------------------------------------- profile


def attribute(workload: Workload, presets: list[str], steps: int, rounds: int) -> None:
    """The recorder's cost as CPU time it adds, beside the wall-clock ratios.

    On a noisy 2-CPU machine the wall-clock ratio of two ~13 ms steps moves by
    +-20% from round to round, more than a 5% target. So the time spent inside
    auditlog's hooks (every hook method wrapped with perf_counter, ~0.2 us per
    call) and the writer thread's CPU time (``time.thread_time`` around each
    batch) are measured over the same ``steps``-step window, and divided by the
    step time of the bare runs right before and after it (the machine's speed
    drifts in phases of seconds; see ``measure``): ``1 + (hooks + writer) / bare`` is the
    overhead if the two CPUs were otherwise idle. It can under-count (cache
    pollution, OpenMP workers woken) and the wall-clock ratio over-counts noise;
    both are printed. The two floors (``GradientNormsFloor``,
    ``DebugStatisticsFloor``: the same statistics with nothing recorded) are timed
    the same way, inside their own hooks, so each preset's cost can be read
    against the price of the numbers it keeps.
    """
    spent = {"hooks": 0.0, "writer": 0.0}
    # Only the hooks this checkout's recorder has (an older commit lacks the backward ones).
    originals = {(owner, name): getattr(owner, name) for owner, name in hook_methods()}
    original_drain = writer_module.Writer._drain_once

    def timed(function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent["hooks"] += time.perf_counter() - began

        return wrapper

    def timed_drain(writer: Any) -> bool:
        began = time.thread_time()
        try:
            return original_drain(writer)
        finally:
            spent["writer"] += time.thread_time() - began

    floors: dict[str, Callable[[], Floor]] = {
        "floor: gradient norms": GradientNormsFloor,
        "floor: debug's statistics": DebugStatisticsFloor,
    }
    names = ["bare", *floors, *presets]
    # per row and round: (wall, hooks, writer) per step, and 1 + (hooks + writer) /
    # the bare step time of the bare runs right before and after it (as in measure()).
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}

    def one(row: str) -> tuple[float, float, float]:
        config: Config = (
            Config() if row == "bare" else floors[row]() if row in floors else Auditlog(row)
        )

        def start() -> None:
            spent.update(hooks=0.0, writer=0.0)
            if isinstance(config, Floor):
                config.spent = 0.0

        window: dict[str, float] = {}

        def written() -> None:
            window.update(spent)
            if isinstance(config, Floor):
                window["hooks"] = config.spent

        with tempfile.TemporaryDirectory(prefix="auditlog-bench-") as scratch:
            _blocks, wall, _details = train(
                workload, config, Path(scratch), 5, steps, start=start, written=written
            )
        return wall / steps, window["hooks"] / steps, window["writer"] / steps

    for (owner, name), function in originals.items():
        setattr(owner, name, timed(function))
    writer_module.Writer._drain_once = timed_drain  # type: ignore[method-assign,assignment]
    try:
        for _ in range(rounds):
            for row, (wall, hooks, writer), before, after in bracketed(
                names[1:], one, lambda: one("bare")
            ):
                reference = (before[0] + after[0]) / 2
                results[row].append((wall, hooks, writer, 1 + (hooks + writer) / reference))
                results["bare"].append((after[0], 0.0, 0.0, 1.0))
    finally:
        for (owner, name), function in originals.items():
            setattr(owner, name, function)
        writer_module.Writer._drain_once = original_drain  # type: ignore[method-assign]
    bare = statistics.median(r[0] for r in results["bare"])
    print(
        f"\n{workload.name}: CPU time auditlog adds, {rounds} rounds of {steps} steps, each row between two bare "
        f"runs (medians; bare {bare * 1e3:.2f} ms/step)\n"
    )
    print(
        "| preset | wall ms/step | in hooks ms/step | writer CPU ms/step | 1 + (hooks + writer) / bare | target |"
    )
    print("|---|---:|---:|---:|---:|---|")
    targets = workload_targets(workload)
    for preset in names[1:]:
        rows = results[preset]
        wall = statistics.median(r[0] for r in rows)
        hooks = statistics.median(r[1] for r in rows)
        writer = statistics.median(r[2] for r in rows)
        ratio = statistics.median(r[3] for r in rows)
        target = targets.get(preset)
        verdict = (
            ""
            if target is None
            else f"<= {target:.2f}x " + ("(met)" if ratio <= target else "(NOT met)")
        )
        print(
            f"| {preset} | {wall * 1e3:.2f} | {hooks * 1e3:.3f} | {writer * 1e3:.3f} | {ratio:.3f}x | {verdict} |"
        )


def profile(workload: Workload, presets: list[str], steps: int, top: int) -> None:
    """cProfile the training thread of each preset and print what costs most per step."""
    configs: list[Config] = [Config()] + [Auditlog(p) for p in presets]
    for config in configs:
        profiler = cProfile.Profile()
        with tempfile.TemporaryDirectory(prefix="auditlog-bench-") as scratch:
            _blocks, wall, _details = train(
                workload, config, Path(scratch), BLOCK, steps, profiler.enable, profiler.disable
            )
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
        print(
            f"\n#### {workload.name}, {config.name}: {wall / steps * 1e3:.2f} ms/step under cProfile "
            f"({steps} steps; profiled functions' own time {total / steps * 1e3:.2f} ms/step)\n"
        )
        print("| function | calls/step | own ms/step | cumulative ms/step |")
        print("|---|---:|---:|---:|")
        entries = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
        for (filename, line, func), (_cc, calls, own, cumulative, _callers) in entries[:top]:
            where = _short(filename, line, func)
            print(
                f"| {where} | {calls / steps:.0f} | {own / steps * 1e3:.3f} | {cumulative / steps * 1e3:.3f} |"
            )


def _short(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return f"`{func}`"
    parts = Path(filename).parts
    for anchor in ("auditlog", "torch", "benchmarks"):
        if anchor in parts:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            return f"`{'/'.join(parts[index:])}:{line} {func}`"
    return f"`{Path(filename).name}:{line} {func}`"


# ---------------------------------------------------------------------- main
def add_noise_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=0.25,
        help="CPUs other processes may use during a round",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=8.0,
        help="minutes per model after which noisy rounds stop being replaced",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=10.0,
        help="seconds to wait for a quiet machine before each round",
    )


def main(argv: list[str] | None = None) -> None:
    # The empty full backward hooks make torch warn (once per process) that they fire for
    # gradients w.r.t. module outputs only; that is expected here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        default="mlp,transformer",
        help="comma-separated: mlp, transformer, fast (the 4-layer MLP at 1-2 ms/step)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"timed steps per round (multiple of {BLOCK}); default: the workload's "
        "(100; the fast workload 2,000, so that the writer's batches fall inside the window)",
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-round shuffle")
    add_noise_options(parser)
    parser.add_argument(
        "--no-peers", action="store_true", help="skip the wandb and TensorBoard rows"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated substrings of row names to run (bare always runs)",
    )
    parser.add_argument(
        "--attribute-rounds",
        type=int,
        default=2,
        help="rounds of the CPU-time attribution table (0: skip)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile each preset instead of the table"
    )
    parser.add_argument("--profile-presets", default="minimal,audit,debug")
    parser.add_argument("--profile-steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=15, help="functions shown per profile")
    args = parser.parse_args(argv)
    if args.steps is not None and (args.steps <= 0 or args.steps % BLOCK):
        parser.error(f"--steps must be a positive multiple of {BLOCK}")
    torch.set_num_threads(args.threads)
    quiet_offline_wandb_environment()
    workloads = [WORKLOADS[name] for name in args.models.split(",") if name]

    print(machine_line())
    print(preset_note())
    if args.profile:
        for workload in workloads:
            profile(workload, args.profile_presets.split(","), args.profile_steps, args.top)
        return

    print(
        "command: python benchmarks/overhead.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    configs = configurations(peers=not args.no_peers)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        configs = [c for c in configs if c.name == "bare" or any(w in c.name for w in wanted)]
    skipped = {c.name: why for c in configs if (why := c.unavailable()) is not None}
    runnable = [c for c in configs if c.name not in skipped]
    try:
        if any(isinstance(c, WandbLogOnly) for c in runnable):
            WandbRun.get()  # start wandb's service before any timing: it runs for every row alike
        for workload in workloads:
            report(workload, configs, skipped, measure(workload, runnable, args), args)
            if args.attribute_rounds > 0:
                attribute(
                    workload,
                    ["minimal", "audit", "debug"],
                    timed_steps(workload, args),
                    args.attribute_rounds,
                )
    finally:
        WandbRun.finish()


if __name__ == "__main__":
    main()
