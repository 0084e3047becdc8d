"""The event store: open (validating first), append, and read events and runs.

Opening is careful because the brief demands that a foreign, corrupt or newer
store is refused and left byte-for-byte untouched: a SQLite file is checked with
a read-only connection *before* SQLAlchemy (which would set pragmas) touches it.
Every driver error that escapes is converted here into a ``StoreError`` that names
the store and the cause.

The library exposes no update or delete of events: the record is append-only.
The only mutable row is ``runs.last_seen_ns``, a liveness heartbeat outside the
hash chain that tells a running process from a crashed one.
"""

from __future__ import annotations

import contextlib
import operator
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, func, inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from auditlog.errors import (
    NotAStoreError,
    SchemaTooNewError,
    SchemaTooOldError,
    StoreError,
    StoreMissingError,
    StoreUnavailableError,
)
from auditlog.store import schema
from auditlog.store.location import SNAPSHOTS_DIR, StoreLocation, resolve_store

SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 30_000


def _sqlite_revision(path: Path, shown: str) -> str:
    """Read the schema revision of an existing SQLite file without modifying it."""
    if not path.is_file():
        raise NotAStoreError(f"{shown!r} is not a regular file, not an auditlog store")
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
        size = path.stat().st_size
    except OSError as exc:
        raise StoreError(f"cannot read store {shown!r}: {exc.strerror or exc}") from exc
    if len(header) == 0:
        raise NotAStoreError(f"{shown!r} is an empty file, not an auditlog store")
    if header[: len(SQLITE_HEADER)] != SQLITE_HEADER:
        raise NotAStoreError(f"{shown!r} is not an auditlog store (not an SQLite database)")
    _check_not_truncated(path, header, size, shown)
    # A read-only connection to a WAL database creates -wal/-shm files beside it.
    # When none exist the file is self-contained, so read it as immutable (no
    # locks, no sidecar files): a refused store is left exactly as found. When
    # they exist, a normal read-only connection uses them and creates nothing.
    sidecars = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    immutable = not any(p.exists() for p in sidecars)
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            tables = {row[0] for row in conn.execute("select name from sqlite_master where type='table'")}
            if "auditlog_meta" not in tables or "alembic_version" not in tables:
                raise NotAStoreError(
                    f"{shown!r} is a foreign SQLite database, not an auditlog store (no auditlog tables)"
                )
            meta = dict(conn.execute("select key, value from auditlog_meta").fetchall())
            if meta.get("format") != schema.STORE_FORMAT:
                raise NotAStoreError(f"{shown!r} is not an auditlog store (format {meta.get('format')!r})")
            row = conn.execute("select version_num from alembic_version").fetchone()
        finally:
            conn.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise StoreError(f"store {shown!r} is corrupt or unreadable: {exc}") from exc
    if row is None:
        raise StoreError(f"store {shown!r} has no schema revision (alembic_version is empty)")
    return str(row[0])


