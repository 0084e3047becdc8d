"""The snapshot file format, and its verification without torch.

A snapshot file holds one tensor content: ``snapshots/<h[:2]>/<h>.parquet``
where ``h`` is the content hash (``auditlog.core.hashing``). Inside, one
column: ``value`` (one row per element, C order) for dtypes Arrow has, so that
DuckDB reads values directly; ``raw`` (large binary, one row per chunk of the
tensor's bytes) for the others (bfloat16, the float8 family, complex, ...).
One row group per chunk of at most ``CHUNK_BYTES`` of source bytes. The schema
metadata repeats dtype and shape; the file's key-value metadata, the hash (and
its version where it is v2: ``hashing.TREE_KEY``).

Everything here works on dtype *names* with pyarrow and numpy only: ``auditlog
verify`` and the read model check a file's content hash by decoding its bytes
(``SnapshotFile.pieces``) and hashing them (``SnapshotStore.verify``, the one entry
point), and never import torch. ``auditlog.store.blobs`` builds tensors from the same bytes
(``SnapshotFile.read_into``).

Encoding (``codec_for``), chosen by measurement (``benchmarks/compression.py``,
docs/snapshots.md): floating-point values are stored uncompressed, since trained
weights barely compress and zstd costs more time than the disk it saves;
integers and booleans (ids, masks, counters) are stored with zstd. Files are
written without column statistics (a reader could be misled by forged ones, and
they cost a pass) and with a required (non-null) column. Files written before
(zstd everywhere, statistics, a nullable column) are read the same way: the
reader follows each file's own codec, and a null value is refused.
"""

from __future__ import annotations

import io
import json
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from auditlog.core.cpus import hash_threads
from auditlog.core.hashing import TREE, TREE_KEY, Hasher, content_hasher

# SnapshotError, its reasons, relpath and opening a file (open_snapshot) live in blobpaths;
# most readers import them from here.
from auditlog.store.blobpaths import WHOLE_FILE_BYTES as WHOLE_FILE_BYTES
from auditlog.store.blobpaths import Opened as Opened
from auditlog.store.blobpaths import SnapshotError as SnapshotError
from auditlog.store.blobpaths import check_size as check_size
from auditlog.store.blobpaths import file_digest as file_digest
from auditlog.store.blobpaths import open_snapshot as open_snapshot
from auditlog.store.blobpaths import read_ahead
from auditlog.store.blobpaths import reason as reason
from auditlog.store.blobpaths import relpath as relpath
from auditlog.store.blobshape import check_extent, element_count, parse_shape

# Source bytes per chunk (one row group each): bounds the writer's and reader's extra memory.
CHUNK_BYTES = 4 * 1024 * 1024
# Row groups of files written before the single-page layout (``page_options``):
# 16 MiB. With one data page per row group, pyarrow holds a row group's page in
# memory while writing it (16 MiB groups raised the peak memory well past the
# target of one host copy + 64 MiB; docs/performance.md); 4 MiB groups keep that small.
LEGACY_CHUNK_BYTES = 16 * 1024 * 1024
# A data page header (Thrift) of one row group's single page is ~20-30 bytes; a
# longer gap before the values means several pages (``SnapshotFile.direct_spans``).
_ONE_PAGE_HEADER = 64
# Bytes read per ``preadv`` call when reading a file straight into its tensor: the
# hash starts on the first piece while the next ones are read.
_READ_PIECE = 4 * 1024 * 1024

# Element size of every torch dtype, by name (tests/test_snapshots.py checks it against torch).
ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "complex32": 4,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "bits16": 2,
    "bits8": 1,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    **{f"int{n}": 1 for n in range(1, 8)},
    **{f"uint{n}": 1 for n in range(1, 8)},
}

# dtypes stored natively (a ``value`` column DuckDB reads): name -> (numpy dtype, arrow type).
NATIVE: dict[str, tuple[Any, pa.DataType]] = {
    "float64": (np.float64, pa.float64()),
    "float32": (np.float32, pa.float32()),
    "float16": (np.float16, pa.float16()),
    "int64": (np.int64, pa.int64()),
    "int32": (np.int32, pa.int32()),
    "int16": (np.int16, pa.int16()),
    "int8": (np.int8, pa.int8()),
    "uint64": (np.uint64, pa.uint64()),
    "uint32": (np.uint32, pa.uint32()),
    "uint16": (np.uint16, pa.uint16()),
    "uint8": (np.uint8, pa.uint8()),
    "bool": (np.bool_, pa.bool_()),
}


