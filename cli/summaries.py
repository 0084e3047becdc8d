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

import re
from collections.abc import Callable
from typing import Any

from auditlog.core.kinds import KINDS

_PLACE = re.compile(r"\{([^{}:]*)(?::([a-z0-9]+))?\}")
_OPTIONAL = re.compile(r"\[([^\[\]|]*)(?:\|([^\[\]]*))?\]")
_ABSENT: tuple[Any, ...] = (None, "", [], {})


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _l2(values: Any) -> str:
    """The L2 norm of a vector's numeric entries (a packed vector is decoded by then)."""
    norms = [n for n in values or [] if isinstance(n, (int, float))] if isinstance(values, list) else []
    return _number(sum(n * n for n in norms) ** 0.5)


def _stats_nonfinite(payload: Any) -> int | None:
    """Tensors with NaN/Inf among an activity payload's calls (None when there are none)."""
    calls = [c for side in ("forward", "backward") for c in _list(_at(payload, side)) if isinstance(c, dict)]
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


def _at(payload: Any, path: str) -> Any:
    value = payload
    for part in path.split(".") if path else ():
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _value(payload: Any, match: re.Match[str]) -> Any:
    """The formatted value of one ``{path:format}``, or None when absent."""
    raw = _at(payload, match.group(1))
    if match.group(2) is None:
        return raw
    try:
        return FORMATS[match.group(2)](raw)
    except (TypeError, ValueError, OverflowError):
        return str(raw)


def _fill(text: str, payload: Any) -> str:
    return _PLACE.sub(lambda m: str(_value(payload, m)), text)


def render(template: str, payload: Any) -> str:
    """``template`` filled from ``payload`` (see the module docstring), in one pass: a
    value's own text is never read as a template."""
    out: list[str] = []
    last = 0
    for segment in _OPTIONAL.finditer(template):
        out.append(_fill(template[last : segment.start()], payload))
        inner, otherwise = segment.group(1), segment.group(2) or ""
        places = list(_PLACE.finditer(inner))
        values = [_at(payload, m.group(1)) for m in places] + [_value(payload, m) for m in places]
        absent = any(v is None or (not isinstance(v, (int, float)) and v in _ABSENT) for v in values)
        out.append(_fill(otherwise if absent else inner, payload))
        last = segment.end()
    out.append(_fill(template[last:], payload))
    return "".join(out)


def summarize(kind: str, payload: dict[str, Any]) -> str:
    """One human line per event (empty for a kind that defines no summary)."""
    known = KINDS.get(kind)
    for when, template in known.summary if known is not None else ():
        if when is not None:
            name, _, wanted = when.partition("=")
            if str(_at(payload, name)) != wanted:
                continue
        return render(template, payload)
    return ""
