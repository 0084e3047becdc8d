"""Snapshot write and restore throughput, and peak extra memory, vs torch.save/load and safetensors.

Each measurement runs in its own subprocess (so its peak RSS is its own) on the
same state_dict: one large float32 parameter plus 64 small ones, ``--gib`` in
total (several sizes: ``--gib 0.5,2``). Printed side by side, as ratios:

- write: auditlog's snapshot path (the training thread's host copy, then
  ``BlobWriter.store``: content hash overlapped with Parquet writing on the
  pool, as the recording's writer does it; and, from the same runs, the
  writer's part alone, which training does not wait for) against ``torch.save`` and
  ``safetensors.torch.save_file``; targets: at least torch.save's throughput,
  0.8x safetensors'. Twice: into the page cache (what each does by default;
  the kernel writes back later), and durable, every file fsynced before the
  call returns (auditlog's ``durability = "strict"``; ``os.fsync`` after
  torch.save and save_file): the speed of the disk, which "snapshots at disk
  speed" is about, and what an audit trail that must survive a power loss pays;
- restore: ``SnapshotStore.read_verified`` of every tensor (what
  ``Run.state_dict`` and ``auditlog restore`` do: decode and check the content
  hash in one pass) against ``torch.load`` and ``safetensors.torch.load_file``
  of the same state_dict; target: at most 1.5x torch.load's time;
- peak extra RSS: above the state_dict itself for writes (target: one host
  copy + 64 MiB for auditlog), above the process at start for reads (the result
  itself included, for every method).

Files are written to a temporary directory (``--dir``, default the system's).
Restores are timed twice: from the page cache, as a restore right after
training would read them, and cold, every file evicted from the page cache
first (``fsync``, then ``posix_fadvise(DONTNEED)``: no root needed), as a
restore of last month's snapshot reads them from the disk.

    python benchmarks/snapshots.py                  # 0.5 and 2 GiB
    python benchmarks/snapshots.py --gib 0.1        # quick look
    python benchmarks/snapshots.py --warm 3         # memory pre-touched in every write process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITES = ("auditlog", "torch.save", "safetensors")
# auditlog's write without the host copy (timed apart in the same runs): what the
# recording's writer thread spends while training goes on.
WRITER = "auditlog, writer only"
DURABLE = " + fsync"
COLD = " (cold)"
READS = ("auditlog", "torch.load", "safetensors")


def _state(gib: float) -> dict[str, object]:
    import torch

    torch.manual_seed(0)
    big = int(gib * (1 << 30) / 4)
    return {"big.weight": torch.randn(big), **{f"small.{i}": torch.randn(4096) for i in range(64)}}


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu() -> float:
    """CPU seconds of this process, every thread (user + system): a figure that a busy
    machine disturbs less than wall time does."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _warm(gib: float) -> None:
    """Touch and free ``gib`` GiB of memory, so that what follows gets pages the machine
    has backed already (``--warm``)."""
    import numpy as np

    block = np.ones(int(gib * (1 << 30)), dtype=np.uint8)
    del block


def write_child(
    method: str, gib: float, out: Path, warm: float, periodic: bool = False
) -> dict[str, float]:
    """One write of ``method`` (``--periodic``: the second of two, the state changed in
    between, as in a run that snapshots or checkpoints every N steps)."""
    # Every method's modules imported before the baseline: pyarrow alone adds ~70 MiB of
    # RSS, which is no part of any write (it was counted into every method's peak before).
    import safetensors.torch  # noqa: F401

    import auditlog.store.blobs
    import auditlog.store.blobwriter  # noqa: F401
    from auditlog.capture.hostbuffers import HostBuffers

    if warm:
        _warm(warm * gib)
    state = _state(gib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())  # type: ignore[attr-defined]
    durable = method.endswith(DURABLE)
    method = method.removesuffix(DURABLE)
    buffers = (
        HostBuffers()
    )  # what a recording keeps between periodic snapshots (capture/hostbuffers.py)
    if periodic:
        (out / "first").mkdir()
        _write_once(method, state, out / "first", durable, buffers)
        for tensor in state.values():
            tensor.add_(1.0)  # type: ignore[attr-defined]  # new content: nothing deduplicated
    base, cpu0 = _rss(), _cpu()
    start = time.perf_counter()
    copied, copy_cpu = _write_once(method, state, out, durable, buffers)
    elapsed, cpu = time.perf_counter() - start, _cpu() - cpu0
    disk = sum(
        p.stat().st_size
        for p in out.rglob("*")
        if p.is_file() and p.relative_to(out).parts[0] != "first"
    )
    return {
        # a warmed (or periodic) process's peak is the warming block (or the first write): no figure then
        "seconds": elapsed,
        "cpu": cpu,
        "bytes": nbytes,
        "disk": disk,
        "extra_rss": -1 if warm or periodic else _rss() - base,
        "copy_seconds": copied - start,
        "copy_cpu": copy_cpu - cpu0,
    }


