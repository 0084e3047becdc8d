"""Writing snapshot files: one pass over a host copy, hashing and encoding overlapped.

A snapshot's tensors arrive as host copies (C-contiguous CPU tensors). For each,
the caller's thread (the recording's writer) computes the content hash, which
the event needs, while a small pool (``WORKERS`` threads) encodes Parquet and
writes the file; ``hashlib`` and pyarrow release the GIL, so these run on
separate cores where there are some. A tensor over 4 MiB has a tree content
hash (v2, ``auditlog.core.hashing``) whose leaves are hashed on
``hash_threads`` cores: one SHA-256 stream capped every snapshot at one core's
hashing speed whatever the core count (docs/performance.md). The content hash is the only pass of
SHA-256 over the values: the catalog digest (``file_sha256``) of a file written
here is its framing digest (``blobcheck``), the bytes outside the values, read
back once the file is closed. Nothing is copied between the host copy and
Parquet's page buffers: columns are zero-copy views of the host copy, chunk by
chunk, and pyarrow writes to the file itself.

Content addressing means a file's name is only known once its hash is. Two ways
of writing, chosen per tensor:

- *overlapped* (large tensors whose content changed last time, or that were
  never seen): the file is written under a temporary name while the hash is
  computed; when the hash is known, the file is renamed to it, or, if that
  content is stored already, abandoned (the worker stops at its next chunk and
  removes it);
- *hash first* (small tensors, and tensors whose content was already stored the
  last time: frozen layers): hash, then write only new content (other tensors'
  writes overlap with the hashing).

Every file of a snapshot is complete before ``store`` returns, so its event,
catalogued after, never names a file still being written; a write that fails
raises ``SnapshotError`` and the snapshot becomes the recorder's fault, as
before.

``durable`` (the recording's ``durability = "strict"``): every new file is
fsynced before it is renamed to its hash, and the directories the renames
touched are fsynced before ``store`` returns, so a snapshot event, committed
after, never outlives its files in a power loss. The other durability modes
leave write-back to the kernel, as they do for the event store's WAL
(docs/how-it-works.md: what a power loss can lose).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import threading
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from auditlog.core.cpus import hash_threads
from auditlog.core.hashing import TREE, TREE_KEY, is_tree
from auditlog.core.tensors import dtype_name, tensor_hash
from auditlog.store.blobcheck import stored_digest, written_digest
from auditlog.store.blobformat import (
    FILE_DIGEST_KEY,
    FRAMING,
    NATIVE,
    BlobInfo,
    SnapshotError,
    SnapshotFile,
    chunk_elements,
    codec_for,
    layout_of,
    page_options,
    relpath,
    row_groups_for,
    write_schema,
)

if TYPE_CHECKING:
    from auditlog.store.blobcatalog import ContentCatalog
    from auditlog.store.blobs import SnapshotStore

# Threads that encode and write files while the caller hashes.
WORKERS = 2
# Tensors smaller than this are hashed first (a file of a few chunks costs little to
# write after its hash; a wasted speculative write would cost more than the overlap).
OVERLAP_BYTES = 2 * 1024 * 1024
IN_MEMORY_BYTES = 256 * 1024
"""Tensors smaller than this are encoded in memory and written in one piece (``_write_small``)."""


@dataclass
class _Job:
    """One file being written: its tensor, and the decision the hash brings."""

    tensor: torch.Tensor
    sha256: str | None = None
    abandoned: bool = False

    def __post_init__(self) -> None:
        self.decided = threading.Event()

    def decide(self, sha256: str | None) -> None:
        """The content hash (write it under that name), or None (drop the file)."""
        self.sha256 = sha256
        self.abandoned = sha256 is None
        self.decided.set()


class BlobWriter:
    """Stores host copies as snapshot files (``store``), on a pool it owns."""

    def __init__(
        self,
        files: SnapshotStore,
        workers: int = WORKERS,
        durable: bool = False,
        hashers: int | None = None,
    ) -> None:
        self.files = files
        self.workers = workers
        self.durable = durable
        # Threads hashing the leaves of a large tensor (1: the caller hashes them in turn).
        self.hashers = hash_threads() if hashers is None else max(1, hashers)
        self._renamed: set[Path] = set()  # directories holding files renamed since the last sync
        self._pool: ThreadPoolExecutor | None = None
        # Per caller key (a tensor id): was its content already stored last time?
        self._unchanged: dict[Hashable, bool] = {}
        self._made: set[Path] = set()  # directories known to exist (set.add is atomic)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool = None

    def _submit(self, job: _Job) -> Future[BlobInfo | None]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.workers, thread_name_prefix="auditlog-snapshot"
            )
        return self._pool.submit(self._write, job)

    # ------------------------------------------------------------------ the pipeline
    def store(
        self,
        items: list[tuple[Hashable, torch.Tensor]],
        catalog: ContentCatalog,
    ) -> list[tuple[str, BlobInfo | None]]:
        """Hash every ``(key, host copy)`` and write the contents ``catalog`` does not hold.

        Returns ``(sha256, info)`` per item, in order; ``info`` is None where the
        content was stored already (by an earlier snapshot or an earlier item).
        Small tensors are hashed first and asked about together (``holds_among``: a
        one-row catalog query per tensor cost seconds on a wide model:
        docs/performance.md); large ones are still overlapped with their writing and
        asked one by one. Each content written is told to the catalog (``added``).
        """
        out: list[tuple[str, BlobInfo | None]] = []
        jobs: list[tuple[int, _Job, Future[BlobInfo | None]]] = []
        seen: set[str] = set()
        early: dict[int, str] = {}
        known_early: set[str] = set()
        hosts: list[torch.Tensor] = []
        for _, tensor in items:
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                tensor = tensor.detach().to("cpu").contiguous()
            hosts.append(tensor)
        for index, tensor in enumerate(hosts):
            if tensor.numel() * tensor.element_size() < OVERLAP_BYTES:
                early[index] = tensor_hash(tensor)
        if early:
            known_early = catalog.holds_among(set(early.values()))
        try:
            for index, (key, _) in enumerate(items):
                tensor = hosts[index]
                job: _Job | None = None
                if (
                    tensor.numel() * tensor.element_size() >= OVERLAP_BYTES
                    and not self._unchanged.get(key, False)
                ):
                    job = _Job(tensor)  # overlapped: written while it is hashed
                    jobs.append((index, job, self._submit(job)))
                digest = early.get(index)
                if digest is not None:
                    known = digest in seen or digest in known_early
                else:
                    digest = tensor_hash(tensor, threads=self.hashers)
                    known = digest in seen or catalog.holds(digest)
                self._unchanged[key] = known
                if job is not None:
                    job.decide(None if known else digest)
                elif not known:
                    job = _Job(tensor)
                    job.decide(digest)
                    jobs.append((index, job, self._submit(job)))
                seen.add(digest)
                out.append((digest, None))
        finally:
            # Every job is decided (an exception above drops the undecided ones) and
            # finished before returning: no worker is left waiting, no file half written.
            failures: list[BaseException] = []
            for index, job, future in jobs:
                if not job.decided.is_set():
                    job.decide(None)
                try:
                    info = future.result()
                except Exception as exc:
                    failures.append(exc)
                    continue
                if info is not None:
                    out[index] = (out[index][0], info)
        if failures:
            raise SnapshotError(f"cannot write a snapshot file: {failures[0]}") from failures[0]
        if self.durable:
            self._sync_directories()
        for _, info in out:
            if info is not None:
                catalog.added(info)
        return out

    def _sync_directories(self) -> None:
        """fsync the directories renames went into (and the root that holds them)."""
        touched, self._renamed = self._renamed, set()
        if not touched:
            return
        for directory in sorted(touched | {self.files.root}):
            try:
                _fsync(directory)
            except OSError as exc:
                raise SnapshotError(f"cannot sync snapshot directory {directory}: {exc}") from exc

    def put(self, tensor: torch.Tensor, sha256: str | None = None) -> BlobInfo:
        """Store one tensor (if its content is not stored yet) and describe it."""
        tensor = tensor.detach()
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise SnapshotError(f"cannot snapshot a {tensor.layout} / quantized tensor")
        digest = sha256 or tensor_hash(tensor)
        if self.files.path(digest).exists():
            try:
                return self._existing(digest)
            except SnapshotError:
                pass  # a damaged file under that name: written again
        from auditlog.store.blobcatalog import KnownContents

        ((_, info),) = self.store([(None, tensor)], KnownContents())
        assert info is not None
        return info

    def _existing(self, sha256: str) -> BlobInfo:
        """The catalog row of content stored already: its file's own facts and digest."""
        with SnapshotFile(self.files.root, sha256) as found:
            return dataclasses.replace(found.info(), file_sha256=stored_digest(found))

    # ------------------------------------------------------------------ one file (pool thread)
    def _write(self, job: _Job) -> BlobInfo | None:
        """Write ``job``'s tensor to a temporary file; rename it to its hash when decided.

        pyarrow writes the file itself (a native file: no Python between its
        pages and the disk, no copy). The catalog digest is the framing digest
        (``blobcheck``): the file is marked framed, and once closed its few
        bytes outside the values are read back and hashed; the values are the
        content hash's, computed on the caller's thread meanwhile. No second
        SHA-256 pass over the values.
        """
        tensor = job.tensor
        dtype = dtype_name(tensor.dtype)
        schema = write_schema(dtype, list(tensor.shape))
        compression, level = codec_for(dtype)
        if self.files.root not in self._made:
            self.files.root.mkdir(parents=True, exist_ok=True)
            self._made.add(self.files.root)
        if tensor.numel() * tensor.element_size() < IN_MEMORY_BYTES:
            return self._write_small(job, dtype, schema, compression, level)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=self.files.root)
        os.close(fd)
        try:
            # "ab", not "wb": O_TRUNC on the file mkstemp made marks it for ext4's
            # auto_da_alloc, and its close then starts writing the whole file back
            # inside the write (a third of a large snapshot's time: docs/performance.md).
            sink = pa.OSFile(tmp, "ab")
            try:
                self._encode(job, dtype, schema, compression, level, sink, framed=True)
            finally:
                sink.close()
            if job.sha256 is None:
                Path(tmp).unlink(missing_ok=True)
                return None
            file_sha256 = written_digest(Path(tmp), dtype, tensor.numel())
            if self.durable:
                _fsync(tmp)
            target = self.files.path(job.sha256)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            self._renamed.add(target.parent)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dataclasses.replace(describe_tensor(tensor, job.sha256), file_sha256=file_sha256)

    def _write_small(
        self, job: _Job, dtype: str, schema: pa.Schema, compression: str, level: int | None
    ) -> BlobInfo | None:
        """``_write`` for a small tensor: encoded in memory, digested whole in one call
        (not framed: the bytes are in hand), written once with one ``write``.

        For the thousands of small tensors of a wide model, per-file work costs
        more than the bytes (a temporary file and a digest thread each were the
        bulk of it: docs/performance.md).
        """
        buffer = pa.BufferOutputStream()
        self._encode(job, dtype, schema, compression, level, buffer)
        if job.sha256 is None:
            return None
        data = buffer.getvalue()
        file_sha256 = hashlib.sha256(data).hexdigest()
        target = self.files.path(job.sha256)
        if target.parent not in self._made:  # a mkdir per file adds up over thousands
            target.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(target.parent)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=self.files.root)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(memoryview(data))
                if self.durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(tmp, target)
            self._renamed.add(target.parent)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dataclasses.replace(describe_tensor(job.tensor, job.sha256), file_sha256=file_sha256)

    @staticmethod
    def _encode(
        job: _Job,
        dtype: str,
        schema: pa.Schema,
        compression: str,
        level: int | None,
        sink: Any,
        framed: bool = False,
    ) -> None:
        """The Parquet file of ``job``'s tensor into ``sink``, chunk by chunk, until it is
        written or abandoned; the hash goes into its metadata once decided, with the
        framed marking (``blobcheck``) when ``framed``."""
        options: dict[str, Any] = {
            "compression": compression,
            "compression_level": level,
            "use_dictionary": False,
            "write_statistics": False,
        }
        try:
            parquet = pq.ParquetWriter(sink, schema, **options, **page_options(dtype))
        except TypeError:  # a pyarrow without max_rows_per_page: pages as it cuts them
            parquet = pq.ParquetWriter(sink, schema, **options)
        with parquet as writer:
            wrote = False
            for column in _columns(job.tensor, dtype):
                if job.abandoned:
                    break
                writer.write_table(
                    pa.Table.from_arrays([column], schema=schema),
                    row_group_size=max(1, len(column)),
                )
                wrote = True
            if (
                not wrote and not job.abandoned
            ):  # an empty tensor: one empty row group keeps the schema
                writer.write_table(schema.empty_table())
            job.decided.wait()
            if job.sha256 is not None:
                extra = {FILE_DIGEST_KEY: FRAMING} if framed else {}
                if is_tree(job.tensor.numel() * job.tensor.element_size()):
                    extra[TREE_KEY] = TREE  # the name is content hash v2 (``hashing``)
                writer.add_key_value_metadata({b"auditlog.sha256": job.sha256.encode(), **extra})


