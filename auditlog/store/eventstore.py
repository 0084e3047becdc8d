"""The event store: open (validating first), append, and the questions readers ask.

The library exposes no update or delete of events: the record is append-only.
The only mutable row is ``runs.last_seen_ns``, a liveness heartbeat outside the
hash chain that tells a running process from a crashed one. Every driver error
that escapes is a ``StoreError`` naming the store and the cause (``guard``).

Reading questions are methods of ``EventQueries`` (``queries.py``), so that no
SQL is written anywhere else and each question is written once. A SQLite store
is read with the stdlib ``sqlite3`` module (``sqlread``); the SQLAlchemy engine,
which writes and reads other databases, is made (and SQLAlchemy imported) the
first time something needs it, and at once by a writer (``create=True``), so
that a recording never pays for the import in the middle of training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from auditlog.core.errors import (
    StoreError,
    StoreMissingError,
    StoreUnavailableError,
    UsageError,
    one_line,
)
from auditlog.store import revision as revisions
from auditlog.store.inserts import Inserts
from auditlog.store.location import StoreLocation, resolve_store
from auditlog.store.opening import check_revision, existing_revision, make_engine, read_only_query
from auditlog.store.queries import EventQueries
from auditlog.store.revision import SNAPSHOTS_META
from auditlog.store.sqlread import EngineReads, Reads, SqliteReads

if TYPE_CHECKING:
    from sqlalchemy import Engine


class EventStore(EventQueries):
    """An open, validated event store."""

    def __init__(
        self,
        location: StoreLocation,
        revision: str,
        read_only: str | None = None,
        synchronous: str = "NORMAL",
        engine: Engine | None = None,
    ) -> None:
        self.location = location
        self.revision = revision
        self.read_only = read_only  # URI parameters of a store on read-only media, else None
        self.synchronous = synchronous
        self._engine = engine
        self._engine_lock = threading.Lock()
        self._inserts: Inserts | None = None
        self.reads: Reads = self._sqlite_reads() if engine is None else EngineReads(engine)

    def _sqlite_reads(self) -> Reads:
        """``sqlite3`` on the store's file; other stores read through the engine."""
        database = self.location.database
        if database is None or not self.location.is_sqlite:
            return EngineReads(self.engine)
        if self.read_only is not None:
            return SqliteReads(f"file:{quote(str(database))}?{self.read_only}", uri=True)
        return SqliteReads(str(database))

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (writes; reads of non-SQLite stores), made on first use."""
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    self._engine = make_engine(self.location, self.synchronous, self.read_only)
        return self._engine

    # ------------------------------------------------------------------ open
    @classmethod
    def open(
        cls,
        store: str | StoreLocation | None = None,
        *,
        create: bool = False,
        allow_old: bool = False,
        synchronous: str = "NORMAL",
    ) -> EventStore:
        """Open a store; with ``create`` make a new one where nothing exists yet.

        Raises ``StoreError`` subclasses (never a driver exception) and leaves a
        refused location exactly as it was.
        """
        location = store if isinstance(store, StoreLocation) else resolve_store(store)
        shown = location.display()
        # Reading an archive on read-only media: SQLite must not try to create -shm.
        read_only = None if create else read_only_query(location, shown)
        revision = existing_revision(location, shown, create)
        shared = location.directory is None and location.database is None
        if revision is None:
            if shared and not location.snapshots_given:
                raise UsageError(
                    f"store {shown!r} is a database: name the directory for its tensor snapshots, "
                    "one every writer can reach (--snapshots PATH, AUDITLOG_SNAPSHOTS, or a store config file)"
                )
            from auditlog.store.migrate import create_store  # Alembic: only to create

            create_store(location)
            revision = revisions.HEAD_REVISION
        check_revision(revision, shown, allow_old=allow_old)
        opened = cls(location, revision, read_only, synchronous)
        if create:
            opened.engine  # noqa: B018  # a writer: SQLAlchemy now, not at its first append
        if shared and not location.snapshots_given:
            recorded = opened.meta().get(SNAPSHOTS_META)
            if recorded:
                opened.location = dataclasses.replace(
                    location, snapshots=Path(recorded), snapshots_given=True
                )
        return opened

    def sqlite_read_uri(self) -> str:
        """A ``file:`` URI that reads the SQLite file and can never write it."""
        assert self.location.database is not None
        return self.location.database.absolute().as_uri() + "?" + (self.read_only or "mode=ro")

    # ------------------------------------------------------------------ write
    def create_run(
        self,
        run_id: str,
        name: str | None,
        host: str,
        pid: int,
        proc_start: int | None,
    ) -> None:
        """Insert the run's index row (ranks of one run share it; first one wins)."""
        from sqlalchemy import select
        from sqlalchemy.exc import IntegrityError

        from auditlog.store import schema

        now = time.time_ns()
        try:
            with self.guard("registering a run"), self.engine.begin() as conn:
                exists = conn.execute(
                    select(schema.runs.c.run_id).where(schema.runs.c.run_id == run_id)
                ).first()
                if exists is None:
                    conn.execute(
                        schema.runs.insert().values(
                            run_id=run_id,
                            name=name,
                            started_ns=now,
                            host=host,
                            pid=pid,
                            proc_start=proc_start,
                            last_seen_ns=now,
                        )
                    )
        except StoreError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
            # Another rank of the same run inserted the row between our check and insert.

    def append(self, rows: Sequence[dict[str, Any]], run_id: str, heartbeat: bool = True) -> None:
        """Insert a batch of encoded events and refresh the run's heartbeat, atomically.

        The rows go to the driver's ``executemany`` as tuples (SQLAlchemy's Core
        insert added a large share per row to the writer: benchmarks/ingest.py,
        docs/performance.md), their NULLs left out of the statement (``inserts.py``).
        Driver errors propagate unconverted: the writer retries and reports them itself.
        """
        from auditlog.store import schema

        with self.engine.begin() as conn:
            self._insert(conn, rows)
            if not heartbeat:
                return
            conn.execute(
                schema.runs.update()
                .where(schema.runs.c.run_id == run_id)
                .values(last_seen_ns=time.time_ns())
            )

    def add_run_row(self, row: dict[str, Any]) -> bool:
        """Insert a runs index row as it is (``auditlog combine``); False when the run has one."""
        from sqlalchemy import select
        from sqlalchemy.exc import IntegrityError

        from auditlog.store import schema

        runs = schema.runs
        values = {c.name: row.get(c.name) for c in runs.columns}
        try:
            with self.guard("registering a run"), self.engine.begin() as conn:
                if conn.execute(
                    select(runs.c.run_id).where(runs.c.run_id == values["run_id"])
                ).first():
                    return False
                conn.execute(runs.insert().values(**values))
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                return False
            raise
        return True

    def add_events(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert already chained events in one transaction (``auditlog combine``)."""
        with self.guard("copying events"), self.engine.begin() as conn:
            self._insert(conn, rows)

    def _insert(self, conn: Any, rows: Sequence[dict[str, Any]]) -> None:
        """The rows, in order, through the statements of the engine's parameter style."""
        inserts = self._inserts
        if inserts is None:
            inserts = self._inserts = Inserts(self.engine.dialect.paramstyle)
        for statement, values in inserts.batches(rows):
            conn.exec_driver_sql(statement, values)

    def rename_run(self, run_id: str, name: str) -> None:
        """Name a run that has no name yet (a ``record(name=...)`` joining ``auditlog run``);
        the recorder also puts the name in the hash chain as an annotation."""
        from auditlog.store import schema

        runs = schema.runs
        with self.guard("naming a run"), self.engine.begin() as conn:
            conn.execute(
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.name.is_(None))
                .values(name=name)
            )

    def add_blobs(self, rows: Sequence[dict[str, Any]]) -> None:
        """Add catalog rows; a row another process added first is left as it is.

        One transaction for all of them (a transaction per row cost seconds for a
        wide model's initial values: docs/performance.md); should another writer add
        one of them meanwhile, row by row as before.
        """
        from sqlalchemy import select
        from sqlalchemy.exc import IntegrityError

        from auditlog.store import schema

        blobs = schema.snapshot_blobs
        now = time.time_ns()
        if not rows:
            return
        try:
            with self.engine.begin() as conn:
                hashes = [row["sha256"] for row in rows]
                present: set[str] = set()
                for start in range(0, len(hashes), 500):
                    chunk = hashes[start : start + 500]
                    present.update(
                        r[0]
                        for r in conn.execute(
                            select(blobs.c.sha256).where(blobs.c.sha256.in_(chunk))
                        )
                    )
                fresh: dict[str, dict[str, Any]] = {}
                for row in rows:
                    if row["sha256"] not in present:
                        fresh.setdefault(row["sha256"], {**row, "created_ns": now})
                if fresh:
                    conn.execute(blobs.insert(), list(fresh.values()))
            return
        except IntegrityError:
            pass  # inserted concurrently by another writer: fall back to row by row
        for row in rows:
            try:
                with self.engine.begin() as conn:
                    exists = conn.execute(
                        select(blobs.c.sha256).where(blobs.c.sha256 == row["sha256"])
                    ).first()
                    if exists is None:
                        conn.execute(blobs.insert().values(**row, created_ns=now))
            except IntegrityError:
                continue  # inserted concurrently by another writer: same content, same row

    def add_checkpoint(self, row: dict[str, Any]) -> int | None:
        """Insert a signed checkpoint row (append-only like events); returns its id."""
        from auditlog.store import schema

        with self.guard("storing a checkpoint"), self.engine.begin() as conn:
            result = conn.execute(schema.checkpoints.insert().values(**row))
            key = result.inserted_primary_key
        return None if key is None or key[0] is None else int(key[0])

    # ------------------------------------------------------------------ misc
    @contextlib.contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Convert driver errors into ``StoreError`` naming the store and the cause."""
        try:
            yield
        except Exception as exc:
            kind = _store_error(exc)
            if kind is None:
                raise
            raise kind(
                f"store {self.location.display()!r}: error while {doing}: {one_line(exc)}"
            ) from exc

    def close(self) -> None:
        """Release the store's connections (an open store holds a connection pool)."""
        self.reads.close()
        if self._engine is not None:
            self._engine.dispose()


