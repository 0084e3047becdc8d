"""The runs index against the chain: every field a reader could show, compared by name.

The ``runs`` table is an index, not evidence: runs, names, start times and the
run selectors come from the chained ``run_started`` events. The table stays for
liveness (``last_seen_ns``, ``proc_start``: is the recording process still
alive?), which no chain can say. Its copies of chained facts (name, host, pid,
start) must agree with ``run_started``; an edit is reported by field.
"""

from __future__ import annotations

from typing import Any

from auditlog.core.payloadlimits import past_limits
from auditlog.integrity.findings import Problem, VerifyReport
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object

# The index row is written just before the run_started event is emitted; a start
# further from it than this was moved.
START_SLACK_NS = 60 * 10**9


def index_mismatches(
    row: dict[str, Any], started: list[dict[str, Any]], chained_name: str | None
) -> list[tuple[str, Any, Any]]:
    """``(field, index value, chained value)`` for every field where the index row disagrees.

    ``started``: the run's ``run_started`` events, lowest stream first. The
    index row is written by whichever process of the run opened the store first
    (any rank), so its host, pid and start must be those of one of them; its
    name is the run's chained name (``run_started``, or the ``auditlog.record``
    annotation of a script's own ``record(name=...)`` joining ``auditlog run``).
    """
    found: list[tuple[str, Any, Any]] = []
    if row.get("name") != chained_name:
        found.append(("name", row.get("name"), chained_name))
    creators = [
        s for s in started if _same_process(row, payload_object(s.get("payload"), s, strict=False))
    ]
    if not creators:
        first = payload_object(started[0].get("payload"), started[0], strict=False)
        for column in ("host", "pid"):
            if row.get(column) != first.get(column):
                found.append((column, row.get(column), first.get(column)))
        creators = started[:1]
    start, chained = row.get("started_ns"), creators[0].get("ts_ns")
    if (
        not isinstance(start, int)
        or not isinstance(chained, int)
        or not 0 <= chained - start <= START_SLACK_NS
    ):
        found.append(("started_ns", start, chained))
    return found


def _same_process(row: dict[str, Any], payload: dict[str, Any]) -> bool:
    return row.get("host") == payload.get("host") and row.get("pid") == payload.get("pid")


def chained_name(store: EventStore, run_id: str, started: list[dict[str, Any]]) -> str | None:
    """The run's name as the chain says it (see ``index_mismatches``)."""
    for event in started:
        name = payload_object(event.get("payload"), event, strict=False).get("name")
        if isinstance(name, str):
            return name
    for event in store.iter_events(run_id, kinds=["annotation"]):
        payload = payload_object(event.get("payload"), event, strict=False)
        fields = payload.get("fields")
        if (
            payload.get("key") == "auditlog.record"
            and isinstance(fields, dict)
            and isinstance(fields.get("name"), str)
        ):
            return str(fields["name"])
    return None


def verify_run_index(store: EventStore, run_id: str, report: VerifyReport) -> None:
    """Report a run whose index row is missing or disagrees with its chained ``run_started``."""
    row = store.run_row(run_id)
    if row is None:
        report.problems.append(
            Problem(
                run_id, 0, 1, None, None, "run has events but its row in the runs index was deleted"
            )
        )
        return
    # One whose payload is past the limits or no JSON object: the chain check names it.
    started = [
        e
        for e in store.iter_events(run_id, kinds=["run_started"], rare=True)
        if isinstance(e.get("stream"), int)
        and past_limits(e.get("payload")) is None
        and payload_object(e.get("payload"), strict=False)
    ]
    if not started:
        return  # no (readable) run_started at all: the chain check reports the stream's first event
    first = started[0]
    stream = int(first["stream"])
    for column, indexed, chained in index_mismatches(
        row, started, chained_name(store, run_id, started)
    ):
        report.problems.append(
            Problem(
                run_id,
                stream,
                1,
                first.get("id"),
                "run_started",
                f"runs index row differs from the chained run_started: {column} is {indexed!r} in the "
                f"index, {chained!r} in the record (the index was edited)",
            )
        )
