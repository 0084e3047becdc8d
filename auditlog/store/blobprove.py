"""Small snapshot files checked on worker processes beside this one, during a verdict.

A small file's full check (``blobcheck.verify_file``) costs its fixed overhead
(opening the Parquet footer, decoding one row group, comparing facts), not its
bytes, and runs under the GIL: a process's first verdict on a run of thousands
of small files (the web UI's first ``verify`` of a 5,000-module run) is that
overhead times the files, on one core. ``Provers`` are worker processes started
ahead of need (``auditlog ui`` starts them as it starts serving). ``submit``
hands them, in parts, the files a verdict has begun (``SnapshotStore.check_ahead``)
and returns at once, so the verdict checks the chain meanwhile; ``Pending.passes``
then checks the parts no worker has started in this process and waits for the
rest. Each pass comes back as (name, SHA-256 of the bytes checked, facts): it is
that verdict's check of the file (run during it, by the same code), and is kept
in ``blobcheck.PROVEN`` as a pass of this process is, so later verdicts read,
hash and recall the file.

Workers report passes only: a file that fails is checked again, found and
worded by the verdict's own check. The workers run this module's code in
processes this one started (forked from it while it had a single thread, or
fresh interpreters: ``start_method``), so what they report is what this
process would have computed. Any failure of the pool (a worker killed, a
timeout) leaves the verdict to this process alone, and a pool still starting
is not waited for. A worker that does not answer within ``WAIT_S`` is killed and its
files are checked by the verdict itself.
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
from typing import TYPE_CHECKING, Any

from auditlog.core.cpus import usable_cpus

if TYPE_CHECKING:
    from auditlog.store.blobformat import BlobInfo

MIN_FILES = 64
"""Fewer names not yet proven than this are left to the verdict itself (a round trip to
the workers costs more than a few checks)."""

CHUNKS_PER_WORKER = 8
"""Parts per worker: small enough that this process can take the last ones itself."""

MIN_CHUNK = 32
"""Files per part at least (each part is a round trip)."""

WAIT_S = 20.0
"""How long a verdict waits for the parts the workers are checking before it checks them
on its own and stops the workers. A part is at most an eighth of one worker's share of a
run's small files (``CHUNKS_PER_WORKER``): ~0.3 ms a file on the slowest machine measured,
so a part of even 10,000 files takes ~3 s. A worker that is stuck (stopped, swapped out,
hung) thus delays a verdict by this much, never more, and is killed."""


SLOTS = 1 << 16
"""Claim slots, one per part handed out, reused in turn (a part's slot is taken again
65,536 parts later, when it is long done)."""

# In a worker: the claims shared with the process that started the pool (``_ready``).
_CLAIMS: Any = None
_CLAIM_LOCK: Any = None


def _ready(parent: int, claims: Any, lock: Any) -> None:
    """Run once in each worker as it starts: what a check needs is imported by then, the
    claims are at hand, and the worker ends with ``parent``, the process that started
    the pool."""
    import pyarrow.parquet  # noqa: F401

    global _CLAIMS, _CLAIM_LOCK
    _CLAIMS, _CLAIM_LOCK = claims, lock
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


def _claimed(claims: Any, lock: Any, slot: int, by: int) -> bool:
    """Take the part of ``slot`` for ``by`` (1: a worker, 2: the process that asked) unless
    the other took it first."""
    with lock:
        if claims[slot]:
            return False
        claims[slot] = by
        return True


def prove_part(root: str, names: list[str], slot: int) -> list[tuple[str, bytes, BlobInfo]]:
    """Worker side: ``prove_chunk`` of a part, unless the process that handed it out took
    it back first (``Pending.passes``: then nothing)."""
    if not _claimed(_CLAIMS, _CLAIM_LOCK, slot, 1):
        return []
    return prove_chunk(root, names)


def prove_chunk(root: str, names: list[str]) -> list[tuple[str, bytes, BlobInfo]]:
    """Worker side: ``(name, SHA-256 of the bytes checked, facts)`` for each small file of
    ``names`` that passes the full check (large files and failures are left out)."""
    from auditlog.store.blobcheck import checked
    from auditlog.store.blobformat import SnapshotError

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
        # Who took each part handed out (0: nobody yet, 1: a worker, 2: this process), so
        # that this process can take back a part no worker has begun without cancelling
        # its future (a cancelled future left in a pool that breaks later makes the pool's
        # own thread raise, on Python 3.11).
        self._claims: Any = None
        self._claim_lock: Any = None
        self._next_slot = 0
        self._slots_lock = threading.Lock()
        if self.method == "fork":
            self._start()
        else:
            threading.Thread(target=self._start, name="auditlog-provers", daemon=True).start()

    def _start(self) -> None:
        pool: ProcessPoolExecutor | None = None
        try:
            # Imported before the workers start: forked ones share it, a forkserver preloads it.
            import auditlog.store.blobcheck  # noqa: F401

            context: Any = multiprocessing.get_context(self.method)
            if self.method == "forkserver":
                context.set_forkserver_preload(["auditlog.store.blobcheck"])
            self._claims = context.RawArray("b", SLOTS)
            self._claim_lock = context.Lock()
            pool = ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                initializer=_ready,
                initargs=(os.getpid(), self._claims, self._claim_lock),
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

    def submit(self, root: Path | str, names: list[str]) -> Pending | None:
        """Hand the workers the small files of ``names`` not yet proven in this process,
        and return at once; None when there is no pool (still starting, gone) or too few
        files to be worth a round trip."""
        from auditlog.store.blobcheck import PROVEN

        todo = [name for name in dict.fromkeys(names) if not PROVEN.known(name)]
        pool = self._pool if self._started.is_set() else None
        if pool is None or len(todo) < MIN_FILES:
            return None
        size = max(MIN_CHUNK, -(-len(todo) // (self.workers * CHUNKS_PER_WORKER)))
        chunks = [todo[start : start + size] for start in range(0, len(todo), size)]
        with self._slots_lock:
            first, self._next_slot = self._next_slot, self._next_slot + len(chunks)
        slots = [(first + index) % SLOTS for index in range(len(chunks))]
        with self._claim_lock:
            for slot in slots:
                self._claims[slot] = 0
        try:
            futures = [
                pool.submit(prove_part, str(root), chunk, slot)
                for chunk, slot in zip(chunks, slots, strict=True)
            ]
        except (BrokenProcessPool, OSError, RuntimeError):
            self.close()
            return None
        return Pending(self, str(root), list(zip(chunks, slots, futures, strict=True)))

    def take_back(self, slot: int) -> bool:
        """Take the part of ``slot`` back from the workers, if none has begun it."""
        return _claimed(self._claims, self._claim_lock, slot, 2)

    def close(self, kill: bool = False) -> None:
        """Stop the workers (work not started is dropped); ``kill``: end the processes now,
        a part they are checking included (workers that did not answer in time)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((pool._processes or {}).values()) if kill else []
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            try:
                process.kill()
            except (OSError, ValueError, AttributeError):
                pass  # gone already


