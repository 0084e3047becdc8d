"""Stable per-run integer ids: modules and optimizers held weakly, tensors held not at all.

Names are not identities: a child's parameters register before the child is
attached, a tied weight has two names, a replaced head reuses a name. Events carry
these ids and names are recomputed by replay.

Modules and optimizers (``ObjectIds``) are held by weak references: recording
never keeps a model alive, and ``torch.utils.swap_tensors`` is about tensors, so
a weak reference on a module or optimizer never stands in the user's way.

Tensors (``TensorIds``) are held by no reference of any kind, not even a weak
one: ``torch.utils.swap_tensors`` refuses a tensor with a weak reference, and
torch swaps parameters in ``load_state_dict``, ``Module.to()`` (with
``torch.__future__.set_swap_module_params_on_conversion(True)``, or for
traceable subclasses such as DTensor) and in parametrizations. A tensor's id is
keyed by its ``id()`` and remembered together with the places that hold it (a
module and member name, or an optimizer). ``id()`` values are reused after an
object dies, so an entry counts only while one of its places still holds that
very object; a place is checked when the id is asked for, by identity, never by
keeping the tensor.

What this means for ids (docs/hooks.md says it to users): ``swap_tensors``
exchanges the contents of two Python objects, so a swapped parameter keeps its
id (same object, same place; its new dtype or device is a structure change); a
tensor that no recorded module and no optimizer holds any more, then is put back
somewhere, gets a new id.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import torch

from auditlog.capture.torch_compat import buffers_of, parameters_of

# A place that holds a tensor: (weak reference to the holder, member, name).
# member: "parameter" | "buffer" (name: the key in the module's dict), or
# "optimizer" (name unused: any of its param_groups).
Place = tuple[weakref.ref[Any], str, str]


class _IdRef(weakref.ref):  # type: ignore[type-arg]
    """The weak reference to a module or optimizer that also carries its id, its
    address and where the module was built (``code``, ``line``: the constructing
    frame, noted by the ``nn.Module.__init__`` wrapper (constructors.py) or found
    at first sight (source.py); ``attached``: that line is only where the module
    was attached, its constructor was not seen). One object per module: a building model's registrations add
    few objects for the cyclic garbage collector to traverse (closures, tuples
    and a second weak-keyed table per module made its full collections several
    times longer during a large model's build: docs/performance.md). A module noted
    at construction has the
    reference before it has an id (``number`` None until it is first registered),
    so the note adds no object either."""

    __slots__ = ("attached", "code", "key", "line", "number")
    key: int
    number: int | None
    code: Any
    line: int | None
    attached: bool


class ObjectIds:
    """Maps live modules and optimizers to small integer ids never reused within a run."""

    def __init__(self) -> None:
        self._ids: dict[int, _IdRef] = {}
        self._by_number: dict[int, _IdRef] = {}
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._callback = self._forget  # one bound method for every reference

    def lookup(self, obj: object) -> int | None:
        """Return the id of ``obj`` if it has one, without assigning."""
        ref = self._ids.get(id(obj))
        if ref is not None and ref() is obj:
            return ref.number  # None: noted at construction, no id yet
        return None

    def get(self, obj: object) -> tuple[int, bool]:
        """Return ``(id, is_new)`` for ``obj``, assigning a fresh id on first sight."""
        ref, new = self.get_ref(obj)
        number = ref.number
        assert number is not None  # get_ref numbers every reference it returns
        return number, new

    def get_ref(self, obj: object) -> tuple[_IdRef, bool]:
        """Like ``get``, with the reference that carries the id and its notes."""
        ref = self._ids.get(id(obj))
        if ref is not None and ref() is obj and ref.number is not None:
            return ref, False
        with self._lock:
            key = id(obj)
            ref = self._ids.get(key)
            if ref is not None and ref() is obj:
                if ref.number is not None:
                    return ref, False
            else:
                ref = _IdRef(obj, self._callback)
                ref.key, ref.code, ref.line, ref.attached = key, None, None, False
                self._ids[key] = ref
            number = ref.number = next(self._counter)
            self._by_number[number] = ref
            return ref, True

    def note(self, obj: object, site: tuple[Any, int]) -> None:
        """Remember where ``obj`` was constructed, before it has an id (constructors.py).

        An object that already has a reference keeps its notes (``Module.__init__``
        run again on a live module says nothing new about where it was built). No
        lock: the object is in its constructor, on this thread; only a live one's
        id is given out (``get_ref``, under the lock)."""
        key = id(obj)
        ref = self._ids.get(key)
        if ref is not None and ref() is obj:
            return
        ref = _IdRef(obj, self._callback)
        ref.key, ref.number, ref.attached = key, None, False
        ref.code, ref.line = site
        self._ids[key] = ref

    def entry(self, obj: object) -> _IdRef | None:
        """The weak reference holding ``obj``'s id and notes, or None (no id)."""
        ref = self._ids.get(id(obj))
        return ref if ref is not None and ref() is obj else None

    def object(self, number: int) -> Any:
        """The live object with this id, or None if it died (or never had it)."""
        ref = self._by_number.get(number)
        return None if ref is None else ref()

    def _forget(self, ref: _IdRef) -> None:
        if self._ids.get(ref.key) is ref:
            self._ids.pop(ref.key, None)
        if ref.number is not None:
            self._by_number.pop(ref.number, None)

    def __len__(self) -> int:
        return len(self._ids)


class _Places:
    """Per tensor id, the places that hold it; the first one in three plain dicts.

    Nearly every tensor has one place: kept as dict values (no tuple, no list
    per tensor), a 5,000-tensor build leaves few new objects for the cyclic
    garbage collector, whose full collections otherwise lengthen the build."""

    __slots__ = ("_member", "_more", "_name", "_ref")

    def __init__(self) -> None:
        self._ref: dict[int, weakref.ref[Any]] = {}
        self._member: dict[int, str] = {}
        self._name: dict[int, str] = {}
        self._more: dict[int, list[Place]] = {}

    def get(self, number: int) -> tuple[Place, ...]:
        ref = self._ref.get(number)
        if ref is None:
            return ()
        first = (ref, self._member[number], self._name[number])
        more = self._more.get(number)
        return (first,) if more is None else (first, *more)

    def add(self, number: int, ref: weakref.ref[Any], member: str, name: str) -> None:
        if number not in self._ref:
            self._ref[number], self._member[number], self._name[number] = ref, member, name
        else:
            self._more.setdefault(number, []).append((ref, member, name))

    def holds_first(self, number: int, address: int) -> bool:
        """Does the first place (a module's parameter or buffer) hold the object at
        ``address``? The common case of ``TensorIds._purge``, inline."""
        ref = self._ref.get(number)
        holder = None if ref is None else ref()
        if holder is None:
            return False
        member = self._member[number]
        if member == "optimizer":
            return False
        table = parameters_of(holder) if member == "parameter" else buffers_of(holder)
        return id(table.get(self._name[number])) == address

    def pop(self, number: int) -> None:
        for table in (self._ref, self._member, self._name, self._more):
            table.pop(number, None)


class TensorIds:
    """Maps tensors to small integer ids without holding any reference to them.

    ``lookup``/``get`` take the tensor in hand and check that one of the places
    remembered for its ``id()`` holds exactly this object; ``object`` finds a
    tensor again through its places. ``note_optimizer`` records which objects an
    optimizer holds, so that tensors no module holds (an optimizer over a bare
    list) are checked the same way.
    """

    def __init__(self) -> None:
        self._numbers: dict[int, int] = {}  # id(tensor) -> number
        self._address: dict[int, int] = {}  # number -> id(tensor)
        self._places = _Places()  # number -> where it is held
        # The weak reference to a holder to keep in its places: the one that holds
        # the module's id when there is one (ObjectIds.entry), no second one.
        self.ref_of: Any = lambda holder: None
        # optimizer -> ids of the objects in its param_groups when last noted
        self._members: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._purge_at = 4096

    # ------------------------------------------------------------------ queries
    def lookup(self, tensor: torch.Tensor) -> int | None:
        """The id of ``tensor`` if a remembered place still holds it, without assigning."""
        number = self._numbers.get(id(tensor))
        if number is not None and self._held(number, tensor):
            return number
        return None

    def address(self, number: int) -> int | None:
        """The ``id()`` the tensor with this number had when last seen."""
        return self._address.get(number)

    def object(self, number: int) -> torch.Tensor | None:
        """The tensor with this id, found through the places that hold it, or None."""
        address = self._address.get(number)
        if address is None:
            return None
        for place in self._places.get(number):
            found = _at(place, address)
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------ assignment
    def get(
        self,
        tensor: torch.Tensor,
        holder: Any = None,
        member: str = "optimizer",
        name: str = "",
    ) -> tuple[int, bool]:
        """Return ``(id, is_new)``; ``holder``/``member``/``name`` say where the tensor is
        (or is being put: registration hooks run before the module's dict is written).

        An id whose places no longer hold this object belonged to an object that
        died at the same address: the tensor gets a fresh id.
        """
        address = id(tensor)
        number = self._numbers.get(address)
        if number is not None and self._held(number, tensor):
            if holder is not None:
                self._add_place(number, holder, member, name)
            return number, False
        with self._lock:
            number = next(self._counter)
            self._numbers[address] = number
            self._address[number] = address
            self._places.pop(number)
            if holder is not None:
                self._add_place(number, holder, member, name)
            if len(self._address) > self._purge_at:
                self._purge(keep=number)
            return number, True

    def note_optimizer(self, optimizer: Any, tensors: list[torch.Tensor]) -> None:
        """Remember which objects ``optimizer`` holds now (its parameters keep them alive)."""
        self._members[optimizer] = frozenset(map(id, tensors))

    # ------------------------------------------------------------------ internals
    def _add_place(self, number: int, holder: Any, member: str, name: str) -> None:
        for ref, m, n in self._places.get(number):
            if m == member and n == name and ref() is holder:
                return
        ref = self.ref_of(holder)
        self._places.add(number, weakref.ref(holder) if ref is None else ref, member, name)

    def _held(self, number: int, tensor: torch.Tensor) -> bool:
        """Does a remembered place hold this very object?"""
        for ref, member, name in self._places.get(number):
            holder = ref()
            if holder is None:
                continue
            if member == "optimizer":
                members = self._members.get(holder)
                if members is not None and id(tensor) in members:
                    return True
                continue
            table = parameters_of(holder) if member == "parameter" else buffers_of(holder)
            if table.get(name) is tensor:
                return True
        return False

    def _purge(self, keep: int) -> None:
        """Forget ids no place holds any more (their tensors died or moved away unseen).

        ``keep``: the id just assigned, whose module dict a registration hook is
        about to write (the hook runs before torch stores the tensor)."""
        held = self._places.holds_first
        for number, address in list(self._address.items()):
            if number == keep or held(number, address):
                continue
            if any(self._holds(place, address) for place in self._places.get(number)):
                continue
            self._address.pop(number, None)
            self._places.pop(number)
            if self._numbers.get(address) == number:
                del self._numbers[address]
        self._purge_at = max(4096, 2 * len(self._address))

    def _holds(self, place: Place, address: int) -> bool:
        ref, member, name = place
        holder = ref()
        if holder is None:
            return False
        if member == "optimizer":
            members = self._members.get(holder)
            return members is not None and address in members
        table = parameters_of(holder) if member == "parameter" else buffers_of(holder)
        return id(table.get(name)) == address

    def __len__(self) -> int:
        return len(self._address)


def _at(place: Place, address: int) -> torch.Tensor | None:
    """The object at ``place`` if its ``id()`` is ``address``."""
    ref, member, name = place
    holder = ref()
    if holder is None:
        return None
    if member == "optimizer":
        for group in holder.param_groups:
            for tensor in group["params"]:
                if id(tensor) == address:
                    return tensor  # type: ignore[no-any-return]
        return None
    table = parameters_of(holder) if member == "parameter" else buffers_of(holder)
    found = table.get(name)
    return found if found is not None and id(found) == address else None
