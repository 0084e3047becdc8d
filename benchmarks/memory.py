"""Memory of the training process while recording: flat over a long run, bounded by the queue.

Three measurements, each in its own fresh subprocess so that one cannot inflate
another's RSS:

1. ``long``: a tiny model (Linear(16, 32), ReLU, Linear(32, 1); SGD) trains
   ``--steps`` optimizer steps (default 100k) bare and under the ``minimal`` and
   ``audit`` presets; RSS is printed at the start and at 1k, 10k, 50k and 100k
   steps (scaled with ``--steps``), with the writer's queued weight. After the
   first 10% (one-off allocations: store, sealing, caches) RSS should stay flat:
   nothing per step may accumulate in the training process.
2. ``per-record``: bytes each queued unit of weight costs, measured by filling a
   ``RecordBuffer`` that nothing drains and dividing the RSS growth by the
   queued weight. The queue bounds weight, not records (``record_weight``): an
   ``activity`` record weighs the module calls it holds, any other record 1. So
   module activity is measured per module call: forward calls of the MLP under
   no_grad with activity sampled and no optimizer step, so the recorder emits an
   ``activity`` record every ``ACTIVITY_FLUSH`` (4096) calls, until queued plus
   held calls reach ``--per-record``; and per MLP optimizer_step record. Times
   ``RecordBuffer.maxsize`` (200,000) this is the bound on what the queue can
   hold.
3. ``flood``: a producer as fast as recording allows: a tight loop of forward
   calls of a model of 16 modules that return four zero-element tensors, under
   no_grad, with activity recorded on every call (17 module calls per forward,
   almost free to produce; with no optimizer step they leave as one
   ``activity`` record of 4096 calls at a time). On CPU the statistics are
   computed in the hooks and the writer only encodes ready activity records, so
   it keeps up with this producer and the queue stays near empty.
   ``--flood-writer-delay S`` makes the writer sleep S seconds per event (a slow
   store) so that it falls behind: the queued weight fills to ``maxsize``,
   ``RecordBuffer.put`` blocks (back-pressure), and RSS plateaus. The flood
   stops once the producer has been blocked ``--flood-hold`` seconds in all (or
   after ``--flood-seconds``).

RSS is the resident set size from /proc; "C heap" is glibc's bytes in use
(``mallinfo2``: tensors and large Python objects, not pymalloc's small objects),
so RSS minus heap growth is mostly fragmentation and small Python objects.
Runs use one intra-op thread by default (``--threads``): memory does not depend
on it and tiny steps run 3x faster without OpenMP.

    python benchmarks/memory.py                 # ~4 minutes on 2 cores
    python benchmarks/memory.py --steps 20000 --only long,per-record   # quick look
    python benchmarks/memory.py --only flood
    python benchmarks/memory.py --only flood --flood-writer-delay 0.5   # writer behind: blocks
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    WORKLOADS,
    machine_line,
    mib,
    peak_rss_bytes,
    preset_note,
    record_options,
    rss_bytes,
    undrained_recorder,
)

import auditlog


def tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def heap_bytes() -> int | None:
    """Bytes glibc malloc has handed out and not had back (all arenas), or None."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return int(info.uordblks + info.hblkhd)


def queued_weight() -> int | None:
    """The writer's queued weight (what ``RecordBuffer.maxsize`` bounds), or None unrecorded."""
    recording = auditlog.recording.session.current()
    if recording is None or recording.writer is None:
        return None
    return recording.writer.buffer.weight


