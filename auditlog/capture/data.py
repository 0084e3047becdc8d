"""Which data trained the model: every DataLoader iteration, its dataset, and the
sample indices of every batch, with no change to the user's code.

While a recording is open, ``DataLoader.__iter__`` and three methods of torch's
DataLoader iterator (``loader_compat.py``) are replaced by thin wrappers that
call the originals with the same arguments and return their results unchanged;
on exit the originals are put back (only where the attribute still holds our
wrapper, as in ``backward.py``). The wrappers never call the sampler, the
dataset or a generator themselves: the batches a loop sees, and every RNG
state, are those of an unrecorded run (tested bitwise).

- An iterator start (``DataLoader.__iter__``) emits ``loader_started`` with
  the loader's configuration, preceded, the first time a dataset is seen in
  the run, by ``dataset_seen`` (its identity, resolved on the writer thread:
  ``datasets.py``).
- Each index list the sampler yields (``_next_index``, always in the main
  process, for any ``num_workers``) is queued on its iterator; each batch the
  iterator returns (``__next__``) takes the oldest queued index list. Workers
  return batches in the order their indices were sent (``in_order=True``, the
  default), so the pairing is exact; with ``in_order=False`` a batch may be
  paired with another in flight (``loader_started.config.in_order`` says so).
  A single-process iterator draws once per batch: its queue is emptied before
  each ``__next__``, so a fetch that raised cannot shift the pairing.
- A batch is tied to the optimizer steps completed when it left the loader
  (``steps``): it trains the next step to complete. Batches are kept in plain
  lists on the training thread and handed over as one ``batches`` event per
  ``BATCHES_PER_EVENT`` batches of one iterator, at the iterator's end, at a
  new epoch and at run end; the writer packs them (``core/packed.py``).
- A batch of an ``IterableDataset`` has no indices: every ``batch_hash_every``-th
  batch of an iterator (policy) is taken for its content hash
  (``core/batchhash.py``): the encoding is built here, its tensors referenced
  with their in-place version counters (none copied: ``COPY_BYTES``), and the
  writer hashes them when it resolves the
  ``batches`` event (a referenced tensor changed in place in between: no hash,
  and ``hash_errors`` says why). What an iteration holds is handed over once it
  reaches ``HELD_BYTES_PER_EVENT``, and the event weighs its bytes in the
  record buffer, so a writer that falls behind blocks training (the buffer's
  back-pressure) instead of growing memory.
- Behind a wrapper that fetches ``k`` batches ahead (Accelerate's ``DataLoaderShard``
  and ``DataLoaderDispatcher``, the HF Trainer's loader, Lightning's prefetching
  fetcher: ``readahead.py``) a batch is stamped when the ``k``-th after it leaves
  the iterator (or the iterator ends): the moment the loop received it.

Iterators started before the recording are not recorded (their first indices
were drawn unseen). A wrapper never raises into user code: the recorder's part
runs under its fault handling (``recorder_error``).
"""

from __future__ import annotations

import base64
import collections
import functools
import operator
import sys
import weakref
from array import array
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils import data as tud

from auditlog.capture import loader_compat, readahead
from auditlog.capture.datasets import DatasetIdentity, loader_config
from auditlog.capture.ids import ObjectIds
from auditlog.capture.registrations import class_name
from auditlog.capture.torch_compat import tensor_version
from auditlog.core.batchhash import BatchChanged, BatchContent
from auditlog.core.packed import INT_KEYS, pack_ints

BATCHES_PER_EVENT = 256
"""Batches of one iterator handed over in one ``batches`` event (at most)."""
INDICES_PER_EVENT = 1 << 16
"""Indices in one ``batches`` event, about (a batch is never split)."""
COPY_BYTES = 0
"""Tensor bytes of a batch copied on the training thread for its hash; beyond, referenced
with their version counters. None: a copy measured dearer than a reference at every size
(large ones fault in fresh pages; docs/performance.md), and a DataLoader's batches are
fresh tensors that an in-place change would mark."""
ITEMS_WALKED = 4096
"""Items (tensors, containers, values) of one batch walked on the training thread, at most:
a batch of more (Python lists of token ids, say) is recorded unhashed, with the reason."""
HELD_BYTES_PER_EVENT = 16 << 20
"""Batch bytes (copied or referenced for hashing) an iteration holds before it hands them over."""

Taken = tuple[int, Any, bool, "BatchContent | str | None"]
"""A batch returned: (optimizer steps completed, its indices, grad enabled, its content
for hashing: taken, why it could not be, or None when not sampled)."""


