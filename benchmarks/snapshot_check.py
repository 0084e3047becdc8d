"""How fast snapshot files are checked, through the one entry point every reader uses.

``SnapshotStore.check`` (what ``auditlog verify`` and the web UI's verdict run for
each file a run names: a content hash, a regular file, exactly a snapshot's
schema, decoded values hashing to the name, the catalog row) on:

- ``--files`` small files (default 5,000 float32 [8, 8] tensors: the files of
  the 5,000-module model of ``benchmarks/ui.py`` and ``replay.py``), checked
  once as a new process does, then again in the same process (a small file
  whose bytes passed before is read, hashed with SHA-256 and recalled:
  ``blobcheck.PROVEN``, docs/integrity.md), in files/s;
- ``--large-mib`` MiB of large files (default 256, in 64 MiB float32 tensors),
  checked in full every time, in MB/s.

The script uses only what older code has too: run it with another checkout's
Python to measure that code (``cd ../main && .venv/bin/python
PATH/benchmarks/snapshot_check.py``). Figures: docs/performance.md (verify).

    python benchmarks/snapshot_check.py
    python benchmarks/snapshot_check.py --files 500 --large-mib 0     # quick look

Figures measured on a loaded machine are not figures: rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from auditlog.store import blobcheck
from auditlog.store.blobcatalog import KnownContents
from auditlog.store.blobs import SnapshotStore
from auditlog.store.blobwriter import BlobWriter


def forget() -> None:
    """Nothing proven yet, as in a new process (no-op for code without it)."""
    proven = getattr(blobcheck, "PROVEN", None)
    if proven is not None:
        proven.clear()


def check(files: SnapshotStore, rows: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    for row in rows:
        assert files.check(str(row["sha256"]), row) == []
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000, help="small snapshot files")
    parser.add_argument("--large-mib", type=int, default=256, help="MiB of large snapshot files")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="auditlog-snapshot-check-") as tmp:
        files = SnapshotStore(Path(tmp) / "snapshots")
        small = [(i, torch.randn(8, 8, generator=generator)) for i in range(args.files)]
        large = [
            (i, torch.randn(16 * 1024 * 1024, generator=generator))
            for i in range(args.large_mib // 64)
        ]
        with BlobWriter(files) as writer:  # 500 a time, as a recording stores a snapshot's tensors
            written = [
                info
                for start in range(0, len(small), 500)
                for _, info in writer.store(small[start : start + 500], KnownContents())
            ]
            big = [info for item in large for _, info in writer.store([item], KnownContents())]
        small_rows = [info.as_row() for info in written if info is not None]
        large_rows = [info.as_row() for info in big if info is not None]
        if small_rows:
            forget()
            first = check(files, small_rows)
            again = statistics.median(check(files, small_rows) for _ in range(3))
            count = len(small_rows)
            print(f"{count:,} small files (float32 [8, 8]):")
            print(f"  first check in this process: {count / first:,.0f} files/s ({first:.2f} s)")
            print(
                f"  checked again:               {count / again:,.0f} files/s "
                f"({again:.2f} s, median of 3)"
            )
        if large_rows:
            megabytes = sum(int(r["nbytes"]) for r in large_rows) / 1e6
            took = statistics.median(check(files, large_rows) for _ in range(3))
            print(
                f"{len(large_rows)} large files (64 MiB of float32 each), checked in full every "
                f"time: {megabytes / took:,.0f} MB/s ({took:.2f} s, median of 3)"
            )
    print("(figures from a loaded machine need a quiet rerun)")


if __name__ == "__main__":
    main()
