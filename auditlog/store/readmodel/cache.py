"""The read model: a DuckDB projection of the event store, refreshed incrementally.

This is the read side of the CQRS split (DESIGN.md, layer 3). The event store is
the record; the projection is a disposable cache shaped for questions:

- **Where it lives.** ``<store dir>/readmodel.duckdb``; for a ``sqlite:///`` URL,
  beside the database file (``<name>.readmodel.duckdb``, or ``readmodel.duckdb``
  when the file is a store directory's ``events.db``); for any other URL,
  or when the store's directory is not writable (an archived record), in
  ``$XDG_CACHE_HOME/auditlog/readmodel/<store id>.duckdb``. ``AUDITLOG_READMODEL``
  overrides all of these. It is never part of the integrity record: ``verify``
  does not read it and nothing in it is trusted.
- **When it is rebuilt.** When it is missing, unreadable or corrupt, of another
  ``tables.FORMAT``, made from another store (store id), or when the store
  no longer holds the last event it copied with the hash it copied (the store
  was replaced or rewound). Rebuilding is just a refresh from id 0.
- **How it is refreshed.** Events are append-only with a monotonic ``id``, so a
  refresh copies ``id > last copied`` (see ``auditlog.store.readmodel.arrowcopy``) in chunks;
  each chunk is one DuckDB transaction that stages the new rows, derives the
  flattened tables from them (``auditlog.store.readmodel.tables``), replays construction of
  the streams the chunk touched to name modules and tensors, and moves the mark.
  An interrupted refresh therefore leaves a consistent projection that the next
  refresh continues.
- **Concurrency.** DuckDB allows one writing process or many reading ones per
  file. A lock file beside the projection (``flock``) makes a refresh wait for
  readers and readers wait for a refresh, instead of failing on DuckDB's lock.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import filelock
import pyarrow as pa
import pyarrow.compute as pc

from auditlog.core.errors import StoreError, one_line
from auditlog.store.eventstore import EventStore
from auditlog.store.location import EVENTS_FILE
from auditlog.store.readmodel import arrowcopy, tables
from auditlog.store.readmodel.names import replay_names

PROJECTION_FILE = "readmodel.duckdb"
CHUNK_ROWS = 1_000_000
LOCK_TIMEOUT_S = 600.0

Progress = Callable[[int, int], None]
"""``progress(done, total)``: events copied so far out of those to copy."""

# DuckDB must never fetch anything: no extension installs or auto-loads (the
# wheel bundles json and parquet, which is all the projection uses).
DUCKDB_CONFIG: dict[str, Any] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


def connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to the projection, configured the one way auditlog uses it.

    DuckDB's own progress bar is switched off (a per-connection setting): it
    would print into pipes; auditlog draws its own, on terminals only.
    """
    con = duckdb.connect(str(path), read_only=read_only, config=DUCKDB_CONFIG)
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:
        con.close()
        raise
    return con


@dataclass
class RefreshReport:
    """What one refresh did."""

    path: Path
    copied: int
    rebuilt: bool
    reason: str | None
    streams_replayed: int
    last_id: int
    seconds: float
    method: str

    @property
    def rate(self) -> float:
        """Events copied per second."""
        return self.copied / self.seconds if self.seconds > 0 else 0.0


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "auditlog" / "readmodel"


def default_path(store: EventStore) -> Path:
    """Where the projection of ``store`` lives (see the module docstring)."""
    override = os.environ.get("AUDITLOG_READMODEL")
    if override:
        return Path(override).expanduser().absolute()
    location = store.location
    candidate: Path | None = None
    if location.directory is not None:
        candidate = location.directory / PROJECTION_FILE
    elif location.database is not None:
        # sqlite:////dir/events.db is the same store as the directory form: share its projection.
        name = PROJECTION_FILE if location.database.name == EVENTS_FILE else location.database.name + "." + PROJECTION_FILE
        candidate = location.database.with_name(name)
    if candidate is not None and os.access(candidate.parent, os.W_OK):
        return candidate
    store_id = store.meta().get("store_id") or "unknown"
    return _cache_dir() / f"{store_id}.duckdb"