class DataListener(Protocol):
    """What the watch needs of the recording: emit, fault and the step (``RecordingContext``)."""

    step: int

    def emit(
        self,
        kind: str,
        module_id: int | None = None,
        tensor_id: int | None = None,
        payload: Any = None,
        step: int | None = None,
    ) -> None: ...

    def fault(self, where: str, exc: BaseException) -> None: ...


class _Patch:
    """One attribute replaced by a wrapper, put back only if it still holds ours."""

    __slots__ = ("name", "original", "owner", "wrapper")

    def __init__(
        self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        self.owner = owner
        self.name = name
        self.original = owner.__dict__[name]  # the class's own attribute, not an inherited one
        self.wrapper = functools.wraps(self.original)(make(self.original))
        setattr(owner, name, self.wrapper)

    def restore(self) -> None:
        if self.owner.__dict__.get(self.name) is self.wrapper:
            setattr(self.owner, self.name, self.original)


class _Iteration:
    """One DataLoader iterator's state: the indices drawn and not yet returned, the
    batches returned and not yet handed over."""

    __slots__ = (
        "ahead",
        "batches",
        "dataset_id",
        "drawn",
        "epoch",
        "first",
        "held",
        "iterable",
        "loader_id",
        "pending",
        "returned",
        "single",
        "started",
    )

    def __init__(self) -> None:
        self.drawn: collections.deque[Any] = collections.deque()
        self.batches: list[Taken] = []
        self.started = False  # its start was seen (DataLoader.__iter__ under this recording)
        self.loader_id = 0
        self.dataset_id = 0
        self.epoch = 0
        self.first = 0  # position in the epoch of batches[0]
        self.iterable = False
        self.single = True
        self.ahead = 0  # batches a wrapper reads ahead of its loop (readahead.py)
        # ahead: the indices and content of the batches the loop has not received yet, oldest first
        self.pending: collections.deque[tuple[Any, BatchContent | str | None]] = collections.deque()
        self.returned = 0  # batches returned in this epoch (the next one's position)
        self.held = 0  # bytes of the batch contents held for hashing


class Batches:
    """A ``batches`` payload: plain lists from the training thread, packed by the writer."""

    __slots__ = ("_batches", "_head", "weight")

    def __init__(self, head: dict[str, Any], batches: list[Taken], held: int = 0) -> None:
        self._head = head
        self._batches = batches
        self.weight = held >> 10  # in the record buffer's units (~1 KB): capture/buffer.py

    def resolve(self) -> dict[str, Any]:
        out = dict(self._head)
        batches, self._batches = self._batches, []
        out["count"] = len(batches)
        out["steps"] = pack_ints([b[0] for b in batches])
        no_grad = [i for i, b in enumerate(batches) if not b[2]]
        if no_grad:
            out["no_grad"] = no_grad
        if out.get("iterable"):
            _hash_batches(out, batches)
            return out
        sizes: list[int] = []
        flat = array("q")
        opaque: list[int] = []
        for position, (_, indices, _, _) in enumerate(batches):
            before = len(flat)
            try:
                # A BatchSampler's list of ints: one C loop (array refuses anything else).
                flat.extend(indices if type(indices) is list else _ints(indices))
            except (TypeError, OverflowError, ValueError):
                del flat[before:]
                opaque.append(position)
            sizes.append(len(flat) - before)
        out["sizes"] = pack_ints(sizes)
        out["indices"] = pack_int_array(flat)
        if opaque:
            out["opaque"] = opaque
        return out


def _hash_batches(out: dict[str, Any], batches: list[Taken]) -> None:
    """``hashes`` (and ``hash_errors``) of the batches taken for hashing (on the writer)."""
    if all(b[3] is None for b in batches):
        return
    hashes: list[str | None] = []
    errors: list[dict[str, Any]] = []
    for position, (_, _, _, content) in enumerate(batches):
        digest = None
        if isinstance(content, str):
            errors.append({"position": position, "reason": content})
        elif content is not None:
            try:
                digest = content.hexdigest()
            except BatchChanged as exc:
                errors.append({"position": position, "reason": str(exc)})
            except Exception as exc:  # whatever the batch holds, the record says why not
                errors.append(
                    {"position": position, "reason": f"{type(exc).__name__}: {exc}"[:500]}
                )
        hashes.append(digest)
    out["hashes"] = hashes
    if errors:
        out["hash_errors"] = errors


def _take(batch: Any) -> BatchContent | str:
    """A batch taken for hashing (training thread), or why it cannot be."""
    try:
        return BatchContent(batch, COPY_BYTES, ITEMS_WALKED, tensor_version)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:500]


