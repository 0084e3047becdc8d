"""``auditlog verify --archive DIR``: check an archive written by ``auditlog export``.

Needs no store: the files alone. In order, each failure named by file, stream
and seq:

1. ``manifest.json`` parses, is of a known format and matches its own digest;
   with a trusted key, ``manifest.sig`` is its valid signature.
2. Every file the manifest lists has exactly its SHA-256 and size, and no
   unlisted file lies under ``events/``, ``snapshots/`` or ``tensors/`` (an
   added stream is a forgery too).
3. Every stream's event file has exactly the archive format's columns, and its
   events are gap-free from seq 1 and chained (the algorithm of
   ``auditlog.core.chain``, in the stream's chain format: the manifest's
   ``chain`` of the stream, or of the run in an ``auditlog-archive-v1``, whose
   streams are all v1 and whose files have the ``snapshot`` column), and end at
   the head the manifest lists.
4. ``heads.json`` (when present) is signed by a trusted key and names exactly
   those heads; each checkpoint in ``checkpoints.parquet`` is signed by a
   trusted key for the manifest's store id and lies on its stream's chain (a
   tree head: its root is the archived stream's). An ``auditlog-archive-v1``
   holds a v2 checkpoint without its tree root, end and world size: they are
   taken from the archived stream, and the signature must cover them.
5. Every tensor content a chained event names is in the catalog, and its file
   holds the content its hash names (``SnapshotStore.check``).

An archive is as craftable as a store: every path the manifest lists must lie
inside the archive (relative, no ``..``), and every file read must be a regular
file (``_unusable``: a FIFO would stop the reader, a link would lead outside);
anything else is a finding, and nothing more is read.

Without a trusted key the signatures cannot be checked and ``ok`` is False, like
``verify`` on a store with checkpoints by an unknown key.
"""

from __future__ import annotations

import dataclasses
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from auditlog.archive.write import ARCHIVE_FORMAT, ARCHIVE_FORMAT_V1, manifest_digest
from auditlog.core import eventrow
from auditlog.core.chain import CHAIN_V1, canonical_row, chain_format, link_hash, row_prefix
from auditlog.core.hashing import shown_hash
from auditlog.core.payloadlimits import loads_bounded
from auditlog.integrity.chaincheck import short
from auditlog.integrity.keys import KeyRing, Verdict
from auditlog.integrity.merkle import leaf_hash, root
from auditlog.integrity.statements import (
    CHECKPOINT_FORMAT,
    Checkpoint,
    HeadStatement,
    StatementError,
)
from auditlog.store.blobformat import SnapshotError
from auditlog.store.blobpaths import kind_of, regular_digest, where
from auditlog.store.blobs import SnapshotStore
from auditlog.store.rows import payload_object

_CHECKED_DIRS = ("events", "snapshots", "tensors")


def _schema(columns: tuple[str, ...]) -> pa.Schema:
    return pa.schema([(name, pa.type_for_alias(eventrow.arrow_type(name))) for name in columns])


# The event files' columns: the row of ``core.eventrow``; before (archive v1) with ``snapshot``.
_EVENTS_SCHEMA = {
    ARCHIVE_FORMAT: _schema(eventrow.ARCHIVE_COLUMNS),
    ARCHIVE_FORMAT_V1: _schema(eventrow.archive_columns(CHAIN_V1.number)),
}


@dataclass
class _Stream:
    """What the archived events of one stream say: its leaves, hashes, end and world size."""

    leaves: list[bytes] = field(default_factory=list)
    hashes: dict[int, str] = field(default_factory=dict)
    ended_at: int | None = None
    world_size: int | None = None


@dataclass
class ArchiveReport:
    """The outcome of verifying one archive."""

    directory: str
    run_id: str | None = None
    events: int = 0
    streams: dict[int, int] = field(default_factory=dict)
    files: int = 0
    tensors: int = 0
    signatures: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.events > 0


def verify_archive(directory: Path, keys: KeyRing) -> ArchiveReport:
    """Verify the archive in ``directory`` (see the module docstring)."""
    report = ArchiveReport(str(directory))
    manifest = _manifest(directory, keys, report)
    if manifest is None:
        return report
    report.run_id = str(manifest.get("run_id"))
    if not _files(directory, manifest, report):
        return report  # changed files: their contents cannot be trusted to say more
    named: set[str] = set()
    streams: dict[int, _Stream] = {}
    heads = _chains(directory, manifest, report, named, streams)
    _signed_heads(directory, manifest, heads, keys, report)
    _checkpoints(directory, manifest, streams, keys, report)
    _tensors(directory, named, report)
    return report


