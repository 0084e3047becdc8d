"""The global hooks: turn PyTorch's callbacks into records on a ``RecordBuffer``.

Rules every hook here follows (DESIGN.md):
- return ``None``: a non-None return value would replace the tensor or parameter;
- never raise into user code: faults become ``recorder_error`` records and one
  warning per place;
- never change numerics or touch the RNG: statistics run under ``no_grad`` on
  detached tensors and are only read back on the writer thread;
- stay cheap: no SQL, JSON, hashing or I/O; a record is a tuple.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.hooks import RemovableHandle

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.identity import ObjectIds
from auditlog.capture.lazy import HostCopy, NonFiniteCount, SealItems, SnapshotItems, StackedNorms
from auditlog.capture.source import Location, construction_location, user_location
from auditlog.capture.structure import check_structure
from auditlog.encoding import Clean, CleanList
from auditlog.errors import RecordingFailedError, one_line
from auditlog.policy import Policy
from auditlog.replay import STATE_KINDS, ModelState, apply
from auditlog.tensors import StatsRecord, activity_stats, batch_records, norms_of

_is_compiling = torch.compiler.is_compiling
MAX_TENSORS = 4
# Activity entries held before they are emitted anyway (a loop of forward calls
# without optimizer steps, e.g. evaluation, must not grow memory without bound).
ACTIVITY_FLUSH = 4096


def _class_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _tensors_in(value: Any, limit: int = 64) -> list[torch.Tensor]:
    """Tensors inside a module output (tensor, tuple/list, dict, ModelOutput-like)."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    stack: list[Any] = [value]
    while stack and len(found) < limit:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


