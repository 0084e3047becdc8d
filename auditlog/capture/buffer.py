"""The bounded hand-off between hooks (producers) and the writer (consumer).

A ``collections.deque`` append is atomic under the GIL and costs tens of
nanoseconds, far less than ``queue.Queue.put`` with its lock and condition. The
writer polls; producers only block (never drop) when the buffer is full, which is
the back-pressure the design asks for.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from auditlog.capture.records import Record
from auditlog.capture.registrations import Registrations
from auditlog.core.packed import packed_count


def record_weight(record: Record) -> int:
    """What a record counts against ``maxsize``, in units of ~1 KB of memory: an
    ``activity`` record one per module call it holds (a step of a big model holds
    thousands), an ``optimizer_step`` one per 25 parameters (its size with three
    norm vectors, benchmarks/memory.py; docs/performance.md), a ``batches`` record
    one per KiB of batch contents it holds for hashing, others 1."""
    if type(record) is not tuple:  # a control record (capture.records)
        return max(1, len(record)) if isinstance(record, Registrations) else 1
    kind = record[0]
    if kind == "activity":
        payload = record[5]
        return max(1, len(payload.get("forward", ())) + len(payload.get("backward", ())))
    if kind == "optimizer_step":
        payload = record[5]
        weight = getattr(payload, "weight", None)  # payloads.StepPayload knows its own
        return weight if weight is not None else 1 + packed_count(payload.get("tensor_ids")) // 25
    if kind == "batches":  # the batch bytes it holds for hashing (capture/data.py)
        return 1 + int(getattr(record[5], "weight", 0))
    return 1


class RecordBuffer:
    """Bounded multi-producer, single-consumer buffer of records.

    The bound is in weight units (``record_weight``): records, with an
    ``activity`` record counting each module call in it, so the bound stays one
    on memory (~1 KB per unit).
    """

    def __init__(self, maxsize: int = 200_000) -> None:
        self.maxsize = maxsize
        self._weight = 0
        self._weight_lock = threading.Lock()
        self._items: collections.deque[Record] = collections.deque()
        self._space = threading.Condition(threading.Lock())
        self.wakeup = threading.Event()
        self.blocked_seconds = 0.0
        self.dropped = 0
        # Set by the writer: if the consumer is gone, a full buffer would block
        # training forever; then records are counted and dropped instead.
        self.consumer_alive: Callable[[], bool] = lambda: True
        # Whether a writer drains this buffer (one that nothing drains is never waited for).
        self.has_consumer = False

    def put(self, record: Record) -> None:
        """Append a record; blocks while the buffer is full (writer behind)."""
        weight = record_weight(record)
        if (
            self._weight + weight > self.maxsize
            and self._items
            and not self._wait_for_space(weight)
        ):
            self.dropped += 1
            return
        with self._weight_lock:
            self._weight += weight
        self._items.append(record)

    def _wait_for_space(self, weight: int) -> bool:
        """Block until the writer makes room; False if the writer is gone."""
        began = time.perf_counter()
        self.wakeup.set()
        try:
            with self._space:
                while self._weight + weight > self.maxsize and self._items:
                    if not self.consumer_alive():
                        return False
                    if not self._space.wait(timeout=1.0):
                        self.wakeup.set()
            return True
        finally:
            self.blocked_seconds += time.perf_counter() - began

    def drain(self, limit: int) -> list[Record]:
        """Remove and return records up to ``limit`` weight (at least one), oldest
        first (writer only). A weight limit, not a count: a batch of big records
        must not hold as much memory again as the queue itself."""
        items = self._items
        out: list[Record] = []
        pop = items.popleft
        removed = 0
        try:
            while removed < limit:
                record = pop()
                out.append(record)
                removed += record_weight(record)
        except IndexError:
            pass
        if out:
            with self._weight_lock:
                self._weight -= removed
            with self._space:
                self._space.notify_all()
        return out

    def __len__(self) -> int:
        return len(self._items)

    @property
    def weight(self) -> int:
        """Queued weight (see ``record_weight``), what ``maxsize`` bounds."""
        return self._weight
