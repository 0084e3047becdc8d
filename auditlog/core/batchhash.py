"""The content hash of a batch: what identifies a batch of an ``IterableDataset``, whose
samples have no index to record.

``batch_hash(batch)`` (public: ``auditlog.batch_hash``) is SHA-256 over ``PREFIX``
and a canonical encoding of the batch as the DataLoader returned it, a nesting of
tensors, mappings, sequences and plain values. Every item is a one-byte tag and
its content; every length and count is an unsigned 64-bit little-endian integer
(``u64``), and ``lp(x)`` is ``u64(len(x))`` followed by ``x``:

- a ``torch.Tensor``: ``T``, ``lp(dtype name)`` (``float32``, as snapshots spell
  it), ``u64(ndim)``, ``u64`` of each dimension, ``u64(nbytes)``, then its bytes
  in C order (the machine's byte order: little-endian on every platform torch
  ships for). Device, strides, ``requires_grad`` and the conjugate/negative bits
  are not part of it: the values are. A sparse tensor is hashed as its dense form;
- a numpy array: ``A``, ``lp(dtype.str)`` (``<f4``), the shape and bytes as for
  tensors;
- a mapping (``dict``, Hugging Face's ``BatchEncoding``): ``D``, ``u64(count)``,
  then each key's encoding followed by its value's, in the order of the keys'
  encodings (bytewise): insertion order does not matter;
- a list or tuple (named tuples too): ``L``, ``u64(count)``, the items in order;
- ``None``: ``N``; a bool: ``?`` and one byte 0/1; an int: ``I`` and ``lp`` of its
  decimal digits; a float: ``F`` and ``lp(float.hex())``; a str: ``S`` and ``lp``
  of its UTF-8; bytes: ``B`` and ``lp`` of them;
- anything else: ``R``, ``lp`` of its qualified class name, ``lp`` of its
  ``repr`` (a repr holding a memory address differs from run to run: such a
  batch has no stable hash, and the record cannot make one up).

Nesting deeper than ``DEPTH_LIMIT`` raises ``ValueError`` (a cycle). The recorder
also bounds its walk on the training thread (``items``: a batch of more items,
e.g. token ids collated as Python lists rather than tensors, is not hashed, and
the record says so), since every item outside a tensor is Python work there
(docs/performance.md).

``BatchContent`` splits the work in two so that the recorder hashes off the
training thread: taking it (``BatchContent(batch, copy_bytes)``) walks the nesting
and encodes everything but tensor bytes, copies the bytes of the first
``copy_bytes`` of CPU tensors (the recorder copies none: docs/data.md says why)
and keeps a reference, with PyTorch's in-place version counter, to every other
tensor; ``hexdigest()`` (on the writer) hashes, and raises ``BatchChanged`` when a
referenced tensor was modified in place between the two. ``batch_hash`` is the
two in one call: one definition, whoever computes it.

A CUDA tensor referenced for later may still be being written by kernels queued on
the training thread's current stream, which need not be the stream the writer
copies on (a loop under ``torch.cuda.stream(s)``: torch's side streams do not wait
for the default stream, nor it for them). So taking a batch records one CUDA event
on the current stream of each device its tensors are on, and ``hexdigest`` waits
for those events before it reads a byte: the bytes hashed are the ones the
program's stream produced. An in-place change queued later bumps the version
counter when it is queued, before its kernel runs, and is refused as above.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping
from typing import Any

import torch

from auditlog.core.tensors import dtype_name

PREFIX = b"auditlog.batch.v1\n"
DEPTH_LIMIT = 32
_U64 = struct.Struct("<Q")


class BatchChanged(RuntimeError):
    """A tensor of the batch was modified in place before its bytes were hashed."""


def _lp(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


# dtypes numpy reads directly (one call instead of a reshape and a view: this runs on the
# training thread for the batches it copies)
_NUMPY = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.complex64,
    torch.complex128,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}
_DTYPE: dict[torch.dtype, bytes] = {}


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's values as bytes in C order (a copy only where the layout needs one)."""
    t = tensor.detach() if tensor.requires_grad else tensor
    if t.layout != torch.strided:
        t = t.to_dense()
    if not t.is_cpu:
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype in _NUMPY and t.dim():
        return t.numpy().data.cast("B")
    return t.reshape(-1).view(torch.uint8).numpy().data


def _dtype(dtype: torch.dtype) -> bytes:
    encoded = _DTYPE.get(dtype)
    if encoded is None:
        encoded = _DTYPE[dtype] = b"T" + _lp(dtype_name(dtype).encode())
    return encoded


