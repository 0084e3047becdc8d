"""Small snapshot files checked on worker processes beside this one, before a verdict.

A small file's full check (``blobcheck.verify_file``) costs its fixed overhead
(opening the Parquet footer, decoding one row group, comparing facts), not its
bytes, and runs under the GIL: a process's first verdict on a run of thousands
of small files (the web UI's first ``verify`` of a 5,000-module run) is that
overhead times the files, on one core. ``Provers`` are worker processes started
ahead of need (``auditlog ui`` starts them as it starts serving); ``prove``
hands them the names a verdict is about to check, split among them, and each
pass comes back as (name, SHA-256 of the bytes checked, facts), which this
process keeps in ``blobcheck.PROVEN`` exactly as it keeps a pass of its own.

Nothing else changes: the verdict's own check still opens every file, reads it,
hashes its bytes and answers from ``PROVEN`` only when they are the bytes a
worker checked; a file changed after a worker saw it is checked again in full.
Workers report passes only: a file that fails is found, and worded, by the
verdict's own check. The workers run this module's code in processes this one
started (forked from it while it had a single thread, or fresh interpreters:
``start_method``), so what they report is what this process would have
computed. Any failure of the pool (a worker killed, a timeout) leaves the
verdict to this process alone, and a pool still starting is not waited for.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from auditlog.core.cpus import usable_cpus
from auditlog.store.blobcheck import PROVEN, checked
from auditlog.store.blobformat import BlobInfo, SnapshotError

MIN_FILES = 64
"""Fewer names not yet proven than this are left to the verdict itself (a round trip to
the workers costs more than a few checks)."""

WAIT_S = 300.0
"""How long a verdict waits for the workers before it checks the rest on its own."""


def _ready(parent: int) -> None:
    """Run once in each worker as it starts: what a check needs is imported by then, and
    the worker ends with ``parent``, the process that started the pool."""
    import pyarrow.parquet  # noqa: F401

    threading.Thread(target=_end_with, args=(parent,), name="auditlog-parent", daemon=True).start()


def _end_with(parent: int) -> None:
    """End this worker when ``parent`` ends, however it ends. A pool's workers wait for
    work on a queue they hold both ends of, so they outlive a parent killed by a signal
    (``auditlog ui`` stopped with SIGTERM runs no cleanup: uvicorn re-raises the signal
    after its shutdown), and the forkserver lives as long as they do."""
    try:
        handle = os.pidfd_open(parent)  # Linux: readable when the process ends
    except (AttributeError, OSError):
        handle = None
    if handle is not None:
        select.select([handle], [], [])
        os._exit(0)
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(0)
        except OSError:
            pass  # alive, owned by another user


def _nothing() -> None:
    """A first task per worker: the pool starts its processes now, not at the first verdict."""


def prove_chunk(root: str, names: list[str]) -> list[tuple[str, bytes, BlobInfo]]:
    """Worker side: ``(name, SHA-256 of the bytes checked, facts)`` for each small file of
    ``names`` that passes the full check (large files and failures are left out)."""
    passed = []
    for name in names:
        try:
            info, whole = checked(root, name, recall=False)
        except (SnapshotError, OSError, ValueError):
            continue
        if whole is not None:
            passed.append((name, whole, info))
    return passed


def start_method() -> str:
    """``fork`` where it is safe and quick: on Linux, from a process with one thread (the
    server before it serves): a copy of it, started in milliseconds. Otherwise
    ``forkserver`` (a fresh interpreter, a fork of which each worker is) or ``spawn``."""
    if sys.platform == "linux" and threading.active_count() == 1:
        return "fork"
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


class Provers:
    """A pool of worker processes proving small snapshot files (module docstring).

    Forked workers start at once (``start_method``); a pool that starts fresh
    interpreters starts on a thread of its own, so that the caller, a server about to
    listen, does not wait for them, and verdicts do not use it until it has started."""

    def __init__(self, workers: int, method: str | None = None) -> None:
        self.workers = workers
        self.method = method or start_method()
        self._pool: ProcessPoolExecutor | None = None
        self._started = threading.Event()
        self._closed = False
        if self.method == "fork":
            self._start()
        else:
            threading.Thread(target=self._start, name="auditlog-provers", daemon=True).start()

    def _start(self) -> None:
        pool: ProcessPoolExecutor | None = None
        try:
            context: Any = multiprocessing.get_context(self.method)
            if self.method == "forkserver":
                context.set_forkserver_preload(["auditlog.store.blobcheck"])
            pool = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_ready, initargs=(os.getpid(),)
            )
            for _ in range(self.workers):  # fork: every worker now, before other threads
                pool.submit(_nothing)
        except (OSError, ValueError, RuntimeError, BrokenProcessPool):
            pool = None
        if pool is not None and self._closed:
            pool.shutdown(wait=False, cancel_futures=True)
            pool = None
        self._pool = pool
        self._started.set()

    def ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the pool to have started; whether it runs."""
        return self._started.wait(timeout) and self._pool is not None

    def pids(self) -> list[int]:
        """The workers' process ids (tests watch them end with this process)."""
        pool = self._pool
        processes = {} if pool is None else (pool._processes or {})
        return [p.pid for p in processes.values() if p.pid is not None]

    def prove(self, root: Path | str, names: list[str]) -> int:
        """Have the workers check the small files of ``names`` not yet proven in this
        process; keep their passes in ``PROVEN``. The number kept (0 when the pool is
        gone, or there were too few to be worth a round trip)."""
        todo = [name for name in dict.fromkeys(names) if not PROVEN.known(name)]
        if len(todo) < MIN_FILES or not self._started.is_set():
            return 0
        pool = self._pool
        if pool is None:
            return 0
        parts = self.workers * 4
        size = -(-len(todo) // parts)
        futures: list[Future[list[tuple[str, bytes, BlobInfo]]]] = []
        kept = 0
        try:
            for start in range(0, len(todo), size):
                futures.append(pool.submit(prove_chunk, str(root), todo[start : start + size]))
            done, late = wait(futures, timeout=WAIT_S)
            for future in done:
                for name, whole, info in future.result():
                    PROVEN.remember(name, whole, info)
                    kept += 1
        except (BrokenProcessPool, OSError, RuntimeError, EOFError):
            self.close()
            return kept
        if late:
            self.close()
        return kept

    def close(self) -> None:
        """Stop the workers (work not started is dropped)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


_ACTIVE: Provers | None = None
_LOCK = threading.Lock()


def start(workers: int | None = None, method: str | None = None) -> bool:
    """Start this process's provers (``workers``: default one per usable CPU, at most 4;
    none on a single CPU, where they could only take turns with this process; ``method``:
    ``start_method()`` by default). True when they run or are starting."""
    global _ACTIVE
    count = min(4, usable_cpus()) if workers is None else workers
    with _LOCK:
        if _ACTIVE is None and count >= 2:
            _ACTIVE = Provers(count, method)
        return _ACTIVE is not None


def stop() -> None:
    """Stop this process's provers, if any."""
    global _ACTIVE
    with _LOCK:
        active, _ACTIVE = _ACTIVE, None
    if active is not None:
        active.close()


def active() -> Provers | None:
    """This process's provers, if started."""
    return _ACTIVE


def prove(root: Path | str, names: list[str]) -> int:
    """``Provers.prove`` on this process's provers; 0 when none were started."""
    active = _ACTIVE
    return 0 if active is None else active.prove(root, names)
