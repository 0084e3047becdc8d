"""Ingest rate of the real write path vs a raw ``executemany`` of the same rows.

Records are real: the 98-module MLP of issue #5 trains a few steps under the
hooks of the ``debug`` preset (so every step yields 98 ``forward`` records with
``StatsRecord`` statistics, ~98 ``backward`` records and one ``optimizer_step``
with per-parameter norms); the steady-state records are replicated up to
``--records``. They are then fed, as fast as the buffer takes them, into the
``RecordBuffer`` of a real ``auditlog.record`` session (its hooks see no torch
activity), whose writer thread resolves statistics, encodes canonical JSON,
extends the SHA-256 chain and inserts batches through ``EventStore.append``.
The rate is records / (first put .. flush done). The rows it stored are then
inserted again with plain ``sqlite3`` ``executemany`` into an identical table
(same DDL, WAL, synchronous=NORMAL, one transaction per 5000 rows, like the
writer): the ratio of the two is the issue's ingest target (>= 50%). A narrow
8-integer-column table gives the machine's raw ceiling for comparison with the
issue's ~570k rows/s.

Also reported: how long the producer (the training thread) was blocked in
``RecordBuffer.put`` (``blocked_seconds``; in a flood it blocks once the queue
holds ``maxsize`` records, never before), a paced run at a given producer rate,
a stage breakdown of the writer's work measured synchronously (resolve
statistics, canonical JSON, chain hash, insert), and a cProfile of the writer
thread itself.

    python benchmarks/ingest.py                     # ~1-2 minutes on 2 cores
    python benchmarks/ingest.py --records 50000 --repeat 1 --no-profile   # quick look
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import WORKLOADS, machine_line, preset_note, record_options, undrained_recorder

import auditlog
import auditlog.recording.writer as writer_module
from auditlog.core.chain import chain_hash, encode_clean, genesis_hash, row_prefix
from auditlog.store.eventstore import EventStore

Record = tuple[Any, ...]
BATCH = 5000  # the writer's default batch size; the raw baseline commits as often


# ---------------------------------------------------------------------- records
def capture_records(preset: str, steps: int, construction: bool = False) -> list[Record]:
    """Steady-state records of ``steps`` MLP training steps under ``preset``'s hooks
    (``construction``: instead, the registration records of building the model)."""
    workload = WORKLOADS["mlp"]
    recorder, buffer = undrained_recorder(preset)
    torch.manual_seed(0)
    x, y = workload.batch()
    recorder.install()
    try:
        model = workload.build()
        optimizer = workload.optimizer(model.parameters())
        records: list[Record] = []
        for i in range(steps + 1):
            loss = workload.loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            batch = buffer.drain(buffer.weight)
            if construction and i == 0:
                return [r for r in batch if r[0].endswith("_registered")]
            if i > 0:  # step 0 carries construction and sealing: not steady state
                records += batch
    finally:
        recorder.remove()
    return records


def replicate(records: list[Record], n: int) -> list[Record]:
    return [records[i % len(records)] for i in range(n)]


# ---------------------------------------------------------------------- pipeline
class WriterProfile:
    """Runs the writer thread's loop under cProfile (patched in before the thread starts)."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._original: Callable[..., None] | None = None

    def __enter__(self) -> WriterProfile:
        original = writer_module.Writer._loop
        self._original = original
        profiles = self.profiles

        def profiled(writer: Any) -> None:
            profiler = cProfile.Profile()
            profiler.enable()
            try:
                original(writer)
            finally:
                profiler.disable()
                profiles.append(profiler)

        writer_module.Writer._loop = profiled  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._original is not None
        writer_module.Writer._loop = self._original  # type: ignore[method-assign]


