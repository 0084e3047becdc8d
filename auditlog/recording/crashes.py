"""Crashed streams become part of the record: ``run_ended(status=crashed)``, detected later.

When a new recording starts it closes the streams of this host whose process
died without closing them, so a crash is written into the record instead of
being a status only derived at read time. Each stream is judged by its own
process (host, pid and process start time from its chained ``run_started``):
the ranks of one run are different processes, and one rank's exit says
nothing about another's. The ``run_ended`` is chained in the stream's own
format (``core.chain``: fixed by its first event), so a run recorded before
chain v2 gets a v1 end.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from auditlog.core.chain import canonical_payload, chained_row
from auditlog.core.errors import PayloadLimitError
from auditlog.core.liveness import process_alive
from auditlog.core.values import iso
from auditlog.integrity.chaincheck import stream_format
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object


def stream_process(started: dict[str, Any], row: dict[str, Any] | None) -> tuple[Any, Any, Any]:
    """``(host, pid, proc_start)`` of the process that wrote a stream: from its
    ``run_started`` payload, else (older records) from the run's index row."""
    row = row or {}
    host = started.get("host", row.get("host"))
    pid = started.get("pid", row.get("pid"))
    proc_start = (
        started.get("proc_start", row.get("proc_start"))
        if "pid" in started
        else row.get("proc_start")
    )
    return host, pid, proc_start


def close_crashed_runs(store: EventStore, detected_by: str) -> list[str]:
    """Append ``run_ended(status=crashed)`` to streams of this host whose process died.

    Called when a new recording starts, so a crash becomes part of the record
    ("crashed, detected later") instead of a status only derived at read time.
    Two recorders racing to close the same stream are arbitrated by the unique
    (run, stream, seq) constraint: the loser's insert fails and is ignored.
    """
    host = socket.gethostname()
    ended = store.ended_streams()
    rows = {str(r["run_id"]): r for r in store.run_rows()}
    closed: list[str] = []
    for started in store.events_of_kind("run_started"):
        run_id, stream = started["run_id"], started["stream"]
        if not isinstance(run_id, str) or not isinstance(stream, int) or (run_id, stream) in ended:
            continue
        row = rows.get(run_id)
        try:
            payload = payload_object(started["payload"], started)
        except PayloadLimitError:
            continue  # crafted: whose process wrote it cannot be told, and a new recording must start
        stream_host, pid, proc_start = stream_process(payload, row)
        if stream_host != host or not isinstance(pid, int):
            continue
        if process_alive(pid, proc_start if isinstance(proc_start, int) else None):
            continue
        if _close(store, run_id, stream, detected_by, row):
            closed.append(run_id)
    return closed


def _close(
    store: EventStore, run_id: str, stream: int, detected_by: str, row: dict[str, Any] | None
) -> bool:
    head = store.chain_head(run_id, stream)
    chain = stream_format(store, run_id, stream)
    if head is None or chain is None:
        return False  # no first event that links: verify names it; nothing is appended to it
    seq, prev = head
    last_step = store.max_step(run_id, stream)
    last_seen = row.get("last_seen_ns") if row else None
    payload = canonical_payload(
        {
            "status": "crashed",
            "exit_code": None,
            "exception": None,
            "signal": None,
            "steps": last_step or 0,
            "detected_by": detected_by,
            "last_seen": iso(int(last_seen)) if isinstance(last_seen, int) else None,
        }
    )
    event, _encoded = chained_row(
        prev,
        run_id,
        stream,
        seq + 1,
        time.time_ns(),
        "run_ended",
        last_step,
        None,
        None,
        payload,
        chain=chain,  # the stream's own format: an older run's stream stays in its own
    )
    try:
        store.append([event], run_id, heartbeat=False)
    except Exception:
        return False
    return True
