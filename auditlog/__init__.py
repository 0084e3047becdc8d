"""auditlog: an event-sourced, tamper-evident audit log of PyTorch model building and training.

Public API: ``record`` (context manager / decorator), ``open`` (read a store),
``tensor_hash``, and the exception hierarchy in ``auditlog.errors``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from auditlog.errors import AuditlogError  # noqa: E402
from auditlog.session import Recording, current, record  # noqa: E402
from auditlog.reader import open  # noqa: E402,A004
from auditlog.tensors import tensor_hash  # noqa: E402

__all__ = ["AuditlogError", "Recording", "current", "open", "record", "tensor_hash", "__version__"]
