"""``auditlog export``: one run as an archive any engine can read, for long-term retention.

Training documentation may have to be kept longer than any version of this tool
(10 years under the EU AI Act), so the archive is plain Parquet and JSON that
DuckDB, Spark, Trino or pyarrow read without auditlog, and it carries what is
needed to verify it without auditlog too (the chain algorithm is in its
README.md). Layout of ``DIR``::

    manifest.json            format, run, store id, streams with their chain formats and heads,
                             every file's SHA-256
    manifest.sig             Ed25519 signature of manifest.json (when a signing key is at hand)
    heads.json               signed statement of every stream's head (auditlog-head-v1)
    README.md                the layout and the chain algorithm, for readers without auditlog
    events/run_id=<run>/stream=<n>/part-0.parquet       every event, verbatim, hash included
    snapshots/run_id=<run>/stream=<n>/part-0.parquet    which tensor values each snapshot holds
    tensors/<h[:2]>/<h>.parquet                          tensor contents, by content hash (as in a store)
    catalog.parquet          one row per tensor content: dtype, shape, size, file hash
    checkpoints.parquet      the run's signed checkpoints (their signatures name the manifest's store_id)

The event files hold the row of ``core.eventrow`` (no ``snapshot`` since store
revision 0005); each stream's entry in the manifest names its chain format
(``auditlog-chain-v1`` or ``-v2``, ``core.chain``): a v1 stream's rows are hashed
with a NULL ``snapshot`` before the payload. Archives of ``auditlog-archive-v1``
(before) have the ``snapshot`` column and one ``chain`` for the whole run (v1);
``verify --archive`` checks both.

``events`` and ``snapshots`` are Hive-partitioned by run and stream (the
partition columns are not repeated inside the files), e.g. in DuckDB::

    SELECT stream, kind, count(*) FROM read_parquet('DIR/events/*/*/*.parquet',
        hive_partitioning = true, hive_types = {'run_id': VARCHAR, 'stream': INTEGER}) GROUP BY ALL

A record proven altered is not exported (verify it first); ``auditlog verify
--archive DIR`` checks an archive (``auditlog.archive.check``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from auditlog.core import eventrow
from auditlog.core.chain import CHAIN_V1, CHAIN_V2
from auditlog.core.errors import AuditlogError, IntegrityError
from auditlog.core.ranks import split_stream
from auditlog.core.replay import CONSTRUCTION_KINDS, replay
from auditlog.core.version import __version__
from auditlog.integrity.chaincheck import stream_format
from auditlog.integrity.checkpoints import export_heads, store_id
from auditlog.integrity.keys import KeyRing
from auditlog.integrity.statements import canonical_statement
from auditlog.integrity.verify import VerifyReport, verify_run
from auditlog.read.runs import list_runs
from auditlog.store.blobpaths import copy_regular, relpath
from auditlog.store.blobs import SnapshotStore, file_digest
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import decode_event

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ARCHIVE_FORMAT = "auditlog-archive-v2"  # v2: per-stream chain formats, no ``snapshot`` column
ARCHIVE_FORMAT_V1 = "auditlog-archive-v1"
ROW_GROUP = 65_536

# The archive's event files: the stored row but for its partitions and the store's id (core.eventrow).
EVENTS_SCHEMA = pa.schema(
    [(name, pa.type_for_alias(eventrow.BY_NAME[name].arrow)) for name in eventrow.ARCHIVE_COLUMNS]
)
SNAPSHOTS_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("step", pa.int64()),
        ("kind", pa.string()),
        ("trigger", pa.string()),
        ("tag", pa.string()),
        ("tensor_id", pa.int64()),
        ("tensor", pa.string()),
        ("sha256", pa.string()),
    ]
)
CATALOG_COLUMNS = (
    "sha256",
    "file",
    "dtype",
    "shape",
    "numel",
    "nbytes",
    "layout",
    "row_groups",
    "file_sha256",
)
CHECKPOINT_COLUMNS = (
    "run_id",
    "stream",
    "seq",
    "head_hash",
    "created_ns",
    "key_fingerprint",
    "signature",
    "format",  # these four since auditlog-archive-v2: a v2 checkpoint's signed fields
    "tree_root",
    "ended",
    "world_size",
)


def manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest's canonical JSON without its ``digest`` field."""
    return hashlib.sha256(
        canonical_statement({k: v for k, v in manifest.items() if k != "digest"})
    ).hexdigest()


