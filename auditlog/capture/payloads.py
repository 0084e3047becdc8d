"""Lazy payload values: launched on the training thread, resolved on the writer.

A hook must not read device values back (a host-device sync) nor hash or encode
anything. So it puts these objects into a record's payload instead of numbers;
the writer calls ``resolve()`` (or ``resolve_in(writer)`` when storing snapshot
data) while encoding the event. Each holds only what it must: small result
tensors, or host copies of tensors that are about to change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from auditlog.capture.hostbuffers import HostBuffers, poolable
from auditlog.capture.torch_compat import local_view, shard_facts, subclass_parts
from auditlog.core.chain import Clean
from auditlog.core.cpus import hash_threads
from auditlog.core.packed import pack_f32
from auditlog.core.tensors import HostValues, StatsRecord, device_stats, tensor_hash
from auditlog.core.values import finite_or_text


class BlobSink(Protocol):
    """What the writer offers snapshot payloads: store content once per hash."""

    def store_blobs(self, items: list[tuple[int, torch.Tensor]]) -> list[tuple[str, int]]:
        """Hash each ``(tensor_id, host copy)``, store the contents not stored yet;
        return ``(sha256, bytes newly written)`` per item, in order."""
        ...


class HostCopy:
    """A host copy of a tensor's value now, without stalling the training thread.

    A CPU tensor is cloned. A CUDA tensor goes to pinned host memory through
    ``HostValues`` (a non-blocking copy and an event): the training thread goes
    on at once, and the writer waits on the event, not the whole device, before
    it reads the bytes. With ``buffers`` (periodic snapshots) a CPU tensor is
    copied into a buffer kept from the last snapshot where one fits
    (``hostbuffers``: warm memory, no page faults on the training thread), and
    ``pooled`` says the copy goes back there once the writer is done with it.
    """

    __slots__ = ("copy", "inner", "pooled", "shard", "stats", "subclass")

    def __init__(
        self, source: torch.Tensor, with_stats: bool = False, buffers: HostBuffers | None = None
    ) -> None:
        with torch.no_grad():
            # A sharded (DTensor) value: this process's shard, and where it lies.
            self.shard = shard_facts(source)
            # A wrapper subclass (TwoTensor, Float8-like): stored through its public
            # representation, the inner tensors of ``__tensor_flatten__``, each a plain
            # content-addressed tensor; the first stands for the whole (``copy``), the
            # others are copied beside it (``inner``). Its own ops never run here.
            self.subclass: dict[str, Any] | None = None
            self.inner: list[tuple[str, HostValues]] = []
            parts = subclass_parts(source)
            if parts is not None:
                cls, inner, ctx = parts
                names = list(inner)
                self.subclass = {
                    "type": cls,
                    "first": names[0] if names else None,
                    "ctx": None if ctx is None else repr(ctx)[:500],
                    **_outer_layout(source),
                }
                self.inner = [(n, HostValues(_host_clone(inner[n]))) for n in names[1:]]
            source = local_view(source.detach())
            # Statistics are launched here, on the training thread, like activity
            # statistics: a torch reduction on the writer thread would start a second
            # OpenMP team and make the training thread's workers sleep between ops
            # (measured: 1.5-2x on every step). The writer only reads 7 numbers.
            self.stats = device_stats(source) if with_stats else None
            self.pooled = buffers is not None and poolable(source)
            if source.device.type == "cuda":
                self.copy = HostValues(source)
            elif self.pooled:
                assert buffers is not None
                self.copy = HostValues(buffers.copy_of(source))
            else:
                # C-contiguous, so hashing and writing on the writer need no torch copy.
                self.copy = HostValues(source.clone(memory_format=torch.contiguous_format))

    def ready(self) -> torch.Tensor:
        """The copy, once the device has written it (writer thread)."""
        return self.copy.ready()


def wrapper_entry(pending: HostCopy, first: str, others: list[str]) -> dict[str, Any]:
    """The ``subclass`` of a stored entry: class, inner attribute -> sha256 (the first
    inner tensor's hash is the entry's ``sha256``), context repr, outer shape and stride."""
    facts = pending.subclass
    assert facts is not None
    shas = {
        facts["first"]: first,
        **{name: sha for (name, _), sha in zip(pending.inner, others, strict=True)},
    }
    return {
        "type": facts["type"],
        "inner": shas,
        "ctx": facts["ctx"],
        "shape": facts["shape"],
        "stride": facts["stride"],
    }


def _outer_layout(tensor: torch.Tensor) -> dict[str, list[int] | None]:
    """A wrapper's own ``shape`` and ``stride``: what ``__tensor_unflatten__`` takes to
    rebuild it (its inner tensors' may differ). None where the subclass computes them
    in code of its own (a "sizes" dispatch policy) and that code fails."""
    try:
        return {"shape": list(tensor.shape), "stride": list(tensor.stride())}
    except Exception:
        return {"shape": None, "stride": None}


def _host_clone(tensor: torch.Tensor) -> torch.Tensor:
    """A C-contiguous copy of a plain tensor (pinned host memory for CUDA, through
    ``HostValues``): an inner tensor of a wrapper subclass."""
    tensor = tensor.detach()
    if tensor.device.type == "cuda":
        return tensor.contiguous()
    return tensor.clone(memory_format=torch.contiguous_format)


class SealItems:
    """Host copies of tensors at construction end: ``[(tensor_id, copy)]``.

    With ``store`` the writer also saves their content as snapshots (initial values).
    """

    __slots__ = ("items", "store")

    def __init__(self, items: list[tuple[int, HostCopy]], store: bool) -> None:
        self.items = items
        self.store = store

    def resolve_in(self, sink: BlobSink) -> list[dict[str, Any]]:
        out = []
        copies = [(tensor_id, pending.ready()) for tensor_id, pending in self.items]
        # A wrapper subclass's other inner tensors, hashed (and stored) beside its first.
        inner = [(tensor_id, part.ready()) for tensor_id, p in self.items for _, part in p.inner]
        if self.store:
            digests = [sha for sha, _ in sink.store_blobs(copies + inner)]
        else:
            threads = hash_threads()  # the leaves of a large tensor on every core (core.hashing)
            digests = [tensor_hash(copy, threads=threads) for _, copy in copies + inner]
        del copies, inner
        inner_digests = iter(digests[len(self.items) :])
        for (tensor_id, pending), digest in zip(self.items, digests, strict=False):
            stats = pending.stats.resolve() if pending.stats is not None else None
            item: dict[str, Any] = {"tensor_id": tensor_id, "sha256": digest, "stats": stats}
            if pending.shard is not None:
                item["shard"] = pending.shard
            if pending.subclass is not None:
                item["subclass"] = wrapper_entry(
                    pending, digest, [next(inner_digests) for _ in pending.inner]
                )
            out.append(item)
        self.items = []
        return out


class SnapshotItems:
    """A snapshot's tensors: ``[(tensor_id, host copy)]``, hashed and stored by the writer.

    ``done`` is set once the writer has finished with it (stored, or failed):
    the recorder counts the snapshots not done yet when the next one is due
    (``RootTracking.snapshot``: an overrun, reported in the event, and the
    bound on how many host copies wait). ``buffers``: where the host copies
    that came from kept buffers go back once stored (``hostbuffers``).
    """

    __slots__ = ("buffers", "done", "items", "nbytes")

    def __init__(
        self, items: list[tuple[int, HostCopy]], buffers: HostBuffers | None = None
    ) -> None:
        self.items = items
        self.buffers = buffers
        self.nbytes = sum(p.copy.tensor.numel() * p.copy.tensor.element_size() for _, p in items)
        self.done = threading.Event()

    def resolve_in(self, sink: BlobSink) -> dict[str, Any]:
        began = time.perf_counter()
        try:
            copies = [(tensor_id, pending.ready()) for tensor_id, pending in self.items]
            stored = sink.store_blobs(copies)
            tensors = []
            inner = [
                (tensor_id, name, part.ready())
                for tensor_id, p in self.items
                for name, part in p.inner
            ]
            stored_inner = (
                iter(zip(inner, sink.store_blobs([(t, c) for t, _, c in inner]), strict=True))
                if inner
                else iter(())
            )
            new_bytes = logical = 0
            for (tensor_id, pending), (digest, _) in zip(self.items, stored, strict=True):
                item: dict[str, Any] = {"tensor_id": tensor_id, "sha256": digest}
                if pending.shard is not None:
                    item["shard"] = pending.shard
                if pending.subclass is not None:
                    shas = []
                    for _ in pending.inner:
                        (_, _, part), (sha, written) = next(stored_inner)
                        shas.append(sha)
                        new_bytes += written
                        logical += part.numel() * part.element_size()
                    item["subclass"] = wrapper_entry(pending, digest, shas)
                tensors.append(item)
            new_bytes += sum(n for _, n in stored)
            logical += sum(c.numel() * c.element_size() for _, c in copies)
        finally:
            if self.buffers is not None:  # the writer is done with every copy: the next snapshot's
                self.buffers.give([p.copy.tensor for _, p in self.items if p.pooled])
            self.items = []  # the host copies go now, whatever happened
            self.done.set()
        return {
            "tensors": tensors,
            "new_bytes": new_bytes,
            "copied_bytes": logical,
            "write_s": round(time.perf_counter() - began, 6),
        }


class StackedNorms:
    """Per-parameter norms as one float32 tensor (``NormPlan``), packed for the payload.

    ``present``: the positions (of ``size``) that had a value (a gradient, say),
    None when all did; the tensor holds norms only for those. Device norms start
    their way to the host at once (``HostValues``: no sync on the training
    thread); the writer reads them. ``resolve()`` gives the packed vector
    (``core.packed``: one bytes conversion, no Python float per parameter).
    """

    __slots__ = ("_nonfinite", "_packed", "norms", "present", "size", "values")

    def __init__(
        self, norms: torch.Tensor | None, size: int, present: list[int] | None = None
    ) -> None:
        self.norms = norms
        self.size = size
        self.present = present
        self.values = None if norms is None else HostValues(norms)
        self._packed: Clean | None = None
        self._nonfinite = 0

    def _read(self) -> Clean:
        if self._packed is None:
            got = (
                self.values.ready().numpy()
                if self.values is not None
                else np.zeros(0, dtype=np.float32)
            )
            got = got.astype("<f4", copy=False)
            self._nonfinite = int(got.size - np.count_nonzero(np.isfinite(got)))
            absent: list[int] = []
            if self.present is not None and len(self.present) != self.size:
                full = np.zeros(self.size, dtype="<f4")
                full[self.present] = got
                mask = np.ones(self.size, dtype=bool)
                mask[self.present] = False
                absent = np.flatnonzero(mask).tolist()
                got = full
            self._packed = Clean(pack_f32(got.tobytes(), absent))
        return self._packed

    def resolve(self) -> Clean:
        """The packed vector: ``{"f32": base64 of float32, "absent": [...]}``."""
        return self._read()

    def nonfinite(self) -> int:
        """How many of the norms are NaN or infinite."""
        self._read()
        return self._nonfinite

    def any_nonfinite(self) -> bool:
        """Is any norm NaN or infinite? (CPU norms, training thread: one float64 sum of a
        view of them, nothing packed; norms are never negative, so only a NaN or an
        infinity makes the sum not finite.)"""
        norms = self.norms
        if norms is None:
            return False
        if norms.numel() <= _FEW_NORMS:
            # A small model's few norms summed as Python floats (exact doubles): a numpy
            # call costs more than the sum. Float32 values cannot overflow a double's
            # sum, so it is finite exactly when every norm is, as the numpy one.
            total = sum(norms.tolist())
        else:
            total = np.add.reduce(norms.detach().numpy(), dtype=np.float64)
        return not bool(total - total == 0.0)


_FEW_NORMS = 64
"""Up to this many norms, ``StackedNorms.any_nonfinite`` sums Python floats (cheaper than
a numpy reduction for a handful; dearer for thousands)."""


class NonFiniteCount:
    """How many of the stacked norms are NaN or infinite (resolved on the writer)."""

    __slots__ = ("norms", "on_nonfinite")

    def __init__(self, norms: StackedNorms, on_nonfinite: Callable[[], None] | None = None) -> None:
        self.norms = norms
        self.on_nonfinite = on_nonfinite

    def resolve(self) -> int:
        # From the values the writer reads anyway: no torch op on the writer thread.
        count = self.norms.nonfinite()
        if count and self.on_nonfinite is not None:
            self.on_nonfinite()  # the recorder samples activity from the next step on
        return count


class NonFiniteInputs:
    """NaN and infinite elements in a module call's input tensors (resolved on the writer).

    ``parts`` are the inputs' statistics: records already taken of the same
    tensors as earlier calls' outputs, or norm-only ones taken for the inputs.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: list[dict[str, Any] | StatsRecord]) -> None:
        self.parts = parts

    def resolve(self) -> int:
        total = 0
        for part in self.parts:
            stats = part if isinstance(part, dict) else part.resolve()
            total += int(stats.get("nan", 0)) + int(stats.get("inf", 0))
        return total


class Scalar:
    """One number on a device (a loss, say), on its way to the host without a sync."""

    __slots__ = ("values",)

    def __init__(self, tensor: torch.Tensor) -> None:
        with torch.no_grad():
            self.values = HostValues(tensor.detach().reshape(1))

    def ready(self) -> bool:
        """Has the device written the value yet? (Never waits.)"""
        event = self.values.event
        return event is None or bool(event.query())

    def resolve(self) -> float | int | str:
        value = self.values.tolist()[0]
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float):
            return value if value - value == 0.0 else finite_or_text(value)
        return value  # type: ignore[no-any-return]


