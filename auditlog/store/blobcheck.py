"""Checking a snapshot file against its name and its catalog digest, without torch.

Two digests cover every byte of a snapshot file between them:

- the *content hash*, the file's name (``auditlog.core.hashing``): the values,
  as decoded, with dtype and shape;
- the catalog's ``file_sha256``, which makes a change anywhere else visible
  (the writer's name, the schema's column name, level encodings a required
  column ignores: docs/integrity.md lists what the content hash and the schema
  check alone miss). For files the writer marks *framed* (``FILE_DIGEST_KEY``
  in the footer: every file written through the pool since this module
  exists), it is the *framing digest*: SHA-256 over the bytes outside the value
  spans (``framing_digest``), which costs a few small reads after writing
  instead of a second SHA-256 pass over every byte; for any other file (small
  files written in one piece, files written before), the SHA-256 of every byte.

A changed byte inside a value span changes the decoded values, so the content
hash catches it; one outside changes the framing digest. That is why a framed
file is only "unchanged" when both still hold (``unchanged``), where a file
with a whole-file digest needs its digest alone.

Readers do not call this module: ``auditlog.store.blobs.SnapshotStore`` is the one
entry point for checking a snapshot file (docs/integrity.md, "Checking a snapshot
file"), and an import contract keeps it so.

**Files proven in this process** (``PROVEN``). ``verify_file`` of a file small
enough to be read whole (``WHOLE_FILE_BYTES``: the files whose check costs its
fixed overhead, not its bytes) first takes the SHA-256 of every byte it read.
When that digest, under the same name, is one whose bytes passed this full check
earlier in this process, the answer is the one given then: the check is a
function of the name and the bytes alone (the file's kind is checked on every
open), and two different byte strings with one SHA-256 are a SHA-256 collision.
Any change of the file, between two requests of ``auditlog ui`` say, changes
its digest, and the file is checked in full again. Nothing is kept on disk
(a kept result would be as trustworthy as whatever guards the place it is
kept), only passes are kept, and at most ``PROVEN_LIMIT`` of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from auditlog.core.cpus import hash_threads
from auditlog.core.hashing import is_tree
from auditlog.store.blobformat import (
    BlobInfo,
    SnapshotError,
    SnapshotFile,
    check_size,
    open_snapshot,
    relpath,
    value_spans,
)
from auditlog.store.blobpaths import fd_digest, read_at

FRAMING_PREFIX = b"auditlog-framing-v1\0"


def framing_digest(
    read: Callable[[int, int], bytes], size: int, spans: list[tuple[int, int]]
) -> str:
    """SHA-256 over ``FRAMING_PREFIX``, the compact JSON ``[size, spans]``, a NUL byte,
    then every byte of the file outside ``spans`` in file order (``read(offset,
    length)`` reads them).

    ``spans`` are the value spans the file's own footer gives (``value_spans``);
    spans that do not lie in order inside the file count as none (the digest then
    covers every byte), so the digest is defined for any bytes at all.
    """
    position = 0
    for offset, length in spans:
        if offset < position or length < 0 or offset + length > size:
            spans = []
            break
        position = offset + length
    digest = hashlib.sha256(FRAMING_PREFIX)
    digest.update(json.dumps([size, spans], separators=(",", ":")).encode() + b"\0")
    position = 0
    for offset, length in [*spans, (size, 0)]:
        if offset > position:
            digest.update(read(position, offset - position))
        position = offset + length
    return digest.hexdigest()


def _framing_of_fd(fd: int, spans: list[tuple[int, int]]) -> str:
    return framing_digest(
        lambda offset, length: read_at(fd, offset, length), os.fstat(fd).st_size, spans
    )


def written_digest(path: Path, dtype: str, numel: int) -> str:
    """The framing digest of a file the writer has just closed (its footer read back:
    a few small reads from the page cache, not a pass over the values)."""
    spans = value_spans(pq.read_metadata(path), dtype, numel)
    fd = os.open(path, os.O_RDONLY)  # the writer's own new file
    try:
        return _framing_of_fd(fd, spans or [])
    finally:
        os.close(fd)


def stored_digest(found: SnapshotFile) -> str:
    """What the catalog's ``file_sha256`` of an open file should be, by the file's own
    marking: the framing digest, or the SHA-256 of every byte."""
    if not found.framed:
        return (
            hashlib.sha256(found.data).hexdigest()
            if found.data is not None
            else fd_digest(found.fd)
        )
    spans = value_spans(found.reader.metadata, found.dtype, found.numel) or []
    if found.data is not None:
        data = found.data
        return framing_digest(
            lambda offset, length: data[offset : offset + length], len(data), spans
        )
    return _framing_of_fd(found.fd, spans)


PROVEN_LIMIT = 200_000
"""Files remembered as proven (``Proven``): ~350 bytes each, so at most ~70 MB."""


class Proven:
    """The facts of files that passed ``verify_file`` in this process, by content hash, with
    the SHA-256 of every byte of the file that passed (module docstring: why that is the
    check's answer for those bytes). ``hits`` and ``misses`` count lookups (tests and
    benchmarks read them).

    Kept compact: the key is the name's 32 bytes; the file's place follows from its name,
    and a whole-file catalog digest from the bytes' digest. One set of bytes per name:
    bytes that pass under a name already known replace the ones kept."""

    def __init__(self, limit: int = PROVEN_LIMIT) -> None:
        self.limit = limit
        self._facts: dict[bytes, tuple[bytes, tuple[Any, ...]]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def known(self, sha256: str) -> bool:
        """Whether some bytes under this name passed (not that the file still holds them)."""
        try:
            return bytes.fromhex(sha256) in self._facts
        except ValueError:
            return False

    def recall(self, sha256: str, whole: bytes) -> BlobInfo | None:
        """What the check found for these bytes under this name (a content hash), or None."""
        kept = self._facts.get(bytes.fromhex(sha256))
        if kept is None or kept[0] != whole:
            self.misses += 1
            return None
        self.hits += 1
        dtype, shape, numel, nbytes, layout, row_groups, digest = kept[1]
        return BlobInfo(
            sha256,
            relpath(sha256),
            dtype,
            list(shape),
            numel,
            nbytes,
            layout,
            row_groups,
            whole.hex() if digest is None else digest,
        )

    def remember(self, sha256: str, whole: bytes, info: BlobInfo) -> None:
        """``info`` is what the check found for the bytes whose SHA-256 is ``whole``."""
        facts = (
            sys.intern(info.dtype),
            tuple(info.shape),
            info.numel,
            info.nbytes,
            sys.intern(info.layout),
            info.row_groups,
            None if info.file_sha256 == whole.hex() else info.file_sha256,
        )
        assert info.sha256 == sha256 and info.file == relpath(sha256) and len(whole) == 32
        key = bytes.fromhex(sha256)
        with self._lock:
            self._facts.pop(key, None)
            while len(self._facts) >= self.limit:  # the oldest first
                del self._facts[next(iter(self._facts))]
            self._facts[key] = (whole, facts)

    def clear(self) -> None:
        with self._lock:
            self._facts.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._facts)


PROVEN = Proven()


def verify_file(root: Path | str, sha256: str) -> BlobInfo:
    """The facts of the file named by ``sha256`` once its content hashed to ``sha256``,
    with its catalog digest (``file_sha256``, ``stored_digest``).

    Torch-free: the bytes are decoded with pyarrow and hashed as
    ``auditlog.tensor_hash`` would hash the tensor; a file with a whole-file
    digest is digested on another thread meanwhile. ``SnapshotError`` when the
    file is missing, unreadable, not exactly a snapshot's schema, the wrong size,
    or holds other content (its message then says ``does not match its name``).
    A small file whose bytes passed this check before in this process is
    answered from ``PROVEN`` after its bytes were read and hashed again.
    """
    info, whole = checked(root, sha256, recall=True)
    if whole is not None:
        PROVEN.remember(sha256, whole, info)
    return info


def checked(root: Path | str, sha256: str, recall: bool) -> tuple[BlobInfo, bytes | None]:
    """``verify_file``'s check, and the SHA-256 of the bytes it checked when the file was
    small enough to be read whole (None otherwise); ``recall``: answer from ``PROVEN``
    when those bytes passed before. Nothing is remembered here (``blobprove``'s workers
    hand their passes to the process that asked)."""
    opened = open_snapshot(root, sha256)
    whole: bytes | None = None
    if opened.data is not None:
        whole = hashlib.sha256(opened.data).digest()
        known = PROVEN.recall(sha256, whole) if recall else None
        if known is not None:
            os.close(opened.fd)
            return known, None
    with SnapshotFile(root, sha256, opened) as found:
        if found.data is not None:  # bytes in hand: no thread
            _check_content(found)
            digest = whole.hex() if whole is not None and not found.framed else stored_digest(found)
            return _with_digest(found.info(), digest), whole
        if found.framed:  # a few small reads: no thread
            _check_content(found)
            return _with_digest(found.info(), stored_digest(found)), None
        with ThreadPoolExecutor(1, thread_name_prefix="auditlog-digest") as pool:
            digesting = pool.submit(
                fd_digest, found.fd
            )  # pread: pyarrow's reads meanwhile are not disturbed
            _check_content(found)
            try:
                file_sha256 = digesting.result()
            except OSError as exc:
                raise SnapshotError(
                    f"snapshot file {found.relpath!r} is unreadable: {exc}"
                ) from exc
        return _with_digest(found.info(), file_sha256), None


def _with_digest(info: BlobInfo, file_sha256: str) -> BlobInfo:
    return BlobInfo(
        info.sha256,
        info.file,
        info.dtype,
        info.shape,
        info.numel,
        info.nbytes,
        info.layout,
        info.row_groups,
        file_sha256,
    )


def unchanged(root: Path, sha256: str, digest: str) -> bool:
    """Whether the file named ``sha256`` still holds the bytes that were verified with
    catalog digest ``digest``: that digest again, and for a framed file (whose
    digest leaves the values to the content hash) its content hash too."""
    try:
        with SnapshotFile(root, sha256) as found:
            if stored_digest(found) != digest:
                return False
            return not found.framed or decoded_hash(found, None) == sha256
    except (SnapshotError, OSError):
        return False


def _check_content(found: SnapshotFile) -> None:
    """``SnapshotError`` unless the decoded content hashes to the file's name."""
    actual = decoded_hash(found, None)
    if actual != found.sha256:
        raise SnapshotError(
            f"content hash {actual[:16]}... does not match its name (file modified)"
        )


