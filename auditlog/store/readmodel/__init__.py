"""The read model: a DuckDB projection of the event store, its views and the query session.

A disposable cache shaped for questions (``cache``), filled from the event store
through Arrow (``arrowcopy``) by the SQL in ``tables``; ``views`` is the
documented query surface and ``session`` the locked-down connection ``auditlog
query`` uses. All of its SQL lives in this package.
"""
