"""``auditlog events``: the events of one run, filtered, with names from replay."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
from auditlog.cli.complete import complete_kinds
from auditlog.cli.options import format_option, rank_option, run_argument, store_option
from auditlog.cli.output import emit_rows

from auditlog.core.errors import IntegrityError, UsageError
from auditlog.core.eventrow import output_columns
from auditlog.core.kinds import KINDS
from auditlog.core.values import iso

if TYPE_CHECKING:
    from auditlog.core.naming import Labels

COLUMNS = ("seq", "step", "kind", "module", "tensor", "summary")
TABLE_ROWS = 1000
_RANGE = re.compile(r"^\s*(\d*)\s*(?::\s*(\d*)\s*)?$")


def parse_step_range(text: str | None) -> tuple[int | None, int | None] | None:
    """``5`` -> (5, 5); ``3:7`` -> (3, 7); ``:7`` / ``3:`` open-ended."""
    if text is None:
        return None
    match = _RANGE.match(text)
    if not match or (match.group(2) is None and not match.group(1)):
        raise UsageError(f"bad step range {text!r}: use N, A:B, A: or :B with non-negative integers")
    low = int(match.group(1)) if match.group(1) else None
    if match.group(2) is None and ":" not in text:
        return low, low
    high = int(match.group(2)) if match.group(2) else None
    if low is not None and high is not None and low > high:
        raise UsageError(f"bad step range {text!r}: start is after end")
    return low, high


def summarize(kind: str, p: dict[str, Any]) -> str:
    """One human line per event."""
    if kind == "module_registered":
        return f"{p.get('name')} = {(p.get('child_class') or 'None').rsplit('.', 1)[-1]}"
    if kind in ("parameter_registered", "buffer_registered"):
        return f"{p.get('name')} {p.get('shape')} {p.get('dtype')}"
    if kind == "construction_sealed":
        return f"{len(p.get('tensors', []))} tensors sealed ({p.get('trigger')})"
    if kind == "activity":
        forward = p.get("forward") or []
        backward = p.get("backward") or []
        nonfinite = sum(
            1
            for call in forward + backward
            for stats in (call.get("outputs") or []) + (call.get("grad_outputs") or []) + (call.get("grad_inputs") or [])
            if stats and (stats.get("nan") or stats.get("inf"))
        )
        return f"{len(forward)} forward, {len(backward)} backward calls" + (
            f"; {nonfinite} tensors with NaN/Inf" if nonfinite else ""
        )
    if kind == "optimizer_step":
        groups = p.get("param_groups") or [{}]
        lr = groups[0].get("lr")
        norms = [n for n in p.get("grad_norm") or [] if isinstance(n, (int, float))]
        total = sum(n * n for n in norms) ** 0.5
        return f"{(p.get('optimizer_class') or '').rsplit('.', 1)[-1]} lr={_num(lr)} grad_norm={_num(total)}"
    if kind == "run_started":
        return " ".join(p.get("argv") or [])[:80]
    if kind == "run_ended":
        exc = p.get("exception") or {}
        code = p.get("exit_code")
        head = f"{p.get('status')} exit={code}" if code is not None else f"{p.get('status')} (exit code unknown)"
        if p.get("detected_by"):
            head += f", detected by run {str(p['detected_by'])[:12]}"
        if exc:
            head += f" {exc.get('type')}" + (f": {exc.get('message')}" if exc.get("message") else "")
        return head
    if kind == "snapshot_taken":
        snap = p.get("snapshot") or {}
        return f"{p.get('trigger')}{' ' + repr(p['tag']) if p.get('tag') else ''}: {len(snap.get('tensors', []))} tensors, {snap.get('new_bytes', 0)} new bytes"
    if kind == "structure_changed":
        if p.get("change") == "removed":
            return f"{p.get('member')} {p.get('name')!r} removed (found at {p.get('detected_at')})"
        return f"{p.get('member')} {p.get('name')!r}: {p.get('before')} -> {p.get('after')}"
    if kind == "annotation":
        return f"{p.get('key')}: {p.get('fields')}"
    if kind == "recorder_error":
        return f"{p.get('where')}: {p.get('type')}: {p.get('message')}"
    return ""


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


@click.command()
@store_option
@format_option
@run_argument
@click.option(
    "--kind", "kinds", multiple=True, metavar="KIND", shell_complete=complete_kinds, help="Only these kinds (repeatable)."
)
@click.option(
    "--module",
    "module_glob",
    default=None,
    metavar="GLOB",
    help="Only events about modules whose qualified name matches (for module_registered: "
    "the parent or the child registered).",
)
@click.option("--step", "step_text", default=None, metavar="N|A:B", help="Only events at these optimizer steps.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N events.")
@rank_option
def events(
    store: str | None,
    fmt: str,
    run: str,
    kinds: tuple[str, ...],
    module_glob: str | None,
    step_text: str | None,
    limit: int | None,
    rank: int | None,
) -> None:
    """Show the events of RUN (default: latest); a multi-rank run's streams one after the other.

    Modules and tensors are named as in `auditlog query` and `auditlog diff`.
    A --step beyond the run, or a --module glob that names no module, is an
    error; filters that match no event say so on stderr.

    Each event shown is checked against the hash chain: one that does not
    match (edited after it was recorded, or the event before it deleted) is
    marked CHAIN BROKEN (JSON and CSV: chain_ok false), one line on stderr
    names the first, and the exit code is 4. A payload past the size or depth
    limit is refused by name (exit 4). `auditlog verify` checks the whole run.
    """
    from auditlog.read.api import open_store

    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise UsageError(f"unknown event kind {unknown[0]!r}; known kinds: {', '.join(KINDS)}")
    step_range = parse_step_range(step_text)
    with open_store(store) as opened:
        view = opened.run(run, rank)
        streams = view.rank_streams()
        # Names for every stream shown (ids are per process: each rank numbered its own).
        labels = {stream: view.labels(stream) for stream in streams}
        found = view.events(kinds=list(kinds) or None, step_range=step_range, module=module_glob, check_chain=True)
        first = next(found, None)  # a bad filter is an error before any output
        if first is None:
            click.echo(f"auditlog: no event of run {view.run_id[:12]} matches these filters", err=True)

        broken: list[dict[str, Any]] = []

        def rows() -> Iterator[dict[str, Any]]:
            if first is None:
                return
            try:
                for shown, event in enumerate(itertools.chain([first], found)):
                    if limit is not None and shown >= limit:
                        return
                    stream = event["stream"]
                    if stream not in labels:
                        labels[stream] = view.labels(stream)
                    if not event["chain_ok"]:
                        broken.append(event)
                    yield _row(event, fmt, labels[stream])
            finally:
                found.close()  # type: ignore[attr-defined]  # release the cursor (and SQLite's -wal/-shm)

        columns = (("stream", *COLUMNS) if len(streams) > 1 else COLUMNS) if fmt == "table" else JSON_COLUMNS
        emit_rows(
            rows(),
            columns,
            fmt,
            cap=None if limit is not None else TABLE_ROWS,
            more_hint=" (--limit N, --kind, --step or --module to choose; --format csv or json streams every event)",
        )
        if broken:
            raise IntegrityError(_broken_line(broken))


def _broken_line(broken: list[dict[str, Any]]) -> str:
    """The one stderr line about events shown that do not match the chain."""
    first = broken[0]
    count = f"{len(broken)} event shown does" if len(broken) == 1 else f"{len(broken)} events shown do"
    return (f"{count} not match the hash chain (first: run {first['run_id'][:12]} stream {first['stream']} "
            f"seq {first['seq']}, {first['kind']}): changed after it was recorded, or the event before it "
            "deleted; marked CHAIN BROKEN (chain_ok false); run `auditlog verify`")


JSON_COLUMNS = output_columns()  # the stored row, as core.eventrow defines it, with names
BROKEN = "CHAIN BROKEN: "


def _row(event: dict[str, Any], fmt: str, labels: Labels) -> dict[str, Any]:
    module_id, tensor_id = event["module_id"], event["tensor_id"]
    module = _module_label(module_id, labels)
    tensor = _tensor_label(tensor_id, labels)
    if fmt == "table":
        return {
            "stream": event["stream"],
            "seq": event["seq"],
            "step": event["step"],
            "kind": event["kind"],
            "module": module,
            "tensor": tensor,
            "summary": ("" if event["chain_ok"] else BROKEN) + summarize(event["kind"], event["payload"]),
        }
    shown = {"time": iso(event["ts_ns"]), "module": module, "tensor": tensor}
    return {name: shown[name] if name in shown else event[name] for name in JSON_COLUMNS}


def _module_label(module_id: int | None, labels: Labels) -> str | None:
    if module_id is None:
        return None
    found = labels.modules.get(module_id)
    return found.label if found is not None else f"#{module_id}"


def _tensor_label(tensor_id: int | None, labels: Labels) -> str | None:
    if tensor_id is None:
        return None
    found = labels.tensors.get(tensor_id)
    return found.label if found is not None else f"#{tensor_id}"
