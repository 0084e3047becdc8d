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
tuple at its first pass (before, a large model's build made enough more tracked
objects to add a full collection to the build: docs/performance.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from auditlog.capture.source import Location, module_kind, site_location
from auditlog.core.chain import Clean
from auditlog.core.replay import ModelState, apply
from auditlog.core.tensors import dtype_name

if TYPE_CHECKING:
    from auditlog.capture.records import EventRecord

# Pending values (~15-20 per registration, 8 bytes each) held before they go to
# the writer anyway: a model built in a loop without steps must not grow memory
# without bound.
PENDING_MAX = 500_000
# A key absent from the payload (``parent_source`` / ``module_source`` are only
# written for a module first seen in that event, and may then be null).
ABSENT: Any = object()

# The pending queue is flat: each registration is a run of plain values (see
# ``MODULE_WIDTH`` / ``TENSOR_WIDTH``), appended with one ``deque.extend`` (atomic
# under the GIL: the queue always holds whole records). No object per
# registration survives on the training thread, which keeps the garbage
# collector's allocation counts, and so its full collections, close to a bare build's.
#
# module_registered: kind, ts_ns, step, parent_id, None, name, child_id,
#   child_class, parent_class, source code, source line, source attached,
#   parent_source code (ABSENT: no key), parent_source line, parent_source attached,
#   adopted, detected_at
# parameter/buffer_registered: kind, ts_ns, step, module_id, tensor_id, name,
#   module_class, dtype, device, lazy, requires_grad/persistent, source code,
#   source line, module_source code (ABSENT: no key), module_source line,
#   module_source attached, adopted, detected_at, ndim (None: no shape), then the
#   ndim sizes
# "attached": the module's line is where it was attached, its constructor was not
# seen (source.module_kind).
MODULE_WIDTH = 17
TENSOR_WIDTH = 19
Pending = Any

_class_names: dict[type, str] = {}
_devices: dict[torch.device, str] = {}


def qualified(cls: type) -> str:
    """Qualified class name, as events record it (``torch.nn.modules.linear.Linear``)."""
    name = _class_names.get(cls)
    if name is None:
        name = _class_names[cls] = f"{cls.__module__}.{cls.__qualname__}"
    return name


def class_name(obj: object) -> str:
    """Qualified class name of an object's type, as events record it."""
    return qualified(type(obj))


def _device(device: torch.device) -> str:
    name = _devices.get(device)
    if name is None:
        name = _devices[device] = str(device)
    return name


def _site(code: Any, line: Any, attached: bool | None = None) -> Location | None:
    """A location; with ``attached`` given, a module's (with its ``kind``)."""
    if code is None:
        return None
    return site_location((code, line), None if attached is None else module_kind(attached))


def _walk(flat: list[Any]) -> Iterator[tuple[list[Any], list[Any] | None]]:
    """Each flat registration as ``(its fixed-width values, its shape)``: the shape is
    the sizes after a tensor record's ``ndim`` (None without one, or for a module)."""
    index, end = 0, len(flat)
    while index < end:
        if flat[index] == "module_registered":
            yield flat[index : index + MODULE_WIDTH], None
            index += MODULE_WIDTH
            continue
        fields = flat[index : index + TENSOR_WIDTH]
        index += TENSOR_WIDTH
        ndim = fields[-1]
        shape = None
        if ndim is not None:
            shape = flat[index : index + ndim]
            index += ndim
        yield fields, shape


def parse(flat: list[Any]) -> list[EventRecord]:
    """The ordinary records ``(kind, ts_ns, step, module_id, tensor_id, payload)``
    of a run of flat registrations, payloads exactly as docs/events.md gives them."""
    out: list[EventRecord] = []
    for fields, shape in _walk(flat):
        kind = fields[0]
        if kind == "module_registered":
            (
                _,
                ts_ns,
                step,
                module_id,
                tensor_id,
                name,
                child_id,
                child_cls,
                parent_cls,
                code,
                line,
                attached,
                parent_code,
                parent_line,
                parent_attached,
                adopted,
                detected_at,
            ) = fields
            body = Clean(
                {
                    "name": name,
                    "child_id": child_id,
                    "child_class": child_cls,
                    "parent_class": parent_cls,
                    "source": None if adopted else _site(code, line, attached),
                }
            )
            if parent_code is not ABSENT:
                body["parent_source"] = _site(parent_code, parent_line, parent_attached)
        else:
            (
                _,
                ts_ns,
                step,
                module_id,
                tensor_id,
                name,
                module_cls,
                dtype,
                device,
                lazy,
                flag,
                code,
                line,
                module_code,
                module_line,
                module_attached,
                adopted,
                detected_at,
                _,
            ) = fields
            body = Clean(name=name, module_class=module_cls)
            if dtype is None:
                body.update(shape=None, dtype=None, device=None)
            elif lazy:
                body.update(shape=None, dtype=dtype_name(dtype), device=_device(device), lazy=True)
            else:
                body.update(shape=shape, dtype=dtype_name(dtype), device=_device(device))
            body["requires_grad" if kind == "parameter_registered" else "persistent"] = flag
            body["source"] = _site(code, line)
            if module_code is not ABSENT:
                body["module_source"] = _site(module_code, module_line, module_attached)
        if adopted:
            body["adopted"] = True
        if detected_at is not None:
            body["detected_at"] = detected_at
        out.append((kind, ts_ns, step, module_id, tensor_id, body))
    return out


class Registrations:
    """A batch of pending registrations, in hook order: parsed once into events
    (``records``) that the writer stores and the recorder folds into its replayed
    state (``fold_into``).
    """

    __slots__ = ("_flat", "_lock", "_records", "count")

    def __init__(self, flat: list[Any], count: int) -> None:
        self._flat: list[Any] | None = flat
        self._records: list[EventRecord] | None = None
        self._lock = threading.Lock()
        self.count = count

    def __len__(self) -> int:
        return self.count

    def records(self) -> list[EventRecord]:
        """The ordinary records ``(kind, ts_ns, step, module_id, tensor_id, payload)``."""
        records = self._records
        if records is None:
            with self._lock:
                records = self._records
                if records is None:
                    assert self._flat is not None
                    records = self._records = parse(self._flat)
                    self._flat = None  # the records say it all now
        return records

    def fold_into(self, state: ModelState) -> None:
        """Fold these registrations into the recorder's replayed state with the replay's
        own ``apply``: one definition of what an event does to the state. The records
        are parsed once (``records``) for this and the writer, whichever asks first;
        applying them costs about what a fold straight from the flat values did
        (docs/performance.md)."""
        for kind, _, _, module_id, tensor_id, payload in self.records():
            apply(
                state,
                {"kind": kind, "module_id": module_id, "tensor_id": tensor_id, "payload": payload},
            )
