"""Stable per-run integer ids for modules, tensors and optimizers, held weakly.

Names are not identities: a child's parameters register before the child is
attached, a tied weight has two names, a replaced head reuses a name. Events carry
these ids and names are recomputed by replay. Entries vanish when the object dies,
so recording never keeps a model alive; ``id()`` reuse after death is handled by
checking that the weak reference still points at the same object.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any


class ObjectIds:
    """Maps live objects to small integer ids that are never reused within a run."""

    def __init__(self) -> None:
        self._ids: dict[int, tuple[weakref.ref[Any], int]] = {}
        self._by_number: dict[int, weakref.ref[Any]] = {}
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def lookup(self, obj: object) -> int | None:
        """Return the id of ``obj`` if it has one, without assigning."""
        entry = self._ids.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        return None

    def get(self, obj: object) -> tuple[int, bool]:
        """Return ``(id, is_new)`` for ``obj``, assigning a fresh id on first sight."""
        entry = self._ids.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1], False
        with self._lock:
            entry = self._ids.get(id(obj))
            if entry is not None and entry[0]() is obj:
                return entry[1], False
            key = id(obj)
            number = next(self._counter)
            ref = weakref.ref(obj, self._forget(key, number))
            self._ids[key] = (ref, number)
            self._by_number[number] = ref
            return number, True

    def object(self, number: int) -> Any:
        """The live object with this id, or None if it died (or never had it)."""
        ref = self._by_number.get(number)
        return None if ref is None else ref()

    def _forget(self, key: int, number: int) -> Any:
        ids = self._ids
        by_number = self._by_number

        def callback(_ref: weakref.ref[Any]) -> None:
            entry = ids.get(key)
            if entry is not None and entry[1] == number:
                ids.pop(key, None)
            by_number.pop(number, None)

        return callback

    def __len__(self) -> int:
        return len(self._ids)
