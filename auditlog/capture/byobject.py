"""Values kept per live object (an optimizer), the object held weakly.

The optimizer-step hooks set and take a value per optimizer at every step.
``weakref.WeakKeyDictionary`` makes a new weak reference with a callback at every
assignment; here each object gets one for its life, and an assignment is a dict
store. As with a weak-keyed dict, nothing here keeps the object alive, and its
value goes when it does.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ByObject(Generic[V]):
    """A value per live object, by identity; the object held weakly."""

    __slots__ = ("__weakref__", "_refs", "_values")

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._values: dict[int, V] = {}

    def set(self, obj: object, value: V) -> None:
        key = id(obj)
        ref = self._refs.get(key)
        if ref is None or ref() is not obj:  # new, or a dead object's id reused
            self._refs[key] = weakref.ref(obj, functools.partial(_drop, weakref.ref(self), key))
        self._values[key] = value

    def get(self, obj: object) -> V | None:
        key = id(obj)
        ref = self._refs.get(key)
        return self._values.get(key) if ref is not None and ref() is obj else None

    def pop(self, obj: object, default: None = None) -> V | None:
        key = id(obj)
        ref = self._refs.get(key)
        return self._values.pop(key, None) if ref is not None and ref() is obj else None

    def __setitem__(self, obj: object, value: V) -> None:
        self.set(obj, value)

    def clear(self) -> None:
        self._refs.clear()
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


def _drop(owner: weakref.ref[ByObject[Any]], key: int, gone: weakref.ref[Any]) -> None:
    """The object died: its value goes (unless its id already names a newer object)."""
    table = owner()
    if table is not None and table._refs.get(key) is gone:
        del table._refs[key]
        table._values.pop(key, None)
