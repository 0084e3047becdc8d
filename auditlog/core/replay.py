"""Replay: fold construction events into the module tree they describe.

Events carry identities, not names. Replay rebuilds each module's ordered
children/parameters/buffers exactly as ``torch.nn.Module`` keeps them (a name
lives in one of the three dicts; re-registering a name keeps its position;
``register_module(name, None)`` leaves a None entry), and then derives
fully-qualified names the way ``named_modules``/``named_parameters`` do,
including their de-duplication of shared modules and tied tensors.

This is a pure function of the event sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from auditlog.core.hashing import hash_text
from auditlog.core.payloadlimits import parse_payload

CONSTRUCTION_KINDS = (
    "module_registered",
    "module_wrapped",
    "parameter_registered",
    "buffer_registered",
    "construction_sealed",
    "structure_changed",
    "snapshot_taken",
)
# Kinds that change the module structure (the recorder keeps its own state of these).
STATE_KINDS = frozenset(
    ("module_registered", "parameter_registered", "buffer_registered", "structure_changed")
)


ATTACHED_MARK = " (attached)"


def attached_mark(kind: Any) -> str:
    """What follows a module's ``file:line`` wherever it is shown: `` (attached)`` when
    its site's ``kind`` says the line is where it was attached to its parent (its
    constructor was not seen: built before recording, a deepcopy, C++; docs/events.md),
    nothing for the constructing line (or a record made before sites had a kind)."""
    return ATTACHED_MARK if kind == "attached" else ""


def built_at(where: str | None) -> str:
    """A module's ``file:line`` (``attached_mark`` included) in a sentence: "built at
    file:line", or "attached at file:line" where its constructing line is unknown."""
    if where is None:
        return "built at an unrecorded line"
    if where.endswith(ATTACHED_MARK):
        return f"attached at {where[: -len(ATTACHED_MARK)]}"
    return f"built at {where}"


@dataclass
class ModuleNode:
    """One module as replayed: class, where it was built, and its ordered members."""

    module_id: int
    cls: str | None = None
    source: dict[str, Any] | None = None
    children: dict[str, int | None] = field(default_factory=dict)
    parameters: dict[str, int | None] = field(default_factory=dict)
    buffers: dict[str, int | None] = field(default_factory=dict)
    wrappers: list[str] = field(
        default_factory=list
    )  # data-parallel wrappers around it (module_wrapped)

    def drop_name(self, name: str) -> None:
        """Assigning a name to one kind of member removes it from the others (as torch does)."""
        self.children.pop(name, None)
        self.parameters.pop(name, None)
        self.buffers.pop(name, None)


