"""Crafted payloads (issue 29, part 4): damaged copies of a real store, each made by one
``damage(store_dir, run_id)`` with plain ``sqlite3`` on ``events.db``.

Each case edits one event's payload text. Those marked ``rehash`` then recompute
the stream's chain from genesis with the published chain function
(``auditlog.core.chain``) and delete the run's checkpoints, as a forger without
the key does; the others are a plain edit (hash column untouched). The limits
they cross are documented in docs/events.md ("Payload limits"): 64 MiB of UTF-8,
64 levels of objects and lists.

``PAYLOAD_CASES`` lists them with what ``verify`` must say about each (words of
its finding, or "" when the record verifies) so that the shared corpus of crafted
stores can run every read command against them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditlog.core.chain import chain_hash, genesis_hash
from auditlog.core.eventrow import HASHED_COLUMNS
from auditlog.core.payloadlimits import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH

CHAINED = HASHED_COLUMNS  # the canonical row of the current chain format
DEEP = 200_000  # levels: what stopped every reader with RecursionError before the limits


def edit_payload(
    store_dir: Path, run_id: str, kind: str, edit: Callable[[str], str], *, rehash: bool
) -> None:
    """Replace the payload text of ``run_id``'s first ``kind`` event with ``edit(text)``;
    with ``rehash``, recompute its stream's chain and delete the run's checkpoints."""
    conn = sqlite3.connect(store_dir / "events.db")
    conn.row_factory = sqlite3.Row
    try:
        rows = [
            dict(r)
            for r in conn.execute(
                "select * from events where run_id = ? and stream = 0 order by seq", (run_id,)
            )
        ]
        target = next(r for r in rows if r["kind"] == kind)
        target["payload"] = edit(target["payload"])
        conn.execute(
            "update events set payload = ? where id = ?", (target["payload"], target["id"])
        )
        if rehash:
            prev = genesis_hash(run_id, 0)
            for row in rows:
                prev = chain_hash(prev, {c: row[c] for c in CHAINED})
                conn.execute("update events set hash = ? where id = ?", (prev, row["id"]))
            conn.execute("delete from checkpoints where run_id = ?", (run_id,))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def with_field(value: Any) -> Callable[[str], str]:
    """A payload edit adding ``"zz": value`` (compact JSON, keys sorted as the recorder writes)."""

    def edit(text: str) -> str:
        payload = json.loads(text)
        payload["zz"] = value
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))

    return edit


def with_raw_field(raw: str) -> Callable[[str], str]:
    """A payload edit appending ``,"zz":RAW`` as text (for nesting no Python object can hold)."""
    return lambda text: text[:-1] + ',"zz":' + raw + "}"


def nested(levels: int) -> str:
    """A list nested ``levels`` deep, as JSON text."""
    return "[" * levels + "]" * levels


def _case(kind: str, edit: Callable[[str], str], rehash: bool) -> Callable[[Path, str], None]:
    def damage(store_dir: Path, run_id: str) -> None:
        edit_payload(store_dir, run_id, kind, edit, rehash=rehash)

    damage.__doc__ = (
        f"The first {kind} event of the run edited{' (chain recomputed)' if rehash else ''}."
    )
    return damage


READERS = ("verify", "events", "runs", "tree", "query", "restore", "diff")
"""The commands whose exit code each case states (``tests/test_crafted_payloads.py`` runs them)."""


@dataclass(frozen=True)
class PayloadCase:
    """One crafted payload: ``damage(store_dir, run_id)`` edits a copy of a store; ``finding``:
    words of ``verify``'s one-line error ("" when the record still verifies: the chain was
    recomputed and nothing verify reads is past a limit); ``codes``: the exit code of each of
    ``READERS`` that is not 0. A reader that parses the edited payload refuses it by name: 4
    past a limit, 3 when it is no JSON; one that never reads it answers as for the pristine
    store."""

    name: str
    damage: Callable[[Path, str], None]
    finding: str
    codes: dict[str, int] = field(default_factory=dict)

    def code(self, reader: str) -> int:
        return self.codes.get(reader, 0)


def _refused_by(*readers: str, code: int = 4) -> dict[str, int]:
    return dict.fromkeys(readers, code)


def _oversized(text: str) -> str:
    """A field of 1 KiB more than the limit (built when used: 64 MiB)."""
    return with_field("a" * (MAX_PAYLOAD_BYTES + 1024))(text)


_TOO_DEEP = f"nested more than {MAX_PAYLOAD_DEPTH} levels deep"
_TOO_BIG = f"over the limit of {MAX_PAYLOAD_BYTES:,} bytes"
# run_started and run_ended are read by verify, runs, the read model, restore and diff
# (``tree`` names the run from them tolerantly, and reads only construction events).
_BOUNDARY = _refused_by("verify", "events", "runs", "query", "restore", "diff")

PAYLOAD_CASES: list[PayloadCase] = [
    PayloadCase(
        "deep_run_started",
        _case("run_started", with_raw_field(nested(DEEP)), rehash=True),
        _TOO_DEEP,
        _BOUNDARY,
    ),
    PayloadCase(
        "deep_run_started_plain_edit",
        _case("run_started", with_raw_field(nested(DEEP)), rehash=False),
        _TOO_DEEP,
        _BOUNDARY,
    ),
    PayloadCase(
        "deep_run_ended",
        _case("run_ended", with_raw_field(nested(DEEP)), rehash=True),
        _TOO_DEEP,
        _BOUNDARY,
    ),
    PayloadCase(
        "just_too_deep_run_ended",  # the object, and a list 64 deep in it: 65 levels
        _case("run_ended", with_raw_field(nested(MAX_PAYLOAD_DEPTH)), rehash=True),
        _TOO_DEEP,
        _BOUNDARY,
    ),
    PayloadCase(
        "deep_construction_sealed",
        _case("construction_sealed", with_raw_field(nested(DEEP)), rehash=True),
        _TOO_DEEP,
        _refused_by("verify", "events", "tree", "query", "restore", "diff"),
    ),
    # an ordinary event: verify hashes its text (intact once rehashed); every reader of it refuses it
    PayloadCase(
        "deep_metrics",
        _case("metrics", with_raw_field(nested(DEEP)), rehash=True),
        "",
        _refused_by("events", "query"),
    ),
    PayloadCase(
        "unclosed_brackets_in_run_started",
        _case("run_started", with_raw_field("[" * DEEP), rehash=True),
        "payload is not a JSON object",
        {**_refused_by("events", "query", "diff", code=3), **_refused_by("verify", "restore")},
    ),
    PayloadCase(
        "oversized_annotation",
        _case("annotation", _oversized, rehash=True),
        _TOO_BIG,
        _refused_by("verify", "events", "query", "restore"),
    ),
    # within the limits: answered as usual (brackets and escaped quotes inside a string are text)
    PayloadCase(
        "brackets_inside_a_string", _case("annotation", with_field('\\"[' * DEEP), rehash=True), ""
    ),
    PayloadCase(
        "four_mib_annotation", _case("annotation", with_field("b" * (4 << 20)), rehash=True), ""
    ),
]
