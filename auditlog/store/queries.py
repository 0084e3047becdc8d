"""Every question the rest of auditlog asks the event store, each written once.

``EventQueries`` is the reading half of ``EventStore`` (it needs only the
store's ``engine`` and ``guard``). Readers never write SQL: the integrity check,
replay, restore and diff all come here. Questions about one stream always filter
by stream, so the ranks of a run never mix.

Rows come back as plain dicts exactly as stored: the store is a file someone may
have edited, and deciding what a garbled value means is the caller's job
(``rows.decode_event`` for readers, ``integrity.verify`` for verification).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select, tuple_
from sqlalchemy.exc import DBAPIError

from auditlog.core.errors import StoreError
from auditlog.core.eventrow import STREAM_COLUMNS
from auditlog.core.hashing import is_content_hash
from auditlog.store import schema

_ev = schema.events


# The columns ``event_tuples`` returns, in order (``core.eventrow``: a stream's rows).
TUPLE_COLUMNS = STREAM_COLUMNS


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class EventQueries:
    """Read-only questions over the ``events``, ``runs``, ``checkpoints`` and catalog tables."""

    engine: Engine

    def guard(self, doing: str) -> contextlib.AbstractContextManager[None]:  # provided by EventStore
        raise NotImplementedError

    # ------------------------------------------------------------------ store
    def meta(self) -> dict[str, str]:
        """The store's identity and provenance (``auditlog_meta``: format, store_id, created_...)."""
        with self.guard("reading store metadata"), self.engine.connect() as conn:
            return {r[0]: r[1] for r in conn.execute(select(schema.auditlog_meta))}

    def check_file(self, shown: str) -> None:
        """Raise ``StoreError`` when SQLite finds the database file damaged (other dialects: nothing).

        ``PRAGMA integrity_check`` reads every page and checks that each index
        matches its table; it changes nothing. A byte garbled inside the file can
        make the table and its index disagree, and then what a query returns
        depends on the access path: the chain could verify through the index
        while other readers see different values.
        """
        if self.engine.dialect.name != "sqlite":
            return
        with self.guard("checking the database file"), self.engine.connect() as conn:
            messages = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA integrity_check(10)")]
        if messages != ["ok"]:
            raise StoreError(
                f"store {shown!r} is corrupt (SQLite integrity_check: "
                f"{messages[0] if messages else 'no answer'}); its events cannot be trusted"
            )

    # ------------------------------------------------------------------ runs
    def run_rows(self) -> list[dict[str, Any]]:
        """All rows of the runs index, oldest first."""
        with self.guard("listing runs"), self.engine.connect() as conn:
            rows = conn.execute(select(schema.runs).order_by(schema.runs.c.started_ns)).mappings()
            return [dict(r) for r in rows]

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        """One run's row of the runs index (liveness and its copy of chained facts), or None."""
        runs = schema.runs
        with self.guard("reading the runs index"), self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().first()
        return None if row is None else dict(row)

    def run_started_event(self, run_id: str) -> dict[str, Any] | None:
        """The run's first ``run_started`` event (lowest stream), exactly as stored."""
        with self.guard("reading run_started"), self.engine.connect() as conn:
            row = conn.execute(
                select(_ev).where(_ev.c.run_id == run_id, _ev.c.kind == "run_started")
                .order_by(_ev.c.stream, _ev.c.seq).limit(1)
            ).mappings().first()
        return None if row is None else dict(row)

    def has_run_row(self, run_id: str) -> bool:
        """Does the runs index have this run's row? (The library never deletes one.)"""
        runs = schema.runs
        with self.guard("reading the runs index"), self.engine.connect() as conn:
            return conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first() is not None

    def recorded_run_ids(self) -> list[str]:
        """Every run id with events, whether or not the runs index still lists it."""
        with self.guard("listing runs"), self.engine.connect() as conn:
            rows = conn.execute(select(_ev.c.run_id).distinct())
            return sorted(str(r[0]) for r in rows if isinstance(r[0], str))

    def run_event_counts(self) -> dict[str, tuple[int, int | None]]:
        """``run_id -> (number of events, highest step)``."""
        with self.guard("counting events"), self.engine.connect() as conn:
            rows = conn.execute(
                select(_ev.c.run_id, func.count(), func.max(_ev.c.step)).group_by(_ev.c.run_id)
            )
            return {r[0]: (int(r[1]), _int_or_none(r[2])) for r in rows}

    def run_first_times(self) -> dict[str, int]:
        """``run_id -> earliest ts_ns`` of its events (runs whose run_started is gone still sort)."""
        with self.guard("reading runs"), self.engine.connect() as conn:
            rows = conn.execute(select(_ev.c.run_id, func.min(_ev.c.ts_ns)).group_by(_ev.c.run_id))
            return {r[0]: int(r[1]) for r in rows if isinstance(r[0], str) and isinstance(r[1], int)}
    def last_activity_ns(self) -> dict[str, int]:
        """``run_id -> time of its newest event other than run_ended`` (when a crashed run
        was last seen doing something; its ``run_ended`` is written later, by whoever noticed)."""
        with self.guard("reading event times"), self.engine.connect() as conn:
            rows = conn.execute(
                select(_ev.c.run_id, func.max(_ev.c.ts_ns)).where(_ev.c.kind != "run_ended").group_by(_ev.c.run_id)
            )
            found = {str(r[0]): _int_or_none(r[1]) for r in rows}
            return {run_id: ns for run_id, ns in found.items() if ns is not None}  # damaged rows: verify's to name

    def events_of_kind(self, kind: str) -> list[dict[str, Any]]:
        """Every event of one kind across runs (run_started/run_ended summaries)."""
        with self.guard(f"reading {kind} events"), self.engine.connect() as conn:
            rows = conn.execute(select(_ev).where(_ev.c.kind == kind).order_by(_ev.c.id)).mappings()
            return [dict(r) for r in rows]

    def ended_streams(self) -> set[tuple[str, int]]:
        """``(run_id, stream)`` pairs that have a ``run_ended`` event."""
        with self.guard("reading run ends"), self.engine.connect() as conn:
            rows = conn.execute(select(_ev.c.run_id, _ev.c.stream).where(_ev.c.kind == "run_ended"))
            return {(str(r[0]), int(r[1])) for r in rows}

    # ------------------------------------------------------------------ streams
    def streams(self, run_id: str) -> list[int]:
        """The stream numbers (ranks) a run has events in."""
        with self.guard("listing streams"), self.engine.connect() as conn:
            rows = conn.execute(select(_ev.c.stream).where(_ev.c.run_id == run_id).distinct())
            # A garbled stream value (not a number) is not a stream: verify names it.
            return sorted(int(r[0]) for r in rows if _int_or_none(r[0]) is not None)

    def stream_event_counts(self, run_id: str) -> list[tuple[Any, int]]:
        """``(stream value as stored, events)`` per stream: verify reports a garbled stream value."""
        with self.guard("listing streams"), self.engine.connect() as conn:
            rows = conn.execute(
                select(_ev.c.stream, func.count()).where(_ev.c.run_id == run_id).group_by(_ev.c.stream)
            ).all()
        return [(r[0], int(r[1])) for r in rows]

    def chain_head(self, run_id: str, stream: int) -> tuple[int, str] | None:
        """The last ``(seq, hash)`` of a stream, used to append to an existing stream."""
        with self.guard("reading the chain head"), self.engine.connect() as conn:
            row = conn.execute(
                select(_ev.c.seq, _ev.c.hash)
                .where(_ev.c.run_id == run_id, _ev.c.stream == stream)
                .order_by(_ev.c.seq.desc())
                .limit(1)
            ).first()
        return None if row is None else (int(row[0]), str(row[1]))

    def stream_head_hashes(self, heads: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int, int], str]:
        """``(run_id, stream, seq) -> stored hash`` for each event named (absent when gone)."""
        out: dict[tuple[str, int, int], str] = {}
        wanted = list(heads)
        with self.guard("reading chain heads"), self.engine.connect() as conn:
            for start in range(0, len(wanted), 300):
                part = wanted[start : start + 300]
                rows = conn.execute(
                    select(_ev.c.run_id, _ev.c.stream, _ev.c.seq, _ev.c.hash).where(
                        tuple_(_ev.c.run_id, _ev.c.stream, _ev.c.seq).in_(part)
                    )
                )
                out.update({(str(r[0]), int(r[1]), int(r[2])): str(r[3]) for r in rows})
        return out

    def last_seq(self, run_id: str, stream: int) -> int | None:
        """The highest seq stored in a stream (None when empty or garbled)."""
        with self.guard("reading the chain head"), self.engine.connect() as conn:
            value = conn.execute(
                select(func.max(_ev.c.seq)).where(_ev.c.run_id == run_id, _ev.c.stream == stream)
            ).scalar()
        return _int_or_none(value)

    def hashes_between(self, run_id: str, stream: int, low: int, high: int) -> dict[int, str]:
        """``seq -> stored hash`` for ``low <= seq <= high`` of a stream."""
        with self.guard("verifying"), self.engine.connect() as conn:
            rows = conn.execute(
                select(_ev.c.seq, _ev.c.hash).where(
                    _ev.c.run_id == run_id, _ev.c.stream == stream, _ev.c.seq >= low, _ev.c.seq <= high
                )
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
        to save that sort (0.15 s a question on a million events).
        ``prev_hash``: each row also has ``prev_hash``, the stored hash of the
        event before it in its stream (seq - 1; None when there is none), one
        lookup in the (run, stream, seq) index, so that filtered rows can be
        checked against the chain (``auditlog events``).
        """
        columns: list[Any] = [_ev]
        if prev_hash:
            before = _ev.alias("before")
            columns.append(
                select(before.c.hash)
                .where(before.c.run_id == _ev.c.run_id, before.c.stream == _ev.c.stream,
                       before.c.seq == _ev.c.seq - 1)
                .limit(1)
                .scalar_subquery()
                .label("prev_hash")
            )
        query = select(*columns).where(_ev.c.run_id == run_id)
        if kinds:
            query = query.where(_ev.c.kind.in_(list(kinds)))
        if stream is not None:
            query = query.where(_ev.c.stream == stream)
        if step_range is not None:
            low, high = step_range
            if low is not None:
                query = query.where(_ev.c.step >= low)
            if high is not None:
                query = query.where(_ev.c.step <= high)
        query = query.order_by(*_sorted_after(rare and bool(kinds)))
        with self.guard("reading events"), self.engine.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=batch).execute(query)
            keys = list(result.keys())
            for row in result:  # zip over rows (tuple-like): ~2x cheaper than RowMapping -> dict
                yield dict(zip(keys, row, strict=True))

    def event_tuples(
        self, run_id: str, stream: int, batch: int = 20_000, *, upto: int | None = None,
        after: int | None = None, resume: tuple[int, int] | None = None,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """One stream's events in (seq, id) order as the driver returns them: batches of
        plain tuples of ``TUPLE_COLUMNS`` (``verify`` reads a million); only those with
        ``seq <= upto`` (or no number there) or only those with ``seq > after`` when given.

        ``run_id`` and ``stream`` are not read: every row selected holds exactly
        the values asked for (a garbled value there, a blob or a text stream, is
        not equal to them, so that row is another stream's or none's).

        SQLite is read through the raw DB-API cursor of the pooled connection: no
        row objects, no dicts, values exactly as stored. Other databases stream
        through SQLAlchemy's result (server-side cursors), still as tuples.
        """
        query = _tuple_query(run_id, stream, upto=upto, after=after, resume=resume)
        with self.guard("verifying"), self.engine.connect() as conn:
            if conn.dialect.name != "sqlite":
                result = conn.execution_options(stream_results=True, yield_per=batch).execute(query)
                for part in result.partitions(batch):
                    yield [tuple(row) for row in part]
                return
            compiled = query.compile(dialect=conn.dialect)
            args = tuple(compiled.params[name] for name in compiled.positiontup or ())
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                cursor.execute(str(compiled), args)
                while rows := cursor.fetchmany(batch):
                    yield list(rows)
            except conn.dialect.loaded_dbapi.Error as exc:
                raise DBAPIError.instance(str(compiled), args, exc, conn.dialect.loaded_dbapi.Error) from exc
            finally:
                cursor.close()

    def count_events(self, run_id: str, kinds: Sequence[str], stream: int = 0) -> int:
        """How many events of these kinds one stream of a run has (uses the (run, kind) index)."""
        with self.guard("counting events"), self.engine.connect() as conn:
            value = conn.execute(
                select(func.count()).where(
                    _ev.c.run_id == run_id, _ev.c.stream == stream, _ev.c.kind.in_(list(kinds))
                )
            ).scalar()
        return int(value or 0)

    def snapshot_references(self, run_id: str) -> list[tuple[Any, Any, Any, Any]]:
        """``(seq, event id, kind, payload text)`` of every event that names stored tensor values."""
        query = (
            select(_ev.c.seq, _ev.c.id, _ev.c.kind, _ev.c.payload)
            .where(_ev.c.run_id == run_id, _ev.c.kind.in_(["snapshot_taken", "construction_sealed"]))
            .order_by(*_sorted_after(True))
        )
        with self.guard("reading snapshot events"), self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query).all()]

    # ------------------------------------------------------------------ steps
    def max_step(self, run_id: str, stream: int) -> int | None:
        """The highest optimizer step recorded in a stream."""
        with self.guard("reading steps"), self.engine.connect() as conn:
            value = conn.execute(
                select(func.max(_ev.c.step)).where(_ev.c.run_id == run_id, _ev.c.stream == stream)
            ).scalar()
        return None if value is None else int(value)

    def step_seq(self, run_id: str, stream: int, step: int) -> int | None:
        """The seq of the ``optimizer_step`` event that ended step ``step`` in a stream."""
        with self.guard("finding a step"), self.engine.connect() as conn:
            found = conn.execute(
                select(_ev.c.seq).where(
                    _ev.c.run_id == run_id,
                    _ev.c.stream == stream,
                    _ev.c.kind == "optimizer_step",
                    _ev.c.step == step,
                )
            ).scalar()
        return None if found is None else int(found)

    def step_seqs(self, run_id: str, stream: int) -> dict[int, int]:
        """``step -> seq`` of every ``optimizer_step`` event of a stream."""
        with self.guard("finding steps"), self.engine.connect() as conn:
            rows = conn.execute(
                select(_ev.c.step, _ev.c.seq).where(
                    _ev.c.run_id == run_id, _ev.c.stream == stream, _ev.c.kind == "optimizer_step"
                )
            ).all()
        return {int(step): int(seq) for step, seq in rows if step is not None}

    def first_seq_from_step(self, run_id: str, stream: int, step: int) -> int | None:
        """The first seq of a stream whose event happened at step ``step`` or later."""
        with self.guard("finding a step"), self.engine.connect() as conn:
            value = conn.execute(
                select(func.min(_ev.c.seq)).where(
                    _ev.c.run_id == run_id, _ev.c.stream == stream, _ev.c.step >= step
                )
            ).scalar()
        return _int_or_none(value)

    # ------------------------------------------------------------------ snapshot catalog
    def has_blob(self, sha256: str) -> bool:
        """Is this tensor content in the snapshot catalog?"""
        blobs = schema.snapshot_blobs
        with self.guard("reading the snapshot catalog"), self.engine.connect() as conn:
            return conn.execute(select(blobs.c.sha256).where(blobs.c.sha256 == sha256)).first() is not None

    def blobs_among(self, hashes: Sequence[str]) -> set[str]:
        """Which of ``hashes`` are in the snapshot catalog (one query per 500)."""
        blobs = schema.snapshot_blobs
        found: set[str] = set()
        wanted = [h for h in hashes if is_content_hash(h)]
        with self.guard("reading the snapshot catalog"), self.engine.connect() as conn:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                found.update(r[0] for r in conn.execute(select(blobs.c.sha256).where(blobs.c.sha256.in_(chunk))))
        return found

    def blob_rows(self, hashes: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Catalog rows by hash (all of them when ``hashes`` is None). Only content hashes
        are looked up: a crafted value (a NUL byte PostgreSQL refuses, an object) has
        no catalog row, and its event is the finding (``integrity.snapshots``)."""
        blobs = schema.snapshot_blobs
        query = select(blobs)
        if hashes is not None:
            query = query.where(blobs.c.sha256.in_([h for h in hashes if is_content_hash(h)]))
        with self.guard("reading the snapshot catalog"), self.engine.connect() as conn:
            return {r["sha256"]: dict(r) for r in conn.execute(query).mappings()}

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_rows(self, run_id: str) -> list[dict[str, Any]]:
        """The stored rows of a run's signed checkpoints, oldest first, exactly as stored."""
        cp = schema.checkpoints
        with self.guard("reading checkpoints"), self.engine.connect() as conn:
            rows = conn.execute(select(cp).where(cp.c.run_id == run_id).order_by(cp.c.id)).mappings()
            return [dict(r) for r in rows]

    def checkpointed_run_ids(self) -> list[str]:
        """Every run id that has checkpoints (``verify all`` also checks runs whose events are gone)."""
        cp = schema.checkpoints
        with self.guard("reading checkpoints"), self.engine.connect() as conn:
            rows = conn.execute(select(cp.c.run_id).distinct())
            return sorted(str(r[0]) for r in rows)


def _sorted_after(found_by_kind: bool) -> tuple[Any, ...]:
    """(stream, seq) order; for rows found by kind, as expressions no index provides, so
    that the planner looks them up by kind and sorts them rather than walk the run."""
    if found_by_kind:
        return (_ev.c.stream + 0, _ev.c.seq + 0, _ev.c.id)
    return (_ev.c.stream, _ev.c.seq)


def _tuple_query(run_id: str, stream: int, *, upto: int | None = None, since: int | None = None,
                 after: int | None = None, resume: tuple[int, int] | None = None) -> Any:
    """The select of ``EventQueries.event_tuples``: ``TUPLE_COLUMNS`` of one stream in
    (seq, id) order (id breaks ties, so that two reads of a stream agree row for row)."""
    c = _ev.c
    query = select(*(c[name] for name in TUPLE_COLUMNS))
    query = query.where(c.run_id == run_id, c.stream == stream)
    if upto is not None:  # a seq that is no number (NULL) sorts first: it belongs to the head
        query = query.where(or_(c.seq.is_(None), c.seq <= upto))
    if since is not None:
        query = query.where(c.seq >= since)
    if after is not None:
        query = query.where(c.seq > after)
    if resume is not None:  # the rows after (seq, id) in (seq, id) order
        query = query.where(or_(c.seq > resume[0], and_(c.seq == resume[0], c.id > resume[1])))
    return query.order_by(c.seq, c.id)


def sqlite_tuple_statement(run_id: str, stream: int, since: int) -> tuple[str, tuple[Any, ...]]:
    """The SQLite text and arguments of ``event_tuples`` for the rows with ``seq >= since``
    (compiled here, before a fork: the child then needs only ``sqlite3``)."""
    from sqlalchemy.dialects import sqlite

    compiled = _tuple_query(run_id, stream, since=since).compile(dialect=sqlite.dialect())
    return str(compiled), tuple(compiled.params[name] for name in compiled.positiontup or ())


def sqlite_event_tuples(uri: str, statement: tuple[str, tuple[Any, ...]], batch: int = 20_000) -> Iterator[list[tuple[Any, ...]]]:
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
