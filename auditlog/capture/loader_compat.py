"""The private parts of ``torch.utils.data`` the data watch needs, in one place.

``torch_compat.py`` holds every other private torch internal and is at its size
limit, so the DataLoader's live here, with the same rule: each access is a
name or a function below, checked against torch 2.4 through 2.13, and
``tests/test_torch_compat.py`` fails naming the torch version when one
disappears.

Why private ones at all: ``DataLoader.__iter__`` (public) says when an
iteration starts, but not which indices each batch was drawn from. Those come
from the sampler through ``_BaseDataLoaderIter._next_index`` (the one call
that advances the sampler's iterator, in the main process for every
``num_workers``: workers receive the indices, they never draw them), and a
batch leaves the loader through ``_BaseDataLoaderIter.__next__``.
``_BaseDataLoaderIter._reset`` starts a persistent-workers iterator over
(indices drawn ahead for the epoch that ended are dropped with it). Wrapping
these three methods observes without calling the sampler ourselves, so the
sampler's generator is never advanced by the recorder.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import dataloader as _dataloader

ITERATOR_CLASS: Any = getattr(_dataloader, "_BaseDataLoaderIter", None)
"""The base class of both DataLoader iterators (single- and multi-process)."""

DRAW_METHOD = "_next_index"
"""``iterator._next_index()``: the sampler's next index or list of indices."""

RESET_METHOD = "_reset"
"""``iterator._reset(loader, first_iter=False)``: a (persistent) iterator starts over."""

NEXT_METHOD = "__next__"
"""Public in name, but patched on the private iterator class."""


def iterator_methods_present() -> bool:
    """Whether the iterator class still has the three methods the watch wraps."""
    return ITERATOR_CLASS is not None and all(
        callable(getattr(ITERATOR_CLASS, name, None))
        for name in (DRAW_METHOD, RESET_METHOD, NEXT_METHOD)
    )


def _require_iterator_methods() -> None:
    if not iterator_methods_present():
        raise AttributeError(
            "torch.utils.data.dataloader._BaseDataLoaderIter lacks _next_index, _reset or __next__"
        )


def index_sampler(loader: Any) -> Any:
    """The sampler the loader draws indices from: its ``batch_sampler`` when it batches
    (auto-collation), else its ``sampler`` (``DataLoader._index_sampler``)."""
    return getattr(loader, "_index_sampler", None)


def is_iterable_dataset(loader: Any) -> bool:
    """Whether the loader's dataset is iterable-style (``DataLoader._dataset_kind``)."""
    kind = getattr(loader, "_dataset_kind", None)
    return kind == getattr(getattr(_dataloader, "_DatasetKind", None), "Iterable", object())


def worker_base_seed(iterator: Any) -> int | None:
    """The seed the iterator drew for its workers (``_base_seed``; worker i is seeded
    with base + i), read, never drawn again."""
    seed = getattr(iterator, "_base_seed", None)
    return int(seed) if isinstance(seed, int) else None


REQUIRED = {
    "torch.utils.data.dataloader._BaseDataLoaderIter._next_index/_reset/__next__": _require_iterator_methods,
    "torch.utils.data.DataLoader._index_sampler": lambda: _dataloader.DataLoader._index_sampler,
    "torch.utils.data.dataloader._DatasetKind.Iterable": lambda: _dataloader._DatasetKind.Iterable,
}
"""What ``tests/test_torch_compat.py`` checks exists (each call raises when it is gone)."""
