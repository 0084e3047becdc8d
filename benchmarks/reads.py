"""Reads that start at once: read commands on a store of 1,000 small real runs (issue 34).

Two stores, recorded for real in this process with ``auditlog.record`` (a
16-32-4 MLP, AdamW, 20 steps a run, the default policy with its sealed and final
snapshots), and cached between runs of the benchmark in the temporary directory
under a key made from the recorder's and the store's source code, so a second
run measures at once (building the 1,000 runs takes about a minute here):

- **small**: one run, the store ``auditlog runs`` is compared on with ``python
  -c "import torch"`` (target: at most 0.15x of it, measured in the same run);
- **1,000 runs**: ``runs``, ``events``, ``verify`` (the latest run) and
  ``query`` cold (the read model deleted first: built from the store) and
  warm (targets: ``runs`` and warm ``query`` under 1 s on this machine).

Every command runs as a fresh process (what a person typing it waits for) with
its output into a pipe, beside ``python -c pass`` and ``python -c "import
torch"``; each row is the median of ``--repeat`` rounds, the rows interleaved
round by round so that machine noise hits them alike.

    python benchmarks/reads.py                # 5 rounds
    python benchmarks/reads.py --repeat 9 --runs 1000 --rebuild
    python benchmarks/reads.py --baseline /tmp/base   # also another checkout's commands, same run

``--baseline DIR`` adds the commands of the checkout at DIR (imported with
``PYTHONPATH=DIR``; link its ``cli/`` and ``migrations/`` to ``auditlog/cli``
and ``auditlog/migrations`` there, as the installed package has them) on the
same stores, interleaved with this checkout's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the cached stores depend on: the code that records and the code that stores.
KEYED = ("auditlog/capture", "auditlog/recording", "auditlog/store", "auditlog/core", "migrations")
QUERY = (
    "select status, count(*) as runs, sum(steps) as steps from runs group by status order by status"
)


def code_key(runs: int) -> str:
    """A digest of the recorder's and the store's sources (and the run count)."""
    digest = hashlib.sha256(f"runs={runs};python={sys.version_info[:2]}".encode())
    for folder in KEYED:
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def record_runs(store: Path, count: int) -> None:
    """``count`` real recorded runs of a small training loop, one after another, in this process."""
    import torch
    from torch import nn

    import auditlog

    for i in range(count):
        torch.manual_seed(i)
        with auditlog.record(store, name=f"run-{i:04d}"):
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for _ in range(20):
                opt.zero_grad()
                model(torch.randn(8, 16)).pow(2).mean().backward()
                opt.step()


def cached_store(name: str, count: int, rebuild: bool) -> Path:
    """The store of ``count`` runs for this code, built once (into a scratch directory,
    renamed when complete: an interrupted build is never taken for a store)."""
    home = Path(tempfile.gettempdir()) / f"auditlog-bench-reads-{code_key(count)}"
    store = home / name
    if store.is_dir() and not rebuild:
        return store
    shutil.rmtree(store, ignore_errors=True)
    scratch = home / f".{name}.building.{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    start = time.perf_counter()
    cwd = os.getcwd()
    os.chdir(scratch)  # the runs' argv and cwd say nothing about this checkout
    try:
        record_runs(scratch / "store", count)
    finally:
        os.chdir(cwd)
    (scratch / "store").rename(store)
    shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"recorded {count} runs into {store} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return store


def drop_read_model(store: Path) -> None:
    for path in store.glob("readmodel.duckdb*"):
        path.unlink()


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds (median reported)")
    parser.add_argument("--runs", type=int, default=1000, help="runs in the large store")
    parser.add_argument("--rebuild", action="store_true", help="record the stores again")
    parser.add_argument(
        "--baseline", type=Path, default=None, help="another checkout to compare (see above)"
    )
    args = parser.parse_args(argv)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AUDITLOG_STORE", "AUDITLOG_KEY", "AUDITLOG_READMODEL")
    }
    small = cached_store("small", 1, args.rebuild)
    large = cached_store("large", args.runs, args.rebuild)
    cli = [sys.executable, "-m", "auditlog.cli.main"]
    many = f"{args.runs:,} runs"
    commands: dict[str, list[str]] = {
        "`runs`, 1 run": [*cli, "runs", "--store", str(small)],
        f"`runs`, {many}": [*cli, "runs", "--store", str(large)],
        f"`events --limit 10`, {many}": [*cli, "events", "--store", str(large), "--limit", "10"],
        f"`verify` (latest), {many}": [*cli, "verify", "--store", str(large)],
        f"`query` cold, {many}": [*cli, "query", "--store", str(large), QUERY],
        f"`query` warm, {many}": [*cli, "query", "--store", str(large), QUERY],
    }
    rows: dict[str, tuple[list[str], dict[str, str]]] = {
        "python -c pass": ([sys.executable, "-c", "pass"], env),
        'python -c "import torch"': ([sys.executable, "-c", "import torch"], env),
    }
    for name, command in commands.items():
        rows[name] = (command, env)
        if args.baseline is not None:
            rows[f"baseline: {name}"] = (
                command,
                {**env, "PYTHONPATH": str(args.baseline.absolute())},
            )
    for command, environment in rows.values():  # warm the page cache and the read model once
        timed(command, environment)
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeat):
        for name, (command, environment) in rows.items():
            if "`query` cold" in name:
                drop_read_model(large)
            samples[name].append(timed(command, environment))
    median = {name: statistics.median(values) for name, values in samples.items()}
    torch_s = median['python -c "import torch"']
    targets = {
        "`runs`, 1 run": ("<= 0.15x import torch", median["`runs`, 1 run"] <= 0.15 * torch_s),
        f"`runs`, {many}": ("< 1 s", median[f"`runs`, {many}"] < 1.0),
        f"`query` warm, {many}": ("< 1 s", median[f"`query` warm, {many}"] < 1.0),
    }
    print(
        f"\nwall time per command (fresh process, output to a pipe), median of {args.repeat} rounds; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n"
    )
    print("| command | seconds | vs `import torch` | target |")
    print("|---|---:|---:|---|")
    for name, value in median.items():
        target = targets.get(name)
        verdict = "" if target is None else f"{target[0]}: {'met' if target[1] else 'MISSED'}"
        print(f"| {name} | {value:.3f} | {value / torch_s:.2f}x | {verdict} |")
    spread = {name: (min(v), max(v)) for name, v in samples.items()}
    print(
        "\nspread (min-max s): "
        + "; ".join(f"{n}: {lo:.2f}-{hi:.2f}" for n, (lo, hi) in spread.items())
    )


if __name__ == "__main__":
    main()
