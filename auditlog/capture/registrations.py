"""Registration events, deferred: the hooks keep facts, the writer builds the payloads.

Building a model registers every module, parameter and buffer through global
hooks on the training thread. A registration hook only assigns ids and keeps
what must be read now (the class, the tensor's shape, dtype and device, the
code object and line of the constructing frame: the frame is gone later) as a
tuple. The tuples wait in the recorder's pending queue until the next record of
any other kind (``emit`` settles them first, so the stream's order is the
hooks' order), ``Recording.flush``, a read of the replayed state, or
``PENDING_MAX`` of them; they then go to the buffer as one ``Registrations``
record, which the writer expands into the usual events: payload dicts, class
names, source locations, JSON and hashing happen off the training thread, and
the writer does not compete for the GIL while the model is being built.

The facts hold strings (class names), ints, dtypes, devices and code objects,
never the module or tensor: nothing the user drops is kept alive, and a pending
tuple holds nothing the cyclic garbage collector tracks, so it untracks the
tuple at its first pass (a 5,000-module build made ~30,000 more tracked objects
before, enough to add a ~0.1 s full collection to the build).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from auditlog.capture.source import site_location
from auditlog.core.chain import Clean
from auditlog.core.tensors import dtype_name

REGISTRATIONS = "__registrations__"
# Registrations held before they go to the writer anyway (a model built in a loop
# without steps must not grow memory without bound; ~200 bytes each).
PENDING_MAX = 50_000
# A key absent from the payload (``parent_source`` / ``module_source`` are only
# written for a module first seen in that event, and may then be null).
ABSENT: Any = object()

# kind, ts_ns, step, module_id, tensor_id, then the facts (flat: one object each)
Pending = tuple[Any, ...]

_class_names: dict[type, str] = {}
_devices: dict[torch.device, str] = {}


def qualified(cls: type) -> str:
    """Qualified class name, as events record it (``torch.nn.modules.linear.Linear``)."""
    name = _class_names.get(cls)
    if name is None:
        name = _class_names[cls] = f"{cls.__module__}.{cls.__qualname__}"
    return name


def _device(device: torch.device) -> str:
    name = _devices.get(device)
    if name is None:
        name = _devices[device] = str(device)
    return name


def payload(kind: str, facts: tuple[Any, ...]) -> Clean:
    """The event's payload, exactly as the hooks used to build it (docs/events.md)."""
    if kind == "module_registered":
        name, child_id, child_cls, parent_cls, source, parent_source, adopted, detected_at = facts
        out = Clean({
            "name": name,
            "child_id": child_id,
            "child_class": child_cls,
            "parent_class": parent_cls,
            "source": None if adopted else site_location(source),
        })
        if parent_source is not ABSENT:
            out["parent_source"] = site_location(parent_source)
    else:
        (name, module_cls, shape, dtype, device, lazy, flag, source, module_source, adopted, detected_at) = facts
        out = Clean(name=name, module_class=module_cls)
        if dtype is None:
            out.update(shape=None, dtype=None, device=None)
        elif lazy:
            out.update(shape=None, dtype=dtype_name(dtype), device=_device(device), lazy=True)
        else:
            out.update(shape=list(shape), dtype=dtype_name(dtype), device=_device(device))
        out["requires_grad" if kind == "parameter_registered" else "persistent"] = flag
        out["source"] = site_location(source)
        if module_source is not ABSENT:
            out["module_source"] = site_location(module_source)
    if adopted:
        out["adopted"] = True
    if detected_at is not None:
        out["detected_at"] = detected_at
    return out


class Registrations:
    """A batch of pending registrations, in hook order; payloads built once, on demand.

    Both the writer (to encode) and the recorder (to fold the replayed state)
    ask for payloads; whichever comes first builds each one (a list slot is
    written atomically; both would build the same dict).
    """

    __slots__ = ("items", "payloads")

    def __init__(self, items: list[Pending]) -> None:
        self.items = items
        self.payloads: list[Clean | None] = [None] * len(items)

    def __len__(self) -> int:
        return len(self.items)

    def payload(self, index: int) -> Clean:
        built = self.payloads[index]
        if built is None:
            item = self.items[index]
            built = self.payloads[index] = payload(item[0], item[5:])
        return built

    def records(self) -> Iterator[tuple[Any, ...]]:
        """The ordinary records ``(kind, ts_ns, step, module_id, tensor_id, payload)``."""
        for index, item in enumerate(self.items):
            yield (*item[:5], self.payload(index))
