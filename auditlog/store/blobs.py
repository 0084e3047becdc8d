"""Content-addressed tensor snapshots in Parquet (pyarrow, zstd).

One file per distinct tensor content, at ``snapshots/<h[:2]>/<h>.parquet`` where
``h`` is ``auditlog.tensor_hash`` (SHA-256 over dtype, shape and C-order bytes):
an identical tensor (a tied weight, a frozen layer, an unchanged buffer) is stored
once however often it is snapshotted, and a file can be checked against its name.

Layout inside a file:
- dtypes Arrow has (float16/32/64, int8..64, uint8..64, bool) are a single column
  ``value`` with one row per element in C order, so DuckDB can read values
  directly;
- dtypes Arrow lacks (bfloat16, the float8 family, complex, ...) are a single
  column ``raw`` (binary) with one row per chunk of the tensor's bytes.
Either way the tensor is written in chunks of at most ``CHUNK_BYTES`` (16 MiB) of source
data, one row group per chunk, so a huge tensor never needs a second full copy in
memory. The schema metadata repeats dtype, shape and hash.

Files are written to a temporary name and renamed, so a crash never leaves a
partial file under a content name.

Readers trust nothing but the content hash: a file's location comes from the
hash alone (never from the catalog's ``file`` column), its Parquet schema must
be exactly the one column its dtype calls for (``check_schema``: an extra
column holding other values is refused, since SQL readers select by name), and
``read_verified`` recomputes the content hash of what it decoded and compares it
with the hash the chain recorded. The ``snapshot_blobs`` catalog is a cache of
facts about each file; ``check`` reports every field in which it disagrees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from auditlog.core.errors import AuditlogError, IntegrityError
from auditlog.core.tensors import dtype_name, tensor_hash

# Source bytes per chunk (one row group each): bounds the writer's extra memory.
CHUNK_BYTES = 16 * 1024 * 1024

# torch dtype -> (numpy dtype, arrow type) for dtypes stored natively.
_NATIVE: dict[torch.dtype, tuple[Any, pa.DataType]] = {
    torch.float64: (np.float64, pa.float64()),
    torch.float32: (np.float32, pa.float32()),
    torch.float16: (np.float16, pa.float16()),
    torch.int64: (np.int64, pa.int64()),
    torch.int32: (np.int32, pa.int32()),
    torch.int16: (np.int16, pa.int16()),
    torch.int8: (np.int8, pa.int8()),
    torch.uint8: (np.uint8, pa.uint8()),
    torch.bool: (np.bool_, pa.bool_()),
}
for _name, _np, _pa in (("uint16", np.uint16, pa.uint16()), ("uint32", np.uint32, pa.uint32()), ("uint64", np.uint64, pa.uint64())):
    if hasattr(torch, _name):
        _NATIVE[getattr(torch, _name)] = (_np, _pa)

_BY_NAME: dict[str, torch.dtype] = {
    dtype_name(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}


class SnapshotError(AuditlogError):
    """A snapshot file is missing, unreadable or does not match its content hash."""


def expected_schema(dtype: str) -> list[tuple[str, pa.DataType]]:
    """The only columns a snapshot file of ``dtype`` may have: ``value`` natively, else ``raw``."""
    native = _NATIVE.get(dtype_from_name(dtype))
    return [("value", native[1])] if native else [("raw", pa.large_binary())]


def dtype_from_name(name: str) -> torch.dtype:
    """``'bfloat16'`` -> ``torch.bfloat16``; unknown names are an error."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SnapshotError(f"unknown dtype {name!r} in snapshot") from None


@dataclass(frozen=True)
class BlobInfo:
    """One stored tensor content: the catalog row the event store keeps."""

    sha256: str
    file: str
    dtype: str
    shape: list[int]
    numel: int
    nbytes: int
    layout: str
    row_groups: int
    file_sha256: str = ""

    def as_row(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "file": self.file,
            "dtype": self.dtype,
            "shape": json.dumps(self.shape),
            "numel": self.numel,
            "nbytes": self.nbytes,
            "layout": self.layout,
            "row_groups": self.row_groups,
            "file_sha256": self.file_sha256,
        }


