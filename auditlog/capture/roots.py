"""Root modules and snapshots: which models exist, and their values when asked.

A root is a module that is nobody's child: the model (and loss modules). Roots
are remembered weakly when sealed or found through an optimizer's parameters;
a root released by the user (a local of ``main()``) is snapshotted one last time
from the member dicts it owned (``weakref.finalize``), since a run-end snapshot
would find nothing.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from auditlog.capture.construction import ConstructionHooks
from auditlog.capture.context import RecordingContext
from auditlog.capture.hostbuffers import HostBuffers
from auditlog.capture.payloads import HostCopy, SnapshotItems
from auditlog.capture.torch_compat import (
    buffers_of,
    children_of,
    is_uninitialized,
    parameters_of,
)
from auditlog.capture.wrappers import unwrap_model

# Snapshots that may wait, host-copied, behind the one the writer is storing
# before the training thread waits (docs/snapshots.md, "When the writer falls behind").
SNAPSHOT_BACKLOG = 1


class RootTracking:
    """Live roots, their release, and ``snapshot_taken`` events.

    A root snapshotted before any of its registrations was seen is adopted first
    (``construction``)."""

    def __init__(self, ctx: RecordingContext, construction: ConstructionHooks) -> None:
        self.ctx = ctx
        self.construction = construction
        # roots seen, and the finalizers that snapshot a root when it is released
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._finalizers: list[weakref.finalize[Any, Any]] = []
        # snapshots emitted and not yet stored by the writer (overruns, back-pressure)
        self._in_flight: list[SnapshotItems] = []
        # host copies of the last stored periodic snapshot, for the next one (hostbuffers.py)
        self.host_buffers = HostBuffers()
        self._finished = False

    def live_roots(self) -> list[torch.nn.Module]:
        """Root modules seen so far that are still alive and still roots."""
        roots = list(self._roots)
        children = {id(c) for r in roots for c in r.modules() if c is not r}
        return [r for r in roots if id(r) not in children]

    def snapshot(
        self,
        roots: list[torch.nn.Module],
        trigger: str,
        tag: str | None = None,
    ) -> None:
        """Emit ``snapshot_taken`` with every parameter and buffer under ``roots``.

        Every tensor is copied to host and hashed on the writer; content already
        stored costs no disk. (Version counters cannot prove a tensor unchanged:
        BatchNorm's running statistics, fused optimizers and ``.data`` writes
        change bytes without bumping them, measured with torch 2.13.)
        """
        for root in (unwrap_model(r) for r in roots):
            if self.ctx.modules.lookup(root) is None:
                self.construction.adopt(root)
            self.track_root(root)
            overrun = self._snapshot_room()
            # Recurring snapshots copy into the last one's buffers (hostbuffers.py).
            buffers = self.host_buffers if self.ctx.policy.snapshot_every > 0 else None
            snapshot = SnapshotItems(self._snapshot_items(module_members(root), buffers), buffers)
            if buffers is not None:
                buffers.drop_unused()
            payload: dict[str, Any] = {"trigger": trigger, "tag": tag, "snapshot": snapshot}
            if overrun is not None:
                payload["overrun"] = overrun
            self._in_flight.append(snapshot)
            self.ctx.emit("snapshot_taken", self.ctx.modules.lookup(root), None, payload)

    def _snapshot_room(self) -> dict[str, Any] | None:
        """Make room for one more snapshot's host copies; say how far behind the writer was.

        A snapshot is in flight from its host copy until the writer has stored
        it. When the next one is due while earlier ones are in flight, the
        writer cannot keep up: the new event says so (``overrun``: how many
        snapshots and bytes were still unwritten, and how long training waited).
        Training goes on at once while at most ``SNAPSHOT_BACKLOG`` snapshots
        wait behind the one being written; beyond that the training thread waits
        for the oldest (bounded back-pressure: host memory for snapshots stays
        within ``SNAPSHOT_BACKLOG + 1`` host copies of the model). Nothing is
        skipped. A writer that failed or stopped is not waited for.
        """
        pending = [s for s in self._in_flight if not s.done.is_set()]
        self._in_flight = pending
        if not pending:
            return None
        behind, behind_bytes = len(pending), sum(s.nbytes for s in pending)
        began = time.perf_counter()
        while len(pending) > SNAPSHOT_BACKLOG:
            if pending[0].done.wait(0.5):
                pending.pop(0)
            elif self.ctx.failure() is not None or not (
                self.ctx.buffer.has_consumer and self.ctx.buffer.consumer_alive()
            ):
                break
        waited = time.perf_counter() - began if behind > SNAPSHOT_BACKLOG else 0.0
        self._in_flight = pending
        return {"behind": behind, "behind_bytes": behind_bytes, "waited_s": round(waited, 6)}

    def track_owners(self, params: list[torch.Tensor]) -> None:
        """Track the root modules that own these parameters (per the recorded structure)."""
        wanted = {self.ctx.tensors.lookup(p) for p in params} - {None}
        if not wanted:
            return
        state = self.ctx.state
        for root_id in state.roots():
            node_ids = [m for _, m in state.named_modules(root_id)]
            owns = any(t in wanted for m in node_ids for t in state.modules[m].parameters.values())
            root = self.ctx.modules.object(root_id) if owns else None
            if root is not None:
                self.track_root(root)

    def track_root(self, root: torch.nn.Module) -> None:
        """Remember a root; when it is garbage-collected, snapshot its last values.

        ``weakref.finalize`` holds the root's member dicts, not the root: the root
        still dies when the user drops it, and the callback can read the tensors
        it owned one last time.
        """
        if root in self._roots:
            return
        self._roots.add(root)
        module_id = self.ctx.modules.lookup(root)
        finalizer = weakref.finalize(
            root,
            self._on_root_released,
            module_id,
            parameters_of(root),
            buffers_of(root),
            children_of(root),
        )
        finalizer.atexit = False  # interpreter exit is handled by the recording's own close
        self._finalizers.append(finalizer)

    def release_roots(self) -> None:
        """Recording is over: let go of the member dicts the finalizers hold."""
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()

    def _on_root_released(
        self, module_id: int | None, params: Any, buffers: Any, children: Any
    ) -> None:
        if not self.ctx.policy.snapshot_final or self._finished:
            return
        try:
            items = self._released_items(module_id, params, buffers, children)
            self.ctx.emit(
                "snapshot_taken",
                module_id,
                None,
                {"trigger": "released", "tag": None, "snapshot": SnapshotItems(items)},
            )
        except Exception as exc:
            self.ctx.fault("root_released_snapshot", exc)

    def _snapshot_items(
        self,
        members: Iterator[tuple[torch.nn.Module, str, str, torch.Tensor]],
        buffers: HostBuffers | None = None,
    ) -> list[tuple[int, HostCopy]]:
        """Host copies of the tensors at these places, each tensor once (into ``buffers``
        where they fit)."""
        items: list[tuple[int, HostCopy]] = []
        seen: set[int] = set()
        with torch.no_grad():
            for module, member, name, tensor in members:
                if is_uninitialized(tensor):
                    continue  # a lazy placeholder has no values yet
                tensor_id = self.ctx.tensors.get(tensor, module, member, name)[0]
                if tensor_id in seen:
                    continue
                seen.add(tensor_id)
                items.append((tensor_id, HostCopy(tensor, buffers=buffers)))
        return items

    def _released_items(
        self, module_id: int | None, params: Any, buffers: Any, children: Any
    ) -> list[tuple[int, HostCopy]]:
        """The last values of a root that died: its own members by name (the record
        says which id is at each of the root's places; the root itself, their
        holder, is gone), its children's as usual (the member dicts keep them)."""
        node = None if module_id is None else self.ctx.state.modules.get(module_id)
        items: list[tuple[int, HostCopy]] = []
        seen: set[int] = set()
        with torch.no_grad():
            for known, table in (
                ({} if node is None else node.parameters, params),
                ({} if node is None else node.buffers, buffers),
            ):
                for name, tensor in list(table.items()):
                    if tensor is None:
                        continue
                    tensor_id = known.get(name)
                    if tensor_id is None or self.ctx.tensors.address(tensor_id) != id(tensor):
                        tensor_id = self.ctx.tensors.get(tensor)[0]  # never recorded at this place
                    if tensor_id not in seen:
                        seen.add(tensor_id)
                        items.append((tensor_id, HostCopy(tensor)))
            for child in list(children.values()):
                if child is not None:
                    for tensor_id, copy in self._snapshot_items(module_members(child)):
                        if tensor_id not in seen:
                            seen.add(tensor_id)
                            items.append((tensor_id, copy))
        return items

    def finish(self) -> None:
        """Run end, after the final snapshot: no more snapshots to copy into the host
        buffers, none for a root released from now on, and the member dicts let go."""
        self.host_buffers.close()
        self._finished = True
        self.release_roots()


def module_members(
    root: torch.nn.Module,
) -> Iterator[tuple[torch.nn.Module, str, str, torch.Tensor]]:
    """Every parameter and buffer under ``root`` with its place: ``(module, member, name, tensor)``."""
    for module in root.modules():
        for name, param in parameters_of(module).items():
            if param is not None:
                yield module, "parameter", name, param
        for name, buf in buffers_of(module).items():
            if buf is not None:
                yield module, "buffer", name, buf
