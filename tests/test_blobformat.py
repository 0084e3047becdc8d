"""The snapshot file format without torch: content hashes recomputed with pyarrow and
numpy, files of the layout before issue 18 still read, one changed byte caught."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from snapshot_support import DTYPES, same_bits, sample, write_legacy

from auditlog.core.errors import IntegrityError
from auditlog.core.tensors import dtype_name, tensor_hash
from auditlog.store import blobformat
from auditlog.store.blobcheck import verify_file
from auditlog.store.blobformat import (
    ITEMSIZE,
    SnapshotError,
    file_digest,
    legacy_row_groups,
)
from auditlog.store.blobs import SnapshotStore


def test_itemsize_table_matches_every_torch_dtype() -> None:
    dtypes = {dtype_name(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
    for name, dtype in dtypes.items():
        if name.startswith(("qint", "quint")):
            continue  # quantized tensors are refused by the writer
        assert ITEMSIZE.get(name) == dtype.itemsize, name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_free_verification_recomputes_tensor_hash(tmp_path: Path, dtype: torch.dtype) -> None:
    store = SnapshotStore(tmp_path)
    full = sample(dtype)
    for tensor in (full, full.t(), full[2, 3], full[:0]):
        info = store.put(tensor)
        assert (
            verify_file(tmp_path, info.sha256) == info
        )  # the writer's catalog row, by the file alone
        assert info.sha256 == tensor_hash(tensor)


def test_verification_imports_no_torch(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    rows = [
        store.put(sample(d)).as_row()
        for d in (torch.float32, torch.bfloat16, torch.bool, torch.complex64)
    ]
    probe = (
        "import sys, json; from pathlib import Path\n"
        "from auditlog.store.blobs import SnapshotStore\n"
        "files = SnapshotStore(Path(sys.argv[1]))\n"
        "problems = [files.check(row['sha256'], row) for row in json.loads(sys.argv[2])]\n"
        "print(json.dumps({'problems': problems, 'torch': 'torch' in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path), json.dumps(rows)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
    assert report == {"problems": [[], [], [], []], "torch": False}, done.stderr


def test_new_files_floats_uncompressed_integers_zstd_no_statistics(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for tensor, codec in (
        (torch.randn(100), "UNCOMPRESSED"),
        (torch.randn(100).bfloat16(), "UNCOMPRESSED"),
        (torch.arange(100), "ZSTD"),
        (torch.ones(100, dtype=torch.bool), "ZSTD"),
    ):
        path = store.path(store.put(tensor).sha256)
        meta = pq.ParquetFile(path).metadata
        column = meta.row_group(0).column(0)
        assert column.compression == codec, tensor.dtype
        assert not column.is_stats_set
        assert pq.ParquetFile(path).schema_arrow.field(0).nullable is False
        assert (
            meta.metadata[b"auditlog.sha256"].decode() == path.stem
        )  # added once the hash is known


def test_files_written_before_issue_18_still_read_and_verify(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    big = torch.randn(
        2_500_000
    )  # one chunk (up to 4Mi rows), which pyarrow split into 3 row groups
    for tensor in (big, torch.arange(1000), torch.randn(300).bfloat16()):
        sha = write_legacy(tmp_path, tensor)
        assert same_bits(store.read_verified(sha, "old"), tensor)
        # the catalog row that writer made counted chunks, not the file's row groups
        row = {
            **store.describe(sha).as_row(),
            "file_sha256": file_digest(store.path(sha)),
            "row_groups": blobformat.legacy_chunks(dtype_name(tensor.dtype), tensor.numel()),
        }
        assert store.check(sha, row) == []
    assert (
        legacy_row_groups("float32", big.numel())
        == pq.ParquetFile(store.path(tensor_hash(big, tree=False))).num_row_groups
        == 3
    )


def test_a_null_value_in_an_old_nullable_column_is_refused(tmp_path: Path) -> None:
    tensor = torch.arange(4.0)
    sha = write_legacy(tmp_path, tensor)
    path = tmp_path / sha[:2] / f"{sha}.parquet"
    table = pq.read_table(path)
    pq.write_table(
        table.set_column(0, "value", pa.array([0.0, None, 2.0, 3.0], pa.float32())), path
    )
    with pytest.raises(SnapshotError, match="null values"):
        verify_file(tmp_path, sha)
    with pytest.raises(IntegrityError, match="null values"):
        SnapshotStore(tmp_path).read_verified(sha, "t")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_a_file_is_checked_under_the_hash_version_its_footer_names(
    tmp_path: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor over one leaf is named by content hash v2 and its file says so; every
    reader checks it as v2, a changed value is caught, and a footer that no longer
    names the version (or names it on a v1 file) makes the file fail its name."""
    from auditlog.core import hashing

    monkeypatch.setattr(hashing, "LEAF_BYTES", 64 * 1024)  # 64 KiB leaves: v2 at test size
    store = SnapshotStore(tmp_path)
    tensor = (torch.randn(100_000) * 100).to(dtype)  # 200-800 KB: several leaves
    info = store.put(tensor)
    assert info.sha256 == tensor_hash(tensor) != tensor_hash(tensor, tree=False)
    path = store.path(info.sha256)
    assert pq.ParquetFile(path).metadata.metadata[hashing.TREE_KEY] == hashing.TREE
    assert (
        verify_file(tmp_path, info.sha256) == info and store.check(info.sha256, info.as_row()) == []
    )
    assert same_bits(store.read_verified(info.sha256, "t"), tensor)
    v2_bytes = path.read_bytes()

    rewrite_footer(
        path, {b"auditlog.sha256": info.sha256.encode()}
    )  # the version dropped: checked as v1
    with pytest.raises(SnapshotError, match="does not match its name"):
        verify_file(tmp_path, info.sha256)
    with pytest.raises(IntegrityError, match="does not hold the recorded content"):
        store.read_verified(info.sha256, "t")
    # a v1 file (an older record) claiming v2 fails the same way
    old = write_legacy(tmp_path / "old", tensor)
    assert verify_file(tmp_path / "old", old).sha256 == old
    rewrite_footer(
        SnapshotStore(tmp_path / "old").path(old),
        {b"auditlog.sha256": old.encode(), hashing.TREE_KEY: hashing.TREE},
    )
    with pytest.raises(SnapshotError, match="does not match its name"):
        verify_file(tmp_path / "old", old)
    # the v2 file back as written: good again; then one value byte changed
    path.write_bytes(v2_bytes)
    assert verify_file(tmp_path, info.sha256) == info
    data = bytearray(v2_bytes)
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    assert store.check(info.sha256, info.as_row()) != []
    with pytest.raises(IntegrityError):
        store.read_verified(info.sha256, "t")