class Recorder:
    """Installs the global hooks and emits records for one run.

    ``emit`` puts ``(kind, ts_ns, step, module_id, tensor_id, payload)`` tuples on
    the buffer; payload values may be lazy objects (``StatsRecord``, ``SealItems``,
    ``StackedNorms``) that the writer resolves off the training thread.
    """

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        self.buffer = buffer
        self.policy = policy or Policy()
        self.modules = ObjectIds()
        self.tensors = ObjectIds()
        self.optimizers = ObjectIds()
        self.step = 0
        self.sampling = True
        self._handles: list[RemovableHandle] = []
        self._local = threading.local()
        self._unsealed: dict[int, weakref.ref[torch.Tensor]] = {}
        self._registrations = 0
        self._step_scanned = -1
        self._scanned: weakref.WeakKeyDictionary[torch.nn.Module, int] = (
            weakref.WeakKeyDictionary()
        )
        self._sources: weakref.WeakKeyDictionary[torch.nn.Module, Location | None] = (
            weakref.WeakKeyDictionary()
        )
        self._pending_steps: dict[int, tuple[list[torch.Tensor], list[torch.Tensor] | None, bool]] = {}
        # Per optimizer: reusable host buffers for the pre-step copy (CPU), and the
        # ids of its parameters as last seen (the optimizer holds them alive).
        self._before_buffers: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[torch.Tensor]] = (
            weakref.WeakKeyDictionary()
        )
        self._param_ids: dict[int, tuple[tuple[int, ...], CleanList, list[CleanList]]] = {}
        # Module activity of sampled steps: (step, "forward" | "backward", entry),
        # emitted as one ``activity`` event per step (deque: appends from autograd's
        # device threads are safe against the flush).
        self._activity: collections.deque[tuple[int, str, Any]] = collections.deque()
        # Within one step: output tensors already measured, and tensors whose gradient
        # is hooked (weakly held; cleared at every flush).
        self._outputs_seen: dict[int, tuple[weakref.ref[torch.Tensor], int, dict[str, Any] | StatsRecord]] = {}
        self._grads_hooked: dict[int, tuple[weakref.ref[torch.Tensor], int, list[int]]] = {}
        self._optimizer_steps: dict[int, int] = {}
        self._warned: set[str] = set()
        self.faults = 0
        # The state our own events describe (replay.apply), for structural checks,
        # and per tensor id the (shape, dtype, device, requires_grad) last found equal to it.
        self.state = ModelState()
        self.checked_facts: dict[int, tuple[Any, ...]] = {}
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._finalizers: list[weakref.finalize[Any, Any]] = []
        self._finished = False
        self._call_handles: list[RemovableHandle] = []  # per-call hooks, present on sampled steps only
        self._selected: dict[int, bool] = {}
        self._names: dict[int, list[str]] = {}
        self._selected_at = -1
        self._nonfinite = False
        self.hooked_steps = 0
        # Set by the session: durability step/strict waits for the writer after each
        # step; on_error=fail stops training when the writer has failed.
        self.step_barrier: Callable[[], Any] | None = None
        self.failure: Callable[[], BaseException | None] = lambda: None

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        """Register the registration and optimizer hooks, and the per-call hooks for step 0.

        Step 0 (until the first optimizer step returns) always has the forward hooks,
        so that the model is sealed at its first forward, before BatchNorm and the
        like change any buffer.
        """
        add = self._handles.append
        add(nn_module.register_module_module_registration_hook(self._on_module_registered))
        add(nn_module.register_module_parameter_registration_hook(self._on_parameter_registered))
        add(nn_module.register_module_buffer_registration_hook(self._on_buffer_registered))
        add(optim_module.register_optimizer_step_pre_hook(self._on_step_pre))
        add(optim_module.register_optimizer_step_post_hook(self._on_step_post))
        # torch keeps a module-level flag saying which kind of global backward hook
        # is in use and never clears it on removal; save it so remove() can restore
        # it, and treat it as unset when no global backward hook exists any more.
        self._saved_full_flag = nn_module._global_is_full_backward_hook
        if not nn_module._global_backward_hooks:
            nn_module._global_is_full_backward_hook = None
        self.sampling = self.policy.samples(0)
        self._install_call_hooks(forward_only=not self.sampling)

    def _install_call_hooks(self, forward_only: bool = False) -> None:
        """Forward (and full/legacy backward) hooks: they take every module call off
        PyTorch's fast path, so they are present only on steps that need them."""
        if self._call_handles:
            return
        add = self._call_handles.append
        add(nn_module.register_module_forward_pre_hook(self._on_forward_pre))
        add(nn_module.register_module_forward_hook(self._on_forward, always_call=True))
        if not forward_only:
            if self.policy.backward == "full":
                add(nn_module.register_module_full_backward_pre_hook(self._on_backward_pre))
                add(nn_module.register_module_full_backward_hook(self._on_full_backward))
            elif self.policy.backward == "legacy":
                add(nn_module.register_module_backward_hook(self._on_legacy_backward))
        self.hooked_steps += 1

    def _remove_call_hooks(self) -> None:
        while self._call_handles:
            self._call_handles.pop().remove()
        self._stack().clear()

    def remove(self) -> None:
        """Remove exactly the hooks this recorder installed."""
        self._remove_call_hooks()
        while self._handles:
            self._handles.pop().remove()
        if hasattr(self, "_saved_full_flag"):
            nn_module._global_is_full_backward_hook = self._saved_full_flag

    def flag_nonfinite(self) -> None:
        """Called by the writer when a step's gradients were not finite."""
        self._nonfinite = True

    def _selected_module(self, module: torch.nn.Module, module_id: int) -> bool:
        """Include/exclude globs, evaluated once per module per structure version."""
        policy = self.policy
        if not policy.include and not policy.exclude:
            return True
        if self._selected_at != self._registrations:
            self._selected = {}
            self._names = self.state.module_names()
            self._selected_at = self._registrations
        hit = self._selected.get(module_id)
        if hit is None:
            node = self.state.modules.get(module_id)
            cls = node.cls if node is not None and node.cls else _class_name(module)
            hit = self._selected[module_id] = policy.module_selected(self._names.get(module_id, []), cls)
        return hit

    # ------------------------------------------------------------------ emit
    def emit(
        self,
        kind: str,
        module_id: int | None = None,
        tensor_id: int | None = None,
        payload: Any = None,
        step: int | None = None,
    ) -> None:
        """Queue one record (the only way anything leaves the capture layer)."""
        self.buffer.put(
            (kind, time.time_ns(), self.step if step is None else step, module_id, tensor_id, payload)
        )
        if kind in STATE_KINDS:
            apply(self.state, {"kind": kind, "module_id": module_id, "tensor_id": tensor_id, "payload": payload})

    def _fault(self, where: str, exc: BaseException) -> None:
        """Record a recorder fault; warn once per place; never raise."""
        self.faults += 1
        try:
            self.emit(
                "recorder_error",
                payload={"where": where, "type": type(exc).__name__, "message": str(exc)[:2000]},
            )
            if where not in self._warned:
                self._warned.add(where)
                warnings.warn(
                    f"auditlog: recorder fault in {where}: {type(exc).__name__}: {exc} "
                    "(recorded as recorder_error; training continues)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        except Exception:  # -W error turns the warning into an exception: swallow it
            pass

    # ------------------------------------------------------------------ identity
    def _module_id(self, module: torch.nn.Module) -> int:
        """Id of a module; on first sight, remember where it was constructed."""
        number, new = self.modules.get(module)
        if new:
            self._sources[module] = construction_location(module, depth=2)
        return number

    def _source_of(self, module: torch.nn.Module | None) -> Location | None:
        if module is None:
            return None
        return self._sources.get(module)

    # ------------------------------------------------------------------ construction
    def _on_module_registered(
        self, parent: torch.nn.Module, name: str, child: torch.nn.Module | None
    ) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            if type(parent).__name__ == "OptimizedModule":
                return None  # torch.compile's wrapper is not part of the model's structure
            if child is not None and self.modules.lookup(child) is None and (
                child._modules or child._parameters or child._buffers
            ):
                # A module whose members never passed through our hooks: built
                # before recording, or a deepcopy (TransformerEncoder clones its
                # layer that way). Record its subtree as adopted first.
                self.adopt(child)
            self.register_child(parent, name, child)
        except Exception as exc:
            self._fault("module_registration_hook", exc)

    def _on_parameter_registered(
        self, module: torch.nn.Module, name: str, param: torch.Tensor | None
    ) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            self.register_tensor(module, name, param, "parameter", source=user_location(2))
        except Exception as exc:
            self._fault("parameter_registration_hook", exc)

    def _on_buffer_registered(
        self, module: torch.nn.Module, name: str, buffer: torch.Tensor | None
    ) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            # The hook is not told whether the buffer is persistent; register_buffer
            # (our caller) holds it in a local. Read it from there when we can.
            caller = sys._getframe(1)
            persistent = None
            if caller.f_code.co_name == "register_buffer":
                value = caller.f_locals.get("persistent")
                persistent = bool(value) if value is not None else None
            self.register_tensor(
                module, name, buffer, "buffer", source=user_location(2), persistent=persistent
            )
        except Exception as exc:
            self._fault("buffer_registration_hook", exc)

    def register_child(
        self,
        parent: torch.nn.Module,
        name: str,
        child: torch.nn.Module | None,
        adopted: bool = False,
        detected_at: str | None = None,
    ) -> None:
        """Emit ``module_registered`` (from the hook, adoption or a structural check)."""
        self._registrations += 1
        parent_new = self.modules.lookup(parent) is None
        parent_id = self._module_id(parent)
        child_id = None if child is None else self._module_id(child)
        # Clean: names, class names, ids and source locations only (no floats), so
        # the writer encodes registration payloads without walking them.
        payload: dict[str, Any] = Clean({
            "name": name,
            "child_id": child_id,
            "child_class": None if child is None else _class_name(child),
            "parent_class": _class_name(parent),
            "source": None if adopted else self._source_of(child),
        })
        if parent_new and not adopted:
            payload["parent_source"] = self._source_of(parent)
        if adopted:
            payload["adopted"] = True
        if detected_at is not None:
            payload["detected_at"] = detected_at
        self.emit("module_registered", parent_id, None, payload)

    def register_tensor(
        self,
        module: torch.nn.Module,
        name: str,
        tensor: torch.Tensor | None,
        member: str,
        source: Location | None = None,
        persistent: bool | None = None,
        adopted: bool = False,
        detected_at: str | None = None,
    ) -> None:
        """Emit ``parameter_registered`` / ``buffer_registered`` for one member."""
        self._registrations += 1
        new = self.modules.lookup(module) is None
        module_id = self._module_id(module)
        payload: dict[str, Any] = Clean(name=name, module_class=_class_name(module))
        tensor_id = None
        if tensor is None:
            payload.update(shape=None, dtype=None, device=None)
        else:
            tensor_id, _ = self.tensors.get(tensor)
            self._unsealed[tensor_id] = weakref.ref(tensor)
            payload.update(
                shape=list(tensor.shape),
                dtype=str(tensor.dtype).removeprefix("torch."),
                device=str(tensor.device),
            )
        if member == "parameter":
            payload["requires_grad"] = None if tensor is None else bool(tensor.requires_grad)
        else:
            if persistent is None and (adopted or detected_at is not None):
                persistent = name not in module._non_persistent_buffers_set
            payload["persistent"] = persistent
        payload["source"] = source
        if new and not adopted:
            payload["module_source"] = self._source_of(module)
        if adopted:
            payload["adopted"] = True
        if detected_at is not None:
            payload["detected_at"] = detected_at
        self.emit(f"{member}_registered", module_id, tensor_id, payload)

    def adopt(self, root: torch.nn.Module) -> None:
        """Emit registration events for modules/tensors that existed before recording."""
        unknown = [m for m in root.modules() if self.modules.lookup(m) is None]
        for module in unknown:
            self._module_id(module)
            for name, child in module._modules.items():
                self.register_child(module, name, child, adopted=True)
            for name, param in module._parameters.items():
                self.register_tensor(module, name, param, "parameter", adopted=True)
            for name, buf in module._buffers.items():
                self.register_tensor(module, name, buf, "buffer", adopted=True)

    # ------------------------------------------------------------------ sealing
    def seal(self, root: torch.nn.Module | None, trigger: str, tensors: Any = None) -> None:
        """Emit ``construction_sealed`` for every not-yet-sealed tensor reachable here."""
        items: list[tuple[int, HostCopy]] = []
        candidates: Iterator[torch.Tensor]
        if root is not None:
            if self.modules.lookup(root) is None:
                self.adopt(root)
            else:
                # Tensors swapped in without a hook (``.to()`` replaces buffers) are
                # registered first, so they are sealed with the rest.
                check_structure(self, [root], trigger)
            candidates = _module_tensors(root)
        elif tensors is not None:
            candidates = iter(tensors)
        else:
            candidates = (t for t in (r() for r in list(self._unsealed.values())) if t is not None)
        seen: set[int] = set()
        for tensor in candidates:
            tensor_id = self.tensors.lookup(tensor)
            if tensor_id is None or tensor_id in seen or tensor_id not in self._unsealed:
                continue
            seen.add(tensor_id)
            del self._unsealed[tensor_id]
            with torch.no_grad():
                items.append((tensor_id, HostCopy(tensor, with_stats=True)))
        if root is not None:
            self._scanned[root] = self._registrations
            self._track_root(root)
        if items:
            # Device statistics of the seal go to the host together (no GIL-held sync on the writer).
            batch_records([copy.stats for _, copy in items if copy.stats is not None])
            module_id = None if root is None else self.modules.lookup(root)
            store = self.policy.snapshot_initial
            self.emit(
                "construction_sealed",
                module_id,
                None,
                {"trigger": trigger, "stored": store, "tensors": SealItems(items, store)},
            )

    # ------------------------------------------------------------------ snapshots
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
        for root in roots:
            if self.modules.lookup(root) is None:
                self.adopt(root)
            self._track_root(root)
            items = self._snapshot_items(_module_tensors(root))
            self.emit(
                "snapshot_taken",
                self.modules.lookup(root),
                None,
                {"trigger": trigger, "tag": tag, "snapshot": SnapshotItems(items)},
            )

    def _track_owners(self, params: list[torch.Tensor]) -> None:
        """Track the root modules that own these parameters (per the recorded structure)."""
        wanted = {self.tensors.lookup(p) for p in params} - {None}
        if not wanted:
            return
        for root_id in self.state.roots():
            node_ids = [m for _, m in self.state.named_modules(root_id)]
            owns = any(
                t in wanted for m in node_ids for t in self.state.modules[m].parameters.values()
            )
            root = self.modules.object(root_id) if owns else None
            if root is not None:
                self._track_root(root)

    def _track_root(self, root: torch.nn.Module) -> None:
        """Remember a root; when it is garbage-collected, snapshot its last values.

        Training scripts often drop the model (a local of ``main()``) before the
        recording ends, so a run-end snapshot would find nothing. ``weakref.finalize``
        holds the root's member dicts, not the root: the root still dies when the user
        drops it, and the callback can read the tensors it owned one last time.
        """
        if root in self._roots:
            return
        self._roots.add(root)
        module_id = self.modules.lookup(root)
        finalizer = weakref.finalize(
            root, self._on_root_released, module_id, root._parameters, root._buffers, root._modules
        )
        finalizer.atexit = False  # interpreter exit is handled by the recording's own close
        self._finalizers.append(finalizer)

    def _on_root_released(self, module_id: int | None, params: Any, buffers: Any, children: Any) -> None:
        if not self.policy.snapshot_final or self._finished:
            return
        try:
            tensors = _dict_tensors(params, buffers, children)
            items = self._snapshot_items(tensors)
            self.emit(
                "snapshot_taken", module_id, None, {"trigger": "released", "tag": None, "snapshot": SnapshotItems(items)}
            )
        except Exception as exc:
            self._fault("root_released_snapshot", exc)

    def _snapshot_items(self, tensors: Iterator[torch.Tensor]) -> list[tuple[int, HostCopy]]:
        """Host copies of ``tensors``, each tensor once."""
        items: list[tuple[int, HostCopy]] = []
        seen: set[int] = set()
        with torch.no_grad():
            for tensor in tensors:
                tensor_id = self.tensors.get(tensor)[0]
                if tensor_id in seen:
                    continue
                seen.add(tensor_id)
                items.append((tensor_id, HostCopy(tensor)))
        return items

    def check(self, roots: list[torch.nn.Module] | None, where: str) -> None:
        """Run a structural check (see ``structure.py``)."""
        check_structure(self, self.live_roots() if roots is None else roots, where)

    # ------------------------------------------------------------------ forward
    def _stack(self) -> list[torch.nn.Module]:
        stack: list[torch.nn.Module] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _on_forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            if type(module).__name__ == "OptimizedModule":  # torch.compile wrapper: count once
                module = module._orig_mod  # type: ignore[assignment]
            stack = self._stack()
            if not stack and self._scanned.get(module) != self._registrations:
                self.seal(module, "first_forward")  # also remembers it as a root
            stack.append(module)
        except Exception as exc:
            self._fault("forward_pre_hook", exc)

    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            if type(module).__name__ == "OptimizedModule":
                module = module._orig_mod  # type: ignore[assignment]
            stack = self._stack()
            if stack and stack[-1] is module:
                stack.pop()
            elif module in stack:
                del stack[len(stack) - 1 - stack[::-1].index(module) :]
            if not (self.sampling and self.policy.activity):
                return
            module_id = self._module_id(module)
            if not self._selected_module(module, module_id):
                return
            if output is None:
                self._add_activity(self.step, "forward", {"module_id": module_id, "n_outputs": 0, "outputs": [], "error": True})
                return
            tensors = _tensors_in(output)
            full = self.policy.stats == "full"
            stats = [self._output_stats(t, full) for t in tensors[:MAX_TENSORS]]
            self._add_activity(self.step, "forward", {"module_id": module_id, "n_outputs": len(tensors), "outputs": stats})
            if self.policy.backward == "grad" and torch.is_grad_enabled():
                self._hook_gradients(module_id, tensors)
        except Exception as exc:
            self._fault("forward_hook", exc)
        return

    def _add_activity(self, step: int, direction: str, entry: dict[str, Any]) -> None:
        """Hold one module call's statistics until the step's ``activity`` event."""
        activity = self._activity
        activity.append((step, direction, entry))
        if len(activity) >= ACTIVITY_FLUSH:
            self.flush_activity()

    def flush_activity(self) -> None:
        """Emit the held module activity: one ``activity`` event per step it belongs to."""
        self._outputs_seen.clear()
        self._grads_hooked.clear()
        activity = self._activity
        by_step: dict[int, dict[str, list[Any]]] = {}
        for _ in range(len(activity)):
            step, direction, entry = activity.popleft()
            calls = by_step.get(step)
            if calls is None:
                calls = by_step[step] = {"forward": [], "backward": []}
            calls[direction].append(entry)
        for step, calls in by_step.items():
            lazy = [
                stats
                for entries in calls.values()
                for entry in entries
                for key in ("outputs", "grad_outputs", "grad_inputs")
                for stats in entry.get(key, ())
                if type(stats) is StatsRecord
            ]
            if lazy:
                batch_records(lazy)  # device statistics: one readback per step on the writer
            else:
                calls = Clean(calls)  # plain numbers only (CPU): the writer encodes it as it is
            self.emit("activity", None, None, calls, step=step)

    def _output_stats(self, tensor: torch.Tensor, full: bool) -> dict[str, Any] | StatsRecord:
        """Statistics of a module output, computed once per tensor and version.

        A container returns its last child's output tensor itself (every
        ``nn.Sequential``): the same object, unchanged since (same version
        counter), has the same statistics, so they are reused (a quarter of the
        calls of the benchmark MLP).
        """
        seen = self._outputs_seen.get(id(tensor))
        if seen is not None and seen[0]() is tensor and seen[1] == tensor._version:
            return seen[2]
        stats = activity_stats(tensor, full)
        self._outputs_seen[id(tensor)] = (weakref.ref(tensor), tensor._version, stats)
        return stats

    def _hook_gradients(self, module_id: int, tensors: list[torch.Tensor]) -> None:
        needing = [t for t in tensors if t.requires_grad]
        if not needing:
            return
        step = self.step
        if len(needing) == 1:
            tensor = needing[0]
            hooked = self._grads_hooked.get(id(tensor))
            if hooked is not None and hooked[0]() is tensor and hooked[1] == tensor._version:
                hooked[2].append(module_id)  # one hook, one gradient, an entry per module
                return
            modules = [module_id]
            self._grads_hooked[id(tensor)] = (weakref.ref(tensor), tensor._version, modules)
            tensor.register_hook(partial(self._on_output_grad, modules, step))  # type: ignore[no-untyped-call]
        else:
            torch.autograd.graph.register_multi_grad_hook(
                needing, partial(self._on_output_grads, module_id, step), mode="all"
            )

    # ------------------------------------------------------------------ backward
    def _on_output_grad(self, module_ids: list[int], step: int, grad: torch.Tensor) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            stats = [activity_stats(grad, self.policy.stats == "full")]
            for module_id in module_ids:  # modules that returned this very tensor: the same gradient
                self._add_activity(step, "backward", {"module_id": module_id, "mechanism": "grad", "grad_outputs": stats})
        except Exception as exc:
            self._fault("gradient_hook", exc)

    def _on_output_grads(self, module_id: int, step: int, grads: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            full = self.policy.stats == "full"
            stats = [None if g is None else activity_stats(g, full) for g in list(grads)[:MAX_TENSORS]]
            self._add_activity(step, "backward", {"module_id": module_id, "mechanism": "grad", "grad_outputs": stats})
        except Exception as exc:
            self._fault("gradient_hook", exc)

    def _on_backward_pre(self, module: torch.nn.Module, grad_output: Any) -> None:
        return None  # installed so the full pair is present; the post hook records

    def _grad_stats(self, grads: Any) -> list[dict[str, Any] | StatsRecord | None]:
        full = self.policy.stats == "full"
        return [None if g is None else activity_stats(g, full) for g in list(grads or ())[:MAX_TENSORS]]

    def _on_full_backward(self, module: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        self._record_backward("full", "full_backward_hook", module, grad_input, grad_output)

    def _on_legacy_backward(self, module: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        self._record_backward("legacy", "legacy_backward_hook", module, grad_input, grad_output)

    def _record_backward(
        self, mechanism: str, where: str, module: torch.nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        try:
            if not (self.sampling and self.policy.activity):
                return
            module_id = self._module_id(module)
            if not self._selected_module(module, module_id):
                return
            self._add_activity(
                self.step,
                "backward",
                {
                    "module_id": module_id,
                    "mechanism": mechanism,
                    "grad_outputs": self._grad_stats(grad_output),
                    "grad_inputs": self._grad_stats(grad_input),
                },
            )
        except Exception as exc:
            self._fault(where, exc)

    # ------------------------------------------------------------------ optimizer
    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            self._stack().clear()  # a forward that died on BaseException left stale entries
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if self._step_scanned != self._registrations:
                # The structure changed since the last step: per-call hooks may be
                # absent, so find the models these parameters belong to from here.
                self._step_scanned = self._registrations
                if self._unsealed:
                    self.seal(None, "optimizer_step", tensors=params)
                self._track_owners(params)
            policy = self.policy
            due = (policy.update_norms or policy.param_norms) and policy.norms_due(self.step)
            before = self._copy_before(optimizer, params) if due and policy.update_norms else None
            self._pending_steps[id(optimizer)] = (params, before, due)
        except Exception as exc:
            self._fault("optimizer_step_pre_hook", exc)

    def _copy_before(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The parameters' values before the step, for exact update norms.

        CPU: copied into buffers kept per optimizer (a fresh clone of every
        parameter cost ~7x more, measured on the 98-parameter MLP: each new
        allocation of a large block faults its pages in). Other devices: clones,
        so the caching allocator reuses their memory and nothing stays resident
        between steps.
        """
        with torch.no_grad():
            detached = [p.detach() for p in params]
            if not detached or any(p.device.type != "cpu" for p in detached):
                return [p.clone() for p in detached]
            buffers = self._before_buffers.get(optimizer)
            if buffers is None or len(buffers) != len(detached) or any(
                b.shape != p.shape or b.dtype != p.dtype for b, p in zip(buffers, detached, strict=True)
            ):
                buffers = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in detached]
                self._before_buffers[optimizer] = buffers
            torch._foreach_copy_(buffers, detached)
            return buffers

    def _on_step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if _is_compiling():  # traced by dynamo: record nothing, never break the trace
            return None
        try:
            self.step += 1
            optimizer_id, _ = self.optimizers.get(optimizer)
            count = self._optimizer_steps.get(optimizer_id, 0) + 1
            self._optimizer_steps[optimizer_id] = count
            params, before, due = self._pending_steps.pop(id(optimizer), (None, None, False))
            if params is None:
                params = [p for group in optimizer.param_groups for p in group["params"]]
            payload = self._step_payload(optimizer, params, before, due)
            payload.update(
                optimizer_id=optimizer_id,
                optimizer_class=_class_name(optimizer),
                optimizer_step=count,
            )
            # Structure check and snapshot come before the optimizer_step event, so
            # "the state after step N" is exactly the events up to that event.
            self.flush_activity()  # this step's module activity, before its optimizer_step
            every = self.policy.snapshot_every
            snap = every > 0 and self.step % every == 0
            if snap or self.step % self.policy.check_every == 0:
                self.check(None, "optimizer_step")
            if snap:
                self.snapshot(self.live_roots(), "step")
            self.emit("optimizer_step", None, None, payload)
            # Decide the next step: per-call hooks only where activity is sampled.
            self.sampling = self.policy.samples(self.step) or (
                self.policy.activity and self.policy.sample_nonfinite and self._nonfinite
            )
            if self.sampling:
                self._install_call_hooks()
            else:
                self._remove_call_hooks()
            if self.step_barrier is not None:
                self.step_barrier()
        except Exception as exc:
            self._fault("optimizer_step_post_hook", exc)
        if self.policy.on_error == "fail":
            failure = self.failure()
            if failure is not None:
                # The one place a hook raises: the user asked for training to stop
                # rather than run unrecorded (compliance runs).
                raise RecordingFailedError(
                    f"recording failed ({one_line(failure)}); training stopped because on_error=fail"
                )

    def _step_payload(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        before: list[torch.Tensor] | None,
        due: bool,
    ) -> dict[str, Any]:
        """The ``optimizer_step`` payload: hyperparameters and per-parameter norms.

        Gradient norms every step (one fused pass); parameter and update norms on
        the steps ``norms_every`` selects. On CPU the norms are read at once (no
        device to wait for; the writer then only encodes), elsewhere they stay on
        the device until the writer reads them.
        """
        tensor_ids, group_ids = self._ids_of(optimizer, params)
        groups: list[dict[str, Any]] = []
        for group, members in zip(optimizer.param_groups, group_ids, strict=True):
            hyper = {
                key: (value.detach().clone() if isinstance(value, torch.Tensor) else value)
                for key, value in group.items()
                if key != "params"
            }
            hyper["params"] = members
            groups.append(hyper)
        policy = self.policy
        strided = torch.strided
        with torch.no_grad():
            grad_norms: list[Any] | StackedNorms | None = None
            nonfinite: int | NonFiniteCount | None = None
            if policy.grad_norms:
                present: list[bool] = []
                grads: list[torch.Tensor] = []
                for p in params:
                    grad = p.grad
                    has = grad is not None and grad.layout == strided
                    present.append(has)
                    if has:
                        grads.append(grad)  # type: ignore[arg-type]
                stacked = StackedNorms(present, norms_of(grads))
                if _on_cpu(stacked):
                    grad_norms = CleanList(stacked.resolve())
                    nonfinite = sum(1 for v in grad_norms if isinstance(v, str))
                    if nonfinite:
                        self.flag_nonfinite()
                else:
                    grad_norms, nonfinite = stacked, NonFiniteCount(stacked, self.flag_nonfinite)
            param_norms: list[Any] | StackedNorms | None = None
            update_norms: list[Any] | StackedNorms | None = None
            if due:
                detached = [p.detach() for p in params]
                if policy.param_norms:
                    param_norms = _read_if_cpu(StackedNorms([True] * len(params), norms_of(detached)))
                if before is not None and len(before) == len(detached):
                    if detached:
                        torch._foreach_sub_(before, detached)  # before := before - after, in place
                    update_norms = _read_if_cpu(StackedNorms([True] * len(params), norms_of(before)))
        return {
            "param_groups": groups,
            "tensor_ids": tensor_ids,
            "grad_norm": grad_norms,
            "nonfinite_grads": nonfinite,
            "update_norm": update_norms,
            "param_norm": param_norms,
        }

    def _ids_of(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[CleanList, list[CleanList]]:
        """Tensor ids of the optimizer's parameters, in order and per group (cached).

        The cache key is the identity of every parameter object: the optimizer
        holds them alive, so an unchanged key means unchanged objects.
        """
        key = tuple(map(id, params)) + tuple(len(g["params"]) for g in optimizer.param_groups)
        cached = self._param_ids.get(id(optimizer))
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        tensor_ids = CleanList(self.tensors.get(p)[0] for p in params)
        group_ids = [CleanList(self.tensors.get(p)[0] for p in group["params"]) for group in optimizer.param_groups]
        self._param_ids[id(optimizer)] = (key, tensor_ids, group_ids)
        return tensor_ids, group_ids

    # ------------------------------------------------------------------ end
    def finish(self) -> None:
        """Run end: seal what was never sealed, check structure, take the final snapshot."""
        self.flush_activity()
        if self._unsealed:
            self.seal(None, "run_end")
        roots = self.live_roots()
        self.check(roots, "run_end")
        if self.policy.snapshot_final and roots:
            self.snapshot(roots, "run_end")
        self._finished = True
        for finalizer in self._finalizers:
            finalizer.detach()  # release the member dicts: recording is over
        self._finalizers.clear()


def _on_cpu(norms: StackedNorms) -> bool:
    return norms.norms is None or norms.norms.device.type == "cpu"


def _read_if_cpu(norms: StackedNorms) -> list[Any] | StackedNorms:
    """CPU norms are read now (nothing to wait for); device norms stay lazy for the writer."""
    return CleanList(norms.resolve()) if _on_cpu(norms) else norms


def _dict_tensors(params: Any, buffers: Any, children: Any) -> Iterator[torch.Tensor]:
    """The tensors of a (dead) root, from the member dicts it owned."""
    for tensor in list(params.values()) + list(buffers.values()):
        if tensor is not None:
            yield tensor
    for child in list(children.values()):
        if child is not None:
            yield from _module_tensors(child)


def _module_tensors(root: torch.nn.Module) -> Iterator[torch.Tensor]:
    for module in root.modules():
        for param in module._parameters.values():
            if param is not None:
                yield param
        for buf in module._buffers.values():
            if buf is not None:
                yield buf


HookFn = Callable[..., None]
