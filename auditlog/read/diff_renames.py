"""Probable renames between two runs' module trees: a removed module and an added one
with the same signature (class, source file and function, the relative names,
classes and shapes of everything under it). ``diff`` shows them as renames, and
``diff --values`` compares a renamed module's tensors under their new names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from auditlog.read.diff import RunFacts


def _subtree_signature(
    facts: RunFacts, modules: dict[str, dict[str, Any]], label: str
) -> tuple[Any, ...]:
    """Class, source file/function and the contents (relative names, classes, shapes) of a module."""
    prefix = label + "."
    own = modules[label]
    inner = tuple(
        sorted(
            (name[len(prefix) :], item["class"])
            for name, item in modules.items()
            if name.startswith(prefix)
        )
    )
    tensors = tuple(
        sorted(
            (t.label[len(prefix) :], t.role, tuple(t.info.shape or ()), t.info.dtype)
            for t in facts.labels.tensors.values()
            if t.label.startswith(prefix)
        )
    )
    source = own["source"].rsplit(":", 1)[0] if own["source"] else None
    return (own["class"], source, own["source_function"], inner, tensors)


def _topmost(names: list[str]) -> list[str]:
    """Names none of whose ancestors is in ``names``."""
    chosen = set(names)
    return [
        n for n in names if not any(n.startswith(other + ".") for other in chosen if other != n)
    ]


def find_renames(
    a: RunFacts,
    b: RunFacts,
    modules_a: dict[str, dict[str, Any]],
    modules_b: dict[str, dict[str, Any]],
) -> dict[str, str]:
    """Probable renames: top-most removed module -> top-most added module with the same signature."""
    removed = _topmost([n for n in modules_a if n not in modules_b])
    added = _topmost([n for n in modules_b if n not in modules_a])
    candidates = {name: _subtree_signature(b, modules_b, name) for name in added}
    renames: dict[str, str] = {}
    claimed: set[str] = set()
    for old in removed:
        signature = _subtree_signature(a, modules_a, old)
        matches = [n for n, s in candidates.items() if s == signature and n not in claimed]
        if len(matches) > 1:
            matches = [n for n in matches if modules_b[n]["source"] == modules_a[old]["source"]]
        if len(matches) == 1:
            renames[old] = matches[0]
            claimed.add(matches[0])
    return renames


def renamed_label(name: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if name == old:
            return new
        if name.startswith(old + "."):
            return new + name[len(old) :]
    return name