def _chunks(flat: torch.Tensor) -> Any:
    per_chunk = max(1, CHUNK_BYTES // max(1, flat.element_size()))
    for start in range(0, flat.numel(), per_chunk):
        part = flat[start : start + per_chunk]
        if part.device.type != "cpu":
            part = part.cpu()
        yield part.contiguous()


class SnapshotStore:
    """The ``snapshots/`` directory of a store."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def relpath(self, sha256: str) -> str:
        return f"{sha256[:2]}/{sha256}.parquet"

    def path(self, sha256: str) -> Path:
        return self.root / self.relpath(sha256)

    def put(self, tensor: torch.Tensor, sha256: str | None = None) -> BlobInfo:
        """Store ``tensor`` (if its content is not stored yet) and describe it."""
        tensor = tensor.detach()
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise SnapshotError(f"cannot snapshot a {tensor.layout} / quantized tensor")
        digest = sha256 or tensor_hash(tensor)
        native = _NATIVE.get(tensor.dtype)
        flat = tensor.reshape(-1)
        per_chunk = max(1, CHUNK_BYTES // max(1, flat.element_size()))
        info = BlobInfo(
            sha256=digest,
            file=self.relpath(digest),
            dtype=dtype_name(tensor.dtype),
            shape=list(tensor.shape),
            numel=tensor.numel(),
            nbytes=tensor.numel() * tensor.element_size(),
            layout="native" if native else "raw",
            row_groups=max(1, -(-flat.numel() // per_chunk)),
        )
        target = self.path(digest)
        if target.exists():
            return dataclasses.replace(info, file_sha256=file_digest(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        field = pa.field("value", native[1]) if native else pa.field("raw", pa.large_binary())
        metadata = {
            b"auditlog.sha256": digest.encode(),
            b"auditlog.dtype": info.dtype.encode(),
            b"auditlog.shape": json.dumps(info.shape).encode(),
        }
        schema = pa.schema([field], metadata=metadata)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=target.parent)
        os.close(fd)
        try:
            # Dictionary encoding never pays for weights and costs ~2x the time (measured).
            with pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=False) as writer:
                wrote = False
                for part in _chunks(flat):
                    if native:
                        column = pa.array(part.numpy(), type=native[1])
                    else:
                        column = pa.array([part.view(torch.uint8).numpy().tobytes()], type=pa.large_binary())
                    writer.write_table(pa.Table.from_arrays([column], schema=schema))
                    wrote = True
                if not wrote:  # empty tensor: one empty row group keeps the schema
                    writer.write_table(schema.empty_table())
            file_sha256 = file_digest(Path(tmp))
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return dataclasses.replace(info, file_sha256=file_sha256)

    def get(self, info: BlobInfo | dict[str, Any]) -> torch.Tensor:
        """Read a stored tensor back, chunk by chunk into its final buffer."""
        blob = info if isinstance(info, BlobInfo) else blob_from_row(info)
        dtype = dtype_from_name(blob.dtype)
        out = torch.empty(blob.numel, dtype=dtype)
        path = self.path(blob.sha256)
        if not path.exists():
            raise SnapshotError(f"snapshot file {blob.file!r} is missing")
        try:
            reader = pq.ParquetFile(path)
            position = 0
            # Write straight into the numpy view of the result: no intermediate tensor.
            target = (out.view(torch.uint8) if blob.layout == "raw" else out).numpy()
            for index in range(reader.num_row_groups):
                column = reader.read_row_group(index).column(0)
                if blob.layout == "native":
                    values = column.to_numpy(zero_copy_only=False)
                    target[position : position + len(values)] = values
                    position += len(values)
                else:
                    for chunk in column.to_pylist():
                        data = np.frombuffer(chunk, dtype=np.uint8)
                        target[position : position + len(data)] = data
                        position += len(data)
        except (OSError, pa.ArrowException, ValueError, RuntimeError) as exc:
            raise SnapshotError(f"snapshot file {blob.file!r} is unreadable: {exc}") from exc
        expected = blob.numel if blob.layout == "native" else blob.nbytes
        if position != expected:
            raise SnapshotError(f"snapshot file {blob.file!r} holds {position} of {expected} elements/bytes")
        return out.reshape(blob.shape)

    def describe(self, sha256: str, digest: bool = True) -> BlobInfo:
        """What the file named by ``sha256`` holds, from the file alone (no catalog).

        Raises ``SnapshotError`` when it is missing, unreadable or not exactly a
        snapshot's schema. Its facts are not evidence until ``read_verified``
        found the decoded content hashing to ``sha256``.
        """
        path = self.path(sha256)
        relpath = self.relpath(sha256)
        if not path.exists():
            raise SnapshotError(f"snapshot file {relpath!r} is missing")
        try:
            reader = pq.ParquetFile(path)
            schema = reader.schema_arrow
            meta = schema.metadata or {}
            dtype = meta[b"auditlog.dtype"].decode()
            shape = [int(d) for d in json.loads(meta[b"auditlog.shape"].decode())]
            row_groups = reader.num_row_groups
        except (OSError, pa.ArrowException, ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"snapshot file {relpath!r} is unreadable: {exc}") from exc
        check_schema(schema, dtype, relpath)
        numel = 1
        for dim in shape:
            numel *= dim
        native = dtype_from_name(dtype) in _NATIVE
        return BlobInfo(
            sha256=sha256,
            file=relpath,
            dtype=dtype,
            shape=shape,
            numel=numel,
            nbytes=numel * torch.empty((), dtype=dtype_from_name(dtype)).element_size(),
            layout="native" if native else "raw",
            row_groups=row_groups,
            file_sha256=file_digest(path) if digest else "",
        )

    def read_verified(self, sha256: str, what: str) -> torch.Tensor:
        """The tensor whose content hash the chain recorded as ``sha256``, or ``IntegrityError``.

        ``what`` names the tensor in the error (``model.0.weight at step 4``),
        which also names the file: a missing, malformed or substituted file is a
        damaged record (exit 4), never a silently different value.
        """
        where = f"snapshots/{self.relpath(sha256)}"
        try:
            tensor = self.get(self.describe(sha256, digest=False))
        except SnapshotError as exc:
            raise IntegrityError(f"snapshot of {what} ({where}) cannot be used: {_reason(exc)}") from exc
        actual = tensor_hash(tensor)
        if actual != sha256:
            raise IntegrityError(
                f"snapshot of {what} ({where}) does not hold the recorded content: it hashes to "
                f"{actual[:16]}..., the record says {sha256[:16]}... (file replaced or modified)"
            )
        return tensor

    def check(self, sha256: str, row: dict[str, Any] | None) -> list[str]:
        """What is wrong with the stored content ``sha256`` and its catalog row (empty: nothing).

        The file must exist, have exactly a snapshot's schema and decode to
        content hashing to its name; the catalog row (a cache) must exist and
        agree with the file in every field.
        """
        try:
            found = self.describe(sha256)
            tensor = self.get(found)
        except SnapshotError as exc:
            return [_reason(exc)]
        actual = tensor_hash(tensor)
        if actual != sha256:
            return [f"content hash {actual[:16]}... does not match its name (file modified)"]
        if row is None:
            return ["not in the snapshot catalog (catalog row deleted)"]
        try:
            listed = blob_from_row(row)
        except (KeyError, TypeError, ValueError) as exc:
            return [f"catalog row is garbled ({exc})"]
        problems = []
        for field in ("file", "dtype", "shape", "numel", "nbytes", "layout", "row_groups", "file_sha256"):
            if getattr(listed, field) != getattr(found, field):
                problems.append(
                    f"catalog row disagrees with the file: {field} is {getattr(listed, field)!r} in the "
                    f"catalog, {getattr(found, field)!r} by the file (catalog edited)"
                )
        return problems


def check_schema(schema: pa.Schema, dtype: str, relpath: str) -> None:
    """``SnapshotError`` unless ``schema`` is exactly the one column ``dtype`` calls for."""
    expected = expected_schema(dtype)
    actual = [(f.name, f.type) for f in schema]
    if actual != expected:
        shown = ", ".join(f"{n}: {t}" for n, t in actual)
        wanted = ", ".join(f"{n}: {t}" for n, t in expected)
        raise SnapshotError(
            f"snapshot file {relpath!r} has columns [{shown}]; a {dtype} snapshot has exactly "
            f"[{wanted}] (file rewritten)"
        )


def _reason(exc: SnapshotError) -> str:
    """A ``SnapshotError`` message without the file name (the caller names the file)."""
    text = str(exc)
    if text.endswith(" is missing"):
        return "missing"
    if " is unreadable: " in text:
        return "unreadable (file modified or damaged): " + text.split(" is unreadable: ", 1)[1]
    if " has columns " in text:
        return "has columns " + text.split(" has columns ", 1)[1]
    return text


def blob_from_row(row: dict[str, Any]) -> BlobInfo:
    """A catalog row (from the event store) as a ``BlobInfo``."""
    shape = row["shape"]
    return BlobInfo(
        sha256=row["sha256"],
        file=row["file"],
        dtype=row["dtype"],
        shape=json.loads(shape) if isinstance(shape, str) else list(shape),
        numel=int(row["numel"]),
        nbytes=int(row["nbytes"]),
        layout=row["layout"],
        row_groups=int(row["row_groups"]),
        file_sha256=str(row.get("file_sha256") or ""),
    )


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