def _write_once(
    method: str, state: dict[str, object], out: Path, durable: bool, buffers: object
) -> tuple[float, float]:
    """Write ``state`` into ``out``; returns when the host copies were done (auditlog) and the CPU time then."""
    import torch
    from safetensors.torch import save_file

    from auditlog.capture.hostbuffers import HostBuffers
    from auditlog.store.blobs import SnapshotStore
    from auditlog.store.blobwriter import BlobWriter

    assert isinstance(buffers, HostBuffers)
    copied, copy_cpu = time.perf_counter(), _cpu()
    if method == "auditlog":
        # What a snapshot does: host copies on the training thread, then the writer's store().
        copies = [(i, buffers.copy_of(t)) for i, t in enumerate(state.values())]  # type: ignore[arg-type]
        copied, copy_cpu = time.perf_counter(), _cpu()
        with BlobWriter(SnapshotStore(out), durable=durable) as writer:
            writer.store(copies, lambda sha: False)  # type: ignore[arg-type]
        buffers.give(
            [copy for _, copy in copies]
        )  # the writer is done: the next snapshot's buffers
        del copies
    elif method == "torch.save":
        torch.save(state, out / "state.pt")
    else:
        save_file(state, str(out / "state.safetensors"))  # type: ignore[arg-type]
    if durable and method != "auditlog":
        for path in (
            next(p for p in out.iterdir() if p.is_file()),
            out,
        ):  # the file, then its directory entry
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    return copied, copy_cpu


def prepare(gib: float, out: Path) -> None:
    """Write the state_dict in every format once (the restores read these)."""
    import torch
    from safetensors.torch import save_file

    from auditlog.store.blobs import SnapshotStore
    from auditlog.store.blobwriter import BlobWriter

    state = _state(gib)
    torch.save(state, out / "state.pt")
    save_file(state, str(out / "state.safetensors"))  # type: ignore[arg-type]
    with BlobWriter(SnapshotStore(out / "snapshots")) as writer:
        stored = writer.store(list(enumerate(state.values())), lambda sha: False)  # type: ignore[arg-type]
    (out / "hashes.json").write_text(json.dumps([sha for sha, _ in stored]))


def read_child(method: str, out: Path) -> dict[str, float]:
    import torch
    from safetensors.torch import load_file

    from auditlog.store.blobs import SnapshotStore

    base, cpu = _rss(), _cpu()
    start = time.perf_counter()
    if method == "auditlog":
        files = SnapshotStore(out / "snapshots")
        loaded = {
            sha: files.read_verified(sha, sha[:8])
            for sha in json.loads((out / "hashes.json").read_text())
        }
    elif method == "torch.load":
        loaded = torch.load(out / "state.pt")
    else:
        loaded = load_file(str(out / "state.safetensors"))
    # Touch every page: safetensors maps the file lazily, and a restore delivers values.
    touched = sum(int(t.reshape(-1).view(torch.uint8)[::4096].sum()) for t in loaded.values())
    elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
    nbytes = sum(t.numel() * t.element_size() for t in loaded.values())
    return {
        "seconds": elapsed,
        "cpu": cpu,
        "bytes": nbytes,
        "extra_rss": _rss() - base,
        "touched": touched,
    }