# A file whose key-value metadata holds ``FILE_DIGEST_KEY: FRAMING`` has the framing
# digest as its catalog ``file_sha256`` (``blobcheck.framing_digest``: every byte
# outside the values, which the content hash covers); any other, the SHA-256 of
# every byte.
FILE_DIGEST_KEY = b"auditlog.file_digest"
FRAMING = b"framing-v1"

# pyarrow's default row group length: the writer before issue 18 let it split
# chunks of more rows, so such files have more row groups than chunks.
_LEGACY_GROUP_ROWS = 1024 * 1024


@dataclass(frozen=True)
class BlobInfo:
    """One stored tensor content: the catalog row the event store keeps.

    ``file_sha256`` is the file's catalog digest (``blobcheck.stored_digest``):
    the content hash and the schema check do not cover every byte of a file
    (docs/integrity.md); with it, every byte is covered.
    """

    sha256: str
    file: str
    dtype: str
    shape: list[int]
    numel: int
    nbytes: int
    layout: str
    row_groups: int
    file_sha256: str = ""

    def as_row(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "file": self.file,
            "dtype": self.dtype,
            "shape": json.dumps(self.shape),
            "numel": self.numel,
            "nbytes": self.nbytes,
            "layout": self.layout,
            "row_groups": self.row_groups,
            "file_sha256": self.file_sha256,
        }


def blob_from_row(row: dict[str, Any]) -> BlobInfo:
    """A catalog row (from the event store) as a ``BlobInfo``."""
    shape = row["shape"]
    return BlobInfo(
        sha256=row["sha256"],
        file=row["file"],
        dtype=row["dtype"],
        shape=json.loads(shape) if isinstance(shape, str) else list(shape),
        numel=int(row["numel"]),
        nbytes=int(row["nbytes"]),
        layout=row["layout"],
        row_groups=int(row["row_groups"]),
        file_sha256=str(row.get("file_sha256") or ""),
    )


def itemsize(dtype: str) -> int:
    """Bytes per element of the dtype named ``dtype``; unknown names are an error."""
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise SnapshotError(f"unknown dtype {dtype!r} in snapshot") from None


def layout_of(dtype: str) -> str:
    """``native`` (a ``value`` column) or ``raw`` (bytes) for a dtype name."""
    itemsize(dtype)
    return "native" if dtype in NATIVE else "raw"


