"""The small type language of event payloads, and the ``Kind`` and ``Field`` records.

A payload is JSON, so its types are JSON's, with the few forms the recorder adds:
a number may be the text ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``
(``core.values.finite_or_text``), and a long vector is *packed* into one base64
string (``core.packed``): ``F32`` for float32 vectors, ``INTS`` for integer lists.
Each type can say whether a value matches it (``problems``; the test of every
emitted payload uses it) and how it reads in the docs (``text``).

The table of kinds built from these is ``core.kinds``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

NONFINITE_TEXT = frozenset({"NaN", "Infinity", "-Infinity"})


class Type:
    """A payload value's type. ``a | b``: either."""

    def problems(self, value: Any, at: str) -> Iterator[str]:
        """What is wrong with ``value`` (at path ``at``) for this type; nothing when it matches."""
        raise NotImplementedError

    def text(self) -> str:
        """How the docs name this type."""
        raise NotImplementedError

    def packing(self) -> str | None:
        """``"f32"`` or ``"ints"`` for a packed vector (also under ``| null``), else None."""
        return None

    def __or__(self, other: Type) -> Type:
        mine = self.options if isinstance(self, OneOf) else (self,)
        theirs = other.options if isinstance(other, OneOf) else (other,)
        return OneOf(mine + theirs)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Scalar(Type):
    """A JSON scalar: ``string``, ``int``, ``number``, ``bool``, ``null`` (``values``: the
    only strings allowed, for an enumeration)."""

    name: str
    values: frozenset[str] = frozenset()

    def problems(self, value: Any, at: str) -> Iterator[str]:
        ok = {
            "string": isinstance(value, str) and (not self.values or value in self.values),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": (isinstance(value, (int, float)) and not isinstance(value, bool))
            or (isinstance(value, str) and value in NONFINITE_TEXT),
            "bool": isinstance(value, bool),
            "null": value is None,
            "any": True,
        }[self.name]
        if not ok:
            yield f"{at}: {_shown(value)} is not {self.text()}"

    def text(self) -> str:
        return " | ".join(f"'{v}'" for v in sorted(self.values)) if self.values else self.name


@dataclass(frozen=True)
class OneOf(Type):
    """Any of ``options``."""

    options: tuple[Type, ...]

    def problems(self, value: Any, at: str) -> Iterator[str]:
        found = [list(option.problems(value, at)) for option in self.options]
        if all(found):  # the closest option's problems (an object with one field wrong: that field)
            deeper = [p for p in found if not p[0].startswith(f"{at}: ")]
            yield from (
                min(deeper, key=len) if deeper else [f"{at}: {_shown(value)} is not {self.text()}"]
            )

    def text(self) -> str:
        return " | ".join(option.text() for option in self.options)

    def packing(self) -> str | None:
        return next((p for option in self.options if (p := option.packing()) is not None), None)


@dataclass(frozen=True)
class ListOf(Type):
    """A JSON array of ``item``."""

    item: Type

    def problems(self, value: Any, at: str) -> Iterator[str]:
        if not isinstance(value, list):
            yield f"{at}: {_shown(value)} is not a list"
            return
        for i, element in enumerate(value):
            yield from self.item.problems(element, f"{at}[{i}]")

    def text(self) -> str:
        return f"list[{self.item.text()}]"


@dataclass(frozen=True)
class MapOf(Type):
    """A JSON object whose keys are data (``{name: value}``), every value of type ``value``."""

    value: Type

    def problems(self, value: Any, at: str) -> Iterator[str]:
        if not isinstance(value, dict):
            yield f"{at}: {_shown(value)} is not an object"
            return
        for key, element in value.items():
            yield from self.value.problems(element, f"{at}.{key}")

    def text(self) -> str:
        return "object" if self.value == ANY else f"{{str: {self.value.text()}}}"


