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
from typing import Any

Record = tuple[Any, ...]


class RecordBuffer:
    """Bounded multi-producer, single-consumer buffer of records."""

    def __init__(self, maxsize: int = 200_000) -> None:
        self.maxsize = maxsize
        self._items: collections.deque[Record] = collections.deque()
        self._space = threading.Condition(threading.Lock())
        self.wakeup = threading.Event()
        self.blocked_seconds = 0.0
        self.dropped = 0
        # Set by the writer: if the consumer is gone, a full buffer would block
        # training forever; then records are counted and dropped instead.
        self.consumer_alive: Callable[[], bool] = lambda: True

    def put(self, record: Record) -> None:
        """Append a record; blocks while the buffer is full (writer behind)."""
        items = self._items
        if len(items) >= self.maxsize and not self._wait_for_space():
            self.dropped += 1
            return
        items.append(record)

    def _wait_for_space(self) -> bool:
        """Block until the writer makes room; False if the writer is gone."""
        began = time.perf_counter()
        self.wakeup.set()
        try:
            with self._space:
                while len(self._items) >= self.maxsize:
                    if not self.consumer_alive():
                        return False
                    if not self._space.wait(timeout=1.0):
                        self.wakeup.set()
            return True
        finally:
            self.blocked_seconds += time.perf_counter() - began

    def drain(self, limit: int) -> list[Record]:
        """Remove and return up to ``limit`` records, oldest first (writer only)."""
        items = self._items
        out: list[Record] = []
        pop = items.popleft
        try:
            for _ in range(limit):
                out.append(pop())
        except IndexError:
            pass
        if out:
            with self._space:
                self._space.notify_all()
        return out

    def __len__(self) -> int:
        return len(self._items)
