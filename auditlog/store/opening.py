"""Opening a store safely: find its schema revision without touching it, and make engines.

The brief demands that a foreign, corrupt or newer store is refused and left
byte-for-byte untouched, so a SQLite file is checked with a read-only (when
possible immutable) ``sqlite3`` connection *before* SQLAlchemy, which would set
pragmas, ever touches it; SQLAlchemy itself is imported only to make an engine
(a writer, or a store behind a URL). Every driver error that escapes is a ``StoreError``
naming the store and the cause.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from auditlog.core.errors import (
    NotAStoreError,
    SchemaTooNewError,
    SchemaTooOldError,
    StoreError,
    StoreMissingError,
    one_line,
)
from auditlog.store import revision as revisions
from auditlog.store.location import SHARDS_DIR, SNAPSHOTS_DIR, StoreLocation

if TYPE_CHECKING:
    from sqlalchemy import Engine

SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 30_000


def sqlite_revision(path: Path, shown: str) -> str:
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
    params = _read_only_params(path, shown)  # a read-only directory: what SQLite can do there
    uri = f"file:{quote(str(path))}?" + (
        params or ("mode=ro&immutable=1" if immutable else "mode=ro")
    )
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            tables = {
                row[0] for row in conn.execute("select name from sqlite_master where type='table'")
            }
            if "auditlog_meta" not in tables or "alembic_version" not in tables:
                raise NotAStoreError(
                    f"{shown!r} is a foreign SQLite database, not an auditlog store (no auditlog tables)"
                )
            meta = dict(conn.execute("select key, value from auditlog_meta").fetchall())
            if meta.get("format") != revisions.STORE_FORMAT:
                raise NotAStoreError(
                    f"{shown!r} is not an auditlog store (format {meta.get('format')!r})"
                )
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
        raise StoreError(
            f"store {shown!r} is corrupt or unreadable: file is truncated ({size} bytes)"
        )
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or size % page_size:
        raise StoreError(
            f"store {shown!r} is corrupt or unreadable: size {size} is not a whole number of pages"
        )
    wal = path.with_name(path.name + "-wal")
    header_valid = header[24:28] == header[92:96]  # the in-header page count is current
    pages = int.from_bytes(header[28:32], "big")
    if header_valid and not wal.exists() and size < pages * page_size:
        raise StoreError(
            f"store {shown!r} is corrupt or unreadable: file is truncated ({size} of {pages * page_size} bytes)"
        )


def read_only_query(location: StoreLocation, shown: str) -> str | None:
    """How to read a SQLite store whose directory cannot be written (an archive on
    read-only media), as URI parameters; None when it is writable.

    A WAL database normally needs to create ``-shm`` beside it, even to read.
    Without a ``-wal`` file (or with an empty one) the database file holds
    everything, so it is opened ``immutable`` (no locks, no sidecar files); with
    both ``-wal`` and ``-shm``, SQLite reads them read-only. A ``-wal`` without
    ``-shm`` cannot be read in place: refused, with what to do.
    """
    database = location.database
    if database is None or not location.is_sqlite:
        return None
    return _read_only_params(database, shown)


def _read_only_params(database: Path, shown: str) -> str | None:
    if os.access(database.parent, os.W_OK):
        return None
    wal, shm = (database.with_name(database.name + suffix) for suffix in ("-wal", "-shm"))
    if not wal.exists() or wal.stat().st_size == 0:
        return "mode=ro&immutable=1"
    if shm.exists():
        return "mode=ro"
    raise StoreError(
        f"store {shown!r} is read-only and its newest events are in {wal.name} without {shm.name}; "
        "SQLite cannot read them in place: copy the store to a writable directory"
    )


def check_revision(revision: str, shown: str, allow_old: bool = False) -> None:
    """Refuse a store whose schema this version of auditlog cannot read or write."""
    if revision not in revisions.KNOWN_REVISIONS:
        raise SchemaTooNewError(
            f"store {shown!r} has schema revision {revision!r}, newer than this auditlog knows "
            f"(head {revisions.HEAD_REVISION}); upgrade auditlog to use it"
        )
    if revision != revisions.HEAD_REVISION and not allow_old:
        raise SchemaTooOldError(
            f"store {shown!r} has schema revision {revision} (current is {revisions.HEAD_REVISION}); "
            f"run `auditlog db upgrade --store {shown}` to bring it forward"
        )


def make_engine(
    location: StoreLocation, synchronous: str = "NORMAL", read_only: str | None = None
) -> Engine:
    """A SQLAlchemy engine with the SQLite pragmas (the only dialect-specific SQL).

    WAL with ``synchronous=NORMAL`` survives a process crash (committed
    transactions are in the WAL) but may lose the last commits on power loss;
    ``FULL`` syncs the WAL on every commit. ``read_only``: URI parameters from
    ``read_only_query`` for a store that cannot be written.
    """
    from sqlalchemy import create_engine, event
    from sqlalchemy.exc import SQLAlchemyError

    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(synchronous)
    url = location.url
    if read_only is not None and location.database is not None:
        url = f"sqlite:///file:{quote(str(location.database))}?{read_only}&uri=true"
    try:
        engine = create_engine(url)
    except ImportError as exc:  # the dialect's driver (psycopg) is an optional extra
        raise StoreError(missing_driver(location, exc)) from exc
    except (SQLAlchemyError, ValueError) as exc:  # a malformed URL, an unknown dialect
        raise StoreError(f"cannot open store {location.display()!r}: {one_line(exc)}") from exc
    if engine.dialect.name == "sqlite":

        def on_connect(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.close()

        event.listen(engine, "connect", on_connect)
    return engine


# Drivers that are optional extras of auditlog, by the module a URL's dialect imports.
EXTRAS = {"psycopg": "postgres", "psycopg2": "postgres", "adbc_driver_postgresql": "postgres"}


def missing_driver(location: StoreLocation, exc: ImportError) -> str:
    """The one-line message for a URL whose database driver is not installed."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is not None:
        return (
            f"store {location.display()!r} needs the {module} driver: "
            f"pip install 'auditlog[{extra}]'"
        )
    return f"store {location.display()!r} needs a database driver that is not installed ({exc})"


