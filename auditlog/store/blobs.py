"""Content-addressed tensor snapshots in Parquet: the ``snapshots/`` directory of a store.

One file per distinct tensor content, at ``snapshots/<h[:2]>/<h>.parquet`` where
``h`` is ``auditlog.tensor_hash`` (SHA-256 over dtype, shape and C-order bytes; over
4 MiB, over the SHA-256 of each 4 MiB leaf: ``auditlog.core.hashing``):
an identical tensor (a tied weight, a frozen layer, an unchanged buffer) is stored
once however often it is snapshotted, and a file can be checked against its name.
The file format and its torch-free verification are ``auditlog.store.blobformat``;
writing (hash and Parquet encoding overlapped on a small pool) is
``auditlog.store.blobwriter``.

Readers trust nothing but the content hash: a file's location comes from the
hash alone (never from the catalog's ``file`` column), its Parquet schema must
be exactly the one column its dtype calls for (``check_schema``: an extra
column holding other values is refused, since SQL readers select by name), and
``read_verified`` hashes what it decoded, in the same pass, and compares it
with the hash the chain recorded. The ``snapshot_blobs`` catalog is a cache of
facts about each file; ``check`` reports every field in which it disagrees.

**The one entry point for checking a snapshot file** (issue 30) is this class;
every reader goes through it, and an import contract keeps the checking itself
(``auditlog.store.blobcheck``) out of every other reader's reach:

- ``check(sha256, row)``: what is wrong with the file and its catalog row
  (``auditlog verify``, ``verify --archive``; the web UI's verdict is verify's);
  ``check_ahead(sha256s)`` first, for many files: worker processes, where the
  process started them (``auditlog ui``), check the small ones in parallel while
  the verdict does its other checks (``auditlog.store.blobprove``);
- ``verify(sha256)``: the facts of a file that passed, or ``SnapshotError``
  (the read model's trust, ``combine``);
- ``unchanged(sha256, digest)``: a verified file whose identity changed still
  holds the bytes verified (the read model's sessions);
- ``read_verified``, ``read_many``, ``verified_bytes``: the values, their content
  hash checked in the same pass (``restore``, ``diff --values``,
  ``Run.state_dict``).

``check`` and ``verify`` run one check (``blobcheck.verify_file``): name,
regular file, schema, extent, content hash, catalog digest; a small file whose
exact bytes passed it before in this process is answered from what that check
found, after its bytes were read and hashed again (``blobcheck.PROVEN``).

torch is imported only by the methods that build tensors (``put``, ``get``,
``read_verified``): ``describe``, ``check`` and ``verify`` (``auditlog verify``)
need pyarrow and numpy only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from auditlog.core.errors import AuditlogError, IntegrityError
from auditlog.core.hashing import is_tree
from auditlog.store.blobcheck import read_whole, unchanged, verify_file
from auditlog.store.blobformat import (
    CHUNK_BYTES,
    BlobInfo,
    SnapshotError,
    SnapshotFile,
    blob_from_row,
    check_schema,
    expected_schema,
    file_digest,
    legacy_row_groups,
    reason,
    relpath,
)
from auditlog.store.blobpaths import where

if TYPE_CHECKING:
    import torch

    from auditlog.store import blobprove

_T = TypeVar("_T")

__all__ = [
    "CHUNK_BYTES",
    "BlobInfo",
    "SnapshotError",
    "SnapshotStore",
    "blob_from_row",
    "check_schema",
    "dtype_from_name",
    "expected_schema",
    "file_digest",
]


def dtype_from_name(name: str) -> torch.dtype:
    """``'bfloat16'`` -> ``torch.bfloat16``; unknown names are an error."""
    import torch

    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise SnapshotError(f"unknown dtype {name!r} in snapshot")
    return found


class SnapshotStore:
    """The ``snapshots/`` directory of a store."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def relpath(self, sha256: str) -> str:
        return relpath(sha256)

    def path(self, sha256: str) -> Path:
        return self.root / relpath(sha256)

    # ------------------------------------------------------------------ writing
    def put(self, tensor: torch.Tensor, sha256: str | None = None) -> BlobInfo:
        """Store ``tensor`` (if its content is not stored yet) and describe it.

        One tensor at a time, on the calling thread's pool; the recording's
        writer stores a snapshot's tensors together (``BlobWriter.store``).
        """
        from auditlog.store.blobwriter import BlobWriter

        with BlobWriter(self) as writer:
            return writer.put(tensor, sha256)

    # ------------------------------------------------------------------ reading
    def get(self, info: BlobInfo | dict[str, Any]) -> torch.Tensor:
        """Read a stored tensor back, chunk by chunk into its final buffer (not verified:
        ``read_verified`` is what readers use)."""
        blob = info if isinstance(info, BlobInfo) else blob_from_row(info)
        with SnapshotFile(self.root, blob.sha256) as found:
            return self._decode(found)[0]

    def read_verified(self, sha256: str, what: str) -> torch.Tensor:
        """The tensor whose content hash the chain recorded as ``sha256``, or ``IntegrityError``.

        One pass: each decoded piece is copied into the result and hashed there
        (what is returned is what was hashed), while the next row group is read
        ahead. Extra memory: the result plus about two row groups. ``what`` names
        the tensor in the error (``model.0.weight at step 4``), which also names
        the file: a missing, malformed or substituted file is a damaged record
        (exit 4), never a silently different value.
        """
        try:
            with SnapshotFile(self.root, sha256) as found:
                tensor, actual = self._decode(found)
        except SnapshotError as exc:
            raise self._unusable(sha256, what, exc) from exc
        self._compare(sha256, what, actual)
        return tensor

    def read_many(self, wanted: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
        """``read_verified`` of every ``(sha256, what)``, several tensors at a time.

        One read checks its content hash on one core while a reader thread fills
        the tensor; reading two or more tensors side by side keeps every core
        busy (one at a time is slower than ``torch.load``, two at a time about as
        fast: docs/performance.md). Readers: ``side_by_side(2)`` (half
        the usable CPUs, at least 2, at most 4). The results are what the caller keeps anyway, so
        the extra memory is the pieces in flight. The first failing tensor in
        ``wanted`` order is the error raised, as reading them in turn would.
        """
        from concurrent.futures import ThreadPoolExecutor

        from auditlog.core.cpus import side_by_side

        first: dict[str, str] = {}
        for sha, what in wanted:
            first.setdefault(sha, what)
        distinct = list(first.items())
        readers = min(len(distinct), side_by_side(2))
        if readers <= 1:
            return {sha: self.read_verified(sha, what) for sha, what in distinct}
        with ThreadPoolExecutor(readers, thread_name_prefix="auditlog-restore") as pool:
            tensors = list(pool.map(lambda item: self.read_verified(*item), distinct))
        return {sha: tensor for (sha, _), tensor in zip(distinct, tensors, strict=True)}

    def verified_bytes(
        self, sha256: str, what: str, whole_only: bool = False
    ) -> tuple[BlobInfo, Any] | None:
        """Torch-free ``read_verified``: the file's facts and its content's C-order bytes
        (a bytes-like object), checked against ``sha256`` with the same errors.

        A small file is read whole in one call (``blobcheck.read_whole``); a
        bigger one is decoded into a numpy buffer as ``read_verified`` does, or,
        with ``whole_only``, left alone (None).
        """
        content: Any
        try:
            whole = read_whole(self.root, sha256)
            if whole is not None:
                info, content, actual = whole
            elif whole_only:
                return None
            else:
                with SnapshotFile(self.root, sha256) as found:
                    buffer = _allocated(lambda: np.empty(found.nbytes, dtype=np.uint8), found)
                    actual = found.read_hashed(buffer)
                    content = buffer
                    info = found.info()
        except SnapshotError as exc:
            raise self._unusable(sha256, what, exc) from exc
        self._compare(sha256, what, actual)
        return info, content

    def same_content(self, sha_a: str, sha_b: str) -> bool:
        """Whether the files named ``sha_a`` and ``sha_b`` hold one content: possible only
        for a tensor over one leaf named under both content hash versions (a run
        recorded before v2 and a newer one; ``auditlog.core.hashing``). Each is read
        and checked against its own name; a missing or damaged file is not the
        same content (``verify`` says what is wrong with it). Torch-free."""
        if sha_a == sha_b:
            return True
        try:
            info_a, info_b = self.describe(sha_a), self.describe(sha_b)
            if (info_a.dtype, info_a.shape) != (info_b.dtype, info_b.shape) or not is_tree(
                info_a.nbytes
            ):
                return False
            value_a = self.verified_bytes(sha_a, "a tensor")
            value_b = self.verified_bytes(sha_b, "a tensor")
        except AuditlogError:
            return False
        if value_a is None or value_b is None:
            return False
        return bool(memoryview(value_a[1]).cast("B") == memoryview(value_b[1]).cast("B"))

    @staticmethod
    def _unusable(sha256: str, what: str, exc: SnapshotError) -> IntegrityError:
        return IntegrityError(f"snapshot of {what} ({where(sha256)}) cannot be used: {reason(exc)}")

    @staticmethod
    def _compare(sha256: str, what: str, actual: str) -> None:
        if actual != sha256:
            raise IntegrityError(
                f"snapshot of {what} ({where(sha256)}) does not hold the recorded content: it hashes to "
                f"{actual[:16]}..., the record says {sha256[:16]}... (file replaced or modified)"
            )

    def _decode(self, found: SnapshotFile) -> tuple[torch.Tensor, str]:
        """The file's tensor, built in its final buffer, and the content hash of the
        bytes written there, taken as they arrive (``SnapshotFile.read_hashed``)."""
        import torch

        out = _allocated(
            lambda: torch.empty(found.numel, dtype=dtype_from_name(found.dtype)), found
        )
        actual = found.read_hashed(out.view(torch.uint8).numpy())
        return out.reshape(found.shape), actual

    def describe(self, sha256: str) -> BlobInfo:
        """What the file named by ``sha256`` holds, from the file alone (no catalog).

        Raises ``SnapshotError`` when it is missing, unreadable or not exactly a
        snapshot's schema. Its facts are not evidence until ``read_verified``
        found the decoded content hashing to ``sha256``.
        """
        with SnapshotFile(self.root, sha256) as found:
            return found.info()

    def verify(self, sha256: str) -> BlobInfo:
        """The facts of the file named by ``sha256``, with its catalog digest, once it
        passed the check (``blobcheck.verify_file``: a regular file with exactly a
        snapshot's schema whose decoded content hashes to ``sha256``); ``SnapshotError``
        saying why not. Torch-free."""
        return verify_file(self.root, sha256)

    def unchanged(self, sha256: str, digest: str) -> bool:
        """Whether the file named by ``sha256`` still holds the bytes verified with catalog
        digest ``digest`` (``blobcheck.unchanged``); False for a missing or unreadable one."""
        return unchanged(self.root, sha256, digest)

    def check_ahead(self, sha256s: list[str]) -> blobprove.Pending | None:
        """Hand the small files among ``sha256s`` to this process's worker processes and
        return at once (None without workers): a verdict does its other checks meanwhile,
        then passes each file's ``Pending.passes()`` entry to ``check`` as ``checked``."""
        from auditlog.store import blobprove

        return blobprove.submit(self.root, sha256s)

    def check(
        self, sha256: str, row: dict[str, Any] | None, checked: BlobInfo | None = None
    ) -> list[str]:
        """What is wrong with the stored content ``sha256`` and its catalog row (empty: nothing).

        The file must pass ``verify``; the catalog row (a cache) must exist and
        agree with the file in every field, ``file_sha256`` (the digest of every
        byte) included. ``checked``: the file's facts from the full check a worker
        process ran for this same verdict (``check_ahead``), in place of ``verify``.
        """
        try:
            found = checked if checked is not None else self.verify(sha256)
        except SnapshotError as exc:
            return [reason(exc)]
        if row is None:
            return ["not in the snapshot catalog (catalog row deleted)"]
        if _same_row(row, found):
            return []
        try:
            listed = blob_from_row(row)
        except (KeyError, TypeError, ValueError) as exc:
            return [f"catalog row is garbled ({exc})"]
        problems = []
        for field in _ROW_FIELDS:
            mine, theirs = getattr(listed, field), getattr(found, field)
            if field == "row_groups" and mine != theirs and _legacy_groups(listed, theirs):
                continue
            if field == "file_sha256" and mine != theirs:
                problems.append(
                    f"the file's bytes hash to {theirs[:16]}..., the catalog recorded "
                    f"{mine[:16] + '...' if mine else 'no digest'} when it was written (file modified "
                    "outside its values, or catalog edited)"
                )
            elif mine != theirs:
                problems.append(
                    f"catalog row disagrees with the file: {field} is {mine!r} in the "
                    f"catalog, {theirs!r} by the file (catalog edited)"
                )
        return problems


_ROW_FIELDS = ("file", "dtype", "shape", "numel", "nbytes", "layout", "row_groups", "file_sha256")


def _same_row(row: dict[str, Any], found: BlobInfo) -> bool:
    """The catalog row holds what the writer writes for ``found`` (``as_row``), value for
    value: then ``blob_from_row`` of it gives ``found``'s every field (it takes text as it
    is, ``int()`` of numbers, ``json.loads`` of the shape's text), so nothing is parsed.
    Any other row is compared field by field."""
    return (
        row.get("file"),
        row.get("dtype"),
        row.get("shape"),
        row.get("numel"),
        row.get("nbytes"),
        row.get("layout"),
        row.get("row_groups"),
        row.get("file_sha256"),
    ) == (
        found.file,
        found.dtype,
        json.dumps(found.shape),
        found.numel,
        found.nbytes,
        found.layout,
        found.row_groups,
        found.file_sha256,
    )


def _allocated(make: Callable[[], _T], found: SnapshotFile) -> _T:
    """``make()``, the buffer for a file's content, with an allocation that fails (a
    shape bigger than memory, bounded by ``blobshape.check_extent``) as a ``SnapshotError``."""
    try:
        return make()
    except (MemoryError, RuntimeError, ValueError, OverflowError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SnapshotError(
            f"snapshot file {found.relpath!r} is unreadable: its {found.nbytes} bytes cannot be allocated ({text})"
        ) from None


def _legacy_groups(listed: BlobInfo, in_file: int) -> bool:
    """A catalog row of the writer before issue 18: it counted chunks, while pyarrow
    split chunks of more than 1Mi rows into several row groups in the file."""
    from auditlog.store.blobformat import legacy_chunks

    return listed.row_groups == legacy_chunks(
        listed.dtype, listed.numel
    ) and in_file == legacy_row_groups(listed.dtype, listed.numel)
