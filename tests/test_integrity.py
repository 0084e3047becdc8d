"""``auditlog verify`` and ``auditlog.integrity.verify.verify_run`` against real tampering.

Every test records a real (tiny) training run into a real SQLite store, alters
``events.db`` with plain ``sqlite3`` the way an attacker with file access would,
and checks that the CLI exits 4 naming the first bad event, and that the library
report pins the problem to the right sequence number.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from helpers import CliResult, invoke, tamper
from helpers import record_run as record_tiny_run

from auditlog.integrity.findings import VERDICTS
from auditlog.integrity.verify import Problem, verify_run
from auditlog.store.eventstore import EventStore


# --------------------------------------------------------------------------- helpers
def record_run(store_path: Path, steps: int = 3, name: str | None = None) -> str:
    return record_tiny_run(store_path, steps, name)


def max_seq(store: Path, run_id: str) -> int:
    with tamper(store) as conn:
        return int(
            conn.execute("select max(seq) from events where run_id=?", (run_id,)).fetchone()[0]
        )


def problems_of(store: Path, run_id: str) -> list[Problem]:
    event_store = EventStore.open(str(store))
    try:
        report = verify_run(event_store, run_id)
    finally:
        event_store.close()
    return report.problems


def verify(store: Path, run: str = "latest", *extra: str) -> CliResult:
    return invoke("verify", "--store", str(store), *extra, run)


def assert_failed_at(result: CliResult, seq: int, *words: str) -> str:
    """Exit 4 with one ``Error:`` line naming ``seq`` (and ``words``); returns that line."""
    assert result.exit_code == 4, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("Error: record altered:"), line
    assert re.search(rf"\bseq {seq}\b", line), line
    for word in words:
        assert word in line, line
    assert "FAILED" in result.stdout
    return line


def swap_seqs(conn: sqlite3.Connection, run_id: str, a: int, b: int) -> None:
    """Swap the positions of two events (via a temporary seq, for the unique constraint)."""
    conn.execute("update events set seq=-1 where run_id=? and seq=?", (run_id, a))
    conn.execute("update events set seq=? where run_id=? and seq=?", (a, run_id, b))
    conn.execute("update events set seq=? where run_id=? and seq=-1", (b, run_id))


def shift_up_from(conn: sqlite3.Connection, run_id: str, seq: int) -> None:
    """Make room at ``seq`` by moving every later event up by one."""
    conn.execute("update events set seq=-(seq+1) where run_id=? and seq>=?", (run_id, seq))
    conn.execute("update events set seq=-seq where run_id=? and seq<0", (run_id,))


INSERT_COPY = (
    "insert into events(run_id, stream, seq, ts_ns, kind, step, module_id, tensor_id, payload, hash) "
    "select run_id, stream, ?, ts_ns, kind, step, module_id, tensor_id, payload, ? "
    "from events where run_id=? and seq=?"
)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One recorded run, made once per module; tests work on copies."""
    path = tmp_path_factory.mktemp("pristine") / "store"
    # record from inside the temp dir: run_started inspects the cwd's git repository
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path.parent)
        # 10 steps: one activity event (step 0, the default sampling) and an
        # optimizer_step per step give a chain of more than 20 events
        run_id = record_run(path, steps=10)
    return path, run_id


@pytest.fixture
def run_id(pristine: tuple[Path, str], store: Path) -> str:
    """A private copy of the recorded store at ``store``; returns its run id."""
    shutil.copytree(pristine[0], store)
    return pristine[1]


# --------------------------------------------------------------------------- intact
def test_untouched_store_verifies(store: Path, run_id: str) -> None:
    result = verify(store)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    n = max_seq(store, run_id)
    assert n > 20  # a real recording: run_started, registrations, activity, steps, run_ended
    assert f"run {run_id[:12]}: {n} events in 1 stream(s): intact" in result.stdout
    assert problems_of(store, run_id) == []
    # by full id and by prefix as well
    assert verify(store, run_id).exit_code == 0
    assert verify(store, run_id[:8]).exit_code == 0


def test_verify_all_reports_every_run(store: Path, run_id: str) -> None:
    second = record_run(store, steps=2)
    result = verify(store, "all")
    assert result.exit_code == 0, result.stderr
    assert f"run {run_id[:12]}:" in result.stdout
    assert f"run {second[:12]}:" in result.stdout
    assert result.stdout.count("intact") == 2

    # tampering one run fails `all` but the other run is still reported intact
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=? and seq=3", (second,))
    result = verify(store, "all")
    line = assert_failed_at(result, 3, "deleted")
    assert second[:12] in line
    assert f"run {run_id[:12]}: " in result.stdout
    first_line = next(
        ln for ln in result.stdout.splitlines() if ln.startswith(f"run {run_id[:12]}")
    )
    assert first_line.endswith(": " + VERDICTS["unsigned"])
    assert verify(store, run_id).exit_code == 0


def test_json_format_reports_ok_true(store: Path, run_id: str) -> None:
    result = verify(store, "latest", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["run_id"] for r in data] == [run_id]
    assert data[0]["ok"] is True
    assert data[0]["problems"] == []
    assert data[0]["events"] == max_seq(store, run_id)


