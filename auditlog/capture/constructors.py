"""Where each module was constructed: a wrapper on ``nn.Module.__init__`` while recording.

torch has no global construction hook. Its registration hooks fire when a
module is *attached* (``add_module``, ``setattr``): a module with parameters or
children is first seen inside its own ``__init__`` (its members register
there), so the caller of that ``__init__`` is its constructing line; a
parameterless one (``ReLU``, ``GELU``, ``Dropout``) is first seen where it is
attached, often another line (``layers.append(nn.ReLU())`` on line 23,
``nn.Sequential(*layers)`` on line 25: issue 28). So while a recording is on,
``nn.Module.__init__`` (which every module's constructor reaches through
``super().__init__()``) is wrapped: after the original ran, the wrapper finds
the constructing frame (``source.constructor_caller``: past every ``__init__``
of this very module, then past torch and auditlog) and hands it to the
listeners (the recorder keeps it on the module's weak id reference, ids.py).

Rules the wrapper keeps (docs/how-it-works.md, "Where a module was built"):

- it changes nothing: the original runs first, with the same arguments, and its
  result and exceptions are the caller's; what the listeners do cannot raise
  into the constructor;
- under ``torch.compile`` it only calls the original (dynamo resolves
  ``nn.Module.__init__`` to its own unpatched copy anyway, so it never traces
  this frame); a subclass that never calls ``super().__init__()``, a deepcopy,
  ``torch.load`` and C++ never reach it: those modules are labelled with the
  line where they were attached (``kind: attached``);
- it is put in place when the first listener starts and taken out when the last
  stops, leaving ``nn.Module.__init__`` exactly the object it was. Where other
  code wrapped it in turn meanwhile (dynamo does, once per process, at the first
  ``torch.compile``), taking ours out would take theirs too: ours then stays in
  their chain, inert (one tuple test per construction) and is reused by the
  next recording.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from auditlog.capture.source import Site, constructor_caller

Listener = Callable[[nn.Module, "Site | None"], None]
_is_compiling = torch.compiler.is_compiling

_lock = threading.Lock()
# Read without the lock by every construction: a tuple, replaced whole.
_listeners: tuple[Listener, ...] = ()
_wrapper: Callable[..., None] | None = None  # ours, while it is in place or in another's chain
_previous: Callable[..., None] | None = None  # nn.Module.__init__ as it was before ours


def _noted(module: nn.Module, listeners: tuple[Listener, ...]) -> None:
    """Find the constructing frame (from the wrapper's caller outward) and tell each listener."""
    try:
        site = constructor_caller(module, sys._getframe(2))  # 0: here, 1: the wrapper
    except Exception:  # never into the user's constructor; the attach line stands in
        return
    for listener in listeners:
        listener(module, site)  # listeners catch their own faults (recorder: recorder_error)


def _wrap(previous: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(previous)
    def __init__(self: nn.Module, *args: Any, **kwargs: Any) -> None:
        previous(self, *args, **kwargs)
        listeners = _listeners
        if listeners and not _is_compiling():
            _noted(self, listeners)

    return __init__


def listen(listener: Listener) -> None:
    """Start telling ``listener`` where each module is constructed (puts the wrapper in place)."""
    global _listeners, _wrapper, _previous
    with _lock:
        if _wrapper is None:
            _previous = nn.Module.__dict__["__init__"]
            _wrapper = _wrap(_previous)
            nn.Module.__init__ = _wrapper  # type: ignore[method-assign]
        _listeners = (*_listeners, listener)


def unlisten(listener: Listener) -> None:
    """Stop telling ``listener``; the last one out restores ``nn.Module.__init__`` exactly."""
    global _listeners, _wrapper, _previous
    with _lock:
        _listeners = tuple(other for other in _listeners if other != listener)
        if _listeners or _wrapper is None:
            return
        if nn.Module.__dict__.get("__init__") is _wrapper:
            nn.Module.__init__ = _previous  # type: ignore[method-assign,assignment]
            _wrapper = _previous = None
        # else: other code wrapped ours meanwhile; ours stays in its chain, inert
