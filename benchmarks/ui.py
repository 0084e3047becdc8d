"""``auditlog ui``: seconds per answer, through the real server, with a warm read model.

Two stores:

- **1,000 runs.** One run of a small MLP is recorded for real
  (``auditlog.record``, 5 steps); its events are then copied under 999 new run
  ids, names and start times, each copy chained afresh (``core.chain``), so
  every run verifies and the runs page reads 1,000 real-looking chains
  (recording 1,000 runs would take minutes and measure the recorder).
- **5,000 modules.** ``nn.Sequential`` of 2,500 x (Linear(8, 8), Tanh)
  (the model of tests/test_large_model.py), recorded for 3 steps with the
  default policy.

The real ``auditlog ui`` command serves each store on a free port; every
endpoint a page asks for is requested once (cold: the read model is brought up
to date on the first one) and then ``--repeat`` times, and the median is
reported (warm). Then a new server over the wide store (its read model warm on
disk) is asked for the verdict first: the one answer that checks every snapshot
file in full in that process. ``--new-servers`` more new servers are then
started in turn with and without the worker processes that check small files in
parallel (``auditlog ui --check-workers 0``), each asked for the verdict first,
side by side. Figures: docs/performance.md.

    python benchmarks/ui.py [--runs 1000] [--layers 2500] [--repeat 5] [--new-servers 5]
    python benchmarks/ui.py --runs 0 --repeat 0 --new-servers 9   # the first verdict only
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import torch
from torch import nn

import auditlog
from auditlog.core.chain import canonical_row, genesis_hash, link_hash

COLUMNS = [
    "run_id",
    "stream",
    "seq",
    "ts_ns",
    "kind",
    "step",
    "module_id",
    "tensor_id",
    "payload",
]


def record_small(store: Path) -> str:
    with auditlog.record(store, name="run-0000") as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            loss = nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


def clone_runs(store: Path, source: str, copies: int) -> None:
    """``copies`` more runs: the source run's events under new ids and names, chained afresh."""
    conn = sqlite3.connect(store / "events.db")
    conn.execute("PRAGMA synchronous=OFF")
    events = conn.execute(
        f"SELECT {', '.join(COLUMNS)} FROM events WHERE run_id = ? ORDER BY stream, seq", [source]
    ).fetchall()
    index = conn.execute(
        "SELECT name, started_ns, host, pid, proc_start, last_seen_ns FROM runs WHERE run_id = ?",
        [source],
    ).fetchone()
    for n in range(1, copies + 1):
        run_id, shift = uuid.uuid4().hex, n * 1_000_000_000
        rows, prev = [], ""
        for event in events:
            fields = dict(zip(COLUMNS, event, strict=True))
            payload = str(fields["payload"]).replace('"run-0000"', f'"run-{n:04d}"')
            fields |= {"run_id": run_id, "ts_ns": int(fields["ts_ns"]) + shift, "payload": payload}
            if fields["seq"] == 1:
                prev = genesis_hash(run_id, int(fields["stream"]))
            prev = link_hash(prev, canonical_row(fields))
            rows.append((*fields.values(), prev))
        conn.executemany(
            f"INSERT INTO events ({', '.join(COLUMNS)}, hash) VALUES ({', '.join('?' * 10)})", rows
        )
        conn.execute(
            "INSERT INTO runs (run_id, name, started_ns, host, pid, proc_start, last_seen_ns) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                f"run-{n:04d}",
                index[1] + shift,
                index[2],
                index[3],
                index[4],
                index[5] + shift,
            ),
        )
    conn.commit()
    conn.close()


def record_wide(store: Path, layers: int) -> str:
    torch.manual_seed(0)
    with auditlog.record(store, name="wide") as run:
        parts: list[nn.Module] = []
        for _ in range(layers):
            parts += [nn.Linear(8, 8), nn.Tanh()]
        model = nn.Sequential(*parts)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


