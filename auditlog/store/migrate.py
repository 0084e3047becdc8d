"""Create and upgrade stores through Alembic, driven programmatically.

The Alembic scripts ship inside the distribution (``auditlog.migrations``), so a
plain ``pip install`` can create and upgrade stores without the source tree.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
import time
import uuid
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import insert, inspect
from sqlalchemy.exc import SQLAlchemyError

from auditlog.core.errors import CorruptRecordError, StoreUnavailableError, one_line
from auditlog.core.version import __version__
from auditlog.store import schema
from auditlog.store.location import StoreLocation
from auditlog.store.opening import build_prefix, make_engine, new_store_id
from auditlog.store.schema import SNAPSHOTS_META

PG_CREATE_LOCK = 0x6175646974  # "audit": the advisory lock key of store creation and upgrades


def alembic_config() -> Config:
    """An Alembic config pointing at the shipped migration scripts."""
    migrations = importlib.import_module("auditlog.migrations")  # migrations/ in the source tree
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(str(migrations.__file__)).parent))
    return cfg


def alembic_head() -> str:
    """The head revision of the shipped scripts (tests compare it with schema.HEAD_REVISION)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


# Alembic's ``op`` and ``context`` are module-level proxies to the migration
# running now: two threads migrating at once (a process creating two stores, or a
# store and a test fixture) sent one thread's DDL to the other's connection while
# it was being closed, and SQLite crashed the interpreter (segfault, reproduced
# with 4 threads). Migrations in one process therefore run one at a time;
# processes race only on the final hard link (``create_store``).
_MIGRATION_LOCK = threading.Lock()


def _upgrade(location: StoreLocation, new: bool) -> None:
    with _MIGRATION_LOCK:
        _upgrade_locked(location, new)


def _upgrade_locked(location: StoreLocation, new: bool) -> None:
    engine = make_engine(location)
    try:
        with engine.begin() as conn:
            if new and engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            if engine.dialect.name == "sqlite":
                # sqlite3 runs DDL outside a transaction unless one is open: one explicit
                # transaction makes an upgrade all or nothing (a revision that refuses the
                # store, or fails half-way through copying a table, leaves it as it was).
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            if engine.dialect.name == "postgresql":
                # Ranks that find an empty database all try to create the store: the
                # first holds this lock while its DDL commits (PostgreSQL DDL is
                # transactional), the others then find the store and use it.
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_CREATE_LOCK})")
                if new and inspect(conn).has_table("alembic_version"):
                    return
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            if new:
                rows = [
                    {"key": "format", "value": schema.STORE_FORMAT},
                    {"key": "store_id", "value": new_store_id()},
                    {"key": "created_ns", "value": str(time.time_ns())},
                    {"key": "created_by", "value": f"auditlog {__version__}"},
                ]
                if location.directory is None and location.database is None:
                    # A database store remembers where its snapshots are (see location.py).
                    rows.append({"key": SNAPSHOTS_META, "value": str(location.snapshots)})
                conn.execute(insert(schema.auditlog_meta), rows)
    except SQLAlchemyError as exc:
        raise StoreUnavailableError(
            f"cannot write store {location.display()!r}: {one_line(exc)}"
        ) from exc
    except CorruptRecordError as exc:  # a revision refused what the store holds (0005)
        raise CorruptRecordError(f"cannot upgrade store {location.display()!r}: {exc}") from None
    finally:
        engine.dispose()


def create_store(location: StoreLocation) -> None:
    """Make a new, empty store at the current schema revision.

    A SQLite store is built under a private temporary name and then hard-linked
    into place: several processes (DDP ranks, parallel jobs) that find no store
    race only on the link, the losers discard their copy and use the winner's, and
    nobody ever opens a half-created file.
    """
    if location.directory is not None:
        try:
            location.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot create store directory {str(location.directory)!r}: {exc.strerror or exc}"
            ) from exc
    if location.database is None:
        _upgrade(location, new=True)
        return
    target = location.database
    tmp = target.with_name(f"{build_prefix(target)}{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        _upgrade(dataclasses.replace(location, url=f"sqlite:///{tmp}", database=tmp), new=True)
        try:
            os.link(tmp, target)
        except FileExistsError:
            pass  # another process created the store first: use theirs
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot create store {str(target)!r}: {exc.strerror or exc}"
            ) from exc
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            leftover.unlink(missing_ok=True)


def migrate_to_head(location: StoreLocation) -> None:
    """Upgrade an existing store to the head revision (the caller checked it is ours)."""
    _upgrade(location, new=False)