def _fsync(path: str | Path) -> None:
    """Flush a closed file's data, or a directory's entries, to the disk (any descriptor
    of it will do)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _columns(tensor: torch.Tensor, dtype: str) -> Any:
    """The tensor as Arrow columns of at most one chunk each, viewing its memory (no copy;
    booleans are bit-packed by Arrow, the one conversion)."""
    flat = tensor.reshape(-1)
    per_chunk = chunk_elements(dtype)
    raw = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
    native = NATIVE.get(dtype)
    if native is not None:
        values = raw.view(native[0])
        for start in range(0, flat.numel(), per_chunk):
            yield pa.array(values[start : start + per_chunk], type=native[1])
        return
    width = flat.element_size()
    for start in range(0, flat.numel(), per_chunk):
        part = raw[start * width : (start + per_chunk) * width]
        offsets = pa.py_buffer(np.array([0, part.nbytes], dtype=np.int64))
        yield pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), 1, [None, offsets, pa.py_buffer(part)]
        )


def describe_tensor(tensor: torch.Tensor, sha256: str) -> BlobInfo:
    """The catalog row of a tensor's content as the writer lays it out."""
    dtype = dtype_name(tensor.dtype)
    return BlobInfo(
        sha256=sha256,
        file=relpath(sha256),
        dtype=dtype,
        shape=list(tensor.shape),
        numel=tensor.numel(),
        nbytes=tensor.numel() * tensor.element_size(),
        layout=layout_of(dtype),
        row_groups=row_groups_for(dtype, tensor.numel()),
    )
