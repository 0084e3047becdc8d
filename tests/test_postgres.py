"""PostgreSQL as the shared event store: the same revisions, record, verify and read model.

Every test runs against the real server (``pg_url`` creates and drops a database
of its own; without a reachable server the tests are skipped, saying why).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg
import pytest
from helpers import assert_one_line_error, invoke, record_run
from integrity_support import isolate_keys
from launch_support import WORKERS, start_workers

import auditlog
from auditlog.core.errors import StoreError, UsageError
from auditlog.integrity.keys import generate_key_pair
from auditlog.store import schema
from auditlog.store.eventstore import EventStore
from auditlog.store.location import resolve_store
from auditlog.store.readmodel import arrowcopy


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def test_a_new_database_store_needs_a_snapshot_directory(pg_url: str) -> None:
    result = invoke("db", "upgrade", "--store", pg_url)
    assert_one_line_error(result, 2, "--snapshots PATH", "AUDITLOG_SNAPSHOTS")
    with psycopg.connect(_plain(pg_url)) as conn:  # nothing was created
        assert conn.execute(
            "select count(*) from pg_tables where schemaname = 'public'"
        ).fetchone() == (0,)


def test_the_store_remembers_its_snapshot_directory(pg_url: str, tmp_path: Path) -> None:
    snaps = tmp_path / "shared-snapshots"
    created = invoke("db", "upgrade", "--store", pg_url, "--snapshots", str(snaps))
    assert created.exit_code == 0, created.stderr
    assert f"revision {schema.HEAD_REVISION}" in created.stdout
    run_id = record_run(pg_url, steps=2)  # no snapshot directory given: the store knows it
    assert any(snaps.rglob("*.parquet"))
    with auditlog.open(pg_url) as store:
        assert store.location.snapshots == snaps
        assert store.run(run_id).verify().ok
        restored = store.run(run_id).state_dict(step=2)
    assert sorted(restored) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_record_verify_tree_and_query_in_postgres(pg_url: str, tmp_path: Path) -> None:
    location = resolve_store(pg_url, tmp_path / "snaps")
    run_id = record_run(location, steps=3, name="pg")
    store_args = ("--store", pg_url)
    runs = invoke("runs", *store_args, "--format", "json")
    assert runs.exit_code == 0, runs.stderr
    [info] = json.loads(runs.stdout)
    assert (info["run_id"], info["status"], info["steps"], info["name"]) == (
        run_id,
        "completed",
        3,
        "pg",
    )
    verified = invoke("verify", *store_args)
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert "intact" in verified.stdout
    tree = invoke("tree", *store_args, "--format", "json")
    assert [c["name"] for c in json.loads(tree.stdout)[0]["children"]] == ["0", "1", "2"]
    query = invoke(
        "query",
        *store_args,
        "--format",
        "json",
        "select step, count(*) as n from steps group by 1 order by 1",
    )
    assert query.exit_code == 0, query.stderr
    assert json.loads(query.stdout) == [
        {"step": 1, "n": 4},
        {"step": 2, "n": 4},
        {"step": 3, "n": 4},
    ]


def test_adbc_and_sqlalchemy_copy_the_same_rows(pg_url: str, tmp_path: Path) -> None:
    record_run(resolve_store(pg_url, tmp_path / "snaps"), steps=2)
    store = EventStore.open(pg_url)
    try:
        assert arrowcopy.copy_method(store) == "adbc-postgresql"
        upto = arrowcopy.max_event_id(store)
        fast = list(arrowcopy.event_batches(store, 0, upto))
        slow = list(arrowcopy.sqlalchemy_batches(store, 0, upto))
    finally:
        store.close()
    import pyarrow as pa

    assert pa.Table.from_batches(fast).equals(pa.Table.from_batches(slow))
    assert sum(b.num_rows for b in fast) == upto


def test_an_edited_event_in_postgres_fails_verify(pg_url: str, tmp_path: Path) -> None:
    run_id = record_run(resolve_store(pg_url, tmp_path / "snaps"), steps=2)
    with psycopg.connect(_plain(pg_url)) as conn:
        conn.execute(
            "update events set payload = replace(payload, '\"lr\":0.1', '\"lr\":0.5') "
            "where run_id = %s and kind = 'optimizer_step' and seq = "
            "(select min(seq) from events where run_id = %s and kind = 'optimizer_step')",
            (run_id, run_id),
        )
    result = invoke("verify", "--store", pg_url)
    assert result.exit_code == 4
    assert "optimizer_step" in result.stdout and "does not match its recorded hash" in result.stdout


def test_store_config_file(pg_url: str, tmp_path: Path) -> None:
    config = tmp_path / "store.toml"
    config.write_text(f'[store]\nurl = "{pg_url}"\nsnapshots = "snaps"\n')
    run_id = record_run(str(config), steps=1)
    assert (tmp_path / "snaps").is_dir()
    runs = invoke("runs", "--store", str(config), "--format", "json")
    assert [r["run_id"] for r in json.loads(runs.stdout)] == [run_id]
    broken = tmp_path / "broken.toml"
    broken.write_text("[store]\nsnapshots = 'x'\n")
    assert_one_line_error(invoke("runs", "--store", str(broken)), 2, "has no [store] url")


def test_without_the_driver_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    result = invoke("runs", "--store", "postgresql+psycopg://nobody@127.0.0.1/none")
    line = assert_one_line_error(result, 3, "pip install 'auditlog[postgres]'")
    assert "psycopg" in line
    with pytest.raises(StoreError, match=r"auditlog\[postgres\]"):
        EventStore.open(resolve_store("postgresql+psycopg://nobody@127.0.0.1/none", tmp_path))


def test_snapshot_location_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="only directories"):
        resolve_store("postgresql+psycopg://x@h/db", "s3://bucket/snaps")
    assert (
        resolve_store("postgresql+psycopg://x@h/db", f"file://{tmp_path}/s").snapshots
        == tmp_path / "s"
    )


@pytest.mark.slow
def test_four_writer_processes_lose_nothing(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four processes race to create the store and record at once; every event arrives."""
    isolate_keys(monkeypatch, tmp_path)
    key = generate_key_pair(tmp_path / "team.key").private_path
    monkeypatch.setenv("AUDITLOG_SNAPSHOTS", str(tmp_path / "snaps"))
    workers = start_workers(pg_url, key, tmp_path)  # type: ignore[arg-type]
    assert len({run_id for run_id, _ in workers}) == WORKERS
    with psycopg.connect(_plain(pg_url)) as conn:
        for run_id, signed_seq in workers:
            seqs = [
                s
                for (s,) in conn.execute(
                    "select seq from events where run_id = %s and stream = 0 order by seq",
                    (run_id,),
                )
            ]
            assert seqs == list(range(1, len(seqs) + 1))
            assert signed_seq == seqs[-1]
            kinds = [
                k
                for (k,) in conn.execute(
                    "select kind from events where run_id = %s order by seq", (run_id,)
                )
            ]
            assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
    runs = json.loads(invoke("runs", "--store", pg_url, "--format", "json").stdout)
    assert {r["status"] for r in runs} == {"completed"} and len(runs) == WORKERS
    verified = invoke("verify", "all", "--store", pg_url, "--key", str(key) + ".pub")
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert verified.stdout.count("1 signed checkpoint(s): intact") == WORKERS


