"""Alembic environment: runs migrations on the connection auditlog hands over.

auditlog drives Alembic programmatically (``auditlog db upgrade``); the connection
arrives in ``config.attributes["connection"]`` so validation, locking and the
SQLite pragmas stay in one place (``auditlog.store.migrate``).
"""

from __future__ import annotations

from alembic import context

from auditlog.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - only when someone runs the alembic CLI by hand
    raise RuntimeError("run migrations through `auditlog db upgrade`, not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