class ReadModel:
    """The projection of one event store."""

    def __init__(self, store: EventStore, path: Path | None = None) -> None:
        self.store = store
        self.path = path if path is not None else default_path(store)
        self._store_id: str | None = None

    # ------------------------------------------------------------------ paths
    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @property
    def store_id(self) -> str:
        if self._store_id is None:
            self._store_id = self.store.meta().get("store_id", "")
        return self._store_id

    # ------------------------------------------------------------------ locking
    @contextlib.contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        """Hold the projection's lock: shared for reading, exclusive for refreshing.

        ``filelock.ReadWriteLock`` (a small SQLite file beside the projection)
        lets many readers in at once and a refresh alone, across processes.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            rw = filelock.ReadWriteLock(self.lock_path, timeout=LOCK_TIMEOUT_S, is_singleton=False)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot use read model {str(self.path)!r}: {exc}") from exc
        try:
            held = rw.write_lock() if exclusive else rw.read_lock()
            with held:
                yield
        except filelock.Timeout:
            raise StoreError(
                f"read model {str(self.path)!r} is busy (another auditlog process is "
                f"refreshing or reading it for more than {LOCK_TIMEOUT_S:.0f}s)"
            ) from None
        finally:
            rw.close()

    # ------------------------------------------------------------------ state
    def _read_meta(self, con: duckdb.DuckDBPyConnection) -> dict[str, str] | None:
        try:
            rows = con.execute(f"SELECT key, value FROM {tables.SCHEMA}.meta").fetchall()
        except duckdb.Error:
            return None
        return {str(k): str(v) for k, v in rows}

    def _stale_reason(self, meta: dict[str, str] | None) -> str | None:
        """Why the projection cannot be continued (None: it can)."""
        if meta is None:
            return "no projection yet"
        if meta.get("format") != tables.FORMAT:
            return f"projection format {meta.get('format')!r}, current is {tables.FORMAT!r}"
        if meta.get("store_id") != self.store_id:
            return "projection was made from another store"
        last_id = int(meta.get("last_id", "0"))
        if last_id and arrowcopy.event_hash(self.store, last_id) != meta.get("last_hash"):
            return "the store no longer holds the last event copied"
        return None

    def is_fresh(self) -> bool:
        """Whether the projection exists, is usable and holds every event of the store."""
        if not self.path.exists():
            return False
        with self.lock(exclusive=False):
            try:
                con = connect(self.path, read_only=True)
            except duckdb.Error:
                return False
            try:
                meta = self._read_meta(con)
                catalogued = _catalog_count(con)
            finally:
                con.close()
        if self._stale_reason(meta) is not None:
            return False
        assert meta is not None
        if int(meta["last_id"]) < arrowcopy.max_event_id(self.store):
            return False
        # A refresh interrupted between the events and the catalog copy leaves
        # the catalog behind; the counts tell (the catalog only grows).
        return catalogued == arrowcopy.catalog_count(self.store)

    # ------------------------------------------------------------------ refresh
    def refresh(self, progress: Progress | None = None) -> RefreshReport:
        """Bring the projection up to date with the store; rebuild it when it cannot be continued."""
        start = time.perf_counter()
        with self.lock(exclusive=True):
            con, rebuilt, reason = self._open_for_refresh()
            try:
                return self._refresh(con, rebuilt, reason, start, progress)
            finally:
                con.close()

    def _open_for_refresh(self) -> tuple[duckdb.DuckDBPyConnection, bool, str | None]:
        reason: str | None = None
        con: duckdb.DuckDBPyConnection | None = None
        if self.path.exists():
            try:
                con = connect(self.path, read_only=False)
            except duckdb.Error as exc:
                reason = f"projection unreadable ({one_line(exc)})"
            else:
                reason = self._stale_reason(self._read_meta(con))
                if reason is None:
                    return con, False, None
                con.close()
        else:
            reason = "no projection yet"
        self._remove_files()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = connect(self.path, read_only=False)
            for ddl in tables.TABLES:
                con.execute(ddl)
            self._write_meta(con, {"format": tables.FORMAT, "store_id": self.store_id, "last_id": "0",
                                   "last_hash": "", "created_ns": str(time.time_ns())})
        except duckdb.Error as exc:
            raise StoreError(f"cannot create read model {str(self.path)!r}: {one_line(exc)}") from exc
        return con, True, reason

    def _remove_files(self) -> None:
        """Delete a stale projection, but never a file that is not one of ours."""
        if self.path.exists() and not _is_projection_file(self.path):
            raise StoreError(
                f"{str(self.path)!r} exists and is not an auditlog read model (not a DuckDB file); "
                "refusing to overwrite it (set AUDITLOG_READMODEL to another path)"
            )
        for suffix in ("", ".wal"):
            target = self.path.with_name(self.path.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                target.unlink()

    @staticmethod
    def _write_meta(con: duckdb.DuckDBPyConnection, values: dict[str, str]) -> None:
        con.executemany(
            f"INSERT OR REPLACE INTO {tables.SCHEMA}.meta VALUES (?, ?)", list(values.items())
        )

    def _refresh(
        self,
        con: duckdb.DuckDBPyConnection,
        rebuilt: bool,
        reason: str | None,
        start: float,
        progress: Progress | None,
    ) -> RefreshReport:
        meta = self._read_meta(con) or {}
        last_id = int(meta.get("last_id", "0"))
        upto = arrowcopy.max_event_id(self.store)
        lower = arrowcopy.copy_lower_bound(self.store, last_id)
        total = max(0, upto - last_id)
        method = arrowcopy.copy_method(self.store)
        copied = 0
        streams_replayed = 0
        if progress is not None:
            progress(0, total)
        if upto > lower:
            pending: list[pa.RecordBatch] = []
            pending_rows = 0
            for batch in arrowcopy.event_batches(self.store, lower, upto):
                offset = 0
                while offset < batch.num_rows:
                    piece = batch.slice(offset, CHUNK_ROWS - pending_rows)
                    offset += piece.num_rows
                    pending.append(piece)
                    pending_rows += piece.num_rows
                    if pending_rows >= CHUNK_ROWS:
                        added, replayed = self._apply_chunk(con, pending, lower)
                        copied, streams_replayed = copied + added, streams_replayed + replayed
                        pending, pending_rows = [], 0
                        if progress is not None:
                            progress(copied, total)
            if pending:
                added, replayed = self._apply_chunk(con, pending, lower)
                copied, streams_replayed = copied + added, streams_replayed + replayed
        self._copy_catalog(con)
        if progress is not None:
            progress(total, total)
        final = self._read_meta(con) or {}
        return RefreshReport(
            path=self.path,
            copied=copied,
            rebuilt=rebuilt,
            reason=reason,
            streams_replayed=streams_replayed,
            last_id=int(final.get("last_id", "0")),
            seconds=time.perf_counter() - start,
            method=method,
        )

    def _apply_chunk(
        self, con: duckdb.DuckDBPyConnection, batches: list[pa.RecordBatch], lower: int
    ) -> tuple[int, int]:
        """Derive, store and name one chunk of events in one transaction; returns (rows, streams).

        The chunk is handed to DuckDB as the Arrow table ``new_events`` (no
        staging copy); every derivation scans it.
        """
        table = pa.Table.from_batches(batches, schema=arrowcopy.EVENT_SCHEMA)
        try:
            con.begin()
            table = self._drop_known(con, table, lower)
            if table.num_rows == 0:
                con.rollback()
                return 0, 0
            con.register("new_events", table)
            try:
                # Names first: the derivations copy them into every row.
                touched = con.execute(tables.CONSTRUCTION_TOUCHED).fetchall()
                if touched:
                    replay_names(con, [(str(r), int(s)) for r, s in touched])
                for sql in tables.DERIVATIONS:
                    con.execute(sql)
            finally:
                con.unregister("new_events")
            mark = con.execute(
                f"SELECT id, hash FROM {tables.SCHEMA}.events ORDER BY id DESC LIMIT 1"
            ).fetchone()
            assert mark is not None
            self._write_meta(
                con, {"last_id": str(mark[0]), "last_hash": str(mark[1]), "refreshed_ns": str(time.time_ns())}
            )
            con.commit()
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise StoreError(f"cannot refresh read model {str(self.path)!r}: {one_line(exc)}") from exc
        return table.num_rows, len(touched)

    def _copy_catalog(self, con: duckdb.DuckDBPyConnection) -> None:
        """Copy the snapshot catalog rows the projection lacks (by content hash).

        Runs after the events: the recorder commits catalog rows before the
        events naming them, so every snapshot row copied so far finds its
        catalog row. Rows are immutable (a hash names one content), so a row
        once copied never needs re-reading.
        """
        known = {str(r[0]) for r in con.execute(f"SELECT sha256 FROM {tables.SCHEMA}.snapshot_catalog").fetchall()}
        missing = sorted(arrowcopy.catalog_hashes(self.store) - known)
        if not missing:
            return
        try:
            con.begin()
            for batch in arrowcopy.catalog_batches(self.store, missing):
                con.register("new_blobs", pa.Table.from_batches([batch]))
                try:
                    con.execute(tables.COPY_CATALOG)
                finally:
                    con.unregister("new_blobs")
            con.commit()
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise StoreError(f"cannot refresh read model {str(self.path)!r}: {one_line(exc)}") from exc

    @staticmethod
    def _drop_known(con: duckdb.DuckDBPyConnection, table: pa.Table, lower: int) -> pa.Table:
        """Rows of a re-read window (non-SQLite stores) that the projection already has."""
        known = con.execute(
            f"SELECT id FROM {tables.SCHEMA}.events WHERE id > ? AND id <= ?",
            [lower, int(pc.max(table.column("id")).as_py() or 0)],
        ).fetchall()
        if not known:
            return table
        mask = pc.invert(pc.is_in(table.column("id"), value_set=pa.array([r[0] for r in known], pa.int64())))
        return table.filter(mask)

def _catalog_count(con: duckdb.DuckDBPyConnection) -> int:
    """Catalog rows in the projection (-1 when the table is not there)."""
    try:
        row = con.execute(f"SELECT count(*) FROM {tables.SCHEMA}.snapshot_catalog").fetchone()
    except duckdb.Error:
        return -1
    return int(row[0]) if row is not None else -1


def _is_projection_file(path: Path) -> bool:
    """A DuckDB file (magic at offset 8), an empty file, or a file named like ours."""
    if not path.is_file():
        return False
    if path.name.endswith(".duckdb"):
        return True
    try:
        with path.open("rb") as handle:
            head = handle.read(12)
    except OSError:
        return False
    return len(head) == 0 or head[8:12] == b"DUCK"