# --------------------------------------------------------------------------- edits
def test_edited_payload_is_pinned_to_that_event(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        (payload,) = conn.execute(
            "select payload from events where run_id=? and seq=5", (run_id,)
        ).fetchone()
        # change one digit of a number in the payload (e.g. a shape or a statistic)
        edited = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), payload, count=1)
        assert edited != payload
        conn.execute("update events set payload=? where run_id=? and seq=5", (edited, run_id))

    assert_failed_at(verify(store), 5, "modified")

    problems = problems_of(store, run_id)
    # the rest of the chain still verifies: exactly one problem, on seq 5
    assert len(problems) == 1, [p.describe() for p in problems]
    assert problems[0].seq == 5
    assert problems[0].event_id == 5
    assert "modified" in problems[0].what


def test_json_format_reports_ok_false_with_the_problem(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        conn.execute("update events set payload=payload || ' ' where run_id=? and seq=7", (run_id,))
    result = verify(store, "latest", "--format", "json")
    assert result.exit_code == 4
    data = json.loads(result.stdout)
    assert data[0]["ok"] is False
    assert [(p["seq"], p["stream"]) for p in data[0]["problems"]] == [(7, 0)]
    assert "modified" in data[0]["problems"][0]["what"]
    assert result.stderr.startswith("Error: record altered:")


@pytest.mark.parametrize(
    "column, new_value",
    [
        ("ts_ns", "ts_ns + 1"),
        ("kind", "'annotation'"),
        ("step", "coalesce(step, 0) + 1"),
        ("module_id", "coalesce(module_id, 0) + 1000"),
        ("tensor_id", "coalesce(tensor_id, 0) + 1000"),
    ],
)
def test_every_hashed_column_is_covered(
    store: Path, run_id: str, column: str, new_value: str
) -> None:
    """Not just the payload: a change to any stored column of an event breaks its hash."""
    with tamper(store) as conn:
        conn.execute(
            f"update events set {column} = {new_value} where run_id=? and seq=9", (run_id,)
        )
    assert_failed_at(verify(store), 9, "modified")
    problems = problems_of(store, run_id)
    assert [p.seq for p in problems] == [9]


def test_edited_hash_column_is_detected(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        conn.execute("update events set hash=? where run_id=? and seq=5", ("0" * 64, run_id))
    assert_failed_at(verify(store), 5)
    problems = problems_of(store, run_id)
    assert problems and problems[0].seq == 5
    assert problems[0].event_id == 5


# --------------------------------------------------------------------------- deletions
def test_deleted_event_is_named_as_missing(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=? and seq=20", (run_id,))
    line = assert_failed_at(verify(store), 20, "deleted")
    assert "seq 20 missing" in line
    problems = problems_of(store, run_id)
    assert len(problems) == 1, [p.describe() for p in problems]
    assert problems[0].seq == 20 and "missing" in problems[0].what


def test_deleted_range_is_named_as_a_range(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=? and seq between 10 and 12", (run_id,))
    line = assert_failed_at(verify(store), 10, "deleted")
    assert "seqs 10..12 missing" in line


def test_deleted_first_event_is_detected(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=? and seq=1", (run_id,))
    assert_failed_at(verify(store), 1, "deleted")


def test_run_with_every_event_deleted_fails(store: Path, run_id: str) -> None:
    """Runs come from the chain: only the runs index remembers this one, and `verify all` reads it."""
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=?", (run_id,))
    result = invoke("verify", "all", "--store", str(store))
    assert result.exit_code == 4
    assert "no events" in result.stderr


# --------------------------------------------------------------------------- insertions
def test_forged_event_appended_is_detected(store: Path, run_id: str) -> None:
    last = max_seq(store, run_id)
    with tamper(store) as conn:
        conn.execute(INSERT_COPY, (last + 1, "ab" * 32, run_id, last))
    assert_failed_at(verify(store), last + 1)
    problems = problems_of(store, run_id)
    assert {p.seq for p in problems} == {last + 1}
    # both what is wrong with it: its hash, and that it follows the stream's end
    assert any("after the stream's run_ended" in p.what for p in problems)


def test_forged_event_inserted_in_the_middle_is_detected(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        shift_up_from(conn, run_id, 10)
        conn.execute(INSERT_COPY, (10, "ab" * 32, run_id, 9))
    assert_failed_at(verify(store), 10)
    problems = problems_of(store, run_id)
    assert problems[0].seq == 10
    # the forged row is the newest row id: it is named, not its neighbours
    assert problems[0].event_id == max_seq(store, run_id)


# --------------------------------------------------------------------------- reordering
def test_swapped_events_are_reported_as_reordered(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        swap_seqs(conn, run_id, 4, 6)
    line = assert_failed_at(verify(store), 4, "reordered")
    assert "recorded as seq 6" in line
    problems = problems_of(store, run_id)
    assert problems[0].seq == 4
    assert problems[0].event_id == 6  # the event that was moved into position 4
    assert "moved" in problems[0].what
    # and the other half of the swap is recognised as moved too
    assert any(p.seq == 6 and "recorded as seq 4" in p.what for p in problems), [
        p.describe() for p in problems
    ]


# --------------------------------------------------------------------------- known limitation
def test_truncated_tail_is_not_detected_by_a_bare_chain(store: Path, run_id: str) -> None:
    """Known limitation, not a feature: cutting off the newest events leaves a valid chain.

    Every remaining event still links to its predecessor, and nothing inside the
    store records how long the chain was; detecting this needs signed checkpoints
    of the chain head kept outside the store (the ``checkpoints`` table of schema
    0002, not yet used by ``verify``). When checkpoints are verified this test
    should be changed to expect exit 4.
    """
    last = max_seq(store, run_id)
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=? and seq>?", (run_id, last - 3))
    result = verify(store)
    assert result.exit_code == 0
    assert f"{last - 3} events" in result.stdout and "intact" in result.stdout
