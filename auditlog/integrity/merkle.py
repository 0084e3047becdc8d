"""Merkle trees as RFC 9162 (Certificate Transparency v2) defines them: roots and proofs.

Pure functions over leaf hashes, no store and no I/O, so a third party (or
``auditlog verify-proof``) can check a proof with nothing but this module and
the documented leaf bytes:

- leaf hash ``SHA-256(0x00 || leaf bytes)``, node hash ``SHA-256(0x01 || left || right)``;
- the tree of ``n`` leaves splits at ``k``, the largest power of two smaller
  than ``n`` (not at the midpoint); the empty tree's hash is ``SHA-256("")``;
- inclusion proofs (audit paths) and consistency proofs are the RFC's
  ``PATH`` and ``PROOF``, verified with the RFC's iterative algorithms
  (sections 2.1.3.2 and 2.1.4.2).

auditlog's leaves are the events of one stream, leaf ``i`` being the event with
``seq = i + 1``, and the leaf bytes are the event's canonical row (the bytes the
hash chain hashes, ``auditlog.core.chain.canonical_row``); see docs/integrity.md.
Hashes are raw 32-byte ``bytes`` here; callers hex-encode them for statements.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """RFC 9162's ``k``: the largest power of two strictly smaller than ``n`` (n >= 2)."""
    if n < 2:
        raise ValueError(f"a tree of {n} leaves does not split")
    return 1 << ((n - 1).bit_length() - 1)


class PackedLeaves(Sequence[bytes]):
    """Leaf hashes packed in one ``bytearray`` (32 bytes each, no per-hash object).

    A million events take 32 MB here, about half of what a list of ``bytes`` would.
    """

    def __init__(self) -> None:
        self._data = bytearray()

    def append(self, digest: bytes) -> None:
        if len(digest) != HASH_SIZE:
            raise ValueError("a leaf hash is 32 bytes")
        self._data += digest

    def packed(self) -> bytes:
        """Every leaf hash, concatenated."""
        return bytes(self._data)

    def extend_packed(self, data: bytes) -> None:
        """Append leaf hashes given concatenated (``packed`` of another)."""
        if len(data) % HASH_SIZE:
            raise ValueError("a leaf hash is 32 bytes")
        self._data += data

    def extend(self, digests: Sequence[bytes]) -> None:
        """Append many leaf hashes (each 32 bytes) at once."""
        joined = b"".join(digests)
        if len(joined) != HASH_SIZE * len(digests):
            raise ValueError("a leaf hash is 32 bytes")
        self._data += joined

    def __len__(self) -> int:
        return len(self._data) // HASH_SIZE

    def __getitem__(self, index: int) -> bytes:  # type: ignore[override]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return bytes(self._data[index * HASH_SIZE : (index + 1) * HASH_SIZE])


