"""Content hash versions (``auditlog.core.hashing``): v2 recomputed from its definition,
equal to v1 up to one leaf, the same however the bytes arrive and on however many
threads, with a bounded number of leaves in flight; ``tensor_hash`` and
``matches_recorded`` on top."""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from auditlog.core import hashing
from auditlog.core.hashing import HASH_PREFIX, LEAF_BYTES, TREE_PREFIX, content_hasher
from auditlog.core.tensors import matches_recorded, tensor_hash


def by_hand_v1(dtype: str, shape: list[int], data: bytes) -> str:
    head = json.dumps([dtype, shape], separators=(",", ":")).encode()
    return hashlib.sha256(HASH_PREFIX + head + b"\0" + data).hexdigest()


def by_hand_v2(dtype: str, shape: list[int], data: bytes, leaf: int = LEAF_BYTES) -> str:
    head = json.dumps([dtype, shape], separators=(",", ":")).encode()
    leaves = b"".join(
        hashlib.sha256(data[i : i + leaf]).digest() for i in range(0, len(data), leaf)
    )
    return hashlib.sha256(TREE_PREFIX + head + b"\0" + leaves).hexdigest()


def one_shot(data: bytes, dtype: str = "uint8", threads: int = 1) -> str:
    digest = content_hasher(dtype, [len(data)], len(data), threads=threads)
    digest.update(data)
    return digest.hexdigest()


@pytest.mark.parametrize("size", [0, 1, LEAF_BYTES - 1, LEAF_BYTES])
def test_up_to_one_leaf_v2_is_v1(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert one_shot(data) == by_hand_v1("uint8", [size], data)
    assert one_shot(data) == tensor_hash(
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if size
        else torch.empty(0, dtype=torch.uint8)
    )


@pytest.mark.parametrize("size", [LEAF_BYTES + 1, 2 * LEAF_BYTES, 3 * LEAF_BYTES + 12345])
def test_above_one_leaf_v2_is_its_definition_and_not_v1(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert one_shot(data) == by_hand_v2("uint8", [size], data)
    assert one_shot(data) != by_hand_v1("uint8", [size], data)
    v1 = content_hasher("uint8", [size], size, tree=False)
    v1.update(data)
    assert v1.hexdigest() == by_hand_v1("uint8", [size], data)


def test_the_header_is_in_the_root() -> None:
    data = bytes(2 * LEAF_BYTES + 8)
    assert one_shot(data, "uint8") != one_shot(data, "int8")
    wide = content_hasher("uint8", [2, LEAF_BYTES + 4], len(data))
    wide.update(data)
    assert wide.hexdigest() == by_hand_v2("uint8", [2, LEAF_BYTES + 4], data) != one_shot(data)


@pytest.mark.parametrize("threads", [1, 3])
def test_pieces_of_any_length_give_the_same_hash(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hashing, "LEAF_BYTES", 1000)
    rng = random.Random(threads)
    data = rng.randbytes(25_777)
    expected = by_hand_v2("uint8", [len(data)], data, leaf=1000)
    for _ in range(20):
        digest = content_hasher("uint8", [len(data)], len(data), threads=threads)
        position = 0
        while position < len(data):  # pieces inside a leaf, across leaves, many leaves long, empty
            step = rng.choice([0, 1, 7, 999, 1000, 1001, 2500, 6000])
            digest.update(memoryview(data)[position : position + step])
            position += step
        assert digest.hexdigest() == expected


def test_leaves_are_hashed_side_by_side_with_a_bounded_number_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hashing, "LEAF_BYTES", 4096)
    running, most, started = [0], [0], [0]
    lock = threading.Lock()
    real = hashing._leaf_digest

    def slow(leaf: memoryview) -> bytes:
        with lock:
            running[0] += 1
            started[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)
        with lock:
            running[0] -= 1
        return real(leaf)

    monkeypatch.setattr(hashing, "_leaf_digest", slow)
    data = random.Random(0).randbytes(4096 * 64)
    before = threading.active_count()
    digest = content_hasher("uint8", [len(data)], len(data), threads=4)
    assert isinstance(digest, hashing.TreeHasher)
    seen: list[int] = []
    for start in range(0, len(data), 4096 * 8):
        digest.update(data[start : start + 4096 * 8])
        seen.append(len(digest._pending))
    assert digest.hexdigest() == by_hand_v2("uint8", [len(data)], data, leaf=4096)
    assert started[0] == 64 and most[0] > 1  # on several threads at once
    assert max(seen) <= hashing._IN_FLIGHT  # never more leaves queued than the bound
    # no thread outlives the hash: verify forks its second process only when it is alone
    assert threading.active_count() == before


def test_tensor_hash_is_the_same_on_threads_and_for_any_layout() -> None:
    tensor = torch.randn(3, LEAF_BYTES // 4 + 17)  # > 3 leaves of float32
    base = tensor_hash(tensor)
    assert tensor_hash(tensor, threads=4) == base == tensor_hash(tensor.t().contiguous().t())
    raw = tensor.numpy().tobytes()
    assert base == by_hand_v2("float32", [3, LEAF_BYTES // 4 + 17], raw)
    assert tensor_hash(tensor, tree=False) == by_hand_v1("float32", [3, LEAF_BYTES // 4 + 17], raw)


def test_a_recorded_hash_matches_under_either_version() -> None:
    big, small = torch.randn(LEAF_BYTES // 2), torch.randn(10)
    assert matches_recorded(big, tensor_hash(big)) and matches_recorded(
        big, tensor_hash(big, tree=False)
    )
    assert matches_recorded(small, tensor_hash(small, tree=False))
    other = big.clone()
    other[-1] += 1
    assert not matches_recorded(other, tensor_hash(big)) and not matches_recorded(
        other, tensor_hash(big, tree=False)
    )


VECTORS = [  # docs/integrity.md lists the same
    (
        "uint8",
        [3],
        bytes([1, 2, 3]),
        "8199d3480b70222568f484f54da71b3b23d3d144243d9ad876cfa9e863808764",
    ),
    (
        "uint8",
        [LEAF_BYTES + 1],
        bytes(LEAF_BYTES + 1),
        "ab81fd72311dd8de868e92b1e3225467f3d12654423a9920562e4c68c6d23d0c",
    ),
    (
        "float32",
        [3, 1 << 20],
        bytes(12 << 20),
        "19ab8c4f7a475b3a8f72b7bcb128b7de403a32a25903047e0b932462c4fa5d0c",
    ),
]


@pytest.mark.parametrize(
    ("dtype", "shape", "data", "expected"), VECTORS, ids=["v1", "two-leaves", "three-leaves"]
)
def test_the_documented_vectors(dtype: str, shape: list[int], data: bytes, expected: str) -> None:
    by_hand = by_hand_v1 if len(data) <= LEAF_BYTES else by_hand_v2
    assert by_hand(dtype, shape, data) == expected  # hashlib alone, from the definition
    digest = content_hasher(dtype, shape, len(data), threads=2)
    digest.update(data)
    assert digest.hexdigest() == expected
    assert expected in (Path(__file__).parent.parent / "docs" / "integrity.md").read_text()
