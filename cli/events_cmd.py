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
from auditlog.cli.summaries import summarize

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
        raise UsageError(
            f"bad step range {text!r}: use N, A:B, A: or :B with non-negative integers"
        )
    low = int(match.group(1)) if match.group(1) else None
    if match.group(2) is None and ":" not in text:
        return low, low
    high = int(match.group(2)) if match.group(2) else None
    if low is not None and high is not None and low > high:
        raise UsageError(f"bad step range {text!r}: start is after end")
    return low, high


@click.command()
@store_option
@format_option
@run_argument
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="KIND",
    shell_complete=complete_kinds,
    help="Only these kinds (repeatable).",
)
@click.option(
    "--module",
    "module_glob",
    default=None,
    metavar="GLOB",
    help="Only events about modules whose qualified name matches (for module_registered: "
    "the parent or the child registered).",
)
@click.option(
    "--step",
    "step_text",
    default=None,
    metavar="N|A:B",
    help="Only events at these optimizer steps.",
)
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
        found = view.events(
            kinds=list(kinds) or None, step_range=step_range, module=module_glob, check_chain=True
        )
        first = next(found, None)  # a bad filter is an error before any output
        if first is None:
            click.echo(
                f"auditlog: no event of run {view.run_id[:12]} matches these filters", err=True
            )

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

        columns = (
            (("stream", *COLUMNS) if len(streams) > 1 else COLUMNS)
            if fmt == "table"
            else JSON_COLUMNS
        )
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
    count = (
        f"{len(broken)} event shown does" if len(broken) == 1 else f"{len(broken)} events shown do"
    )
    return (
        f"{count} not match the hash chain (first: run {first['run_id'][:12]} stream {first['stream']} "
        f"seq {first['seq']}, {first['kind']}): changed after it was recorded, or the event before it "
        "deleted; marked CHAIN BROKEN (chain_ok false); run `auditlog verify`"
    )


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
            "summary": ("" if event["chain_ok"] else BROKEN)
            + summarize(event["kind"], event["payload"]),
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
