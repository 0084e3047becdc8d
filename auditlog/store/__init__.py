"""Write/read side storage: the event store (SQLAlchemy) and where stores live."""

from auditlog.store.eventstore import EventStore
from auditlog.store.location import StoreLocation, resolve_store

__all__ = ["EventStore", "StoreLocation", "resolve_store"]
