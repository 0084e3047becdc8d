"""How ``auditlog diff`` draws a ``RunDiff``: both runs, each section's changes, a total.

Imported only when a diff is drawn (rich and the diff types are not needed to
start the CLI). Nothing is Rich markup: lines are assembled from ``Text`` pieces,
so names and arguments (``[/x]``, a trailing backslash) are shown as they are.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.text import Text

from auditlog.core.naming import short_class
from auditlog.present.text import one_line
from auditlog.read.diff import Change, RunDiff, RunSide
from auditlog.read.diff_values import ValuesDiff

if TYPE_CHECKING:
    from rich.console import Console

SYMBOLS = {
    "added": ("+", "green"),
    "removed": ("-", "red"),
    "changed": ("~", "yellow"),
    "renamed": ("→", "cyan"),
    "moved": ("↕", "blue"),
}
TITLES = {
    "code": "Code version",
    "modules": "Modules",
    "parameters": "Parameters",
    "buffers": "Buffers",
    "hyperparameters": "Hyperparameters",
    "data": "Data",
    "metadata": "Run metadata",
}

Piece = str | tuple[str, str] | Text


def line(*pieces: Piece) -> Text:
    """One output line from plain strings and ``(text, style)`` pairs; never parsed as markup,
    its control characters (newlines too) escaped (``present.text``)."""
    return one_line(*pieces)


def diff_text(result: RunDiff, values: ValuesDiff | None = None, width: int = 100) -> str:
    """The diff as ``auditlog diff`` prints it to a pipe: plain text, no colour."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    render(result, values, Console(file=buffer, width=width, color_system=None, soft_wrap=False))
    return buffer.getvalue()


def render(result: RunDiff, values: ValuesDiff | None, out: Console) -> None:
    """The human summary on ``out``: both runs, then each section's differences, then a total."""
    for letter, side in (("A", result.a), ("B", result.b)):
        out.print(line((f"run {letter}", "bold"), "  ", _side(side)), highlight=False)
    out.print()
    for section, title in TITLES.items():
        changes = result.section(section)
        if section == "code":
            _render_code(out, result, changes)
            continue
        if not changes:
            out.print(line((title, "bold"), "  ", ("no differences", "dim")), highlight=False)
            continue
        out.print(line((title, "bold"), "  ", _counts(changes)), highlight=False)
        for shown_line in _lines(section, changes):
            out.print(line("  ", shown_line), highlight=False)
    if result.init_values_differ:
        count = len(result.init_values_differ)
        shown = ", ".join(result.init_values_differ[:8])
        more = count - 8
        out.print(
            line(
                ("Initial values", "bold"),
                f"  {_plural(count, 'tensor')} {'was' if count == 1 else 'were'} drawn again from "
                "the same distribution (the random generator was consumed differently): "
                f"{shown}{f' and {more} more' if more > 0 else ''}",
            ),
            highlight=False,
        )
    if values is not None:
        _render_values(out, values)
    out.print()
    summary = _summary(result)
    if values is not None and values.first is not None:
        first = values.first
        summary = "; ".join(
            p for p in (summary, f"values diverge at step {first.step} ({first.tensor})") if p
        )
    out.print(line((summary or "no differences", "bold")), highlight=False)


def _steps(steps: list[int]) -> str:
    """``0, 1, 2, 3, 7`` as ``0-3, 7``."""
    if not steps:
        return "none"
    runs: list[tuple[int, int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], step)
        else:
            runs.append((step, step))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _render_values(out: Any, values: ValuesDiff) -> None:
    """The Values section: which steps were compared, and the first divergence."""
    how = "bitwise" if values.mode == "bitwise" else f"atol {values.atol:g}, rtol {values.rtol:g}"
    out.print(
        line(
            ("Values", "bold"),
            f"  ({how}) compared steps {_steps(values.steps_compared)}: "
            f"{_plural(values.compared, 'tensor value')}, {values.equal_hashes} equal by hash",
        ),
        highlight=False,
    )
    if values.steps_only_a or values.steps_only_b:
        text = (
            f"not compared: steps only in run A {_steps(values.steps_only_a)}; "
            f"only in run B {_steps(values.steps_only_b)}"
        )
        out.print(line("  ", (text, "dim")), highlight=False)
    if values.tensors_only_a or values.tensors_only_b:
        text = (
            f"tensors only in run A: {', '.join(values.tensors_only_a) or 'none'}; "
            f"only in run B: {', '.join(values.tensors_only_b) or 'none'}"
        )
        out.print(line("  ", (text, "dim")), highlight=False)
    first = values.first
    if first is None:
        verdict = (
            "no value differences"
            if values.steps_compared
            else "no step was snapshotted by both runs"
        )
        out.print(line("  ", (verdict, "dim")), highlight=False)
        return
    named = first.tensor if first.a.name == first.b.name else f"{first.a.name} → {first.b.name}"
    out.print(
        line("  ", (f"~ first divergence: step {first.step}, {named}", "yellow")), highlight=False
    )
    if first.reason != "values":
        text = f"    {first.reason} {_short(getattr(first.a, first.reason))} → {_short(getattr(first.b, first.reason))}"
        out.print(line(text), highlight=False)
    for letter, side in (("A", first.a), ("B", first.b)):
        out.print(
            line(
                f"    run {letter}: norm {_short(side.norm)}  mean {_short(side.mean)}  sha256 {side.sha256[:12]}"
            ),
            highlight=False,
        )
    if first.max_abs_diff is not None:
        out.print(line(f"    max |a-b| {_short(first.max_abs_diff)}"), highlight=False)


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
        out.print(line((TITLES["code"], "bold"), "  ", (same, "dim")), highlight=False)
        return
    out.print(line((TITLES["code"], "bold")), highlight=False)
    for change in changes:
        width = max(len(key) for key in change.fields)
        for key, (a, b) in change.fields.items():
            out.print(
                line(
                    "  ",
                    (f"~ {key.ljust(width)}", "yellow"),
                    f"  {_value(key, a)} → {_value(key, b)}",
                ),
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


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _lines(section: str, changes: list[Change]) -> list[Text]:
    """One line per change; descendants of added/removed modules fold into their ancestor."""
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
        lines.append(
            line((f"{symbol} {name.ljust(width)}", color), f"  {detail}" if detail else "")
        )
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
    parts = [
        f"files changed: {b}"
        if section == "data" and key == "files"
        else f"{key + ' ' if key != change.name else ''}{_value(key, a)} → {_value(key, b)}"
        for key, (a, b) in change.fields.items()
    ]
    if change.change == "renamed" and not parts:
        item = change.b or {}
        return f"{short_class(item.get('class'))}  {item.get('source') or ''}  same class, contents and source".rstrip()
    return "; ".join(parts)


def _value(key: str, value: Any) -> str:
    if key == "init" and isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{k} {_short(value.get(k))}" for k in ("mean", "std", "min", "max"))
            + "}"
        )
    if key == "class":
        return short_class(value) if isinstance(value, str) else _short(value)
    if key in ("commit", "diff_sha256") and isinstance(value, str):
        return value[:10]
    if key == "fingerprint" and isinstance(value, str):
        return value[:16]
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
