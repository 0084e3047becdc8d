"""How ``auditlog tree`` draws a module tree (the JSON of ``read.tree.tree_json``).

Two ways to the same text: rich's ``Tree`` (colour, and any label rich must wrap or
escape), and ``plain_lines``, the lines rich prints without colour, built directly
because rich's per-node cost is large on a model of thousands of modules
(docs/performance.md). Labels are pieces, never markup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from auditlog.core.replay import attached_mark
from auditlog.present.text import one_line

if TYPE_CHECKING:
    from rich.tree import Tree


def member_label(
    kind: str, t: dict[str, Any]
) -> tuple[tuple[str, str], str, tuple[str, str] | str]:
    """A parameter's or buffer's line, as styled pieces (name, facts, content hash)."""
    flags = []
    if kind == "buffers":
        flags.append("buffer" + ("" if t["persistent"] is not False else ", not persistent"))
    elif t["requires_grad"] is False:
        flags.append("frozen")
    extra = f" ({', '.join(flags)})" if flags else ""
    sha = (f" {t['sha256'][:10]}@{t['snapshot_step']}", "dim") if t["sha256"] else ""
    return (t["name"], "cyan"), f" {t['shape']} {t['dtype']}{extra}", sha


def child_label(child: dict[str, Any]) -> tuple[tuple[str, str], str, tuple[str, str] | str]:
    cls = (child["class"] or "?").rsplit(".", 1)[-1]
    where = (
        (f" {child['source']}{attached_mark(child.get('source_kind'))}", "dim")
        if child["source"]
        else ""
    )
    return (child["name"], "bold"), f" ({cls})", where


def root_label(item: dict[str, Any]) -> tuple[Any, ...]:
    cls = item["class"] or "?"
    where = (
        (f" {item['source']}{attached_mark(item.get('source_kind'))}", "dim")
        if item["source"]
        else ""
    )
    wrapped = "".join(f" (in {w.rsplit('.', 1)[-1]})" for w in item["wrapped_by"])
    return (cls.rsplit(".", 1)[-1], "bold"), " ", (cls, "dim"), (wrapped, "dim"), where


def _plain(pieces: tuple[Any, ...]) -> str:
    return "".join(p if isinstance(p, str) else p[0] for p in pieces)


def add_children(data: dict[str, Any], tree: Tree) -> None:
    # Pieces, never markup: "[bold]" or a trailing backslash in a name stays text, and
    # a control character in it is escaped (present.text: a label is one line).
    for kind in ("parameters", "buffers"):
        for t in data[kind]:
            tree.add(one_line(*member_label(kind, t)))
    for child in data["children"]:
        add_children(child, tree.add(one_line(*child_label(child))))


def plain_lines(item: dict[str, Any], width: int) -> list[str] | None:
    """The lines rich's ``Tree`` prints for ``item`` without colour, built directly
    (far faster on a wide model: docs/performance.md); None when rich must draw it
    because a line would not print as one plain line of at most ``width`` cells
    (a control character, a wide character, a label rich would wrap)."""
    out = [_plain(root_label(item))]

    def walk(data: dict[str, Any], indent: str) -> None:
        labels: list[tuple[str, dict[str, Any] | None]] = [
            (_plain(member_label(kind, t)), None)
            for kind in ("parameters", "buffers")
            for t in data[kind]
        ]
        labels += [(_plain(child_label(child)), child) for child in data["children"]]
        last = len(labels) - 1
        for index, (label, child) in enumerate(labels):
            out.append(f"{indent}{'└── ' if index == last else '├── '}{label}")
            if child is not None:
                walk(child, indent + ("    " if index == last else "│   "))

    walk(item, "")
    for line in out:
        if not (
            line.isprintable() and (len(line) <= width if line.isascii() else _cells(line) <= width)
        ):
            return None
    return out


def _cells(line: str) -> int:
    from rich.cells import cell_len

    return int(cell_len(line))


def renderable(item: dict[str, Any]) -> Tree:
    """One root's tree as a rich ``Tree`` (styles; labels escaped, one line each)."""
    from rich.tree import Tree

    top = Tree(one_line(*root_label(item)))
    add_children(item, top)
    return top


def tree_text(item: dict[str, Any], width: int = 100) -> str:
    """One root's tree as ``auditlog tree`` prints it to a pipe: plain text, no colour."""
    lines = plain_lines(item, width)
    if lines is not None:
        return "\n".join(lines) + "\n"
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(renderable(item), highlight=False)
    return buffer.getvalue()