def _store_error(exc: Exception) -> type[StoreError] | None:
    """The ``StoreError`` class a driver error becomes (None: not a driver error).

    ``OperationalError`` (a read-only file, disk full, an I/O error, a lock
    timeout) is ``StoreUnavailableError``, from ``sqlite3`` directly or wrapped by
    SQLAlchemy (looked up only when SQLAlchemy is loaded: reads never import it).
    """
    if isinstance(exc, sqlite3.Error):
        return StoreUnavailableError if isinstance(exc, sqlite3.OperationalError) else StoreError
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(exc, sa_exc.SQLAlchemyError):
        return StoreUnavailableError if isinstance(exc, sa_exc.OperationalError) else StoreError
    return None


def upgrade_store(store: str | StoreLocation | None) -> tuple[str | None, str]:
    """Bring a store to the head revision (creating it if nothing is there).

    Returns ``(revision before, revision after)``; ``before`` is None for a new store.
    A foreign, corrupt or newer store is refused untouched.
    """
    try:
        existing = EventStore.open(store, create=False, allow_old=True)
    except StoreMissingError:
        created = EventStore.open(store, create=True)
        created.close()
        return None, created.revision
    before = existing.revision
    existing.close()
    if before != revisions.HEAD_REVISION:
        from auditlog.store.migrate import migrate_to_head

        migrate_to_head(existing.location)
    return before, revisions.HEAD_REVISION
