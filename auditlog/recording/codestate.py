"""The state of the code a run ran: which files differ from the commit, and one hash of them.

Asked at every run start (on the writer thread), so it must be bounded in time
and memory whatever the repository holds: a 3 GiB untracked checkpoint or a data
folder bigger than RAM beside the code. Hashing the work tree by reading every
untracked file whole (what this replaced) took seconds more and more memory than
the file itself for one untracked checkpoint (docs/performance.md). So:

- ``git status --porcelain -z`` says which paths differ (tracked paths changed
  against ``HEAD``, and untracked, non-ignored files); git compares tracked
  files by its index's stat data and never reads an untracked file.
- Each changed path is then identified by its content as it is on disk now
  (what the program ran), read in ``CHUNK`` pieces: by SHA-256 when the file is
  at most ``FILE_LIMIT`` bytes and the run start's budget (``TOTAL_LIMIT`` bytes
  read, ``SECONDS_LIMIT`` seconds) is not spent, else by its size and
  modification time (``size_mtime``). Only regular files are opened (a FIFO in
  the tree would block the read forever); a symbolic link is identified by its
  target, a deleted path as deleted.
- ``diff_sha256`` is SHA-256 over every changed path's state, path, method and
  identity and executable bit (sorted), so two dirty runs of one commit hash equal only if every
  changed file had the same content (or, above the limits, size and mtime).
- The record names the changed paths (modified first, then untracked; at most
  ``FILES_LISTED``), with the totals, the method that covered each, and how
  many each method covered, so ``auditlog diff`` and the report say which files
  made a run dirty.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
FILE_LIMIT = 16 << 20  # bytes: larger files are identified by size and mtime
TOTAL_LIMIT = 128 << 20  # bytes read at one run start, all files together
SECONDS_LIMIT = 2.0  # reading stops after this (git itself not counted)
FILES_LISTED = 100  # changed paths named in the record (the totals count all)
GIT_TIMEOUT = 10.0


def git(root: Path, *args: str) -> bytes | None:
    """stdout of ``git args`` in ``root``, or None (no git, not a repository, a timeout).

    This runs on the writer thread while the program's own thread may ``fork()`` at
    any moment (a ``DataLoader`` starting its workers). A process forked without
    exec inherits every pipe open at that instant, close-on-exec or not, and keeps
    its write end open for as long as it lives (persistent workers: the whole run):
    a pipe read for git's output, or subprocess's own exec-error pipe, then never
    sees EOF, and the run start waited until the flush gave up and lost the record
    (it happened in runs under load). So no pipe is read: git's output goes to an
    unnamed temporary file, the process is waited for, not its pipes, and it is
    started with ``posix_spawn`` (full path, no ``cwd``: ``git -C``; no
    ``close_fds``), which has no exec-error pipe.
    """
    executable = shutil.which("git")
    if executable is None:
        return None
    with tempfile.TemporaryFile() as out:
        try:
            done = subprocess.run(
                [executable, "-C", str(root), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.DEVNULL,
                timeout=GIT_TIMEOUT,
                check=False,
                close_fds=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        out.seek(0)
        return out.read()


def _state(code: str) -> str:
    """A porcelain ``XY`` code as one word."""
    if code == "??":
        return "untracked"
    for letter, word in (
        ("D", "deleted"),
        ("R", "renamed"),
        ("C", "copied"),
        ("A", "added"),
        ("U", "unmerged"),
    ):
        if letter in code:
            return word
    return "modified"


def changed_paths(status: bytes) -> list[tuple[str, str, str | None]]:
    """``(state, path, old path of a rename)`` from ``git status --porcelain=v1 -z``."""
    out: list[tuple[str, str, str | None]] = []
    fields = status.split(b"\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2].decode(errors="replace"), entry[3:].decode(errors="replace")
        old = None
        if code[0] in "RC":  # "R  new\0old\0"
            old = fields[i].decode(errors="replace") if i < len(fields) else None
            i += 1
        out.append((_state(code), path, old))
    return out


class _Budget:
    """What one run start may still read."""

    def __init__(self) -> None:
        self.bytes_left = TOTAL_LIMIT
        self.deadline = time.monotonic() + SECONDS_LIMIT

    def allows(self, size: int) -> bool:
        return size <= FILE_LIMIT and size <= self.bytes_left and time.monotonic() < self.deadline


def identify(path: Path, budget: _Budget) -> tuple[str, str, bool]:
    """``(method, identity, executable)`` of one changed path as it is on disk now."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "deleted", "", False
    except OSError as exc:
        return "unreadable", type(exc).__name__, False
    if stat.S_ISLNK(info.st_mode):
        try:
            return "symlink", os.readlink(path), False
        except OSError as exc:
            return "unreadable", type(exc).__name__, False
    if not stat.S_ISREG(info.st_mode):
        return "special", oct(stat.S_IFMT(info.st_mode)), False
    executable = bool(info.st_mode & stat.S_IXUSR)
    if budget.allows(info.st_size):
        digest = hashlib.sha256()
        try:
            # O_NONBLOCK: should the path have become a FIFO since lstat, open must not wait.
            fd = os.open(
                path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
            )
            with os.fdopen(fd, "rb") as handle:
                read = 0
                while read <= FILE_LIMIT and (block := handle.read(CHUNK)):
                    digest.update(block)
                    read += len(block)
        except OSError as exc:
            return "unreadable", type(exc).__name__, False
        budget.bytes_left -= read
        if read <= FILE_LIMIT:
            return "sha256", digest.hexdigest(), executable
    return "size_mtime", f"{info.st_size}:{info.st_mtime_ns}", executable


def code_state(root: Path, spec: list[str]) -> dict[str, Any]:
    """``dirty``, ``diff_sha256`` and the changed files of the work tree at ``root``
    (``spec``: the pathspec, which leaves the store out)."""
    begun = time.monotonic()
    status = git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", *spec) or b""
    paths = changed_paths(status)
    # Modified first (they are the code), then untracked; each by name.
    paths.sort(key=lambda p: (p[0] == "untracked", p[1]))
    budget = _Budget()
    digest = hashlib.sha256()
    files: list[dict[str, Any]] = []
    methods: dict[str, int] = {}
    for state, path, old in paths:
        method, identity, executable = (
            ("deleted", "", False) if state == "deleted" else identify(root / path, budget)
        )
        methods[method] = methods.get(method, 0) + 1
        for part in (state, path, old or "", method, identity, "x" if executable else "-"):
            digest.update(part.encode(errors="replace") + b"\0")
        if len(files) < FILES_LISTED:
            entry: dict[str, Any] = {
                "path": path,
                "state": state,
                "method": method,
                "identity": identity,
            }
            if old is not None:
                entry["from"] = old
            if executable:
                entry["executable"] = True
            files.append(entry)
    untracked = sum(1 for p in paths if p[0] == "untracked")
    dirty = bool(paths)
    return {
        "dirty": dirty,
        "diff_sha256": digest.hexdigest() if dirty else None,
        "modified": len(paths) - untracked,
        "untracked": untracked,
        "files": files,
        "files_total": len(paths),
        "hashing": {
            "methods": methods,
            "file_limit": FILE_LIMIT,
            "total_limit": TOTAL_LIMIT,
            "seconds_limit": SECONDS_LIMIT,
            "seconds": round(time.monotonic() - begun, 3),
        },
    }
