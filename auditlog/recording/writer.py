"""The write side: a background thread that turns records into chained events.

It drains the ``RecordBuffer`` in batches, resolves lazy payload values (device
statistics, tensor copies to hash) off the training thread, encodes each event
canonically, extends the stream's hash chain and inserts the batch in one
transaction. The training thread never waits on the disk unless the buffer is
full.

If the store stops accepting writes the writer says so once on stderr, stops
writing (so no gap ever appears inside a stream) and counts what it drops;
training goes on.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.records import EventRecord, Flush
from auditlog.capture.registrations import Registrations
from auditlog.core.chain import (
    CURRENT,
    Clean,
    CleanList,
    canonical_payload,
    canonical_row,
    chained_row,
    encode_clean,
    row_prefix,
)
from auditlog.core.errors import PayloadLimitError, one_line
from auditlog.core.payloadlimits import MAX_PAYLOAD_BYTES, limit_problem
from auditlog.core.tensors import dtype_name
from auditlog.core.values import finite_or_text
from auditlog.integrity.chaincheck import stream_format
from auditlog.integrity.findings import StreamTip
from auditlog.integrity.merkle import Frontier, leaf_hash
from auditlog.store.blobcatalog import StoreCatalog
from auditlog.store.blobs import SnapshotStore
from auditlog.store.blobwriter import BlobWriter
from auditlog.store.eventstore import EventStore

# The run's liveness heartbeat (``runs.last_seen_ns``) is refreshed with a batch at
# most this often, and by an otherwise idle writer this often: the read side calls
# a run on another host stale after ``runs.STALE_AFTER_S`` (300 s). Refreshing it
# with every batch was a large share of the writer's time per ``optimizer_step``
# event (benchmarks/ingest.py; docs/performance.md).
HEARTBEAT_S = 10.0


def materialize(value: Any, writer: Writer | None = None) -> Any:
    """Turn a payload with lazy parts (``resolve`` / ``resolve_in``) into clean data.

    Clean means what ``encode_clean`` may take: str keys, non-finite floats as
    their text, tensors as lists. ``Clean`` dicts are clean by construction and
    are not walked.
    """
    kind = type(value)
    if (
        kind is Clean
        or kind is CleanList
        or kind is str
        or kind is int
        or kind is bool
        or value is None
    ):
        return value
    if kind is float:
        return value if value - value == 0.0 else finite_or_text(value)
    resolve_in = getattr(value, "resolve_in", None)
    if resolve_in is not None and writer is not None:
        return materialize(resolve_in(writer), writer)
    resolve = getattr(value, "resolve", None)
    if resolve is not None and not isinstance(value, type):
        return materialize(resolve(), writer)
    if isinstance(value, dict):
        return {str(k): materialize(v, writer) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [materialize(v, writer) for v in value]
    if isinstance(value, torch.Tensor):
        return materialize(value.tolist())
    if isinstance(value, float):  # float subclasses (numpy.float64)
        return finite_or_text(float(value))
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.device):
        return str(value)
    return value


# Kinds whose nesting the recorder fixes, whatever the model or the user passes: ``activity``
# (four levels; its text the biggest of every step) and ``metrics`` (entries of scalars:
# ``auditlog.log`` takes numbers and text only). Only their size is measured.
_FIXED_DEPTH = frozenset(("activity", "metrics"))


def _check_limits(kind: str, text: str) -> None:
    """Refuse a payload past the size or depth limit (``core.payloadlimits``): readers would
    refuse it as an edit, so it is never written; the writer's fault path records a
    ``recorder_error`` in its place (``_FIXED_DEPTH``: kinds only measured by size)."""
    problem = (
        limit_problem(text)
        if kind not in _FIXED_DEPTH
        else f"is {len(text):,} characters long, over the limit of {MAX_PAYLOAD_BYTES:,} bytes"
        if len(text) > MAX_PAYLOAD_BYTES
        else None
    )
    if problem is not None:
        raise PayloadLimitError(
            f"the {kind} payload {problem}; it was not recorded (limits: docs/events.md)"
        )


class Writer:
    """Consumes one run-stream's records and appends them to the event store."""

    def __init__(
        self,
        store: EventStore,
        run_id: str,
        stream: int,
        buffer: RecordBuffer,
        *,
        batch_size: int = 5000,
        interval: float = 0.1,
        on_error: str = "continue",
        sign: Callable[[StreamTip], None] | None = None,
        sign_every_events: int = 10_000,
        sign_every_seconds: float = 60.0,
        durable: bool = False,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.stream = stream
        self.buffer = buffer
        self.batch_size = batch_size
        self.interval = interval
        self.on_error = on_error
        # Signed checkpoints of the chain head (when a key is configured): after a
        # committed batch, every N events or T seconds, and at run end.
        self.sign = sign
        self.sign_every_events = sign_every_events
        self.sign_every_seconds = sign_every_seconds
        self._signed_seq = 0
        self._sign_warned = False  # a signing fault is reported once
        self._signed_at = time.monotonic()
        self._heartbeat_at = float("-inf")  # the first batch refreshes it
        head = store.chain_head(run_id, stream)
        # A new stream is written in the current chain format; a stream continued keeps
        # the format its first event fixed (or, matching none, the current one).
        self.chain = CURRENT if head is None else stream_format(store, run_id, stream) or CURRENT
        self.seq, self.head = head if head is not None else (0, self.chain.genesis(run_id, stream))
        # The stream's Merkle tree (its right edge), kept only to sign tree heads.
        self.tree: Frontier | None = None
        self.last_kind: str | None = None
        if sign is not None:
            self.tree = Frontier()
            if head is not None:  # continuing a stream: its tree so far, once
                for stored in store.iter_events(run_id, stream=stream):
                    self.tree.append(leaf_hash(canonical_row(stored, chain=self.chain)))
                    self.last_kind = stored["kind"]
        self.written = 0
        self.dropped = 0
        self._row_prefix = row_prefix(run_id, stream)  # the constant head of every canonical row
        self.snapshots = SnapshotStore(store.location.snapshots)
        # its pool starts with the first snapshot; durable: files fsynced before their events
        self.blobs = BlobWriter(self.snapshots, durable=durable)
        # which contents the store holds, and the catalog rows of those written since
        # the last batch (the store's bookkeeping: store/blobcatalog.py)
        self.catalog = StoreCatalog(store, self.snapshots)
        self.failure: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="auditlog-writer", daemon=True)

    def start(self) -> None:
        self.buffer.consumer_alive = self._thread.is_alive
        self.buffer.has_consumer = True
        self._thread.start()

    # ------------------------------------------------------------------ control
    def flush(self, timeout: float | None = 60.0) -> bool:
        """Block until every record queued before this call is written (or dropped)."""
        if not self._thread.is_alive():
            self._drain_all()
            return True
        done = threading.Event()
        self.buffer.put(Flush(done))
        self.buffer.wakeup.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Write everything still queued, then stop the thread."""
        self.flush(timeout)
        self._stop = True
        self.buffer.wakeup.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.blobs.close()

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        while True:
            try:
                worked = self._drain_once()
            except Exception as exc:  # a bug of ours must not leave producers blocked
                self._fail(exc, 0)
                worked = True
            if self._stop and not len(self.buffer):
                return
            if not worked:
                if self.failure is None and time.monotonic() - self._heartbeat_at >= HEARTBEAT_S:
                    self._heartbeat()  # a long evaluation, say: the run is still alive
                self.buffer.wakeup.wait(self.interval)
                self.buffer.wakeup.clear()

    def _drain_all(self) -> None:
        while self._drain_once():
            pass

    def _drain_once(self) -> bool:
        records = self.buffer.drain(self.batch_size)
        if not records:
            return False
        rows: list[dict[str, Any]] = []
        waiters: list[threading.Event] = []
        for record in records:  # by type (capture.records)
            if type(record) is tuple:  # an event
                if self.failure is not None:
                    self.dropped += 1
                    continue
                rows.append(self._encode(record))
            elif isinstance(record, Registrations):  # deferred registrations, in order
                if self.failure is not None:
                    self.dropped += len(record)
                    continue
                rows.extend(map(self._encode, record.records()))
            elif isinstance(record, Flush):
                waiters.append(record.done)
        if rows and self.failure is None:
            self._write(rows)
        for waiter in waiters:
            waiter.set()
        return True

    # ------------------------------------------------------------------ snapshots
    def store_blobs(self, items: list[tuple[int, torch.Tensor]]) -> list[tuple[str, int]]:
        """Hash each ``(tensor_id, host copy)`` and store the contents the store lacks.

        Returns ``(sha256, bytes newly written)`` per item. The files are complete
        when this returns; their catalog rows go in before the batch that holds
        the event naming them (``_write``).
        """
        stored = self.blobs.store(list(items), self.catalog)
        return [(sha, info.nbytes if info is not None else 0) for sha, info in stored]

    # ------------------------------------------------------------------ encode
    def _encode(self, record: EventRecord) -> dict[str, Any]:
        kind, ts_ns, step, module_id, tensor_id, payload = record
        try:
            text = encode_clean(payload if type(payload) is Clean else materialize(payload, self))
            _check_limits(kind, text)
        except Exception as exc:  # a payload that cannot be read (or is past the limits) becomes the recorder's fault
            kind = "recorder_error"
            text = canonical_payload(
                {
                    "where": f"writer ({record[0]})",
                    "type": type(exc).__name__,
                    "message": str(exc)[:2000],
                }
            )
        self.seq += 1
        row, encoded = chained_row(
            self.head,
            self.run_id,
            self.stream,
            self.seq,
            ts_ns,
            kind,
            step,
            module_id,
            tensor_id,
            text,
            self._row_prefix,
            self.chain,
        )
        self.head = row["hash"]
        if self.tree is not None:
            self.tree.append(leaf_hash(encoded))
            self.last_kind = kind
        return row

    def _write(self, rows: list[dict[str, Any]]) -> None:
        database = self.store.location.database
        if database is not None and not database.exists():
            # SQLite keeps writing into an unlinked file without complaint: every
            # event would vanish at close. Say so instead.
            self._fail(OSError(f"store file {str(database)!r} was deleted"), len(rows))
            return
        delay = 0.05
        for attempt in range(5):
            try:
                # Catalog rows first, in their own transaction: an event must never
                # reference a hash the catalog does not know.
                self.catalog.commit()
                now = time.monotonic()
                beat = now - self._heartbeat_at >= HEARTBEAT_S
                self.store.append(rows, self.run_id, heartbeat=beat)
                if beat:
                    self._heartbeat_at = now
                self.written += len(rows)
                self._maybe_sign()
                return
            except Exception as exc:
                if attempt == 4:
                    self._fail(exc, len(rows))
                    return
                time.sleep(delay)
                delay *= 2

    def _heartbeat(self) -> None:
        """Refresh the run's heartbeat with no events (best effort: a failure here
        is not a lost event, and the next batch tries again)."""
        try:
            self.store.append([], self.run_id)
        except Exception:
            pass  # tried again in HEARTBEAT_S, not in a tight loop
        finally:
            self._heartbeat_at = time.monotonic()

    def _maybe_sign(self, force: bool = False) -> None:
        if self.sign is None or self.seq == self._signed_seq:
            return
        due = (
            force
            or self.seq - self._signed_seq >= self.sign_every_events
            or time.monotonic() - self._signed_at >= self.sign_every_seconds
        )
        if not due:
            return
        try:
            assert self.tree is not None
            # The head of what was just committed; ended when it is the stream's run_ended.
            self.sign(
                StreamTip(
                    self.stream,
                    self.seq,
                    self.head,
                    self.tree.root().hex(),
                    self.seq if self.last_kind == "run_ended" else None,
                )
            )
            self._signed_seq, self._signed_at = self.seq, time.monotonic()
        except Exception as exc:  # a signing fault must not stop recording; say it once
            if not self._sign_warned:
                self._sign_warned = True
                print(f"auditlog: cannot sign the chain head: {one_line(exc)}", file=sys.stderr)

    def sign_final(self) -> None:
        """Sign the last committed head (run end), unless writing failed."""
        if self.failure is None:
            self._maybe_sign(force=True)

    def _fail(self, exc: BaseException, lost: int) -> None:
        if self.failure is not None:
            self.dropped += lost
            return
        self.failure = exc
        self.dropped += lost
        cause = one_line(exc)
        try:
            print(
                f"auditlog: cannot write to store {self.store.location.display()!r} ({cause}); "
                + (
                    "recording stopped"
                    if self.on_error == "fail"
                    else "recording stopped, training continues"
                ),
                file=sys.stderr,
            )
        except Exception:
            pass
