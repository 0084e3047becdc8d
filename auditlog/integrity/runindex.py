"""The runs index against the chain: every field a reader could show, compared by name.

The ``runs`` table is an index, not evidence: runs, names, start times and the
run selectors come from the chained ``run_started`` events. The table stays for
liveness (``last_seen_ns``, ``proc_start``: is the recording process still
alive?), which no chain can say. Its copies of chained facts (name, host, pid,
start) must agree with ``run_started``; an edit is reported by field.
"""

from __future__ import annotations

from typing import Any

from auditlog.integrity.report import Problem, VerifyReport
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object

# The index row is written just before the run_started event is emitted; a start
# further from it than this was moved.
START_SLACK_NS = 60 * 10**9


def index_mismatches(row: dict[str, Any], started: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, index value, chained value)`` for every field where the index row disagrees."""
    payload = payload_object(started.get("payload"))
    found: list[tuple[str, Any, Any]] = []
    for column in ("name", "host", "pid"):
        if row.get(column) != payload.get(column):
            found.append((column, row.get(column), payload.get(column)))
    start, chained = row.get("started_ns"), started.get("ts_ns")
    if not isinstance(start, int) or not isinstance(chained, int) or not 0 <= chained - start <= START_SLACK_NS:
        found.append(("started_ns", start, chained))
    return found


def verify_run_index(store: EventStore, run_id: str, report: VerifyReport) -> None:
    """Report a run whose index row is missing or disagrees with its chained ``run_started``."""
    row = store.run_row(run_id)
    if row is None:
        report.problems.append(Problem(
            run_id, 0, 1, None, None, "run has events but its row in the runs index was deleted"))
        return
    started = store.run_started_event(run_id)
    if started is None:
        return  # no run_started at all: the chain check reports the stream's first event
    stream_value = started.get("stream")
    stream = stream_value if isinstance(stream_value, int) else 0
    for column, indexed, chained in index_mismatches(row, started):
        report.problems.append(Problem(
            run_id, stream, 1, started.get("id"), "run_started",
            f"runs index row differs from the chained run_started: {column} is {indexed!r} in the "
            f"index, {chained!r} in the record (the index was edited)"))
