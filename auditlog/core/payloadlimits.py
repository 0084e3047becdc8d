"""The size and depth limits of a stored payload, and the one parser that enforces them.

A payload is JSON text in ``events.db``, and the store is a file anyone with
write access may have crafted. Parsed as it comes, a payload nested 200,000
levels deep stops every reader with ``RecursionError`` (the standard library's
parser recurses once per level), and one of 200 MiB keeps a command busy for
minutes. So a payload has two documented limits (docs/events.md, "Payload
limits"), and every reader goes through ``parse_payload``:

- ``MAX_PAYLOAD_BYTES`` (64 MiB of UTF-8). The biggest payloads the recorder
  writes grow with the model (``construction_sealed``, and ``activity`` every
  step); 64 MiB leaves a wide margin above a large model's (a model of about
  200,000 modules reaches it; docs/performance.md).
- ``MAX_PAYLOAD_DEPTH`` (64 levels of objects and lists). The deepest payload
  the recorder writes is 6 levels (``run_started``'s environment, an
  annotation's fields); only a user's annotation nested 64 levels deep comes
  near.

The size is known before anything is parsed. The depth is measured without
recursion and without building anything: string literals are cut out (with
C-speed regular expressions), the brackets left are folded pairwise, one level
per pass, at most ``MAX_PAYLOAD_DEPTH`` passes. Most payloads hold fewer
brackets than the limit and skip even that. Past a limit the reader raises
``PayloadLimitError`` (exit 4) naming the event; the recorder refuses to
write such a payload at all (``recording.writer``: a ``recorder_error`` event
takes its place), so a payload past the limits was written by other means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from auditlog.core.errors import PayloadLimitError

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
MAX_PAYLOAD_DEPTH = 64

_STRINGS = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_PAIRED = bytes.maketrans(b"{}", b"[]")
_FOLD_BYTES = 64 * 1024  # more than this: measured with numpy instead of folded
_CHUNK = 1 << 20


class NotJSONError(ValueError):
    """The brackets or quotes of a payload do not pair: it is no JSON (found while measuring)."""


def limit_problem(text: str) -> str | None:
    """What puts payload ``text`` past a limit ("is nested more than 64 levels deep"), or None.

    Raises ``NotJSONError`` when its brackets or quotes do not pair (it could
    not be parsed anyway, and parsing it could recurse without end).
    """
    if len(text) > MAX_PAYLOAD_BYTES:  # (before encoding 200 MiB)
        return f"is {len(text):,} characters long, over the limit of {MAX_PAYLOAD_BYTES:,} bytes"
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_PAYLOAD_BYTES:
        return f"is {len(data):,} bytes long, over the limit of {MAX_PAYLOAD_BYTES:,} bytes"
    # Brackets inside strings count here too: an upper bound (``bytes.count`` is faster
    # than ``str.count``).
    if data.count(b"[") + data.count(b"{") > MAX_PAYLOAD_DEPTH and _deeper_than(
        data, MAX_PAYLOAD_DEPTH
    ):
        return f"is nested more than {MAX_PAYLOAD_DEPTH} levels deep"
    return None


def past_limits(text: Any) -> str | None:
    """``limit_problem`` for a stored value that may be anything: None for a non-string or
    for text that is no JSON (within the limits: no reader is stopped by it)."""
    if not isinstance(text, str):
        return None
    try:
        return limit_problem(text)
    except NotJSONError:
        return None


def _deeper_than(data: bytes, limit: int) -> bool:
    """Are the objects and lists of JSON text ``data`` nested more than ``limit`` deep?

    Raises ``NotJSONError`` when its quotes or brackets do not pair.
    """
    if b"\\" in data:  # an escaped backslash, then an escaped quote, are no quote
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Only brackets and quotes matter. Two quotes in a row end one string and open
    # the next (or hold an empty one): dropping them joins strings, still strings.
    kept = data.translate(_PAIRED, _NOT_STRUCTURE).replace(b'""', b"")
    if len(kept) > _FOLD_BYTES:
        depth = _deepest(kept)
        if depth < 0:
            raise NotJSONError("its quotes or brackets do not pair")
        return depth > limit
    brackets = _STRINGS.sub(b"", kept) if b'"' in kept else kept
    if b'"' in brackets:
        raise NotJSONError("a string is not closed")
    # Each pass removes the innermost pairs: a tree of height h is gone after h passes.
    for _ in range(limit):
        if not brackets:
            return False
        folded = brackets.replace(b"[]", b"")
        if len(folded) == len(brackets):
            raise NotJSONError("its brackets do not pair")
        brackets = folded
    if brackets and _deepest(brackets) < 0:
        raise NotJSONError("its brackets do not pair")
    return bool(brackets)


def _deepest(kept: bytes) -> int:
    """The greatest depth the brackets outside strings of ``kept`` (brackets and quotes)
    reach; -1 when a string is left open, a ``]`` closes nothing or a ``[`` stays open.

    Vectorized in chunks (numpy): a Python loop over 64 MiB takes seconds.
    """
    import numpy as np  # only here: most commands never need it, and it is slow to import

    codes = np.frombuffer(kept, dtype=np.uint8)
    top = level = quotes = 0
    for start in range(0, len(codes), _CHUNK):
        chunk = codes[start : start + _CHUNK]
        quote = chunk == ord('"')
        # after each byte, the count of quotes so far: odd inside a string (an opening quote too)
        inside = (np.cumsum(quote, dtype=np.int64) + quotes) & 1
        outside = (inside == 0) & ~quote
        signs = (chunk == ord("[")).astype(np.int64) - (chunk == ord("]")).astype(np.int64)
        levels = np.cumsum(signs * outside) + level
        if int(levels.min()) < 0:
            return -1
        top, level, quotes = max(top, int(levels.max())), int(levels[-1]), int(quotes + quote.sum())
    return top if level == 0 and quotes % 2 == 0 else -1


def event_label(event: Mapping[str, Any] | None, shown: str = "") -> str:
    """``event id 14 in store '...' (run '9e58487d6d21' stream 0 seq 14, kind 'metrics')``:
    how errors name an event (its columns as stored: any of them may be garbled)."""
    if event is None:
        return "an event" + (f" in store {shown!r}" if shown else "")
    where = f" in store {shown!r}" if shown else ""
    run = event.get("run_id")
    run_text = repr(run[:12]) if isinstance(run, str) else repr(run)
    return (
        f"event id {event.get('id')!r}{where} (run {run_text} stream {event.get('stream')!r} "
        f"seq {event.get('seq')!r}, kind {event.get('kind')!r})"
    )


def limit_error(
    problem: str, event: Mapping[str, Any] | None = None, shown: str = ""
) -> PayloadLimitError:
    """The one-line refusal of a payload past the limits, naming its event."""
    return PayloadLimitError(
        f"{event_label(event, shown)}: its payload {problem}; the recorder never writes a payload past "
        f"{MAX_PAYLOAD_BYTES >> 20} MiB or {MAX_PAYLOAD_DEPTH} levels (docs/events.md), so the store was "
        "edited; run `auditlog verify`"
    )


def parse_payload(text: str, event: Mapping[str, Any] | None = None, shown: str = "") -> Any:
    """``json.loads(text)`` within the limits.

    Raises ``PayloadLimitError`` (exit 4) naming ``event`` past a limit, and
    ``ValueError`` when the text is not JSON, before any deep work.
    """
    problem = limit_problem(text)
    if problem is not None:
        raise limit_error(problem, event, shown)
    return json.loads(text)


def loads_bounded(text: str | bytes) -> Any:
    """``json.loads`` for a document from outside the record (a proof, a head statement,
    an attestation, the read model's seal): past ``MAX_PAYLOAD_DEPTH`` levels it raises
    ``ValueError``, as for text that is not JSON, instead of recursing."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if data.count(b"[") + data.count(b"{") > MAX_PAYLOAD_DEPTH and _deeper_than(
        data, MAX_PAYLOAD_DEPTH
    ):
        raise NotJSONError(f"nested more than {MAX_PAYLOAD_DEPTH} levels deep")
    return json.loads(text)
