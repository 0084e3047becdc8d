"""Find the line of user code responsible for the current hook call.

Uses ``sys._getframe`` and a per-code-object cache; ``inspect.stack()`` reads
source files for every frame and is orders of magnitude slower. Frames inside
torch, auditlog and the import machinery are skipped.
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType
from typing import Any

import torch

# auditlog's own package directory (two levels up from capture/source.py) and torch's.
_SKIP_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (
        torch.__file__,
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/__init__.py",
    )
    if path
)
_skip_cache: dict[CodeType, bool] = {}
Location = dict[str, Any]
# What a hook keeps of a frame: its code object and line (no frame: a frame holds
# the caller's locals alive). ``site_location`` makes the event's dict later.
Site = tuple[CodeType, int]


def _skipped(code: CodeType) -> bool:
    hit = _skip_cache.get(code)
    if hit is None:
        name = code.co_filename
        hit = name.startswith(_SKIP_DIRS) or name.startswith("<frozen")
        _skip_cache[code] = hit
    return hit


# A module's site says what its line is (docs/events.md): the caller of its
# constructor, or (constructor not seen: built before recording, a deepcopy, C++)
# the line where it was attached to its parent.
CONSTRUCTED = "constructed"
ATTACHED = "attached"


def module_kind(attached: bool) -> str:
    """The ``kind`` of a module's site."""
    return ATTACHED if attached else CONSTRUCTED


def site_location(site: Site | None, kind: str | None = None) -> Location | None:
    """``{file, line, function}`` of a site (on the writer thread, or when needed);
    a module's site also has ``kind`` (``module_kind``)."""
    if site is None:
        return None
    code = site[0]
    location: Location = {"file": code.co_filename, "line": site[1], "function": code.co_name}
    if kind is not None:
        location["kind"] = kind
    return location


def user_site(depth: int = 2) -> Site | None:
    """The innermost frame outside torch and auditlog, as a site."""
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None
    while frame is not None:
        if not _skipped(frame.f_code):
            return frame.f_code, frame.f_lineno
        frame = frame.f_back
    return None


def user_location(depth: int = 2) -> Location | None:
    """The innermost frame outside torch and auditlog, as ``{file, line, function}``."""
    return site_location(user_site(depth + 1))


def construction_location(module: object, depth: int = 2) -> Location | None:
    """Where ``module`` was constructed, as ``{file, line, function}`` (see ``construction_site``)."""
    return site_location(construction_site(module, depth + 1))


def construction_site(module: object, depth: int = 2) -> Site | None:
    """Where ``module`` was constructed: the caller of its outermost ``__init__``
    (see ``construction_or_attach_site``; without the flag)."""
    return construction_or_attach_site(module, depth + 1)[0]


def constructor_caller(module: object, frame: FrameType | None) -> Site | None:
    """The user frame that called ``module``'s constructor, from ``frame``: the caller
    of ``nn.Module.__init__`` (constructors.py). Past torch and auditlog frames (the
    cached test first: torch's own ``__init__`` frames need no look at their locals)
    and past every user ``__init__`` whose ``self`` is this module (a subclass's
    ``super().__init__()`` chain); the first other frame is the line that built it.
    """
    while frame is not None:
        code = frame.f_code
        if not _skipped(code) and not (
            code.co_name == "__init__"
            and code.co_argcount > 0
            and frame.f_locals.get(code.co_varnames[0]) is module
        ):
            return code, frame.f_lineno
        frame = frame.f_back
    return None


def construction_or_attach_site(module: object, depth: int = 2) -> tuple[Site | None, bool]:
    """``(site, constructed)``: the caller of ``module``'s outermost ``__init__`` when
    one is on the stack (``constructed`` true), else the innermost user frame.

    A module is first seen when its own parameters or children register, which is
    inside its ``__init__``; the interesting line is the one that called the
    constructor (``self.fc = nn.Linear(...)``), so walk outward past every
    ``__init__`` frame whose ``self`` is this module, then past torch frames.
    Without such a frame (a hook at attach time, the constructor long returned)
    the innermost user frame is where the module is being attached: the caller
    labels it so (``kind: attached``, constructors.py).
    """
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None, False
    outermost: FrameType | None = None
    probe = frame
    while probe is not None:
        code = probe.f_code
        if (
            code.co_name == "__init__"
            and code.co_argcount > 0
            and probe.f_locals.get(code.co_varnames[0]) is module
        ):
            outermost = probe
        elif outermost is not None and not _skipped(code):
            # The module's own __init__ frames (its class's and its bases') are
            # contiguous but for torch's frames between them; past them, in user
            # code, none of them can follow: stop rather than walk the whole
            # stack (each registration of a deep model paid for every frame).
            break
        probe = probe.f_back
    start = outermost.f_back if outermost is not None else frame
    while start is not None:
        if not _skipped(start.f_code):
            return (start.f_code, start.f_lineno), outermost is not None
        start = start.f_back
    return None, outermost is not None