def rewrite_footer(path: Path, footer: dict[bytes, bytes]) -> None:
    """The file's values and schema written again under another key-value footer."""
    table = pq.read_table(io.BytesIO(path.read_bytes()))
    with pq.ParquetWriter(path, table.schema, compression="none") as writer:
        writer.write_table(table)
        writer.add_key_value_metadata(footer)


def test_one_changed_byte_is_caught_by_every_reader(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for tensor in (torch.randn(1000), torch.randn(1000).bfloat16(), torch.arange(1000)):
        info = store.put(tensor)
        path = store.path(info.sha256)
        data = bytearray(path.read_bytes())
        # a byte inside the values (after the magic and page header, before the footer)
        data[len(data) // 4] ^= 0x01
        path.write_bytes(bytes(data))
        assert store.check(info.sha256, info.as_row()) != []
        with pytest.raises((SnapshotError,)):
            verify_file(tmp_path, info.sha256)
        with pytest.raises(IntegrityError):
            store.read_verified(info.sha256, "t")


def test_a_file_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    tensor = torch.randn(10)
    info = store.put(tensor)
    path = store.path(info.sha256)
    table = pq.read_table(path)
    # the same values plus one: the shape in the metadata no longer matches what is stored
    longer = pa.table({"value": pa.array([*table.column(0).to_pylist(), 1.0], pa.float32())})
    pq.write_table(longer.replace_schema_metadata(table.schema.metadata), path)
    assert store.check(info.sha256, info.as_row()) == ["holds 44 of 40 bytes (file modified)"]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.complex64, torch.float16], ids=str
)
def test_large_float_files_are_read_straight_into_the_tensor(
    tmp_path: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New float files hold one data page per row group, their values as they are in
    memory: restore reads them with preadv (no decode), several row groups included."""
    monkeypatch.setattr(blobformat, "CHUNK_BYTES", 1 << 20)  # 1 MiB row groups: several per file
    store = SnapshotStore(tmp_path)
    tensor = torch.randn(2_500_000).to(dtype)  # above WHOLE_FILE_BYTES (4 MiB): read from the file
    info = store.put(tensor)
    with blobformat.SnapshotFile(tmp_path, info.sha256) as found:
        spans = found.direct_spans()
        assert spans is not None and len(spans) == info.row_groups > 1
        decoded = bytearray(found.nbytes)
    assert same_bits(store.read_verified(info.sha256, "t"), tensor)
    # the decode path agrees byte for byte
    with blobformat.SnapshotFile(tmp_path, info.sha256) as found:
        target = np.frombuffer(decoded, dtype=np.uint8)
        digest = found.hasher()
        found.read_into(target, digest)
        assert digest.hexdigest() == info.sha256
    assert bytes(decoded) == tensor.view(torch.uint8).numpy().tobytes()


def test_a_changed_byte_in_a_directly_read_file_is_refused_and_old_layouts_are_decoded(
    tmp_path: Path,
) -> None:
    store = SnapshotStore(tmp_path)
    tensor = torch.randn(1_500_000)
    info = store.put(tensor)
    path = store.path(info.sha256)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not hold the recorded content"):
        store.read_verified(info.sha256, "t")
    # pyarrow's default pages (1 MiB, 20,000 rows): values not contiguous, so decoded
    sha = write_legacy(tmp_path / "old", tensor)
    with blobformat.SnapshotFile(tmp_path / "old", sha) as found:
        assert found.direct_spans() is None
    assert same_bits(SnapshotStore(tmp_path / "old").read_verified(sha, "old"), tensor)
