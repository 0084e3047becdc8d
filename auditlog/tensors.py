"""Tensor statistics and content hashes.

Statistics are split in two halves on purpose. ``device_stats`` runs inside hooks:
it launches a handful of reductions and stacks them into two small tensors on the
tensor's own device, without reading any value back (no host-device sync). The
writer thread later calls ``StatsRecord.resolve`` to turn them into plain numbers.
Hashing (``tensor_hash``) only ever runs on the writer thread.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import torch

_FAST_FLOATS = (torch.float32, torch.float64)
HASH_PREFIX = b"auditlog-tensor-v1\0"
CHUNK_BYTES = 64 * 1024 * 1024


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``'float32'``: the name used in events and hashes."""
    return str(dtype).removeprefix("torch.")


def finite_or_text(value: float) -> float | str:
    """JSON has no NaN/Infinity; encode them as strings so no information is lost."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def stat_float(value: object) -> float | None:
    """A stored statistic back as a float (the inverse of ``finite_or_text``); None if absent."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


class StatsRecord:
    """Statistics of one tensor as launched on the hot path, resolved on the writer.

    Holds only small result tensors (7 numbers), never the tensor itself, so an
    activation is not kept alive by the queue.
    """

    __slots__ = ("counts", "dtype", "floats", "numel", "shape")

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        numel: int,
        floats: torch.Tensor | None,
        counts: torch.Tensor | None,
    ) -> None:
        self.shape = shape
        self.dtype = dtype
        self.numel = numel
        self.floats = floats
        self.counts = counts

    def resolve(self) -> dict[str, Any]:
        """Read the reductions back (writer thread) and return the JSON-ready dict."""
        out: dict[str, Any] = {
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "numel": self.numel,
        }
        if self.floats is None or self.counts is None:
            return out
        floats = [finite_or_text(float(v)) for v in self.floats.tolist()]
        nan, inf = (int(v) for v in self.counts.tolist())
        out.update(zip(("norm", "mean", "std", "min", "max"), floats, strict=False))
        out.update(nan=nan, inf=inf)
        return out


def device_stats(tensor: torch.Tensor, full: bool = True) -> StatsRecord:
    """Launch the statistics reductions for ``tensor`` without syncing the device.

    Runs under ``no_grad`` and touches no RNG. Low-precision, integer and boolean
    tensors are reduced in float32; complex tensors over their real and imaginary
    parts. Meta and empty tensors get shape and dtype only.
    """
    shape = tuple(tensor.shape)
    numel = tensor.numel()
    if numel == 0 or tensor.is_meta or tensor.layout != torch.strided:
        return StatsRecord(shape, tensor.dtype, numel, None, None)
    with torch.no_grad():
        x = tensor.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        if x.dtype not in _FAST_FLOATS:
            x = x.float()
        if full:
            lo, hi = torch.aminmax(x)
            floats = torch.stack(
                [torch.linalg.vector_norm(x), x.mean(), x.std(correction=0), lo, hi]
            )
        else:  # policy stats="norm": one reduction instead of five
            floats = torch.linalg.vector_norm(x).reshape(1)
        counts = torch.stack([torch.isnan(x).sum(), torch.isinf(x).sum()])
    return StatsRecord(shape, tensor.dtype, numel, floats, counts)


def host_stats(tensor: torch.Tensor) -> dict[str, Any]:
    """Statistics of a tensor, resolved immediately (writer side, or tests)."""
    return device_stats(tensor).resolve()


def _raw_chunks(tensor: torch.Tensor) -> Any:
    """Yield the tensor's bytes in C order, at most ``CHUNK_BYTES`` of source at a time."""
    # Chunks are sliced from the flat view and copied to host one at a time, so a
    # huge (or CUDA) tensor never needs a second full copy in host memory.
    flat = tensor.detach().reshape(-1)
    per_chunk = max(1, CHUNK_BYTES // max(1, flat.element_size()))
    for start in range(0, flat.numel(), per_chunk):
        part = flat[start : start + per_chunk]
        if part.device.type != "cpu":
            part = part.cpu()
        yield part.contiguous().view(torch.uint8).numpy().data


def tensor_hash(tensor: torch.Tensor) -> str:
    """Content hash of a tensor: SHA-256 over dtype, shape and raw bytes (C order).

    This is the identity used for sealed initial values and for snapshots, so an
    identical tensor always has one hash, whatever its strides or device.
    """
    digest = hashlib.sha256(HASH_PREFIX)
    header = json.dumps([dtype_name(tensor.dtype), list(tensor.shape)], separators=(",", ":"))
    digest.update(header.encode() + b"\0")
    for chunk in _raw_chunks(tensor):
        digest.update(chunk)
    return digest.hexdigest()
