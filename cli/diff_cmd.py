"""``auditlog diff``: what differs between two runs, as a colored summary or JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from auditlog.cli.options import format_option, store_option
from auditlog.cli.output import console
from auditlog.cli.progress import progress_bar
from rich.markup import escape

from auditlog.diff import Change, RunDiff, RunSide, diff_runs
from auditlog.errors import UsageError
from auditlog.naming import short_class
from auditlog.runs import select_run
from auditlog.store.eventstore import EventStore

SYMBOLS = {
    "added": ("+", "green"),
    "removed": ("-", "red"),
    "changed": ("~", "yellow"),
    "renamed": ("→", "cyan"),
}
TITLES = {
    "code": "Code version",
    "modules": "Modules",
    "parameters": "Parameters",
    "buffers": "Buffers",
    "hyperparameters": "Hyperparameters",
    "metadata": "Run metadata",
}


@click.command()
@store_option
@format_option
@click.argument("run_a", default="latest~1", metavar="RUN_A")
@click.argument("run_b", default="latest", metavar="RUN_B")
def diff(store: str | None, fmt: str, run_a: str, run_b: str) -> None:
    """How RUN_B differs from RUN_A (default: the last two runs).

    Construction (modules, parameters, buffers: added, removed, renamed, changed
    class, shape, dtype, requires_grad, initial values, source line),
    hyperparameters, code version (git commit, dirty) and run metadata.
    """
    if fmt == "csv":
        raise UsageError("diff has no CSV form; use --format table or json")
    event_store = EventStore.open(store)
    try:
        id_a, id_b = select_run(event_store, run_a), select_run(event_store, run_b)
        with progress_bar("reading runs") as progress:
            result = diff_runs(event_store, id_a, id_b, progress)
    finally:
        event_store.close()
    if fmt == "json":
        sys.stdout.write(json.dumps(result.as_dict(), ensure_ascii=False, indent=2, default=str) + "\n")
        return
    render(result)


# --------------------------------------------------------------------------- rendering
def render(result: RunDiff) -> None:
    """The human summary: both runs, then each section's differences, then a total."""
    out = console()
    for letter, side in (("A", result.a), ("B", result.b)):
        out.print(f"[bold]run {letter}[/bold]  {escape(_side(side))}", highlight=False)
    out.print()
    for section, title in TITLES.items():
        changes = result.section(section)
        if section == "code":
            _render_code(out, result, changes)
            continue
        if not changes:
            out.print(f"[bold]{title}[/bold]  [dim]no differences[/dim]", highlight=False)
            continue
        out.print(f"[bold]{title}[/bold]  {escape(_counts(changes))}", highlight=False)
        for line in _lines(section, changes):
            out.print("  " + line, highlight=False)
    if result.init_values_differ:
        shown = ", ".join(result.init_values_differ[:8])
        more = len(result.init_values_differ) - 8
        out.print(
            f"[bold]Initial values[/bold]  {len(result.init_values_differ)} tensors were drawn again from "
            f"the same distribution (the random generator was consumed differently): "
            f"{escape(shown)}{f' and {more} more' if more > 0 else ''}",
            highlight=False,
        )
    out.print()
    out.print("[bold]no differences[/bold]" if result.identical else f"[bold]{escape(_summary(result))}[/bold]")


def _side(side: RunSide) -> str:
    git = side.git or {}
    commit = git.get("commit")
    parts = [side.run_id[:12]]
    if side.name:
        parts.append(repr(side.name))
    if side.started:
        parts.append(side.started)
    if commit:
        parts.append(f"commit {commit[:10]}" + ("+dirty" if git.get("dirty") else ""))
    else:
        parts.append("no git commit")
    return "  ".join(parts)


def _render_code(out: Any, result: RunDiff, changes: list[Change]) -> None:
    git_a = result.a.git or {}
    if not changes:
        commit = git_a.get("commit")
        same = f"same commit {commit[:10]}" if commit else "no git commit on either side"
        out.print(f"[bold]{TITLES['code']}[/bold]  [dim]{escape(same)}[/dim]", highlight=False)
        return
    out.print(f"[bold]{TITLES['code']}[/bold]", highlight=False)
    for change in changes:
        width = max(len(key) for key in change.fields)
        for key, (a, b) in change.fields.items():
            out.print(
                f"  [yellow]~ {escape(key.ljust(width))}[/yellow]  {escape(_value(key, a))} → {escape(_value(key, b))}",
                highlight=False,
            )


def _counts(changes: list[Change]) -> str:
    tally: dict[str, int] = {}
    for change in changes:
        tally[change.change] = tally.get(change.change, 0) + 1
    return "(" + ", ".join(f"{n} {kind}" for kind, n in tally.items()) + ")"


def _summary(result: RunDiff) -> str:
    parts = []
    for section in TITLES:
        changes = result.section(section)
        if not changes:
            continue
        if section == "code":
            parts.append("code version differs")
            continue
        tally: dict[str, int] = {}
        for change in changes:
            tally[change.change] = tally.get(change.change, 0) + 1
        noun = section if section != "metadata" else "metadata fields"
        parts.append(f"{noun}: " + ", ".join(f"{n} {kind}" for kind, n in tally.items()))
    if result.init_values_differ:
        parts.append(f"{len(result.init_values_differ)} initial values redrawn")
    return "; ".join(parts)


def _lines(section: str, changes: list[Change]) -> list[str]:
    """One markup line per change; descendants of added/removed modules fold into their ancestor."""
    folded = _folded(changes)
    lines = []
    width = max((len(c.new_name or c.name) for c in changes), default=0)
    width = min(width, 40)
    for change in changes:
        if change.name in folded:
            continue
        symbol, color = SYMBOLS[change.change]
        if change.change == "renamed":
            name = f"{change.name} → {change.new_name}"
        else:
            name = change.name
        detail = _detail(section, change)
        lines.append(f"[{color}]{symbol} {escape(name.ljust(width))}[/{color}]  {escape(detail)}")
    return lines


def _folded(changes: list[Change]) -> set[str]:
    """Names of added/removed items whose module is itself added/removed (shown on that line)."""
    top = {c.name for c in changes if c.change in ("added", "removed")}
    folded = set()
    for change in changes:
        if change.change not in ("added", "removed"):
            continue
        if any(change.name.startswith(other + ".") for other in top if other != change.name):
            folded.add(change.name)
    return folded


def _detail(section: str, change: Change) -> str:
    item = change.b if change.change == "added" else change.a
    if change.change in ("added", "removed"):
        item = item or {}
        if section == "modules":
            return f"{short_class(item.get('class'))}  {item.get('source') or ''}".rstrip()
        if section in ("parameters", "buffers"):
            return f"{_value('shape', item.get('shape'))} {item.get('dtype')}  {item.get('source') or ''}".rstrip()
        if section == "hyperparameters":
            return short_class(item.get("class"))
        return ""
    parts = [f"{key} {_value(key, a)} → {_value(key, b)}" for key, (a, b) in change.fields.items()]
    if change.change == "renamed" and not parts:
        item = change.b or {}
        return f"{short_class(item.get('class'))}  {item.get('source') or ''}  same class, contents and source".rstrip()
    return "; ".join(parts)


def _value(key: str, value: Any) -> str:
    if key == "init" and isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_short(value.get(k))}" for k in ("mean", "std", "min", "max")) + "}"
    if key == "class":
        return short_class(value) if isinstance(value, str) else _short(value)
    if key in ("commit", "diff_sha256") and isinstance(value, str):
        return value[:10]
    return _short(value)


def _short(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)
