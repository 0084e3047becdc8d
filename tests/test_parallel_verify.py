"""A stream checked in two processes (``integrity.parallel``) gets the sequential verdicts.

The split is forced on a short stream (``MIN_EVENTS`` lowered); each damage is
placed before, at and after the split point, and the report (problems, tips,
tree heads at signed sizes, leaves) must be the one the sequential check makes,
for streams of either chain format (the child is given the format the first event
fixes), and with an event hashed in the other format.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from auditlog.core.chain import (
    CHAIN_V1,
    CHAIN_V2,
    CURRENT,
    ChainFormat,
    canonical_payload,
    chained_row,
)
from auditlog.integrity import parallel
from auditlog.integrity.findings import VerifyReport
from auditlog.integrity.merkle import Frontier, PackedLeaves, leaf_hash
from auditlog.integrity.verify import verify_stream
from auditlog.store.eventstore import EventStore

RUN = "d" * 32
EVENTS = 300  # split at 141


def _store(path: Path, chain: ChainFormat = CURRENT, mixed: int | None = None) -> EventStore:
    """A stream of ``EVENTS`` events in ``chain``; the event at seq ``mixed`` (and only it) in
    the other format, the ones after it linked to it."""
    store = EventStore.open(str(path), create=True)
    store.create_run(RUN, "split", "host", 1, None)
    other = CHAIN_V1 if chain is CHAIN_V2 else CHAIN_V2
    prev, rows = chain.genesis(RUN, 0), []
    for seq in range(1, EVENTS + 1):
        kind = "run_started" if seq == 1 else ("run_ended" if seq == EVENTS else "annotation")
        row, _ = chained_row(
            prev,
            RUN,
            0,
            seq,
            10 + seq,
            kind,
            seq // 3,
            None,
            None,
            canonical_payload({"world_size": 1} if seq == 1 else {"n": seq, "t": 'x"y'}),
            chain=other if seq == mixed else chain,
        )
        prev = row["hash"]
        rows.append(row)
    store.append(rows, RUN, heartbeat=False)
    return store


def _verify(
    store: EventStore, split: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[VerifyReport, bytes]:
    monkeypatch.setattr(parallel, "MIN_EVENTS", 2 if split else 10**12)
    monkeypatch.setattr(parallel, "core_free", lambda: True)
    report, leaves = VerifyReport(RUN), PackedLeaves()
    count = store.stream_event_counts(RUN)[0][1]
    verify_stream(
        store,
        RUN,
        0,
        report,
        sizes=frozenset({5, 141, 142, 256, 280, 300}),
        leaves=leaves,
        count=count,
    )
    return report, leaves.packed()


DAMAGE = {
    "none": [],
    "edit_before": [
        "update events set payload = replace(payload, '\"n\":100,', '\"n\":101,') where seq = 100"
    ],
    "edit_at": [
        "update events set payload = replace(payload, '\"n\":141,', '\"n\":7,') where seq = 141"
    ],
    "edit_after": [
        "update events set payload = replace(payload, '\"n\":270,', '\"n\":7,') where seq = 270"
    ],
    "delete_at": ["delete from events where seq = 141"],
    "delete_after": ["delete from events where seq between 142 and 144"],
    "hash_at": ["update events set hash = substr(hash, 2) || '0' where seq = 141"],
    "garble_after": ["update events set seq = 'x' where seq = 290"],
    "garble_ts": ["update events set ts_ns = 1.5 where seq = 258"],
    "moved_id": ["update events set id = id + 100000 where seq = 265"],
    "ended_early": ["update events set kind = 'run_ended' where seq = 200"],
    "first_edited": [  # no format can be told from it: checked in one process
        "update events set payload = replace(payload, '1}', '2}') where seq = 1"
    ],
}
MIXED = {"mixed_before": 100, "mixed_at": 141, "mixed_after": 270}
CASES = [
    *((CURRENT, damage) for damage in [*DAMAGE, *MIXED]),
    *((CHAIN_V1, damage) for damage in ("none", "edit_after", "first_edited", *MIXED)),
]


def _ran_in_a_clean_process(request: pytest.FixtureRequest) -> bool:
    """The split check forks only when no other thread runs, and libraries earlier tests
    used (inductor's tqdm monitor, idle thread pools) leave threads behind: then this test
    runs again, alone, in a fresh interpreter, and passes only if it passes there."""
    import subprocess
    import sys
    import threading

    if not [t for t in threading.enumerate() if t is not threading.main_thread()]:
        return False
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{__file__}::{request.node.name}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]
    return True


@pytest.mark.parametrize(("chain", "damage"), CASES, ids=[f"v{c.number}-{d}" for c, d in CASES])
def test_split_check_agrees_with_sequential(
    tmp_path: Path,
    chain: ChainFormat,
    damage: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if _ran_in_a_clean_process(request):
        return
    store = _store(tmp_path / "store", chain, MIXED.get(damage))
    with sqlite3.connect(tmp_path / "store" / "events.db") as conn:
        for statement in DAMAGE.get(damage, []):
            conn.execute(statement)
    conn.close()
    joined: list[int] = []
    join = parallel._join
    monkeypatch.setattr(
        parallel, "_join", lambda check, result: (joined.append(result.rows), join(check, result))
    )
    split, split_leaves = _verify(store, True, monkeypatch)
    plain, plain_leaves = _verify(store, False, monkeypatch)
    if damage in ("none", "edit_before", "edit_after", "garble_after", "moved_id", "mixed_before"):
        assert joined and joined[0] > 0  # the child's checked rows were taken
    if damage == "first_edited":
        assert not joined
    if damage in MIXED:
        assert [(p.seq, p.what.split(",")[0]) for p in plain.problems] == [
            (
                MIXED[damage],
                f"event is hashed in chain format {'auditlog-chain-v2' if chain is CHAIN_V1 else 'auditlog-chain-v1'}",
            )
        ]
    assert split.problems == plain.problems
    assert (
        split.tips == plain.tips and split.events == plain.events and split.streams == plain.streams
    )
    assert split_leaves == plain_leaves
    assert bool(plain.problems) == (damage != "none")
    store.close()


@pytest.mark.parametrize("start", [1, 6, 141, 256, 1000])
def test_blocks_stack_into_the_same_tree(start: int) -> None:
    leaves = [leaf_hash(str(i).encode()) for i in range(start + 700)]
    sizes = frozenset({start + 3, start + 64, start + 65, 1024, start + 700})
    whole, stacked = Frontier(), Frontier()
    heads: dict[int, bytes] = {}
    for index, leaf in enumerate(leaves):
        whole.append(leaf)
        if index < start:
            stacked.append(leaf)
        if whole.size in sizes:
            heads[whole.size] = whole.root()
    seen: dict[int, bytes] = {}
    for width, head in parallel.blocks(leaves[start:], start, sizes):
        stacked.append_subtree(width, head)
        if stacked.size in sizes:
            seen[stacked.size] = stacked.root()
    assert stacked.size == whole.size and stacked.root() == whole.root()
    assert seen == {s: h for s, h in heads.items() if s > start}