def chunk_elements(dtype: str) -> int:
    """Elements per chunk (row group) of a ``dtype`` tensor."""
    return max(1, CHUNK_BYTES // itemsize(dtype))


def row_groups_for(dtype: str, numel: int) -> int:
    """How many row groups the writer makes for ``numel`` elements (an empty tensor: one)."""
    return max(1, -(-numel // chunk_elements(dtype)))


def legacy_chunks(dtype: str, numel: int) -> int:
    """How many 16 MiB chunks the writers before the single-page layout cut a tensor into
    (``LEGACY_CHUNK_BYTES``: what their catalog rows counted as row groups)."""
    return max(1, -(-numel // max(1, LEGACY_CHUNK_BYTES // itemsize(dtype))))


def legacy_row_groups(dtype: str, numel: int) -> int:
    """How many row groups a file written before issue 18 has (pyarrow split long chunks)."""
    if layout_of(dtype) == "raw" or numel == 0:
        return legacy_chunks(dtype, numel)
    per_chunk = max(1, LEGACY_CHUNK_BYTES // itemsize(dtype))
    full, rest = divmod(numel, per_chunk)
    return full * -(-per_chunk // _LEGACY_GROUP_ROWS) + (
        -(-rest // _LEGACY_GROUP_ROWS) if rest else 0
    )


def codec_for(dtype: str) -> tuple[str, int | None]:
    """Parquet compression for a dtype: none for floating point, zstd (level 1) for the rest."""
    floating = dtype.startswith(("float", "bfloat", "complex"))
    return ("none", None) if floating else ("zstd", 1)


def expected_schema(dtype: str) -> list[tuple[str, pa.DataType]]:
    """The only columns a snapshot file of ``dtype`` may have: ``value`` natively, else ``raw``."""
    native = NATIVE.get(dtype)
    itemsize(dtype)
    return [("value", native[1])] if native else [("raw", pa.large_binary())]


def check_schema(schema: pa.Schema, dtype: str, relpath: str) -> None:
    """``SnapshotError`` unless ``schema`` is exactly the one column ``dtype`` calls for."""
    expected = expected_schema(dtype)
    actual = [(f.name, f.type) for f in schema]
    if actual != expected:
        shown = ", ".join(f"{n}: {t}" for n, t in actual)
        wanted = ", ".join(f"{n}: {t}" for n, t in expected)
        raise SnapshotError(
            f"snapshot file {relpath!r} has columns [{shown}]; a {dtype} snapshot has exactly "
            f"[{wanted}] (file rewritten)"
        )


def page_options(dtype: str) -> dict[str, Any]:
    """``ParquetWriter`` options for a new file: floating-point content (stored
    uncompressed) in one data page per row group, so a restore reads it straight
    into the tensor (``SnapshotFile.direct_spans``). pyarrow cuts pages at 1 MiB
    and 20,000 rows by default; ``max_rows_per_page`` needs a recent pyarrow (the
    writer drops both options where it is unknown: the file is then read decoded)."""
    if not dtype.startswith(("float", "bfloat", "complex")):
        return {}
    return {"data_page_size": 2 * CHUNK_BYTES, "max_rows_per_page": chunk_elements(dtype)}


def write_schema(dtype: str, shape: list[int]) -> pa.Schema:
    """The schema the writer gives a new file (the hash is added to its metadata when known)."""
    ((name, kind),) = expected_schema(dtype)
    metadata = {b"auditlog.dtype": dtype.encode(), b"auditlog.shape": json.dumps(shape).encode()}
    return pa.schema([pa.field(name, kind, nullable=False)], metadata=metadata)


class SnapshotFile:
    """An open snapshot file: its facts (from the file alone, no catalog) and its bytes.

    Opening checks that it exists, is Parquet, names a known dtype and a shape,
    and has exactly a snapshot's schema. Its facts are not evidence until its
    content hashed to its name (``verify_file``, ``SnapshotStore.read_verified``).
    """

    def __init__(self, root: Path | str, sha256: str, opened: Opened | None = None) -> None:
        """Open the file named ``sha256`` under ``root`` (``open_snapshot``), or take over
        ``opened`` (its descriptor is this file's from then on, closed by ``close``)."""
        if opened is None:
            opened = open_snapshot(root, sha256)
        self.sha256 = sha256
        self.relpath = opened.relpath
        # The file's bytes when it is small enough to be read whole (WHOLE_FILE_BYTES):
        # everything below is about exactly these bytes.
        self.data: bytes | None = opened.data
        # The descriptor opened (and checked a regular file) once: every later read,
        # pyarrow's included, goes through it, never through the path again.
        self.fd = opened.fd
        self.size = opened.size
        self._handle: Any = None
        try:
            if self.data is not None:
                self._handle = pa.BufferReader(self.data)
            else:
                self._handle = pa.PythonFile(
                    io.FileIO(os.dup(self.fd), "r", closefd=True), mode="r"
                )
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise SnapshotError(f"snapshot file {self.relpath!r} is unreadable: {exc}") from exc
        try:
            self.reader = pq.ParquetFile(self._handle)
            schema = self.reader.schema_arrow
            meta = schema.metadata or {}
            self.dtype = meta[b"auditlog.dtype"].decode()
            self.shape = parse_shape(json.loads(meta[b"auditlog.shape"].decode()), self.relpath)
            self.row_groups = self.reader.num_row_groups
            footer = self.reader.metadata.metadata or {}
            # Which digest the catalog's ``file_sha256`` is (``blobcheck.stored_digest``).
            self.framed = footer.get(FILE_DIGEST_KEY) == FRAMING
            # Which content hash version names the file (``hashing``: v2 where marked, else v1).
            self.tree = footer.get(TREE_KEY) == TREE
        except (OSError, pa.ArrowException, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.close()
            if isinstance(exc, SnapshotError):
                raise
            raise SnapshotError(f"snapshot file {self.relpath!r} is unreadable: {exc}") from exc
        try:
            check_schema(schema, self.dtype, self.relpath)
            self.numel = element_count(self.shape)
            self.layout = layout_of(self.dtype)
            self.nbytes = self.numel * itemsize(self.dtype)
            # Before any reader allocates ``nbytes`` (blobshape): a shape the file cannot hold is refused.
            check_extent(
                self.reader.metadata,
                self.size,
                self.layout,
                self.dtype,
                itemsize(self.dtype),
                self.numel,
                self.relpath,
            )
        except SnapshotError:
            self.close()
            raise
        except (
            AttributeError,
            ValueError,
            TypeError,
            OverflowError,
            IndexError,
            pa.ArrowException,
        ) as exc:
            self.close()
            raise SnapshotError(f"snapshot file {self.relpath!r} is unreadable: {exc}") from exc

    def __enter__(self) -> SnapshotFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def info(self) -> BlobInfo:
        return BlobInfo(
            sha256=self.sha256,
            file=self.relpath,
            dtype=self.dtype,
            shape=self.shape,
            numel=self.numel,
            nbytes=self.nbytes,
            layout=self.layout,
            row_groups=self.row_groups,
        )

    def _row_group(self, index: int) -> pa.ChunkedArray:
        return self.reader.read_row_group(index, use_threads=False).column(0)

    def pieces(self) -> Iterator[memoryview]:
        """The content's bytes in C order, piece by piece (at most a row group held at
        once, the next one read ahead on a thread while the caller uses this one).

        ``SnapshotError`` for a file that cannot be decoded or holds a null value.
        """
        count = self.row_groups
        try:
            if count <= 1:
                for index in range(count):
                    yield from self._bytes_of(self._row_group(index))
                return
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="auditlog-read") as ahead:
                pending = ahead.submit(self._row_group, 0)
                for index in range(count):
                    column = pending.result()
                    if index + 1 < count:
                        pending = ahead.submit(self._row_group, index + 1)
                    yield from self._bytes_of(column)
        except (OSError, pa.ArrowException, ValueError, RuntimeError) as exc:
            raise SnapshotError(f"snapshot file {self.relpath!r} is unreadable: {exc}") from exc

    def read_into(self, target: np.ndarray[Any, Any], digest: Any) -> None:
        """Decode the content into ``target`` (bytes, exactly ``nbytes`` long) and hash
        what was written there into ``digest`` (when given).

        A reader thread decodes and copies row group after row group while the
        caller hashes the parts already copied: the two passes overlap, and what
        is hashed is what the caller gets (never bytes read again from the file).
        No memory beyond ``target`` and the row group being decoded.
        """
        if self.row_groups <= 1:  # a small file: no thread
            position = 0
            for piece in self.pieces():
                position = self._place(target, position, piece)
                if digest is not None:
                    digest.update(target[position - piece.nbytes : position].data)
            check_size(position, self.nbytes, self.relpath)
            return

        def fill(ready: Callable[[int, int], None]) -> None:
            position = 0
            for piece in self.pieces():
                end = self._place(target, position, piece)
                ready(position, end)
                position = end
            check_size(position, self.nbytes, self.relpath)

        _hash_while_filling(fill, memoryview(target.data).cast("B"), digest, self.relpath)

    def read_hashed(self, target: np.ndarray[Any, Any]) -> str:
        """Fill ``target`` (bytes, exactly ``nbytes`` long) with the content and return
        the content hash of what is there (``hasher``: the version the file is
        marked with; v2's leaves hashed on ``hash_threads`` cores).

        Straight from the file into ``target`` where the file's layout allows it
        (``direct_spans``: one ``preadv`` per row group, no decode, no copy), the
        hash following the reads on this thread; otherwise decoded
        (``read_into``). What is returned is the hash of the bytes the caller
        gets, either way: should the direct bytes not hash to the file's name
        (a file whose layout only looked simple), it is decoded again before
        anything is said about it.
        """
        spans = self.direct_spans()
        if spans is not None:
            digest = self.hasher(hash_threads())
            self._read_spans(target, spans, digest)
            actual = digest.hexdigest()
            if actual == self.sha256:
                return actual
        digest = self.hasher(hash_threads())
        self.read_into(target, digest)
        return digest.hexdigest()

    def hasher(self, threads: int = 1) -> Hasher:
        """A content hasher of the version this file's name is in (``hashing.content_hasher``):
        feed it the content's bytes. ``threads`` > 1: only for bytes that stay in place
        until the digest is taken (a read's target)."""
        return content_hasher(self.dtype, self.shape, self.nbytes, self.tree, threads)

    def direct_spans(self) -> list[tuple[int, int]] | None:
        """``(file offset, length)`` of each row group's content bytes, when they lie in
        the file as they are (``value_spans``); None otherwise, and for files read
        whole (``WHOLE_FILE_BYTES``)."""
        if self.data is not None:
            return None
        return value_spans(self.reader.metadata, self.dtype, self.numel)

    def _read_spans(
        self, target: np.ndarray[Any, Any], spans: list[tuple[int, int]], digest: Any
    ) -> None:
        """``preadv`` each span into its place in ``target`` on a reader thread, in
        pieces of ``_READ_PIECE``, while this thread hashes the pieces already read."""
        view = memoryview(target.data).cast("B")

        def fill(ready: Callable[[int, int], None]) -> None:
            fd = self.fd  # the descriptor checked at open (pread: its position is not shared)
            position = 0
            for offset, length in spans:
                for start in range(0, length, _READ_PIECE):
                    size = min(_READ_PIECE, length - start)
                    read_ahead(fd, offset + start, size)
                    got = 0
                    while got < size:
                        read = os.preadv(
                            fd, [view[position + got : position + size]], offset + start + got
                        )
                        if read <= 0:
                            raise SnapshotError(
                                f"snapshot file {self.relpath!r} is shorter than its metadata says"
                            )
                        got += read
                    ready(position, position + size)
                    position += size
            check_size(position, self.nbytes, self.relpath)

        _hash_while_filling(fill, view, digest, self.relpath)

    def _place(self, target: np.ndarray[Any, Any], position: int, piece: memoryview) -> int:
        end = position + piece.nbytes
        if end > target.nbytes:
            check_size(end, self.nbytes, self.relpath)
        target[position:end] = np.frombuffer(piece, dtype=np.uint8)
        return end

    def _bytes_of(self, column: pa.ChunkedArray) -> Iterator[memoryview]:
        for chunk in column.chunks:
            if not len(chunk):
                continue
            if chunk.null_count:
                raise SnapshotError(
                    f"snapshot file {self.relpath!r} is unreadable: it holds null values"
                )
            if self.layout == "raw":
                for index in range(len(chunk)):
                    yield memoryview(chunk[index].as_buffer())
            elif (
                chunk.type == pa.bool_()
            ):  # bit-packed in Arrow: one byte (0/1) per element, as torch
                yield memoryview(chunk.to_numpy(zero_copy_only=False).view(np.uint8))
            else:
                width = chunk.type.bit_width // 8
                data = memoryview(chunk.buffers()[1]).cast("B")
                yield data[chunk.offset * width : (chunk.offset + len(chunk)) * width]


def value_spans(metadata: Any, dtype: str, numel: int) -> list[tuple[int, int]] | None:
    """``(file offset, length)`` of each row group's content bytes, from a file's footer,
    when they lie in the file as they are: one uncompressed data page per row
    group, no dictionary (the writer's layout since ``max_rows_per_page`` is set),
    and a floating-point dtype (integers are compressed, booleans bit-packed).
    None otherwise.

    Only sizes and offsets are read from the footer: pyarrow (26.0) aborts the
    process on an out-of-range codec or encoding number in a forged footer when
    ``compression`` or ``encodings`` is read, so "uncompressed" is "compressed
    size equals uncompressed size" here. A span list is never trusted for the
    values: a direct read is checked against the content hash and decoded again
    on a mismatch (``read_hashed``), and the framing digest covers the footer
    the spans come from (``blobcheck``).
    """
    if dtype == "bool" or not dtype.startswith(("float", "bfloat", "complex")) or numel == 0:
        return None
    width = itemsize(dtype)
    per = chunk_elements(dtype)
    spans: list[tuple[int, int]] = []
    try:
        if metadata.num_row_groups != row_groups_for(dtype, numel):
            return None
        for index in range(metadata.num_row_groups):
            column = metadata.row_group(index).column(0)
            if (
                column.has_dictionary_page
                or column.total_compressed_size != column.total_uncompressed_size
            ):
                return None
            length = min(per, numel - index * per) * width
            header = column.total_compressed_size - length
            if not 0 < header <= _ONE_PAGE_HEADER:
                return None  # several pages (headers between the values), or not this layout
            spans.append((column.data_page_offset + header, length))
    except (AttributeError, ValueError, IndexError, OverflowError, pa.ArrowException):
        return None
    return spans


def _hash_while_filling(
    fill: Callable[[Callable[[int, int], None]], None], view: memoryview, digest: Any, relpath: str
) -> None:
    """Run ``fill`` on a reader thread; it fills ``view`` and calls ``ready(start, end)``
    for each piece in order, which this thread hashes into ``digest`` (when given)
    meanwhile. An error on the reader is raised here (an ``OSError`` as ``SnapshotError``)."""
    done: queue.SimpleQueue[tuple[int, int] | BaseException | None] = queue.SimpleQueue()

    def run() -> None:
        try:
            fill(lambda start, end: done.put((start, end)))
            done.put(None)
        except BaseException as exc:  # handed to the caller's thread
            done.put(exc)

    reader = threading.Thread(target=run, name="auditlog-read", daemon=True)
    reader.start()
    try:
        while (piece := done.get()) is not None:
            if isinstance(piece, BaseException):
                if isinstance(piece, OSError):
                    raise SnapshotError(
                        f"snapshot file {relpath!r} is unreadable: {piece}"
                    ) from piece
                raise piece
            if digest is not None:
                digest.update(view[piece[0] : piece[1]])
    finally:
        reader.join()