def _check_not_truncated(path: Path, header: bytes, size: int, shown: str) -> None:
    """A cut-off file is refused up front: SQLite only notices when it reads the lost pages."""
    if len(header) < 100:
        raise StoreError(f"store {shown!r} is corrupt or unreadable: file is truncated ({size} bytes)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or size % page_size:
        raise StoreError(f"store {shown!r} is corrupt or unreadable: size {size} is not a whole number of pages")
    wal = path.with_name(path.name + "-wal")
    header_valid = header[24:28] == header[92:96]  # the in-header page count is current
    pages = int.from_bytes(header[28:32], "big")
    if header_valid and not wal.exists() and size < pages * page_size:
        raise StoreError(
            f"store {shown!r} is corrupt or unreadable: file is truncated ({size} of {pages * page_size} bytes)"
        )


def check_revision(revision: str, shown: str, allow_old: bool = False) -> None:
    """Refuse a store whose schema this version of auditlog cannot read or write."""
    if revision not in schema.KNOWN_REVISIONS:
        raise SchemaTooNewError(
            f"store {shown!r} has schema revision {revision!r}, newer than this auditlog knows "
            f"(head {schema.HEAD_REVISION}); upgrade auditlog to use it"
        )
    if revision != schema.HEAD_REVISION and not allow_old:
        raise SchemaTooOldError(
            f"store {shown!r} has schema revision {revision} (current is {schema.HEAD_REVISION}); "
            f"run `auditlog db upgrade --store {shown}` to bring it forward"
        )


def make_engine(location: StoreLocation, synchronous: str = "NORMAL") -> Engine:
    """A SQLAlchemy engine with the SQLite pragmas (the only dialect-specific SQL).

    WAL with ``synchronous=NORMAL`` survives a process crash (committed
    transactions are in the WAL) but may lose the last commits on power loss;
    ``FULL`` syncs the WAL on every commit.
    """
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(synchronous)
    engine = create_engine(location.url)
    if engine.dialect.name == "sqlite":

        def on_connect(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.close()

        event.listen(engine, "connect", on_connect)
    return engine


EVENT_COLUMNS = (
    "run_id", "stream", "seq", "ts_ns", "kind", "step", "module_id", "tensor_id", "snapshot", "payload", "hash",
)
_EVENT_VALUES = operator.itemgetter(*EVENT_COLUMNS)


def build_prefix(database: Path) -> str:
    """How the private copies ``create_store`` builds a new store under begin
    (``.events.db.<pid>.<random>.tmp`` and its ``-wal``/``-shm``): a directory
    holding only those is still empty to a second creator, who then races for the
    link instead of refusing the directory."""
    return f".{database.name}."


class EventStore:
    """An open, validated event store."""

    def __init__(self, location: StoreLocation, engine: Engine, revision: str) -> None:
        self.location = location
        self.engine = engine
        self.revision = revision

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
        revision = cls._existing_revision(location, shown, create)
        if revision is None:
            from auditlog.store.migrate import create_store

            create_store(location)
            revision = schema.HEAD_REVISION
        check_revision(revision, shown, allow_old=allow_old)
        return cls(location, make_engine(location, synchronous), revision)

    @staticmethod
    def _existing_revision(location: StoreLocation, shown: str, create: bool) -> str | None:
        """The revision of the store at ``location``, or None when a new one may be made."""
        if location.directory is not None:
            directory = location.directory
            if directory.exists() and not directory.is_dir():
                raise NotAStoreError(
                    f"{shown!r} is a file, not a store directory "
                    "(a store is a directory holding events.db, or a database URL)"
                )
            assert location.database is not None
            if location.database.exists() or location.database.is_symlink():
                return _sqlite_revision(location.database, str(location.database))
            if not create:
                raise StoreMissingError(f"no auditlog store at {shown!r} (record a run to create one)")
            if directory.exists():
                building = build_prefix(location.database)  # another creator's private copy
                others = [
                    p.name
                    for p in directory.iterdir()
                    if p.name != SNAPSHOTS_DIR and not p.name.startswith(building)
                ]
                if others:
                    raise NotAStoreError(
                        f"{shown!r} is a non-empty directory without events.db, not an auditlog "
                        "store; choose a new or empty directory"
                    )
            return None
        if location.database is not None:
            if location.database.exists():
                return _sqlite_revision(location.database, shown)
            if not create:
                raise StoreMissingError(f"no auditlog store at {shown!r}")
            return None
        return _url_revision(location, shown, create)

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
        now = time.time_ns()
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

    def append(self, rows: Sequence[dict[str, Any]], run_id: str, heartbeat: bool = True) -> None:
        """Insert a batch of encoded events and refresh the run's heartbeat, atomically.

        The rows go to the driver's ``executemany`` as tuples (SQLAlchemy's Core
        insert added ~40% per row to the writer, measured by benchmarks/ingest.py);
        the statement is built once for the dialect's parameter style.
        """
        with self.engine.begin() as conn:
            if rows:
                conn.exec_driver_sql(self._insert_sql(), [_EVENT_VALUES(r) for r in rows])
            if not heartbeat:
                return
            conn.execute(
                schema.runs.update()
                .where(schema.runs.c.run_id == run_id)
                .values(last_seen_ns=time.time_ns())
            )

    def _insert_sql(self) -> str:
        sql: str | None = getattr(self, "_insert_sql_text", None)
        if sql is None:
            style = self.engine.dialect.paramstyle  # positional styles only: rows are tuples
            count = len(EVENT_COLUMNS)
            if style == "qmark":
                marks = ["?"] * count
            elif style == "numeric":
                marks = [f":{i + 1}" for i in range(count)]
            else:  # format / pyformat (psycopg): %s is positional there
                marks = ["%s"] * count
            sql = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES ({', '.join(marks)})"
            self._insert_sql_text = sql
        return sql

    def has_blob(self, sha256: str) -> bool:
        """Is this tensor content in the snapshot catalog?"""
        blobs = schema.snapshot_blobs
        with self.guard("reading the snapshot catalog"), self.engine.connect() as conn:
            return conn.execute(select(blobs.c.sha256).where(blobs.c.sha256 == sha256)).first() is not None

    def add_blobs(self, rows: Sequence[dict[str, Any]]) -> None:
        """Add catalog rows; a row another process added first is left as it is."""
        blobs = schema.snapshot_blobs
        now = time.time_ns()
        for row in rows:
            try:
                with self.engine.begin() as conn:
                    exists = conn.execute(select(blobs.c.sha256).where(blobs.c.sha256 == row["sha256"])).first()
                    if exists is None:
                        conn.execute(blobs.insert().values(**row, created_ns=now))
            except IntegrityError:
                continue  # inserted concurrently by another writer: same content, same row

    def blob_rows(self, hashes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Catalog rows by hash (all of them when ``hashes`` is None)."""
        blobs = schema.snapshot_blobs
        query = select(blobs)
        if hashes is not None:
            query = query.where(blobs.c.sha256.in_(list(hashes)))
        with self.guard("reading the snapshot catalog"), self.engine.connect() as conn:
            return {r["sha256"]: dict(r) for r in conn.execute(query).mappings()}

    def chain_head(self, run_id: str, stream: int) -> tuple[int, str] | None:
        """The last ``(seq, hash)`` of a stream, used to append to an existing stream."""
        ev = schema.events
        with self.guard("reading the chain head"), self.engine.connect() as conn:
            row = conn.execute(
                select(ev.c.seq, ev.c.hash)
                .where(ev.c.run_id == run_id, ev.c.stream == stream)
                .order_by(ev.c.seq.desc())
                .limit(1)
            ).first()
        return None if row is None else (int(row[0]), str(row[1]))

    # ------------------------------------------------------------------ read
    def run_rows(self) -> list[dict[str, Any]]:
        """All rows of the runs index, oldest first."""
        with self.guard("listing runs"), self.engine.connect() as conn:
            rows = conn.execute(select(schema.runs).order_by(schema.runs.c.started_ns)).mappings()
            return [dict(r) for r in rows]

    def run_event_counts(self) -> dict[str, tuple[int, int | None]]:
        """``run_id -> (number of events, highest step)``."""
        ev = schema.events
        with self.guard("counting events"), self.engine.connect() as conn:
            rows = conn.execute(
                select(ev.c.run_id, func.count(), func.max(ev.c.step)).group_by(ev.c.run_id)
            )
            return {r[0]: (int(r[1]), r[2] if isinstance(r[2], int) else None) for r in rows}

    def events_of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every event of one kind across runs (run_started/run_ended summaries)."""
        ev = schema.events
        with self.guard(f"reading {kind} events"), self.engine.connect() as conn:
            rows = conn.execute(select(ev).where(ev.c.kind == kind).order_by(ev.c.id)).mappings()
            return [dict(r) for r in rows]

    def iter_events(
        self,
        run_id: str,
        *,
        kinds: Sequence[str] | None = None,
        stream: int | None = None,
        step_range: tuple[int | None, int | None] | None = None,
        batch: int = 5000,
    ) -> Iterator[dict[str, Any]]:
        """Events of a run in (stream, seq) order, streamed in batches."""
        ev = schema.events
        query = select(ev).where(ev.c.run_id == run_id)
        if kinds:
            query = query.where(ev.c.kind.in_(list(kinds)))
        if stream is not None:
            query = query.where(ev.c.stream == stream)
        if step_range is not None:
            low, high = step_range
            if low is not None:
                query = query.where(ev.c.step >= low)
            if high is not None:
                query = query.where(ev.c.step <= high)
        query = query.order_by(ev.c.stream, ev.c.seq)
        with self.guard("reading events"), self.engine.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=batch).execute(query)
            for row in result.mappings():
                yield dict(row)

    def ended_streams(self) -> set[tuple[str, int]]:
        """``(run_id, stream)`` pairs that have a ``run_ended`` event."""
        ev = schema.events
        with self.guard("reading run ends"), self.engine.connect() as conn:
            rows = conn.execute(select(ev.c.run_id, ev.c.stream).where(ev.c.kind == "run_ended"))
            return {(str(r[0]), int(r[1])) for r in rows}

    def max_step(self, run_id: str, stream: int) -> int | None:
        """The highest optimizer step recorded in a stream."""
        ev = schema.events
        with self.guard("reading steps"), self.engine.connect() as conn:
            value = conn.execute(
                select(func.max(ev.c.step)).where(ev.c.run_id == run_id, ev.c.stream == stream)
            ).scalar()
        return None if value is None else int(value)

    def streams(self, run_id: str) -> list[int]:
        """The stream numbers (ranks) a run has events in."""
        ev = schema.events
        with self.guard("listing streams"), self.engine.connect() as conn:
            rows = conn.execute(select(ev.c.stream).where(ev.c.run_id == run_id).distinct())
            return sorted(int(r[0]) for r in rows)

    def meta(self) -> dict[str, str]:
        with self.guard("reading store metadata"), self.engine.connect() as conn:
            return {r[0]: r[1] for r in conn.execute(select(schema.auditlog_meta))}

    # ------------------------------------------------------------------ misc
    @contextlib.contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Convert driver errors into ``StoreError`` naming the store and the cause."""
        try:
            yield
        except SQLAlchemyError as exc:
            cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            # OperationalError: read-only file, disk full, I/O error, lock timeout.
            kind = StoreUnavailableError if isinstance(exc, OperationalError) else StoreError
            raise kind(f"store {self.location.display()!r}: error while {doing}: {cause}") from exc

    def close(self) -> None:
        self.engine.dispose()


def _url_revision(location: StoreLocation, shown: str, create: bool) -> str | None:
    """Revision of a store behind a non-file URL (PostgreSQL); None if the database is empty."""
    engine = make_engine(location)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            if not tables:
                if not create:
                    raise StoreMissingError(f"no auditlog store at {shown!r} (the database is empty)")
                return None
            if "auditlog_meta" not in tables or "alembic_version" not in tables:
                raise NotAStoreError(f"{shown!r} holds a foreign database, not an auditlog store")
            row = conn.execute(text("select version_num from alembic_version")).first()
    except SQLAlchemyError as exc:
        cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise StoreError(f"cannot open store {shown!r}: {cause}") from exc
    finally:
        engine.dispose()
    if row is None:
        raise StoreError(f"store {shown!r} has no schema revision")
    return str(row[0])


def new_store_id() -> str:
    return uuid.uuid4().hex
