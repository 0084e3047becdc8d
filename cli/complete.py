"""Shell completion of values (Click's ``shell_complete``): run selectors, event kinds, views.

Enabled per shell with Click's own script (see ``auditlog --help``). A completion
reads the store named by ``--store`` / ``AUDITLOG_STORE`` on the command line so
far; it never fails and never prints: no store, no completions.
"""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem


def complete_runs(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """``latest``, ``latest~N``, run ids and run names that start with what was typed."""
    return _runs(ctx, incomplete, extra=())


def complete_runs_or_all(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """As ``complete_runs``, plus ``all``."""
    return _runs(ctx, incomplete, extra=("all",))


def complete_kinds(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Event kinds (``auditlog.core.kinds``)."""
    from auditlog.core.kinds import KINDS

    return [
        CompletionItem(name, help=kind.doc.split(".")[0])
        for name, kind in KINDS.items()
        if name.startswith(incomplete)
    ]


def complete_views(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The views ``auditlog query`` answers from."""
    from auditlog.read.api import views

    return [
        CompletionItem(v.name, help=v.doc.split(".")[0])
        for v in views()
        if v.name.startswith(incomplete)
    ]


def _runs(ctx: click.Context, incomplete: str, extra: tuple[str, ...]) -> list[CompletionItem]:
    items = [CompletionItem(word) for word in (*extra, "latest") if word.startswith(incomplete)]
    try:
        infos = _run_infos(_store_of(ctx))
    except Exception:  # completion must never fail the shell: no store, no run completions
        return items
    for back in range(1, len(infos)):
        word = f"latest~{back}"
        if word.startswith(incomplete) and incomplete.startswith("latest~"):
            items.append(CompletionItem(word, help=infos[-1 - back].run_id[:12]))
    names: dict[str, int] = {}
    for info in infos:
        if info.name:
            names[info.name] = names.get(info.name, 0) + 1
    for info in reversed(infos):  # newest first
        started = f"{info.status}, started {_when(info.started_ns)}"
        if info.run_id.startswith(incomplete):
            items.append(CompletionItem(info.run_id, help=f"{info.name or ''} {started}".strip()))
        if info.name and info.name.startswith(incomplete) and names.get(info.name) == 1:
            items.append(CompletionItem(info.name, help=f"run {info.run_id[:12]}, {started}"))
    return items


def _store_of(ctx: click.Context) -> str | None:
    """The ``--store`` given on the command line so far (Click fills in the env var too)."""
    while ctx is not None:
        value = ctx.params.get("store")
        if value:
            return str(value)
        ctx = ctx.parent  # type: ignore[assignment]
    return None


def _run_infos(store: str | None) -> list[Any]:
    from auditlog.read.api import open_store

    with open_store(store) as opened:
        return opened.runs()


def _when(ns: int) -> str:
    from auditlog.core.values import iso

    return iso(ns)[:16].replace("T", " ")
