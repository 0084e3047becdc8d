"""Why the read model may answer: a seal over what it was built from, and verified snapshot files.

The read model is a cache, not evidence (``auditlog verify`` is the evidence).
Still, a cache anyone with file access can edit must not quietly answer for
the record. Two things keep it honest:

**The seal.** After every refresh the read model writes ``<projection>.seal``:
the store id, the chain head ``(run, stream, seq, hash)`` of every stream it
copied, and the projection file's identity (size, mtime, ctime, inode), under
an HMAC-SHA256 with a secret kept outside the store
(``$XDG_CACHE_HOME/auditlog/readmodel.secret``, mode 0600, made on first use).
Before answering, the seal must verify, the file must still be the one sealed
(an edit changes its ctime, which no user-level tool can set back), no
``.wal`` may lie beside it, and every sealed head must still be on the store's
chain. Otherwise the projection is rebuilt from the store. Every row sealed
was checked against the chain when it was copied (``links``: its recomputed
link hash is its stored hash, from the stream's genesis up to the sealed head),
so the rows are exactly the events the sealed heads chain over: an edit that
is put back after a cache was built cannot leave the cache answering it.
Someone who can
edit the store but not the user's home cannot forge a seal; a second user
querying the same store has another secret, so each user's first query after
the other's rebuilds (give each user ``AUDITLOG_READMODEL``).

**Verified snapshot files.** ``tensor_values`` reads Parquet files directly.
The projection's catalog is not a copy of the store's ``snapshot_blobs`` table
(a cache anyone can edit): each content hash the chained snapshot events name
is read from the location its hash alone gives, its schema checked, its
content hash recomputed from the decoded bytes without torch
(``SnapshotStore.verify``, the check ``auditlog verify`` makes), and only
then are its facts and the file's identity and digest recorded. A file that fails is
recorded in ``rejected_blobs`` with the reason, never read by a query; a file
changed after verification is left out of ``tensor_values`` by the session
(``changed_files``) and named in a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from auditlog.core.errors import AuditlogError
from auditlog.core.payloadlimits import loads_bounded
from auditlog.store.eventstore import EventStore

# v2: every row sealed was checked against the chain when copied (``links``); a v1
# seal (rows copied by id only, issue 29) is not trusted, so such a cache is rebuilt.
SEAL_FORMAT = "auditlog-readmodel-seal-v2"
SECRET_FILE = "readmodel.secret"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "auditlog"


def secret() -> bytes | None:
    """This user's seal secret, made on first use; None when it cannot be kept (then nothing is trusted)."""
    path = _cache_root() / SECRET_FILE
    with contextlib.suppress(OSError):
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            return data if len(data) >= 32 else None
        return None
    except OSError:
        return None
    with os.fdopen(fd, "wb") as handle:
        made = os.urandom(32)
        handle.write(made)
    return made


def file_identity(path: Path, follow: bool = True) -> list[int] | None:
    """``[size, mtime_ns, ctime_ns, inode]``: changes whenever the file's bytes do.
    ``follow=False`` (snapshot files): of the path itself, so that a link put in a
    verified file's place is a change even when it points at that file."""
    try:
        st = path.stat() if follow else path.lstat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _mac(key: bytes, fields: dict[str, Any]) -> str:
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def seal_path(projection: Path) -> Path:
    return projection.with_name(projection.name + ".seal")


def write_seal(projection: Path, store_id: str, heads: list[list[Any]]) -> None:
    """Seal the projection as it is now on disk (after its connection closed)."""
    key = secret()
    target = seal_path(projection)
    identity = file_identity(projection)
    if key is None or identity is None:
        target.unlink(missing_ok=True)
        return
    fields = {"format": SEAL_FORMAT, "store_id": store_id, "heads": heads, "file": identity}
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**fields, "mac": _mac(key, fields)}))
    os.replace(tmp, target)


