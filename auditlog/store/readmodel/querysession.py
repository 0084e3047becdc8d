"""Read-only SQL over the read model: the session behind ``auditlog query``.

A user's SQL must answer questions and nothing else: it must not change the
projection, the store, or anything else on the machine, and must not read files
outside the record. Three independent layers make sure of that, so that a gap in
one is not a hole:

1. **The statement is checked before it runs.** DuckDB's own parser
   (``extract_statements``) classifies it; exactly one statement of type SELECT
   (which covers ``FROM``, ``WITH``, ``VALUES``, ``DESCRIBE``, ``SHOW``,
   ``SUMMARIZE``) or an ``EXPLAIN [ANALYZE]`` of one is accepted; ``INSERT``,
   ``UPDATE``, ``DELETE``, ``CREATE``, ``ATTACH``, ``COPY``, ``INSTALL``/``LOAD``,
   ``SET``, ``PRAGMA``, ``CALL``, ``EXPORT`` ... are refused unexecuted.
2. **The projection is opened read-only**, so even a statement that slipped
   through could not write it.
3. **DuckDB is locked down** after the views are set up:
   ``allowed_directories`` is the store's ``snapshots/`` directory and nothing
   else, then ``enable_external_access=false`` (no file, URL or database outside
   the projection and that directory; ``read_csv('/etc/passwd')`` fails),
   extension auto-install and auto-load off, then ``lock_configuration=true`` so
   the statement cannot undo any of it.

The documented views (``auditlog.store.readmodel.views``) are created as temporary views on
each session, over all runs or over the one run given, so ``--run`` scopes every
view and every join the same way.

The ``tensor_values`` view reads Parquet files under the store's ``snapshots/``
directory with DuckDB's bundled parquet reader: only files the read model
verified (``trust``), and of those only the ones still holding the bytes it
verified; the others are left out and named in ``left_out``. The ``runs`` view
shows chained facts (``run_started``) and liveness from the runs index. DuckDB (2.0) checks
``allowed_directories`` before refusing a path because external access is off,
so that one directory stays readable, and only for reading (``COPY`` and every
other writing statement is refused by layer 1; the projection is read-only).
Checked: ``read_parquet`` through the view works and ``/etc/passwd`` is still
refused (tests/test_snapshot_views.py). Nothing weaker (external access left on)
is needed.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import duckdb

from auditlog.core.errors import AuditlogError, UsageError, one_line
from auditlog.core.liveness import run_liveness
from auditlog.store.location import StoreLocation
from auditlog.store.readmodel import tables
from auditlog.store.readmodel.cache import Progress, ReadModel, RefreshReport, connect
from auditlog.store.readmodel.trust import changed_files
from auditlog.store.readmodel.views import (
    RUNS_LIVE,
    VIEWS,
    scoped_catalog,
    snapshot_values_sql,
    view_sql,
)
from auditlog.store.rows import payload_object


class QueryRefusedError(UsageError):
    """The SQL is not a single read-only statement. Exit code 2."""


class QueryError(AuditlogError):
    """DuckDB could not run the SQL (syntax, unknown column, refused file access). Exit code 1."""


class QueryTimeoutError(QueryError):
    """The query ran past its time limit and was cancelled. Exit code 1."""


# EXPLAIN's statement type hides what it explains; the explained statement is
# parsed again on its own. A prefix this regex cannot strip (a comment before
# EXPLAIN, say) stays EXPLAIN and is refused: failing closed.
_EXPLAIN_PREFIX = re.compile(r"^\s*explain\s+(analyze\s+)?", re.IGNORECASE)
_RUN_ID = re.compile(r"^[0-9A-Za-z_-]{1,64}$")
_T = TypeVar("_T")


def allowed_directories(location: StoreLocation) -> list[str]:
    """Directories DuckDB may read while external access is off: the store's snapshots.

    The trailing slash matters: DuckDB matches by prefix, and ``/store/snapshots``
    would also admit ``/store/snapshots-other``.
    """
    return [str(location.snapshots).rstrip("/") + "/"]


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """The one read-only statement in ``sql``; raises ``QueryRefusedError`` otherwise."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(one_line(exc)) from exc
    if not statements:
        raise QueryRefusedError("no SQL statement given")
    if len(statements) > 1:
        raise QueryRefusedError(f"one statement at a time, got {len(statements)}")
    statement = statements[0]
    kind = statement.type
    if kind == duckdb.StatementType.EXPLAIN:
        inner = _EXPLAIN_PREFIX.sub("", statement.query, count=1)
        if inner != statement.query:
            check_read_only(con, inner)
            return statement.query
    if kind != duckdb.StatementType.SELECT:
        name = _statement_name(statement.query, str(kind).rsplit(".", 1)[-1])
        article = "an" if name[:1] in "AEIOU" else "a"
        raise QueryRefusedError(
            f"only read-only queries are allowed (SELECT, WITH, FROM, DESCRIBE, SHOW, EXPLAIN); "
            f"refused {article} {name} statement"
        )
    return str(statement.query)


_FIRST_WORD = re.compile(r"^\s*([A-Za-z_]+)")