def export_run(
    store: EventStore,
    run_id: str,
    directory: Path,
    key: Ed25519PrivateKey | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write the archive of ``run_id`` into the new or empty ``directory``; returns the manifest."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise AuditlogError(
            f"{str(directory)!r} exists and is not an empty directory; choose a new one"
        )
    keys = KeyRing([key.public_key()]) if key is not None else KeyRing()
    report = verify_run(store, run_id, keys=keys)
    altered = [p for p in report.problems if p.altered]
    if altered:
        raise IntegrityError(
            f"refusing to export run {run_id[:12]}: record altered: {altered[0].describe()}"
        )
    building = directory.with_name(f".{directory.name}.export-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        manifest = _write(store, run_id, building, key, progress, report)
        if directory.exists():
            directory.rmdir()
        building.rename(directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return manifest


def _write(
    store: EventStore,
    run_id: str,
    root: Path,
    key: Ed25519PrivateKey | None,
    progress: Callable[[int], None] | None,
    report: VerifyReport,
) -> dict[str, Any]:
    files: list[dict[str, Any]] = []
    streams: list[dict[str, Any]] = []
    hashes: set[str] = set()
    for stream in store.streams(run_id):
        part = f"run_id={run_id}/stream={stream}/part-0.parquet"
        count, first, last, head = _write_events(
            store, run_id, stream, root / "events" / part, progress
        )
        files.append(_file(root, f"events/{part}", count))
        refs = _snapshot_rows(store, run_id, stream)
        hashes |= {r["sha256"] for r in refs}
        pq.write_table(
            pa.Table.from_pylist(refs, schema=SNAPSHOTS_SCHEMA), _new(root / "snapshots" / part)
        )
        files.append(_file(root, f"snapshots/{part}", len(refs)))
        segment, rank = split_stream(stream)
        chain = stream_format(store, run_id, stream)
        if chain is None:  # verified before: the store changed since
            raise IntegrityError(
                f"refusing to export run {run_id[:12]}: stream {stream}'s first event matches "
                "no chain format (run `auditlog verify`)"
            )
        streams.append(
            {
                "stream": stream,
                "chain": chain.version,
                "rank": rank,
                "segment": segment,
                "events": count,
                "first_seq": first,
                "last_seq": last,
                "head_hash": head,
            }
        )
    files.extend(_write_tensors(store, root, sorted(hashes)))
    checkpoints = [
        {c: row.get(c) for c in CHECKPOINT_COLUMNS} for row in store.checkpoint_rows(run_id)
    ]
    pq.write_table(_checkpoint_table(checkpoints), root / "checkpoints.parquet")
    files.append(_file(root, "checkpoints.parquet", len(checkpoints)))
    identity = store_id(store)
    if key is not None:
        statement = export_heads(store, key, report)
        (root / "heads.json").write_text(statement.to_json())
        files.append(_file(root, "heads.json", None))
    (root / "README.md").write_text(_readme(run_id))
    files.append(_file(root, "README.md", None))
    info = next((i.as_dict() for i in list_runs(store) if i.run_id == run_id), None)
    manifest: dict[str, Any] = {
        "format": ARCHIVE_FORMAT,
        "created_ns": time.time_ns(),
        "auditlog": __version__,
        "store_id": identity,
        "run_id": run_id,
        "run": info,
        "streams": streams,
        "files": files,
    }
    manifest["digest"] = manifest_digest(manifest)
    text = json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=True)
    (root / "manifest.json").write_text(text + "\n")
    if key is not None:
        from auditlog.integrity.keys import fingerprint

        signature = {
            "key_fingerprint": fingerprint(key),
            "signature": key.sign((text + "\n").encode()).hex(),
        }
        (root / "manifest.sig").write_text(json.dumps(signature, sort_keys=True) + "\n")
    return manifest


def _new(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _file(root: Path, relative: str, rows: int | None) -> dict[str, Any]:
    path = root / relative
    entry: dict[str, Any] = {
        "path": relative,
        "sha256": file_digest(path),
        "bytes": path.stat().st_size,
    }
    if rows is not None:
        entry["rows"] = rows
    return entry


def _write_events(
    store: EventStore, run_id: str, stream: int, path: Path, progress: Callable[[int], None] | None
) -> tuple[int, int, int, str]:
    """One stream's events, verbatim, in seq order; returns (count, first seq, last seq, head hash)."""
    count, first, last, head = 0, 0, 0, ""
    with pq.ParquetWriter(_new(path), EVENTS_SCHEMA, compression="zstd") as writer:
        for batch in _batches(store.iter_events(run_id, stream=stream)):
            writer.write_table(pa.Table.from_pylist(batch, schema=EVENTS_SCHEMA))
            count += len(batch)
            first = first or int(batch[0]["seq"])
            last, head = int(batch[-1]["seq"]), str(batch[-1]["hash"])
            if progress is not None:
                progress(len(batch))
    return count, first, last, head


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append({name: row[name] for name in EVENTS_SCHEMA.names})
        if len(batch) >= ROW_GROUP:
            yield batch
            batch = []
    if batch:
        yield batch


def _snapshot_rows(store: EventStore, run_id: str, stream: int) -> list[dict[str, Any]]:
    """Every stored tensor value a stream's events name, with the tensor's name from replay."""
    shown = store.location.display()
    events = [
        decode_event(r, shown)
        for r in store.iter_events(run_id, kinds=CONSTRUCTION_KINDS, stream=stream)
    ]
    names = replay(events).tensor_names()
    rows: list[dict[str, Any]] = []
    for event in events:
        payload = event["payload"]
        if event["kind"] == "snapshot_taken":
            items, trigger, tag = (
                (payload.get("snapshot") or {}).get("tensors") or [],
                payload.get("trigger"),
                payload.get("tag"),
            )
        elif event["kind"] == "construction_sealed" and payload.get("stored"):
            items, trigger, tag = payload.get("tensors") or [], "sealed", None
        else:
            continue
        for item in items:
            tensor_id = item.get("tensor_id")
            rows.append(
                {
                    "seq": event["seq"],
                    "step": event["step"],
                    "kind": event["kind"],
                    "trigger": trigger,
                    "tag": tag,
                    "tensor_id": tensor_id,
                    "tensor": next(iter(names.get(tensor_id) or []), None),
                    "sha256": item.get("sha256"),
                }
            )
    return rows


def _write_tensors(store: EventStore, root: Path, hashes: list[str]) -> list[dict[str, Any]]:
    """Copy the tensor contents (verbatim Parquet files) and write their catalog."""
    catalog = store.blob_rows(hashes)
    source = SnapshotStore(store.location.snapshots)
    files: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for sha in hashes:
        row = catalog.get(sha)
        if row is None:
            raise AuditlogError(
                f"snapshot {sha[:16]}... is not in the store's catalog; run `auditlog verify`"
            )
        relative = f"tensors/{relpath(sha)}"  # from the hash alone, never the catalog's (editable) file column
        copy_regular(source.path(sha), relpath(sha), _new(root / relative))
        files.append(_file(root, relative, None))
        rows.append({c: row.get(c) for c in CATALOG_COLUMNS})
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                (c, pa.int64() if c in ("numel", "nbytes", "row_groups") else pa.string())
                for c in CATALOG_COLUMNS
            ]
        ),
    )
    pq.write_table(table, root / "catalog.parquet")
    files.append(_file(root, "catalog.parquet", len(rows)))
    return files


