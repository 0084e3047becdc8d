"""Running the store's read questions: one SQL text, two ways to run it.

Every question in ``queries.py`` is written once, as SQL text with named
parameters (``:run_id``), which both runners below accept unchanged:

- ``SqliteReads``: the stdlib ``sqlite3`` module on a SQLite store's file. A
  read command (``runs``, ``events``, ``verify``) then never imports SQLAlchemy,
  whose import was most of ``auditlog runs``'s time (docs/performance.md).
- ``EngineReads``: a SQLAlchemy engine (PostgreSQL, and any store without a
  file), the text run through ``sqlalchemy.text``.

Both hand back plain tuples of values exactly as the driver returns them, and
column names from the cursor. A connection is checked out for one question and
returned to a small pool afterwards, as SQLAlchemy's pool does: a question never
shares a connection with another one in flight (a half-read result holds its own).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sqlalchemy import Engine

BUSY_TIMEOUT_S = 30.0  # as opening.BUSY_TIMEOUT_MS: wait for a writer's lock, never fail on it


class ReadConnection(Protocol):
    """One checked-out connection: SQL text with ``:name`` parameters in, tuples out."""

    dialect: str

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]: ...

    def batches(
        self, sql: str, params: Mapping[str, Any] | None, size: int
    ) -> tuple[list[str], Iterator[list[tuple[Any, ...]]]]: ...


class Reads(Protocol):
    """Where read connections come from (``EventStore.reads``)."""

    dialect: str

    def connection(self) -> contextlib.AbstractContextManager[ReadConnection]: ...

    def close(self) -> None: ...


def in_list(name: str, values: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    """``(:name_0, :name_1, ...)`` and its parameters, for ``column IN ...``.

    An empty list is ``(NULL)``: ``x IN (NULL)`` is never true, as SQLAlchemy's
    empty ``in_`` is never true.
    """
    if not values:
        return "(NULL)", {}
    params = {f"{name}_{i}": value for i, value in enumerate(values)}
    return "(" + ", ".join(f":{key}" for key in params) + ")", params


# ---------------------------------------------------------------------- sqlite3
class _SqliteConnection:
    dialect = "sqlite"

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.cursors: list[sqlite3.Cursor] = []

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self.connection.execute(sql, params or {}).fetchall()

    def batches(
        self, sql: str, params: Mapping[str, Any] | None, size: int
    ) -> tuple[list[str], Iterator[list[tuple[Any, ...]]]]:
        cursor = self.connection.execute(sql, params or {})
        self.cursors.append(cursor)  # closed when the connection goes back to the pool
        keys = [str(d[0]) for d in cursor.description or ()]

        def fetched() -> Iterator[list[tuple[Any, ...]]]:
            try:
                while rows := cursor.fetchmany(size):
                    yield rows
            finally:
                cursor.close()

        return keys, fetched()


class SqliteReads:
    """A pool of read connections to one SQLite file (``target``: a path, or a ``file:``
    URI for a store on read-only media).

    Connections are autocommit (``isolation_level=None``): each question sees what
    was committed when it started, and none holds a transaction open afterwards.
    A forked child never reuses its parent's connections.
    """

    dialect = "sqlite"

    def __init__(self, target: str, uri: bool = False) -> None:
        self.target = target
        self.uri = uri
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.target,
            uri=self.uri,
            timeout=BUSY_TIMEOUT_S,
            check_same_thread=False,
            isolation_level=None,
        )

    @contextlib.contextmanager
    def connection(self) -> Iterator[ReadConnection]:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's connections are not ours to use
                self._idle, self._pid = [], os.getpid()
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = self._connect()
        wrapped = _SqliteConnection(connection)
        try:
            yield wrapped
        finally:
            # A result left half read (a caller stopped early) must not hold its read
            # transaction open on a pooled connection: the next question would see
            # the store as it was then.
            for cursor in wrapped.cursors:
                cursor.close()
            with self._lock:
                keep = not self._closed and self._pid == os.getpid() and len(self._idle) < 5
                if keep:
                    self._idle.append(connection)
            if not keep:
                connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for connection in idle:
            connection.close()


# ---------------------------------------------------------------------- SQLAlchemy
class _EngineConnection:
    def __init__(self, connection: Any, dialect: str) -> None:
        self.connection = connection
        self.dialect = dialect

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        from sqlalchemy import text

        return [tuple(r) for r in self.connection.execute(text(sql), dict(params or {})).fetchall()]

    def batches(
        self, sql: str, params: Mapping[str, Any] | None, size: int
    ) -> tuple[list[str], Iterator[list[tuple[Any, ...]]]]:
        from sqlalchemy import text

        result = self.connection.execution_options(stream_results=True, yield_per=size).execute(
            text(sql), dict(params or {})
        )
        names = result.keys()  # a result's column names (iterating the result gives rows)
        keys = [str(k) for k in names]
        return keys, ([tuple(r) for r in part] for part in result.partitions(size))


class EngineReads:
    """Read connections from a SQLAlchemy engine (server-side cursors where streamed)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = str(engine.dialect.name)

    @contextlib.contextmanager
    def connection(self) -> Iterator[ReadConnection]:
        with self.engine.connect() as connection:
            yield _EngineConnection(connection, self.dialect)

    def close(self) -> None:
        """The engine is the store's; ``EventStore.close`` disposes of it."""
