"""Where a store's read model (its DuckDB projection) lives, and how it is opened.

Beside the store when its directory is writable (``readmodel.duckdb``), else in the
user's cache directory under the store's id; ``$AUDITLOG_READMODEL`` overrides.
Every connection is made by ``connect``, the one way auditlog configures DuckDB
(no extension fetched, no progress bar printed into pipes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from auditlog.store.location import EVENTS_FILE

if TYPE_CHECKING:
    from auditlog.store.eventstore import EventStore

PROJECTION_FILE = "readmodel.duckdb"

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
        name = (
            PROJECTION_FILE
            if location.database.name == EVENTS_FILE
            else location.database.name + "." + PROJECTION_FILE
        )
        candidate = location.database.with_name(name)
    if candidate is not None and os.access(candidate.parent, os.W_OK):
        return candidate
    store_id = store.meta().get("store_id") or "unknown"
    return _cache_dir() / f"{store_id}.duckdb"


def is_projection_file(path: Path) -> bool:
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