def build_prefix(database: Path) -> str:
    """How the private copies ``create_store`` builds a new store under begin
    (``.events.db.<pid>.<random>.tmp`` and its ``-wal``/``-shm``): a directory
    holding only those is still empty to a second creator, who then races for the
    link instead of refusing the directory."""
    return f".{database.name}."


def existing_revision(location: StoreLocation, shown: str, create: bool) -> str | None:
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
            return sqlite_revision(location.database, str(location.database))
        if not create:
            raise StoreMissingError(f"no auditlog store at {shown!r} (record a run to create one)")
        if directory.exists():
            building = build_prefix(location.database)  # another creator's private copy
            others = [
                p.name
                for p in directory.iterdir()
                if p.name not in (SNAPSHOTS_DIR, SHARDS_DIR) and not p.name.startswith(building)
            ]
            if others:
                raise NotAStoreError(
                    f"{shown!r} is a non-empty directory without events.db, not an auditlog "
                    "store; choose a new or empty directory"
                )
        return None
    if location.database is not None:
        if location.database.exists():
            return sqlite_revision(location.database, shown)
        if not create:
            raise StoreMissingError(f"no auditlog store at {shown!r}")
        return None
    return url_revision(location, shown, create)


def url_revision(location: StoreLocation, shown: str, create: bool) -> str | None:
    """Revision of a store behind a non-file URL (PostgreSQL); None if the database is empty."""
    from sqlalchemy import inspect, text
    from sqlalchemy.exc import SQLAlchemyError

    engine = make_engine(location)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            if not tables:
                if not create:
                    raise StoreMissingError(
                        f"no auditlog store at {shown!r} (the database is empty)"
                    )
                return None
            if "auditlog_meta" not in tables or "alembic_version" not in tables:
                raise NotAStoreError(f"{shown!r} holds a foreign database, not an auditlog store")
            row = conn.execute(text("select version_num from alembic_version")).first()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot open store {shown!r}: {one_line(exc)}") from exc
    finally:
        engine.dispose()
    if row is None:
        raise StoreError(f"store {shown!r} has no schema revision")
    return str(row[0])


def new_store_id() -> str:
    """A new store's identity (``auditlog_meta.store_id``; signed statements name it)."""
    return uuid.uuid4().hex
