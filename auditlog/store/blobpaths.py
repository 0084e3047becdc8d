"""Where a snapshot file is, and the one way a reader opens it.

A snapshot file's location comes from its content hash alone
(``snapshots/<h[:2]>/<h>.parquet``), and the hash comes from an event payload,
which anyone with write access to the store can craft. So before a hash
becomes a path it must be a content hash as the recorder writes one
(``core.hashing.is_content_hash``: 64 lowercase hex characters); a NUL byte, a
JSON object, ``../../x``, an absolute path or upper case is a ``SnapshotError``
that names the value, and no path is built from it (``relpath``).

Opening goes through ``open_regular``, never ``open()`` or a library's own
open: ``O_NONBLOCK`` so that a FIFO put where a file should be cannot stop the
reader (a blocking open of a FIFO waits for a writer forever), ``O_NOFOLLOW``
so that a symbolic link (to a file outside the store, to a FIFO, to a device)
is refused rather than followed, then ``fstat`` on what was opened: anything
but a regular file (FIFO, directory, device, socket) is refused, "not a
regular file", before a byte is read. The recorder never writes a snapshot
file as a link; the ``snapshots/`` directory itself may be one (a store's
snapshots on another disk), since only the last component is checked.
Everything after that reads the descriptor that was checked, never the path
again, so the file cannot be swapped for a FIFO in between. ``open_snapshot``
does all of it for a content hash, and reads a small file whole.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from auditlog.core.errors import AuditlogError
from auditlog.core.hashing import is_content_hash, shown_hash

# O_NOFOLLOW and O_NONBLOCK are POSIX; where a platform lacks one, the fstat check still refuses what is opened.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class SnapshotError(AuditlogError):
    """A snapshot file is missing, unreadable or does not match its content hash."""


NOT_A_HASH = "is not a content hash (64 lowercase hex characters): event edited, no file read"


def check_hash(value: object) -> str:
    """``value`` if it is a content hash, else ``SnapshotError`` naming it (shortened,
    control characters escaped): the one check every path to a snapshot file passes."""
    if not is_content_hash(value):
        raise SnapshotError(f"content hash {shown_hash(value)} {NOT_A_HASH}")
    return str(value)


def relpath(sha256: object) -> str:
    """Where the content ``sha256`` lives, relative to ``snapshots/``: from the hash alone,
    once it is one (``check_hash``)."""
    sha = check_hash(sha256)
    return f"{sha[:2]}/{sha}.parquet"


def where(sha256: object, directory: str = "snapshots") -> str:
    """A snapshot's place for a message: ``snapshots/<h[:2]>/<h>.parquet``, or, for a
    value that is not a content hash, that value (there is no file to name)."""
    if is_content_hash(sha256):
        return f"{directory}/{relpath(sha256)}"
    return f"content hash {shown_hash(sha256)}"


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words (``a FIFO``)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], shown: str) -> int:
    """A read-only descriptor of ``path`` if it is a regular file, else ``SnapshotError``.

    Never blocks and never follows a final symbolic link (module docstring).
    ``shown`` names the file in the error (``'ab/ab12....parquet'``).
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise SnapshotError(f"snapshot file {shown!r} is missing") from None
    except OSError as exc:
        try:  # ELOOP (a link under O_NOFOLLOW) and the like: say what is there
            mode = os.lstat(path).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise SnapshotError(
                f"snapshot file {shown!r} is not a regular file ({kind_of(mode)})"
            ) from None
        raise SnapshotError(f"snapshot file {shown!r} is unreadable: {exc}") from exc
    except ValueError as exc:  # a NUL in a path that did not come through relpath
        raise SnapshotError(f"snapshot file {shown!r} is unreadable: {exc}") from exc
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise SnapshotError(f"snapshot file {shown!r} is unreadable: {exc}") from exc
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SnapshotError(f"snapshot file {shown!r} is not a regular file ({kind_of(mode)})")
    return fd


# A file at most this long is read into memory in one call and parsed from there:
# one open and one read instead of pyarrow's several, and the digest of all its
# bytes taken from the same buffer (no second read, no thread). Models of many
# small tensors (5,000 files for 2,500 Linear layers) spend their time on
# per-file overhead, not bytes.
WHOLE_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Opened:
    """A snapshot file as ``open_snapshot`` found it: a checked descriptor, and its bytes
    when it is small (``WHOLE_FILE_BYTES``)."""

    relpath: str
    fd: int
    size: int
    data: bytes | None


