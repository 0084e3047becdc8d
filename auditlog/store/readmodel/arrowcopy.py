"""Read events out of the event store as Arrow record batches, newest-only.

The read model copies the append-only ``events`` table into DuckDB. Three things
decide how, and they are kept here, away from the projection's SQL:

- **Offline and dialect-neutral.** DuckDB's own ``sqlite`` extension is not an
  option: it is downloaded on first use, and it would not read PostgreSQL. The
  rows are moved as Arrow instead, which DuckDB ingests without a copy.
- **One path per database.** A SQLite store is always read through ADBC
  (``adbc-driver-sqlite`` is a dependency) straight into Arrow, several times
  the rows per second of Python's ``sqlite3`` (``benchmarks/query.py``;
  docs/performance.md). A
  PostgreSQL store is read through ``adbc-driver-postgresql`` (the
  ``auditlog[postgres]`` extra installs it; binary COPY, in a read-only
  session). Any other database (or PostgreSQL without that driver) is read with
  SQLAlchemy Core in batches turned into Arrow here: slower, but it works for
  every store the event store can open (``copy_method`` decides, once).
- **Only what is new.** Events get an autoincrement ``id`` in commit order on
  SQLite (one writer at a time), so ``id > last_copied`` is exactly the new
  rows. PostgreSQL hands out sequence values at insert time, not at commit, so a
  slow transaction can commit an ``id`` below one already copied; for such
  dialects the copy re-reads a window of ``REREAD_WINDOW`` ids below the mark and
  the projection drops the rows it already has.

ADBC's SQLite driver infers column types from the first batch, and a nullable
text column that starts with NULLs is inferred as an integer; such a column
(none since revision 0005 dropped ``snapshot``, always NULL: ``core.eventrow``)
would be read as ``coalesce(column, '')`` and turned back into NULL here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from auditlog.core.errors import StoreError
from auditlog.core.eventrow import ALL_COLUMNS, COLUMNS
from auditlog.store.eventstore import EventStore

BATCH_ROWS = 65_536
REREAD_WINDOW = 10_000

EVENT_COLUMNS: tuple[str, ...] = ALL_COLUMNS  # defined once, in core.eventrow

EVENT_SCHEMA = pa.schema([(c.name, pa.type_for_alias(c.arrow)) for c in COLUMNS])
# Nullable text columns (none at present): read as '' through ADBC's SQLite driver.
_NULLABLE_TEXT = frozenset(c.name for c in COLUMNS if c.nullable and c.arrow == "string")


def copy_method(store: EventStore) -> str:
    """How events of ``store`` reach Arrow: ``"adbc"`` for a SQLite file,
    ``"adbc-postgresql"`` for PostgreSQL with its ADBC driver, else ``"sqlalchemy"``."""
    dialect = store.reads.dialect
    if dialect == "sqlite" and store.location.database is not None:
        return "adbc"
    if dialect == "postgresql" and importlib.util.find_spec("adbc_driver_postgresql") is not None:
        return "adbc-postgresql"
    return "sqlalchemy"


def copy_lower_bound(store: EventStore, last_id: int) -> int:
    """The id after which to read: ``last_id``, less a window where ids may commit late."""
    if store.reads.dialect == "sqlite":
        return last_id
    return max(0, last_id - REREAD_WINDOW)


def max_event_id(store: EventStore) -> int:
    """The highest event ``id`` in the store (0 when empty)."""
    return store.max_event_id()


def event_hash(store: EventStore, event_id: int) -> str | None:
    """The chain hash of the event with this ``id``, or None if there is none."""
    return store.event_hash(event_id)


def event_batches(store: EventStore, after_id: int, upto_id: int) -> Iterator[pa.RecordBatch]:
    """Events with ``after_id < id <= upto_id`` in id order, as batches of ``EVENT_SCHEMA``.

    ``upto_id`` pins the copy to what existed when it started, so events that a
    live recording appends meanwhile wait for the next refresh instead of
    racing with the bookkeeping of the last copied id.
    """
    method = copy_method(store)
    if method == "adbc-postgresql":
        yield from _adbc_postgres_batches(store, after_id, upto_id)
    elif method == "adbc":
        yield from _adbc_sqlite_batches(store, after_id, upto_id)
    else:
        yield from sqlalchemy_batches(store, after_id, upto_id)


def _normalize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Cast to ``EVENT_SCHEMA`` and turn the ADBC ``''`` placeholder back into NULL."""
    columns = []
    for name, target in zip(EVENT_SCHEMA.names, EVENT_SCHEMA.types, strict=True):
        column = batch.column(name)
        if column.type != target:
            column = column.cast(target)
        if name in _NULLABLE_TEXT:
            column = pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=EVENT_SCHEMA)