@dataclass(frozen=True)
class Obj(Type):
    """A JSON object with named ``fields`` (those in ``optional`` may be absent); keys
    outside them are allowed only when ``more`` gives their type."""

    fields: Mapping[str, Type]
    optional: frozenset[str] = frozenset()
    more: Type | None = None

    def problems(self, value: Any, at: str) -> Iterator[str]:
        if not isinstance(value, dict):
            yield f"{at}: {_shown(value)} is not an object"
            return
        for name, kind in self.fields.items():
            if name in value:
                yield from kind.problems(value[name], f"{at}.{name}")
            elif name not in self.optional:
                yield f"{at}: no {name!r}"
        for name in value.keys() - self.fields.keys():
            if self.more is None:
                yield f"{at}: unexpected {name!r}"
            else:
                yield from self.more.problems(value[name], f"{at}.{name}")

    def text(self) -> str:
        return "object"


@dataclass(frozen=True)
class Packed(Type):
    """A vector packed as base64 (``core.packed``): ``f32`` ``{f32: BASE64, absent?: [int]}``,
    ``ints`` ``{i16|i32|i64: BASE64}``. Records written before packing hold a plain list;
    readers decode both to the list, the recorder writes only this form."""

    form: str

    def problems(self, value: Any, at: str) -> Iterator[str]:
        if self.form == "f32":
            ok = (
                isinstance(value, dict)
                and isinstance(value.get("f32"), str)
                and value.keys() <= {"f32", "absent"}
                and all(isinstance(i, int) for i in value.get("absent", []))
            )
        else:
            ok = (
                isinstance(value, dict)
                and len(value) == 1
                and isinstance(value.get(next(iter(value), "")), str)
            )
            ok = ok and next(iter(value)) in ("i16", "i32", "i64")
        if not ok:
            yield f"{at}: {_shown(value)} is not a packed {self.form} vector"

    def text(self) -> str:
        return f"packed {self.form}"

    def packing(self) -> str | None:
        return self.form


STR = Scalar("string")
INT = Scalar("int")
NUM = Scalar("number")
BOOL = Scalar("bool")
NULL = Scalar("null")
ANY = Scalar("any")
OBJ = MapOf(ANY)
F32 = Packed("f32")
INTS = Packed("ints")


def enum(*values: str) -> Scalar:
    """A string that is one of ``values``."""
    return Scalar("string", frozenset(values))


def obj(optional: tuple[str, ...] = (), more: Type | None = None, **fields: Type) -> Obj:
    """``Obj`` spelled inline: ``obj(file=STR, line=INT, optional=("kind",))``."""
    return Obj(fields, frozenset(optional), more)


@dataclass(frozen=True)
class Field:
    """One payload field: its type as stored, what it means, whether it may be absent."""

    type: Type
    doc: str
    optional: bool = False

    @property
    def packing(self) -> str | None:
        """``"f32"`` / ``"ints"`` when the field is stored packed (readers decode it)."""
        return self.type.packing()


def F(type_: Type, doc: str, optional: bool = False) -> Field:
    """A ``Field``, short enough for the table of kinds."""
    return Field(type_, doc, optional)


@dataclass(frozen=True)
class Kind:
    """One event kind: its name, what it records, its payload fields, and the line
    ``auditlog events`` shows for it (``summary``: templates, ``cli/summaries.py``)."""

    name: str
    doc: str
    fields: dict[str, Field]
    summary: tuple[tuple[str | None, str], ...] = field(default=())

    def packed(self, form: str) -> tuple[str, ...]:
        """The fields stored packed as ``form`` (``"f32"`` or ``"ints"``)."""
        return tuple(name for name, f in self.fields.items() if f.packing == form)

    def problems(self, payload: Any) -> list[str]:
        """What is wrong with a stored payload of this kind: a field missing, unknown, or
        of the wrong type (empty when it matches the definition)."""
        spec = Obj(
            {name: f.type for name, f in self.fields.items()},
            frozenset(name for name, f in self.fields.items() if f.optional),
        )
        return list(spec.problems(payload, self.name))
