"""``auditlog tree``: the module tree of a run at any step, with where each part was built."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
from auditlog.cli.options import format_option, rank_option, run_argument, store_option
from auditlog.cli.output import console, emit_json

from auditlog.core.errors import AuditlogError, UsageError

if TYPE_CHECKING:
    pass


def step_options(func: Any) -> Any:
    """``--step N`` / ``--seq N``: the state right after the N-th optimizer step, or at an event."""
    func = click.option(
        "--seq", type=int, default=None, metavar="N", help="State as of event seq N."
    )(func)
    return click.option(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="State right after the N-th optimizer.step() returned (0: sealed initial state).",
    )(func)


def check_step_or_seq(step: int | None, seq: int | None) -> None:
    """``--step`` and ``--seq`` both name a point in the run: one at a time."""
    if step is not None and seq is not None:
        raise UsageError("--step and --seq both name a point in the run; give one of them")


@click.command()
@store_option
@format_option(formats=("table", "json"))
@run_argument
@step_options
@click.option(
    "--root",
    default=None,
    metavar="CLASS|all",
    help="Root module by class name, or 'all' (default: the root holding the most parameters).",
)
@rank_option
def tree(
    store: str | None,
    fmt: str,
    run: str,
    step: int | None,
    seq: int | None,
    root: str | None,
    rank: int | None,
) -> None:
    """Show RUN's module tree: names, classes, shapes, dtypes, where each was built.

    A multi-rank run shows rank 0's stream unless --rank says otherwise.
    """
    from auditlog.present.tree_text import plain_lines, renderable
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
        lines = plain_lines(item, out.width) if plain else None
        if lines is not None:
            sys.stdout.write(
                "\n".join(lines) + "\n"
            )  # printable by plain_lines; the InertStream anyway
            continue
        out.print(renderable(item), highlight=False)