# ---------------------------------------------------------------------- children
def child_long(preset: str, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    marks = sorted({0, steps // 100, steps // 10, steps // 2, steps})
    points: list[dict[str, Any]] = []
    recording = None
    scratch = tempfile.mkdtemp(prefix="auditlog-memory-")
    if preset != "bare":
        recording = auditlog.record(Path(scratch) / "store", **record_options(preset))
        recording.start()
    began = time.perf_counter()
    try:
        model = tiny()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for i in range(steps + 1):
            if i in marks:
                points.append(
                    {
                        "step": i,
                        "rss": rss_bytes(),
                        "queued": queued_weight(),
                        "seconds": time.perf_counter() - began,
                    }
                )
            if i == steps:
                break
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
    finally:
        blocked = 0.0
        if recording is not None:
            assert recording.writer is not None
            blocked = recording.writer.buffer.blocked_seconds
            recording.stop()
    db = Path(scratch) / "store" / "events.db"
    db_bytes = db.stat().st_size if db.exists() else 0
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "preset": preset,
        "points": points,
        "peak": peak_rss_bytes(),
        "blocked": blocked,
        "db_bytes": db_bytes,
        "us_per_step": (points[-1]["seconds"] - points[0]["seconds"]) / steps * 1e6,
    }


def child_per_record(kind: str, count: int) -> dict[str, Any]:
    """RSS growth per queued unit of weight of one kind (nothing drains the buffer).

    ``activity``: per module call, forward calls under no_grad with no optimizer
    step (the recorder emits an ``activity`` record every ``ACTIVITY_FLUSH``
    calls), counting the calls queued plus those the recorder still holds.
    ``optimizer_step``: per unit of its weight (1 + parameters // 25: 4 for the MLP).
    """
    workload = WORKLOADS["mlp"]
    preset = "debug" if kind == "activity" else "audit"
    recorder, buffer = undrained_recorder(preset)
    torch.manual_seed(0)
    x, y = workload.batch()
    recorder.install()
    try:
        model = workload.build()
        optimizer = workload.optimizer(model.parameters())
        loss = workload.loss(model(x), y)  # first forward: sealing, adoption
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad()
        recorder.ctx.sampling = False
        recorder.ctx.step = 1
        for _ in range(3):  # warm allocator and caches with records that are then freed
            loss = workload.loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad()
        buffer.drain(buffer.weight)
        assert buffer.weight == 0 and not recorder.activity._activity
        before, heap_before = rss_bytes(), heap_bytes()
        if kind == "activity":
            recorder.ctx.sampling = True
            with torch.no_grad():
                while buffer.weight + len(recorder.activity._activity) < count:
                    model(x)
        else:
            while buffer.weight < count:
                loss = workload.loss(model(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                optimizer.zero_grad()
                recorder.ctx.sampling = False  # optimizer_step records only
        after, heap_after = rss_bytes(), heap_bytes()
        held = len(recorder.activity._activity)
        units = buffer.weight + held  # module calls (activity) or weight units (optimizer_step)
        records = len(buffer)
        kinds = sorted({r[0] for r in buffer.drain(buffer.weight)})
    finally:
        recorder.remove()
    heap = None if heap_before is None or heap_after is None else (heap_after - heap_before) / units
    return {
        "kind": kind,
        "kinds": kinds,
        "units": units,
        "records": records,
        "held": held,
        "rss_per_unit": (after - before) / units,
        "heap_per_unit": heap,
    }


class Empty(nn.Module):
    """Returns four zero-element tensors: a module call almost free to record (statistics
    of an empty tensor are its shape), with four statistics entries for the writer to encode."""

    def __init__(self) -> None:
        super().__init__()
        self.out = tuple(torch.empty(0) for _ in range(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.out


class Wide(nn.Module):
    """16 cheap modules called in a row: 17 module calls per forward (held by the recorder
    and emitted as an ``activity`` record every 4096), produced faster than the writer can
    encode, hash and insert them."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Empty() for _ in range(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            layer(x)
        return x


def child_flood(seconds: float, hold: float, writer_delay: float = 0.0) -> dict[str, Any]:
    """Produce until the producer has been blocked ``hold`` seconds in all (or ``seconds`` pass).

    ``writer_delay``: seconds the writer sleeps per event before committing a batch
    (a slow store), so that it falls behind the producer.
    """
    scratch = tempfile.mkdtemp(prefix="auditlog-memory-")
    recording = auditlog.record(Path(scratch) / "store", **record_options("debug"))
    recording.start()
    writer = recording.writer
    assert writer is not None
    buffer = writer.buffer
    if writer_delay > 0:
        write = writer._write

        def slow_write(rows: list[dict[str, Any]]) -> None:
            time.sleep(writer_delay * len(rows))
            write(rows)

        writer._write = slow_write  # type: ignore[method-assign]
    trace: list[dict[str, Any]] = []
    produced = 0
    try:
        model = Wide()
        x = torch.randn(4, 8)
        began = time.perf_counter()
        next_mark = 0.0
        with torch.no_grad():
            while True:
                now = time.perf_counter() - began
                last = now >= seconds or buffer.blocked_seconds >= hold
                if now >= next_mark or last:
                    trace.append(
                        {
                            "seconds": now,
                            "rss": rss_bytes(),
                            "queued": buffer.weight,
                            "records": len(buffer),
                            "blocked": buffer.blocked_seconds,
                            "written": writer.written,
                            "produced": produced,
                        }
                    )
                    next_mark += 5.0
                if last:
                    break
                model(x)
                produced += 17
    finally:
        stop_began = time.perf_counter()
        recording.stop()
        drain = time.perf_counter() - stop_began
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "trace": trace,
        "maxsize": buffer.maxsize,
        "peak": peak_rss_bytes(),
        "drain_seconds": drain,
        "dropped": buffer.dropped,
        "writer_delay": writer_delay,
    }


def run_child(threads: int, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--threads", str(threads), "--child", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=100_000, help="optimizer steps of the long runs"
    )
    parser.add_argument("--presets", default="bare,minimal,audit", help="long runs to make")
    parser.add_argument(
        "--per-record",
        type=int,
        default=100_000,
        help="module calls queued for the activity measurement",
    )
    parser.add_argument("--flood-seconds", type=float, default=120.0, help="longest flood")
    parser.add_argument(
        "--flood-hold",
        type=float,
        default=10.0,
        help="stop the flood once the producer was blocked this long",
    )
    parser.add_argument(
        "--flood-writer-delay",
        type=float,
        default=0.0,
        help="seconds the writer sleeps per event written in the flood (a slow store; 0: none)",
    )
    parser.add_argument("--only", default="", help="long, per-record or flood (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        what, *rest = args.child
        if what == "long":
            result = child_long(rest[0], int(rest[1]))
        elif what == "per-record":
            result = child_per_record(rest[0], int(rest[1]))
        else:
            result = child_flood(float(rest[0]), float(rest[1]), float(rest[2]))
        print(json.dumps(result))
        return

    print(machine_line())
    print(preset_note())
    print(
        "command: python benchmarks/memory.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    wanted = set(args.only.split(",")) if args.only else {"long", "per-record", "flood"}

    if "long" in wanted:
        results = []
        for preset in args.presets.split(","):
            began = time.perf_counter()
            results.append(run_child(args.threads, "long", preset, str(args.steps)))
            print(f"  long run {preset}: {time.perf_counter() - began:.0f}s", file=sys.stderr)
        marks = [p["step"] for p in results[0]["points"]]
        print(
            f"\n### RSS over a {args.steps:,}-step run "
            f"(tiny model, {results[0]['points'][-1]['step']:,} optimizer steps)\n"
        )
        print(
            "| configuration | "
            + " | ".join(f"step {m:,}" for m in marks)
            + f" | growth step {marks[2]:,} to {marks[-1]:,} | peak RSS | us/step "
            "| queued weight at end | store on disk |"
        )
        print("|---|" + "---:|" * (len(marks) + 5))
        for r in results:
            points = r["points"]
            growth = points[-1]["rss"] - points[2]["rss"]
            queued = points[-1]["queued"]
            print(
                f"| {r['preset']} | "
                + " | ".join(mib(p["rss"]) for p in points)
                + f" | {growth / 2**20:+.1f} MiB | {mib(r['peak'])} | {r['us_per_step']:.0f} | "
                f"{'' if queued is None else queued} | {mib(r['db_bytes']) if r['db_bytes'] else ''} |"
            )

    per_record: dict[str, dict[str, Any]] = {}
    if "per-record" in wanted:
        for kind in ("activity", "optimizer_step"):
            count = args.per_record if kind == "activity" else max(1000, args.per_record // 50)
            per_record[kind] = run_child(args.threads, "per-record", kind, str(count))
        print(
            "\n### bytes per unit of queued weight (growth / weight; nothing draining the queue)\n"
        )
        print(
            "| record (weight unit) | measured on | weight | records | RSS/unit | C heap/unit | "
            "RSS x maxsize 200,000 |"
        )
        print("|---|---|---:|---:|---:|---:|---:|")
        for kind, r in per_record.items():
            if kind == "activity":
                label = "activity (per module call)"
                what = "MLP forward call under no_grad, 1 output, CPU statistics dict"
                records = f"{r['records']:,} + {r['held']:,} calls held"
            else:
                label = "optimizer_step (per weight unit)"
                what = "MLP SGD step, 98 parameters, 3 norm vectors"
                records = f"{r['records']:,}"
            heap = "" if r["heap_per_unit"] is None else f"{r['heap_per_unit']:,.0f}"
            print(
                f"| {label} | {what} | {r['units']:,} | {records} | {r['rss_per_unit']:,.0f} | {heap} | "
                f"{mib(max(0.0, r['rss_per_unit']) * 200_000)} |"
            )

    if "flood" in wanted:
        r = run_child(
            args.threads,
            "flood",
            str(args.flood_seconds),
            str(args.flood_hold),
            str(args.flood_writer_delay),
        )
        print(
            f"\n### flood: 16 modules returning 4 empty tensors, under no_grad, activity every call; "
            f"RecordBuffer maxsize {r['maxsize']:,} (weight: module calls)"
            + (
                f"; writer slowed by {r['writer_delay']:g}s per event"
                if r["writer_delay"] > 0
                else ""
            )
            + "\n"
        )
        print(
            "| seconds | RSS | queued weight (module calls) | queued records | produced (module calls) | "
            "written (events) | producer blocked |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for p in r["trace"]:
            print(
                f"| {p['seconds']:.0f} | {mib(p['rss'])} | {p['queued']:,} | {p['records']:,} | {p['produced']:,} | "
                f"{p['written']:,} | {p['blocked']:.1f}s |"
            )
        first, full = r["trace"][0], max(r["trace"], key=lambda p: p["queued"])
        blocked = r["trace"][-1]["blocked"]
        if blocked > 0:
            per = (full["rss"] - first["rss"]) / max(1, full["queued"])
            filled = (
                f"the queue filled and the producer was blocked {blocked:.1f}s (back-pressure); "
                f"{(full['rss'] - first['rss']) / 2**20:+.1f} MiB with {full['queued']:,} module calls queued "
                f"(~{per:,.0f} bytes/call of this small kind)"
            )
        else:
            filled = (
                f"the writer kept up: queued weight peaked at {full['queued']:,}, the producer never blocked "
                "(--flood-writer-delay slows the writer to show back-pressure)"
            )
        print(
            f"\npeak RSS {mib(r['peak'])}; {filled}; {r['dropped']:,} records dropped; "
            f"draining the queue at the end took {r['drain_seconds']:.1f}s"
        )


if __name__ == "__main__":
    main()