def open_snapshot(root: Path | str, sha256: str) -> Opened:
    """Open the file named by the content hash ``sha256`` the one way (``blobpaths``: the
    hash checked before it becomes a path, a regular file opened without blocking or
    following a link) and read it whole when it is at most ``WHOLE_FILE_BYTES``
    (then ``size`` is the length of what was read). ``SnapshotError`` otherwise."""
    shown = relpath(sha256)  # a hash that is not one names no file (blobpaths)
    fd = open_regular(os.path.join(root, shown), shown)
    try:
        size = os.fstat(fd).st_size
        data = read_at(fd, 0, size) if size <= WHOLE_FILE_BYTES else None
    except OSError as exc:
        os.close(fd)
        raise SnapshotError(f"snapshot file {shown!r} is unreadable: {exc}") from exc
    return Opened(shown, fd, size if data is None else len(data), data)


def read_at(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` (fewer only at the end of the file); the
    descriptor's own position is left alone (``pread``), so it can be shared."""
    parts: list[bytes] = []
    while length > 0:
        part = os.pread(fd, min(length, 1 << 20), offset)
        if not part:
            break
        parts.append(part)
        offset += len(part)
        length -= len(part)
    return b"".join(parts)


def fd_digest(fd: int) -> str:
    """SHA-256 of every byte of an open file, read in 1 MiB blocks with ``pread``."""
    digest = hashlib.sha256()
    offset = 0
    while True:
        block = os.pread(fd, 1 << 20, offset)
        if not block:
            return digest.hexdigest()
        digest.update(block)
        offset += len(block)


def regular_digest(path: Path, shown: str) -> str:
    """SHA-256 of the regular file ``path`` (``open_regular``'s refusals otherwise)."""
    fd = open_regular(path, shown)
    try:
        return fd_digest(fd)
    except OSError as exc:
        raise SnapshotError(f"snapshot file {shown!r} is unreadable: {exc}") from exc
    finally:
        os.close(fd)


def copy_regular(path: Path, shown: str, target: Path) -> None:
    """Copy the regular file ``path`` to the new file ``target`` (``open_regular``'s
    refusals otherwise): an archive or a combined store copies what was checked."""
    import shutil

    fd = open_regular(path, shown)
    with os.fdopen(fd, "rb") as source, target.open("xb") as sink:
        shutil.copyfileobj(source, sink, 1 << 20)


def check_size(stored: int, expected: int, relpath: str) -> None:
    """``SnapshotError`` unless a file held exactly the bytes its dtype and shape call for."""
    if stored != expected:
        raise SnapshotError(f"snapshot file {relpath!r} holds {stored} of {expected} bytes")


def reason(exc: SnapshotError) -> str:
    """A ``SnapshotError`` message without the file name (the caller names the file)."""
    text = str(exc)
    if text.endswith(NOT_A_HASH):
        return "not a content hash (64 lowercase hex characters): event edited, no file read"
    if text.endswith(" is missing"):
        return "missing"
    if " is not a regular file (" in text:
        return (
            "not a regular file ("
            + text.split(" is not a regular file (", 1)[1]
            + ": refused unread (file replaced)"
        )
    if " is unreadable: " in text:
        return "unreadable (file modified or damaged): " + text.split(" is unreadable: ", 1)[1]
    if " has columns " in text:
        return "has columns " + text.split(" has columns ", 1)[1]
    if " holds " in text and text.startswith("snapshot file "):
        return "holds " + text.split(" holds ", 1)[1] + " (file modified)"
    return text


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks (archives and exports list them)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


READ_AHEAD = 32 * 1024 * 1024  # bytes asked of the kernel ahead of a reader


def read_ahead(fd: int, offset: int, size: int) -> None:
    """Ask the kernel to start reading the ``READ_AHEAD`` bytes after this piece while it
    is read: a cold file (last month's snapshot) then streams from the disk without
    stalls between ``preadv`` calls, and no more than that is asked for at once
    (a faster cold read: docs/performance.md)."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset + size, READ_AHEAD, os.POSIX_FADV_WILLNEED)
