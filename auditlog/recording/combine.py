"""``auditlog combine``: merge shard stores into one store, like ``coverage combine``.

A shard is a complete store one process wrote on its own (``auditlog run
--shard``, see ``auditlog.recording.shards``). Combining copies its runs, streams
and snapshot contents into the target store:

- **Nothing is re-chained.** Events are copied with their stored hashes, so every
  stream still verifies in the target exactly as it did in the shard.
- **Shards are verified first.** A shard whose database is refused (foreign,
  corrupt, newer schema) or whose record is proven altered (a broken chain, a
  damaged snapshot file) is reported and left where it is, untouched; the other
  shards are still combined.
- **Idempotent.** A stream the target already holds is compared by hash: the
  events the target has are skipped (a second combine adds nothing), a shard
  that extends a stream adds only its newer events, and a stream whose hashes
  disagree with the target's (two different records under one run id and
  stream) is reported as a conflict and not copied.
- **Snapshot contents first.** A tensor's Parquet file is copied (and its bytes
  checked against the catalog's file hash) and catalogued before any event that
  names it, the invariant the recorder keeps too.
- **Signed checkpoints stay behind.** A checkpoint's signature covers its store's
  id, so it cannot verify in another store; they are counted, not copied. Heads
  exported with ``auditlog export-head`` from a shard verify against the
  combined store (``verify --against``), and ``auditlog checkpoint`` signs the
  combined record anew.
- Originals are kept unless ``delete``; a shard is deleted only when all of it
  is in the target.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditlog.core.errors import StoreError, UsageError
from auditlog.integrity.keys import KeyRing
from auditlog.integrity.verify import verify_run
from auditlog.store.blobformat import SnapshotError
from auditlog.store.blobpaths import copy_regular
from auditlog.store.blobs import SnapshotStore, blob_from_row
from auditlog.store.eventstore import EventStore
from auditlog.store.location import StoreLocation, resolve_store
from auditlog.store.rows import payload_object

BATCH = 5000


@dataclass
class ShardResult:
    """What combining one shard did."""

    shard: str
    runs: list[str] = field(default_factory=list)
    events_added: int = 0
    events_present: int = 0
    blobs_added: int = 0
    checkpoints_left: int = 0
    conflicts: list[str] = field(default_factory=list)
    refused: str | None = None
    deleted: bool = False

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.conflicts


@dataclass
class CombineReport:
    """What ``combine`` did, shard by shard."""

    target: str
    shards: list[ShardResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shards)

    @property
    def events_added(self) -> int:
        return sum(s.events_added for s in self.shards)


def combine(
    target: str | StoreLocation | None,
    shards: Sequence[str | Path],
    *,
    delete: bool = False,
    keys: KeyRing | None = None,
    progress: Callable[[str], None] | None = None,
) -> CombineReport:
    """Merge ``shards`` into ``target`` (created when missing); see the module docstring."""
    if not shards:
        raise UsageError("no shards given: name shard stores (directories) to combine")
    into = EventStore.open(target, create=True)
    report = CombineReport(into.location.display())
    try:
        target_id = into.meta().get("store_id")
        for shard in shards:
            if progress is not None:
                progress(str(shard))
            result = _combine_one(into, target_id, shard, keys)
            if delete and result.ok:
                result.deleted = _delete(shard)
            report.shards.append(result)
    finally:
        into.close()
    return report


def _combine_one(
    into: EventStore, target_id: str | None, shard: str | Path, keys: KeyRing | None
) -> ShardResult:
    result = ShardResult(str(shard))
    try:
        source = EventStore.open(resolve_store(shard), create=False)
    except StoreError as exc:
        result.refused = str(exc)
        return result
    try:
        source.check_file(source.location.display())
        if source.meta().get("store_id") == target_id:
            result.refused = "it is the target store itself"
            return result
        run_ids = _run_ids(source)
        for run_id in run_ids:
            report = verify_run(source, run_id, keys=keys if keys is not None else KeyRing())
            altered = [p for p in report.problems if p.altered]
            if altered:
                result.refused = f"record altered: {altered[0].describe()}"
                return result
        for run_id in run_ids:
            _copy_run(into, source, run_id, result)
        result.checkpoints_left = sum(len(source.checkpoint_rows(r)) for r in run_ids)
    except StoreError as exc:
        result.refused = str(exc)
    finally:
        source.close()
    return result


def _run_ids(source: EventStore) -> list[str]:
    indexed = [str(r["run_id"]) for r in source.run_rows()]
    return indexed + sorted(set(source.recorded_run_ids()) - set(indexed))


def _copy_run(into: EventStore, source: EventStore, run_id: str, result: ShardResult) -> None:
    rows = {str(r["run_id"]): r for r in source.run_rows()}
    if run_id in rows:
        into.add_run_row(rows[run_id])
    result.runs.append(run_id)
    _copy_blobs(into, source, run_id, result)
    for stream in source.streams(run_id):
        start = _first_missing(into, source, run_id, stream, result)
        if start is None:
            continue
        batch: list[dict[str, Any]] = []
        for row in source.iter_events(run_id, stream=stream):
            if int(row["seq"]) < start:
                continue
            batch.append(row)
            if len(batch) >= BATCH:
                into.add_events(batch)
                result.events_added += len(batch)
                batch = []
        if batch:
            into.add_events(batch)
            result.events_added += len(batch)


def _first_missing(
    into: EventStore, source: EventStore, run_id: str, stream: int, result: ShardResult
) -> int | None:
    """The first seq of the shard's stream the target lacks; None when there is nothing
    to copy (all present) or the two records disagree (a conflict, reported).

    A chain hash commits to every event before it, so one equal hash at the shorter
    stream's last seq proves the shorter is a prefix of the longer.
    """
    present = into.chain_head(run_id, stream)
    if present is None:
        return 1
    held, _head = present
    last = source.last_seq(run_id, stream) or 0
    common = min(held, last)
    ours = source.hashes_between(run_id, stream, common, common).get(common)
    theirs = into.hashes_between(run_id, stream, common, common).get(common)
    if ours is None or ours != theirs:
        result.conflicts.append(
            f"run {run_id[:12]} stream {stream}: the target holds a different record at seq {common} (not copied)"
        )
        return None
    result.events_present += common
    return held + 1 if held < last else None


def _copy_blobs(into: EventStore, source: EventStore, run_id: str, result: ShardResult) -> None:
    """Copy and catalog the snapshot contents the run's events name (before the events)."""
    wanted: set[str] = set()
    for _seq, _id, _kind, text in source.snapshot_references(run_id):
        wanted |= _hashes(text)
    if not wanted:
        return
    catalog = source.blob_rows(sorted(wanted))
    have = into.blob_rows(sorted(wanted))
    files_from, files_to = (
        SnapshotStore(source.location.snapshots),
        SnapshotStore(into.location.snapshots),
    )
    new_rows = []
    for sha, row in sorted(catalog.items()):
        target = files_to.path(sha)
        if sha in have and target.exists():
            continue
        if not target.exists():
            origin = files_from.path(sha)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.combine")
            partial.unlink(missing_ok=True)
            try:
                files_from.verify(sha)  # the content hash, recomputed (no torch)
                copy_regular(
                    origin, files_from.relpath(sha), partial
                )  # a regular file, as verify found it
            except SnapshotError as exc:
                raise StoreError(
                    f"snapshot file snapshots/{files_from.relpath(sha)} is missing or damaged ({exc})"
                ) from exc
            partial.replace(target)
        if sha not in have:
            new_rows.append(blob_from_row(row).as_row())
    if new_rows:
        into.add_blobs(new_rows)
        result.blobs_added += len(new_rows)


def _hashes(text: Any) -> set[str]:
    payload = payload_object(text)
    items = (
        (payload.get("snapshot") or {}).get("tensors")
        if "snapshot" in payload
        else payload.get("tensors")
    )
    found = set()
    for item in items or []:
        if isinstance(item, dict) and isinstance(item.get("sha256"), str):
            found.add(item["sha256"])
    return found


def _delete(shard: str | Path) -> bool:
    """Remove a combined shard (a store directory, or a database file with its sidecars)."""
    location = resolve_store(shard)
    if location.directory is not None and location.directory.is_dir():
        shutil.rmtree(location.directory)
        return True
    if location.database is not None and location.database.is_file():
        for suffix in ("", "-wal", "-shm"):
            Path(str(location.database) + suffix).unlink(missing_ok=True)
        return True
    return False