def _adbc_sqlite_batches(
    store: EventStore, after_id: int, upto_id: int
) -> Iterator[pa.RecordBatch]:
    import adbc_driver_sqlite.dbapi as adbc_sqlite

    # Read-only URI: the copy must never be able to write the record.
    uri = store.sqlite_read_uri()
    wanted = ", ".join(
        f"coalesce({c}, '') AS {c}" if c in _NULLABLE_TEXT else c for c in EVENT_COLUMNS
    )
    query = f"SELECT {wanted} FROM events WHERE id > ? AND id <= ? ORDER BY id"
    try:
        conn = adbc_sqlite.connect(uri)
    except Exception as exc:  # the driver raises its own DB-API error classes
        raise _store_error(store, exc) from exc
    try:
        cursor = conn.cursor()
        try:
            cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
            cursor.execute(query, (after_id, upto_id))
            reader = cursor.fetch_record_batch()
            for batch in reader:
                if batch.num_rows:
                    yield _normalize(batch)
        except Exception as exc:
            raise _store_error(store, exc) from exc
        finally:
            cursor.close()
    finally:
        conn.close()


def libpq_uri(store: EventStore) -> str:
    """The store's SQLAlchemy URL as the libpq URI ADBC's PostgreSQL driver takes."""
    url = store.engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def _adbc_postgres_batches(
    store: EventStore, after_id: int, upto_id: int
) -> Iterator[pa.RecordBatch]:
    """PostgreSQL's binary COPY protocol straight into Arrow, in a read-only transaction."""
    import adbc_driver_postgresql.dbapi as adbc_pg

    query = (
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM events "
        f"WHERE id > {int(after_id)} AND id <= {int(upto_id)} ORDER BY id"
    )
    try:
        conn = adbc_pg.connect(libpq_uri(store))
    except Exception as exc:  # the driver raises its own DB-API error classes
        raise _store_error(store, exc) from exc
    try:
        cursor = conn.cursor()
        try:
            # The copy must never be able to write the record.
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            cursor.execute(query)
            for batch in cursor.fetch_record_batch():
                if batch.num_rows:
                    yield _normalize(batch)
        except Exception as exc:
            raise _store_error(store, exc) from exc
        finally:
            cursor.close()
    finally:
        conn.close()


def sqlalchemy_batches(store: EventStore, after_id: int, upto_id: int) -> Iterator[pa.RecordBatch]:
    """The dialect-neutral path (databases without an ADBC driver), also tested against SQLite."""
    from sqlalchemy import select

    from auditlog.store import schema

    ev = schema.events
    query = (
        select(*(ev.c[name] for name in EVENT_COLUMNS))
        .where(ev.c.id > after_id, ev.c.id <= upto_id)
        .order_by(ev.c.id)
    )
    with store.guard("copying events to the read model"), store.engine.connect() as conn:
        result = conn.execution_options(stream_results=True, yield_per=BATCH_ROWS).execute(query)
        for rows in result.partitions():
            columns: list[list[Any]] = [[] for _ in EVENT_COLUMNS]
            for row in rows:
                for i, value in enumerate(row):
                    columns[i].append(value)
            arrays = [
                pa.array(col, type=t) for col, t in zip(columns, EVENT_SCHEMA.types, strict=True)
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA)


def _store_error(store: EventStore, exc: BaseException) -> StoreError:
    cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return StoreError(
        f"store {store.location.display()!r}: error while copying events to the read model: {cause}"
    )


# --------------------------------------------------------------------------- snapshot catalog
CATALOG_BATCH = 500

CATALOG_SCHEMA = pa.schema(
    [
        ("sha256", pa.string()),
        ("file", pa.string()),
        ("dtype", pa.string()),
        ("shape", pa.string()),
        ("numel", pa.int64()),
        ("nbytes", pa.int64()),
        ("layout", pa.string()),
        ("row_groups", pa.int64()),
        ("file_sha256", pa.string()),
        ("created_ns", pa.int64()),
    ]
)


def catalog_hashes(store: EventStore) -> set[str]:
    """Every content hash in the store's snapshot catalog.

    The catalog is keyed by hash with no insertion counter, so the projection
    learns what is new by difference; the hashes alone are small (64 bytes a row).
    """
    from sqlalchemy import select

    from auditlog.store import schema

    blobs = schema.snapshot_blobs
    with store.guard("reading the snapshot catalog"), store.engine.connect() as conn:
        return {str(h) for h in conn.execute(select(blobs.c.sha256)).scalars()}


def catalog_count(store: EventStore) -> int:
    """Rows in the store's snapshot catalog."""
    from sqlalchemy import func, select

    from auditlog.store import schema

    blobs = schema.snapshot_blobs
    with store.guard("counting the snapshot catalog"), store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(blobs)).scalar() or 0)


def catalog_batches(store: EventStore, hashes: list[str]) -> Iterator[pa.RecordBatch]:
    """The catalog rows of ``hashes`` as batches of ``CATALOG_SCHEMA``."""
    from sqlalchemy import select

    from auditlog.store import schema

    blobs = schema.snapshot_blobs
    for start in range(0, len(hashes), CATALOG_BATCH):
        wanted = hashes[start : start + CATALOG_BATCH]
        with store.guard("copying the snapshot catalog"), store.engine.connect() as conn:
            rows = [
                dict(r)
                for r in conn.execute(select(blobs).where(blobs.c.sha256.in_(wanted))).mappings()
            ]
        if rows:
            yield pa.RecordBatch.from_pylist(
                [{name: row.get(name) for name in CATALOG_SCHEMA.names} for row in rows],
                schema=CATALOG_SCHEMA,
            )
