"""``auditlog tree``: the module tree of a run at any step, with where each part was built."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
from auditlog.cli.inert import one_line
from auditlog.cli.options import format_option, rank_option, run_argument, store_option
from auditlog.cli.output import console, emit_json

from auditlog.core.errors import AuditlogError, UsageError
from auditlog.core.replay import attached_mark

if TYPE_CHECKING:
    from rich.tree import Tree


def step_options(func: Any) -> Any:
    """``--step N`` / ``--seq N``: the state right after the N-th optimizer step, or at an event."""
    func = click.option("--seq", type=int, default=None, metavar="N", help="State as of event seq N.")(func)
    return click.option(
        "--step", type=int, default=None, metavar="N",
        help="State right after the N-th optimizer.step() returned (0: sealed initial state).",
    )(func)


def check_step_or_seq(step: int | None, seq: int | None) -> None:
    """``--step`` and ``--seq`` both name a point in the run: one at a time."""
    if step is not None and seq is not None:
        raise UsageError("--step and --seq both name a point in the run; give one of them")


def _member_label(kind: str, t: dict[str, Any]) -> tuple[tuple[str, str], str, tuple[str, str] | str]:
    """A parameter's or buffer's line, as styled pieces (name, facts, content hash)."""
    flags = []
    if kind == "buffers":
        flags.append("buffer" + ("" if t["persistent"] is not False else ", not persistent"))
    elif t["requires_grad"] is False:
        flags.append("frozen")
    extra = f" ({', '.join(flags)})" if flags else ""
    sha = (f" {t['sha256'][:10]}@{t['snapshot_step']}", "dim") if t["sha256"] else ""
    return (t["name"], "cyan"), f" {t['shape']} {t['dtype']}{extra}", sha


def _child_label(child: dict[str, Any]) -> tuple[tuple[str, str], str, tuple[str, str] | str]:
    cls = (child["class"] or "?").rsplit(".", 1)[-1]
    where = (f" {child['source']}{attached_mark(child.get('source_kind'))}", "dim") if child["source"] else ""
    return (child["name"], "bold"), f" ({cls})", where


def _root_label(item: dict[str, Any]) -> tuple[Any, ...]:
    cls = item["class"] or "?"
    where = (f" {item['source']}{attached_mark(item.get('source_kind'))}", "dim") if item["source"] else ""
    wrapped = "".join(f" (in {w.rsplit('.', 1)[-1]})" for w in item["wrapped_by"])
    return (cls.rsplit(".", 1)[-1], "bold"), " ", (cls, "dim"), (wrapped, "dim"), where


def _plain(pieces: tuple[Any, ...]) -> str:
    return "".join(p if isinstance(p, str) else p[0] for p in pieces)


def _render(data: dict[str, Any], tree: Tree) -> None:
    # Pieces, never markup: "[bold]" or a trailing backslash in a name stays text, and
    # a control character in it is escaped (cli.inert: a label is one line).
    for kind in ("parameters", "buffers"):
        for t in data[kind]:
            tree.add(one_line(*_member_label(kind, t)))
    for child in data["children"]:
        _render(child, tree.add(one_line(*_child_label(child))))


def _plain_lines(item: dict[str, Any], width: int) -> list[str] | None:
    """The lines rich's ``Tree`` prints for ``item`` without colour, built directly
    (far faster on a wide model: docs/performance.md); None when rich must draw it
    because a line would not print as one plain line of at most ``width`` cells
    (a control character, a wide character, a label rich would wrap)."""
    out = [_plain(_root_label(item))]

    def walk(data: dict[str, Any], indent: str) -> None:
        labels: list[tuple[str, dict[str, Any] | None]] = [
            (_plain(_member_label(kind, t)), None) for kind in ("parameters", "buffers") for t in data[kind]
        ]
        labels += [(_plain(_child_label(child)), child) for child in data["children"]]
        last = len(labels) - 1
        for index, (label, child) in enumerate(labels):
            out.append(f"{indent}{'└── ' if index == last else '├── '}{label}")
            if child is not None:
                walk(child, indent + ("    " if index == last else "│   "))

    walk(item, "")
    for line in out:
        if not (line.isprintable() and (len(line) <= width if line.isascii() else _cells(line) <= width)):
            return None
    return out


def _cells(line: str) -> int:
    from rich.cells import cell_len

    return int(cell_len(line))


@click.command()
@store_option
@format_option(formats=("table", "json"))
@run_argument
@step_options
@click.option(
    "--root", default=None, metavar="CLASS|all",
    help="Root module by class name, or 'all' (default: the root holding the most parameters).",
)
@rank_option
def tree(
    store: str | None, fmt: str, run: str, step: int | None, seq: int | None, root: str | None, rank: int | None
) -> None:
    """Show RUN's module tree: names, classes, shapes, dtypes, where each was built.

    A multi-rank run shows rank 0's stream unless --rank says otherwise.
    """
    from rich.tree import Tree

    from auditlog.read.api import open_store
    from auditlog.read.tree import tree_json

    check_step_or_seq(step, seq)
    with open_store(store) as opened:
        view = opened.run(run, rank)
        state = view.state_at(step=step, seq=seq)
    if not state.modules:
        raise AuditlogError(f"run {view.run_id[:12]} recorded no modules")
    if root == "all":
        roots = state.roots()
    elif root:
        try:
            roots = [state.root_by_class(root)]
        except KeyError:
            raise UsageError(f"no root module of class {root!r}") from None
    else:
        roots = [state.main_root()]
    data = [tree_json(state, r, "") for r in roots]
    if fmt == "json":
        emit_json(data)
        return
    out = console()
    # No colour and unicode guides (a pipe, a file): the same text, without rich's per-node cost.
    plain = out.color_system is None and not out.options.ascii_only
    for item in data:
        lines = _plain_lines(item, out.width) if plain else None
        if lines is not None:
            sys.stdout.write("\n".join(lines) + "\n")  # printable by _plain_lines; the InertStream anyway
            continue
        top = Tree(one_line(*_root_label(item)))
        _render(item, top)
        out.print(top, highlight=False)