def _perfect_root(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    """Root of a range whose length is a power of two, level by level (no recursion)."""
    level = [leaves[i] for i in range(lo, hi)]
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def subtree_root(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    """``MTH(D[lo:hi])`` over leaf hashes."""
    n = hi - lo
    if n < 0 or lo < 0 or hi > len(leaves):
        raise ValueError(f"bad leaf range {lo}..{hi} of {len(leaves)}")
    if n == 0:
        return EMPTY_ROOT
    if n & (n - 1) == 0:
        return _perfect_root(leaves, lo, hi)
    k = split_point(n)
    return node_hash(_perfect_root(leaves, lo, lo + k), subtree_root(leaves, lo + k, hi))


def root(leaves: Sequence[bytes], size: int | None = None) -> bytes:
    """The tree head of the first ``size`` leaves (default: all)."""
    return subtree_root(leaves, 0, len(leaves) if size is None else size)


def inclusion_proof(leaves: Sequence[bytes], index: int, size: int | None = None) -> list[bytes]:
    """RFC 9162 ``PATH(index, D[0:size])``: the audit path of leaf ``index``."""
    size = len(leaves) if size is None else size
    if not 0 <= index < size <= len(leaves):
        raise ValueError(f"no leaf {index} in a tree of {size}")
    path: list[bytes] = []
    lo, hi, m = 0, size, index
    while hi - lo > 1:
        k = split_point(hi - lo)
        if m < k:
            path.append(subtree_root(leaves, lo + k, hi))
            hi = lo + k
        else:
            path.append(subtree_root(leaves, lo, lo + k))
            lo, m = lo + k, m - k
    path.reverse()  # PATH lists the siblings from the leaf up
    return path


def consistency_proof(
    leaves: Sequence[bytes], old_size: int, new_size: int | None = None
) -> list[bytes]:
    """RFC 9162 ``PROOF(old_size, D[0:new_size])``: that the old tree is a prefix of the new."""
    new_size = len(leaves) if new_size is None else new_size
    if not 0 <= old_size <= new_size <= len(leaves):
        raise ValueError(f"no consistency proof from size {old_size} to {new_size}")
    if old_size in (0, new_size):
        return []
    proof: list[bytes] = []
    lo, hi, m, whole = 0, new_size, old_size, True
    while m != hi - lo:
        k = split_point(hi - lo)
        if m <= k:
            proof.append(subtree_root(leaves, lo + k, hi))
            hi = lo + k
        else:
            proof.append(subtree_root(leaves, lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    if not whole:
        proof.append(subtree_root(leaves, lo, hi))
    proof.reverse()
    return proof


def _valid_hashes(*hashes: bytes) -> bool:
    return all(isinstance(h, bytes) and len(h) == HASH_SIZE for h in hashes)


def root_from_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes | None:
    """The root an audit path leads to (RFC 9162 2.1.3.2), or None when it is malformed."""
    if not 0 <= index < size or not _valid_hashes(leaf, *path):
        return None
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(
    index: int, size: int, leaf: bytes, path: Sequence[bytes], expected_root: bytes
) -> bool:
    """Does ``path`` prove leaf hash ``leaf`` is leaf ``index`` of the tree with head ``expected_root``?"""
    found = root_from_inclusion(index, size, leaf, path)
    return found is not None and found == expected_root


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Does ``proof`` show the tree of ``old_size`` (``old_root``) is a prefix of ``new_root``'s?

    RFC 9162 2.1.4.2, with its two degenerate cases spelled out: equal sizes need
    an empty proof and equal roots; the empty old tree is a prefix of anything.
    """
    if not 0 <= old_size <= new_size or not _valid_hashes(old_root, new_root, *proof):
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


class Frontier:
    """The right edge of a growing tree: its root at any size in O(log n) memory.

    Holds the roots of the perfect subtrees the leaves so far decompose into
    (sizes are the binary digits of the leaf count, largest first); the tree
    head is their right fold, which is exactly RFC 9162's split. The writer keeps
    one per stream to sign tree heads as it records; ``verify`` keeps one to
    check every signed head in one pass.
    """

    __slots__ = ("_stack", "size")

    def __init__(self) -> None:
        self._stack: list[tuple[int, bytes]] = []
        self.size = 0

    def append(self, digest: bytes) -> None:
        """Add a leaf hash."""
        stack = self._stack
        stack.append((1, digest))
        while len(stack) > 1 and stack[-1][0] == stack[-2][0]:
            (size, right), (_, left) = stack.pop(), stack.pop()
            stack.append((size * 2, node_hash(left, right)))
        self.size += 1

    def extend(self, digests: Iterable[bytes]) -> None:
        for digest in digests:
            self.append(digest)

    def append_subtree(self, width: int, digest: bytes) -> None:
        """Add ``width`` leaves at once, given the head of their perfect subtree: ``width``
        a power of two dividing the current size (the subtree is one of the tree's own)."""
        if width < 1 or width & (width - 1) or self.size % width:
            raise ValueError(f"a subtree of {width} leaves does not start at leaf {self.size}")
        stack = self._stack
        self.size += width
        while stack and stack[-1][0] == width:
            digest = node_hash(stack.pop()[1], digest)
            width *= 2
        stack.append((width, digest))

    def extend_marked(
        self, digests: Iterable[bytes], marks: frozenset[int] | set[int]
    ) -> dict[int, bytes]:
        """Add many leaf hashes; return the tree head at each size in ``marks`` passed on
        the way. ``append``'s work in one loop with local names (verify adds a million)."""
        stack = self._stack
        size = self.size
        sha256 = hashlib.sha256
        heads: dict[int, bytes] = {}
        for digest in digests:
            width = 1
            while stack and stack[-1][0] == width:
                digest = sha256(b"\x01" + stack.pop()[1] + digest).digest()
                width *= 2
            stack.append((width, digest))
            size += 1
            if marks and size in marks:
                self.size = size
                heads[size] = self.root()
        self.size = size
        return heads

    def root(self) -> bytes:
        """The tree head of the leaves so far."""
        if not self._stack:
            return EMPTY_ROOT
        acc = self._stack[-1][1]
        for _, digest in reversed(self._stack[:-1]):
            acc = node_hash(digest, acc)
        return acc
