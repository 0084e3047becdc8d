"""The chain and tree check of one stream, in a tight loop over plain row tuples.

``verify`` spends its time here on a long run: a million events are a million
canonical rows, link hashes and leaf hashes. ``StreamCheck.feed`` takes rows
as the database driver returns them (tuples in ``TUPLE_COLUMNS`` order, no
row objects, no dicts) and checks an ordinary event, the overwhelming
majority, inline: exact column types, the next sequence number, a newer id,
neither the stream's first event nor a run_started or run_ended, and a link
hash that matches. Anything else is handed, as a dict, to ``StreamCheck.one``:
the general rules, event by event, with their problem reports (they are
``verify``'s own, unchanged). Both paths encode exactly what
``auditlog.core.chain.canonical_row`` encodes (tests check they agree), and
leaf hashes are added to the Merkle frontier a batch at a time.

Each stream is checked in one chain format (``core.chain``): the one its first
event links under from that format's genesis hash (``first_event_format``), or the
one given (the parallel check's child, whose parent found it). An event of the
stream hashed in another format is a mismatch like any edit (``verify`` says which
format it was hashed in). Only when the first event matches no format (edited or
deleted: the stream fails already) is the format taken from the first later event
that links under one, for the reports that follow.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from auditlog.core import eventrow
from auditlog.core.chain import (
    CHAIN_V1,
    CURRENT,
    FORMATS,
    ChainFormat,
    canonical_row,
    chain_hash,
    first_event_format,
    link_hash,
    row_prefix,
)
from auditlog.core.payloadlimits import MAX_PAYLOAD_BYTES, past_limits
from auditlog.integrity.findings import Problem, StreamTip, VerifyReport
from auditlog.integrity.merkle import Frontier, PackedLeaves, leaf_hash
from auditlog.store.eventstore import EventStore
from auditlog.store.queries import TUPLE_COLUMNS
from auditlog.store.rows import payload_object

# Column -> allowed Python types of a stored event. Anyone with file access can
# store any SQLite value in any column; such a row is reported, never crashed on.
EVENT_TYPES: dict[str, tuple[type, ...]] = {
    name: (
        eventrow.BY_NAME[name].python,
        *((type(None),) if eventrow.BY_NAME[name].nullable else ()),
    )
    for name in eventrow.STORED_COLUMNS
}

_BOUNDARY_KINDS = frozenset({"run_started", "run_ended"})
_NULL = (None,)  # a chain-v1 row's ``snapshot``
# Kinds whose payloads verify parses (the boundaries here, snapshot references in
# ``integrity.snapshots``): each goes through ``one``, which checks the payload limits.
_READ_KINDS = _BOUNDARY_KINDS | {"snapshot_taken", "construction_sealed"}
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


def garbled_column(row: dict[str, Any]) -> str | None:
    """The first column of ``row`` holding a value the writer can never have stored."""
    for column, types in EVENT_TYPES.items():
        value = row.get(column)
        if type(value) not in types:  # exact types: a bool is not an int here
            return f"column {column} holds {type(value).__name__} {short(value)}"
    return None


def _plain_text(value: Any) -> bool:
    """A str of ASCII without DEL: for these orjson writes exactly ``json.dumps``'s
    ``ensure_ascii`` escapes (``auditlog.core.chain._escaped``)."""
    return type(value) is str and value.isascii() and "\x7f" not in value


def links_to(row: dict[str, Any], prev_hash: Any, chain: ChainFormat | None) -> bool:
    """Is ``row`` (an event as stored) the link its stored hash says, chained from
    ``prev_hash``, the stored hash of the event before it (seq 1: the genesis hash),
    in its stream's format ``chain`` (``stream_format``)?

    One event's share of ``verify``: an event whose content was edited (its hash
    column untouched) fails it, and so does the event after one that was deleted.
    What it cannot see (a rewrite with fresh hashes, events cut off) is ``verify``'s.
    ``chain`` None: the stream's first event matches no format (it fails here, and
    ``verify`` fails the stream); its other events are then tried in each format.
    """
    if garbled_column(row) is not None:
        return False
    if row["seq"] == 1:
        found = first_event_format(row)
        return found is not None and chain in (None, found)
    return isinstance(prev_hash, str) and any(
        chain_hash(prev_hash, row, chain=f) == row["hash"]
        for f in (FORMATS if chain is None else (chain,))
    )


def stream_format(store: EventStore, run_id: str, stream: int) -> ChainFormat | None:
    """The chain format of a stored stream: the one its first event (seq 1, the lowest
    id) links under from that format's genesis hash; None when none does (the event
    was edited or deleted, or the stream is empty)."""
    row = store.first_event(run_id, stream)
    return None if row is None else first_event_format(row)


class RowLinks:
    """``links_to`` for the rows of one run, each in its stream's format (found once)."""

    def __init__(self, store: EventStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.formats: dict[Any, ChainFormat | None] = {}

    def check(self, row: dict[str, Any], prev_hash: Any) -> bool:
        stream = row["stream"]
        if stream not in self.formats:
            self.formats[stream] = (
                stream_format(self.store, self.run_id, stream) if type(stream) is int else None
            )
        return links_to(row, prev_hash, self.formats[stream])


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class StreamCheck:
    """What has been read of one stream so far, and the problems found in it."""

    def __init__(
        self,
        run_id: str,
        stream: int,
        report: VerifyReport,
        sizes: frozenset[int] = frozenset(),
        leaves: PackedLeaves | list[bytes] | None = None,
        chain: ChainFormat | None = None,
    ) -> None:
        self.run_id, self.stream, self.report = run_id, stream, report
        self.sizes, self.leaves = sizes, leaves
        self.expected = 1
        # The stream's chain format: given, or fixed by its first event (``one``).
        self.chain = chain
        self._recomputed_by: dict[ChainFormat, str] = {}  # a first event matching no format
        # prev: the stored hash of the previous event; recomputed: what that hash should
        # be given its own content. An event chained to either is intact, so editing
        # one event's hash column is reported once, not also at the next event.
        self.prev = self.recomputed = (chain or CURRENT).genesis(run_id, stream)
        self.last_id = -1
        self.count = 0
        self.mismatched: list[dict[str, Any]] = []
        self.after_end: list[dict[str, Any]] = []
        self.tip = StreamTip(stream)
        self.tree = Frontier()
        self.grow_tree = True  # False: leaves are only collected (``integrity.parallel``'s child)
        self._prefix = row_prefix(run_id, stream).encode("ascii")
        self._plain_kinds: set[Any] = (
            set()
        )  # kinds an ordinary event may have (plain text, not a boundary)

    # ------------------------------------------------------------------ ordinary events
    def feed(
        self,
        rows: Iterable[tuple[Any, ...]],
        progress: Callable[[int], None] | None = None,
        *,
        stop: bool = False,
    ) -> int | None:
        """Check a batch of rows (``TUPLE_COLUMNS`` order: ``EventStore.event_tuples``), ordinary
        ones inline. With ``stop``, the first row that is not ordinary ends the batch
        unchecked: the number of rows checked is returned (None: all of them)."""
        first = self.count
        sha256 = hashlib.sha256
        dumps = orjson.dumps
        plain = self._plain_kinds
        prefix = self._prefix
        pending: list[bytes] = []
        expected, prev, last_id = self.expected, self.prev, self.last_id
        link = prev.encode() + b"\n"
        started = self.count > 0 and self.chain is not None
        v1 = self.chain is CHAIN_V1  # its rows hash a NULL ``snapshot`` before the payload
        ended = self.tip.ended_at is not None
        done = 0
        for row in rows:
            rid, seq, ts, kind, step, mid, tid, payload, stored = row
            if kind not in plain and _plain_text(kind) and kind not in _READ_KINDS:
                plain.add(kind)
            if (
                seq != expected
                or not started
                or type(seq) is not int
                or type(rid) is not int
                or rid <= last_id
                or type(ts) is not int
                or kind not in plain
                or type(stored) is not str
                or ended
                or not (step is None or type(step) is int)
                or not (mid is None or type(mid) is int)
                or not (tid is None or type(tid) is int)
                or type(payload) is not str
                or not payload.isascii()
                or "\x7f" in payload
                or len(payload) > MAX_PAYLOAD_BYTES
            ):
                self._flush(pending, expected, prev, last_id, done, progress)
                if stop:
                    return self.count - first
                pending, done = [], 0
                self.one(self._row(row))
                expected, prev, last_id = self.expected, self.prev, self.last_id
                link = prev.encode() + b"\n"
                started, ended = self.chain is not None, self.tip.ended_at is not None
                v1 = self.chain is CHAIN_V1
                if progress is not None:
                    progress(1)
                continue
            # Every value is an int, None or plain text here: orjson writes exactly the
            # canonical JSON of ``canonical_row`` (tests check they agree).
            encoded = prefix + dumps(row[1:7] + _NULL + row[7:8] if v1 else row[1:8])[1:]
            if sha256(link + encoded).hexdigest() != stored:
                self._flush(pending, expected, prev, last_id, done, progress)
                if stop:
                    return self.count - first
                pending, done = [], 0
                self.one(self._row(row))
                expected, prev, last_id = self.expected, self.prev, self.last_id
                link = prev.encode() + b"\n"
                ended = self.tip.ended_at is not None
                if progress is not None:
                    progress(1)
                continue
            pending.append(sha256(b"\x00" + encoded).digest())
            prev, last_id, expected = stored, rid, seq + 1
            link = stored.encode() + b"\n"
            done += 1
        self._flush(pending, expected, prev, last_id, done, progress)
        return None

    def _row(self, row: tuple[Any, ...]) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "stream": self.stream,
            **dict(zip(TUPLE_COLUMNS, row, strict=True)),
        }

    def _flush(
        self,
        pending: list[bytes],
        expected: int,
        prev: str,
        last_id: int,
        done: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        """Take over the inline loop's state: ``done`` ordinary events ending at ``expected - 1``."""
        if not done:
            return
        if self.grow_tree:
            for size, head in self.tree.extend_marked(pending, self.sizes).items():
                self.tip.roots[size] = head.hex()
        if self.leaves is not None:
            self.leaves.extend(pending)
        self.expected, self.prev, self.recomputed, self.last_id = expected, prev, prev, last_id
        self.tip.seq, self.tip.head_hash = expected - 1, prev
        self.count += done
        if progress is not None:
            progress(done)

    # ------------------------------------------------------------------ any event
    def one(self, row: dict[str, Any]) -> None:
        """Check one event by the general rules (any content, any position)."""
        run_id, stream, report, tip = self.run_id, self.stream, self.report, self.tip
        self.count += 1
        garbled = garbled_column(row)
        if garbled is None and self.chain is None:
            self._settle(row)
        chain = self.chain or CURRENT
        encoded = repr(sorted(row.items())).encode() if garbled else canonical_row(row, chain=chain)
        leaf = leaf_hash(encoded)
        self.tree.append(leaf)
        if self.leaves is not None:
            self.leaves.append(leaf)
        if self.tree.size in self.sizes:
            tip.roots[self.tree.size] = self.tree.root().hex()
        if garbled is not None:
            seq_value = row.get("seq")
            at = (
                seq_value
                if isinstance(seq_value, int) and not isinstance(seq_value, bool)
                else self.expected
            )
            kind = row.get("kind") if isinstance(row.get("kind"), str) else None
            report.problems.append(
                Problem(run_id, stream, at, row.get("id"), kind, f"event is garbled: {garbled}")
            )
            if isinstance(row.get("hash"), str):
                self.prev = self.recomputed = row["hash"]
            self.expected = max(self.expected, at + 1)
            return
        seq = int(row["seq"])
        past = past_limits(row["payload"])
        if past is not None:
            report.problems.append(
                Problem(
                    run_id,
                    stream,
                    seq,
                    row["id"],
                    row["kind"],
                    f"payload {past}, past the limits the recorder writes (docs/events.md): the store was edited",
                )
            )
        payload: dict[str, Any] = {}
        if row["kind"] in _BOUNDARY_KINDS and past is None:
            payload = payload_object(row["payload"], strict=False)
            if (
                not payload
            ):  # the recorder writes an object with the run's facts, never anything else
                report.problems.append(
                    Problem(
                        run_id,
                        stream,
                        seq,
                        row["id"],
                        row["kind"],
                        "payload is not a JSON object (edited)",
                    )
                )
        if tip.ended_at is not None:
            self.after_end.append(row)
        elif row["kind"] == "run_ended":
            tip.ended_at = seq
            status = payload.get("status")
            tip.end_status = status if isinstance(status, str) else None
        if row["kind"] == "run_started" and tip.world_size is None:
            started = payload
            world = started.get("world_size")
            tip.world_size = (
                world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else 1
            )
            key = started.get("signing_key")
            tip.signing_key = key if isinstance(key, str) and _FINGERPRINT.fullmatch(key) else None
        if self.count == 1 and seq == 1 and row["kind"] != "run_started":
            report.problems.append(
                Problem(
                    run_id,
                    stream,
                    1,
                    row["id"],
                    row["kind"],
                    "stream does not begin with run_started (its first event was replaced)",
                )
            )
        if seq > self.expected:
            expected = self.expected
            missing = f"seq {expected}" if seq == expected + 1 else f"seqs {expected}..{seq - 1}"
            report.problems.append(
                Problem(run_id, stream, expected, None, None, f"{missing} missing (events deleted)")
            )
            self.prev = self.recomputed = row["hash"]
        elif seq < self.expected:
            report.problems.append(
                Problem(
                    run_id,
                    stream,
                    seq,
                    row["id"],
                    row["kind"],
                    "duplicate sequence number (event inserted)",
                )
            )
            return
        else:
            computed = link_hash(self.prev, encoded)
            if computed != row["hash"] and (
                self.recomputed == self.prev
                or chain_hash(self.recomputed, row, chain=chain) != row["hash"]
            ):
                self.mismatched.append(row)
            self.recomputed = computed
        if row["id"] < self.last_id:
            report.problems.append(
                Problem(
                    run_id,
                    stream,
                    seq,
                    row["id"],
                    row["kind"],
                    "stored out of order (events reordered)",
                )
            )
        self.last_id = row["id"]
        self.prev = row["hash"]
        tip.seq, tip.head_hash = seq, row["hash"]
        self.expected = seq + 1

    def _settle(self, row: dict[str, Any]) -> None:
        """Fix the stream's format from ``row``: at its first event, the format whose
        genesis it links from; after a first event that matched none, the first format
        a later event links under from the stored hash before it."""
        if self.expected == 1 and self.count == 1:
            self.chain = first_event_format(row)
            if self.chain is not None:
                self.prev = self.recomputed = self.chain.genesis(self.run_id, self.stream)
            elif row["seq"] == 1:  # its hash in each format, were only its hash column edited
                self._recomputed_by = {
                    f: chain_hash(f.genesis(self.run_id, self.stream), row, chain=f)
                    for f in FORMATS
                }
            return
        if row["seq"] != self.expected:
            return
        for chain in FORMATS:
            if chain_hash(self.prev, row, chain=chain) == row["hash"]:
                self.chain = chain
                return
            was = self._recomputed_by.get(chain)
            if was is not None and chain_hash(was, row, chain=chain) == row["hash"]:
                self.chain, self.recomputed = chain, was
                return
