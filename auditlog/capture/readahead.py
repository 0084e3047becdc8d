"""Loader wrappers that fetch batches ahead of the loop they feed, recognised so that each
batch is tied to the step that trained on it, not a step early.

Known wrappers, and how far ahead each reads:

- Accelerate's ``DataLoaderShard`` (what ``accelerator.prepare`` returns for a
  map-style loader, and the HF Trainer iterates) and ``DataLoaderDispatcher``
  (what it returns for an ``IterableDataset``: ``dispatch_batches``) hold a plain
  ``DataLoader`` (``base_dataloader``) and iterate it one batch ahead, to know
  which batch is the last: the loop receives batch ``b`` only after batch
  ``b + 1`` has left the torch iterator, and nothing runs in between.
- Lightning's ``_PrefetchDataFetcher`` (``pytorch_lightning`` and ``lightning``)
  fetches ``prefetch_batches`` (1 by default) ahead through its ``CombinedLoader``,
  but only when the loader has no length (an ``IterableDataset``, or a sampler
  without ``__len__``): with a length it reads no batch ahead.

The data watch sees only the inner ``DataLoader``; behind a wrapper that reads
``k`` ahead, the steps completed when batch ``b + k`` leaves the torch iterator
(or it raises ``StopIteration``) are the steps completed when the loop received
batch ``b``, so batch ``b`` is stamped then (``capture/data.py``,
``_Iteration.pending``).

How it is recognised: ``DataLoader.__iter__`` is called, directly or a few calls
down (Lightning: fetcher, ``CombinedLoader``, its mode iterator), from the
wrapper's own methods, so one of the caller frames holds the wrapper as
``self``. At most ``FRAMES`` frame look-ups per iterator start, read-only: the
frames' locals are read, never written. Batches a resumed ``DataLoaderShard``
skips (``skip_batches``) never reach the loop; they are recorded as the
batches before them are, trained by the step that follows.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

ONE_AHEAD = {
    ("accelerate.data_loader", "DataLoaderShard"),
    ("accelerate.data_loader", "DataLoaderDispatcher"),
}
"""(module, class) of the wrappers known to iterate their ``base_dataloader`` one batch ahead."""
PREFETCHERS = {
    ("pytorch_lightning.loops.fetchers", "_PrefetchDataFetcher"),
    ("lightning.pytorch.loops.fetchers", "_PrefetchDataFetcher"),
}
"""(module, class) of Lightning's fetchers that read ``prefetch_batches`` ahead of an unsized loader."""
FRAMES = 10
"""Caller frames looked at, at most, for a wrapper."""


def reads_ahead(caller: FrameType | None, loader: Any) -> int:
    """How many batches ahead of its loop a known wrapper iterates ``loader``, found among
    the callers of ``loader.__iter__`` (0: none, or not recognised)."""
    frame = caller
    for _ in range(FRAMES):
        if frame is None:
            return 0
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not loader:
            for cls in type(owner).__mro__:
                key = (cls.__module__, cls.__qualname__)
                if key in ONE_AHEAD:
                    return 1 if getattr(owner, "base_dataloader", None) is loader else 0
                if key in PREFETCHERS:
                    return _prefetched(owner, loader)
        frame = frame.f_back
    return 0


def _prefetched(fetcher: Any, loader: Any) -> int:
    """Batches a Lightning fetcher reads ahead of ``loader``: ``prefetch_batches`` when the
    loader is one of its ``CombinedLoader``'s and has no length (Lightning's own rule,
    ``sized_len``), else 0."""
    combined = getattr(fetcher, "_combined_loader", None)
    flattened = getattr(combined, "flattened", None) or ()
    if not any(item is loader for item in flattened):
        return 0
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        ahead = getattr(fetcher, "prefetch_batches", 0)
        return ahead if isinstance(ahead, int) and ahead > 0 else 0
    return 0