def seal_problem(projection: Path, store: EventStore, store_id: str) -> str | None:
    """Why the projection may not answer as it is (None: its seal holds)."""
    key = secret()
    if key is None:
        return "no place to keep the read model's seal secret (the cache directory is not writable)"
    try:
        data = loads_bounded(seal_path(projection).read_text())
    except (OSError, ValueError):
        return "the read model has no valid seal"
    if not isinstance(data, dict):
        return "the read model has no valid seal"
    fields = {k: v for k, v in data.items() if k != "mac"}
    if not isinstance(data.get("mac"), str) or not hmac.compare_digest(
        data["mac"], _mac(key, fields)
    ):
        return "the read model's seal does not verify (edited, or sealed by another user)"
    if fields.get("format") != SEAL_FORMAT:
        return "the read model was sealed by another auditlog version (its rows are checked against the chain again)"
    if fields.get("store_id") != store_id:
        return "the read model was sealed for another store"
    if fields.get("file") != file_identity(projection):
        return "the read model file changed since it was sealed (edited outside auditlog)"
    if projection.with_name(projection.name + ".wal").exists():
        return "the read model has a write-ahead log nobody sealed"
    heads = fields.get("heads")
    if not isinstance(heads, list):
        return "the read model has no valid seal"
    found = store.stream_head_hashes(
        [(h[0], h[1], h[2]) for h in heads if isinstance(h, list) and len(h) == 4]
    )
    for run_id, stream, seq, head_hash in heads:
        if found.get((run_id, stream, seq)) != head_hash:
            return (
                f"the store no longer holds the chain head the read model was built from "
                f"(run {str(run_id)[:12]} stream {stream} seq {seq}: rewritten or cut off)"
            )
    return None


# --------------------------------------------------------------------------- snapshot files
@dataclass(frozen=True)
class CheckedBlob:
    """One content hash after verification: its facts (when it passed) or why it failed."""

    sha256: str
    row: dict[str, Any] | None
    problem: str | None


def check_blobs(snapshots: Path, hashes: list[str]) -> list[CheckedBlob]:
    """Verify the files of ``hashes`` (location from the hash, exact schema, content hash).

    Torch-free: the content hash is recomputed from the bytes pyarrow decodes
    (``SnapshotStore.verify``, the one check of a snapshot file).
    """
    if not hashes:
        return []
    from auditlog.core.hashing import is_content_hash
    from auditlog.store.blobformat import SnapshotError, reason
    from auditlog.store.blobpaths import where
    from auditlog.store.blobs import SnapshotStore  # pyarrow: only with snapshots

    files = SnapshotStore(snapshots)
    out: list[CheckedBlob] = []
    for sha in hashes:
        try:
            info = files.verify(sha)
        except (SnapshotError, AuditlogError) as exc:
            why = reason(exc) if isinstance(exc, SnapshotError) else str(exc)
            place = f"snapshot file {where(sha)}" if is_content_hash(sha) else where(sha)
            out.append(CheckedBlob(sha, None, f"{place} cannot be used: {why}"))
            continue
        identity = file_identity(snapshots / info.file, follow=False) or [0, 0, 0, 0]
        out.append(
            CheckedBlob(
                sha,
                {
                    "sha256": sha,
                    "file": info.file,
                    "dtype": info.dtype,
                    "shape": info.shape,
                    "numel": info.numel,
                    "nbytes": info.nbytes,
                    "layout": info.layout,
                    "row_groups": info.row_groups,
                    "file_sha256": info.file_sha256,
                    "created_ns": time.time_ns(),
                    "identity": identity,
                },
                None,
            )
        )
    return out


def _unchanged(snapshots: Path, sha: str, digest: str) -> bool:
    """``SnapshotStore.unchanged``, imported only for a file whose identity changed (it loads pyarrow)."""
    from auditlog.store.blobs import SnapshotStore

    return SnapshotStore(snapshots).unchanged(sha, digest)


def changed_files(snapshots: Path, rows: list[tuple[str, str, list[int]]]) -> dict[str, str]:
    """``sha256 -> why`` for verified files that are no longer the bytes verified.

    ``rows``: ``(sha256, file digest at verification, identity at verification)``.
    An unchanged identity is trusted; a changed one is checked again
    (``SnapshotStore.unchanged``: its digest, and its content hash where the digest
    leaves the values to it).
    """
    if not rows:
        return {}
    from auditlog.core.hashing import is_content_hash
    from auditlog.store.blobpaths import relpath, where

    changed: dict[str, str] = {}
    base = os.fspath(
        snapshots
    )  # strings, not Path objects: a session checks every file it may read
    for sha, digest, identity in rows:
        if not is_content_hash(sha):  # a projection edited to name another path: never read
            changed[sha] = f"{where(sha)} is not a content hash"
            continue
        try:
            st = os.lstat(os.path.join(base, relpath(sha)))
            now: list[int] | None = [
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                st.st_ino,
            ]  # file_identity
        except OSError:
            now = None
        if now is None:
            changed[sha] = f"snapshots/{relpath(sha)} is missing"
        elif now != list(identity) and not _unchanged(snapshots, sha, digest):
            changed[sha] = f"snapshots/{relpath(sha)} changed since it was verified"
    return changed
