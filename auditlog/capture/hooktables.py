"""The recorder's entries in torch's global hook tables: installed, checked, removed.

Other code can take them out: a ``RemovableHandle`` is easy to reach, and code
that assigns a fresh dict to a table (PyTorch's own
``TestModuleGlobalHooks.tearDown`` replaces the forward, forward-pre and backward
tables) silently ends what the recorder learns through it. ``missing`` compares
what the recorder installed with the tables torch reads now, by hook id and
hook object; the recorder (``recorder.py``) re-installs what is missing and
records that it happened (``hooks_removed``).

An entry found again in a table that was put back (saved, replaced, restored)
is taken as present: re-installing it would make it fire twice. ``remove_all``
takes every entry the recorder ever installed out of every table it can reach,
the tables torch uses now included, so nothing of a finished recording fires.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.utils.hooks import RemovableHandle

from auditlog.capture.torch_compat import GLOBAL_HOOK_TABLES, global_hook_table

Register = Callable[[Callable[..., Any]], RemovableHandle]


@dataclass
class Entry:
    """One hook of the recorder: which table it lives in, and how to put it back."""

    kind: str  # the recorder's name for it (see KIND_TABLES)
    hook: Callable[..., Any]  # the object the table holds (identity is checked)
    register: Register  # the public torch function that installs it
    handle: RemovableHandle
    always_called: bool = False
    history: list[RemovableHandle] = field(default_factory=list)


# The recorder's hook kinds and the torch table each lives in.
KIND_TABLES = {
    "module_registration": "module_registration",
    "parameter_registration": "parameter_registration",
    "buffer_registration": "buffer_registration",
    "optimizer_step_pre": "optimizer_step_pre",
    "optimizer_step_post": "optimizer_step_post",
    "forward_pre": "forward_pre",
    "root_watch_pre": "forward_pre",
    "root_watch": "forward",
    "forward": "forward",
    "full_backward_pre": "backward_pre",
    "full_backward": "backward",
    "backward": "backward",  # the legacy module backward hook
}


class HookTables:
    """The recorder's hooks by kind; at most one live entry per kind."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._retired: list[Entry] = []
        # What ``missing`` looks up, worked out once per change of the entries: per
        # table, its accessor and the (hook id, hook) pairs it must hold, and the ids the
        # always-called table must hold. None: to be worked out again.
        self._expected: _Expected | None = None

    def install(
        self, kind: str, hook: Callable[..., Any], register: Register, always_called: bool = False
    ) -> None:
        """Register ``hook`` through torch's public ``register`` function."""
        handle = register(hook)
        entry = Entry(kind, hook, register, handle, always_called)
        entry.history.append(handle)
        self._entries[kind] = entry
        self._expected = None

    def installed(self) -> list[str]:
        return list(self._entries)

    def has(self, kind: str) -> bool:
        """Is ``kind`` installed (expected in its table)?"""
        return kind in self._entries

    def uninstall(self, kind: str) -> None:
        """Take one kind out (per-call hooks leave on unsampled steps)."""
        entry = self._entries.pop(kind, None)
        if entry is not None:
            self._expected = None
            _take_out(entry)

    def missing(self) -> list[str]:
        """The kinds whose hook is not in the table torch uses now. This runs at every
        optimizer step, so the common case is one comparison done in C: the objects
        the tables torch uses now hold under the entries' ids, against the entries'
        hooks (identical, or equal: a bound method of the same object and function)."""
        expected = self._expected
        if expected is None:
            expected = self._expected = self._expect()
        accessors, ids, hooks, always_ids = expected
        try:
            if tuple(map(dict.get, map(operator.call, accessors), ids)) != hooks:
                return self._missing()
        except TypeError:  # a table replaced by something that is not a dict
            return self._missing()
        if always_ids:
            always = global_hook_table("forward_always_called")
            for hook_id in always_ids:
                if hook_id not in always:
                    return self._missing()
        return []

    def _expect(self) -> _Expected:
        """What ``missing`` looks for: each entry's last handle in its table."""
        entries = list(self._entries.values())
        return (
            tuple(GLOBAL_HOOK_TABLES[KIND_TABLES[entry.kind]] for entry in entries),
            tuple(entry.handle.id for entry in entries),
            tuple(entry.hook for entry in entries),
            tuple(entry.handle.id for entry in entries if entry.always_called),
        )

    def _missing(self) -> list[str]:
        """``missing`` once a lookup failed: each kind in turn, a table put back included."""
        self._expected = None  # an entry may now be found under an earlier handle
        gone = []
        tables: dict[str, dict[int, Any]] = {}
        always: dict[int, Any] | None = None
        for kind, entry in self._entries.items():
            name = KIND_TABLES[kind]
            table = tables.get(name)
            if table is None:  # (the accessor itself: this runs at every optimizer step)
                table = tables[name] = GLOBAL_HOOK_TABLES[name]()
            # The common case first: the last handle's id holds this very hook.
            if table.get(entry.handle.id) is entry.hook:
                if not entry.always_called:
                    continue
                if always is None:
                    always = global_hook_table("forward_always_called")
                if entry.handle.id in always:
                    continue
            if not self._present(entry):
                gone.append(kind)
        return gone

    def reinstall(self, kind: str) -> None:
        """Register the hook of ``kind`` again (raises what torch raises)."""
        entry = self._entries[kind]
        self._expected = None
        _take_out(entry)  # an always_call flag left without its hook, say
        handle = entry.register(entry.hook)
        entry.handle = handle
        entry.history.append(handle)

    def stop(self, kind: str) -> None:
        """Give up on ``kind`` (it could not be put back): no longer expected."""
        entry = self._entries.pop(kind, None)
        self._expected = None
        if entry is not None:
            self._retired.append(entry)
            _take_out(entry)

    def remove_all(self) -> None:
        """Take every entry ever installed out of every table it can be found in."""
        for entry in [*self._entries.values(), *self._retired]:
            _take_out(entry)
        self._entries.clear()
        self._retired.clear()
        self._expected = None

    def _present(self, entry: Entry) -> bool:
        table = global_hook_table(KIND_TABLES[entry.kind])
        for handle in reversed(entry.history):
            if table.get(handle.id) is entry.hook:
                if entry.always_called and handle.id not in global_hook_table(
                    "forward_always_called"
                ):
                    return False  # it would no longer run when forward raises
                entry.handle = handle  # a table put back holds an earlier entry
                return True
        return False


_Expected = tuple[
    tuple[Callable[[], dict[int, Any]], ...],
    tuple[int, ...],
    tuple[Callable[..., Any], ...],
    tuple[int, ...],
]
"""``HookTables.missing``'s plan, one position per entry: the accessor of the table it
lives in, its hook id, its hook; then the hook ids the always-called table holds."""


def _take_out(entry: Entry) -> None:
    """Remove every registration of ``entry`` from the dicts its handles know and
    from the tables torch uses now (a copied table holds the same ids)."""
    table = global_hook_table(KIND_TABLES[entry.kind])
    always = global_hook_table("forward_always_called")
    for handle in entry.history:
        handle.remove()
        if table.get(handle.id) is entry.hook:
            del table[handle.id]
            always.pop(handle.id, None)
    entry.history = []
