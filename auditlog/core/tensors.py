"""Tensor statistics and content hashes.

Statistics are split in two halves on purpose. ``device_stats`` runs inside hooks:
it launches a handful of reductions and stacks them into two small tensors on the
tensor's own device, without reading any value back (no host-device sync). The
writer thread later calls ``StatsRecord.resolve`` to turn them into plain numbers.
Hashing (``tensor_hash``) only ever runs on the writer thread.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from auditlog.core.hashing import content_hasher, is_tree
from auditlog.core.values import finite_or_text

_FAST_FLOATS = (torch.float32, torch.float64)
CHUNK_BYTES = 64 * 1024 * 1024


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``'float32'``: the name used in events and hashes (remembered
    per dtype: it is asked for every module output and gradient of a sampled step)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


_DTYPE_NAMES: dict[torch.dtype, str] = {}


class HostValues:
    """Small results on a device, on their way to the host without a sync.

    On CUDA the training thread queues a non-blocking copy into pinned host
    memory and records an event; the writer waits on the event, which releases
    the GIL while the device catches up, then reads host memory. (A plain
    ``tolist()`` on the writer copies on the default stream while holding the
    GIL: it waits for all the work the training thread queued since, and the
    training thread waits for the GIL: a markedly slower step on a GPU,
    docs/performance.md.) Elsewhere the tensor is read as it is.
    """

    __slots__ = ("_list", "event", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.event: Any = None
        self._list: list[Any] | None = None
        if tensor.is_cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.event.record(torch.cuda.current_stream(tensor.device))
            tensor = host
        self.tensor = tensor

    def ready(self) -> torch.Tensor:
        """The host tensor, once the device has written it (writer thread)."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self.tensor

    def tolist(self) -> list[Any]:
        if self._list is None:
            self._list = self.ready().tolist()
        return self._list


class StatsBatch:
    """The reductions of many ``StatsRecord`` s stacked into two tensors and sent
    to the host together: the writer reads a whole step's statistics at once."""

    __slots__ = ("counts", "floats")

    def __init__(self, floats: torch.Tensor, counts: torch.Tensor) -> None:
        self.floats = HostValues(floats)
        self.counts = HostValues(counts)

    def values(self) -> tuple[list[list[float]], list[list[int]]]:
        return self.floats.tolist(), self.counts.tolist()


class StatsRecord:
    """Statistics of one tensor as launched on the hot path, resolved on the writer.

    Holds only small result tensors (7 numbers), never the tensor itself, so an
    activation is not kept alive by the queue; ``batch`` replaces them once the
    step's records are stacked together (``batch_records``).
    """

    __slots__ = ("batch", "counts", "dtype", "floats", "numel", "shape")

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
        self.batch: tuple[StatsBatch, int] | None = None

    def resolve(self) -> dict[str, Any]:
        """Read the reductions back (writer thread) and return the JSON-ready dict."""
        out: dict[str, Any] = {
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "numel": self.numel,
        }
        if self.batch is not None:
            batch, index = self.batch
            values, counts = batch.values()
            raw_floats, raw_counts = values[index], counts[index]
        elif self.floats is None or self.counts is None:
            return out
        else:
            raw_floats, raw_counts = self.floats.tolist(), self.counts.tolist()
        floats = [finite_or_text(float(v)) for v in raw_floats]
        out.update(zip(("norm", "mean", "std", "min", "max"), floats, strict=False))
        out.update(nan=int(raw_counts[0]), inf=int(raw_counts[1]))
        if len(raw_counts) == 4:  # units=True: zero elements and dead units (see unit_size)
            out["zeros"] = int(raw_counts[2])
            units = unit_size(self.shape)
            if units is not None:
                out.update(units=units, dead_units=int(raw_counts[3]))
        return out


def batch_records(records: list[StatsRecord]) -> None:
    """Stack the pending reductions of ``records`` (per device and width) into
    ``StatsBatch`` es: a few stacking kernels on the training thread, no sync."""
    groups: dict[tuple[Any, ...], list[StatsRecord]] = {}
    seen: set[int] = set()
    for record in records:
        if record.floats is not None and record.counts is not None and id(record) not in seen:
            seen.add(id(record))  # one record may stand in two entries (a container's output)
            key = (record.floats.device, record.floats.shape[0], record.counts.shape[0])
            groups.setdefault(key, []).append(record)
    for members in groups.values():
        batch = StatsBatch(
            torch.stack([m.floats for m in members]),  # type: ignore[misc]
            torch.stack([m.counts for m in members]),  # type: ignore[misc]
        )
        for index, member in enumerate(members):
            member.batch = (batch, index)
            member.floats = member.counts = None


