"""HTML building blocks for ``auditlog report``: one self-contained page, nothing fetched.

Every value goes through ``html.escape`` (``esc``): module names, annotation
fields, exception messages and command lines come from the record, and a module
attribute may hold markup. The page carries its CSS inline and its pictures as
``data:`` URIs; it has no script and no link to anything outside itself (only
in-page ``#anchors``), so it renders the same from a file, an archive or an
e-mail, with no network.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

CSS = """
:root { --fg: #1d2330; --muted: #5f6b7a; --line: #d9dee5; --bg: #ffffff; --soft: #f4f6f9;
        --ok: #1a7f37; --bad: #c62828; --warn: #9a6700; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       color: var(--fg); background: var(--bg); }
main { max-width: 1100px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px;
     padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 16px 0 6px; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.muted { color: var(--muted); }
nav { margin: 10px 0 0; } nav a { margin-right: 14px; color: #0b5cad; text-decoration: none; }
table { border-collapse: collapse; margin: 6px 0 10px; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
table.kv th { width: 210px; background: none; color: var(--muted); font-weight: 500; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; font-weight: 600; font-size: 13px; }
.ok { background: #dafbe1; color: var(--ok); } .bad { background: #ffebe9; color: var(--bad); }
.warn { background: #fff8c5; color: var(--warn); }
img.plot { max-width: 100%; border: 1px solid var(--line); margin: 6px 0; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 18px; }
ul.tree { padding-left: 0; } ul.tree li { margin: 1px 0; }
summary { cursor: pointer; }
pre { background: var(--soft); padding: 8px 10px; overflow-x: auto; white-space: pre-wrap; }
.add { color: var(--ok); } .rem { color: var(--bad); } .chg { color: var(--warn); }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
"""


def esc(value: Any) -> str:
    """Any value as escaped HTML text (None as an empty string)."""
    if value is None:
        return ""
    return html.escape(str(value), quote=True)


def number(value: Any) -> str:
    """A number as a table shows it: integers with separators, floats to 6 digits, NaN/inf named."""
    if isinstance(value, bool) or value is None:
        return esc(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    return esc(value)


def si(value: float | int | None, unit: str = "") -> str:
    """``1.23 G`` style for big counts (FLOPs, parameters)."""
    if value is None:
        return ""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:g} {unit}".strip()


def kv_table(rows: Iterable[tuple[str, Any]], raw: bool = False) -> str:
    """A two-column table of facts (values escaped unless ``raw``: already HTML)."""
    body = "".join(f"<tr><th>{esc(k)}</th><td>{v if raw else esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def table(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool] | None = None
) -> str:
    """A table of rows (each cell escaped; numbers right-aligned and formatted)."""
    numeric = numeric or [False] * len(columns)
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for row in rows:
        cells = []
        for value, is_number in zip(row, numeric, strict=True):
            if is_number:
                cells.append(f'<td class="num">{number(value)}</td>')
            else:
                cells.append(f"<td>{esc(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def badge(text: str, kind: str) -> str:
    return f'<span class="badge {esc(kind)}">{esc(text)}</span>'


def image(png: bytes, alt: str) -> str:
    """A PNG embedded in the page (a ``data:`` URI: nothing to fetch)."""
    encoded = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{encoded}">'


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{body}</section>'


def page(
    title: str, heading: str, nav: Sequence[tuple[str, str]], sections: Sequence[str], footer: str
) -> str:
    """The whole document: inline CSS, no script, in-page links only."""
    links = "".join(f'<a href="#{esc(anchor)}">{esc(label)}</a>' for anchor, label in nav)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><main><header>{heading}<nav>{links}</nav></header>"
        + "".join(sections)
        + f"<footer>{footer}</footer></main></body></html>\n"
    )
