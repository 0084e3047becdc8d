"""Where a rank records: the shared store, or a shard of its own; and which stream.

A directory store is one SQLite file, safe for several processes of one host
(WAL) but not across hosts on a network file system, where SQLite's locks are
not reliable. So a rank may write a *shard*: a complete store of its own (its
``events.db`` and ``snapshots/``), later merged with ``auditlog combine``, like
coverage.py's per-process data files. Shards of a store ``DIR`` are named

    DIR/shards/<run id>.<rank>.<host>.<pid>/

one directory per process (run and rank say what it holds; host and pid keep
two processes apart, a restarted rank too, even on a shared file system). Sharding is on when asked
(``record(shard=True)``, ``auditlog run --shard``, ``AUDITLOG_SHARD=1``), and by
default for a directory store when a torchrun job spans several nodes
(``LOCAL_WORLD_SIZE`` < ``WORLD_SIZE``). A database URL (PostgreSQL) is shared by design: never sharded.
"""

from __future__ import annotations

import os
import re

from auditlog.core.errors import UsageError
from auditlog.core.ranks import stream_number
from auditlog.recording.launch import Launch
from auditlog.store.eventstore import EventStore
from auditlog.store.location import SHARDS_DIR, StoreLocation, resolve_store

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def sharding(requested: bool | None, location: StoreLocation, launch: Launch) -> bool:
    """Whether this process records into a shard (see the module docstring)."""
    if requested is None:
        flag = os.environ.get("AUDITLOG_SHARD", "").strip().lower()
        if flag in ("1", "true", "yes", "on"):
            requested = True
        elif flag in ("0", "false", "no", "off"):
            requested = False
    if location.directory is None:
        if requested:
            raise UsageError(
                f"store {location.display()!r} is a database URL, shared by every rank: shards are "
                "for directory stores (drop --shard)"
            )
        return False
    if requested is not None:
        return requested
    # Only torchrun says how many ranks share this node (LOCAL_WORLD_SIZE).
    return launch.launcher == "torchrun" and launch.local_world_size < launch.world_size


def shard_location(
    location: StoreLocation, run_id: str, rank: int, host: str, pid: int
) -> StoreLocation:
    """The shard directory store of this process under the store directory ``location``."""
    assert location.directory is not None
    name = f"{_UNSAFE.sub('_', run_id)}.{rank}.{_UNSAFE.sub('_', host)}.{pid}"
    return resolve_store(location.directory / SHARDS_DIR / name)


def free_stream(store: EventStore, run_id: str, rank: int, segment: int) -> int:
    """The stream this process writes: its rank in the first segment from ``segment``
    on that holds no events yet (a stream is never continued by another process)."""
    taken = set(store.streams(run_id))
    while stream_number(rank, segment) in taken:
        segment += 1
    return stream_number(rank, segment)
