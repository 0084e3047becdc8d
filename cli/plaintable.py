"""The table rich would draw into a pipe, drawn without rich when that is simple.

Rich lays out every cell as a renderable, and for a table of many runs that
cost more than the rest of ``auditlog runs`` (docs/performance.md). Into a pipe
or a file rich prints no colour and no style, so when every cell fits on its
line the text is plain: the same box characters, the same padding, the title
centred above. ``plain_table`` returns exactly those lines, or None whenever rich might
do something else (a table wider than the console, a non-UTF-8 stream, any
character that is not printable ASCII, whose width rich measures itself); the
caller then draws with rich. On a terminal with colours rich's only styling of
such a table is the bold header, written as rich writes it. ``tests/test_plaintable.py``
compares the two on many tables.
"""

from __future__ import annotations

from collections.abc import Sequence

# rich.box.HEAVY_HEAD, the box of rich.table.Table's default.
_TOP = ("┏", "━", "┳", "┓")
_HEAD = ("┃", "┃", "┃")
_HEAD_RULE = ("┡", "━", "╇", "┩")
_ROW = ("│", "│", "│")
_BOTTOM = ("└", "─", "┴", "┘")
_BOLD = "\x1b[1m{}\x1b[0m"  # what rich writes for a bold segment, whatever the colour system


def _simple(text: str) -> bool:
    return text.isascii() and text.isprintable()


def plain_table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    bold: bool = False,
) -> list[str] | None:
    """The lines of a rich ``Table`` (default box, a bold header, ``overflow="fold"``
    cells) printed by a ``Console`` of ``width`` columns; None when this function
    cannot be sure to match it. ``bold``: the console styles its output (a
    terminal with colours): the header cells carry the bold sequences rich writes."""
    if not columns or not all(_simple(c) for c in columns):
        return None
    if title is not None and not _simple(title):
        return None
    title = title or None  # rich draws no line for an empty title
    widths = [len(c) for c in columns]
    for row in rows:
        if len(row) != len(columns):
            return None
        for i, cell in enumerate(row):
            if not _simple(cell):
                return None
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    if bold and not all(widths):  # an empty column: rich's segments vary there
        return None
    total = sum(widths) + 3 * len(widths) + 1  # one space each side of a cell, a rule between
    if total > width or (title is not None and len(title) > total):
        return None

    def rule(parts: tuple[str, str, str, str]) -> str:
        left, line, cross, right = parts
        return left + cross.join(line * (w + 2) for w in widths) + right

    def line(cells: Sequence[str], parts: tuple[str, str, str], styled: bool = False) -> str:
        left, between, right = parts
        if styled:  # rich styles the padding and the text as three segments
            pieces = [
                _BOLD.format(" ") + _BOLD.format(c.ljust(w)) + _BOLD.format(" ")
                for c, w in zip(cells, widths, strict=True)
            ]
            return left + between.join(pieces) + right
        return (
            left
            + between.join(f" {c.ljust(w)} " for c, w in zip(cells, widths, strict=True))
            + right
        )

    out = []
    if title is not None:
        before = (total - len(title)) // 2
        out.append(" " * before + title + " " * (total - len(title) - before))
    out.append(rule(_TOP))
    out.append(line(columns, _HEAD, bold))
    out.append(rule(_HEAD_RULE))
    out.extend(line(row, _ROW) for row in rows)
    out.append(rule(_BOTTOM))
    return out
