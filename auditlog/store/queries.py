"""Every question the rest of auditlog asks the event store, each written once.

``EventQueries`` is the reading half of ``EventStore`` (it needs only the
store's ``reads`` and ``guard``). Readers never write SQL: the integrity check,
replay, restore and diff all come here. Each question is SQL text with named
parameters, run as it is by ``sqlite3`` on a SQLite file and by SQLAlchemy on
PostgreSQL (``sqlread``): one definition of each, and a read command on a
SQLite store never imports SQLAlchemy. Questions about one stream always filter
by stream, so the ranks of a run never mix.

Rows come back as plain dicts exactly as stored: the store is a file someone may
have edited, and deciding what a garbled value means is the caller's job
(``rows.decode_event`` for readers, ``integrity.verify`` for verification).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from auditlog.core.errors import StoreError
from auditlog.core.eventrow import ALL_COLUMNS, STREAM_COLUMNS
from auditlog.core.hashing import is_content_hash
from auditlog.store.sqlread import ReadConnection, Reads, in_list

# The columns of each table, in the order of its definition (events: ``core.eventrow``;
# the others: ``schema.py``, and a test checks that the two agree). Questions name
# their columns: a crafted store may carry columns of its own, which no reader sees.
EVENT_FIELDS = ALL_COLUMNS
RUN_FIELDS = ("run_id", "name", "started_ns", "host", "pid", "proc_start", "last_seen_ns")
CHECKPOINT_FIELDS = (
    "id",
    "run_id",
    "stream",
    "seq",
    "head_hash",
    "created_ns",
    "key_fingerprint",
    "signature",
    "format",
    "tree_root",
    "ended",
    "world_size",
)
BLOB_FIELDS = (
    "sha256",
    "file",
    "dtype",
    "shape",
    "numel",
    "nbytes",
    "layout",
    "row_groups",
    "file_sha256",
    "created_ns",
)

# The columns ``event_tuples`` returns, in order (``core.eventrow``: a stream's rows).
TUPLE_COLUMNS = STREAM_COLUMNS


def _columns(fields: Sequence[str], table: str = "") -> str:
    return ", ".join(f"{table}{f}" for f in fields)


_EVENTS = _columns(EVENT_FIELDS)
# (stream, seq) order for rows found by kind, as expressions no index provides, so
# that the planner looks them up by kind and sorts them rather than walk the run.
_BY_KIND_ORDER = "stream + 0, seq + 0, id"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class EventQueries:
    """Read-only questions over the ``events``, ``runs``, ``checkpoints`` and catalog tables."""

    reads: Reads

    def guard(
        self, doing: str
    ) -> contextlib.AbstractContextManager[None]:  # provided by EventStore
        raise NotImplementedError

    @contextlib.contextmanager
    def reading(self, doing: str) -> Iterator[ReadConnection]:
        """A read connection for one question; driver errors become ``StoreError`` (``guard``)."""
        with self.guard(doing), self.reads.connection() as conn:
            yield conn

    def _rows(
        self, doing: str, sql: str, params: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        with self.reading(doing) as conn:
            return conn.rows(sql, params)

    def _dicts(
        self,
        doing: str,
        sql: str,
        fields: Sequence[str],
        params: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        return [dict(zip(fields, row, strict=True)) for row in self._rows(doing, sql, params)]

    def _scalar(self, doing: str, sql: str, params: dict[str, Any] | None = None) -> Any:
        rows = self._rows(doing, sql, params)
        return rows[0][0] if rows else None

    # ------------------------------------------------------------------ store
    def meta(self) -> dict[str, str]:
        """The store's identity and provenance (``auditlog_meta``: format, store_id, created_...)."""
        return {
            r[0]: r[1]
            for r in self._rows("reading store metadata", "SELECT key, value FROM auditlog_meta")
        }

    def check_file(self, shown: str) -> None:
        """Raise ``StoreError`` when SQLite finds the database file damaged (other dialects: nothing).

        ``PRAGMA integrity_check`` reads every page and checks that each index
        matches its table; it changes nothing. A byte garbled inside the file can
        make the table and its index disagree, and then what a query returns
        depends on the access path: the chain could verify through the index
        while other readers see different values.
        """
        if self.reads.dialect != "sqlite":
            return
        messages = [
            str(r[0])
            for r in self._rows("checking the database file", "PRAGMA integrity_check(10)")
        ]
        if messages != ["ok"]:
            raise StoreError(
                f"store {shown!r} is corrupt (SQLite integrity_check: "
                f"{messages[0] if messages else 'no answer'}); its events cannot be trusted"
            )

    def max_event_id(self) -> int:
        """The highest event ``id`` in the store (0 when empty)."""
        value = self._scalar("reading the newest event id", "SELECT max(id) FROM events")
        return 0 if value is None else int(value)

    def event_hash(self, event_id: int) -> str | None:
        """The chain hash of the event with this ``id``, or None if there is none."""
        value = self._scalar(
            "reading an event hash", "SELECT hash FROM events WHERE id = :id", {"id": event_id}
        )
        return None if value is None else str(value)

    # ------------------------------------------------------------------ runs
    def run_rows(self) -> list[dict[str, Any]]:
        """All rows of the runs index, oldest first."""
        sql = f"SELECT {_columns(RUN_FIELDS)} FROM runs ORDER BY started_ns"
        return self._dicts("listing runs", sql, RUN_FIELDS)

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        """One run's row of the runs index (liveness and its copy of chained facts), or None."""
        sql = f"SELECT {_columns(RUN_FIELDS)} FROM runs WHERE run_id = :run_id"
        rows = self._dicts("reading the runs index", sql, RUN_FIELDS, {"run_id": run_id})
        return rows[0] if rows else None

    def run_started_event(self, run_id: str) -> dict[str, Any] | None:
        """The run's first ``run_started`` event (lowest stream), exactly as stored."""
        sql = (
            f"SELECT {_EVENTS} FROM events WHERE run_id = :run_id AND kind = 'run_started' "
            "ORDER BY stream, seq LIMIT 1"
        )
        rows = self._dicts("reading run_started", sql, EVENT_FIELDS, {"run_id": run_id})
        return rows[0] if rows else None

    def has_run_row(self, run_id: str) -> bool:
        """Does the runs index have this run's row? (The library never deletes one.)"""
        sql = "SELECT run_id FROM runs WHERE run_id = :run_id"
        return bool(self._rows("reading the runs index", sql, {"run_id": run_id}))

    def recorded_run_ids(self) -> list[str]:
        """Every run id with events, whether or not the runs index still lists it."""
        rows = self._rows("listing runs", "SELECT DISTINCT run_id FROM events")
        return sorted(str(r[0]) for r in rows if isinstance(r[0], str))

    def run_event_counts(self) -> dict[str, tuple[int, int | None]]:
        """``run_id -> (number of events, highest step)``."""
        rows = self._rows(
            "counting events", "SELECT run_id, count(*), max(step) FROM events GROUP BY run_id"
        )
        return {r[0]: (int(r[1]), _int_or_none(r[2])) for r in rows}

    def run_first_times(self) -> dict[str, int]:
        """``run_id -> earliest ts_ns`` of its events (runs whose run_started is gone still sort)."""
        rows = self._rows("reading runs", "SELECT run_id, min(ts_ns) FROM events GROUP BY run_id")
        return {r[0]: int(r[1]) for r in rows if isinstance(r[0], str) and isinstance(r[1], int)}

    def last_activity_ns(self) -> dict[str, int]:
        """``run_id -> time of its newest event other than run_ended`` (when a crashed run
        was last seen doing something; its ``run_ended`` is written later, by whoever noticed)."""
        sql = "SELECT run_id, max(ts_ns) FROM events WHERE kind != 'run_ended' GROUP BY run_id"
        found = {str(r[0]): _int_or_none(r[1]) for r in self._rows("reading event times", sql)}
        return {
            run_id: ns for run_id, ns in found.items() if ns is not None
        }  # damaged rows: verify's to name

    def events_of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every event of one kind across runs (run_started/run_ended summaries)."""
        sql = f"SELECT {_EVENTS} FROM events WHERE kind = :kind ORDER BY id"
        return self._dicts(f"reading {kind} events", sql, EVENT_FIELDS, {"kind": kind})

    def ended_streams(self) -> set[tuple[str, int]]:
        """``(run_id, stream)`` pairs that have a ``run_ended`` event."""
        rows = self._rows(
            "reading run ends", "SELECT run_id, stream FROM events WHERE kind = 'run_ended'"
        )
        return {(str(r[0]), int(r[1])) for r in rows}

    # ------------------------------------------------------------------ streams
    def streams(self, run_id: str) -> list[int]:
        """The stream numbers (ranks) a run has events in."""
        rows = self._rows(
            "listing streams",
            "SELECT DISTINCT stream FROM events WHERE run_id = :run_id",
            {"run_id": run_id},
        )
        # A garbled stream value (not a number) is not a stream: verify names it.
        return sorted(int(r[0]) for r in rows if _int_or_none(r[0]) is not None)

    def stream_event_counts(self, run_id: str) -> list[tuple[Any, int]]:
        """``(stream value as stored, events)`` per stream: verify reports a garbled stream value."""
        sql = "SELECT stream, count(*) FROM events WHERE run_id = :run_id GROUP BY stream"
        return [(r[0], int(r[1])) for r in self._rows("listing streams", sql, {"run_id": run_id})]

    def chain_head(self, run_id: str, stream: int) -> tuple[int, str] | None:
        """The last ``(seq, hash)`` of a stream, used to append to an existing stream."""
        sql = "SELECT seq, hash FROM events WHERE run_id = :run_id AND stream = :stream ORDER BY seq DESC LIMIT 1"
        rows = self._rows("reading the chain head", sql, {"run_id": run_id, "stream": stream})
        return None if not rows else (int(rows[0][0]), str(rows[0][1]))

    def first_event(self, run_id: str, stream: int) -> dict[str, Any] | None:
        """The stream's first event (seq 1, the lowest id), as stored: its chain format
        is the one it links under (``core.chain.first_event_format``)."""
        sql = (
            f"SELECT {_EVENTS} FROM events WHERE run_id = :run_id AND stream = :stream "
            "AND seq = 1 ORDER BY id LIMIT 1"
        )
        rows = self._dicts(
            "reading a stream's first event",
            sql,
            EVENT_FIELDS,
            {"run_id": run_id, "stream": stream},
        )
        return rows[0] if rows else None

    def stream_head_hashes(
        self, heads: Sequence[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], str]:
        """``(run_id, stream, seq) -> stored hash`` for each event named (absent when gone)."""
        out: dict[tuple[str, int, int], str] = {}
        wanted = list(heads)
        with self.reading("reading chain heads") as conn:
            for start in range(0, len(wanted), 300):
                part = wanted[start : start + 300]
                params: dict[str, Any] = {}
                keys = []
                for i, (run_id, stream, seq) in enumerate(part):
                    params.update({f"r{i}": run_id, f"s{i}": stream, f"q{i}": seq})
                    keys.append(f"(:r{i}, :s{i}, :q{i})")
                sql = f"SELECT run_id, stream, seq, hash FROM events WHERE (run_id, stream, seq) IN ({', '.join(keys)})"
                out.update(
                    {(str(r[0]), int(r[1]), int(r[2])): str(r[3]) for r in conn.rows(sql, params)}
                )
        return out

    def last_seq(self, run_id: str, stream: int) -> int | None:
        """The highest seq stored in a stream (None when empty or garbled)."""
        sql = "SELECT max(seq) FROM events WHERE run_id = :run_id AND stream = :stream"
        return _int_or_none(
            self._scalar("reading the chain head", sql, {"run_id": run_id, "stream": stream})
        )

    def hashes_between(self, run_id: str, stream: int, low: int, high: int) -> dict[int, str]:
        """``seq -> stored hash`` for ``low <= seq <= high`` of a stream."""
        sql = (
            "SELECT seq, hash FROM events WHERE run_id = :run_id AND stream = :stream "
            "AND seq >= :low AND seq <= :high"
        )
        rows = self._rows(
            "verifying", sql, {"run_id": run_id, "stream": stream, "low": low, "high": high}
        )
        return {int(r[0]): str(r[1]) for r in rows}

    def iter_events(
        self,
        run_id: str,
        *,
        kinds: Sequence[str] | None = None,
        stream: int | None = None,
        step_range: tuple[int | None, int | None] | None = None,
        batch: int = 5000,
        rare: bool = False,
        prev_hash: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Events of a run in (stream, seq) order, streamed in batches.

        ``rare``: the ``kinds`` asked for are few in the run (``run_started``,
        snapshots): they are found through the (run, kind) index and sorted,
        where SQLite would otherwise walk every event of the run in seq order
        to save that sort (slow on a long run: docs/performance.md).
        ``prev_hash``: each row also has ``prev_hash``, the stored hash of the
        event before it in its stream (seq - 1; None when there is none), one
        lookup in the (run, stream, seq) index, so that filtered rows can be
        checked against the chain (``auditlog events``).
        """
        columns = _columns(EVENT_FIELDS, "events.")
        if prev_hash:
            columns += (
                ", (SELECT prior.hash FROM events AS prior WHERE prior.run_id = events.run_id"
                " AND prior.stream = events.stream AND prior.seq = events.seq - 1 LIMIT 1) AS prev_hash"
            )
        where = ["events.run_id = :run_id"]
        params: dict[str, Any] = {"run_id": run_id}
        if kinds:
            listed, kind_params = in_list("kind", list(kinds))
            where.append(f"events.kind IN {listed}")
            params.update(kind_params)
        if stream is not None:
            where.append("events.stream = :stream")
            params["stream"] = stream
        if step_range is not None:
            low, high = step_range
            if low is not None:
                where.append("events.step >= :low")
                params["low"] = low
            if high is not None:
                where.append("events.step <= :high")
                params["high"] = high
        order = (
            "events.stream + 0, events.seq + 0, events.id"
            if rare and kinds
            else "events.stream, events.seq"
        )
        sql = f"SELECT {columns} FROM events WHERE {' AND '.join(where)} ORDER BY {order}"
        with self.reading("reading events") as conn:
            keys, parts = conn.batches(sql, params, batch)
            for part in parts:
                for row in part:  # zip over rows (tuples): cheaper than row objects -> dict
                    yield dict(zip(keys, row, strict=True))

    def event_tuples(
        self,
        run_id: str,
        stream: int,
        batch: int = 20_000,
        *,
        upto: int | None = None,
        after: int | None = None,
        resume: tuple[int, int] | None = None,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """One stream's events in (seq, id) order as the driver returns them: batches of
        plain tuples of ``TUPLE_COLUMNS`` (``verify`` reads a million); only those with
        ``seq <= upto`` (or no number there) or only those with ``seq > after`` when given.

        ``run_id`` and ``stream`` are not read: every row selected holds exactly
        the values asked for (a garbled value there, a blob or a text stream, is
        not equal to them, so that row is another stream's or none's).

        No row objects, no dicts, values exactly as stored; other databases than
        SQLite stream through server-side cursors.
        """
        sql, params = _tuple_query(run_id, stream, upto=upto, after=after, resume=resume)
        with self.reading("verifying") as conn:
            _keys, parts = conn.batches(sql, params, batch)
            yield from parts

    def count_events(self, run_id: str, kinds: Sequence[str], stream: int = 0) -> int:
        """How many events of these kinds one stream of a run has (uses the (run, kind) index)."""
        listed, params = in_list("kind", list(kinds))
        sql = f"SELECT count(*) FROM events WHERE run_id = :run_id AND stream = :stream AND kind IN {listed}"
        return int(
            self._scalar("counting events", sql, {"run_id": run_id, "stream": stream, **params})
            or 0
        )

    def snapshot_references(self, run_id: str) -> list[tuple[Any, Any, Any, Any]]:
        """``(seq, event id, kind, payload text)`` of every event that names stored tensor values."""
        sql = (
            "SELECT seq, id, kind, payload FROM events WHERE run_id = :run_id "
            f"AND kind IN ('snapshot_taken', 'construction_sealed') ORDER BY {_BY_KIND_ORDER}"
        )
        return [
            (r[0], r[1], r[2], r[3])
            for r in self._rows("reading snapshot events", sql, {"run_id": run_id})
        ]

    # ------------------------------------------------------------------ steps
    def max_step(self, run_id: str, stream: int) -> int | None:
        """The highest optimizer step recorded in a stream."""
        sql = "SELECT max(step) FROM events WHERE run_id = :run_id AND stream = :stream"
        value = self._scalar("reading steps", sql, {"run_id": run_id, "stream": stream})
        return None if value is None else int(value)

    def step_seq(self, run_id: str, stream: int, step: int) -> int | None:
        """The seq of the ``optimizer_step`` event that ended step ``step`` in a stream."""
        sql = (
            "SELECT seq FROM events WHERE run_id = :run_id AND stream = :stream "
            "AND kind = 'optimizer_step' AND step = :step"
        )
        found = self._scalar(
            "finding a step", sql, {"run_id": run_id, "stream": stream, "step": step}
        )
        return None if found is None else int(found)

    def step_seqs(self, run_id: str, stream: int) -> dict[int, int]:
        """``step -> seq`` of every ``optimizer_step`` event of a stream."""
        sql = "SELECT step, seq FROM events WHERE run_id = :run_id AND stream = :stream AND kind = 'optimizer_step'"
        rows = self._rows("finding steps", sql, {"run_id": run_id, "stream": stream})
        return {int(step): int(seq) for step, seq in rows if step is not None}

    def first_seq_from_step(self, run_id: str, stream: int, step: int) -> int | None:
        """The first seq of a stream whose event happened at step ``step`` or later."""
        sql = "SELECT min(seq) FROM events WHERE run_id = :run_id AND stream = :stream AND step >= :step"
        return _int_or_none(
            self._scalar("finding a step", sql, {"run_id": run_id, "stream": stream, "step": step})
        )

    # ------------------------------------------------------------------ snapshot catalog
    def has_blob(self, sha256: str) -> bool:
        """Is this tensor content in the snapshot catalog?"""
        sql = "SELECT sha256 FROM snapshot_blobs WHERE sha256 = :sha256"
        return bool(self._rows("reading the snapshot catalog", sql, {"sha256": sha256}))

    def blobs_among(self, hashes: Sequence[str]) -> set[str]:
        """Which of ``hashes`` are in the snapshot catalog (one query per 500)."""
        found: set[str] = set()
        wanted = [h for h in hashes if is_content_hash(h)]
        with self.reading("reading the snapshot catalog") as conn:
            for start in range(0, len(wanted), 500):
                listed, params = in_list("h", wanted[start : start + 500])
                found.update(
                    r[0]
                    for r in conn.rows(
                        f"SELECT sha256 FROM snapshot_blobs WHERE sha256 IN {listed}", params
                    )
                )
        return found

    def blob_rows(self, hashes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Catalog rows by hash (all of them when ``hashes`` is None). Only content hashes
        are looked up: a crafted value (a NUL byte PostgreSQL refuses, an object) has
        no catalog row, and its event is the finding (``integrity.snapshots``)."""
        sql = f"SELECT {_columns(BLOB_FIELDS)} FROM snapshot_blobs"
        params: dict[str, Any] = {}
        if hashes is not None:
            listed, params = in_list("h", [h for h in hashes if is_content_hash(h)])
            sql += f" WHERE sha256 IN {listed}"
        rows = self._dicts("reading the snapshot catalog", sql, BLOB_FIELDS, params)
        return {r["sha256"]: r for r in rows}

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_rows(self, run_id: str) -> list[dict[str, Any]]:
        """The stored rows of a run's signed checkpoints, oldest first, exactly as stored."""
        sql = f"SELECT {_columns(CHECKPOINT_FIELDS)} FROM checkpoints WHERE run_id = :run_id ORDER BY id"
        return self._dicts("reading checkpoints", sql, CHECKPOINT_FIELDS, {"run_id": run_id})

    def checkpointed_run_ids(self) -> list[str]:
        """Every run id that has checkpoints (``verify all`` also checks runs whose events are gone)."""
        rows = self._rows("reading checkpoints", "SELECT DISTINCT run_id FROM checkpoints")
        return sorted(str(r[0]) for r in rows)


def _tuple_query(
    run_id: str,
    stream: int,
    *,
    upto: int | None = None,
    since: int | None = None,
    after: int | None = None,
    resume: tuple[int, int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The select of ``EventQueries.event_tuples``: ``TUPLE_COLUMNS`` of one stream in
    (seq, id) order (id breaks ties, so that two reads of a stream agree row for row)."""
    where = ["run_id = :run_id", "stream = :stream"]
    params: dict[str, Any] = {"run_id": run_id, "stream": stream}
    if upto is not None:  # a seq that is no number (NULL) sorts first: it belongs to the head
        where.append("(seq IS NULL OR seq <= :upto)")
        params["upto"] = upto
    if since is not None:
        where.append("seq >= :since")
        params["since"] = since
    if after is not None:
        where.append("seq > :after")
        params["after"] = after
    if resume is not None:  # the rows after (seq, id) in (seq, id) order
        where.append("(seq > :resume_seq OR (seq = :resume_seq AND id > :resume_id))")
        params.update(resume_seq=resume[0], resume_id=resume[1])
    return (
        f"SELECT {_columns(TUPLE_COLUMNS)} FROM events WHERE {' AND '.join(where)} ORDER BY seq, id",
        params,
    )


def sqlite_tuple_statement(run_id: str, stream: int, since: int) -> tuple[str, dict[str, Any]]:
    """The SQL text and parameters of ``event_tuples`` for the rows with ``seq >= since``
    (made here, before a fork: the child then needs only ``sqlite3``)."""
    return _tuple_query(run_id, stream, since=since)


def sqlite_event_tuples(
    uri: str, statement: tuple[str, dict[str, Any]], batch: int = 20_000
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``statement`` (``sqlite_tuple_statement``) in batches, on a connection of
    its own to the SQLite file at ``uri`` (read-only): what a process forked to check part of
    a stream reads (``integrity.parallel``); it must not touch its parent's connections."""
    import sqlite3

    connection = sqlite3.connect(uri, uri=True)
    try:
        cursor = connection.execute(*statement)
        while rows := cursor.fetchmany(batch):
            yield rows
    finally:
        connection.close()
