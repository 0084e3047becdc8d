"""The framing digest: the writer's catalog digest covers every byte outside the values,
the content hash the values, so one changed byte anywhere is caught, with one
SHA-256 pass over the values when writing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq
import pytest
import torch
from snapshot_support import same_bits, write_legacy

from auditlog.core.errors import IntegrityError
from auditlog.store import blobformat
from auditlog.store.blobcatalog import KnownContents
from auditlog.store.blobcheck import framing_digest, unchanged, verify_file
from auditlog.store.blobformat import (
    FILE_DIGEST_KEY,
    FRAMING,
    SnapshotFile,
    file_digest,
    value_spans,
)
from auditlog.store.blobs import SnapshotStore
from auditlog.store.blobwriter import BlobWriter


class Framed(NamedTuple):
    """A framed file as written: where it is, its bytes, its value spans and its catalog digest."""

    files: SnapshotStore
    sha: str
    path: Path
    data: bytes
    spans: list[tuple[int, int]]
    digest: str


def framed_file(root: Path, monkeypatch: pytest.MonkeyPatch) -> Framed:
    """A float32 file of 7 row groups written through the pool (framed)."""
    monkeypatch.setattr(blobformat, "CHUNK_BYTES", 64 * 1024)
    files = SnapshotStore(root)
    with BlobWriter(files) as writer:
        ((sha, info),) = writer.store([("w", torch.randn(100_000))], KnownContents())
    assert info is not None
    path = files.path(sha)
    metadata = pq.read_metadata(path)
    assert metadata.metadata[FILE_DIGEST_KEY] == FRAMING
    spans = value_spans(metadata, "float32", 100_000)
    assert spans is not None and len(spans) == 7 and sum(n for _, n in spans) == 400_000
    return Framed(files, sha, path, path.read_bytes(), spans, info.file_sha256)


def test_pool_files_are_framed_and_their_digest_leaves_out_exactly_the_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, sha, path, data, spans, digest = framed_file(tmp_path, monkeypatch)
    # recomputed by hand: prefix, [size, spans], then the bytes between the spans
    expected = hashlib.sha256(b"auditlog-framing-v1\0")
    expected.update(f"[{len(data)},{[list(s) for s in spans]}]".replace(" ", "").encode() + b"\0")
    position = 0
    for offset, length in [*spans, (len(data), 0)]:
        expected.update(data[position:offset])
        position = offset + length
    assert digest == expected.hexdigest() != file_digest(path)
    assert verify_file(tmp_path, sha).file_sha256 == digest
    assert files.check(sha, {**files.describe(sha).as_row(), "file_sha256": digest}) == []
    # the values between the spans are the tensor's bytes, as they are
    assert (
        b"".join(data[o : o + n] for o, n in spans)
        == files.read_verified(sha, "w").numpy().tobytes()
    )
    # small files (written in one piece) keep the digest of every byte
    with BlobWriter(files) as writer:
        ((small, info),) = writer.store([("b", torch.randn(8))], KnownContents())
    assert info is not None and info.file_sha256 == file_digest(files.path(small))
    assert FILE_DIGEST_KEY not in (pq.read_metadata(files.path(small)).metadata or {})


def test_every_changed_byte_outside_the_values_and_any_inside_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, sha, path, original, spans, digest = framed_file(tmp_path, monkeypatch)
    inside = {o + n // 2 for o, n in spans} | {spans[0][0], spans[-1][0] + spans[-1][1] - 1}
    outside = [i for i in range(len(original)) if not any(o <= i < o + n for o, n in spans)]
    assert 200 < len(outside) < 5000
    row = {**files.describe(sha).as_row(), "file_sha256": digest}
    values = files.read_verified(sha, "w")
    missed, wrong = [], []
    for position in [*outside, *sorted(inside)]:
        changed = bytearray(original)
        changed[position] ^= 0x01
        path.write_bytes(bytes(changed))
        if files.check(sha, row) == [] or unchanged(tmp_path, sha, digest):
            missed.append(position)
        # restore checks the values only: the recorded ones, or refused (never another
        # value, never a crash: pyarrow aborts on some forged footers if asked the codec)
        try:
            if not same_bits(files.read_verified(sha, "w"), values):
                wrong.append(position)
        except IntegrityError:
            pass
    path.write_bytes(original)
    assert missed == [] and wrong == []
    assert files.check(sha, row) == [] and unchanged(tmp_path, sha, digest)


def test_the_framing_digest_is_defined_for_any_bytes() -> None:
    data = bytes(range(256)) * 4
    read = lambda offset, length: data[offset : offset + length]  # noqa: E731
    whole = framing_digest(read, len(data), [])
    # spans out of order or past the end count as none: every byte is covered
    assert framing_digest(read, len(data), [(100, 10), (50, 10)]) == whole
    assert framing_digest(read, len(data), [(1000, 100)]) == whole
    # a byte inside a span is left to the content hash; the spans themselves are covered
    inside = bytearray(data)
    inside[105] ^= 1
    assert framing_digest(
        lambda o, n: bytes(inside[o : o + n]), len(data), [(100, 10)]
    ) == framing_digest(read, len(data), [(100, 10)])
    assert framing_digest(read, len(data), [(100, 10)]) != framing_digest(
        read, len(data), [(100, 11)]
    )


def test_files_without_the_marking_keep_the_digest_of_every_byte(tmp_path: Path) -> None:
    tensor = torch.randn(2_000_000)  # above WHOLE_FILE_BYTES: digested from the file
    sha = write_legacy(tmp_path, tensor)
    path = tmp_path / blobformat.relpath(sha)
    with SnapshotFile(tmp_path, sha) as found:
        assert not found.framed
    assert verify_file(tmp_path, sha).file_sha256 == file_digest(path)
    assert unchanged(tmp_path, sha, file_digest(path))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert not unchanged(tmp_path, sha, hashlib.sha256(b"").hexdigest())
