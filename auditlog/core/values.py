"""Plain values as the record stores them: non-finite floats as text, times as ISO 8601.

JSON has no NaN or Infinity, so the record writes them as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``; ``stat_float`` reads them back. Shared by
the writer, the read model and every reader, and free of torch on purpose.
"""

from __future__ import annotations

import math
import time


def finite_or_text(value: float) -> float | str:
    """JSON has no NaN/Infinity; encode them as strings so no information is lost."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def stat_float(value: object) -> float | None:
    """A stored statistic back as a float (the inverse of ``finite_or_text``); None if absent."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def iso(ns: int) -> str:
    """UTC ISO-8601 with milliseconds and a Z."""
    seconds = ns / 1e9
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        + f".{int(ns % 1_000_000_000) // 1_000_000:03d}Z"
    )
