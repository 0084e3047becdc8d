"""Opening stores: creation, refusal of anything that is not ours, schema revisions.

A refused location must be left exactly as it was: the same bytes, and no new
files next to it (no directory created, no SQLite ``-wal``/``-shm`` sidecars).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import CliResult, assert_one_line_error, file_digest, invoke, tree_digest
from helpers import record_run as record_tiny_run

import auditlog
from auditlog.core.errors import NotAStoreError, SchemaTooNewError, StoreError, StoreMissingError
from auditlog.store import schema
from auditlog.store.eventstore import EventStore, upgrade_store
from auditlog.store.migrate import alembic_head
from auditlog.store.schema import HEAD_REVISION as HEAD

REPO = Path(__file__).resolve().parents[1]
READING_COMMANDS = (("runs",), ("events",), ("verify",))
ALL_COMMANDS = (*READING_COMMANDS, ("db", "current"), ("db", "upgrade"))


# --------------------------------------------------------------------------- helpers
def record_run(store_path: Path | str | None, steps: int = 2, name: str | None = None) -> str:
    """A tiny run without snapshots, so the store is also a faithful revision-0001
    store once the newer tables are dropped (the older-schema test does that)."""
    return record_tiny_run(store_path, steps, name, snapshot_initial=False, snapshot_final=False)


def cli(*args: str, store: Path | str) -> CliResult:
    return invoke(*args, "--store", str(store))


def checkpoint(db: Path) -> None:
    """Fold the WAL back into the main file so its bytes are the whole database."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def run_ids_listed(store: Path | str) -> list[str]:

    result = invoke("runs", "--store", str(store), "--format", "json")
    assert result.exit_code == 0, result.stderr
    return [r["run_id"] for r in json.loads(result.stdout)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One recorded run, made once per module; tests work on copies."""
    path = tmp_path_factory.mktemp("pristine") / "store"
    # record from inside the temp dir: run_started inspects the cwd's git repository
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path.parent)
        run_id = record_run(path)
    checkpoint(path / "events.db")
    assert sorted(os.listdir(path)) == ["events.db"]
    return path, run_id


@pytest.fixture
def recorded(pristine: tuple[Path, str], store: Path) -> str:
    """A private copy of the recorded store at ``store``; returns its run id."""
    shutil.copytree(pristine[0], store)
    return pristine[1]


# --------------------------------------------------------------------------- builders of refused stores
def make_foreign(directory: Path, wal: bool = False) -> None:
    directory.mkdir(parents=True)
    conn = sqlite3.connect(directory / "events.db")
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("create table invoices (id integer primary key, customer text, amount real)")
    conn.executemany(
        "insert into invoices(customer, amount) values (?, ?)", [("acme", 12.5), ("globex", 99.0)]
    )
    conn.commit()
    conn.close()
    assert sorted(os.listdir(directory)) == ["events.db"]


def make_text(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "events.db").write_text("these are my notes, not a database\n")


def make_empty(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "events.db").write_bytes(b"")


def make_garbage(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "events.db").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 12)


def make_truncated(directory: Path, pristine: Path) -> None:
    """The first 2000 bytes of a real (checkpointed) store's events.db."""
    tmp = directory.parent / "truncated-source"
    shutil.copytree(pristine, tmp)
    checkpoint(tmp / "events.db")
    data = (tmp / "events.db").read_bytes()
    assert len(data) > 2000
    directory.mkdir(parents=True)
    (directory / "events.db").write_bytes(data[:2000])


def make_newer(directory: Path, pristine: Path) -> None:
    shutil.copytree(pristine, directory)
    conn = sqlite3.connect(directory / "events.db")
    conn.execute("update alembic_version set version_num='9999'")
    conn.commit()
    conn.close()
    checkpoint(directory / "events.db")
    assert sorted(os.listdir(directory)) == ["events.db"]


# --------------------------------------------------------------------------- creation and revisions
def test_db_upgrade_creates_a_fresh_store(store: Path) -> None:
    result = cli("db", "upgrade", store=store)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"created store at revision {schema.HEAD_REVISION}"
    assert (store / "events.db").is_file()

    result = cli("db", "current", store=store)
    assert result.exit_code == 0, result.stderr
    assert f"revision {HEAD}" in result.stdout and "(current)" in result.stdout

    result = cli("db", "upgrade", store=store)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"store already at revision {HEAD}"

    opened = EventStore.open(str(store))
    try:
        assert opened.revision == HEAD
        meta = opened.meta()
    finally:
        opened.close()
    assert meta["format"] == schema.STORE_FORMAT
    assert re.fullmatch(r"[0-9a-f]{32}", meta["store_id"])


def test_upgrade_store_reports_before_and_after(store: Path) -> None:
    assert upgrade_store(str(store)) == (None, HEAD)
    assert upgrade_store(str(store)) == (HEAD, HEAD)


@pytest.mark.parametrize("command", (*READING_COMMANDS, ("db", "current")), ids=" ".join)
def test_reading_a_missing_store_is_refused_and_not_created(
    store: Path, command: tuple[str, ...]
) -> None:
    assert_one_line_error(cli(*command, store=store), 3, "no auditlog store", str(store))
    assert not store.exists()


def test_event_store_open_on_missing_store_raises(store: Path) -> None:
    with pytest.raises(StoreMissingError):
        EventStore.open(str(store))
    assert not store.exists()


def test_alembic_head_matches_schema_head() -> None:
    assert alembic_head() == schema.HEAD_REVISION
    assert schema.KNOWN_REVISIONS[-1] == schema.HEAD_REVISION


def test_known_revisions_lists_every_migration_file() -> None:
    revisions = []
    for path in sorted((REPO / "migrations" / "versions").glob("*.py")):
        if path.name == "__init__.py":
            continue
        match = re.search(r'^revision\s*=\s*["\']([^"\']+)["\']', path.read_text(), re.MULTILINE)
        assert match, f"{path.name} has no revision id"
        revisions.append(match.group(1))
    assert revisions, "no migration files found"
    assert tuple(revisions) == schema.KNOWN_REVISIONS


# --------------------------------------------------------------------------- refusals
def test_foreign_sqlite_database_is_refused_untouched(store: Path) -> None:
    make_foreign(store)
    db = store / "events.db"
    before_file, before_tree = file_digest(db), tree_digest(store)
    for command in ALL_COMMANDS:
        line = assert_one_line_error(
            cli(*command, store=store), 3, "foreign", "not an auditlog store"
        )
        assert str(db) in line
        assert file_digest(db) == before_file, command
        assert tree_digest(store) == before_tree, command
    with pytest.raises(NotAStoreError, match="foreign"):
        record_run(store)
    assert auditlog.current() is None
    assert tree_digest(store) == before_tree
    # the foreign data is intact
    conn = sqlite3.connect(db)
    assert conn.execute("select count(*) from invoices").fetchone() == (2,)
    conn.close()


@pytest.mark.parametrize(
    "maker, words",
    [
        (make_text, ("not an SQLite database",)),
        (make_empty, ("empty file",)),
        (make_garbage, ("corrupt",)),
        ("truncated", ("corrupt",)),
    ],
    ids=["text", "empty", "garbage-with-header", "truncated"],
)
def test_non_database_events_db_is_refused_untouched(
    store: Path,
    pristine: tuple[Path, str],
    maker: Callable[[Path], None] | str,
    words: tuple[str, ...],
) -> None:
    if maker == "truncated":
        make_truncated(store, pristine[0])
    else:
        assert callable(maker)
        maker(store)
    db = store / "events.db"
    before = file_digest(db)
    for command in ALL_COMMANDS:
        assert_one_line_error(cli(*command, store=store), 3, *words)
        assert file_digest(db) == before, command
    with pytest.raises(StoreError):
        record_run(store)
    assert file_digest(db) == before
    assert auditlog.current() is None


@pytest.mark.parametrize(
    "kind", ["foreign", "foreign-wal", "text", "garbage", "truncated-store", "newer-schema"]
)
def test_refusal_leaves_no_new_files(store: Path, pristine: tuple[Path, str], kind: str) -> None:
    """Refusing must not leave SQLite ``-wal``/``-shm`` files next to someone else's file."""
    if kind == "foreign":
        make_foreign(store)
    elif kind == "foreign-wal":
        make_foreign(store, wal=True)
    elif kind == "text":
        make_text(store)
    elif kind == "garbage":
        make_garbage(store)
    elif kind == "truncated-store":
        make_truncated(store, pristine[0])
    else:
        make_newer(store, pristine[0])
    before = tree_digest(store)
    for command in ALL_COMMANDS:
        result = cli(*command, store=store)
        assert result.exit_code == 3, (command, result.stderr)
        assert tree_digest(store) == before, (
            f"`{' '.join(command)}` left {sorted(os.listdir(store))}"
        )
    with pytest.raises(StoreError):
        record_run(store)
    assert tree_digest(store) == before, f"record() left {sorted(os.listdir(store))}"


def test_store_option_pointing_at_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("not a store\n")
    before = file_digest(target)
    for command in ALL_COMMANDS:
        assert_one_line_error(cli(*command, store=target), 3, "is a file")
        assert file_digest(target) == before
    with pytest.raises(NotAStoreError, match="is a file"):
        record_run(target)
    assert file_digest(target) == before and target.is_file()


def test_non_empty_directory_without_events_db_is_refused(store: Path) -> None:
    store.mkdir()
    (store / "data.csv").write_text("a,b\n1,2\n")
    (store / "sub").mkdir()
    (store / "sub" / "x.bin").write_bytes(b"\x00\x01")
    before = tree_digest(store)
    with pytest.raises(NotAStoreError, match="non-empty directory"):
        record_run(store)
    assert auditlog.current() is None
    assert tree_digest(store) == before
    assert sorted(p.name for p in store.iterdir()) == ["data.csv", "sub"]
    assert_one_line_error(cli("db", "upgrade", store=store), 3, "non-empty directory")
    assert tree_digest(store) == before


def test_empty_existing_directory_is_accepted(store: Path) -> None:
    store.mkdir()
    run_id = record_run(store)
    assert run_ids_listed(store) == [run_id]


# --------------------------------------------------------------------------- other schema revisions
def test_newer_schema_is_refused_by_every_command(store: Path, pristine: tuple[Path, str]) -> None:
    make_newer(store, pristine[0])
    db = store / "events.db"
    before = file_digest(db)
    for command in ALL_COMMANDS:
        line = assert_one_line_error(
            cli(*command, store=store), 3, "newer", "upgrade auditlog", "9999"
        )
        assert str(store) in line
        assert file_digest(db) == before, command
    with pytest.raises(SchemaTooNewError):
        record_run(store)
    with pytest.raises(SchemaTooNewError):
        upgrade_store(str(store))
    with pytest.raises(SchemaTooNewError):
        EventStore.open(str(store), allow_old=True)
    assert file_digest(db) == before
    checkpoint(db)  # fold in anything a refusal might have written to a WAL
    assert file_digest(db) == before


def test_older_schema_needs_db_upgrade_and_keeps_its_runs(store: Path, recorded: str) -> None:
    conn = sqlite3.connect(store / "events.db")
    conn.execute("drop table checkpoints")
    conn.execute("drop table snapshot_blobs")
    conn.execute("alter table events add column snapshot varchar(64)")  # dropped by 0005
    conn.execute("update alembic_version set version_num='0001'")
    conn.commit()
    conn.close()
    checkpoint(store / "events.db")
    before = file_digest(store / "events.db")

    line = assert_one_line_error(cli("runs", store=store), 3, "0001", "auditlog db upgrade")
    assert f"--store {store}" in line
    assert_one_line_error(cli("verify", store=store), 3, "auditlog db upgrade")
    assert file_digest(store / "events.db") == before

    result = cli("db", "current", store=store)
    assert result.exit_code == 0, result.stderr
    assert "revision 0001" in result.stdout and "db upgrade" in result.stdout

    result = cli("db", "upgrade", store=store)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"upgraded store from revision 0001 to {HEAD}"

    assert run_ids_listed(store) == [recorded]
    result = cli("verify", store=store)
    assert result.exit_code == 0, result.stderr
    assert "intact" in result.stdout
    conn = sqlite3.connect(store / "events.db")
    tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
    (revision,) = conn.execute("select version_num from alembic_version").fetchone()
    conn.close()
    assert {"checkpoints", "snapshot_blobs"} <= tables and revision == HEAD
    # and it can be recorded into again
    second = record_run(store)
    assert run_ids_listed(store) == [recorded, second]


# --------------------------------------------------------------------------- locating the store
def test_auditlog_store_environment_variable_is_honoured(
    store: Path, recorded: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AUDITLOG_STORE", str(store))

    result = invoke("runs", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert [r["run_id"] for r in json.loads(result.stdout)] == [recorded]
    assert invoke("verify").exit_code == 0
    # record() without store= writes there too, and the default ./.auditlog is never made
    second = record_run(None)
    assert run_ids_listed(store) == [recorded, second]
    assert not (tmp_path / ".auditlog").exists()
    # --store wins over the environment
    other = tmp_path / "other"
    assert_one_line_error(invoke("runs", "--store", str(other)), 3, "no auditlog store", str(other))


def test_default_store_is_dot_auditlog_in_cwd(tmp_path: Path) -> None:
    run_id = record_run(None)
    assert (tmp_path / ".auditlog" / "events.db").is_file()

    result = invoke("runs", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert [r["run_id"] for r in json.loads(result.stdout)] == [run_id]


def test_sqlite_url_to_an_existing_store(store: Path, recorded: str) -> None:
    url = f"sqlite:///{(store / 'events.db').absolute()}"
    assert url.startswith("sqlite:////")  # an absolute path: four slashes
    assert run_ids_listed(url) == [recorded]
    result = cli("verify", store=url)
    assert result.exit_code == 0, result.stderr
    assert "intact" in result.stdout
    result = cli("db", "current", store=url)
    assert result.exit_code == 0 and f"revision {HEAD} (current)" in result.stdout


def test_sqlite_url_store_is_created_and_recorded_into(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere" / "audit.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    assert_one_line_error(cli("runs", store=url), 3, "no auditlog store")
    assert not db.exists()
    result = cli("db", "upgrade", store=url)
    assert result.exit_code == 0 and f"created store at revision {HEAD}" in result.stdout
    run_id = record_run(url)
    assert run_ids_listed(url) == [run_id]
    assert cli("verify", run_id, store=url).exit_code == 0
