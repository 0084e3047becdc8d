"""Four processes recording into one SQLite store at the same moment.

Each worker is a real Python process that trains a tiny model under
``auditlog.record(store=...)`` and then signs its chain head with
``auditlog.integrity.checkpoints.checkpoint_head``; all of them wait for one start signal so
that their writes really overlap. Afterwards every run must be present and
completed, every stream gap-free, and ``verify all`` (with the signing key)
must pass. A ``database is locked`` failure would show as a worker's stderr
line (the writer reports and stops), a missing run, or a sequence gap.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import invoke
from integrity_support import isolate_keys
from launch_support import WORKERS, start_workers

from auditlog.integrity.keys import generate_key_pair
from auditlog.store.eventstore import EventStore


@pytest.mark.slow
@pytest.mark.parametrize(
    "created",
    [pytest.param(True, id="existing-store"), pytest.param(False, id="store-created-by-the-race")],
)
def test_four_processes_record_into_one_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, created: bool
) -> None:
    isolate_keys(monkeypatch, tmp_path)
    key = generate_key_pair(tmp_path / "team.key").private_path
    store = tmp_path / "store"
    if created:
        assert invoke("db", "upgrade", "--store", str(store)).exit_code == 0

    workers = start_workers(store, key, tmp_path)
    run_ids = {run_id for run_id, _ in workers}
    assert len(run_ids) == WORKERS

    listed = invoke("runs", "--store", str(store), "--format", "json")
    assert listed.exit_code == 0, listed.stderr
    runs = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert set(runs) == run_ids
    assert {r["status"] for r in runs.values()} == {"completed"}
    assert {r["steps"] for r in runs.values()} == {3}

    conn = sqlite3.connect(f"file:{store / 'events.db'}?mode=ro", uri=True)
    try:
        for run_id, signed_seq in workers:
            streams = conn.execute(
                "select distinct stream from events where run_id=?", (run_id,)
            ).fetchall()
            assert streams == [(0,)]
            seqs = [
                s
                for (s,) in conn.execute(
                    "select seq from events where run_id=? and stream=0 order by seq", (run_id,)
                )
            ]
            assert seqs == list(range(1, len(seqs) + 1)), f"gap in run {run_id}"
            assert signed_seq == seqs[-1]
            kinds = [
                k
                for (k,) in conn.execute(
                    "select kind from events where run_id=? and stream=0 order by seq", (run_id,)
                )
            ]
            assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
        (checkpoints,) = conn.execute("select count(*) from checkpoints").fetchone()
        assert checkpoints == WORKERS
        # The writers really ran at once: every two runs' commit intervals (first to
        # last event time) overlap, which serial recording could never produce.
        spans = dict(
            conn.execute("select run_id, min(ts_ns) from events group by run_id").fetchall()
        )
        ends = dict(
            conn.execute("select run_id, max(ts_ns) from events group by run_id").fetchall()
        )
        for a, b in itertools.combinations(sorted(spans), 2):
            assert max(spans[a], spans[b]) < min(ends[a], ends[b]), (
                f"runs {a[:8]} and {b[:8]} did not overlap"
            )
    finally:
        conn.close()

    result = invoke("verify", "all", "--store", str(store), "--key", str(key) + ".pub")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.count("1 signed checkpoint(s): intact") == WORKERS


@pytest.mark.parametrize("same", [False, True], ids=["four stores", "one store"])
@pytest.mark.slow
def test_threads_of_one_process_create_stores_at_once(tmp_path: Path, same: bool) -> None:
    """Alembic's migration proxies are process-global: concurrent migrations from
    threads crashed the interpreter (segfault) before migrations were serialized,
    and a thread finding another's private build copy refused the directory as
    not a store. Run in a child process so a crash is a failure, not a dead suite."""
    script = (
        "import sys, threading\n"
        "from auditlog.store.eventstore import EventStore\n"
        "errors = []\n"
        "def make(path):\n"
        "    try:\n"
        "        EventStore.open(path, create=True).close()\n"
        "    except Exception as exc:\n"
        "        errors.append(repr(exc))\n"
        "for round in range(5):\n"
        "    paths = [f'{sys.argv[1]}/r{round}/s{0 if sys.argv[2] == \"same\" else i}' for i in range(4)]\n"
        "    threads = [threading.Thread(target=make, args=(p,)) for p in paths]\n"
        "    [t.start() for t in threads]\n"
        "    [t.join() for t in threads]\n"
        "print(len(errors), errors[:2])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "same" if same else "distinct"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith("0 "), done.stdout
    stores = sorted(p.parent for p in tmp_path.glob("r*/s*/events.db"))
    assert len(stores) == (5 if same else 20)
    for store in stores:
        assert [
            p.name for p in store.iterdir() if p.name.startswith(".")
        ] == []  # no build copies left
        opened = EventStore.open(str(store))
        try:
            assert opened.revision
        finally:
            opened.close()
