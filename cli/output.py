"""Render rows as a rich table (terminals), JSON or CSV (machines).

JSON output is a list of objects whose keys are documented in docs/cli.md; CSV
has the same columns as the table with nested values JSON-encoded. Every value
is shown literally: a run name or module name such as ``[red]x`` is data, never
Rich markup, and its control characters are escaped (``cli.inert``: a table
cell is one line, so a stored newline shows as ``\x0a``). A table cell shows at
most ``cli.inert.SHOWN_CHARS`` characters and says how long the rest is: rich folds a
cell into lines at a cost that grows faster than its length (a 4 MiB payload
summary took minutes), and no one reads a cell of a thousand lines; JSON and CSV
write every value whole. Rich is imported only when a table is drawn (the CLI
starts fast), and not even then into a pipe when the table is simple
(``cli.plaintable``: the same bytes, without rich's cost per cell; on a
terminal too, with rich's console deciding width and bold).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click
from auditlog.cli.inert import inert_console, raw

from auditlog.present.text import fit, inert

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 200  # the console's width when it is not a terminal


def emit_rows(
    rows: Iterable[dict[str, Any]],
    columns: Sequence[str],
    fmt: str,
    title: str | None = None,
    cap: int | None = None,
    more_hint: str = "",
) -> int:
    """Write ``rows`` in ``fmt``; returns how many were written.

    JSON and CSV stream every row. A table has to see all its rows before it
    can size its columns, so with ``cap`` it shows at most that many and says
    on stderr that more were left out (``more_hint`` says how to see them).
    """
    count = 0
    if fmt == "json":
        out = sys.stdout
        out.write("[")
        for row in rows:
            out.write(
                ("," if count else "") + "\n  " + json.dumps(row, ensure_ascii=False, default=str)
            )
            count += 1
        out.write("\n]\n" if count else "]\n")
        return count
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in columns])
            count += 1
        return count
    more = False
    cells: list[list[str]] = []
    for row in rows:
        if cap is not None and count >= cap:
            more = True
            break
        cells.append([inert(fit(_cell(row.get(c)))) for c in columns])
        count += 1
    heads = [inert(c) for c in columns]
    shown = None if title is None else inert(title)
    plain = _plain_lines(shown, heads, cells)
    if plain is not None:
        raw(sys.stdout).write("".join(line + "\n" for line in plain))
    else:
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=None if shown is None else Text(shown), show_lines=False, header_style="bold"
        )
        for column in heads:
            table.add_column(Text(column), overflow="fold")
        for values in cells:
            table.add_row(*(Text(v) for v in values))
        console().print(table)
    if more:
        sys.stderr.write(
            f"auditlog: showing the first {count} rows; more were left out{more_hint}\n"
        )
    return count


# Environment variables that make rich style its output even into a pipe.
_STYLED_ANYWAY = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def _plain_lines(title: str | None, columns: list[str], cells: list[list[str]]) -> list[str] | None:
    """The table's lines drawn without rich's layout (``cli.plaintable``), as rich would
    draw them; None where rich must. Into a pipe (UTF-8, no variable that forces
    styles) rich is not even imported; on a terminal its console says how wide and
    whether the header is bold."""
    import os

    from auditlog.cli.plaintable import plain_table

    out = raw(sys.stdout)
    if not str(getattr(out, "encoding", None) or "utf-8").lower().startswith("utf"):
        return None
    if not out.isatty() and not any(os.environ.get(name) for name in _STYLED_ANYWAY):
        return plain_table(title, columns, cells, PIPE_WIDTH)
    drawn = console()
    if drawn.legacy_windows or drawn.options.ascii_only:
        return None
    return plain_table(
        title,
        columns,
        cells,
        drawn.width,
        bold=drawn.is_terminal and drawn.color_system is not None,
    )


def emit_json(value: Any) -> None:
    """Write one JSON document (pretty, UTF-8) to stdout."""
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2, default=str) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def echo_line(text: str, err: bool = False) -> None:
    """One line of plain text holding stored text (a verdict, a finding): a newline
    stored in a name cannot start a line of its own (``cli.inert.inert``)."""
    click.echo(inert(text), err=err)


def console() -> Console:
    """A console that colours on a terminal and stays plain in pipes.

    It writes beneath the command's ``InertStream`` (its own colour sequences
    must pass) and escapes every text segment itself (``cli.inert.InertHook``).
    """
    from rich.console import Console

    out = raw(sys.stdout)
    return inert_console(
        Console(
            file=out,
            soft_wrap=False,
            width=None if out.isatty() else PIPE_WIDTH,
            markup=False,
            emoji=False,
            highlight=False,
        )
    )


def fmt_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def write_document(output: str, text: str, what: str = "") -> None:
    """A whole document (a page, a BOM) to the file ``output``, or stdout for ``-``; says
    on stderr what was written. An unwritable path is a usage error in one line."""
    from pathlib import Path

    from auditlog.core.errors import UsageError

    if output == "-":
        sys.stdout.write(text)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output!r}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {output}{f' ({what})' if what else ''}", err=True)