def _ints(indices: Any) -> list[int]:
    """A batch's indices as ints (one index: a list of one); raises TypeError when they
    are not integers."""
    if isinstance(indices, torch.Tensor):
        if indices.is_floating_point() or indices.is_complex():
            raise TypeError("indices are not integers")
        return [int(i) for i in indices.reshape(-1).tolist()]
    if isinstance(indices, (list, tuple)):
        return [operator.index(i) for i in indices]
    return [operator.index(indices)]


def pack_int_array(values: array[int]) -> dict[str, Any]:
    """``core.packed.pack_ints`` of an ``array('q')``, with numpy (several times faster per
    batch, docs/performance.md: this runs on the writer, which shares the GIL with training)."""
    import numpy as np

    data = np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
    low, high = (int(data.min()), int(data.max())) if len(data) else (0, 0)
    for key, (_, width) in INT_KEYS.items():
        if -(2 ** (8 * width - 1)) <= low and high < 2 ** (8 * width - 1):
            raw = data.astype(f"<i{width}").tobytes()
            return {key: base64.b64encode(raw).decode("ascii")}
    raise ValueError("index beyond int64")  # unreachable: the array holds int64


class DataWatch:
    """The wrappers of one recording (see the module docstring), and their state."""

    def __init__(self, listener: DataListener, hash_every: int = 0) -> None:
        self.listener = listener
        self.hash_every = hash_every  # policy batch_hash_every (iterable datasets)
        self.active = False
        self._patches: list[_Patch] = []
        self._loaders = ObjectIds()
        self._datasets = ObjectIds()
        self._strong: dict[int, tuple[Any, int]] = {}  # datasets/loaders without weak references
        self._counter = 1_000_000_000  # their ids: never one ObjectIds hands out
        self._starts: dict[int, int] = {}  # loader id -> iterations started
        self._iterations: weakref.WeakKeyDictionary[Any, _Iteration] = weakref.WeakKeyDictionary()
        # Iterations holding batches not handed over, held strongly (not their iterators):
        # an iterator dropped before its end (a loop left with break) loses none.
        self._holding: set[_Iteration] = set()

    def install(self) -> None:
        """Put the wrappers in place (recording starts)."""
        if self._patches:
            return
        self.active = True
        self._patches.append(_Patch(tud.DataLoader, "__iter__", self._wrap_iter))
        if loader_compat.iterator_methods_present():
            it = loader_compat.ITERATOR_CLASS
            self._patches.append(_Patch(it, loader_compat.DRAW_METHOD, self._wrap_draw))
            self._patches.append(_Patch(it, loader_compat.RESET_METHOD, self._wrap_reset))
            self._patches.append(_Patch(it, loader_compat.NEXT_METHOD, self._wrap_next))

    def remove(self) -> None:
        """Hand over what is pending, put the originals back (recording ends)."""
        self.flush()
        self.active = False
        while self._patches:
            self._patches.pop().restore()

    def flush(self) -> None:
        """Hand over every iterator's pending batches (run end, ``run.flush()``)."""
        try:
            for iteration in list(self._holding):
                self._hand_over(iteration)
        except Exception as exc:
            self.listener.fault("data_flush", exc)

    # ------------------------------------------------------------------ wrappers
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __iter__(loader: Any) -> Any:
            iterator = original(loader)
            if self.active:
                try:
                    self._started(loader, iterator, readahead.reads_ahead(sys._getframe(1), loader))
                except Exception as exc:
                    self.listener.fault("dataloader_iter", exc)
            return iterator

        return __iter__

    def _wrap_draw(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _next_index(iterator: Any) -> Any:
            index = original(iterator)  # StopIteration goes to torch as it came
            if self.active:
                try:
                    iteration = self._iterations.get(iterator)
                    if iteration is None:
                        iteration = self._iterations[iterator] = _Iteration()
                    if not iteration.iterable:
                        iteration.drawn.append(index)
                except Exception as exc:
                    self.listener.fault("dataloader_draw", exc)
            return index

        return _next_index

    def _wrap_reset(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _reset(iterator: Any, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                try:
                    iteration = self._iterations.get(iterator)
                    if iteration is not None:  # a persistent iterator starts its next epoch
                        self._hand_over(iteration)
                        iteration.drawn.clear()
                        iteration.started = False
                        iteration.returned = 0
                except Exception as exc:
                    self.listener.fault("dataloader_reset", exc)
            return original(iterator, *args, **kwargs)

        return _reset

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __next__(iterator: Any) -> Any:
            if not self.active:
                return original(iterator)
            iteration = self._iterations.get(iterator)
            if iteration is not None and iteration.single:
                iteration.drawn.clear()
            try:
                batch = original(iterator)
            except StopIteration:
                if iteration is not None:
                    try:
                        self._hand_over(iteration)
                    except Exception as exc:
                        self.listener.fault("dataloader_next", exc)
                raise
            try:
                self._returned(iterator, batch)
            except Exception as exc:
                self.listener.fault("dataloader_next", exc)
            return batch

        return __next__

    # ------------------------------------------------------------------ record
    def _id(self, ids: ObjectIds, obj: Any) -> tuple[int, bool]:
        try:
            return ids.get(obj)
        except TypeError:  # no weak reference possible: held for the run (rare)
            held = self._strong.get(id(obj))
            if held is not None and held[0] is obj:
                return held[1], False
            self._counter += 1
            self._strong[id(obj)] = (obj, self._counter)
            return self._counter, True

    def _started(self, loader: Any, iterator: Any, ahead: int = 0) -> None:
        for held in list(self._holding):  # earlier iterations (left early, or interleaved) first
            self._hand_over(held)
        loader_id, _ = self._id(self._loaders, loader)
        dataset = loader.dataset
        dataset_id, new = self._id(self._datasets, dataset)
        iterable = loader_compat.is_iterable_dataset(loader)
        if new:
            identity = DatasetIdentity(dataset)
            self.listener.emit(
                "dataset_seen",
                payload={
                    "dataset_id": dataset_id,
                    "class": identity.name,
                    "kind": "iterable" if iterable else "map",
                    "length": identity.length,
                    "identity": identity,
                },
            )
        iteration = self._iterations.get(iterator)
        if iteration is None:
            iteration = self._iterations[iterator] = _Iteration()
        epoch = self._starts.get(loader_id, 0)
        self._starts[loader_id] = epoch + 1
        iteration.loader_id, iteration.dataset_id, iteration.epoch, iteration.first = (
            loader_id,
            dataset_id,
            epoch,
            0,
        )
        iteration.iterable = iterable
        iteration.single = int(loader.num_workers) == 0
        iteration.ahead = ahead
        iteration.pending.clear()
        iteration.returned = 0
        iteration.started = True
        if iterable:
            iteration.drawn.clear()
        self.listener.emit(
            "loader_started",
            payload={
                "loader_id": loader_id,
                "dataset_id": dataset_id,
                "epoch": epoch,
                "loader_class": class_name(loader),
                "config": loader_config(loader, iterator),
            },
        )

    def _returned(self, iterator: Any, batch: Any) -> None:
        iteration = self._iterations.get(iterator)
        if iteration is None or not iteration.started:
            return
        content: BatchContent | str | None = None
        if iteration.iterable:
            indices = None
            if self.hash_every and iteration.returned % self.hash_every == 0:
                content = _take(batch)
                if isinstance(content, BatchContent):
                    iteration.held += content.nbytes
        elif iteration.drawn:
            indices = iteration.drawn.popleft()
        else:
            return  # nothing drawn for it that we saw
        iteration.returned += 1
        if iteration.ahead:  # the loop receives an earlier batch now, this one later
            iteration.pending.append((indices, content))
            self._holding.add(iteration)
            if len(iteration.pending) <= iteration.ahead:
                return
            indices, content = iteration.pending.popleft()
        iteration.batches.append((self.listener.step, indices, torch.is_grad_enabled(), content))
        if len(iteration.batches) == 1:
            self._holding.add(iteration)
        if (
            len(iteration.batches) >= BATCHES_PER_EVENT
            or iteration.held >= HELD_BYTES_PER_EVENT
            or (len(iteration.batches) * _size(indices) >= INDICES_PER_EVENT)
        ):
            self._hand_over(iteration, final=False)

    def _hand_over(self, iteration: _Iteration, final: bool = True) -> None:
        """Emit the batches held; ``final``: the iteration ended (or is left), so a
        batch still pending (read ahead) is stamped now too, else they stay held."""
        self._holding.discard(iteration)
        if iteration.pending:
            if not final:
                self._holding.add(iteration)
            else:
                grad = torch.is_grad_enabled()
                while iteration.pending:
                    indices, content = iteration.pending.popleft()
                    iteration.batches.append((self.listener.step, indices, grad, content))
        if not iteration.batches:
            return
        batches, iteration.batches = iteration.batches, []
        held = iteration.held  # less what is still pending: counted with the next hand-over
        held -= sum(c.nbytes for _, c in iteration.pending if isinstance(c, BatchContent))
        iteration.held -= held
        head: dict[str, Any] = {
            "loader_id": iteration.loader_id,
            "dataset_id": iteration.dataset_id,
            "epoch": iteration.epoch,
            "first": iteration.first,
        }
        if iteration.iterable:
            head["iterable"] = True
        iteration.first += len(batches)
        self.listener.emit("batches", payload=Batches(head, batches, held))


def _size(indices: Any) -> int:
    try:
        return len(indices)
    except TypeError:
        return 1