class BatchContent:
    """A batch taken for hashing: its encoding, with tensor bytes copied or referenced.

    ``version``: a tensor's in-place version counter (the recorder passes
    ``capture.torch_compat.tensor_version``: private torch internals live there),
    so that a referenced tensor changed in place before it is hashed is refused
    (``BatchChanged``); None when it is hashed at once (``batch_hash``)."""

    __slots__ = ("budget", "copied", "events", "nbytes", "parts", "version")

    def __init__(
        self,
        batch: Any,
        copy_bytes: int = 0,
        items: int | None = None,
        version: Callable[[torch.Tensor], int] | None = None,
    ) -> None:
        # bytes (encoded already) or (tensor, its version when taken)
        self.version = version
        self.parts: list[bytes | tuple[torch.Tensor, int]] = [PREFIX]
        self.nbytes = 0  # tensor bytes, copied or referenced (what holding this costs)
        self.copied = 0
        self.budget = items if items is not None else -1  # items left to walk (negative: no bound)
        # per CUDA device index: an event recorded on its current stream when taken
        self.events: dict[int, torch.cuda.Event] = {}
        self._walk(batch, copy_bytes, 0)

    def _walk(self, value: Any, copy_bytes: int, depth: int) -> None:
        if depth > DEPTH_LIMIT:
            raise ValueError(f"batch nested deeper than {DEPTH_LIMIT} levels")
        self.budget -= 1
        if self.budget == -1:
            raise ValueError("batch of more items than the recorder walks on the training thread")
        add = self.parts.append
        if isinstance(value, torch.Tensor):
            shape = value.shape
            nbytes = value.nbytes
            add(
                _dtype(value.dtype) + struct.pack(f"<{len(shape) + 2}Q", len(shape), *shape, nbytes)
            )
            self.nbytes += nbytes
            if self.copied + nbytes <= copy_bytes and value.is_cpu:
                self.copied += nbytes
                add(bytes(_tensor_bytes(value)))
            else:
                add((value, version(value) if (version := self.version) is not None else 0))
                if value.is_cuda and (index := value.get_device()) not in self.events:
                    event = self.events[index] = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(torch.cuda.current_stream(index))
        elif (
            type(value).__module__ == "numpy"
            and type(value).__name__ == "ndarray"
            and value.dtype != object
        ):
            import numpy as np

            data = np.ascontiguousarray(value).tobytes()
            add(
                b"A"
                + _lp(value.dtype.str.encode())
                + _U64.pack(value.ndim)
                + b"".join(_U64.pack(d) for d in value.shape)
                + _lp(data)
            )
        elif isinstance(value, Mapping):
            items = []
            for key, item in value.items():
                if type(key) is str:  # the usual key: its encoding at once
                    items.append((b"S" + _lp(key.encode("utf-8", "surrogatepass")), item))
                    continue
                encoded = BatchContent.__new__(BatchContent)
                encoded.parts, encoded.nbytes, encoded.copied, encoded.budget = [], 0, 0, -1
                encoded.version, encoded.events = None, {}
                encoded._walk(key, 1 << 62, depth + 1)
                items.append((b"".join(p for p in encoded.parts if isinstance(p, bytes)), item))
            items.sort(key=lambda kv: kv[0])
            add(b"D" + _U64.pack(len(items)))
            for key_bytes, item in items:
                add(key_bytes)
                self._walk(item, copy_bytes, depth + 1)
        elif isinstance(value, (list, tuple)):
            add(b"L" + _U64.pack(len(value)))
            for item in value:
                self._walk(item, copy_bytes, depth + 1)
        elif value is None:
            add(b"N")
        elif isinstance(value, bool):
            add(b"?\x01" if value else b"?\x00")
        elif isinstance(value, int):
            add(b"I" + _lp(str(int(value)).encode()))
        elif isinstance(value, float):
            add(b"F" + _lp(float(value).hex().encode()))
        elif isinstance(value, str):
            add(b"S" + _lp(value.encode("utf-8", "surrogatepass")))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            add(b"B" + _lp(bytes(value)))
        else:
            cls = type(value)
            add(
                b"R"
                + _lp(f"{cls.__module__}.{cls.__qualname__}".encode())
                + _lp(repr(value).encode("utf-8", "replace"))
            )

    def hexdigest(self) -> str:
        """SHA-256 of the encoding, in lowercase hex. Raises ``BatchChanged`` when a
        referenced tensor was modified in place since the batch was taken."""
        for event in self.events.values():
            event.synchronize()  # the program's stream has written the bytes (docstring)
        self.events = {}
        digest = hashlib.sha256()
        for part in self.parts:
            if isinstance(part, bytes):
                digest.update(part)
                continue
            tensor, taken = part
            version = self.version
            if version is not None and version(tensor) != taken:
                raise BatchChanged(
                    "a tensor of the batch was modified in place before it was hashed"
                )
            digest.update(_tensor_bytes(tensor))  # hashlib releases the GIL over large buffers
            if version is not None and version(tensor) != taken:
                raise BatchChanged(
                    "a tensor of the batch was modified in place while it was hashed"
                )
        self.parts = []  # hashed once: the references go now
        return digest.hexdigest()


def batch_hash(batch: Any) -> str:
    """The content hash of ``batch`` (a DataLoader's output: tensors, dicts, lists,
    tuples and plain values; the encoding is in this module's docstring), as the
    ``batches`` event records it for iterable datasets: SHA-256, lowercase hex."""
    return BatchContent(batch).hexdigest()
