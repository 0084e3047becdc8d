"""How long an ``auditlog`` command takes to answer, beside Python's own start-up.

Each command runs as a fresh process (what a person typing it waits for) on a
small store recorded first (a 20-step MLP run, default policy, with its sealed
and final snapshots), beside ``python -c pass`` and ``python -c "import torch"``
measured in the same run. Every row is the median of ``--repeat`` runs, and the
rows are interleaved round by round so machine noise hits them alike.

    python benchmarks/startup.py               # 7 rounds
    python benchmarks/startup.py --repeat 15

Targets: ``--version``/``--help`` <= 0.3 s; ``runs``/``events``/``verify`` on a
small store <= 0.6 s (this machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORD = """
import auditlog, torch
from torch import nn
torch.manual_seed(0)
with auditlog.record({store!r}, name="small"):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
"""


def commands(store: str) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "auditlog.cli.main"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "auditlog --version": [*cli, "--version"],
        "auditlog --help": [*cli, "--help"],
        "auditlog runs": [*cli, "runs", "--store", store],
        "auditlog events --limit 10": [*cli, "events", "--store", store, "--limit", "10"],
        "auditlog verify": [*cli, "verify", "--store", store],
        'auditlog query "select 1"': [*cli, "query", "--store", store, "select 1"],
    }


TARGETS = {
    "auditlog --version": 0.3,
    "auditlog --help": 0.3,
    "auditlog runs": 0.6,
    "auditlog events --limit 10": 0.6,
    "auditlog verify": 0.6,
}


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7, help="rounds (median reported)")
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k not in ("AUDITLOG_STORE", "AUDITLOG_KEY")}
    with tempfile.TemporaryDirectory(prefix="auditlog-startup-") as scratch:
        store = str(Path(scratch) / "store")
        subprocess.run(
            [sys.executable, "-c", RECORD.format(store=store)], env=env, cwd=scratch, check=True
        )
        rows = commands(store)
        for argv_ in rows.values():  # warm the disk cache and the read model once
            timed(argv_, env, scratch)
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, argv_ in rows.items():
                samples[name].append(timed(argv_, env, scratch))
    base = statistics.median(samples["python -c pass"])
    print(
        f"\nwall time per command, median of {args.repeat} rounds (python {sys.version.split()[0]})\n"
    )
    print("| command | seconds | minus `python -c pass` | target |")
    print("|---|---:|---:|---|")
    for name, values in samples.items():
        median = statistics.median(values)
        target = TARGETS.get(name)
        verdict = (
            "" if target is None else f"<= {target} s: {'met' if median <= target else 'MISSED'}"
        )
        print(f"| {name} | {median:.3f} | {median - base:+.3f} | {verdict} |")


if __name__ == "__main__":
    main()