def _statement_name(query: str, kind: str) -> str:
    """What a user typed (``INSTALL``, which DuckDB classifies as LOAD), else DuckDB's type."""
    match = _FIRST_WORD.match(query)
    word = match.group(1).upper() if match else ""
    return word if word and word not in ("WITH", "FROM", "SELECT", "EXPLAIN") else kind


@dataclass
class QueryResult:
    """Column names and DuckDB types of a result, and its rows (streamed)."""

    columns: list[str]
    types: list[str]
    rows: Iterator[tuple[Any, ...]]


def _object(payload: Any) -> dict[str, Any]:
    """A stored JSON payload as a dict ({} when it is not an object, or past the payload
    limits, which the refresh refuses to copy: summaries tolerate damage)."""
    return payload_object(payload, strict=False)


class QuerySession:
    """A read-only, locked-down DuckDB connection to a fresh projection, with the views."""

    def __init__(
        self, readmodel: ReadModel, run_id: str | None = None, rank: int | None = None
    ) -> None:
        if run_id is not None and not _RUN_ID.match(run_id):
            raise UsageError(f"bad run id {run_id!r}")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise UsageError(f"bad rank {rank!r}")
        self.rank = rank
        self.readmodel = readmodel
        self.run_id = run_id
        # Snapshot contents tensor_values does not read, and why (failed or changed files).
        self.left_out: dict[str, str] = {}
        self._resources = contextlib.ExitStack()
        with self._resources as resources:
            resources.enter_context(readmodel.lock(exclusive=False))
            try:
                self.con = connect(readmodel.path, read_only=True)
            except duckdb.Error as exc:
                raise QueryError(
                    f"cannot open read model {str(readmodel.path)!r}: {one_line(exc)}"
                ) from exc
            resources.callback(self.con.close)
            self._set_up()
            self._resources = resources.pop_all()

    @classmethod
    def open(
        cls,
        readmodel: ReadModel,
        run_id: str | None = None,
        progress: Progress | None = None,
        rank: int | None = None,
        rebuild: bool = False,
    ) -> tuple[QuerySession, RefreshReport | None]:
        """Refresh the projection if the store has new events (or its seal does not hold;
        rebuild it when asked), then open a session on it.

        A rebuild nobody asked for (the seal no longer held, the store changed
        under the read model) is said in one line on stderr: the answers come
        from the store as it is now, not from what was cached.
        """
        fresh = not rebuild and readmodel.is_fresh()
        report = None if fresh else readmodel.refresh(progress, rebuild=rebuild)
        if report is not None and report.notice is not None:
            sys.stderr.write(report.notice + "\n")
            sys.stderr.flush()
        return cls(readmodel, run_id, rank), report

    # ------------------------------------------------------------------ setup
    def _set_up(self) -> None:
        self._load_liveness()
        values = self._snapshot_values()
        for view in VIEWS:
            self.con.execute(
                f'CREATE TEMP VIEW "{view.name}" AS {view_sql(view, self.run_id, values, self.rank)}'
            )
        directories = allowed_directories(self.readmodel.store.location)
        if directories:
            self.con.execute("SET allowed_directories = ?", [directories])
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def _snapshot_values(self) -> str:
        """The relation ``tensor_values`` reads: the session's verified native snapshot files, by dtype."""
        rows = self.con.execute(
            f"SELECT sha256, dtype, file_sha256, identity FROM {scoped_catalog(self.run_id)} "
            "WHERE layout = 'native' ORDER BY dtype, sha256"
        ).fetchall()
        snapshots = self.readmodel.store.location.snapshots
        self.left_out = changed_files(snapshots, [(str(r[0]), str(r[2]), list(r[3])) for r in rows])
        rejected = f"SELECT sha256, problem FROM {tables.SCHEMA}.rejected_blobs"
        params: list[str] = []
        if self.run_id is not None:
            rejected += (
                f" WHERE sha256 IN (SELECT sha256 FROM {tables.SCHEMA}.snapshots WHERE run_id = ?)"
            )
            params.append(self.run_id)
        for sha, problem in self.con.execute(rejected, params).fetchall():
            self.left_out[str(sha)] = str(problem)
        files: dict[str, list[str]] = {}
        for sha, dtype, _digest, _identity in rows:
            if str(sha) not in self.left_out:
                files.setdefault(str(dtype), []).append(f"{str(sha)[:2]}/{sha}.parquet")
        return snapshot_values_sql(str(snapshots), files)

    def _load_liveness(self) -> None:
        """Runs from their chained ``run_started`` (lowest stream), status derived now from
        every stream (``auditlog.core.liveness.run_liveness``, as ``auditlog runs``).

        Name, start, host and pid come from the chain; the runs index gives
        only liveness (heartbeat, process start time), which status needs.
        """
        payloads: dict[str, dict[str, dict[int, dict[str, Any]]]] = {
            "run_started": {},
            "run_ended": {},
        }
        for table_name, found in payloads.items():
            for run_id, stream, payload in self.con.execute(
                f"SELECT run_id, stream, payload FROM projection.{table_name}"
            ).fetchall():
                found.setdefault(str(run_id), {})[int(stream)] = _object(payload)
        started = self.con.execute(
            """SELECT s.run_id, s.ts_ns FROM projection.run_started s
               QUALIFY row_number() OVER (PARTITION BY s.run_id ORDER BY s.stream, s.seq) = 1
               ORDER BY s.ts_ns"""
        ).fetchall()
        index = {str(r["run_id"]): r for r in self.readmodel.store.run_rows()}
        rows = []
        live = []
        for run_id, ts_ns in started:
            begun = payloads["run_started"].get(run_id, {})
            first = begun[min(begun)] if begun else {}
            indexed = index.get(run_id) or {}
            seen = indexed.get("last_seen_ns")
            pid = first.get("pid")
            facts = {
                "host": str(first.get("host") or ""),
                "pid": pid if isinstance(pid, int) else 0,
                "proc_start": indexed.get("proc_start"),
                "last_seen_ns": seen if isinstance(seen, int) else int(ts_ns),
            }
            name = first.get("name")
            rows.append(
                {
                    "run_id": run_id,
                    "name": name if isinstance(name, str) else None,
                    "started_ns": int(ts_ns),
                    **facts,
                }
            )
            live.append(run_liveness(facts, begun, payloads["run_ended"].get(run_id, {})))
        # Handed to DuckDB as one list per column: a pyarrow table built from Python
        # lists makes pyarrow import pandas, which cost more than the rest of the session.
        self.con.execute(
            f"""CREATE TEMP TABLE {RUNS_LIVE} AS SELECT
                   unnest($1::VARCHAR[]) AS run_id, unnest($2::VARCHAR[]) AS name,
                   unnest($3::BIGINT[]) AS started_ns, unnest($4::BIGINT[]) AS last_seen_ns,
                   unnest($5::VARCHAR[]) AS host, unnest($6::INTEGER[]) AS pid,
                   unnest($7::VARCHAR[]) AS status, unnest($8::VARCHAR[]) AS status_detail""",
            [
                [r["run_id"] for r in rows],
                [r["name"] for r in rows],
                [r["started_ns"] for r in rows],
                [r["last_seen_ns"] for r in rows],
                [r["host"] for r in rows],
                [r["pid"] for r in rows],
                [s.status for s in live],
                [s.detail for s in live],
            ],
        )

    # ------------------------------------------------------------------ use
    def execute(self, sql: str, timeout: float | None = None) -> QueryResult:
        """Run one read-only statement; DuckDB errors become one-line ``QueryError``.

        DuckDB does not look at Python's signals while it works, so the statement
        runs (and each batch of rows is fetched) in a worker thread while this one
        waits: Ctrl-C (``KeyboardInterrupt``) or the end of ``timeout`` seconds
        cancels it with DuckDB's ``interrupt()``. Rows are fetched as they are read.
        """
        statement = check_read_only(self.con, sql)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            cursor = self._watched(lambda: self.con.execute(statement), deadline, timeout)
        except duckdb.PermissionException as exc:
            raise QueryError(
                f"{one_line(exc)} (queries read the record's views, no other files)"
            ) from exc
        except duckdb.Error as exc:
            raise QueryError(one_line(exc)) from exc
        description = cursor.description or []
        columns = [str(d[0]) for d in description]
        types = [str(d[1]) for d in description]

        def rows() -> Iterator[tuple[Any, ...]]:
            while True:
                try:
                    batch = self._watched(lambda: cursor.fetchmany(2048), deadline, timeout)
                except duckdb.Error as exc:
                    raise QueryError(one_line(exc)) from exc
                if not batch:
                    return
                yield from batch

        return QueryResult(columns, types, rows())

    def _watched(self, work: Callable[[], _T], deadline: float | None, timeout: float | None) -> _T:
        """``work()`` in a worker thread, cancelled by Ctrl-C or the deadline.

        The wait is on an ``Event``, not ``Thread.join``: a join interrupted by
        Ctrl-C can afterwards report a running thread as finished (CPython < 3.13).
        """
        done: list[_T] = []
        failed: list[BaseException] = []
        finished = threading.Event()

        def run() -> None:
            try:
                done.append(work())
            except BaseException as exc:  # handed to the waiting thread
                failed.append(exc)
            finally:
                finished.set()

        threading.Thread(target=run, name="auditlog-query", daemon=True).start()
        try:
            while not finished.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._cancel(finished)
                    raise QueryTimeoutError(
                        f"query cancelled: it ran past its time limit of {timeout:g} s"
                    )
                finished.wait(0.1 if left is None else min(0.1, left))
        except KeyboardInterrupt:
            self._cancel(finished)
            raise
        if failed:
            raise failed[0]
        return done[0]

    def _cancel(self, finished: threading.Event) -> None:
        """Interrupt DuckDB and wait until the worker has let go of the connection."""
        while not finished.is_set():
            self.con.interrupt()
            finished.wait(0.1)

    def close(self) -> None:
        self._resources.close()

    def __enter__(self) -> QuerySession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