def _evict(root: Path) -> None:
    """Drop every file under ``root`` from the page cache (written back first)."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _mib(nbytes: float) -> str:
    return "n/a" if nbytes < 0 else f"{nbytes / (1 << 20):.0f} MiB"


def _rate(result: dict[str, float]) -> float:
    return result["bytes"] / result["seconds"]


def _run(*args: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{done.stderr}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _best(into: dict[str, dict[str, float]], method: str, result: dict[str, float]) -> None:
    """Keep the fastest round of ``method`` (peak RSS: the largest seen)."""
    kept = into.get(method)
    peak = max(result["extra_rss"], kept["extra_rss"]) if kept else result["extra_rss"]
    if kept is None or result["seconds"] < kept["seconds"]:
        into[method] = {**result, "extra_rss": peak}
    else:
        kept["extra_rss"] = peak


def _rotated(methods: tuple[str, ...], turn: int) -> tuple[str, ...]:
    """``methods`` starting at a different one each round: what one method leaves behind
    (freed pages, dirty pages being written back) must not favour the same method every
    round."""
    first = turn % len(methods)
    return methods[first:] + methods[:first]


def report(gib: float, where: str | None, rounds: int, warm: float, periodic: bool) -> None:
    writes: dict[str, dict[str, float]] = {}
    reads: dict[str, dict[str, float]] = {}
    for turn in range(
        rounds
    ):  # methods interleaved, so a slow spell of the machine hits all of them
        order = _rotated(WRITES, turn)
        for method in (*order, *(m + DURABLE for m in order)):
            with tempfile.TemporaryDirectory(prefix="auditlog-snapbench-", dir=where) as out:
                result = _run(
                    "--child",
                    f"write:{method}",
                    "--gib",
                    str(gib),
                    "--out",
                    out,
                    "--warm",
                    str(warm),
                    *(["--periodic"] if periodic else []),
                )
                _best(writes, method, result)
                if method.startswith(
                    "auditlog"
                ):  # the writer's part alone (the training thread has gone on)
                    writer = method.replace("auditlog", WRITER, 1)
                    _best(
                        writes,
                        writer,
                        {
                            **result,
                            "seconds": result["seconds"] - result["copy_seconds"],
                            "cpu": result["cpu"] - result["copy_cpu"],
                        },
                    )
    with tempfile.TemporaryDirectory(prefix="auditlog-snapbench-", dir=where) as out:
        _run("--child", "prepare", "--gib", str(gib), "--out", out)
        for turn in range(rounds):
            for method in _rotated(READS, turn):
                _evict(Path(out))
                _best(
                    reads,
                    method + COLD,
                    _run("--child", f"read:{method}", "--gib", str(gib), "--out", out),
                )
                _best(
                    reads,
                    method,
                    _run("--child", f"read:{method}", "--gib", str(gib), "--out", out),
                )
    gb = writes["torch.save"]["bytes"] / (1 << 30)
    warmed = (
        f"; every write process first touched {warm:g}x that much memory (--warm)" if warm else ""
    )
    if periodic:
        warmed += "; the second write of each process, the state changed in between (--periodic)"
    print(
        f"\nstate_dict of {gb:.2f} GiB (one {gib:g} GiB float32 parameter + 64 small); best of {rounds} rounds{warmed}"
    )
    for suffix, title in (
        ("", "into the page cache"),
        (DURABLE, "durable: fsynced before returning"),
    ):
        torch_rate = _rate(writes["torch.save" + suffix])
        safe_rate = _rate(writes["safetensors" + suffix])
        print(
            f"| write, {title} | GB/s | vs torch.save | vs safetensors | CPU s/GiB | peak extra RSS | on disk |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for method in (WRITES[0], WRITER, *WRITES[1:]):
            r = writes[method + suffix]
            rate = _rate(r)
            print(
                f"| {method + suffix} | {rate / 1e9:.2f} | {rate / torch_rate:.2f}x | {rate / safe_rate:.2f}x "
                f"| {r['cpu'] / (r['bytes'] / (1 << 30)):.2f} "
                f"| {_mib(r['extra_rss'])} | {r['disk'] / (1 << 30):.2f} GiB |"
            )
    for suffix, title in (
        ("", "from the page cache"),
        (COLD, "cold: files evicted from the page cache"),
    ):
        base, safe = (
            reads["torch.load" + suffix]["seconds"],
            reads["safetensors" + suffix]["seconds"],
        )
        print(
            f"| restore, {title} | GB/s | time vs torch.load | time vs safetensors | CPU s/GiB "
            "| peak extra RSS (result included) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for method in READS:
            r = reads[method + suffix]
            print(
                f"| {method + suffix} | {r['bytes'] / r['seconds'] / 1e9:.2f} | {r['seconds'] / base:.2f}x "
                f"| {r['seconds'] / safe:.2f}x | {r['cpu'] / (r['bytes'] / (1 << 30)):.2f} "
                f"| {r['extra_rss'] / (1 << 20):.0f} MiB |"
            )
    copy = writes["auditlog"]["bytes"]
    if not (warm or periodic):
        print(
            "auditlog write: peak extra RSS - one host copy = "
            f"{(writes['auditlog']['extra_rss'] - copy) / (1 << 20):.0f} MiB "
            "(target <= 64 MiB)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", default="0.5,2", help="state_dict sizes in GiB, comma-separated")
    parser.add_argument(
        "--dir", default=None, help="where the files are written (default: the system's temp dir)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds, methods interleaved; each method's best is shown",
    )
    parser.add_argument(
        "--warm",
        type=float,
        default=0.0,
        help="each write process first touches and frees this many times the state's size (0: off). On a VM "
        "whose free memory the host backs lazily, the first touch of a page costs several times a write; a "
        "snapshot touches one host copy more than torch.save, so this shows the write without that effect",
    )
    parser.add_argument(
        "--periodic",
        action="store_true",
        help="time each method's second write in its process, the state changed in between: the steady state "
        "of a run that snapshots (or checkpoints) every N steps, where a snapshot's host copy goes into the "
        "last one's buffers",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        out = Path(args.out)
        if args.child == "prepare":
            prepare(float(args.gib), out)
            print("{}")
            return
        kind, method = args.child.split(":", 1)
        result = (
            write_child(method, float(args.gib), out, args.warm, args.periodic)
            if kind == "write"
            else read_child(method, out)
        )
        print(json.dumps(result))
        return
    for size in (float(g) for g in args.gib.split(",")):
        report(size, args.dir, max(1, args.rounds), args.warm, args.periodic)
    print("\nTimings on a shared machine are indicative only: rerun on a quiet one for figures.")


if __name__ == "__main__":
    main()