class StepPayload:
    """An ``optimizer_step`` payload as the post hook leaves it: raw values, built into
    the event's dict on the writer (``resolve``).

    Every number in it was taken on the training thread (norms are result tensors
    nothing writes to again; a tensor hyperparameter is cloned); what is left for
    the writer is the dict itself, the packed vectors and the non-finite count.
    ``weight``: what the record counts against the buffer's bound
    (``buffer.record_weight``: one per 25 parameters).
    """

    __slots__ = (
        "count",
        "grad_norms",
        "group_ids",
        "groups",
        "modified",
        "on_nonfinite",
        "optimizer_class",
        "optimizer_id",
        "param_norms",
        "raw_norms",
        "tensor_ids",
        "update_norms",
        "weight",
    )

    def __init__(
        self,
        groups: list[dict[str, Any]],
        group_ids: list[Clean],
        tensor_ids: Clean,
        size: int,
        grad_norms: StackedNorms | None,
        raw_norms: StackedNorms | None,
        modified: bool | None,
        param_norms: StackedNorms | None,
        update_norms: StackedNorms | None,
        optimizer_id: int,
        optimizer_class: type,
        count: int,
        on_nonfinite: Callable[[], None] | None,
    ) -> None:
        self.groups = groups  # shallow copies of the param groups, without ``params``
        self.group_ids = group_ids
        self.tensor_ids = tensor_ids
        self.grad_norms = grad_norms
        self.raw_norms = raw_norms
        self.modified = modified
        self.param_norms = param_norms
        self.update_norms = update_norms
        self.optimizer_id = optimizer_id
        self.optimizer_class = optimizer_class
        self.count = count
        self.on_nonfinite = on_nonfinite
        self.weight = 1 + size // 25

    def resolve(self) -> dict[str, Any]:
        """The payload (writer thread). ``Clean`` when every hyperparameter is a plain
        JSON value (numbers, text, flags, tuples of them: what torch's optimizers hold),
        so the writer encodes it without walking it; otherwise a dict it walks."""
        groups: list[dict[str, Any]] = []
        clean = True
        for group, members in zip(self.groups, self.group_ids, strict=True):
            plain = True
            for key, value in group.items():
                kind = type(value)
                if kind is float:
                    if value - value != 0.0:
                        group[key] = finite_or_text(value)
                elif not (
                    kind in _JSON_SCALARS or (kind is tuple and all(map(_json_ready, value)))
                ):
                    plain = (
                        False  # a tensor, a dtype, an object: the writer's materialize knows them
                    )
            group["params"] = members
            groups.append(Clean(group) if plain else group)
            clean = clean and plain
        grads = self.grad_norms
        cls = self.optimizer_class
        payload = {
            "param_groups": groups,
            "tensor_ids": self.tensor_ids,
            "grad_norm": None if grads is None else grads.resolve(),
            "raw_grad_norm": None if self.raw_norms is None else self.raw_norms.resolve(),
            "grads_modified": self.modified,
            "nonfinite_grads": None
            if grads is None
            else NonFiniteCount(grads, self.on_nonfinite).resolve(),
            "update_norm": None if self.update_norms is None else self.update_norms.resolve(),
            "param_norm": None if self.param_norms is None else self.param_norms.resolve(),
            "optimizer_id": self.optimizer_id,
            "optimizer_class": f"{cls.__module__}.{cls.__qualname__}",
            "optimizer_step": self.count,
        }
        return Clean(payload) if clean else payload


# Values the JSON encoder takes as they are (a float is checked apart: NaN and infinities
# are stored as text). A tuple of finite floats (``betas``) is one too.
_JSON_SCALARS = frozenset((int, bool, str, type(None)))


def _json_ready(value: Any) -> bool:
    kind = type(value)
    return (kind is float and value - value == 0.0) or kind in _JSON_SCALARS
