"""Snapshot throughput and peak extra memory vs torch.save and safetensors.

Each method runs in its own subprocess (so peak RSS is its own) on the same
state_dict: a few large float32 parameters plus small ones, ``--gib`` in total.
Reports GB/s and peak RSS above the state_dict itself, as ratios to torch.save.

- auditlog: ``SnapshotStore.put`` for every tensor (hash + Parquet/zstd), the
  write path of a snapshot, plus the training-thread host copy a snapshot takes;
- torch.save of the state_dict;
- safetensors.torch.save_file of the state_dict.

    python benchmarks/snapshots.py [--gib 1.0]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("auditlog", "torch.save", "safetensors")


def child(method: str, gib: float, out: Path) -> None:
    import torch

    torch.manual_seed(0)
    big = int(gib * (1 << 30) / 4)
    state = {"big.weight": torch.randn(big), **{f"small.{i}": torch.randn(4096) for i in range(64)}}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    if method == "auditlog":
        from auditlog.store.blobs import SnapshotStore

        store = SnapshotStore(out)
        for tensor in state.values():
            copy = tensor.detach().to("cpu", copy=True)  # what the hook takes
            store.put(copy)
            del copy
    elif method == "torch.save":
        torch.save(state, out / "state.pt")
    else:
        from safetensors.torch import save_file

        save_file(state, str(out / "state.safetensors"))
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(json.dumps({"seconds": elapsed, "bytes": nbytes, "extra_rss": peak - base, "disk": on_disk}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--child", choices=METHODS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.gib, Path(args.out))
        return
    results = {}
    for method in METHODS:
        with tempfile.TemporaryDirectory(prefix="auditlog-snapbench-") as out:
            done = subprocess.run(
                [sys.executable, __file__, "--child", method, "--gib", str(args.gib), "--out", out],
                capture_output=True, text=True, check=True,
            )
            results[method] = json.loads(done.stdout.strip().splitlines()[-1])
    ref = results["torch.save"]
    print(f"state_dict of {ref['bytes'] / (1 << 30):.2f} GiB (one {args.gib:g} GiB parameter + 64 small)")
    print("| method | GB/s | time vs torch.save | peak extra RSS | on disk |")
    print("|---|---|---|---|---|")
    for method, r in results.items():
        print(
            f"| {method} | {r['bytes'] / r['seconds'] / 1e9:.2f} | {r['seconds'] / ref['seconds']:.2f}x | "
            f"{r['extra_rss'] / (1 << 30):.2f} GiB | {r['disk'] / (1 << 30):.2f} GiB |"
        )


if __name__ == "__main__":
    main()
