"""Crashed runs become part of the record: ``run_ended(status=crashed)``, detected later.

When a new recording starts it closes the streams of this host whose process
died without closing them, so a crash is written into the record instead of
being a status only derived at read time.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from auditlog.core.chain import canonical_payload, chained_row
from auditlog.core.liveness import process_alive
from auditlog.core.values import iso
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object


def _index_matches_chain(store: EventStore, row: dict[str, Any]) -> bool:
    """Does the index row name the process the chained ``run_started`` does (host and pid)?"""
    started = store.run_started_event(str(row["run_id"]))
    payload = payload_object(started.get("payload")) if started else {}
    return payload.get("host") == row.get("host") and payload.get("pid") == row.get("pid")


def close_crashed_runs(store: EventStore, detected_by: str) -> list[str]:
    """Append ``run_ended(status=crashed)`` to streams of this host whose process died.

    Called when a new recording starts, so a crash becomes part of the record
    ("crashed, detected later") instead of a status only derived at read time.
    Two recorders racing to close the same stream are arbitrated by the unique
    (run, stream, seq) constraint: the loser's insert fails and is ignored.
    """
    host = socket.gethostname()
    ended = store.ended_streams()
    closed: list[str] = []
    for row in store.run_rows():
        if row["host"] != host or process_alive(int(row["pid"]), row.get("proc_start")):
            continue
        if not _index_matches_chain(store, row):
            continue  # an edited index row (say, a live run's pid) must not end a run
        for stream in store.streams(row["run_id"]):
            if (row["run_id"], stream) in ended:
                continue
            head = store.chain_head(row["run_id"], stream)
            if head is None:
                continue
            seq, prev = head
            last_step = store.max_step(row["run_id"], stream)
            payload = canonical_payload(
                {
                    "status": "crashed",
                    "exit_code": None,
                    "exception": None,
                    "signal": None,
                    "steps": last_step or 0,
                    "detected_by": detected_by,
                    "last_seen": iso(int(row["last_seen_ns"])),
                }
            )
            event, _encoded = chained_row(
                prev, row["run_id"], stream, seq + 1, time.time_ns(), "run_ended", last_step, None, None, payload
            )
            try:
                store.append([event], row["run_id"], heartbeat=False)
            except Exception:
                continue
            closed.append(row["run_id"])
    return closed
