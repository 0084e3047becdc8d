"""The one exception hierarchy of auditlog, and the exit code each maps to.

Every driver or file error that reaches a user is converted into one of these in
one place (the store module for storage, the CLI boundary for everything else), so
the CLI can print a single ``Error: ...`` line and exit with a documented code.
"""

from __future__ import annotations


class AuditlogError(Exception):
    """Base class: a problem the user can act on. Exit code 1."""

    exit_code = 1


class UsageError(AuditlogError):
    """Bad arguments: an unknown event kind, a malformed step range. Exit code 2."""

    exit_code = 2


class StoreError(AuditlogError):
    """The store cannot be used: missing, foreign, corrupt or of another schema. Exit code 3."""

    exit_code = 3


class StoreMissingError(StoreError):
    """Nothing is stored at the location yet (reading commands need an existing store)."""


class NotAStoreError(StoreError):
    """The location holds something that is not an auditlog store; it is left untouched."""


class CorruptRecordError(StoreError):
    """A stored event is malformed (edited by hand, damaged): readers refuse it by name."""


class StoreUnavailableError(StoreError):
    """The store is fine but cannot be written now (read-only, disk full, no permission).

    Unlike a refusal, this is the environment's fault: with ``on_error=continue``
    the program runs unrecorded instead of failing because of its recorder.
    """


class SchemaTooOldError(StoreError):
    """The store was written by an older auditlog; ``auditlog db upgrade`` brings it forward."""


class SchemaTooNewError(StoreError):
    """The store was written by a newer auditlog; this version refuses to touch it."""


class RunNotFoundError(AuditlogError):
    """No run matches the selector, or a prefix matches more than one run. Exit code 1."""


class IntegrityError(AuditlogError):
    """``verify`` found the record altered: a broken hash chain or a sequence gap. Exit code 4."""

    exit_code = 4


class PayloadLimitError(IntegrityError):
    """A stored payload is past the documented size or depth limit (``core.payloadlimits``).

    The recorder never writes one, so it was written by other means; readers refuse
    it by name before parsing it. Exit code 4, as ``verify``'s verdict on an edit.
    """


class RecordingFailedError(AuditlogError):
    """The store failed during a run recorded with ``on_error=fail``. Exit code 5."""

    exit_code = 5


class CommandInterrupted(AuditlogError):
    """Ctrl-C (SIGINT) stopped a command. Exit code 130, as a shell reports a SIGINT death."""

    exit_code = 130


class RecordingActiveError(AuditlogError):
    """A second ``record()`` while one is active: hooks would be doubled, so it is refused."""


def one_line(exc: BaseException) -> str:
    """A driver's error message on one line: what a user reads after ``Error:``.

    SQLAlchemy wraps the driver's exception (``orig``) and appends the SQL and a
    link; DuckDB echoes the query with a caret line under it. Those lines are
    dropped, the rest joined, so every layer reports a driver error the same way.
    """
    text = str(getattr(exc, "orig", None) or exc)
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(
            ("LINE ", "[SQL:", "[parameters:", "(Background on this error")
        ):
            continue
        if set(line) <= {"^"}:
            continue
        lines.append(line)
    return " ".join(lines) or type(exc).__name__