def _checkpoint_table(rows: list[dict[str, Any]]) -> pa.Table:
    types = {
        "stream": pa.int64(),
        "seq": pa.int64(),
        "created_ns": pa.int64(),
        "ended": pa.int64(),
        "world_size": pa.int64(),
    }
    schema = pa.schema([(c, types.get(c, pa.string())) for c in CHECKPOINT_COLUMNS])
    return pa.Table.from_pylist(rows, schema=schema)


def _readme(run_id: str) -> str:
    return f"""# auditlog archive of run {run_id}

Written by auditlog {__version__} ({ARCHIVE_FORMAT}). Everything here is Parquet or JSON.

- `events/run_id=<run>/stream=<n>/part-0.parquet`: every event of one stream (one process,
  a torchrun rank), in `seq` order, exactly as recorded. `payload` is JSON text.
- `snapshots/...`: the tensor values each snapshot event lists (`sha256` names the content).
- `tensors/<h[:2]>/<h>.parquet`: tensor contents. Column `value` holds the elements in C order
  (dtypes Arrow has); column `raw` holds the bytes (bfloat16, float8, complex). The file's
  metadata repeats dtype and shape.
- `catalog.parquet`: dtype, shape, size and the file's SHA-256 of every tensor content.
- `checkpoints.parquet`, `heads.json`, `manifest.sig`: Ed25519 signatures (see below).
- `manifest.json`: every file with its SHA-256; every stream with its chain format (`chain`),
  its last seq and hash.

## Verifying without auditlog

1. Every file's SHA-256 equals its entry in `manifest.json`, and no other files are present
   in `events/`, `snapshots/` and `tensors/`.
2. Per stream, events have `seq` 1, 2, 3, ... without gaps, and each event's `hash` is
   `sha256(prev + "\\n" + row)` in hex, where `prev` is the previous event's `hash` (for
   seq 1: `sha256("<chain>:<run_id>:<stream>")` in hex, `<chain>` the stream's `chain` in
   the manifest) and `row` is the compact ASCII JSON array (`json.dumps(row, separators=(",",
   ":"), ensure_ascii=True)`) `[run_id, stream, seq, ts_ns, kind, step, module_id,
   tensor_id, payload]` for `{CHAIN_V2.version}`, and for `{CHAIN_V1.version}` (streams
   recorded before it) `[run_id, stream, seq, ts_ns, kind, step, module_id, tensor_id,
   null, payload]` (the `null`: the `snapshot` column those records had, always NULL).
3. The last event's hash equals the stream's `head_hash` in the manifest and in `heads.json`,
   whose Ed25519 signature covers its canonical JSON without `signature` (sorted keys, no
   whitespace); `manifest.sig` signs the bytes of `manifest.json`.
4. A tensor's content hash (its `sha256`, the file name) is the SHA-256 of
   `b"auditlog-tensor-v1\\0" + json([dtype, shape]) + b"\\0" + bytes` where `json` is the
   compact JSON array (e.g. `["float32",[8,4]]`) and `bytes` the elements in C order, little
   endian; `catalog.parquet` also gives each file's SHA-256.
"""
