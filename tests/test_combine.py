"""``auditlog combine``: shards merged into one store, idempotently, bad shards left in place."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from helpers import assert_one_line_error, invoke, record_run, tamper, tree_digest

from auditlog.recording.combine import combine
from auditlog.store.eventstore import EventStore


def _rank_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int = 2
) -> tuple[Path, str]:
    """Two processes' shards of one run (as two torchrun ranks would write them)."""
    base = tmp_path / "store"
    monkeypatch.setenv("AUDITLOG_RUN_ID", "job")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        record_run(base, steps=steps, shard=True)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("AUDITLOG_RUN_ID")
    return base, "job"


def _counts(store: Path) -> tuple[int, int]:
    opened = EventStore.open(store)
    try:
        events = sum(n for n, _ in opened.run_event_counts().values())
        return events, len(opened.blob_rows())
    finally:
        opened.close()


def test_shards_combine_into_one_verifiable_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, run_id = _rank_shards(tmp_path, monkeypatch)
    shards = sorted((base / "shards").iterdir())
    assert [s.name.split(".")[:2] for s in shards] == [["job", "0"], ["job", "1"]]
    assert not (base / "events.db").exists()  # the ranks wrote only their shards

    result = invoke("combine", "--into", str(base), "--format", "json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["result"] for r in rows] == ["combined", "combined"]
    assert all(r["added"] > 0 and r["present"] == 0 for r in rows)

    [run] = json.loads(invoke("runs", "--store", str(base), "--format", "json").stdout)
    assert (run["run_id"], run["status"], run["streams"], run["world_size"]) == (
        run_id,
        "completed",
        2,
        2,
    )
    verified = invoke("verify", "--store", str(base))
    assert verified.exit_code == 0 and "2 stream(s): intact" in verified.stdout
    restored = invoke("restore", "--store", str(base), "--step", "2", "-o", str(tmp_path / "w.pt"))
    assert restored.exit_code == 0, restored.stderr  # snapshot files came along
    assert all(s.exists() for s in shards)  # originals kept


def test_combining_twice_adds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, _ = _rank_shards(tmp_path, monkeypatch)
    first = combine(str(base), sorted((base / "shards").iterdir()))
    before = _counts(base), tree_digest(base / "snapshots")
    second = combine(str(base), sorted((base / "shards").iterdir()))
    assert first.ok and second.ok
    assert first.events_added > 0 and second.events_added == 0
    assert [s.events_present for s in second.shards] == [s.events_added for s in first.shards]
    assert (_counts(base), tree_digest(base / "snapshots")) == before


def test_a_longer_shard_adds_only_its_new_events(tmp_path: Path) -> None:
    shard, target = tmp_path / "shard", tmp_path / "target"
    run_id = record_run(shard, steps=2)
    # The process died before its run_ended (what SIGKILL leaves): cut it off the shard.
    with sqlite3.connect(shard / "events.db") as conn:
        conn.execute("delete from events where run_id = ? and kind = 'run_ended'", (run_id,))
    assert combine(str(target), [shard]).ok
    held = _counts(target)[0]
    # A later recording closes the crashed stream: the shard's stream grows by its run_ended.
    opened = EventStore.open(shard)
    try:
        seq, head = opened.chain_head(run_id, 0) or (0, "")
        from auditlog.core.chain import canonical_payload, chain_hash

        extra = {
            "run_id": run_id,
            "stream": 0,
            "seq": seq + 1,
            "ts_ns": 1,
            "kind": "run_ended",
            "step": 2,
            "module_id": None,
            "tensor_id": None,
            "payload": canonical_payload(
                {
                    "status": "crashed",
                    "exit_code": None,
                    "exception": None,
                    "signal": None,
                    "steps": 2,
                    "detected_by": "later",
                }
            ),
        }
        extra["hash"] = chain_hash(head, extra)
        opened.add_events([extra])
    finally:
        opened.close()
    again = combine(str(target), [shard])
    assert again.ok and again.events_added == 1 and again.shards[0].events_present == held


def test_a_corrupt_shard_is_reported_and_left_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _ = _rank_shards(tmp_path, monkeypatch)
    good, bad = sorted((base / "shards").iterdir())
    (bad / "events.db").write_bytes(b"this is not a database" * 100)
    before = tree_digest(bad)

    result = invoke("combine", "--into", str(tmp_path / "target"), str(good), str(bad))
    line = assert_one_line_error(result, 1, str(bad), "left in place")
    assert "not an auditlog store" in line
    assert "combined" in result.stdout and "left in place" in result.stdout
    assert tree_digest(bad) == before  # untouched
    [run] = json.loads(
        invoke("runs", "--store", str(tmp_path / "target"), "--format", "json").stdout
    )
    assert run["streams"] == 1  # the good shard is in


def test_an_altered_shard_is_not_combined(tmp_path: Path) -> None:
    shard = tmp_path / "shard"
    record_run(shard, steps=2)
    with tamper(shard) as conn:
        conn.execute(
            "update events set payload = replace(payload, '0.1', '0.2') where kind = 'optimizer_step'"
        )
    before = tree_digest(shard)
    report = combine(str(tmp_path / "target"), [shard], delete=True)
    assert not report.ok and report.events_added == 0
    assert "record altered" in (report.shards[0].refused or "")
    assert tree_digest(shard) == before and not report.shards[0].deleted


def test_conflicting_streams_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDITLOG_RUN_ID", "same-id")
    one, two = tmp_path / "one", tmp_path / "two"
    record_run(one, steps=1)
    record_run(two, steps=2)  # another record under the same run id and stream
    target = tmp_path / "target"
    assert combine(str(target), [one]).ok
    clash = combine(str(target), [two])
    assert not clash.ok and clash.events_added == 0
    assert "different record" in clash.shards[0].conflicts[0]
    assert invoke("verify", "--store", str(target)).exit_code == 0


def test_delete_removes_only_combined_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _ = _rank_shards(tmp_path, monkeypatch)
    shards = sorted((base / "shards").iterdir())
    missing = tmp_path / "nowhere"
    report = combine(str(base), [*shards, missing], delete=True)
    assert [s.deleted for s in report.shards] == [True, True, False]
    assert not any(s.exists() for s in shards)
    assert report.shards[2].refused is not None and "no auditlog store" in report.shards[2].refused
    assert invoke("verify", "--store", str(base)).exit_code == 0


def test_combine_into_postgres(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    base, run_id = _rank_shards(tmp_path, monkeypatch)
    result = invoke(
        "combine",
        "--into",
        pg_url,
        "--snapshots",
        str(tmp_path / "pg-snaps"),
        *[str(s) for s in sorted((base / "shards").iterdir())],
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    verified = invoke("verify", "--store", pg_url)
    assert verified.exit_code == 0 and "2 stream(s): intact" in verified.stdout
    [run] = json.loads(invoke("runs", "--store", pg_url, "--format", "json").stdout)
    assert (run["run_id"], run["streams"], run["status"]) == (run_id, 2, "completed")


def test_combine_needs_shards(tmp_path: Path) -> None:
    assert_one_line_error(
        invoke("combine", "--into", str(tmp_path / "empty")), 1, "no shards to combine"
    )