def pipeline(
    records: list[Record], scratch: Path, pace: float | None, per_burst: int
) -> dict[str, Any]:
    """Feed records into a real recording's buffer; return rates and where the rows went.

    ``pace``: producer rate in records/s (bursts of ``per_burst`` records, like one
    training step's worth), or None to put as fast as the buffer accepts.
    """
    store = scratch / "store"
    recording = auditlog.record(store, **record_options("debug"))
    recording.start()
    try:
        writer = recording.writer
        assert writer is not None
        buffer = writer.buffer
        recording.flush(None)  # run_started is written before timing starts
        put = buffer.put
        blocked_before = buffer.blocked_seconds
        max_queued = 0
        began = time.perf_counter()
        if pace is None:
            for record in records:
                put(record)
        else:
            interval = per_burst / pace
            for start in range(0, len(records), per_burst):
                due = began + (start // per_burst) * interval
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                for record in records[start : start + per_burst]:
                    put(record)
                max_queued = max(max_queued, len(buffer))
        produced = time.perf_counter() - began
        recording.flush(None)
        elapsed = time.perf_counter() - began
        blocked = buffer.blocked_seconds - blocked_before
        run_id = recording.run_id
    finally:
        recording.stop()
    return {
        "records": len(records),
        "elapsed": elapsed,
        "produced": produced,
        "rate": len(records) / elapsed,
        "blocked": blocked,
        "max_queued": max_queued,
        "maxsize": buffer.maxsize,
        "db": store / "events.db",
        "run_id": run_id,
    }


# ---------------------------------------------------------------------- raw baselines
def stored_rows(db: Path, run_id: str) -> tuple[list[tuple[Any, ...]], list[str], list[str]]:
    """The rows the writer stored (minus run_started/ended), and the DDL of their table."""
    conn = sqlite3.connect(db)
    try:
        columns = [r[1] for r in conn.execute("pragma table_info(events)") if r[1] != "id"]
        rows = conn.execute(
            f"select {', '.join(columns)} from events where run_id = ? "
            "and kind not in ('run_started', 'run_ended') order by seq",
            (run_id,),
        ).fetchall()
        ddl = [
            r[0]
            for r in conn.execute(
                "select sql from sqlite_master where tbl_name = 'events' and sql is not null "
                "order by type desc"
            )
        ]
    finally:
        conn.close()
    return rows, columns, ddl


def raw_executemany(
    path: Path, ddl: list[str], table: str, columns: list[str], rows: list[tuple[Any, ...]]
) -> float:
    """rows/s of plain sqlite3 executemany, one transaction per BATCH rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("pragma journal_mode=WAL")
        conn.execute("pragma synchronous=NORMAL")
        for statement in ddl:
            conn.execute(statement)
        sql = f"insert into {table} ({', '.join(columns)}) values ({', '.join('?' * len(columns))})"
        began = time.perf_counter()
        for start in range(0, len(rows), BATCH):
            conn.execute("begin")
            conn.executemany(sql, rows[start : start + BATCH])
            conn.execute("commit")
        elapsed = time.perf_counter() - began
    finally:
        conn.close()
    return len(rows) / elapsed


def narrow_rows(n: int) -> list[tuple[int, ...]]:
    return [(i, i % 7, i * 3, 1, 2, 3, i % 100, i) for i in range(n)]


NARROW_DDL = [
    "create table narrow (a integer, b integer, c integer, d integer, e integer, f integer, g integer, h integer)"
]


# ---------------------------------------------------------------------- stages
def stages(records: list[Record], scratch: Path) -> dict[str, float]:
    """Seconds per record of each stage of the writer, run synchronously on this thread."""
    materialize = writer_module.materialize
    began = time.perf_counter()
    plain = [materialize(r[5]) for r in records]
    t_materialize = time.perf_counter() - began

    began = time.perf_counter()
    texts = [encode_clean(p) for p in plain]
    t_json = time.perf_counter() - began

    run_id = "0" * 32
    head = genesis_hash(run_id, 0)
    prefix = row_prefix(run_id, 0)  # as the writer does: once per stream
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    for seq, (record, text) in enumerate(zip(records, texts, strict=True), start=1):
        kind, ts_ns, step, module_id, tensor_id, _ = record
        row = {
            "run_id": run_id,
            "stream": 0,
            "seq": seq,
            "ts_ns": ts_ns,
            "kind": kind,
            "step": step,
            "module_id": module_id,
            "tensor_id": tensor_id,
            "payload": text,
        }
        head = row["hash"] = chain_hash(head, row, prefix)
        rows.append(row)
    t_chain = time.perf_counter() - began

    store = EventStore.open(str(scratch / "stages"), create=True)
    try:
        store.create_run(run_id, None, "bench", os.getpid(), None)
        began = time.perf_counter()
        for start in range(0, len(rows), BATCH):
            store.append(rows[start : start + BATCH], run_id)
        t_insert = time.perf_counter() - began
    finally:
        store.close()
    n = len(records)
    return {
        "resolve lazy values, clean floats (materialize)": t_materialize / n,
        "JSON, sorted keys (encode_clean: orjson)": t_json / n,
        "row + SHA-256 chain (chain_hash)": t_chain / n,
        "insert: driver executemany in one transaction (EventStore.append)": t_insert / n,
    }


# ---------------------------------------------------------------------- report
def print_profile(profiles: list[cProfile.Profile], records: int, top: int) -> None:
    if not profiles:
        return
    out = io.StringIO()
    stats = pstats.Stats(profiles[0], stream=out)
    for extra in profiles[1:]:
        stats.add(extra)
    entries = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    print(
        f"\nwriter thread under cProfile ({records:,} records; own time {total / records * 1e6:.1f} us/record, "
        "inflated by the profiler):\n"
    )
    print("| function | calls/record | own us/record | cumulative us/record |")
    print("|---|---:|---:|---:|")
    for (filename, line, func), (_cc, calls, own, cumulative, _callers) in entries[:top]:
        where = f"`{func}`" if filename == "~" else f"`{_short(filename)}:{line} {func}`"
        print(
            f"| {where} | {calls / records:.2f} | {own / records * 1e6:.2f} | {cumulative / records * 1e6:.2f} |"
        )


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("auditlog", "sqlalchemy", "torch", "json"):
        if anchor in parts:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[index:])
    return Path(filename).name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000, help="records per pipeline run")
    parser.add_argument(
        "--repeat", type=int, default=2, help="pipeline + raw runs (medians reported)"
    )
    parser.add_argument(
        "--capture-steps", type=int, default=10, help="MLP steps whose records are replicated"
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="paced run's producer rate, records/s (0: half the measured rate)",
    )
    parser.add_argument("--stage-records", type=int, default=50_000)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_line())
    print(preset_note())
    print(
        "command: python benchmarks/ingest.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )

    parser_mixes = {
        "training (debug preset: activity + optimizer_step per step)": capture_records(
            "debug", args.capture_steps
        ),
        "construction (registration events)": capture_records("debug", 0, construction=True),
    }
    base = parser_mixes["training (debug preset: activity + optimizer_step per step)"]
    per_step = len(base) // args.capture_steps
    kinds = Counter(r[0] for r in base)
    mix = ", ".join(f"{k} {v / args.capture_steps:.0f}" for k, v in sorted(kinds.items()))
    print(
        f"records: MLP under the debug preset, per step: {mix} ({per_step} records); "
        f"and the {len(parser_mixes['construction (registration events)'])} registration records of building it"
    )

    table: list[str] = []
    training_rate = 0.0
    profiles: list[cProfile.Profile] = []
    runs: list[dict[str, Any]] = []
    records = base
    for name, captured in parser_mixes.items():
        mixed = replicate(captured, args.records)
        rates: list[float] = []
        raws: list[float] = []
        narrows: list[float] = []
        payload_bytes = 0
        for i in range(args.repeat):
            scratch = Path(tempfile.mkdtemp(prefix="auditlog-ingest-"))
            try:
                if i == 0 and not args.no_profile and captured is base:
                    # The profiled run is extra: cProfile slows the writer, so it is not timed.
                    with WriterProfile() as wp:
                        pipeline(
                            mixed[: min(len(mixed), 100_000)], scratch / "profiled", None, per_step
                        )
                    profiles = wp.profiles
                run = pipeline(mixed, scratch, None, per_step)
                rows, columns, ddl = stored_rows(run["db"], run["run_id"])
                payload_bytes = sum(len(r[columns.index("payload")]) for r in rows) // max(
                    1, len(rows)
                )
                raws.append(raw_executemany(scratch / "raw.db", ddl, "events", columns, rows))
                narrows.append(
                    raw_executemany(
                        scratch / "narrow.db",
                        NARROW_DDL,
                        "narrow",
                        list("abcdefgh"),
                        narrow_rows(len(rows)),
                    )
                )
                rates.append(run["rate"])
                if captured is base:
                    runs.append(run)
                print(
                    f"  {name} run {i + 1}: writer {run['rate']:,.0f} rec/s, raw {raws[-1]:,.0f} rows/s, "
                    f"narrow {narrows[-1]:,.0f} rows/s",
                    file=sys.stderr,
                )
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        rate, raw, narrow = (
            statistics.median(rates),
            statistics.median(raws),
            statistics.median(narrows),
        )
        if captured is base:
            training_rate = rate
        table.append(
            f"| {name}, {payload_bytes:,} B payload | {rate:,.0f} ({', '.join(f'{r:,.0f}' for r in rates)}) | "
            f"{raw:,.0f} | **{rate / raw:.0%}** | {narrow:,.0f} |"
        )
    print(f"\n### ingest ({args.records:,} records per run, {args.repeat} runs, medians)\n")
    print(
        "| records | auditlog writer rows/s (runs) | raw executemany of the same stored rows, rows/s "
        "| writer vs raw (target >= 50%) | raw, 8 narrow integer columns |"
    )
    print("|---|---:|---:|---:|---:|")
    for line in table:
        print(line)
    print(
        "\nauditlog writer = resolve + JSON + SHA-256 chain + EventStore.append, on its thread, fed by a producer "
        "putting records as fast as the buffer takes them; raw = plain sqlite3 executemany into an identical table "
        "(same DDL, WAL, synchronous=NORMAL, one transaction per 5000 rows)."
    )

    flood = runs[-1]
    print(
        f"\nflood producer: {flood['records']:,} records put in {flood['produced']:.2f}s, written by "
        f"{flood['elapsed']:.2f}s; blocked in RecordBuffer.put {flood['blocked']:.2f}s "
        f"(maxsize {flood['maxsize']:,}: the producer can only block once the queue is full)"
    )
    pace = args.pace or training_rate / 2
    scratch = Path(tempfile.mkdtemp(prefix="auditlog-ingest-"))
    try:
        n = min(len(records), max(per_step, int(pace * 10)))  # ~10 s of production
        paced = pipeline(records[:n], scratch, pace, per_step)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"paced producer at {pace:,.0f} records/s ({per_step} per burst): {paced['records']:,} records, "
        f"blocked {paced['blocked']:.3f}s, queue peaked at {paced['max_queued']:,} records, "
        f"written {paced['elapsed'] - paced['produced']:.2f}s after the last put"
    )

    print("\nwriter stages, measured one after another on this thread (no threads, no profiler):\n")
    print("| stage | us/record | share |")
    print("|---|---:|---:|")
    scratch = Path(tempfile.mkdtemp(prefix="auditlog-ingest-"))
    try:
        parts = stages(records[: args.stage_records], scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total = sum(parts.values())
    for name, seconds in parts.items():
        print(f"| {name} | {seconds * 1e6:.2f} | {seconds / total:.0%} |")
    print(f"| total (= {1 / total:,.0f} records/s single-threaded) | {total * 1e6:.2f} | 100% |")
    if profiles:
        print_profile(profiles, min(len(records), 100_000), args.top)


if __name__ == "__main__":
    main()
