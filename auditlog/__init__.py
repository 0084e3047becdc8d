"""auditlog: an event-sourced, tamper-evident audit log of PyTorch model building and training.

Public API: ``record`` (context manager / decorator), ``open`` (read a store),
``tensor_hash``, and the exception hierarchy in ``auditlog.errors``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from auditlog.errors import AuditlogError
from auditlog.reader import open
from auditlog.session import Recording, current, record
from auditlog.tensors import tensor_hash

__all__ = ["AuditlogError", "Recording", "__version__", "current", "open", "record", "tensor_hash"]
