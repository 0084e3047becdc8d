"""The content hash of a tensor, without torch: what a verifier needs to recompute it.

Two versions, told apart by a file's footer (``TREE_KEY``) and never by guessing:

- **v1** (every tensor of records made before v2, and every tensor of at most
  ``LEAF_BYTES`` since): SHA-256 over ``HASH_PREFIX``, the JSON header ``[dtype name,
  shape]`` (compact separators) and a NUL byte, then the tensor's bytes in C
  order.
- **v2** (tensors of more than ``LEAF_BYTES`` bytes in new records): the bytes
  are cut into leaves of ``LEAF_BYTES`` (the last one shorter), each leaf
  hashed with plain SHA-256, and the hash is SHA-256
  over ``TREE_PREFIX``, the same header and NUL, then the leaf digests (32
  bytes each) in order. The leaves are independent, so they are hashed on
  several cores (``update`` hands them to a thread pool): one SHA-256 stream on
  one core capped every snapshot write and every restore at its speed (issue 18;
  docs/performance.md). A tensor of at most one leaf has the
  same hash under both versions, so small tensors (most of a model's, and every
  initial value of a Linear(256)) keep their identity across versions.

Both are SHA-256 throughout (no new primitive for an auditor to accept), and a
collision of v2 is a collision of SHA-256 (the leaf count follows from the
header, which the root covers). Accepting a file under the version its footer
names cannot be abused: a forged footer only selects which of two preimage-
resistant functions the file's bytes must hash to the name under.

``content_hasher`` starts either hash from a dtype name, a shape and the byte
count alone, so the read side (``auditlog verify``, the read model's snapshot
checks) can feed it the bytes it decoded from a Parquet file with pyarrow and
numpy and never import torch; ``tensor_hash`` feeds it a tensor's bytes. One
definition, every caller: they cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the leaf threads start with the first large tensor; readers never need them
    from concurrent.futures import Future, ThreadPoolExecutor

HASH_PREFIX = b"auditlog-tensor-v1\0"
TREE_PREFIX = b"auditlog-tensor-v2\0"
LEAF_BYTES = 4 * 1024 * 1024
"""Leaf size of v2, in bytes of the tensor (also the snapshot files' row group size)."""
CONTENT_HASH_VERSION = 2
"""The version new records hash with; ``run_started`` says it (``content_hash``; absent: 1)."""
# A file's key-value metadata entry naming its content hash version (absent: v1).
TREE_KEY = b"auditlog.content_hash"
TREE = b"tree-v2"
# Leaves handed to the pool and not yet hashed, at most, per hasher: bounds the memory a
# caller that passes short-lived buffers (chunks copied from a GPU) keeps alive.
_IN_FLIGHT = 16


# A content hash as the record must spell it: SHA-256 in lowercase hex, nothing else.
_CONTENT_HASH = re.compile("[0-9a-f]{64}")
_SHOWN = 56  # characters of a malformed hash shown in a message, at most


def is_content_hash(value: object) -> bool:
    """Whether ``value`` is a content hash as the recorder writes one: exactly 64
    lowercase hex characters. Readers check this before a hash becomes a path
    (``auditlog.store.blobpaths``): a NUL, ``../``, an absolute path, another
    case or a JSON object in an edited event must never name a file."""
    return isinstance(value, str) and _CONTENT_HASH.fullmatch(value) is not None


def hash_text(value: object) -> str | None:
    """A recorded ``sha256`` field as text: None (no content) and strings as they are;
    anything else (an object, a list, a number an edited event holds) as text that
    can never be a content hash (it starts with ``<``), so it stays hashable and
    printable and is refused, by name, wherever it would become a path."""
    if value is None or isinstance(value, str):
        return value
    try:
        shown = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        shown = type(value).__name__
    return f"<{type(value).__name__} {shown}>"


def shown_hash(value: object) -> str:
    """``value`` for a one-line message: a content hash's first 16 characters, or a
    malformed one as a short ``repr`` (control characters and NUL escaped)."""
    if is_content_hash(value):
        return f"{value[:16]}..."  # type: ignore[index]
    text = repr(hash_text(value) if not isinstance(value, str) else value)
    # a long value keeps both ends: what follows 64 good characters (a newline) shows
    return text if len(text) <= _SHOWN else f"{text[: _SHOWN - 16]}...{text[-12:]}"


class Hasher(Protocol):
    """What ``content_hasher`` returns: ``hashlib``'s interface, the part callers use."""

    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


def content_hash_version(started: dict[str, Any]) -> int:
    """The content hash version of a run, from its ``run_started`` payload (1 before v2)."""
    version = started.get("content_hash")
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def header(dtype: str, shape: Sequence[int]) -> bytes:
    """The header both versions hash after their prefix: ``[dtype, shape]`` as compact JSON, NUL."""
    return json.dumps([dtype, [int(d) for d in shape]], separators=(",", ":")).encode() + b"\0"


def is_tree(nbytes: int, tree: bool = True) -> bool:
    """Whether content of ``nbytes`` bytes is hashed as v2 (``tree``: the version is v2)."""
    return tree and nbytes > LEAF_BYTES


def content_hasher(
    dtype: str, shape: Sequence[int], nbytes: int, tree: bool = True, threads: int = 1
) -> Hasher:
    """A hasher that has seen the prefix and header of a ``dtype`` tensor of ``shape``
    (``nbytes`` of content); ``update`` it with the tensor's C-order bytes and take
    ``hexdigest()``.

    ``tree``: the content hash version is v2 (new records; a file's footer says
    so, ``TREE_KEY``); False for v1. ``threads`` > 1 hashes v2 leaves on that
    many threads; the bytes passed to ``update`` must then stay unchanged until
    ``hexdigest`` returns (host copies and read targets do).
    """
    if is_tree(nbytes, tree):
        return TreeHasher(header(dtype, shape), threads)
    digest = hashlib.sha256(HASH_PREFIX)
    digest.update(header(dtype, shape))
    return digest


class TreeHasher:
    """v2: leaves of ``LEAF_BYTES`` hashed on a pool (or in turn), then the root.

    ``update`` may be called with pieces of any length: a piece that starts or
    ends inside a leaf goes into that leaf's running SHA-256 on the caller's
    thread; whole leaves inside a piece go to the pool as zero-copy views.
    """

    def __init__(self, head: bytes, threads: int = 1) -> None:
        self._root = hashlib.sha256(TREE_PREFIX)
        self._root.update(head)
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._leaves: list[bytes | Future[bytes]] = []
        self._pending: deque[Future[bytes]] = deque()
        self._open = hashlib.sha256()
        self._open_bytes = 0

    def update(self, data: Any, /) -> None:
        view = memoryview(data).cast("B")
        position = 0
        if self._open_bytes:  # finish the leaf a previous piece began
            take = min(LEAF_BYTES - self._open_bytes, len(view))
            self._take(view[:take])
            position = take
        while len(view) - position >= LEAF_BYTES:
            leaf = view[position : position + LEAF_BYTES]
            if self._threads <= 1:
                self._leaves.append(hashlib.sha256(leaf).digest())
            else:
                while len(self._pending) >= _IN_FLIGHT:
                    self._pending.popleft().result()
                if self._pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._pool = ThreadPoolExecutor(
                        self._threads, thread_name_prefix="auditlog-leaf"
                    )
                future = self._pool.submit(_leaf_digest, leaf)
                self._leaves.append(future)
                self._pending.append(future)
            position += LEAF_BYTES
        if position < len(view):
            self._take(view[position:])

    def _take(self, part: memoryview) -> None:
        self._open.update(part)
        self._open_bytes += len(part)
        if self._open_bytes == LEAF_BYTES:
            self._leaves.append(self._open.digest())
            self._open, self._open_bytes = hashlib.sha256(), 0

    def hexdigest(self) -> str:
        leaves = list(self._leaves)
        if self._open_bytes:
            leaves.append(self._open.digest())
        root = self._root.copy()
        try:
            for leaf in leaves:
                root.update(leaf if isinstance(leaf, bytes) else leaf.result())
        finally:
            self.close()
        return root.hexdigest()

    def close(self) -> None:
        """Let the leaf threads go (``hexdigest`` does). The pool is the hasher's own, not
        the process's: idle threads left behind would stop ``verify`` from forking its
        second process (``integrity.parallel`` forks only a single-threaded process),
        and making a few threads costs little against hashing a tensor that has two
        leaves."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _leaf_digest(leaf: memoryview) -> bytes:
    return hashlib.sha256(leaf).digest()
