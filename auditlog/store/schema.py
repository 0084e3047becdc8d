"""The event store schema as SQLAlchemy Core tables, and its version.

Schema changelog (each entry is an Alembic revision in ``migrations/versions``):

- ``0001``: ``auditlog_meta`` (store identity), ``runs`` (index of runs with
  liveness), ``events`` (the append-only, hash-chained record).
- ``0002``: ``checkpoints`` (signed chain heads; filled by ``auditlog keygen``
  users, see the integrity docs).
- ``0003``: ``snapshot_blobs`` (catalog of content-addressed tensor snapshots:
  hash -> Parquet file, dtype, shape, size). Snapshot events reference these
  hashes, so the hash chain covers snapshot contents.
- ``0004``: ``checkpoints.format``, ``tree_root``, ``ended``, ``world_size``
  (signed Merkle tree heads, ``auditlog-checkpoint-v2``; NULL format = a v1 row).
- ``0005``: ``events.snapshot`` dropped (always NULL; chain format v2,
  ``core.chain``: events recorded before verify as v1, with that NULL in place).
  Refused, unchanged, when any event holds a value there.

``HEAD_REVISION`` must equal Alembic's head; a test checks it. Code that reads a
store compares the store's revision with ``KNOWN_REVISIONS`` to decide between
"upgrade your store" and "upgrade auditlog"; those constants live in
``revision.py`` (no SQLAlchemy: read commands open a store without it), and the
column lists the read questions name in ``queries.py`` (a test checks them
against these tables).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeEngine

from auditlog.core import eventrow
from auditlog.core.eventrow import RowColumn
from auditlog.store.revision import HEAD_REVISION as HEAD_REVISION
from auditlog.store.revision import KNOWN_REVISIONS as KNOWN_REVISIONS
from auditlog.store.revision import SNAPSHOTS_META as SNAPSHOTS_META
from auditlog.store.revision import STORE_FORMAT as STORE_FORMAT

metadata = MetaData()

auditlog_meta = Table(
    "auditlog_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(32), primary_key=True),
    Column("name", Text),
    Column("started_ns", BigInteger, nullable=False),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    # Process start time (clock ticks since boot, from /proc) tells a live pid
    # from a reused one when deciding whether an unfinished run crashed.
    Column("proc_start", BigInteger),
    Column("last_seen_ns", BigInteger, nullable=False),
)


def _sql_type(sql: str) -> TypeEngine[Any]:
    """The SQLAlchemy type of a portable SQL type name of ``core.eventrow``."""
    if sql.startswith("VARCHAR("):
        return String(int(sql[len("VARCHAR(") : -1]))
    types: dict[str, TypeEngine[Any]] = {
        "INTEGER": Integer(),
        "BIGINT": BigInteger(),
        "TEXT": Text(),
    }
    return types[sql]


def _event_column(column: RowColumn) -> Column[Any]:
    if column.name == "id":
        return Column(column.name, _sql_type(column.sql), primary_key=True, autoincrement=True)
    return Column(column.name, _sql_type(column.sql), nullable=column.nullable)


# The columns are defined once, in ``core.eventrow`` (the chain hashes them).
events = Table(
    "events",
    metadata,
    *(_event_column(c) for c in eventrow.COLUMNS),
    UniqueConstraint("run_id", "stream", "seq", name="uq_events_run_stream_seq"),
    Index("ix_events_run_kind", "run_id", "kind"),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("stream", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("head_hash", String(64), nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("key_fingerprint", String(64), nullable=False),
    Column("signature", Text, nullable=False),
    Column("format", String(32)),
    Column("tree_root", String(64)),
    Column("ended", Integer),
    Column("world_size", Integer),
)

snapshot_blobs = Table(
    "snapshot_blobs",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("file", Text, nullable=False),
    Column("dtype", String(32), nullable=False),
    Column("shape", Text, nullable=False),
    Column("numel", BigInteger, nullable=False),
    Column("nbytes", BigInteger, nullable=False),
    Column("layout", String(8), nullable=False),
    Column("row_groups", Integer, nullable=False),
    # SHA-256 of the Parquet file's bytes: any change to the file, even one that
    # leaves the decoded values intact, is detected.
    Column("file_sha256", String(64), nullable=False),
    Column("created_ns", BigInteger, nullable=False),
)
