"""Stored text made inert for a terminal: control characters escaped, long values cut.

Names, kinds and payload text come from a store anyone with write access may have
crafted (docs/integrity.md, "crafted stores"): printed raw, an escape sequence
redraws the screen, a bidi override reorders what is read. Every text rendering
(``tree_text``, ``diff_text``, the CLI's tables and streams: ``cli/inert.py``)
escapes through this module, so there is one definition of what "inert" means.

Escapes: ``\\x1b`` for C0 characters, ``\\u009b`` for DEL, C1 and the Unicode
bidi controls (U+061C, U+200E-200F, U+202A-202E, U+2066-2069) and line
separators (U+2028-2029). The ``\\uXXXX`` form is a JSON escape of the same
character, so JSON output passing through the stream stays exact JSON (json
itself escapes C0).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

_WIDE = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_EVERY = re.compile(f"[\x00-\x1f{_WIDE}]")
BUT_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_WIDE}]")  # keeps \t and \n


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """``text`` as one visible line: every control character (newlines too) escaped."""
    return _EVERY.sub(_escape, text)


def inert_lines(text: str) -> str:
    """``text`` with every control character but newline and tab escaped."""
    return BUT_LINES.sub(_escape, text)


SHOWN_CHARS = 1000


def fit(text: str) -> str:
    """``text`` cut after ``SHOWN_CHARS`` characters, saying how long it is (a table cell,
    a piece of a line). Rich wraps a long line at a cost that grows faster than its
    length (a module name of megabytes in a diff took a minute), and nobody reads a thousand
    wrapped lines; JSON and CSV output write every value whole."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({len(text):,} characters in all)"


def one_line(*pieces: str | tuple[str, str] | Text) -> Text:
    """A rich ``Text`` line from plain strings and ``(text, style)`` pairs: never markup,
    every control character (newlines too) escaped, each string cut by ``fit``. A
    ``Text`` piece is taken as it is (a line built here before)."""
    from rich.text import Text

    def piece(p: str | tuple[str, str] | Text) -> str | tuple[str, str] | Text:
        if isinstance(p, Text):
            return p
        return inert(fit(p)) if isinstance(p, str) else (inert(fit(p[0])), p[1])

    return Text.assemble(*(piece(p) for p in pieces))