def decoded_hash(found: SnapshotFile, keep: list[memoryview] | None) -> str:
    """The content hash of what ``found`` decodes to (its pieces appended to ``keep`` when
    given); ``SnapshotError`` for a file that cannot be decoded or is the wrong size."""
    # Decoded pieces stay alive while a leaf of theirs is queued (at most 16 leaves).
    digest = found.hasher(hash_threads() if is_tree(found.nbytes, found.tree) else 1)
    stored = 0
    for piece in found.pieces():
        digest.update(piece)
        stored += piece.nbytes
        if keep is not None:
            keep.append(piece)
    check_size(stored, found.nbytes, found.relpath)
    return digest.hexdigest()


def read_whole(root: Path, sha256: str) -> tuple[BlobInfo, bytes | memoryview, str] | None:
    """A small file's facts, decoded content (C-order bytes) and the hash of that content,
    from one read of the file; None for a file too big to be read whole (the caller streams it).

    Torch-free (``auditlog restore`` writes these bytes into a safetensors file
    as they are); the caller compares the hash with ``sha256``. ``SnapshotError``
    for a missing, unreadable or malformed file.
    """
    with SnapshotFile(root, sha256) as found:
        if found.data is None:
            return None
        pieces: list[memoryview] = []
        actual = decoded_hash(found, pieces)
        content: bytes | memoryview = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return found.info(), content, actual
