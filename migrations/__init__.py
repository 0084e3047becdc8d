"""Alembic environment and revisions for the event store (installed as auditlog.migrations)."""