def unit_size(shape: tuple[int, ...] | list[int]) -> int | None:
    """How many units (features, channels) an activation of this shape has, or None.

    Units are the last dimension of a 2-D or 3-D activation (``(batch, features)``,
    ``(batch, tokens, features)``) and dimension 1 from 4-D on (``(N, C, H, W)``
    convolutions). A unit is *dead* in a batch when it is exactly zero everywhere
    in it (a ReLU that never fires).
    """
    if len(shape) < 2:
        return None
    return int(shape[unit_dim(len(shape))])


def unit_dim(ndim: int) -> int:
    """The dimension ``unit_size`` counts units along."""
    return 1 if ndim >= 4 else ndim - 1


def _unit_counts(x: torch.Tensor) -> list[torch.Tensor]:
    """Zero elements and dead units of a real activation, as two 0-dim tensors (no sync)."""
    nonzero = x != 0
    zeros = x.numel() - nonzero.sum()
    if x.dim() < 2:
        return [zeros, torch.zeros((), dtype=zeros.dtype, device=x.device)]
    n = x.shape[unit_dim(x.dim())]
    alive = nonzero.movedim(unit_dim(x.dim()), -1).reshape(-1, n).any(0).sum()
    return [zeros, n - alive]


def device_stats(tensor: torch.Tensor, full: bool = True, units: bool = False) -> StatsRecord:
    """Launch the statistics reductions for ``tensor`` without syncing the device.

    Runs under ``no_grad`` and touches no RNG. Low-precision, integer and boolean
    tensors are reduced in float32; complex tensors over their real and imaginary
    parts. Meta and empty tensors get shape and dtype only. ``units`` also counts
    zero elements and dead units (``unit_size``) of a real tensor.
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
        parts = [torch.isnan(x).sum(), torch.isinf(x).sum()]
        if units and not tensor.is_complex():
            parts.extend(_unit_counts(x))
        counts = torch.stack(parts)
    return StatsRecord(shape, tensor.dtype, numel, floats, counts)


def activity_stats(
    tensor: torch.Tensor, full: bool = True, units: bool = False
) -> dict[str, Any] | StatsRecord:
    """Statistics of a module output or gradient, as cheaply as the device allows.

    On CPU there is no device to stay away from, so the numbers are read at once,
    from the three reductions that are fast there (``sum``, ``vector_norm``,
    ``aminmax``, each several times cheaper than ``std``, ``std_mean`` or
    ``isnan(x).sum()``; docs/performance.md):

    - mean = sum / n; std (population) = sqrt(norm^2/n - mean^2), computed in
      float64 from float32 reductions. Where mean^2 is more than half of the mean
      square the subtraction would lose digits, and ``std`` is computed exactly
      instead; otherwise the relative error stays below ~1e-6.
    - NaN / infinity counts: a tensor holding either has a non-finite norm, so the
      counts are 0 when the norm is finite and are counted exactly (two more
      reductions) only when it is not.

    ``units`` (forward outputs) adds ``zeros`` and, from 2-D on, ``units`` and
    ``dead_units`` (``unit_size``): one comparison and one sum, and a second
    reduction only when some element is exactly zero.

    On other devices the reductions are launched and stacked without a sync
    (``device_stats``) and read by the writer.
    """
    if not tensor.is_cpu:  # (no device object to build, as ``device.type`` does)
        return device_stats(tensor, full, units)
    numel = tensor.numel()
    shape = list(tensor.shape)
    dtype = dtype_name(tensor.dtype)
    if numel == 0 or tensor.layout != torch.strided:
        return {"dtype": dtype, "numel": numel, "shape": shape}
    # No no_grad() needed: a detached tensor records no graph (and entering the
    # context has a cost that adds up over every module call).
    x = tensor.detach()
    if x.dtype not in _FAST_FLOATS:
        x = torch.view_as_real(x) if x.is_complex() else x.float()
        if x.dtype not in _FAST_FLOATS:
            x = x.float()
    norm = torch.linalg.vector_norm(x).item()
    # Statistics as stored: a float, or its text when it is not finite (finite_or_text).
    out_norm: Any = norm
    mean: Any = None
    std: Any = None
    low: Any = None
    high: Any = None
    if full:
        total = x.sum().item()
        lo, hi = torch.aminmax(x)
        mean = total / numel
        square = norm * norm / numel
        if mean * mean <= 0.5 * square and square - square == 0.0:
            std = math.sqrt(max(square - mean * mean, 0.0))
        else:
            std = x.std(correction=0).item()
        low = lo.item()
        high = hi.item()
    if norm - norm == 0.0:  # finite norm: every element is finite
        nan = inf = 0
        if full and mean - mean != 0.0:  # the float32 sum overflowed
            mean = finite_or_text(mean)
    else:
        out_norm = finite_or_text(norm)
        if full:
            mean, std = finite_or_text(mean), finite_or_text(std)
            low, high = finite_or_text(low), finite_or_text(high)
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
    counted = _unit_counts_now(x) if units and not tensor.is_complex() else None
    # One dict, keys in sorted order: the writer's encoder sorts every dict's keys, and
    # sorted ones cost it the fewest comparisons.
    if counted is not None and counted[1] is not None:
        zeros, n, dead = counted
        if full:
            return {
                "dead_units": dead,
                "dtype": dtype,
                "inf": inf,
                "max": high,
                "mean": mean,
                "min": low,
                "nan": nan,
                "norm": out_norm,
                "numel": numel,
                "shape": shape,
                "std": std,
                "units": n,
                "zeros": zeros,
            }
        return {
            "dead_units": dead,
            "dtype": dtype,
            "inf": inf,
            "nan": nan,
            "norm": out_norm,
            "numel": numel,
            "shape": shape,
            "units": n,
            "zeros": zeros,
        }
    out: dict[str, Any] = (
        {
            "dtype": dtype,
            "inf": inf,
            "max": high,
            "mean": mean,
            "min": low,
            "nan": nan,
            "norm": out_norm,
            "numel": numel,
            "shape": shape,
            "std": std,
        }
        if full
        else {
            "dtype": dtype,
            "inf": inf,
            "nan": nan,
            "norm": out_norm,
            "numel": numel,
            "shape": shape,
        }
    )
    if counted is not None:
        out["zeros"] = counted[0]  # a 0-D or 1-D activation: no units
    return out


def _unit_counts_now(x: torch.Tensor) -> tuple[int, int | None, int | None]:
    """``(zeros, units, dead_units)`` of a CPU activation, read at once; units and dead
    units are None below 2-D (``unit_size``)."""
    # count_nonzero is one kernel with no boolean tensor to allocate, cheaper than
    # (x != 0).sum() (docs/performance.md), and it runs on every forward output of a
    # sampled step. Same rule: NaN counts as non-zero, -0.0 as zero.
    count = int(torch.count_nonzero(x))
    zeros = x.numel() - count
    if x.dim() < 2:
        return zeros, None, None
    n = x.shape[unit_dim(x.dim())]
    if count == x.numel():
        return zeros, n, 0
    nonzero = x != 0
    return zeros, n, n - int(nonzero.movedim(unit_dim(x.dim()), -1).reshape(-1, n).any(0).sum())


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


def tensor_hash(tensor: torch.Tensor, tree: bool = True, threads: int = 1) -> str:
    """Content hash of a tensor: SHA-256 over dtype, shape and raw bytes (C order).

    This is the identity used for sealed initial values and for snapshots, so an
    identical tensor always has one hash, whatever its strides or device. The
    torch-free definition (both versions, prefix and header) is
    ``auditlog.core.hashing.content_hasher``, which the read side uses to check
    files without torch. ``tree``: version 2 (a tree of SHA-256 leaves for
    tensors over 4 MiB; False: version 1, what older records used);
    ``threads`` > 1 hashes the leaves side by side.
    """
    nbytes = tensor.numel() * tensor.element_size()
    digest = content_hasher(dtype_name(tensor.dtype), tensor.shape, nbytes, tree, threads)
    for chunk in _raw_chunks(tensor):  # a GPU's chunks: the hasher keeps at most 16 leaves alive
        digest.update(chunk)
    return digest.hexdigest()


def matches_recorded(tensor: torch.Tensor, recorded: str, threads: int = 1) -> bool:
    """Whether ``tensor`` has the content hash ``recorded`` under either version (a
    record made before version 2 hashed large tensors as version 1)."""
    if tensor_hash(tensor, threads=threads) == recorded:
        return True
    nbytes = tensor.numel() * tensor.element_size()
    return is_tree(nbytes) and tensor_hash(tensor, tree=False) == recorded
