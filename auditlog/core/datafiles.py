"""The identity of a dataset's files: path, size and content hash, within a bound.

A dataset over files (a torchvision ``ImageFolder``'s ``samples``, a list of
paths, a Hugging Face dataset's Arrow cache files) is identified by what is on
disk when the recording first sees it. This runs on the writer thread, never
on the training thread (``capture/datasets.py`` hands over the file list; the
writer resolves it), and is bounded so that a dataset of millions of files or
terabytes cannot stall the record:

- files are taken in the dataset's order; each regular file is read in 1 MiB
  chunks and identified by the SHA-256 of its content (``sha256``) while it is
  at most ``FILE_LIMIT`` bytes and the bytes read so far stay within
  ``TOTAL_LIMIT``. Both bounds are in bytes, so two runs over the same files
  choose the same method for each file, and their fingerprints agree;
- past those bounds a file is identified by its size and modification time
  (``size_mtime``): a change that keeps both (rare: a copy with preserved
  times) goes unseen, and the same files copied to another machine differ;
- past ``SECONDS_LIMIT`` of reading (a slow network file system), the rest are
  ``size_mtime`` too and ``hashing.truncated`` says so (the fingerprint then
  depends on the machine's speed: a diff names the method of each file it lists);
- past ``STAT_LIMIT`` files nothing more is read from disk: the rest are
  identified by their path alone (``path``).

Every file, listed or not, goes into ``files_sha256`` (SHA-256 over one line
per file: path, size, method, identity), so a change to one byte of one hashed
file changes it; the record lists the first ``FILES_LISTED`` files by name.
Only regular files are opened, without following a FIFO (``O_NONBLOCK``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterable
from typing import Any

CHUNK = 1 << 20
FILE_LIMIT = 64 << 20
"""Bytes: a larger file is identified by size and modification time."""
TOTAL_LIMIT = 1 << 30
"""Bytes read for one dataset, all files together; the rest by size and modification time."""
SECONDS_LIMIT = 30.0
"""Seconds of reading for one dataset; the rest by size and modification time."""
STAT_LIMIT = 1_000_000
"""Files looked at on disk for one dataset; the rest are identified by path alone."""
FILES_LISTED = 1000
"""Files named in the record (``files_sha256`` covers all)."""


class _Budget:
    """What one dataset's identification may still read."""

    def __init__(self) -> None:
        self.bytes_left = TOTAL_LIMIT
        self.deadline = time.monotonic() + SECONDS_LIMIT
        self.truncated = False
        self.bytes_read = 0

    def allows(self, size: int) -> bool:
        if size > FILE_LIMIT or size > self.bytes_left:
            return False
        if time.monotonic() >= self.deadline:
            self.truncated = True
            return False
        return True


def identify_file(path: str, budget: _Budget) -> tuple[int | None, str, str]:
    """``(size, method, identity)`` of one file as it is on disk now."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None, "missing", ""
    except OSError as exc:
        return None, "unreadable", type(exc).__name__
    if not stat.S_ISREG(info.st_mode):
        return None, "special", oct(stat.S_IFMT(info.st_mode))
    if budget.allows(info.st_size):
        digest = hashlib.sha256()
        read = 0
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd, "rb") as handle:
                while read <= FILE_LIMIT and (block := handle.read(CHUNK)):
                    digest.update(block)
                    read += len(block)
        except OSError as exc:
            return info.st_size, "unreadable", type(exc).__name__
        budget.bytes_left -= read
        budget.bytes_read += read
        if read <= FILE_LIMIT:
            return read, "sha256", digest.hexdigest()
    return info.st_size, "size_mtime", f"{info.st_size}:{info.st_mtime_ns}"


def identify_files(paths: Iterable[str]) -> dict[str, Any]:
    """The identity of a list of files (see the module docstring): ``files_total``,
    ``bytes_total``, ``files`` (the first ``FILES_LISTED``: ``{path, size, method,
    identity}``), ``files_sha256`` and ``hashing`` (methods used, bounds, seconds)."""
    started = time.monotonic()
    budget = _Budget()
    digest = hashlib.sha256()
    listed: list[dict[str, Any]] = []
    methods: dict[str, int] = {}
    seen: dict[str, tuple[int | None, str, str]] = {}
    total = 0
    size_total = 0
    for path in paths:
        found = seen.get(path)
        if found is None:
            found = identify_file(path, budget) if len(seen) < STAT_LIMIT else (None, "path", "")
            seen[path] = found
        size, method, identity = found
        total += 1
        size_total += size or 0
        methods[method] = methods.get(method, 0) + 1
        digest.update(f"{path}\0{size}\0{method}\0{identity}\n".encode("utf-8", "surrogateescape"))
        if len(listed) < FILES_LISTED:
            listed.append({"path": path, "size": size, "method": method, "identity": identity})
    hashing: dict[str, Any] = {
        "methods": methods,
        "file_limit": FILE_LIMIT,
        "total_limit": TOTAL_LIMIT,
        "seconds_limit": SECONDS_LIMIT,
        "stat_limit": STAT_LIMIT,
        "bytes_read": budget.bytes_read,
        "seconds": round(time.monotonic() - started, 6),
    }
    if budget.truncated:
        hashing["truncated"] = True
    return {
        "files_total": total,
        "bytes_total": size_total,
        "files": listed,
        "files_sha256": digest.hexdigest(),
        "hashing": hashing,
    }