class Pending:
    """Files handed to the workers (``Provers.submit``), their passes still to come."""

    def __init__(
        self,
        provers: Provers,
        root: str,
        parts: list[tuple[list[str], int, Future[list[tuple[str, bytes, BlobInfo]]]]],
    ) -> None:
        self._provers = provers
        self._root = root
        self._parts = parts
        self._passes: dict[str, BlobInfo] | None = None

    def passes(self) -> dict[str, BlobInfo]:
        """What the workers found for each file that passed, by name, once they are done
        (waiting for them; what came back before a failure of the pool, after one). Each
        pass is also kept in ``PROVEN``, for later verdicts."""
        if self._passes is not None:
            return self._passes
        from auditlog.store.blobcheck import PROVEN

        found: dict[str, BlobInfo] = {}
        results = []
        # The parts no worker has begun are checked here, last first: this process would
        # otherwise only wait (on two CPUs, the workers and this one take turns).
        futures = []
        for chunk, slot, future in reversed(self._parts):
            if self._provers.take_back(slot):
                results.append(prove_chunk(self._root, chunk))
            else:
                futures.append(future)
        failed = late = False
        try:
            done, pending = wait(futures, timeout=WAIT_S)
            late = bool(pending)
            for future in done:
                try:
                    results.append(future.result())
                except Exception:  # any failure of a part: its files are the verdict's own
                    # to check (the same code, run here, finds and words what went wrong)
                    failed = True
        except (BrokenProcessPool, OSError, RuntimeError, EOFError):
            failed = True
        for passed in results:
            for name, whole, info in passed:
                PROVEN.remember(name, whole, info)
                found[name] = info
        if failed or late:
            # The files of the parts that did not come back are the verdict's own to check
            # (it checks every file no pass was returned for).
            self._provers.close(kill=late)
        self._passes = found
        return found


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


def submit(root: Path | str, names: list[str]) -> Pending | None:
    """``Provers.submit`` on this process's provers; None when none were started."""
    active = _ACTIVE
    return None if active is None else active.submit(root, names)
