"""Where a store lives: a directory (SQLite ``events.db`` + ``snapshots/``) or a URL.

Resolution order: the ``--store`` option, then ``AUDITLOG_STORE``, then
``./.auditlog``. A value containing ``://`` is a SQLAlchemy URL for the event
store; its snapshots go to ``AUDITLOG_SNAPSHOTS`` or ``./.auditlog/snapshots``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STORE = ".auditlog"
EVENTS_FILE = "events.db"
SNAPSHOTS_DIR = "snapshots"


@dataclass(frozen=True)
class StoreLocation:
    """A resolved store: the SQLAlchemy URL, and the local paths when it is a directory."""

    url: str
    directory: Path | None
    database: Path | None
    snapshots: Path

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def display(self) -> str:
        """How to name this store in messages (never shows a password)."""
        if self.directory is not None:
            return str(self.directory)
        if self.database is not None:
            return str(self.database)
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)


def resolve_store(value: str | os.PathLike[str] | None = None) -> StoreLocation:
    """Turn ``--store`` / ``AUDITLOG_STORE`` / the default into a ``StoreLocation``."""
    raw = os.fspath(value) if value is not None else os.environ.get("AUDITLOG_STORE") or DEFAULT_STORE
    if "://" in raw:
        snapshots = Path(os.environ.get("AUDITLOG_SNAPSHOTS") or Path(DEFAULT_STORE) / SNAPSHOTS_DIR)
        database = None
        if raw.startswith("sqlite") and raw.split("://", 1)[1].startswith("/"):
            database = Path(raw.split("://", 1)[1][1:] or ".").absolute()
            snapshots = database.parent / SNAPSHOTS_DIR
        return StoreLocation(url=raw, directory=None, database=database, snapshots=snapshots.absolute())
    directory = Path(raw).expanduser().absolute()
    database = directory / EVENTS_FILE
    return StoreLocation(
        url=f"sqlite:///{database}",
        directory=directory,
        database=database,
        snapshots=directory / SNAPSHOTS_DIR,
    )
