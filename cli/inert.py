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

What is escaped and how: ``auditlog.present.text`` (``inert``, ``fit``,
``one_line``). ``auditlog run`` hands the streams back to the user's
program (``release``): its output is its own.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from auditlog.present.text import BUT_LINES, inert_lines

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderableType, RenderResult


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
            if segment.control or not BUT_LINES.search(segment.text):
                yield segment
            else:
                yield Segment(inert_lines(segment.text), segment.style)


class InertHook:
    """Rich render hook (a ``rich.console.RenderHook`` by shape: rich is imported only
    when something is drawn): every renderable printed is wrapped in ``_Inert``."""

    def process_renderables(self, renderables: list[RenderableType]) -> list[RenderableType]:
        return [_Inert(r) for r in renderables]
