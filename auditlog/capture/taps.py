"""The hooks the recorder leaves on the user's own objects, and what copies of them become.

A loss module gets a forward hook of its own (``metrics.py``) and a module
output a gradient hook (``activity.py``). A copy or a pickle of that object
(``copy.deepcopy(model)``, ``torch.save(model)`` during a recording) must not
call into the recorder, must not need auditlog to be loaded, and must not fail
to pickle because the recorder holds locks: it carries an inert standard-library
no-op instead (``sys.audit`` with an event name of ours ignores its arguments).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

INERT_EVENT = "auditlog.inert_hook"


def inert_hook() -> Callable[..., None]:
    """A hook that does nothing and returns None, built from the standard library only."""
    return functools.partial(sys.audit, INERT_EVENT)


class InertWhenCopied:
    """For hook objects the recorder leaves on user objects: copies and pickles are inert."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (functools.partial, (sys.audit, INERT_EVENT))

    def __copy__(self) -> Callable[..., None]:
        return inert_hook()

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        return inert_hook()


class ModuleTap(InertWhenCopied):
    """The recorder's hook on one of the user's modules (loss modules, roots): calls ``target``."""

    __slots__ = ("target",)

    def __init__(self, target: Callable[..., None]) -> None:
        self.target = target

    def __call__(self, *args: Any) -> None:
        return self.target(*args)
