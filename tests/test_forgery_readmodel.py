"""The read model proves what it answers (issue 29, part 1): forgeries aimed at the DuckDB cache.

Each forgery uses the documented format only (``forgery_support``: plain
``sqlite3`` on ``events.db``), as the attacker of the threat model would:
edit payload text with the hash column untouched, let a reader build the read
model, put ``events.db`` back byte for byte. ``query``, ``metrics`` and the
Python API must never answer from a row that does not match the chain.
"""

from __future__ import annotations

import json
from pathlib import Path

import forgery_support
import pytest
from forgery_support import Trial, append_event
from helpers import assert_one_line_error, tamper

import auditlog
from auditlog.core.errors import IntegrityError
from auditlog.store.readmodel import trust

pristine = forgery_support.pristine  # fixtures
trial = forgery_support.trial

POISON = (
    ("optimizer_step", '"lr":0.1,', '"lr":0.5,'),
    ("annotation", "0" * 64, "e" * 64),
)


def poison(store: Path, run_id: str) -> int:
    """Edit lr and the dataset hash in the stored payloads, hashes untouched; the first id edited."""
    with tamper(store) as conn:
        for kind, old, new in POISON:
            changed = conn.execute(
                "update events set payload = replace(payload, ?, ?) where run_id=? and kind=? and instr(payload, ?)",
                (old, new, run_id, kind, old),
            ).rowcount
            assert changed > 0, kind
        (first,) = conn.execute(
            "select min(id) from events where run_id=? and (instr(payload, ?) or instr(payload, ?))",
            (run_id, POISON[0][2], POISON[1][2]),
        ).fetchone()
    return int(first)


def answers(trial: Trial) -> tuple[set[float], set[str], set[float]]:
    """The lrs and dataset hashes ``query`` answers for r1, and the lrs ``metrics`` shows."""
    lrs = trial.cli("query", "--run", trial.r1, "--format", "json", "select distinct lr from steps")
    assert lrs.exit_code == 0, lrs.stderr
    data = trial.cli(
        "query",
        "--run",
        trial.r1,
        "--format",
        "json",
        "select fields ->> 'sha256' as sha from annotations where key = 'dataset'",
    )
    assert data.exit_code == 0, data.stderr
    metrics = trial.cli("metrics", trial.r1, "--format", "json")
    assert metrics.exit_code == 0, metrics.stderr
    return (
        {r["lr"] for r in json.loads(lrs.stdout)},
        {r["sha"] for r in json.loads(data.stdout)},
        {r["lr"] for r in json.loads(metrics.stdout)},
    )


def test_edit_build_restore_leaves_no_poisoned_cache(trial: Trial) -> None:
    """The attack of issue 29: edit, let a query build the cache, put events.db back."""
    db = trial.store / "events.db"
    original = db.read_bytes()
    first = poison(trial.store, trial.r1)
    for command in (("query", "select distinct lr from steps"), ("metrics", trial.r1)):
        refused = trial.cli(*command)
        line = assert_one_line_error(
            refused, 4, f"event id {first} ", "content does not match its recorded hash"
        )
        assert line.startswith("Error: record altered: event id "), line
    db.write_bytes(original)  # put back byte for byte
    assert trial.verify().exit_code == 0
    assert answers(trial) == ({0.1}, {"0" * 64}, {0.1})


def test_a_plain_edit_after_the_cache_was_built_is_never_served(trial: Trial) -> None:
    """The cache holds exactly the chained content: an edit under it is verify's to name, not an answer."""
    assert answers(trial) == ({0.1}, {"0" * 64}, {0.1})  # built from the intact record
    first = poison(trial.store, trial.r1)
    assert answers(trial) == ({0.1}, {"0" * 64}, {0.1})  # what the chain proves, not the edit
    verdict = trial.verify()
    assert verdict.exit_code == 4 and f"(event id {first}, " in verdict.stderr, verdict.stdout
    rebuilt = trial.cli("query", "--rebuild", "select distinct lr from steps")
    assert_one_line_error(rebuilt, 4, "content does not match its recorded hash")


def test_an_event_appended_with_a_stale_hash_is_refused_by_an_incremental_refresh(
    trial: Trial,
) -> None:
    assert answers(trial) == ({0.1}, {"0" * 64}, {0.1})
    with tamper(trial.store) as conn:
        row = append_event(conn, trial.r2, 0, "annotation", {"key": "late", "fields": {"x": 1}})
        conn.execute(
            "update events set payload = replace(payload, '\"x\":1', '\"x\":2') where hash=?",
            (row["hash"],),
        )
        (eid,) = conn.execute("select id from events where hash=?", (row["hash"],)).fetchone()
    refused = trial.cli("query", "select count(*) from annotations")
    assert_one_line_error(refused, 4, f"event id {eid} ", f"seq {row['seq']},", "kind 'annotation'")


def test_an_event_deleted_before_the_copy_is_refused(trial: Trial) -> None:
    with tamper(trial.store) as conn:
        (eid, seq) = conn.execute(
            "select id, seq from events where run_id=? and kind='optimizer_step' order by seq limit 1",
            (trial.r1,),
        ).fetchone()
        conn.execute("delete from events where id=?", (eid,))
    refused = trial.cli("query", "select count(*) from events")
    assert_one_line_error(refused, 4, f"seq {seq + 1},", f"follows seq {seq - 1} of its stream")


def test_the_python_api_refuses_too(trial: Trial) -> None:
    db = trial.store / "events.db"
    original = db.read_bytes()
    first = poison(trial.store, trial.r1)
    with (
        auditlog.open(trial.store) as opened,
        pytest.raises(IntegrityError, match=f"event id {first} "),
    ):
        opened.query("select distinct lr from steps")
    db.write_bytes(original)
    with auditlog.open(trial.store) as opened:
        assert {r["lr"] for r in opened.query("select distinct lr from steps", run=trial.r1)} == {
            0.1
        }


def test_a_cache_sealed_before_rows_were_checked_is_rebuilt_and_says_so(trial: Trial) -> None:
    """A read model of an older auditlog (seal v1: rows copied by id, unchecked) is not trusted."""
    assert answers(trial)[0] == {0.1}
    seal = trust.seal_path(trial.store / "readmodel.duckdb")
    fields = {k: v for k, v in json.loads(seal.read_text()).items() if k != "mac"}
    fields["format"] = "auditlog-readmodel-seal-v1"
    key = trust.secret()
    assert key is not None
    seal.write_text(json.dumps({**fields, "mac": trust._mac(key, fields)}))
    result = trial.cli("query", "select count(*) as n from runs", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == (
        "auditlog: read model rebuilt from the store: the read model was sealed by another auditlog "
        "version (its rows are checked against the chain again)\n"
    )
    again = trial.cli("query", "select count(*) as n from runs", "--format", "json")
    assert again.exit_code == 0 and again.stderr == ""  # sealed now: answered without a rebuild
