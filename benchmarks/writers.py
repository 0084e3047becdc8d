"""Events/s from several writer processes: one shared PostgreSQL store vs per-rank SQLite shards.

Each writer process plays one rank of a distributed job: it runs the real write
path (``auditlog.recording.writer.Writer``: canonical JSON, SHA-256 chain,
batched inserts through ``EventStore.append``) on its own stream, fed as fast
as its ``RecordBuffer`` takes records shaped like a training step's events
(an ``optimizer_step``-sized payload). All writers of a round are released
together; the rate is all events / (first start .. last flush done).

Two targets, side by side, for 2, 4 and 8 writers:

- ``postgresql``: every writer appends to one PostgreSQL database (a fresh one
  per round, created and dropped here);
- ``sqlite-shards``: every writer appends to a shard store of its own (what
  ``auditlog run --shard`` does), to be merged later by ``auditlog combine``;
  the combine time is reported too.

The figure that matters is the ratio postgresql / shards at each writer count.
Timings on a loaded machine are not figures: rerun on a quiet one.

    python benchmarks/writers.py                          # ~1-3 minutes
    python benchmarks/writers.py --events 2000 --writers 2,4   # quick look
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine_line

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _payload(step: int) -> Any:
    from auditlog.core.chain import Clean

    norms = [0.1 + (step % 7) * 0.01 + i * 1e-3 for i in range(16)]
    return Clean(
        optimizer_id=1,
        optimizer_class="torch.optim.adamw.AdamW",
        optimizer_step=step,
        param_groups=[
            {"lr": 1e-3, "weight_decay": 0.01, "betas": [0.9, 0.999], "params": list(range(16))}
        ],
        tensor_ids=list(range(16)),
        grad_norm=norms,
        update_norm=norms,
        param_norm=norms,
        nonfinite_grads=0,
    )


def _writer(
    store: str, snapshots: str, run_id: str, stream: int, world: int, events: int, go: Any, out: Any
) -> None:
    """One writer process: its stream, as fast as the buffer takes records.

    The stream begins with a real ``run_started`` (this rank's facts) and ends with
    ``run_ended``, written before and after the timed part: ``combine`` and
    ``verify`` refuse a stream that does not begin with one.
    """
    import os

    from auditlog.capture.buffer import RecordBuffer
    from auditlog.core.liveness import process_start_ticks
    from auditlog.recording.launch import Launch
    from auditlog.recording.metadata import static_metadata
    from auditlog.recording.writer import Writer
    from auditlog.store.eventstore import EventStore
    from auditlog.store.location import resolve_store

    name = "writers benchmark"
    opened = EventStore.open(resolve_store(store, snapshots or None), create=True)
    static = static_metadata(
        name, None, {}, argv=["writers.py"], launch=Launch(rank=stream, world_size=world)
    )
    static.update(segment=0, run_id_source="benchmark")
    opened.create_run(run_id, name, static["host"], os.getpid(), process_start_ticks(os.getpid()))
    buffer = RecordBuffer()
    writer = Writer(opened, run_id, stream, buffer)
    buffer.put(("run_started", time.time_ns(), 0, None, None, static))
    writer.start()
    writer.flush()
    records = [
        ("optimizer_step", time.time_ns(), i, None, None, _payload(i)) for i in range(1, 257)
    ]
    go.wait()
    start = time.perf_counter()
    for i in range(events):
        buffer.put(records[i % len(records)])
    writer.flush()
    end = time.perf_counter()
    buffer.put(
        (
            "run_ended",
            time.time_ns(),
            events,
            None,
            None,
            {
                "status": "completed",
                "exit_code": 0,
                "exception": None,
                "signal": None,
                "steps": events,
                "dropped": 0,
            },
        )
    )
    writer.close()
    opened.close()
    out.put((stream, start, end, writer.written - 2, writer.dropped))  # the timed events only


def _round(target: str, stores: list[str], snapshots: str, events: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    run_id = uuid.uuid4().hex
    procs = [
        ctx.Process(
            target=_writer, args=(store, snapshots, run_id, rank, len(stores), events, go, out)
        )
        for rank, store in enumerate(stores)
    ]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # let every process import and open its store before the start signal
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    start = min(r[1] for r in results)
    end = max(r[2] for r in results)
    written = sum(r[3] for r in results)
    dropped = sum(r[4] for r in results)
    return {
        "target": target,
        "writers": len(stores),
        "events": written,
        "dropped": dropped,
        "seconds": end - start,
        "rate": written / (end - start),
    }


def _pg_database(admin: str) -> tuple[str, Any] | None:
    try:
        import psycopg
    except ImportError:
        return None
    name = f"auditlog_bench_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:
        print(f"postgresql skipped: {exc}".splitlines()[0])
        return None

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    base = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}", drop


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20_000, help="events per writer")
    parser.add_argument("--writers", default="2,4,8", help="writer counts, comma-separated")
    parser.add_argument("--pg", default=PG_ADMIN, help="PostgreSQL admin URL (libpq form)")
    args = parser.parse_args()
    counts = [int(n) for n in args.writers.split(",")]
    print(machine_line())
    print(f"{args.events} events per writer; writers {counts}\n")
    rows = []
    for n in counts:
        work = Path(tempfile.mkdtemp(prefix="auditlog-writers-"))
        try:
            pg = _pg_database(args.pg)
            if pg is not None:
                url, drop = pg
                try:
                    rows.append(
                        _round("postgresql", [url] * n, str(work / "pg-snapshots"), args.events)
                    )
                finally:
                    drop()
            shards = [str(work / "store" / "shards" / f"rank{r}") for r in range(n)]
            rows.append(_round("sqlite-shards", shards, "", args.events))
            from auditlog.recording.combine import combine

            begun = time.perf_counter()
            report = combine(str(work / "store"), shards)
            rows[-1]["combine_s"] = time.perf_counter() - begun
            # Every timed event plus each stream's run_started and run_ended.
            expected = rows[-1]["events"] + 2 * n
            assert report.ok and report.events_added == expected, ("combine lost events", report)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'target':<15} {'writers':>7} {'events':>9} {'dropped':>7} {'seconds':>8} {'events/s':>10} {'combine s':>9}"
    )
    for row in rows:
        combine_s = f"{row['combine_s']:.2f}" if "combine_s" in row else ""
        print(
            f"{row['target']:<15} {row['writers']:>7} {row['events']:>9} {row['dropped']:>7} "
            f"{row['seconds']:>8.2f} {row['rate']:>10.0f} {combine_s:>9}"
        )
    print("\nratio postgresql / sqlite-shards (events/s, same writers, same run of this script):")
    for n in counts:
        pg_rate = next(
            (r["rate"] for r in rows if r["target"] == "postgresql" and r["writers"] == n), None
        )
        shard_rate = next(
            r["rate"] for r in rows if r["target"] == "sqlite-shards" and r["writers"] == n
        )
        print(
            f"  {n} writers: "
            + (f"{pg_rate / shard_rate:.2f}" if pg_rate else "n/a (no PostgreSQL)")
        )


if __name__ == "__main__":
    main()
