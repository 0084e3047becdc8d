"""``auditlog snapshots``: which tensors were snapshotted when, sizes and deduplication."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click
from auditlog.cli.options import format_option, run_argument, store_option
from auditlog.cli.output import emit_rows

from auditlog.reader import Run
from auditlog.runs import select_run
from auditlog.store.eventstore import EventStore

COLUMNS = ("seq", "step", "trigger", "tag", "module", "tensors", "logical_bytes", "new_bytes")


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


@click.command()
@store_option
@format_option
@run_argument
def snapshots(store: str | None, fmt: str, run: str) -> None:
    """List RUN's snapshots: when, what triggered them, bytes stored and deduplication."""
    event_store = EventStore.open(store)
    try:
        view = Run(event_store, select_run(event_store, run))
        events = list(view.events(kinds=["snapshot_taken", "construction_sealed"]))
        state = view.model_state()
        hashes = sorted(
            {t["sha256"] for e in events for t in _tensors(e)}
        )
        catalog = event_store.blob_rows(hashes)
    finally:
        event_store.close()
    names = state.module_names()
    rows: list[dict[str, Any]] = []
    stored_total = logical_total = 0
    for event in events:
        tensors = _tensors(event)
        if not tensors:
            continue
        logical = sum(int(catalog[t["sha256"]]["nbytes"]) for t in tensors if t["sha256"] in catalog)
        payload = event["payload"]
        new = int((payload.get("snapshot") or {}).get("new_bytes", logical if event["kind"] == "construction_sealed" else 0))
        logical_total += logical
        module_names = names.get(event["module_id"] or -1) or []
        rows.append(
            {
                "seq": event["seq"],
                "step": event["step"],
                "trigger": payload.get("trigger") if event["kind"] == "snapshot_taken" else "sealed",
                "tag": payload.get("tag"),
                "module": (module_names[0] or "(root)") if module_names else None,
                "tensors": len(tensors),
                "logical_bytes": logical,
                "new_bytes": new,
            }
        )
    stored_total = sum(int(r["nbytes"]) for r in catalog.values())
    if fmt != "table":
        emit_rows(iter(rows), COLUMNS, fmt)
        return

    def shown() -> Iterator[dict[str, Any]]:
        for row in rows:
            yield {**row, "logical_bytes": _human(row["logical_bytes"]), "new_bytes": _human(row["new_bytes"])}

    emit_rows(shown(), COLUMNS, fmt, title=f"snapshots of run {view.run_id[:12]}")
    ratio = logical_total / stored_total if stored_total else 0.0
    click.echo(
        f"{len(rows)} snapshots, {_human(logical_total)} of tensor values, "
        f"{_human(stored_total)} distinct content stored (dedup {ratio:.1f}x)"
    )


def _tensors(event: dict[str, Any]) -> list[dict[str, Any]]:
    payload = event["payload"]
    if event["kind"] == "snapshot_taken":
        return list((payload.get("snapshot") or {}).get("tensors", []))
    return list(payload.get("tensors", [])) if payload.get("stored") else []
