"""Stored text made inert on a terminal: the one layer every command's output goes through.

Run, module, annotation and parameter names, event kinds and payload text come
from a store that anyone with write access may have crafted (docs/integrity.md,
"crafted stores"). Printed raw, an ESC or CSI sequence redraws the screen (a
``FAILED`` verdict overwritten with ``intact``), an OSC-8 sequence plants a
hyperlink, a C1 byte or a bidi override reorders what is read. So:

- ``guarded_streams`` replaces ``sys.stdout`` and ``sys.stderr`` for the length of
  a command (``AuditlogGroup.invoke``) with ``InertStream``: every ``click.echo``,
  ``print`` and ``sys.stdout.write`` (tables, CSV, JSON, plain lines, errors)
  reaches the terminal with each control character escaped visibly. Newlines
  and tabs pass, since commands write several lines at once.
- Rich draws colour with escape sequences of its own, so its consoles
  (``cli.output.console``) write to the stream underneath and carry
  ``InertHook``, which escapes the text of every segment before rich adds its
  styles. Rich markup is never parsed from stored text (``Text`` objects and
  ``markup=False``).
- Text meant as one line (a table cell, a tree label, a verify finding, an
  error) goes through ``inert``, which escapes newlines too: a stored newline
  cannot start a forged line.

Escapes: ``\\x1b`` for C0 characters, ``\\u009b`` for DEL, C1 and the Unicode
bidi controls (U+061C, U+200E-200F, U+202A-202E, U+2066-2069) and line
separators (U+2028-2029). The ``\\uXXXX`` form is a JSON escape of the same
character, so JSON output passing through the stream stays exact JSON (json
itself escapes C0). ``auditlog run`` hands the streams back to the user's
program (``release``): its output is its own.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
    from rich.text import Text

_WIDE = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_EVERY = re.compile(f"[\x00-\x1f{_WIDE}]")
_BUT_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_WIDE}]")  # keeps \t and \n


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """``text`` as one visible line: every control character (newlines too) escaped."""
    return _EVERY.sub(_escape, text)


def inert_lines(text: str) -> str:
    """``text`` with every control character but newline and tab escaped."""
    return _BUT_LINES.sub(_escape, text)


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


class InertStream(io.TextIOBase):
    """A text stream that escapes control characters (``inert_lines``) on the way to ``raw``."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # click probes streams with b"": this one is text only
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.raw.write(inert_lines(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.raw, "errors", None)


def raw(stream: Any) -> Any:
    """The stream under an ``InertStream`` (rich writes there, after ``InertHook``)."""
    return stream.raw if isinstance(stream, InertStream) else stream


@contextlib.contextmanager
def guarded_streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as ``InertStream`` for the block, then as they were."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = InertStream(raw(sys.stdout)), InertStream(raw(sys.stderr))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout, sys.stderr = saved


def release() -> None:
    """Hand the real streams back (``auditlog run``: the user's program prints as it likes)."""
    sys.stdout, sys.stderr = raw(sys.stdout), raw(sys.stderr)


def inert_console(console: Console) -> Console:
    """``console`` with ``InertHook`` pushed: its text segments are escaped before styling."""
    console.push_render_hook(InertHook())  # type: ignore[arg-type]
    return console


class _Inert:
    """A renderable whose text segments are escaped (control segments, rich's own, pass)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.segment import Segment

        for segment in console.render(self.renderable, options):
            if segment.control or not _BUT_LINES.search(segment.text):
                yield segment
            else:
                yield Segment(inert_lines(segment.text), segment.style)


class InertHook:
    """Rich render hook (a ``rich.console.RenderHook`` by shape: rich is imported only
    when something is drawn): every renderable printed is wrapped in ``_Inert``."""

    def process_renderables(self, renderables: list[RenderableType]) -> list[RenderableType]:
        return [_Inert(r) for r in renderables]
