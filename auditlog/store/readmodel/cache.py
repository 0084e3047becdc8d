"""The read model: a DuckDB projection of the event store, refreshed incrementally.

This is the read side of the CQRS split (docs/how-it-works.md, the store layer). The
event store is the record; the projection is a disposable cache shaped for questions:

- **Where it lives.** ``<store dir>/readmodel.duckdb``; for a ``sqlite:///`` URL,
  beside the database file (``<name>.readmodel.duckdb``, or ``readmodel.duckdb``
  when the file is a store directory's ``events.db``); for any other URL,
  or when the store's directory is not writable (an archived record), in
  ``$XDG_CACHE_HOME/auditlog/readmodel/<store id>.duckdb``. ``AUDITLOG_READMODEL``
  overrides all of these. It is never part of the integrity record: ``verify``
  does not read it, and it is not evidence (``verify`` is).
- **When it is rebuilt.** When it is missing, unreadable or corrupt, of another
  ``tables.FORMAT``, made from another store (store id), when its seal does not
  hold (``trust``: the file was edited outside auditlog, or the store no longer
  holds a chain head it was built from: rewritten or cut off), when the store
  no longer holds the last event it copied with the hash it copied (the store
  was replaced or rewound), or when asked (``query --rebuild``). Rebuilding is
  just a refresh from id 0.
- **How it is refreshed.** Events are append-only with a monotonic ``id``, so a
  refresh copies ``id > last copied`` (see ``auditlog.store.readmodel.arrowcopy``) in chunks;
  each chunk is one DuckDB transaction that checks every new row against the
  chain (``auditlog.store.readmodel.links``: a row whose recomputed link hash is
  not its stored hash is refused, naming the event), stages the new rows, derives the
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
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import filelock

from auditlog.core.errors import CorruptRecordError, IntegrityError, StoreError, one_line
from auditlog.core.naming import attached_ids, label_state
from auditlog.core.replay import CONSTRUCTION_KINDS, ModelState, apply
from auditlog.store.eventstore import EventStore
from auditlog.store.readmodel import tables
from auditlog.store.readmodel.projection import (
    DUCKDB_CONFIG as DUCKDB_CONFIG,
)
from auditlog.store.readmodel.projection import (
    PROJECTION_FILE as PROJECTION_FILE,
)
from auditlog.store.readmodel.projection import connect as connect
from auditlog.store.readmodel.projection import default_path, is_projection_file
from auditlog.store.readmodel.trust import check_blobs, seal_path, seal_problem, write_seal

if TYPE_CHECKING:  # the refresh imports pyarrow; a session on a fresh projection does not
    import pyarrow as pa

    from auditlog.store.readmodel.links import Heads

CHUNK_ROWS = 1_000_000
LOCK_TIMEOUT_S = 600.0

NO_PROJECTION = "no projection yet"
REBUILD_REQUESTED = "rebuild requested"

Progress = Callable[[int, int], None]
"""``progress(done, total)``: events copied so far out of those to copy."""


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
    link_seconds: float = 0.0  # of ``seconds``, spent recomputing the copied rows' chain links

    @property
    def rate(self) -> float:
        """Events copied per second."""
        return self.copied / self.seconds if self.seconds > 0 else 0.0

    @property
    def notice(self) -> str | None:
        """The line to tell the user when the read model was rebuilt for a reason they did
        not choose (its seal no longer held, the store changed under it); None otherwise."""
        if not self.rebuilt or self.reason in (None, NO_PROJECTION, REBUILD_REQUESTED):
            return None
        return f"auditlog: read model rebuilt from the store: {self.reason}"


class ReadModel:
    """The projection of one event store."""

    def __init__(self, store: EventStore, path: Path | None = None) -> None:
        self.store = store
        self.path = path if path is not None else default_path(store)
        self._store_id: str | None = None
        self._link_seconds = 0.0

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
            return NO_PROJECTION
        if meta.get("format") != tables.FORMAT:
            return f"projection format {meta.get('format')!r}, current is {tables.FORMAT!r}"
        if meta.get("store_id") != self.store_id:
            return "projection was made from another store"
        last_id = int(meta.get("last_id", "0"))
        if last_id and self.store.event_hash(last_id) != meta.get("last_hash"):
            return "the store no longer holds the last event copied"
        return seal_problem(self.path, self.store, self.store_id)

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
                unchecked = _unchecked_blobs(con)
            finally:
                con.close()
        if self._stale_reason(meta) is not None:
            return False
        assert meta is not None
        if int(meta["last_id"]) < self.store.max_event_id():
            return False
        # A refresh interrupted between the events and the file checks leaves
        # snapshot hashes neither verified nor rejected.
        return unchecked == 0

    # ------------------------------------------------------------------ refresh
    def refresh(self, progress: Progress | None = None, *, rebuild: bool = False) -> RefreshReport:
        """Bring the projection up to date with the store; rebuild it when it cannot be
        continued (or when ``rebuild``), and seal what it was built from."""
        start = time.perf_counter()
        with self.lock(exclusive=True):
            con, rebuilt, reason = self._open_for_refresh(rebuild)
            try:
                report = self._refresh(con, rebuilt, reason, start, progress)
                heads = [
                    [str(r), int(s), int(q), str(h)]
                    for r, s, q, h in con.execute(tables.STREAM_HEADS).fetchall()
                ]
            finally:
                con.close()
            # Sealed after the connection closed: DuckDB writes its checkpoint on close.
            write_seal(self.path, self.store_id, heads)
            return report

    def _open_for_refresh(
        self, rebuild: bool = False
    ) -> tuple[duckdb.DuckDBPyConnection, bool, str | None]:
        reason: str | None = None
        con: duckdb.DuckDBPyConnection | None = None
        if rebuild:
            reason = REBUILD_REQUESTED
        elif self.path.exists():
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
            reason = NO_PROJECTION
        self._remove_files()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = connect(self.path, read_only=False)
            for ddl in tables.TABLES:
                con.execute(ddl)
            self._write_meta(
                con,
                {
                    "format": tables.FORMAT,
                    "store_id": self.store_id,
                    "last_id": "0",
                    "last_hash": "",
                    "created_ns": str(time.time_ns()),
                },
            )
        except duckdb.Error as exc:
            raise StoreError(
                f"cannot create read model {str(self.path)!r}: {one_line(exc)}"
            ) from exc
        return con, True, reason

    def _remove_files(self) -> None:
        """Delete a stale projection, but never a file that is not one of ours."""
        if self.path.exists() and not is_projection_file(self.path):
            raise StoreError(
                f"{str(self.path)!r} exists and is not an auditlog read model (not a DuckDB file); "
                "refusing to overwrite it (set AUDITLOG_READMODEL to another path)"
            )
        for target in (
            self.path,
            self.path.with_name(self.path.name + ".wal"),
            seal_path(self.path),
        ):
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
        from auditlog.store.readmodel import arrowcopy

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
        # The chain head (and format) of every stream held so far: each copied event must link to it.
        from auditlog.store.readmodel.links import held_heads

        heads: Heads = held_heads(
            con.execute(tables.STREAM_HEADS).fetchall(),
            con.execute(tables.STREAM_FIRSTS).fetchall(),
        )
        self._link_seconds = 0.0
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
                        added, replayed = self._apply_chunk(con, pending, lower, heads)
                        copied, streams_replayed = copied + added, streams_replayed + replayed
                        pending, pending_rows = [], 0
                        if progress is not None:
                            progress(copied, total)
            if pending:
                added, replayed = self._apply_chunk(con, pending, lower, heads)
                copied, streams_replayed = copied + added, streams_replayed + replayed
        self._verify_blobs(con)
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
            link_seconds=self._link_seconds,
        )

    def _apply_chunk(
        self,
        con: duckdb.DuckDBPyConnection,
        batches: list[pa.RecordBatch],
        lower: int,
        heads: Heads,
    ) -> tuple[int, int]:
        """Check, derive, store and name one chunk of events in one transaction; returns (rows, streams).

        Every row's chain link is recomputed first (``links.check_links``): a
        row that does not match the chain is never stored. The chunk is then
        handed to DuckDB as the Arrow table ``new_events`` (no staging copy);
        every derivation scans it.
        """
        import pyarrow as pa

        from auditlog.store.readmodel import arrowcopy, vectors
        from auditlog.store.readmodel import batches as batch_rows
        from auditlog.store.readmodel.links import check_links

        table = pa.Table.from_batches(batches, schema=arrowcopy.EVENT_SCHEMA)
        try:
            con.begin()
            table = self._drop_known(con, table, lower)
            if table.num_rows == 0:
                con.rollback()
                return 0, 0
            checking = time.perf_counter()
            check_links(table, heads, self.store.location.display())
            self._link_seconds += time.perf_counter() - checking
            con.register("new_events", table)
            con.register("new_vectors", vectors.new_vectors(table))
            con.register("new_batches", batch_rows.new_batches(table))
            try:
                # Names first: the derivations copy them into every row.
                touched = con.execute(tables.CONSTRUCTION_TOUCHED).fetchall()
                if touched:
                    self._replay_names(con, [(str(r), int(s)) for r, s in touched])
                for sql in tables.DERIVATIONS:
                    con.execute(sql)
            finally:
                con.unregister("new_events")
                con.unregister("new_vectors")
                con.unregister("new_batches")
            mark = con.execute(
                f"SELECT id, hash FROM {tables.SCHEMA}.events ORDER BY id DESC LIMIT 1"
            ).fetchone()
            assert mark is not None
            self._write_meta(
                con,
                {
                    "last_id": str(mark[0]),
                    "last_hash": str(mark[1]),
                    "refreshed_ns": str(time.time_ns()),
                },
            )
            con.commit()
        except (
            IntegrityError,
            CorruptRecordError,
        ):  # a row that fails its link, its limits or is no JSON
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise StoreError(
                f"cannot refresh read model {str(self.path)!r}: {one_line(exc)}"
            ) from exc
        return table.num_rows, len(touched)

    def _verify_blobs(self, con: duckdb.DuckDBPyConnection) -> None:
        """Verify the snapshot files the projection's snapshot rows name and it has not checked.

        Runs after the events. A content hash is checked once: its file is
        immutable under its name, and a later change is the query session's to
        notice (``trust.changed_files``).
        """
        import pyarrow as pa

        missing = [str(r[0]) for r in con.execute(tables.UNCHECKED_BLOBS).fetchall()]
        if not missing:
            return
        checked = check_blobs(self.store.location.snapshots, missing)
        good = [c.row for c in checked if c.row is not None]
        bad = [(c.sha256, c.problem or "") for c in checked if c.row is None]
        try:
            con.begin()
            if good:
                con.register("new_blobs", pa.Table.from_pylist(good, schema=blob_schema()))
                try:
                    con.execute(tables.COPY_CATALOG)
                finally:
                    con.unregister("new_blobs")
            if bad:
                con.executemany(
                    f"INSERT OR REPLACE INTO {tables.SCHEMA}.rejected_blobs VALUES (?, ?)", bad
                )
            con.commit()
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise StoreError(
                f"cannot refresh read model {str(self.path)!r}: {one_line(exc)}"
            ) from exc

    @staticmethod
    def _drop_known(con: duckdb.DuckDBPyConnection, table: pa.Table, lower: int) -> pa.Table:
        """Rows of a re-read window (non-SQLite stores) that the projection already has."""
        import pyarrow as pa
        import pyarrow.compute as pc

        known = con.execute(
            f"SELECT id FROM {tables.SCHEMA}.events WHERE id > ? AND id <= ?",
            [lower, int(pc.max(table.column("id")).as_py() or 0)],
        ).fetchall()
        if not known:
            return table
        mask = pc.invert(
            pc.is_in(table.column("id"), value_set=pa.array([r[0] for r in known], pa.int64()))
        )
        return table.filter(mask)

    # ------------------------------------------------------------------ names
    def _replay_names(self, con: duckdb.DuckDBPyConnection, streams: list[tuple[str, int]]) -> None:
        """Replace the module and tensor rows of ``streams`` by a fresh replay of their construction.

        Construction events come from the projection and from the chunk being
        applied (``new_events``). Labels that changed are rewritten where rows
        already carry them (``tables.RELABEL``).
        """
        import pyarrow as pa

        from auditlog.store.readmodel import names
        from auditlog.store.readmodel.names import MODULE_SCHEMA, TENSOR_SCHEMA

        keys = pa.table(
            {
                "run_id": [r for r, _ in streams],
                "stream": pa.array([s for _, s in streams], pa.int64()),
            }
        )
        con.register("touched_streams", keys)
        kinds = ", ".join(f"'{k}'" for k in CONSTRUCTION_KINDS)
        columns = "e.run_id, e.stream, e.seq, e.kind, e.module_id, e.tensor_id, e.payload"
        join = f"JOIN touched_streams t ON t.run_id = e.run_id AND t.stream = e.stream WHERE e.kind IN ({kinds})"
        cursor = con.execute(
            f"""SELECT {columns} FROM {tables.SCHEMA}.events e {join}
                UNION ALL
                SELECT {columns} FROM new_events e {join}
                ORDER BY 1, 2, 3"""
        )
        states: dict[tuple[str, int], ModelState] = {key: ModelState() for key in streams}
        attached: dict[tuple[str, int], set[int]] = {key: set() for key in streams}
        while True:
            rows = cursor.fetchmany(10_000)
            if not rows:
                break
            for run_id, stream, seq, kind, module_id, tensor_id, payload in rows:
                event = {
                    "seq": seq,
                    "kind": kind,
                    "module_id": module_id,
                    "tensor_id": tensor_id,
                    "payload": payload,
                }
                apply(states[(run_id, stream)], event)
                attached[(run_id, stream)] |= attached_ids([event])
        schema_ = tables.SCHEMA
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE old_modules AS
                SELECT x.run_id, x.stream, x.module_id, x.module FROM {schema_}.modules x
                JOIN touched_streams t ON t.run_id = x.run_id AND t.stream = x.stream"""
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE old_tensors AS
                SELECT x.run_id, x.stream, x.tensor_id, x.name, x.module FROM {schema_}.tensors x
                JOIN touched_streams t ON t.run_id = x.run_id AND t.stream = x.stream"""
        )
        for table in ("modules", "tensors"):
            con.execute(
                f"""DELETE FROM {schema_}.{table} x USING touched_streams t
                    WHERE x.run_id = t.run_id AND x.stream = t.stream"""
            )
        con.unregister("touched_streams")
        module_rows: list[dict[str, Any]] = []
        tensor_rows: list[dict[str, Any]] = []
        for (run_id, stream), state in states.items():
            labels = label_state(state, attached[(run_id, stream)])
            module_rows.extend(names.module_rows(run_id, stream, state, labels))
            tensor_rows.extend(names.tensor_rows(run_id, stream, labels))
        if module_rows:
            con.register("new_modules", pa.Table.from_pylist(module_rows, schema=MODULE_SCHEMA))
            con.execute(f"INSERT INTO {schema_}.modules SELECT * FROM new_modules")
            con.unregister("new_modules")
        if tensor_rows:
            con.register("new_tensors", pa.Table.from_pylist(tensor_rows, schema=TENSOR_SCHEMA))
            con.execute(f"INSERT INTO {schema_}.tensors SELECT * FROM new_tensors")
            con.unregister("new_tensors")
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE changed_modules AS
                SELECT n.run_id, n.stream, n.module_id, n.module FROM {schema_}.modules n
                JOIN old_modules o
                    ON o.run_id = n.run_id AND o.stream = n.stream AND o.module_id = n.module_id
                WHERE o.module IS DISTINCT FROM n.module"""
        )
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE changed_tensors AS
                SELECT n.run_id, n.stream, n.tensor_id, n.name, n.module FROM {schema_}.tensors n
                JOIN old_tensors o
                    ON o.run_id = n.run_id AND o.stream = n.stream AND o.tensor_id = n.tensor_id
                WHERE o.name IS DISTINCT FROM n.name OR o.module IS DISTINCT FROM n.module"""
        )
        counts = con.execute(
            "SELECT (SELECT count(*) FROM changed_modules), (SELECT count(*) FROM changed_tensors)"
        ).fetchone()
        if counts is not None and (counts[0] or counts[1]):
            for sql in tables.RELABEL:
                con.execute(sql)
        for temp in ("old_modules", "old_tensors", "changed_modules", "changed_tensors"):
            con.execute(f"DROP TABLE {temp}")


def _unchecked_blobs(con: duckdb.DuckDBPyConnection) -> int:
    """Snapshot hashes neither verified nor rejected yet (-1 when the tables are not there)."""
    try:
        return len(con.execute(tables.UNCHECKED_BLOBS).fetchall())
    except duckdb.Error:
        return -1


@functools.cache
def blob_schema() -> pa.Schema:
    """The ``blobs`` rows a refresh writes (a function: pyarrow is imported by refreshes only)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("sha256", pa.string()),
            ("file", pa.string()),
            ("dtype", pa.string()),
            ("shape", pa.list_(pa.int64())),
            ("numel", pa.int64()),
            ("nbytes", pa.int64()),
            ("layout", pa.string()),
            ("row_groups", pa.int32()),
            ("file_sha256", pa.string()),
            ("created_ns", pa.int64()),
            ("identity", pa.list_(pa.int64())),
        ]
    )
