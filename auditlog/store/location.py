"""Where a store lives: a directory (SQLite ``events.db`` + ``snapshots/``) or a URL.

Resolution order: the ``--store`` option, then ``AUDITLOG_STORE``, then
``./.auditlog``. The value is one of:

- a directory: ``events.db`` and ``snapshots/`` inside it (the embedded default);
- a SQLAlchemy URL containing ``://`` for the event store, e.g.
  ``postgresql+psycopg://user@host/db`` (many ranks and hosts writing to one
  place). Its tensor snapshots go to a directory every writer can reach:
  ``--snapshots PATH``, else ``AUDITLOG_SNAPSHOTS``; a new database store
  remembers that path (``auditlog_meta``), so later commands find it without
  being told. A ``sqlite:////abs/path.db`` URL keeps ``snapshots/`` beside the file;
- a store config file (``*.toml``), for a URL and a snapshot path that belong
  together and should not be typed each time::

      [store]
      url = "postgresql+psycopg://auditlog@db.internal/auditlog"
      snapshots = "/shared/auditlog/snapshots"   # relative paths: to the file

Snapshots are a local (or mounted) directory; ``file://`` URIs are accepted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from auditlog.core.errors import UsageError

DEFAULT_STORE = ".auditlog"
EVENTS_FILE = "events.db"
SNAPSHOTS_DIR = "snapshots"
SHARDS_DIR = "shards"
CONFIG_SUFFIX = ".toml"


@dataclass(frozen=True)
class StoreLocation:
    """A resolved store: the SQLAlchemy URL, and the local paths when it is a directory.

    ``snapshots_given``: the snapshot directory was named (option, environment or
    config file) rather than defaulted; a database store without one reads it
    from its own metadata when opened.
    """

    url: str
    directory: Path | None
    database: Path | None
    snapshots: Path
    snapshots_given: bool = True

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


def snapshot_path(value: str | os.PathLike[str], base: Path | None = None) -> Path:
    """A snapshot directory from a path or a ``file://`` URI (relative: to ``base`` or the cwd)."""
    text = os.fspath(value)
    if "://" in text:
        parsed = urlparse(text)
        if parsed.scheme != "file":
            raise UsageError(
                f"snapshot location {text!r}: only directories (or file:// URIs) are supported; "
                "mount object storage as a directory"
            )
        text = unquote(parsed.path)
    path = Path(text).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path.absolute()


def _from_config(path: Path, snapshots: str | os.PathLike[str] | None) -> StoreLocation:
    """A store named by a config file (module docstring)."""
    import tomllib  # here: only a store config file needs it

    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"store config {str(path)!r} cannot be read: {exc}") from exc
    section = document.get("store")
    if not isinstance(section, dict) or not isinstance(section.get("url"), str):
        raise UsageError(f'store config {str(path)!r} has no [store] url = "..."')
    given = snapshots if snapshots is not None else section.get("snapshots")
    if given is not None and not isinstance(given, str):
        raise UsageError(f"store config {str(path)!r}: snapshots must be a path")
    location = resolve_store(
        section["url"], snapshots=None if given is None else snapshot_path(given, path.parent)
    )
    return location


def resolve_store(
    value: str | os.PathLike[str] | None = None, snapshots: str | os.PathLike[str] | None = None
) -> StoreLocation:
    """Turn ``--store`` / ``AUDITLOG_STORE`` / the default into a ``StoreLocation``.

    ``snapshots``: ``--snapshots`` (else ``AUDITLOG_SNAPSHOTS``), for database URLs.
    """
    raw = (
        os.fspath(value) if value is not None else os.environ.get("AUDITLOG_STORE") or DEFAULT_STORE
    )
    if "://" not in raw and raw.endswith(CONFIG_SUFFIX) and Path(raw).expanduser().is_file():
        return _from_config(Path(raw).expanduser().absolute(), snapshots)
    if "://" in raw:
        given = snapshots if snapshots is not None else os.environ.get("AUDITLOG_SNAPSHOTS") or None
        database = None
        if raw.startswith("sqlite") and raw.split("://", 1)[1].startswith("/"):
            database = Path(raw.split("://", 1)[1][1:] or ".").absolute()
            return StoreLocation(
                url=raw,
                directory=None,
                database=database,
                snapshots=snapshot_path(given) if given else database.parent / SNAPSHOTS_DIR,
            )
        return StoreLocation(
            url=raw,
            directory=None,
            database=None,
            snapshots=snapshot_path(given)
            if given
            else Path(DEFAULT_STORE, SNAPSHOTS_DIR).absolute(),
            snapshots_given=given is not None,
        )
    directory = Path(raw).expanduser().absolute()
    database = directory / EVENTS_FILE
    return StoreLocation(
        url=f"sqlite:///{database}",
        directory=directory,
        database=database,
        snapshots=directory / SNAPSHOTS_DIR,
    )
