"""The snapshots of a run as ``auditlog snapshots`` and the UI list them.

Naming each snapshot's module needs the run's labels: a replay of every
construction event (``Run.labels``), the larger part of the answer on a model
of thousands of modules. A long-lived reader (``auditlog ui``) asks again and
again about a run that has not changed, so the labels are kept per process for
a few runs, keyed by the stream's last event (its seq and stored hash): a new
event, or a rewritten last one, asks again. The labels only name things; what
the record proves is ``verify``'s, which keeps nothing.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

from auditlog.core.hashing import hash_text
from auditlog.core.naming import Labels

if TYPE_CHECKING:
    from auditlog.read.run import Run

LABELS_KEPT = 8  # runs whose labels a process keeps
_kept: collections.OrderedDict[tuple[Any, ...], Labels] = collections.OrderedDict()
_lock = threading.Lock()


def run_labels(run: Run) -> Labels:
    """``run.labels()``, kept while the run's stream ends at the same event."""
    store, stream = run.store, run.stream
    last = store.last_seq(run.run_id, stream)
    head = (
        store.hashes_between(run.run_id, stream, last, last).get(last) if last is not None else None
    )
    key = (store.location.display(), run.run_id, stream, last, head)
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
            return found
    labels = run.labels()
    with _lock:
        _kept[key] = labels
        while len(_kept) > LABELS_KEPT:
            _kept.popitem(last=False)
    return labels


def snapshot_rows(run: Run) -> tuple[list[dict[str, Any]], int]:
    """``Run.snapshots``: the rows and the distinct bytes stored."""
    events = list(run.events(kinds=["snapshot_taken", "construction_sealed"]))
    labels = run_labels(run)
    catalog = run.store.blob_rows(
        sorted({t["sha256"] for e in events for t in _snapshot_tensors(e)})
    )
    rows: list[dict[str, Any]] = []
    for event in events:
        tensors = _snapshot_tensors(event)
        if not tensors:
            continue
        logical = sum(
            int(catalog[t["sha256"]]["nbytes"]) for t in tensors if t["sha256"] in catalog
        )
        payload = event["payload"]
        sealed = event["kind"] == "construction_sealed"
        new = int((payload.get("snapshot") or {}).get("new_bytes", logical if sealed else 0))
        rows.append(
            {
                "seq": event["seq"],
                "step": event["step"],
                "trigger": "sealed" if sealed else payload.get("trigger"),
                "tag": payload.get("tag"),
                "module": _snapshot_owner(event["module_id"], tensors, labels),
                "tensors": len(tensors),
                "logical_bytes": logical,
                "new_bytes": new,
                "write_s": (payload.get("snapshot") or {}).get("write_s"),
                "behind": int((payload.get("overrun") or {}).get("behind", 0)),
            }
        )
    return rows, sum(int(r["nbytes"]) for r in catalog.values())


def _snapshot_owner(
    module_id: int | None, tensors: list[dict[str, Any]], labels: Labels
) -> str | None:
    """The module a snapshot is of; for a seal at an optimizer step (no module of its
    own), the root(s) its tensors belong to."""
    if module_id is not None:
        return labels.module_label(module_id)
    roots = {
        labels.modules[found.module_id].root
        for found in (labels.tensors.get(int(t.get("tensor_id") or -1)) for t in tensors)
        if found is not None and found.module_id in labels.modules
    }
    return ", ".join(sorted(roots)) or None


def _snapshot_tensors(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The tensors a snapshot or stored seal lists, each ``sha256`` as text (``hash_text``:
    an edited event's object or list stays printable and is never looked up as a hash)."""
    payload = event["payload"]
    if event["kind"] == "snapshot_taken":
        items = (payload.get("snapshot") or {}).get("tensors", [])
    else:
        items = payload.get("tensors", []) if payload.get("stored") else []
    return [{**t, "sha256": hash_text(t.get("sha256"))} for t in items if isinstance(t, dict)]
