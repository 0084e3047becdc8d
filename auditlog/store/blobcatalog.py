"""Which snapshot contents a store holds, as a writer storing more of them needs to know.

A content is held when the catalog lists it and its file exists. The recording's
writer asks this for every tensor of every snapshot, so what it learnt is kept
(``StoreCatalog``), many hashes are asked about in one query, and the rows of
contents it wrote wait here until the writer commits them, in their own
transaction before the events that name them (an event never references a hash
the catalog does not know). ``BlobWriter.store`` asks and tells a catalog; it
never calls back into the recording.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from auditlog.store.blobformat import BlobInfo
    from auditlog.store.blobs import SnapshotStore
    from auditlog.store.eventstore import EventStore


class ContentCatalog(Protocol):
    """What ``BlobWriter.store`` asks (is a content held?) and tells (this one was written)."""

    def holds(self, sha256: str) -> bool: ...

    def holds_among(self, hashes: set[str]) -> set[str]: ...

    def added(self, info: BlobInfo) -> None: ...


class KnownContents:
    """A catalog in memory: the contents named at the start and those written since
    (a writer with no store behind it: tests, tools)."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known = set(known)

    def holds(self, sha256: str) -> bool:
        return sha256 in self.known

    def holds_among(self, hashes: set[str]) -> set[str]:
        return hashes & self.known

    def added(self, info: BlobInfo) -> None:
        self.known.add(info.sha256)


class StoreCatalog:
    """The store's catalog as the recording's writer sees it: what it learnt, and the rows
    of the contents it wrote that the catalog does not have yet (``commit``)."""

    def __init__(self, store: EventStore, files: SnapshotStore) -> None:
        self.store = store
        self.files = files
        self._known: set[str] = set()
        self._pending: list[dict[str, Any]] = []

    def holds(self, sha256: str) -> bool:
        if sha256 in self._known:
            return True
        if self.store.has_blob(sha256) and self.files.path(sha256).exists():
            self._known.add(sha256)
            return True
        return False

    def holds_among(self, hashes: set[str]) -> set[str]:
        """``holds`` for many hashes, with one catalog query per 500."""
        known = hashes & self._known
        ask = hashes - known
        if ask:
            for sha256 in self.store.blobs_among(sorted(ask)):
                if self.files.path(sha256).exists():
                    self._known.add(sha256)
                    known.add(sha256)
        return known

    def added(self, info: BlobInfo) -> None:
        self._known.add(info.sha256)
        self._pending.append(info.as_row())

    def commit(self) -> None:
        """Insert the rows of the contents written since the last commit (one transaction);
        kept for the next try when the insert fails."""
        if self._pending:
            self.store.add_blobs(self._pending)
            self._pending = []
