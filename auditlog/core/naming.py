"""Stable labels for the modules and tensors of a replayed model.

Events carry identities; people think in qualified names. ``replay`` gives
``named_modules``-style paths per root, but a run can hold several roots (the
model, a loss module, a module that was replaced and dropped out of the tree),
and their paths collide: every root is ``""``. The DuckDB views and ``auditlog
diff`` need one unique, predictable label per module and tensor, so this module
decides them once, for both:

- a root module is ``(ShortClass)``, with ``#2``, ``#3`` ... for later roots of
  the same class (the ``auditlog events`` command shows roots the same way);
- the model root holding the most parameters (the first of them on a tie: the
  root ``auditlog tree`` and ``restore`` choose) keeps plain ``named_modules``
  paths for its descendants (``body.0``, ``head.weight``), exactly what
  ``model.named_parameters()`` prints; this is the usual case of one model plus
  loss modules, and also of a model built from a template layer that stays a
  root of its own (``nn.TransformerEncoder(layer, n)`` copies ``layer``);
- the descendants of every other root with descendants (the smaller of a GAN's
  two networks, a teacher beside a student, that template layer) are prefixed
  with their root's label: ``(TransformerEncoderLayer).linear1``;
- a module that was once attached and is no longer (``del model.fc``, or a name
  given to another module) is a root of its own now, labelled
  ``(detached Linear)``; it never counts as a model root, and what hangs below
  it is always prefixed with that label.

A module or tensor reachable under several names (a shared module, tied weights)
is labelled by the first name in ``named_modules``/``named_parameters`` order, as
PyTorch de-duplicates them, and keeps the others as ``aliases``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from auditlog.core.payloadlimits import parse_payload
from auditlog.core.replay import ModelState, ModuleNode, TensorInfo


@dataclass
class ModuleLabel:
    """One module of a replayed run, named."""

    module_id: int
    label: str
    path: str
    root: str
    cls: str | None
    parent_id: int | None
    attr: str | None
    depth: int
    aliases: list[str] = field(default_factory=list)


@dataclass
class TensorLabel:
    """One parameter or buffer of a replayed run, named."""

    tensor_id: int
    label: str
    role: str
    module_id: int
    attr: str
    info: TensorInfo
    aliases: list[str] = field(default_factory=list)


@dataclass
class Labels:
    """Labels of every module and tensor that replay placed in a tree."""

    modules: dict[int, ModuleLabel]
    tensors: dict[int, TensorLabel]

    def module_label(self, module_id: int | None) -> str | None:
        if module_id is None:
            return None
        found = self.modules.get(module_id)
        return None if found is None else found.label


def short_class(cls: str | None) -> str:
    """``torch.nn.modules.linear.Linear`` -> ``Linear``."""
    return (cls or "?").rsplit(".", 1)[-1]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _has_descendants(node: ModuleNode) -> bool:
    members = (*node.children.values(), *node.parameters.values(), *node.buffers.values())
    return any(m is not None for m in members)


def _parameter_count(state: ModelState, root: int) -> int:
    return sum(1 for _ in state.named_parameters(root))


def _walk(state: ModelState, root: int) -> Iterator[tuple[str, int, int | None, str | None, int]]:
    """Every path to every module under ``root``, depth-first in registration order.

    Yields ``(path, module_id, parent_id, attr, depth)``; a shared module appears
    once per path (cycles are cut), which is how aliases are found.
    """
    stack: list[tuple[str, int, int | None, str | None, int, frozenset[int]]] = [
        ("", root, None, None, 0, frozenset())
    ]
    while stack:
        path, module_id, parent, attr, depth, seen = stack.pop()
        yield path, module_id, parent, attr, depth
        node = state.modules.get(module_id)
        if node is None or module_id in seen:
            continue
        inner = seen | {module_id}
        for name, child in reversed(list(node.children.items())):
            if child is not None and child not in inner:
                stack.append((_join(path, name), child, module_id, name, depth + 1, inner))


def attached_ids(events: Iterable[dict[str, Any]]) -> set[int]:
    """Modules that were ever registered as someone's child (to tell detached roots)."""
    out: set[int] = set()
    for event in events:
        if event["kind"] != "module_registered":
            continue
        payload = event["payload"]
        child = (parse_payload(payload, event) if isinstance(payload, str) else payload).get(
            "child_id"
        )
        if child is not None:
            out.add(int(child))
    return out


def label_state(state: ModelState, attached: set[int] | None = None) -> Labels:
    """Label every module and tensor of ``state`` (see the module docstring for the rules).

    ``attached``: modules that were ever some module's child (``attached_ids``);
    those among the roots are detached, not models.
    """
    roots = state.roots()
    detached = {r for r in roots if attached is not None and r in attached}
    root_labels: dict[int, str] = {}
    seen_classes: dict[str, int] = {}
    for root in roots:
        cls = short_class(state.modules[root].cls)
        base = f"(detached {cls})" if root in detached else f"({cls})"
        seen_classes[base] = seen_classes.get(base, 0) + 1
        count = seen_classes[base]
        root_labels[root] = base if count == 1 else f"{base}#{count}"
    models = [r for r in roots if r not in detached and _has_descendants(state.modules[r])]
    plain = (
        {max(models, key=lambda r: (_parameter_count(state, r), -models.index(r)))}
        if models
        else set()
    )

    def name_of(root: int, path: str) -> str:
        if not path:
            return root_labels[root]
        return path if root in plain else f"{root_labels[root]}.{path}"

    def member_name(root: int, path: str, attr: str) -> str:
        if not path:
            return attr if root in plain else f"{root_labels[root]}.{attr}"
        return f"{name_of(root, path)}.{attr}"

    modules: dict[int, ModuleLabel] = {}
    tensors: dict[int, TensorLabel] = {}
    for root in roots:
        for path, module_id, parent, attr, depth in _walk(state, root):
            label = name_of(root, path)
            known = modules.get(module_id)
            if known is not None:
                if label != known.label and label not in known.aliases:
                    known.aliases.append(label)
                continue
            node = state.modules[module_id]
            modules[module_id] = ModuleLabel(
                module_id, label, path, root_labels[root], node.cls, parent, attr, depth
            )
    # Tensors in named_parameters() order: modules in named_modules() order
    # (first path wins), then each module's own members.
    for root in roots:
        for path, module_id, _parent, _attr, _depth in _walk(state, root):
            node = state.modules[module_id]
            for role, members in (("parameter", node.parameters), ("buffer", node.buffers)):
                for attr, tensor_id in members.items():
                    if tensor_id is None or tensor_id not in state.tensors:
                        continue
                    label = member_name(root, path, attr)
                    known_tensor = tensors.get(tensor_id)
                    if known_tensor is not None:
                        if label != known_tensor.label and label not in known_tensor.aliases:
                            known_tensor.aliases.append(label)
                        continue
                    tensors[tensor_id] = TensorLabel(
                        tensor_id, label, role, module_id, attr, state.tensors[tensor_id]
                    )
    return Labels(modules, tensors)
