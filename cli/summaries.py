"""The one-line summary ``auditlog events`` shows for an event, from its kind's definition.

Which fields a summary shows is part of the kind (``Kind.summary`` in
``auditlog.core.kinds``); this module only renders the templates, so a new kind
or field needs no change here. A template is text with

- ``{path}`` or ``{path:format}``: a payload value; ``path`` is dotted (``a.b``, a
  number indexes a list: ``param_groups.0.lr``), empty for the whole payload;
  a missing value is None (shown as ``None``). ``format`` is one of ``FORMATS``.
- ``[...]``: shown only when every value inside is present (not None, empty text,
  list or object; a format may also answer None); ``[A|B]`` shows ``B`` instead.

A kind's summary is a list of ``(when, template)``: the first whose ``when``
(``field=value``, or None for always) holds is used.

Payloads come from a file anyone may have edited: nothing here raises on a value
of an unexpected type; it is shown as text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from auditlog.core.kinds import KINDS

_PLACE = re.compile(r"\{([^{}:]*)(?::([a-z0-9]+))?\}")
_OPTIONAL = re.compile(r"\[([^\[\]|]*)(?:\|([^\[\]]*))?\]")
_ABSENT: tuple[Any, ...] = (None, "", [], {})


def _number(value: Any) -> str:
    return (
        f"{value:.4g}"
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else str(value)
    )


def _l2(values: Any) -> str:
    """The L2 norm of a vector's numeric entries (a packed vector is decoded by then)."""
    norms = (
        [n for n in values or [] if isinstance(n, (int, float))] if isinstance(values, list) else []
    )
    return _number(sum(n * n for n in norms) ** 0.5)


def _stats_nonfinite(payload: Any) -> int | None:
    """Tensors with NaN/Inf among an activity payload's calls (None when there are none)."""
    calls = [
        c
        for side in ("forward", "backward")
        for c in _list(_at(payload, (side,)))
        if isinstance(c, dict)
    ]
    count = sum(
        1
        for call in calls
        for name in ("outputs", "grad_outputs", "grad_inputs")
        for stats in _list(call.get(name))
        if isinstance(stats, dict) and (stats.get("nan") or stats.get("inf"))
    )
    return count or None


FORMATS: dict[str, Callable[[Any], Any]] = {
    "class": lambda v: str(v or "None").rsplit(".", 1)[-1],  # a qualified class name, shortened
    "count": lambda v: len(v) if isinstance(v, (list, dict, str)) else 0,
    "num": _number,
    "l2": _l2,
    "words": lambda v: " ".join(str(w) for w in _list(v))[:80],  # a command line
    "repr": repr,
    "id12": lambda v: str(v)[:12],  # a run id, shortened
    "nonfinite": _stats_nonfinite,
}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


Place = tuple[tuple[str, ...], str | None]
"""One ``{path:format}``: the path's parts and the format (None: the value as it is)."""
Part = str | Place | tuple[list["Part"], list["Part"]]
"""Literal text, a place, or an optional segment: (its parts, the parts shown instead)."""


def _at(payload: Any, path: tuple[str, ...]) -> Any:
    value = payload
    for part in path:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _places(text: str) -> list[Part]:
    parts: list[Part] = []
    last = 0
    for match in _PLACE.finditer(text):
        parts.append(text[last : match.start()])
        path = tuple(match.group(1).split(".")) if match.group(1) else ()
        parts.append((path, match.group(2)))
        last = match.end()
    parts.append(text[last:])
    return [p for p in parts if p != ""]


@functools.cache
def compile_template(template: str) -> list[Part]:
    """``template`` parsed once (the kinds' templates are few; each is rendered per event)."""
    parts: list[Part] = []
    last = 0
    for segment in _OPTIONAL.finditer(template):
        parts.extend(_places(template[last : segment.start()]))
        parts.append((_places(segment.group(1)), _places(segment.group(2) or "")))
        last = segment.end()
    parts.extend(_places(template[last:]))
    return parts


def _value(payload: Any, place: Place) -> tuple[Any, Any]:
    """The raw and the formatted value of one place."""
    raw = _at(payload, place[0])
    if place[1] is None:
        return raw, raw
    try:
        return raw, FORMATS[place[1]](raw)
    except (TypeError, ValueError, OverflowError):
        return raw, str(raw)


def _absent(value: Any) -> bool:
    return value is None or (not isinstance(value, (int, float)) and value in _ABSENT)


def _fill(parts: list[Part], payload: Any, out: list[str]) -> None:
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part[0], list):  # an optional segment
            inner, otherwise = part
            places = [p for p in inner if not isinstance(p, str)]
            missing = any(_absent(v) for p in places for v in _value(payload, p))  # type: ignore[arg-type]
            _fill(otherwise if missing else inner, payload, out)
        else:
            out.append(str(_value(payload, part)[1]))


def render(template: str, payload: Any) -> str:
    """``template`` filled from ``payload`` (see the module docstring), in one pass: a
    value's own text is never read as a template."""
    out: list[str] = []
    _fill(compile_template(template), payload, out)
    return "".join(out)


def summarize(kind: str, payload: dict[str, Any]) -> str:
    """One human line per event (empty for a kind that defines no summary)."""
    known = KINDS.get(kind)
    for when, template in known.summary if known is not None else ():
        if when is not None:
            name, _, wanted = when.partition("=")
            if str(_at(payload, tuple(name.split(".")))) != wanted:
                continue
        return render(template, payload)
    return ""
