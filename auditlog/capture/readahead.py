"""Loader wrappers that fetch one batch ahead of the loop they feed, recognised so that
each batch is tied to the step that trained on it, not one step early.

Accelerate's ``DataLoaderShard`` (what ``accelerator.prepare`` and the HF Trainer
iterate) holds a plain ``DataLoader`` (``base_dataloader``) and iterates it one
batch ahead, to know which batch is the last: the loop receives batch ``b`` only
after batch ``b + 1`` has left the torch iterator, and nothing runs in between.
The data watch sees only the inner ``DataLoader``; the steps completed when it
returns batch ``b + 1`` (or raises ``StopIteration`` after the last one) are the
steps completed when the loop received batch ``b``, so for such an iteration
batch ``b`` is stamped then (``capture/data.py``, ``_Iteration.pending``).

How it is recognised: ``DataLoader.__iter__`` is called from the wrapper's own
``__iter__`` (``self.base_dataloader.__iter__()``), so the caller's frame holds
the wrapper as ``self``. One frame look-up per iterator start, read-only: the
frame's locals are read, never written. Batches a resumed ``DataLoaderShard``
skips (``skip_batches``) never reach the loop; they are recorded as the
batches before them are, trained by the step that follows.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

ONE_AHEAD = {("accelerate.data_loader", "DataLoaderShard")}
"""(module, class) of the wrappers known to iterate their DataLoader one batch ahead."""


def reads_one_ahead(caller: FrameType | None, loader: Any) -> bool:
    """Whether ``loader.__iter__`` was called by a known one-ahead wrapper of ``loader``."""
    if caller is None:
        return False
    owner = caller.f_locals.get("self")
    if owner is None or owner is loader:
        return False
    for cls in type(owner).__mro__:
        if (cls.__module__, cls.__qualname__) in ONE_AHEAD:
            return getattr(owner, "base_dataloader", None) is loader
    return False