def _unusable(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file of the archive (None: a regular file; a
    link is not followed, a FIFO not opened)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    return None if stat.S_ISREG(mode) else f"not a regular file ({kind_of(mode)})"


def _inside(relative: str) -> bool:
    """Whether a manifest's path names a file inside the archive."""
    parts = PurePosixPath(relative).parts
    return (
        bool(parts)
        and not relative.startswith("/")
        and ".." not in parts
        and "\0" not in relative
        and "\\" not in relative
    )


def _manifest(directory: Path, keys: KeyRing, report: ArchiveReport) -> dict[str, Any] | None:
    path = directory / "manifest.json"
    why = _unusable(path)
    if why is not None and why != "missing":
        report.problems.append(f"manifest.json: {why}")
        return None
    try:
        raw = path.read_bytes()
        manifest = loads_bounded(raw)
    except FileNotFoundError:
        report.problems.append(f"{str(directory)!r} is not an auditlog archive (no manifest.json)")
        return None
    except (OSError, ValueError) as exc:
        report.problems.append(f"manifest.json is unreadable or not JSON ({exc})")
        return None
    if not isinstance(manifest, dict) or manifest.get("format") not in _EVENTS_SCHEMA:
        report.problems.append(
            f"manifest.json is not an {ARCHIVE_FORMAT} (or {ARCHIVE_FORMAT_V1}) manifest"
        )
        return None
    if manifest.get("digest") != manifest_digest(manifest):
        report.problems.append(
            "manifest.json does not match its own digest (the manifest was modified)"
        )
        return None
    signature = directory / "manifest.sig"
    if _unusable(signature) not in (None, "missing"):
        report.problems.append(f"manifest.sig: {_unusable(signature)}")
    elif signature.exists():
        try:
            sig = loads_bounded(signature.read_text())
            verdict = keys.check(str(sig["key_fingerprint"]), raw, str(sig["signature"]))
        except (OSError, ValueError, KeyError, TypeError):
            verdict = Verdict.INVALID
        report.signatures += 1
        if verdict is Verdict.INVALID:
            report.problems.append(
                "manifest.sig: the signature of manifest.json does not verify (modified)"
            )
        elif verdict is Verdict.UNKNOWN_KEY:
            report.problems.append(
                "manifest.sig: signed by a key that is not trusted (pass its public key with --key)"
            )
    return manifest


def _files(directory: Path, manifest: dict[str, Any], report: ArchiveReport) -> bool:
    listed = {str(f.get("path")): f for f in manifest.get("files") or [] if isinstance(f, dict)}
    intact = True
    for relative, entry in sorted(listed.items()):
        if not _inside(relative):
            report.problems.append(f"{relative!r}: not a path inside the archive (manifest edited)")
            intact = False
            continue
        path = directory / relative
        why = _unusable(path)
        if why is not None:
            report.problems.append(f"{relative}: {why}")
            intact = False
        else:
            try:
                same = path.stat().st_size == entry.get("bytes") and regular_digest(
                    path, relative
                ) == entry.get("sha256")
            except (SnapshotError, OSError):
                same = False
            if not same:
                report.problems.append(
                    f"{relative}: its bytes differ from the manifest's SHA-256 (file modified)"
                )
                intact = False
        report.files += 1
    for top in _CHECKED_DIRS:
        for path in sorted((directory / top).rglob("*")) if (directory / top).is_dir() else []:
            relative = path.relative_to(directory).as_posix()
            if (path.is_symlink() or not path.is_dir()) and relative not in listed:
                report.problems.append(f"{relative}: not listed in the manifest (file added)")
                intact = False
    return intact


def _chains(
    directory: Path,
    manifest: dict[str, Any],
    report: ArchiveReport,
    named: set[str],
    streams: dict[int, _Stream],
) -> dict[int, tuple[int, str]]:
    """Check every stream's chain; returns the heads found, ``stream -> (seq, hash)``, fills
    ``streams`` with what each says, and adds the tensor contents the (chained) events
    name to ``named``."""
    run_id = str(manifest["run_id"])
    heads: dict[int, tuple[int, str]] = {}
    if not _inside(f"run_id={run_id}") or "/" in run_id:
        report.problems.append(
            f"manifest.json: run id {run_id[:40]!r} is not a run id (manifest edited)"
        )
        return heads
    old = manifest["format"] == ARCHIVE_FORMAT_V1  # one chain (v1) for the whole run
    for entry in manifest.get("streams") or []:
        stream = int(entry["stream"])
        relative = f"events/run_id={run_id}/stream={stream}/part-0.parquet"
        path = directory / relative
        version = manifest.get("chain") if old else entry.get("chain")
        chain = chain_format(version)
        why = _unusable(path)
        if chain is None or (old and chain != CHAIN_V1):
            why = (
                f"chain format {short(version)} is not one the archive format has (manifest edited)"
            )
        if why is None:
            try:
                table = pq.read_table(path)
            except (OSError, pa.ArrowException) as exc:
                why = f"unreadable ({exc})"
        if why is None and not table.schema.remove_metadata().equals(
            _EVENTS_SCHEMA[manifest["format"]]
        ):
            why = (
                f"its columns ({', '.join(table.schema.names)}) are not the archive format's "
                "(file crafted)"
            )
        if why is not None:
            report.problems.append(f"stream {stream}: {relative}: {why}")
            continue
        assert chain is not None
        prev = chain.genesis(run_id, stream)
        prefix = row_prefix(run_id, stream)
        expected = 1
        facts = streams[stream] = _Stream()
        for row in table.to_pylist():
            row.update(run_id=run_id, stream=stream)
            where = f"stream {stream} seq {row['seq']}"
            if row["seq"] != expected:
                report.problems.append(
                    f"{where}: expected seq {expected} (events missing or reordered)"
                )
                expected = row["seq"]
            try:
                encoded = canonical_row(row, prefix, chain)
            except (TypeError, ValueError) as exc:
                report.problems.append(f"{where}: garbled ({exc})")
                encoded = b""
            if link_hash(prev, encoded) != row["hash"]:
                report.problems.append(
                    f"{where} ({row['kind']}): content does not match its recorded hash"
                )
            facts.leaves.append(leaf_hash(encoded))
            prev, expected = row["hash"], expected + 1
            facts.hashes[expected - 1] = prev
            _boundary(row, facts)
            if row["kind"] in ("snapshot_taken", "construction_sealed"):
                named |= _named_tensors(row["payload"])
        count = table.num_rows
        report.streams[stream] = count
        report.events += count
        heads[stream] = (expected - 1, prev)
        if (entry.get("last_seq"), entry.get("head_hash")) != heads[stream]:
            report.problems.append(
                f"stream {stream}: ends at seq {expected - 1}, not at the manifest's head"
            )
    return heads


def _boundary(row: dict[str, Any], facts: _Stream) -> None:
    """A stream's end and world size, from its run_ended and run_started (what a v2
    checkpoint signs: ``_checkpoints`` rebuilds the ones an archive v1 lacks)."""
    if row["kind"] == "run_ended" and facts.ended_at is None:
        facts.ended_at = row["seq"]
    elif row["kind"] == "run_started" and row["seq"] == 1:
        world = payload_object(row["payload"], strict=False).get("world_size")
        if isinstance(world, int) and not isinstance(world, bool):
            facts.world_size = world


def _signed_heads(
    directory: Path,
    manifest: dict[str, Any],
    heads: dict[int, tuple[int, str]],
    keys: KeyRing,
    report: ArchiveReport,
) -> None:
    path = directory / "heads.json"
    if _unusable(path) == "missing":
        return
    if _unusable(path) is not None:
        report.problems.append(f"heads.json: {_unusable(path)}")
        return
    try:
        statement = HeadStatement.parse(path.read_text(), "heads.json")
    except (OSError, StatementError) as exc:
        report.problems.append(f"heads.json: {exc}")
        return
    report.signatures += 1
    verdict = keys.check(statement.key_fingerprint, statement.message(), statement.signature)
    if verdict is Verdict.INVALID:
        report.problems.append(
            "heads.json: the signature does not verify (the statement was modified)"
        )
    elif verdict is Verdict.UNKNOWN_KEY:
        report.problems.append(
            "heads.json: signed by a key that is not trusted (pass its public key with --key)"
        )
    if statement.run_id != manifest["run_id"] or statement.store_id != manifest.get("store_id"):
        report.problems.append("heads.json is about another run or store than the manifest")
    signed = {h.stream: (h.seq, h.head_hash) for h in statement.heads}
    if signed != heads:
        report.problems.append(
            "heads.json: the signed heads are not the archive's streams and heads"
        )


def _checkpoints(
    directory: Path,
    manifest: dict[str, Any],
    streams: dict[int, _Stream],
    keys: KeyRing,
    report: ArchiveReport,
) -> None:
    path = directory / "checkpoints.parquet"
    if _unusable(path) == "missing":
        return
    if _unusable(path) is not None:
        report.problems.append(f"checkpoints.parquet: {_unusable(path)}")
        return
    run_id, store_id = str(manifest["run_id"]), str(manifest.get("store_id", ""))
    for row in pq.read_table(path).to_pylist():
        try:
            checkpoint = Checkpoint.from_row(row)
        except (ValueError, KeyError) as exc:
            report.problems.append(f"checkpoints.parquet: a row is garbled ({exc})")
            continue
        report.signatures += 1
        facts = streams.get(checkpoint.stream, _Stream())
        verdict = keys.check(
            checkpoint.key_fingerprint, checkpoint.statement(store_id), checkpoint.signature
        )
        if verdict is Verdict.INVALID and "format" not in row:
            # an auditlog-archive-v1 file: a v2 checkpoint without the fields it signs
            rebuilt = _tree_head(checkpoint, facts)
            if rebuilt is not None:
                again = keys.check(
                    rebuilt.key_fingerprint, rebuilt.statement(store_id), rebuilt.signature
                )
                if again is not Verdict.INVALID:
                    checkpoint, verdict = rebuilt, again
        where = f"checkpoint of stream {checkpoint.stream} seq {checkpoint.seq}"
        if checkpoint.run_id != run_id or verdict is Verdict.INVALID:
            report.problems.append(f"{where}: the signature does not verify")
            continue
        if verdict is Verdict.UNKNOWN_KEY:
            report.problems.append(
                f"{where}: signed by a key that is not trusted (pass its public key with --key)"
            )
        if facts.hashes.get(checkpoint.seq) != checkpoint.head_hash:
            report.problems.append(f"{where}: the signed head is not on the archived chain")
        elif checkpoint.is_tree_head and _tree_head(checkpoint, facts) != checkpoint:
            report.problems.append(
                f"{where}: the signed tree head, end or world size is not the archived stream's"
            )


def _tree_head(checkpoint: Checkpoint, facts: _Stream) -> Checkpoint | None:
    """``checkpoint`` as a v2 checkpoint of the archived stream at its seq: the tree root,
    end and world size the archived events give (None: the stream is shorter)."""
    if not 1 <= checkpoint.seq <= len(facts.leaves) or facts.world_size is None:
        return None
    return dataclasses.replace(
        checkpoint,
        format=CHECKPOINT_FORMAT,
        tree_root=root(facts.leaves, checkpoint.seq).hex(),
        ended=facts.ended_at == checkpoint.seq,
        world_size=facts.world_size,
    )


def _named_tensors(text: str) -> set[str]:
    """Content hashes a snapshot or seal event names (as ``integrity.snapshots`` reads them)."""
    payload = payload_object(text, strict=False)  # damaged or past the limits: verify's to name
    if "snapshot" in payload:
        items = (payload.get("snapshot") or {}).get("tensors")
    else:
        items = payload.get("tensors") if payload.get("stored") else None
    return {
        i["sha256"] for i in items or [] if isinstance(i, dict) and isinstance(i.get("sha256"), str)
    }


def _tensors(directory: Path, named: set[str], report: ArchiveReport) -> None:
    catalog_path = directory / "catalog.parquet"
    if _unusable(catalog_path) not in (None, "missing"):
        report.problems.append(f"catalog.parquet: {_unusable(catalog_path)}")
        return
    catalog = (
        {r["sha256"]: r for r in pq.read_table(catalog_path).to_pylist()}
        if catalog_path.exists()
        else {}
    )
    files = SnapshotStore(directory / "tensors")
    for sha in sorted(named):
        row = catalog.get(sha)
        what = "not in catalog.parquet" if row is None else "; ".join(files.check(sha, row)) or None
        report.tensors += 1
        if what is not None:
            report.problems.append(f"tensor {shown_hash(sha)} ({where(sha, 'tensors')}): {what}")
