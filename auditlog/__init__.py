"""auditlog: an event-sourced, tamper-evident audit log of PyTorch model building and training.

Public API: ``record`` (context manager / decorator) and ``current`` (the active
recording), ``log`` (metrics into the active recording), ``open`` (read a store), ``tensor_hash``,
``batch_hash``, and the exception
hierarchy in ``auditlog.core.errors`` (``AuditlogError`` and subclasses).

``import auditlog`` is cheap: the names below are imported on first use, so a
command that only reads a store never imports torch (a recording imports it
when it starts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import AuditlogError
from auditlog.core.version import __version__

if TYPE_CHECKING:
    from auditlog.core.batchhash import batch_hash
    from auditlog.core.tensors import tensor_hash
    from auditlog.read.api import open
    from auditlog.recording.session import Recording, current, log, record

_LAZY = {
    "open": "auditlog.read.api",
    "record": "auditlog.recording.session",
    "current": "auditlog.recording.session",
    "log": "auditlog.recording.session",
    "Recording": "auditlog.recording.session",
    "tensor_hash": "auditlog.core.tensors",
    "batch_hash": "auditlog.core.batchhash",
}

__all__ = [
    "AuditlogError",
    "Recording",
    "__version__",
    "batch_hash",
    "current",
    "log",
    "open",
    "record",
    "tensor_hash",
]


def __getattr__(name: str) -> Any:
    """Import the public API on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'auditlog' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
