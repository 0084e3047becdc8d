"""The snapshot writer: hashing overlapped with Parquet writing, each content stored once,
no temporary file left behind, a failed write reported."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from snapshot_support import DTYPES, same_bits, sample

from auditlog.core.tensors import tensor_hash
from auditlog.store import blobformat, blobwriter
from auditlog.store.blobcatalog import KnownContents
from auditlog.store.blobcheck import verify_file
from auditlog.store.blobformat import SnapshotError
from auditlog.store.blobs import SnapshotStore
from auditlog.store.blobwriter import BlobWriter


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 4 KiB and every tensor written while it is hashed: the overlapped path
    with many row groups, on tensors of test size."""
    monkeypatch.setattr(blobformat, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(blobwriter, "OVERLAP_BYTES", 0)


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("hashers", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_overlapped_writes_round_trip_every_dtype_bitwise(
    tmp_path: Path, dtype: torch.dtype, hashers: int, small_chunks: None
) -> None:
    files = SnapshotStore(tmp_path)
    big = sample(dtype).repeat(100, 20)  # 60,000 elements: several 4 KiB row groups
    tensors = [big, big.t(), big[::3, 1:], big[5, 7], big[:0], sample(dtype)]
    with BlobWriter(files, hashers=hashers) as writer:
        stored = writer.store([(i, t.contiguous()) for i, t in enumerate(tensors)], KnownContents())
    for tensor, (sha, info) in zip(tensors, stored, strict=True):
        assert sha == tensor_hash(tensor)
        assert info is not None and verify_file(tmp_path, sha) == info
        assert same_bits(files.read_verified(sha, "t"), tensor.contiguous())
    assert pq.ParquetFile(files.path(stored[0][0])).num_row_groups == stored[0][1].row_groups > 1  # type: ignore[union-attr]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("hashers", [1, 3])
def test_each_content_is_written_once_and_abandoned_writes_leave_nothing(
    tmp_path: Path, hashers: int, small_chunks: None
) -> None:
    files = SnapshotStore(tmp_path)
    a, b = torch.randn(50_000), torch.randn(50_000)
    with BlobWriter(files, hashers=hashers) as writer:
        first = writer.store([(1, a), (2, a.clone()), (3, b)], KnownContents())
        assert [info is not None for _, info in first] == [
            True,
            False,
            True,
        ]  # a twice: stored once
        on_disk = sorted(p.name for p in tmp_path.rglob("*.parquet"))
        assert len(on_disk) == 2 and leftovers(tmp_path) == []
        # the next snapshot: b unchanged (already stored: its overlapped write is dropped), a changed
        stored = {sha for sha, _ in first}
        second = writer.store([(1, a + 1), (3, b)], KnownContents(stored))
        assert second[0][1] is not None and second[1][1] is None and second[1][0] == first[2][0]
        assert len(list(tmp_path.rglob("*.parquet"))) == 3 and leftovers(tmp_path) == []
        # b was unchanged last time: now it is hashed first, and still not written again
        third = writer.store([(3, b)], KnownContents(stored))
        assert third == [(first[2][0], None)] and leftovers(tmp_path) == []


def test_large_tensors_are_hashed_on_several_threads_with_several_hashers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One SHA-256 stream caps a snapshot at one core's hashing speed: with several
    hashers the leaves of a large tensor (content hash v2) are hashed on the leaf
    pool, concurrently, and the names and files are the same as hashed in turn."""
    import threading
    import time

    from auditlog.core import hashing

    running, overlapped, threads = [0], [0], set()
    lock = threading.Lock()
    real_leaf = hashing._leaf_digest

    def watched(leaf: memoryview) -> bytes:
        with lock:
            running[0] += 1
            overlapped[0] = max(overlapped[0], running[0])
            threads.add(threading.current_thread().name)
        time.sleep(0.02)  # long enough for the others to start
        try:
            return real_leaf(leaf)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(hashing, "_leaf_digest", watched)
    monkeypatch.setattr(hashing, "LEAF_BYTES", 64 * 1024)
    tensors = [torch.randn(1 << 20) for _ in range(2)]  # 4 MiB each: 64 leaves, above OVERLAP_BYTES
    outcomes = {}
    for hashers in (1, 3):
        running[0] = overlapped[0] = 0
        threads.clear()
        with BlobWriter(SnapshotStore(tmp_path / str(hashers)), hashers=hashers) as writer:
            outcomes[hashers] = writer.store(list(enumerate(tensors)), KnownContents())
        if hashers == 1:  # in turn, on the caller's thread
            assert threads == set() and overlapped[0] == 0
        else:
            assert (
                threads
                and all(name.startswith("auditlog-leaf") for name in threads)
                and overlapped[0] > 1
            )
        for sha, info in outcomes[hashers]:
            assert info is not None and verify_file(tmp_path / str(hashers), sha) == info
    assert (
        [sha for sha, _ in outcomes[1]]
        == [sha for sha, _ in outcomes[3]]
        == [tensor_hash(t) for t in tensors]
    )
    # the names are v2 and the files say so; a v1 name would differ
    assert all(
        sha != tensor_hash(t, tree=False) for (sha, _), t in zip(outcomes[1], tensors, strict=True)
    )
    for sha, _ in outcomes[3]:
        footer = pq.ParquetFile(SnapshotStore(tmp_path / "3").path(sha)).metadata.metadata
        assert footer[hashing.TREE_KEY] == hashing.TREE


def test_a_failed_write_is_an_error_and_leaves_no_file(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    root.write_text("not a directory")  # every write fails
    with (
        BlobWriter(SnapshotStore(root)) as writer,
        pytest.raises(SnapshotError, match="cannot write a snapshot file"),
    ):
        writer.store([(1, torch.randn(10)), (2, torch.randn(1 << 20))], KnownContents())
    assert root.read_text() == "not a directory"
    assert leftovers(tmp_path) == []


def test_a_write_failing_after_its_file_was_made_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file exists and is complete when the framing digest is read back:
    an error there (an I/O error, a full disk) is the snapshot's error, and the
    temporary file goes."""

    def unreadable(path: Path, dtype: str, numel: int) -> str:
        assert path.exists() and path.name.startswith(".tmp-")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(blobwriter, "written_digest", unreadable)
    files = SnapshotStore(tmp_path)
    with BlobWriter(files) as writer, pytest.raises(SnapshotError, match="Input/output error"):
        writer.store([(1, torch.randn(1 << 20))], KnownContents())
    assert leftovers(tmp_path) == [] and list(tmp_path.rglob("*.parquet")) == []


def test_cpu_and_non_contiguous_inputs_are_made_host_contiguous(tmp_path: Path) -> None:
    files = SnapshotStore(tmp_path)
    tensor = torch.randn(40, 30).t()
    with BlobWriter(files) as writer:
        ((sha, info),) = writer.store([(1, tensor)], KnownContents())
    assert info is not None and sha == tensor_hash(tensor)
    assert torch.equal(files.read_verified(sha, "t"), tensor)


@pytest.mark.parametrize("durable", [False, True])
def test_durable_writes_fsync_every_new_file_and_the_directories_before_returning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """durability=strict: a snapshot's event is committed after ``store`` returns, so
    its files (both write paths) and the renames into their directories are on disk
    by then; the other modes leave write-back to the kernel."""
    import os
    import stat

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        synced.append("dir" if stat.S_ISDIR(mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(blobwriter.os, "fsync", fsync)
    files = SnapshotStore(tmp_path)
    big = torch.randn(800_000)  # 3.2 MB: written while it is hashed
    small = [torch.randn(16) * i for i in range(3)]  # encoded in memory, written once
    with BlobWriter(files, durable=durable) as writer:
        stored = writer.store(
            [("big", big)] + [(i, t) for i, t in enumerate(small)], KnownContents()
        )
    if not durable:
        assert synced == []
        return
    assert synced.count("file") == 4
    directories = {files.path(sha).parent for sha, _ in stored} | {files.root}
    assert synced.count("dir") == len(directories) and synced[-len(directories) :] == ["dir"] * len(
        directories
    )
    for sha, _ in stored:
        assert verify_file(files.root, sha) is not None


def test_many_tensors_are_read_side_by_side_and_the_first_bad_one_is_the_error(
    tmp_path: Path,
) -> None:
    from auditlog.core.errors import IntegrityError

    files = SnapshotStore(tmp_path)
    tensors = [torch.randn(300_000) * i for i in range(1, 6)]  # 1.2 MB each: read from the file
    with BlobWriter(files) as writer:
        shas = [sha for sha, _ in writer.store(list(enumerate(tensors)), KnownContents())]
    wanted = [(sha, f"t{i}") for i, sha in enumerate(shas)] + [(shas[0], "again")]
    loaded = files.read_many(wanted)
    assert list(loaded) == shas and all(
        same_bits(loaded[s], t) for s, t in zip(shas, tensors, strict=True)
    )
    for index in (3, 1):  # two damaged files: the error names the first in order
        path = files.path(shas[index])
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"snapshot of t1 \("):
        files.read_many(wanted)
