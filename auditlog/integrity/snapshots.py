"""Verify the snapshot files a run's events reference: present, intact, catalogued.

The hash chain covers snapshot *hashes* (they are in event payloads); this checks
that the content behind each hash is still there at the location its hash
names, has exactly a snapshot's Parquet schema and still hashes to it (decoded
with pyarrow and numpy: ``verify`` never imports torch), and that the catalog
(a cache) agrees with the file in every field, the digest of all its bytes
included; it names the tensor (by qualified name) and the file when not. A
missing file is reported as missing, a damaged one as damaged; neither
crashes ``verify``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditlog.core.errors import StoreError
from auditlog.core.hashing import hash_text, is_content_hash, shown_hash
from auditlog.core.replay import CONSTRUCTION_KINDS, replay
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import decode_event, payload_object

if TYPE_CHECKING:
    from auditlog.store.blobprove import Pending


@dataclass(frozen=True)
class SnapshotProblem:
    """A snapshot a run references that is missing or damaged."""

    seq: int
    event_id: int
    tensor: str
    sha256: str
    file: str | None
    what: str

    @property
    def place(self) -> str:
        """``file snapshots/<h[:2]>/<h>.parquet``, or the recorded value where it is not a
        content hash (no file is named, none was opened)."""
        return (
            f"file snapshots/{self.file}"
            if self.file
            else f"content hash {shown_hash(self.sha256)}"
        )

    def describe(self) -> str:
        return (
            f"seq {self.seq} (event id {self.event_id}): snapshot of {self.tensor} "
            f"[{shown_hash(self.sha256)}], {self.place}: {self.what}"
        )


def _referenced(store: EventStore, run_id: str) -> Iterator[tuple[int, int, int, str]]:
    """``(seq, event id, tensor_id, sha256)`` for every stored value a run references."""
    rows = store.snapshot_references(run_id)
    for seq, event_id, kind, text in rows:
        # A malformed event is the chain check's to report; here it is skipped.
        try:
            payload = payload_object(
                text, strict=False
            )  # past the limits: the chain check names it
            if kind == "snapshot_taken":
                items = (payload.get("snapshot") or {}).get("tensors", [])
            elif payload.get("stored"):
                items = payload.get("tensors", [])
            else:
                continue
            # A value that is not a content hash stays a finding (hash_text keeps it printable, never a path).
            found = [
                (int(seq), int(event_id), int(i["tensor_id"]), str(hash_text(i["sha256"])))
                for i in items
            ]
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            continue
        yield from found


@dataclass
class ChecksAhead:
    """A run's snapshot references, read at the start of its verdict, and their small files
    handed to worker processes (``SnapshotStore.check_ahead``) while the verdict checks
    the chain."""

    references: list[tuple[int, int, int, str]]
    pending: Pending | None


def check_files_ahead(store: EventStore, run_id: str) -> ChecksAhead | None:
    """Start checking the run's snapshot files on this process's worker processes, where
    it started them (``auditlog ui``); None otherwise (nothing is read then)."""
    from auditlog.store import blobprove

    if blobprove.active() is None:
        return None
    from auditlog.store.blobs import SnapshotStore

    try:
        references = list(_referenced(store, run_id))
    except StoreError:
        return None  # the verdict reads them again and reports what it finds
    names = sorted({sha for *_, sha in references if is_content_hash(sha)})
    pending = SnapshotStore(store.location.snapshots).check_ahead(names)
    return ChecksAhead(references, pending)


def verify_snapshots(
    store: EventStore, run_id: str, ahead: ChecksAhead | None = None
) -> tuple[int, list[SnapshotProblem]]:
    """Check each distinct snapshot the run references once; return (checked, problems).
    ``ahead``: references read, and files being checked by worker processes, since the
    verdict began (``check_files_ahead``): a file a worker passed is not checked again."""
    references = ahead.references if ahead is not None else list(_referenced(store, run_id))
    if not references:
        return 0, []
    from auditlog.store.blobs import SnapshotStore  # pyarrow: only when there are snapshots

    catalog = store.blob_rows(sorted({sha for *_, sha in references}))
    files = SnapshotStore(store.location.snapshots)
    passed = ahead.pending.passes() if ahead is not None and ahead.pending is not None else {}
    verdict: dict[str, list[str]] = {}
    problems: list[SnapshotProblem] = []
    names: dict[int, list[str]] | None = None
    for seq, event_id, tensor_id, sha in references:
        if sha in verdict:
            continue  # one report per content, at its first reference
        verdict[sha] = files.check(sha, catalog.get(sha), passed.get(sha))
        if not verdict[sha]:
            continue
        if names is None:  # replayed only when a problem needs the tensor's name
            names = _tensor_names(store, run_id)
        label = ", ".join(names.get(tensor_id, [])) or f"tensor #{tensor_id}"
        for what in verdict[sha]:
            problems.append(
                SnapshotProblem(
                    seq,
                    event_id,
                    label,
                    sha,
                    files.relpath(sha) if is_content_hash(sha) else None,
                    what,
                )
            )
    return len(verdict), problems


def _tensor_names(store: EventStore, run_id: str) -> dict[int, list[str]]:
    """Every tensor's qualified names (a courtesy: a malformed event gives none, and is
    reported by the chain check)."""
    try:
        state = replay(decode_event(r) for r in store.iter_events(run_id, kinds=CONSTRUCTION_KINDS))
        return state.tensor_names()
    except (StoreError, KeyError, TypeError, ValueError, AttributeError):
        return {}
