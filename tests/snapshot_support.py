"""Tensors of every dtype, a bitwise comparison and snapshot files as the writer
before issue 18 made them: shared by the snapshot, blob-format and blob-check tests."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from auditlog.core.tensors import dtype_name, tensor_hash
from auditlog.store import blobformat

FLOAT8 = [
    getattr(torch, n)
    for n in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    )
    if hasattr(torch, n)
]
UNSIGNED = [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]
DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
    *FLOAT8,
    *UNSIGNED,
]


def sample(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=gen, dtype=torch.float64) * 20
    if dtype.is_complex:
        return torch.randn(6, 5, generator=gen, dtype=dtype)
    if dtype == torch.bool:
        return base > 0
    if dtype in FLOAT8:
        return base.abs().to(torch.float32).to(dtype)
    if dtype in UNSIGNED:
        return base.abs().to(torch.int64).to(dtype)
    return base.to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(
        torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def write_legacy(root: Path, tensor: torch.Tensor) -> str:
    """A file as the writer before issue 18 made it: zstd, statistics, a nullable column,
    16 MiB chunks that pyarrow split into row groups of 1Mi rows, named by content
    hash v1 (no version in its footer)."""
    sha = tensor_hash(tensor, tree=False)
    path = root / sha[:2] / f"{sha}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    native = {torch.float32: pa.float32(), torch.int64: pa.int64()}.get(tensor.dtype)
    field = pa.field("value", native) if native is not None else pa.field("raw", pa.large_binary())
    schema = pa.schema(
        [field],
        metadata={
            b"auditlog.sha256": sha.encode(),
            b"auditlog.dtype": dtype_name(tensor.dtype).encode(),
            b"auditlog.shape": json.dumps(list(tensor.shape)).encode(),
        },
    )
    flat = tensor.reshape(-1)
    per_chunk = blobformat.LEGACY_CHUNK_BYTES // flat.element_size()
    with pq.ParquetWriter(path, schema, compression="zstd", use_dictionary=False) as writer:
        for start in range(0, flat.numel(), per_chunk):
            part = flat[start : start + per_chunk]
            column = (
                pa.array(part.numpy(), type=native)
                if native is not None
                else pa.array([part.view(torch.uint8).numpy().tobytes()], type=pa.large_binary())
            )
            writer.write_table(pa.Table.from_arrays([column], schema=schema))
    return sha
