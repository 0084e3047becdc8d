"""How long ``verify``, ``tree`` and ``restore`` take on a 5,000-module record (issue 16, item 2).

The record is made once, as the issue describes it: ``auditlog run`` (default
policy: the sealed initial state and the end of the run stored) of a script
building ``nn.Sequential`` of 2,500 x ``Linear(8, 8)`` + ``Tanh``, training
3 steps. Then each command runs as a fresh process (what a person typing it
waits for), beside ``python -c pass``, interleaved round by round so that
machine noise hits them alike; every row is the median of ``--repeat`` rounds.

- ``verify``: chain, Merkle tree, runs index and every snapshot file
  (5,000 tensors, ~5,000 files: each decoded and hashed, its bytes digested);
- ``tree``: the module tree at the end, printed to a pipe (10,001 lines);
- ``restore -o end.safetensors``: every tensor read back, its content hash
  checked, written (and ``restore -o end.pt`` for reference: that format
  needs torch, whose import alone is printed beside it).

    python benchmarks/replay.py               # 5 rounds
    python benchmarks/replay.py --repeat 9

Target: each of verify, tree and restore <= 1 s (this machine).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import timed

SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
layers = []
for _ in range(2500):
    layers += [nn.Linear(8, 8), nn.Tanh()]
model = nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
"""

TARGET_S = 1.0


def commands(store: str, scratch: str) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "auditlog.cli.main"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "auditlog verify": [*cli, "verify", "--store", store],
        "auditlog tree": [*cli, "tree", "--store", store],
        "auditlog restore -o end.safetensors": [
            *cli,
            "restore",
            "--store",
            store,
            "--force",
            "-o",
            str(Path(scratch) / "end.safetensors"),
        ],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "auditlog restore -o end.pt": [
            *cli,
            "restore",
            "--store",
            store,
            "--force",
            "-o",
            str(Path(scratch) / "end.pt"),
        ],
    }


TARGETS = {
    "auditlog verify": TARGET_S,
    "auditlog tree": TARGET_S,
    "auditlog restore -o end.safetensors": TARGET_S,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds (median reported)")
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k not in ("AUDITLOG_STORE", "AUDITLOG_KEY")}
    with tempfile.TemporaryDirectory(prefix="auditlog-replay-") as scratch:
        store = str(Path(scratch) / "store")
        script = Path(scratch) / "wide.py"
        script.write_text(SCRIPT)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "auditlog.cli.main", "run", "--store", store, str(script)],
            env=env,
            cwd=scratch,
            check=True,
            capture_output=True,
        )
        print(
            f"recorded 2,500 x Linear(8,8)+Tanh, 3 steps, in {time.perf_counter() - start:.1f} s",
            file=sys.stderr,
        )
        rows = commands(store, scratch)
        for argv_ in rows.values():  # warm the disk cache (and the read model) once
            timed(argv_, env, scratch)
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, argv_ in rows.items():
                samples[name].append(timed(argv_, env, scratch))
    base = statistics.median(samples["python -c pass"])
    print(
        f"\n5,000-module record: wall time per command, median of {args.repeat} rounds "
        f"(python {sys.version.split()[0]})\n"
    )
    print("| command | seconds | minus `python -c pass` | / target | target |")
    print("|---|---:|---:|---:|---|")
    for name, values in samples.items():
        median = statistics.median(values)
        target = TARGETS.get(name)
        ratio = "" if target is None else f"{median / target:.2f}"
        verdict = (
            "" if target is None else f"<= {target} s: {'met' if median <= target else 'MISSED'}"
        )
        print(f"| {name} | {median:.3f} | {median - base:+.3f} | {ratio} | {verdict} |")
    print("\n(figures from a loaded machine need a quiet rerun)")


if __name__ == "__main__":
    main()