def serve(store: Path, *options: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "auditlog.cli.main",
            "ui",
            "--store",
            str(store),
            "--port",
            "0",
            *options,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None
    found = re.search(r"at (http://\S+/) ", server.stdout.readline())
    assert found, "auditlog ui did not start"
    return server, found.group(1)


def fetch(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as answer:
        body = answer.read()
    return time.perf_counter() - start, len(body)


def measure(
    base: str, paths: list[tuple[str, str]], repeat: int
) -> list[tuple[str, float, float, int]]:
    out = []
    for label, path in paths:
        cold, size = fetch(base + path)
        warm = statistics.median(fetch(base + path)[0] for _ in range(repeat)) if repeat else cold
        out.append((label, cold, warm, size))
        print(
            f"  {label:<44} cold {cold:7.3f} s   warm {warm:7.3f} s   {size / 1024:8.1f} KiB",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument(
        "--layers", type=int, default=2500, help="(Linear, Tanh) pairs of the wide model"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--new-servers",
        type=int,
        default=5,
        help="new servers asked for the verdict first, with and without check workers, each",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="build the stores here and keep them"
    )
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-ui-"))
    try:
        many, wide = root / "many", root / "wide"
        if args.runs:
            runs_page(many, args.runs, args.repeat)
        start = time.perf_counter()
        wide_id = record_wide(wide, args.layers)
        print(
            f"{2 * args.layers}-module run recorded in {time.perf_counter() - start:.1f} s",
            flush=True,
        )
        run_page(wide, wide_id, args.repeat)
        first_verdicts(wide, wide_id, args.new_servers)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def runs_page(many: Path, runs: int, repeat: int) -> None:
    start = time.perf_counter()
    clone_runs(many, record_small(many), runs - 1)
    print(f"store of {runs} runs built in {time.perf_counter() - start:.1f} s", flush=True)
    server, base = serve(many)
    try:
        print(f"runs page, {runs} runs:")
        measure(
            base,
            [
                ("index.html", ""),
                ("/api/runs (first 100, newest first)", "api/runs"),
                (
                    "/api/runs?sort=name&order=asc&offset=500",
                    "api/runs?sort=name&order=asc&offset=500",
                ),
                ("/api/runs?q=run-09 (filtered)", "api/runs?q=run-09"),
                ("/api/runs/latest (one run's facts)", "api/runs/latest"),
            ],
            repeat,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_page(wide: Path, wide_id: str, repeat: int) -> None:
    server, base = serve(wide)
    try:
        print(f"run page, {wide.name} store:")
        run = f"api/runs/{wide_id}"
        measure(
            base,
            [
                ("/api/runs/RUN (summary, finding, snapshots)", run),
                ("/api/runs/RUN/tree (the end)", run + "/tree"),
                ("/api/runs/RUN/tree?step=1 (slider)", run + "/tree?step=1"),
                ("/api/runs/RUN/curves", run + "/curves"),
                ("/api/runs/RUN/verify", run + "/verify"),
            ],
            repeat,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


def first_verdicts(wide: Path, wide_id: str, new_servers: int) -> None:
    """A new server over the read model just built, asked for the verdict first: nothing
    was checked in that process yet. With check workers (the default) and without, in
    turn; the first answer of each server, then the median over servers."""
    found: dict[str, list[float]] = {"default": [], "--check-workers 0": []}
    for _ in range(max(1, new_servers)):
        for label in found:
            server, base = serve(wide, *([] if label == "default" else label.split()))
            try:
                took, _ = fetch(f"{base}api/runs/{wide_id}/verify")
                again, _ = fetch(f"{base}api/runs/{wide_id}/verify")
            finally:
                server.terminate()
                server.wait(timeout=30)
            found[label].append(took)
            print(f"  new server ({label}): first verdict {took:.3f} s, second {again:.3f} s")
    print("a new server (read model warm), the verdict asked first, median:")
    for label, times in found.items():
        print(
            f"  {label:<20} {statistics.median(times):7.3f} s  (of {len(times)}: {min(times):.3f}-{max(times):.3f})"
        )


if __name__ == "__main__":
    main()
