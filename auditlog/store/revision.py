"""The store's schema version and identity constants, without SQLAlchemy.

Opening a store compares its Alembic revision with ``KNOWN_REVISIONS`` to decide
between "upgrade your store" and "upgrade auditlog"; a read command does that
without importing SQLAlchemy, so the constants live here. The tables themselves
and the changelog of revisions are in ``schema.py``, which re-exports these.
A new revision is appended to ``KNOWN_REVISIONS``.
"""

from __future__ import annotations

KNOWN_REVISIONS: tuple[str, ...] = ("0001", "0002", "0003", "0004", "0005")
HEAD_REVISION = KNOWN_REVISIONS[-1]
STORE_FORMAT = "auditlog-event-store"
SNAPSHOTS_META = "snapshots"  # auditlog_meta key: a database store's snapshot directory
