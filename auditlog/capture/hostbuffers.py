"""Host buffers kept from one periodic snapshot to the next: the host copy writes warm memory.

A snapshot's host copy, taken on the training thread, is the one part of a
snapshot that training waits for (the writer hashes and writes afterwards). A
fresh CPU allocation of a large tensor is fresh memory: glibc serves blocks
above its mmap threshold (at most 32 MiB) straight from ``mmap`` and unmaps them
when they are freed, so every snapshot's copy faults each of its pages in again.
A ``copy_`` into a buffer kept from before takes a fraction of a fresh
``clone()``'s time (``benchmarks/snapshots.py --stall``; docs/performance.md).

When snapshots recur (``snapshot_every``), the host copies of the last snapshot
the writer has finished are kept here, and the next snapshot copies into them
(same shape and dtype; anything else is allocated as before). What is kept is
bounded: ``give`` replaces the buffers held with the ones given, so at most one
snapshot's host copies wait here; the next snapshot lets go of those it did
not use (``drop_unused``); and a buffer is handed out only after the writer is
done with it (``SnapshotItems`` gives them back once stored). Kept and
in-flight host copies together stay within the two host copies of the model
that snapshot back-pressure allows (docs/snapshots.md). The
price is that one host copy of the snapshotted state stays allocated between
snapshots instead of being returned to the system; the peak (a host copy per
snapshot in flight) is unchanged. CUDA snapshots copy into pinned memory, which
PyTorch's own caching host allocator already reuses: they are not kept here.
"""

from __future__ import annotations

import threading

import torch

Key = tuple[tuple[int, ...], torch.dtype]


class HostBuffers:
    """Free CPU buffers by (shape, dtype): taken by the training thread, given back by the writer."""

    __slots__ = ("_closed", "_free", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[Key, list[torch.Tensor]] = {}
        self._closed = False

    def copy_of(self, source: torch.Tensor) -> torch.Tensor:
        """A C-contiguous CPU copy of ``source`` (a dense CPU tensor), in a kept buffer if one fits."""
        buffer = self._take((tuple(source.shape), source.dtype))
        if buffer is None:
            return source.clone(memory_format=torch.contiguous_format)
        return buffer.copy_(source)

    def _take(self, key: Key) -> torch.Tensor | None:
        with self._lock:
            free = self._free.get(key)
            return free.pop() if free else None

    def give(self, buffers: list[torch.Tensor]) -> None:
        """The host copies of a snapshot the writer has finished with: kept for the next
        one, in place of whatever was kept before (at most one snapshot's worth)."""
        free: dict[Key, list[torch.Tensor]] = {}
        for buffer in buffers:
            free.setdefault((tuple(buffer.shape), buffer.dtype), []).append(buffer)
        with self._lock:
            if not self._closed:
                self._free = free

    def drop_unused(self) -> None:
        """A snapshot has taken its copies: let go of the kept buffers it did not use (their
        shapes are gone), so that kept and in-flight copies stay within the bound the
        snapshot back-pressure sets."""
        with self._lock:
            self._free = {}

    def close(self) -> None:
        """Recording is over: let every buffer go, and keep none given back later."""
        with self._lock:
            self._closed = True
            self._free = {}

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers kept now (tests, benchmarks)."""
        with self._lock:
            return sum(t.numel() * t.element_size() for free in self._free.values() for t in free)


def poolable(source: torch.Tensor) -> bool:
    """Whether a snapshot's copy of ``source`` may go into a kept buffer: a plain dense
    CPU tensor (not quantized, not a subclass with a representation of its own)."""
    return (
        source.device.type == "cpu"
        and source.layout is torch.strided
        and not source.is_quantized
        and type(source) in (torch.Tensor, torch.nn.Parameter)
    )