@dataclass
class TensorInfo:
    """A parameter or buffer as replayed."""

    tensor_id: int
    role: str
    shape: list[int] | None
    dtype: str | None
    device: str | None
    requires_grad: bool | None = None
    persistent: bool | None = None
    source: dict[str, Any] | None = None
    initial_sha256: str | None = None
    initial_stats: dict[str, Any] | None = None
    snapshot_sha256: str | None = None
    snapshot_step: int | None = None
    snapshot_seq: int | None = None
    history: list[tuple[int, int, str]] = field(default_factory=list)  # (step, seq, sha256)
    # For a sharded (DTensor) tensor: seq -> where the stored local shard lies (``shard`` of the item).
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    # For a wrapper subclass (TwoTensor, Float8-like): seq -> its stored representation
    # (``subclass`` of the item: type, inner attribute -> sha256, ctx, shape, stride).
    wrappers: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ModelState:
    """The module forest at some point of a run."""

    modules: dict[int, ModuleNode] = field(default_factory=dict)
    tensors: dict[int, TensorInfo] = field(default_factory=dict)
    last_seq: int = 0

    def node(self, module_id: int, cls: str | None = None) -> ModuleNode:
        found = self.modules.get(module_id)
        if found is None:
            found = self.modules[module_id] = ModuleNode(module_id)
        if cls is not None and found.cls is None:
            found.cls = cls
        return found

    # ------------------------------------------------------------------ names
    def roots(self) -> list[int]:
        """Modules that are nobody's child now, in order of first appearance."""
        children = {c for m in self.modules.values() for c in m.children.values() if c is not None}
        return [m for m in self.modules if m not in children]

    def named_modules(self, root: int, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Like ``Module.named_modules()``: depth-first, each module once."""
        memo: set[int] = set()

        def walk(module_id: int, path: str) -> Iterator[tuple[str, int]]:
            if module_id in memo:
                return
            memo.add(module_id)
            yield path, module_id
            node = self.modules.get(module_id)
            if node is None:
                return
            for name, child in node.children.items():
                if child is not None:
                    yield from walk(child, f"{path}.{name}" if path else name)

        yield from walk(root, prefix)

    def _named_members(self, root: int, which: str) -> Iterator[tuple[str, int]]:
        memo: set[int] = set()
        for path, module_id in self.named_modules(root):
            members: dict[str, int | None] = getattr(self.modules[module_id], which)
            for name, tensor_id in members.items():
                if tensor_id is None or tensor_id in memo:
                    continue
                memo.add(tensor_id)
                yield (f"{path}.{name}" if path else name), tensor_id

    def named_parameters(self, root: int) -> Iterator[tuple[str, int]]:
        """Like ``Module.named_parameters()`` (tied weights once, under the first name)."""
        return self._named_members(root, "parameters")

    def named_buffers(self, root: int) -> Iterator[tuple[str, int]]:
        """Like ``Module.named_buffers()``."""
        return self._named_members(root, "buffers")

    def module_names(self) -> dict[int, list[str]]:
        """Every qualified name of every module, over all roots (root: its class name)."""
        names: dict[int, list[str]] = {}
        for root in self.roots():
            for path, module_id in self.named_modules(root):
                names.setdefault(module_id, []).append(path)
        return names

    def tensor_names(self) -> dict[int, list[str]]:
        """Every qualified name of every tensor (tied weights have several)."""
        names: dict[int, list[str]] = {}
        for root in self.roots():
            for path, module_id in self._all_paths(root):
                node = self.modules[module_id]
                for member in (node.parameters, node.buffers):
                    for name, tensor_id in member.items():
                        if tensor_id is not None:
                            full = f"{path}.{name}" if path else name
                            if full not in names.setdefault(tensor_id, []):
                                names[tensor_id].append(full)
        return names

    def _all_paths(self, root: int) -> Iterator[tuple[str, int]]:
        """Every path to every module (shared modules under each of their names)."""
        stack: list[tuple[str, int, frozenset[int]]] = [("", root, frozenset())]
        while stack:
            path, module_id, seen = stack.pop()
            yield path, module_id
            node = self.modules.get(module_id)
            if node is None or module_id in seen:
                continue
            inner = seen | {module_id}
            for name, child in reversed(list(node.children.items())):
                if child is not None and child not in inner:
                    stack.append((f"{path}.{name}" if path else name, child, inner))

    def state_dict_keys(self, root: int) -> list[tuple[str, int]]:
        """``(key, tensor_id)`` in ``Module.state_dict()`` order: parameters, persistent
        buffers, then children, by every path (tied tensors under each name)."""
        out: list[tuple[str, int]] = []

        def walk(module_id: int, prefix: str) -> None:
            node = self.modules[module_id]
            for name, tensor_id in node.parameters.items():
                if tensor_id is not None:
                    out.append((prefix + name, tensor_id))
            for name, tensor_id in node.buffers.items():
                if tensor_id is not None and self.tensors[tensor_id].persistent is not False:
                    out.append((prefix + name, tensor_id))
            for name, child in node.children.items():
                if child is not None:
                    walk(child, f"{prefix}{name}.")

        walk(root, "")
        return out

    def main_root(self) -> int:
        """The root most likely to be "the model": the one holding the most parameters."""
        roots = self.roots()
        if not roots:
            raise KeyError("no modules recorded")
        return max(roots, key=lambda r: (sum(1 for _ in self.named_parameters(r)), -roots.index(r)))

    def root_by_class(self, suffix: str) -> int:
        """The first root whose class name ends with ``suffix`` (tests and quick looks)."""
        for root in self.roots():
            cls = self.modules[root].cls or ""
            if cls == suffix or cls.endswith("." + suffix):
                return root
        raise KeyError(suffix)


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    payload = event.get("payload")
    if isinstance(payload, str):
        return dict(parse_payload(payload, event))
    return dict(payload or {})


def apply(state: ModelState, event: dict[str, Any]) -> None:
    """Fold one event into ``state`` (events of other kinds are ignored)."""
    kind = event["kind"]
    if event.get("seq") is not None:
        state.last_seq = int(event["seq"])
    if kind not in CONSTRUCTION_KINDS:
        return
    data = _payload(event)
    if kind == "module_registered":
        parent = state.node(int(event["module_id"]), data.get("parent_class"))
        if parent.source is None and data.get("parent_source"):
            parent.source = data["parent_source"]
        name = data["name"]
        child_id = data.get("child_id")
        if name not in parent.children:
            parent.drop_name(name)
        parent.children[name] = child_id
        if child_id is not None:
            child = state.node(int(child_id), data.get("child_class"))
            if child.source is None:
                child.source = data.get("source")
    elif kind == "module_wrapped":
        wrapper = data.get("wrapper_class")
        node = state.node(int(event["module_id"]))
        if isinstance(wrapper, str) and wrapper not in node.wrappers:
            node.wrappers.append(wrapper)
    elif kind in ("parameter_registered", "buffer_registered"):
        module = state.node(int(event["module_id"]), data.get("module_class"))
        if module.source is None and data.get("module_source"):
            module.source = data["module_source"]
        name = data["name"]
        members = module.parameters if kind == "parameter_registered" else module.buffers
        if name not in members:
            module.drop_name(name)
        tensor_id = event.get("tensor_id")
        members[name] = None if tensor_id is None else int(tensor_id)
        if tensor_id is not None:
            role = "parameter" if kind == "parameter_registered" else "buffer"
            info = state.tensors.get(int(tensor_id))
            if info is None:
                info = state.tensors[int(tensor_id)] = TensorInfo(
                    int(tensor_id), role, data.get("shape"), data.get("dtype"), data.get("device")
                )
                info.source = data.get("source")
            info.shape, info.dtype, info.device = (
                data.get("shape"),
                data.get("dtype"),
                data.get("device"),
            )
            if role == "parameter":
                info.requires_grad = data.get("requires_grad")
            else:
                info.persistent = data.get("persistent")
    elif kind == "construction_sealed":
        for item in data.get("tensors", []):
            info = state.tensors.get(int(item["tensor_id"]))
            if info is not None:
                info.initial_sha256 = hash_text(item.get("sha256"))
                info.initial_stats = item.get("stats")
                if data.get("stored"):
                    _snapshotted(
                        info,
                        hash_text(item.get("sha256")),
                        event,
                        item.get("shard"),
                        item.get("subclass"),
                    )
    elif kind == "snapshot_taken":
        snap = data.get("snapshot") or {}
        for item in snap.get("tensors", []):
            info = state.tensors.get(int(item["tensor_id"]))
            if info is not None:
                _snapshotted(
                    info,
                    hash_text(item.get("sha256")),
                    event,
                    item.get("shard"),
                    item.get("subclass"),
                )
    elif kind == "structure_changed":
        owner = (
            state.modules.get(int(event["module_id"]))
            if event.get("module_id") is not None
            else None
        )
        if data.get("change") == "removed" and owner is not None:
            by_member: dict[str, dict[str, int | None]] = {
                "module": owner.children,
                "parameter": owner.parameters,
                "buffer": owner.buffers,
            }
            by_member[data["member"]].pop(data["name"], None)
        elif data.get("change") == "tensor_changed" and event.get("tensor_id") is not None:
            info = state.tensors.get(int(event["tensor_id"]))
            if info is not None:
                for key, value in (data.get("after") or {}).items():
                    setattr(info, key, value)


def _snapshotted(
    info: TensorInfo,
    sha256: str | None,
    event: dict[str, Any],
    shard: Any = None,
    wrapper: Any = None,
) -> None:
    info.snapshot_sha256 = sha256
    info.snapshot_step = event.get("step")
    info.snapshot_seq = event.get("seq")
    if sha256 is not None and event.get("seq") is not None:
        info.history.append((int(event.get("step") or 0), int(event["seq"]), sha256))
        if isinstance(shard, dict):
            info.shards[int(event["seq"])] = shard
        if isinstance(wrapper, dict) and isinstance(wrapper.get("inner"), dict):
            info.wrappers[int(event["seq"])] = wrapper


def replay(events: Iterable[dict[str, Any]], upto_seq: int | None = None) -> ModelState:
    """Fold events (in seq order) into a ``ModelState``, stopping after ``upto_seq``."""
    state = ModelState()
    for event in events:
        if upto_seq is not None and int(event["seq"]) > upto_seq:
            break
        apply(state, event)
    return state