# --------------------------------------------------------------------------- revision 0004 -> 0005
def _store_at_0004(pg_url: str, tmp_path: Path) -> tuple[Path, str]:
    """The chain-v1 fixture's store (tests/fixtures/chain_v1) as a PostgreSQL store at revision
    0004: the tables as Alembic made them then, every row copied, ``snapshot`` NULL."""
    import shutil
    import sqlite3

    from alembic import command

    from auditlog.store.migrate import alembic_config
    from auditlog.store.opening import make_engine

    fixture = Path(__file__).resolve().parent / "fixtures" / "chain_v1"
    snaps = Path(shutil.copytree(fixture / "store" / "snapshots", tmp_path / "snaps"))
    engine = make_engine(resolve_store(pg_url, snaps))
    try:
        with engine.begin() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0004")
    finally:
        engine.dispose()
    source = sqlite3.connect(fixture / "store" / "events.db")
    with psycopg.connect(_plain(pg_url)) as conn:
        for table in ("auditlog_meta", "runs", "events", "checkpoints", "snapshot_blobs"):
            cursor = source.execute(f"select * from {table}")
            names = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
            marks = ", ".join(["%s"] * len(names))
            with conn.cursor() as cur:
                cur.executemany(f"insert into {table} ({', '.join(names)}) values ({marks})", rows)
        conn.execute("insert into auditlog_meta values ('snapshots', %s)", (str(snaps),))
    source.close()
    return fixture / "key" / "signing_key.pub", "v1-signed"


def test_a_revision_0004_store_upgrades_in_postgres(pg_url: str, tmp_path: Path) -> None:
    key, run = _store_at_0004(pg_url, tmp_path)
    assert_one_line_error(invoke("runs", "--store", pg_url), 3, "0004", "auditlog db upgrade")
    result = invoke("db", "upgrade", "--store", pg_url)
    assert result.exit_code == 0, result.stderr
    assert "from revision 0004 to 0005" in result.stdout
    with psycopg.connect(_plain(pg_url)) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "select column_name from information_schema.columns "
                "where table_name = 'events' order by ordinal_position"
            )
        ]
    assert columns == [c.name for c in schema.events.columns]
    verified = invoke("verify", run, "--store", pg_url, "--key", str(key))
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert "intact, signed" in verified.stdout
    with auditlog.open(pg_url) as store:
        assert sorted(store.run(run).state_dict(step=4)) == sorted(
            json.loads((key.parent.parent / "expected.json").read_text())["4"]
        )
    query = invoke(
        "query", "--store", pg_url, "--format", "json", "select count(*) as n from events"
    )
    assert query.exit_code == 0, query.stderr
    assert json.loads(query.stdout) == [{"n": 58}]


def test_a_postgresql_store_holding_a_snapshot_value_is_refused_unchanged(
    pg_url: str, tmp_path: Path
) -> None:
    _store_at_0004(pg_url, tmp_path)
    with psycopg.connect(_plain(pg_url)) as conn:
        conn.execute("update events set snapshot = 'forged' where id = 7")
    assert_one_line_error(
        invoke("db", "upgrade", "--store", pg_url), 3, "event id 7", "left unchanged"
    )
    with psycopg.connect(_plain(pg_url)) as conn:
        assert conn.execute("select version_num from alembic_version").fetchone() == ("0004",)
        assert conn.execute("select snapshot from events where id = 7").fetchone() == ("forged",)
