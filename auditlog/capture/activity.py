"""Module activity on sampled steps: forward outputs and backward gradients, with statistics.

Every recorded call becomes an entry held until its step ends; the step's
entries leave as one ``activity`` event (``flush_activity``). Backward is seen,
by default, through gradient hooks on the forward outputs (``backward="grad"``):
module full backward hooks make models with in-place ops fail, so they are an
explicit opt-in (``full``, or the legacy hook).

No reference to an output tensor is kept, not even a weak one (``swap_tensors``
refuses tensors with weak references; docs/hooks.md). A tensor that several
modules return (every ``nn.Sequential`` returns its last child's output) is
recognised by the recorder's own gradient hook already on it (``GradTap``): its
statistics are reused and one gradient hook serves every module that returned
it. A hook on a leaf output (a module may return one of its parameters) is
removed when the step ends, so none accumulates on the user's parameters; other
outputs take their hooks with them when they die.

The entries' dicts are built with their keys in sorted order, the order the writer's
encoder writes them in (it sorts every dict; a sorted one costs it least).
"""

from __future__ import annotations

import collections
from functools import partial
from typing import Any

import torch

from auditlog.capture.construction import ConstructionHooks, InPlaceCheck
from auditlog.capture.context import RecordingContext
from auditlog.capture.flops import FlopCounting
from auditlog.capture.metrics import MetricHooks
from auditlog.capture.payloads import NonFiniteInputs
from auditlog.capture.registrations import class_name
from auditlog.capture.taps import InertWhenCopied
from auditlog.capture.torch_compat import (
    call_guard,
    compiled_modules,
    local_view,
    skip_guards_at_frame_level,
    tensor_hooks,
    tensor_version,
    transform_value,
    unwrap_compiled,
)
from auditlog.capture.wrappers import parallel_wrapper_attr
from auditlog.core.chain import Clean
from auditlog.core.policy import Policy
from auditlog.core.tensors import StatsRecord, activity_stats, batch_records, dtype_name

MAX_TENSORS = 4
# Activity entries held before they are emitted anyway (a loop of forward calls
# without optimizer steps, e.g. evaluation, must not grow memory without bound).
ACTIVITY_FLUSH = 4096


def tensors_in(value: Any, limit: int = 64) -> list[torch.Tensor]:
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


def skipped_stats(tensor: torch.Tensor) -> dict[str, Any]:
    """What is recorded of a functorch transform's value (``torch_compat.transform_value``):
    its shape and dtype, and why nothing else."""
    return {
        "dtype": dtype_name(tensor.dtype),
        "shape": list(tensor.shape),
        "skipped": "functorch transform value",
    }


def grad_stats(grad: torch.Tensor | None, full: bool) -> dict[str, Any] | StatsRecord | None:
    """Statistics of a gradient a hook was handed: None for none (gradcheck hands hooks
    None for outputs it does not differentiate), shape only for a transform's value
    (batched gradcheck runs backward under vmap), else of its plain view."""
    if grad is None:
        return None
    if transform_value(grad):
        return skipped_stats(grad)
    return activity_stats(local_view(grad), full)


class GradTap(InertWhenCopied):
    """The recorder's gradient hook on one module output.

    It lives in the tensor's own hook table (``Tensor.register_hook``), which is
    how a later call that returns the same tensor finds it: the recorder keeps
    no reference to the tensor. It holds what the forward hook knew: the modules
    that returned the tensor, the step, the tensor's version then and its
    statistics.
    """

    __slots__ = ("activity", "modules", "stats", "step", "version")

    def __init__(
        self,
        activity: ActivityHooks,
        modules: list[int],
        step: int,
        version: int,
        stats: dict[str, Any] | StatsRecord | None,
    ) -> None:
        self.activity = activity
        self.modules = modules
        self.step = step
        self.version = version
        self.stats = stats

    def __call__(self, grad: torch.Tensor) -> None:
        self.activity._on_output_grad(self.modules, self.step, grad)


class ActivityHooks:
    """Forward pre/post hooks, gradient hooks and module backward hooks.

    The forward pre hook is also where a model is first seen running: sealed
    (``construction``), checked for in-place modules (``check_in_place``), and
    its outermost call handed to the metrics (loss modules, roots; ``metrics``).
    The recorder's own statistics run outside a FLOP count (``flops``)."""

    def __init__(
        self,
        ctx: RecordingContext,
        construction: ConstructionHooks,
        metrics: MetricHooks,
        flops: FlopCounting,
        check_in_place: InPlaceCheck,
    ) -> None:
        self.ctx = ctx
        self.construction = construction
        self.metrics = metrics
        self.flops = flops
        self.check_in_place = check_in_place
        # Module activity of sampled steps: (step, "forward" | "backward", entry, lazy),
        # emitted as one ``activity`` event per step (deque: appends from autograd's
        # device threads are safe against the flush). ``lazy``: the entry holds device
        # statistics (``StatsRecord``) to batch; on CPU none does, and the flush looks
        # into no entry.
        self._activity: collections.deque[tuple[int, str, Any, bool]] = collections.deque()
        # Handles of the gradient hooks put on leaf tensors that modules returned
        # (removed at the step's end: a parameter outlives its step).
        self._leaf_taps: list[Any] = []
        # input NaN/Inf checks of the calls in progress, by (id(module), depth in the call stack)
        self._inputs: dict[tuple[int, int], Any] = {}
        # include/exclude decisions per module id, the module names they were made
        # with, and the structure version (construction.registrations) of those names
        self._selected: dict[int, bool] = {}
        self._names: dict[int, list[str]] = {}
        self._selected_at = -1
        # Module classes that are neither a data-parallel nor a torch.compile wrapper (both
        # are properties of the class): their calls skip those two tests.
        self._plain_types: set[type] = set()

    def _selected_module(self, module: torch.nn.Module, module_id: int) -> bool:
        """Include/exclude globs, evaluated once per module per structure version."""
        policy = self.ctx.policy
        if not policy.include and not policy.exclude:
            return True
        registrations = self.construction.registrations
        if self._selected_at != registrations:
            self._selected = {}
            self._names = self.ctx.state.module_names()
            self._selected_at = registrations
        hit = self._selected.get(module_id)
        if hit is None:
            node = self.ctx.state.modules.get(module_id)
            cls = node.cls if node is not None and node.cls else class_name(module)
            hit = self._selected[module_id] = policy.module_selected(
                self._names.get(module_id, []), cls
            )
        return hit

    # ------------------------------------------------------------------ forward
    @call_guard
    def _on_forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        ctx = self.ctx
        try:
            called = module
            if type(module) not in self._plain_types:
                if parallel_wrapper_attr(module) is not None:
                    return None  # DDP/FSDP wrapper: the model's own call follows and is recorded
                module = unwrap_compiled(module)  # torch.compile wrapper: count once
                if module is called:
                    self._plain_types.add(type(module))
                elif not ctx.compiled_seen:
                    ctx.compiled_seen = True
                    skip_guards_at_frame_level()
            stack = ctx.call_stack()
            if not stack:
                construction = self.construction
                if construction.scanned.get(module) != construction.registrations:
                    self.check_in_place(module, subtree=True)  # built before recording: seen now
                    if not ctx.compiled_seen and compiled_modules(module):
                        ctx.compiled_seen = True  # Module.compile() or a compiled forward inside
                        skip_guards_at_frame_level()
                    construction.seal(module, "first_forward")  # also remembers it as a root
            metrics = self.metrics
            metrics.watch_call(called, not stack)  # loss modules and roots: metrics.py
            if not stack:
                # the outermost call: FLOPs (never of a compiled model), a loss
                metrics.root_entered(called)
            if ctx.sampling and ctx.policy.activity:
                module_id = ctx.module_id(module)
                if self._selected_module(module, module_id):
                    # The id travels to the post hook with the check (one lookup a call).
                    key = (id(module), len(stack))
                    if self.flops.flops_counting():
                        with self.flops.uncounted():  # our statistics are not the model's FLOPs
                            self._inputs[key] = (module_id, self._input_check(args))
                    else:  # (no context manager to enter: its frames cost more than the check)
                        self._inputs[key] = (module_id, self._input_check(args))
            stack.append(module)
        except Exception as exc:
            ctx.fault("forward_pre_hook", exc)
        return None

    def _input_check(self, args: Any) -> int | NonFiniteInputs | None:
        """NaN/Inf elements in a call's positional input tensors (the first 4), so that
        ``auditlog nonfinite`` can tell a module that produced a NaN from one that was
        handed it. An input that is an earlier call's output (same tensor, same
        version: our gradient tap on it says so) reuses that call's statistics;
        others cost one norm."""
        parts: list[dict[str, Any] | StatsRecord] = []
        inputs = (
            args  # one positional tensor, nearly every call: no container to walk
            if len(args) == 1 and isinstance(args[0], torch.Tensor)
            else tensors_in(args, MAX_TENSORS)[:MAX_TENSORS]
        )
        for tensor in inputs:
            # Our tap first: only a floating point or complex tensor can require grad, so a
            # tensor that carries one needs no dtype test (a test through torch's argument parser).
            tap = self._tap_on(tensor)
            if (
                tap is None and not (tensor.is_floating_point() or tensor.is_complex())
            ) or transform_value(tensor):
                continue  # integers and booleans are always finite; a transform's values are not read
            if tap is not None and tap.stats is not None and tap.version == tensor_version(tensor):
                parts.append(tap.stats)
            else:
                parts.append(activity_stats(local_view(tensor), full=False))
        if not parts:
            return None
        total = 0
        for part in parts:  # plain numbers (CPU): added up now, as NonFiniteInputs.resolve does
            if type(part) is not dict:
                return NonFiniteInputs(parts)
            total += int(part.get("nan", 0)) + int(part.get("inf", 0))
        return total

    @call_guard
    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        ctx = self.ctx
        try:
            if type(module) not in self._plain_types:
                if parallel_wrapper_attr(module) is not None:
                    return None
                module = unwrap_compiled(module)
            stack = ctx.call_stack()
            depth = len(stack) - 1
            if stack and stack[-1] is module:
                stack.pop()
            elif module in stack:
                depth = len(stack) - 1 - stack[::-1].index(module)
                del stack[depth:]
            entry = self._inputs.pop((id(module), depth), None) if self._inputs else None
            if depth == 0:
                self.metrics.root_left(module, output)
            policy = ctx.policy
            if not (ctx.sampling and policy.activity):
                return None
            if entry is not None:
                module_id, inputs = entry
            else:
                module_id, inputs = ctx.module_id(module), None
            if not self._selected_module(module, module_id):
                return None
            if isinstance(output, torch.Tensor):
                self._forward_tensor(module_id, output, inputs, policy)
                return None
            if output is None:
                self._add_activity(
                    ctx.step,
                    "forward",
                    {
                        "error": True,
                        "input_nonfinite": inputs,
                        "module_id": module_id,
                        "n_outputs": 0,
                        "outputs": [],
                    },
                    self._lazy([], inputs),
                )
                return None
            tensors = tensors_in(output)
            full = policy.stats == "full"
            with self.flops.uncounted():
                stats = [self._output_stats(t, full) for t in tensors[:MAX_TENSORS]]
            self._add_activity(
                ctx.step,
                "forward",
                {
                    "input_nonfinite": inputs,
                    "module_id": module_id,
                    "n_outputs": len(tensors),
                    "outputs": stats,
                },
                self._lazy(stats, inputs),
            )
            if policy.backward == "grad" and torch.is_grad_enabled():
                self._hook_gradients(module_id, tensors, stats)
        except Exception as exc:
            ctx.fault("forward_hook", exc)
        return None

    def _forward_tensor(
        self, module_id: int, tensor: torch.Tensor, inputs: Any, policy: Policy
    ) -> None:
        """A call that returned one tensor (nearly every call): what the general path
        records, with the tensor's gradient tap looked up once for both the reuse of
        its statistics (``_output_stats``) and its gradient hook (``_hook_gradients``)."""
        full = policy.stats == "full"
        step = self.ctx.step
        tap = self._tap_on(tensor)
        version = tensor_version(tensor)
        stats: dict[str, Any] | StatsRecord
        if transform_value(tensor):
            stats = skipped_stats(tensor)
        elif tap is not None and tap.stats is not None and tap.version == version:
            stats = tap.stats
        elif self.flops.flops_counting():
            with self.flops.uncounted():
                stats = activity_stats(local_view(tensor), full, units=full)
        else:
            stats = activity_stats(local_view(tensor), full, units=full)
        self._add_activity(
            step,
            "forward",
            {"input_nonfinite": inputs, "module_id": module_id, "n_outputs": 1, "outputs": [stats]},
            type(stats) is not dict or type(inputs) is NonFiniteInputs,
        )
        if policy.backward != "grad" or not tensor.requires_grad or not torch.is_grad_enabled():
            return
        if tap is not None and tap.version == version:
            tap.modules.append(module_id)  # one hook, one gradient, an entry per module
            return
        handle = tensor.register_hook(GradTap(self, [module_id], step, version, stats))  # type: ignore[no-untyped-call]
        if tensor.is_leaf:  # a parameter the module returned: its hook goes at the step's end
            self._leaf_taps.append(handle)

    def _add_activity(
        self, step: int, direction: str, entry: dict[str, Any], lazy: bool = True
    ) -> None:
        """Hold one module call's statistics until the step's ``activity`` event
        (``lazy``: it may hold device statistics; ``_lazy`` says)."""
        activity = self._activity
        activity.append((step, direction, entry, lazy))
        if len(activity) >= ACTIVITY_FLUSH:
            self._emit_activity()

    def flush_activity(self) -> None:
        """The step ended: emit its module activity, and take the gradient hooks off
        the leaf tensors (parameters) that modules returned, which outlive the step."""
        taps = self._leaf_taps
        while taps:
            taps.pop().remove()
        self._emit_activity()

    def _emit_activity(self) -> None:
        """Emit the held module activity: one ``activity`` event per step it belongs to."""
        self._inputs.clear()
        activity = self._activity
        by_step: dict[int, dict[str, list[Any]]] = {}
        lazy_steps: set[int] = set()
        for _ in range(len(activity)):
            step, direction, entry, maybe_lazy = activity.popleft()
            calls = by_step.get(step)
            if calls is None:
                calls = by_step[step] = {"backward": [], "forward": []}
            calls[direction].append(entry)
            if maybe_lazy:
                lazy_steps.add(step)
        for step, calls in by_step.items():
            if step not in lazy_steps:  # plain numbers only (CPU): the writer encodes it as it is
                self.ctx.emit("activity", None, None, Clean(calls), step=step)
                continue
            lazy = [
                stats
                for entries in calls.values()
                for entry in entries
                for key in ("outputs", "grad_outputs", "grad_inputs")
                for stats in entry.get(key, ())
                if type(stats) is StatsRecord
            ]
            lazy += [
                part
                for entry in calls["forward"]
                if type(entry.get("input_nonfinite")) is NonFiniteInputs
                for part in entry["input_nonfinite"].parts
                if type(part) is StatsRecord
            ]
            if lazy:
                batch_records(lazy)  # device statistics: one readback per step on the writer
            else:
                calls = Clean(calls)  # plain numbers only (CPU): the writer encodes it as it is
            self.ctx.emit("activity", None, None, calls, step=step)

    @staticmethod
    def _lazy(stats: list[Any], inputs: Any = None) -> bool:
        """May an entry with these statistics hold device statistics (to batch at the flush)?"""
        return type(inputs) is NonFiniteInputs or any(
            s is not None and type(s) is not dict for s in stats
        )

    def _output_stats(self, tensor: torch.Tensor, full: bool) -> dict[str, Any] | StatsRecord:
        """Statistics of a module output, computed once per tensor and version.

        A container returns its last child's output tensor itself (every
        ``nn.Sequential``): the same object, unchanged since (same version
        counter), has the same statistics, so they are reused (a quarter of the
        calls of the benchmark MLP). The object is recognised by the ``GradTap``
        the child's call left on it, so only outputs that require grad are
        recognised; others are measured again.
        """
        if transform_value(tensor):
            return skipped_stats(tensor)
        tap = self._tap_on(tensor)
        if tap is not None and tap.stats is not None and tap.version == tensor_version(tensor):
            return tap.stats
        return activity_stats(local_view(tensor), full, units=full)

    def _tap_on(self, tensor: torch.Tensor) -> GradTap | None:
        """This recorder's gradient hook of the current step on ``tensor``, if any."""
        if not tensor.requires_grad:
            return None
        hooks = tensor_hooks(tensor)
        if hooks:
            for hook in reversed(hooks.values()):
                if type(hook) is GradTap and hook.activity is self and hook.step == self.ctx.step:
                    return hook
        return None

    def _hook_gradients(
        self, module_id: int, tensors: list[torch.Tensor], stats: list[dict[str, Any] | StatsRecord]
    ) -> None:
        needing = [t for t in tensors if t.requires_grad]
        if not needing:
            return
        step = self.ctx.step
        if len(needing) == 1:
            tensor = needing[0]
            version = tensor_version(tensor)
            tap = self._tap_on(tensor)
            if tap is not None and tap.version == version:
                tap.modules.append(module_id)  # one hook, one gradient, an entry per module
                return
            measured = next((s for t, s in zip(tensors, stats, strict=False) if t is tensor), None)
            tap = GradTap(self, [module_id], step, version, measured)
            handle = tensor.register_hook(tap)  # type: ignore[no-untyped-call]
        else:
            handle = torch.autograd.graph.register_multi_grad_hook(
                needing, partial(self._on_output_grads, module_id, step), mode="all"
            )
        if any(t.is_leaf for t in needing):  # (reading grad_fn builds a Python node: not free)
            # A leaf (a parameter the module returned) outlives the step: its hook is
            # removed at the step's end. Other outputs take their hooks with them.
            self._leaf_taps.append(handle)

    # ------------------------------------------------------------------ backward
    @call_guard
    def _on_output_grad(self, module_ids: list[int], step: int, grad: torch.Tensor) -> None:
        try:
            found = grad_stats(grad, self.ctx.policy.stats == "full")
            stats = [found]
            lazy = found is not None and type(found) is not dict
            for (
                module_id
            ) in module_ids:  # modules that returned this very tensor: the same gradient
                self._add_activity(
                    step,
                    "backward",
                    {"grad_outputs": stats, "mechanism": "grad", "module_id": module_id},
                    lazy,
                )
        except Exception as exc:
            self.ctx.fault("gradient_hook", exc)
        return None

    @call_guard
    def _on_output_grads(self, module_id: int, step: int, grads: Any) -> None:
        try:
            full = self.ctx.policy.stats == "full"
            stats = [grad_stats(g, full) for g in list(grads)[:MAX_TENSORS]]
            self._add_activity(
                step,
                "backward",
                {"grad_outputs": stats, "mechanism": "grad", "module_id": module_id},
                self._lazy(stats),
            )
        except Exception as exc:
            self.ctx.fault("gradient_hook", exc)
        return None

    def _on_backward_pre(self, module: torch.nn.Module, grad_output: Any) -> None:
        return None  # installed so the full pair is present; the post hook records

    def _grad_stats(self, grads: Any) -> list[dict[str, Any] | StatsRecord | None]:
        full = self.ctx.policy.stats == "full"
        return [grad_stats(g, full) for g in list(grads or ())[:MAX_TENSORS]]

    @call_guard
    def _on_full_backward(self, module: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        self._record_backward("full", "full_backward_hook", module, grad_input, grad_output)

    @call_guard
    def _on_legacy_backward(
        self, module: torch.nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        self._record_backward("legacy", "legacy_backward_hook", module, grad_input, grad_output)

    def _record_backward(
        self, mechanism: str, where: str, module: torch.nn.Module, grad_input: Any, grad_output: Any
    ) -> None:
        try:
            if (
                not (self.ctx.sampling and self.ctx.policy.activity)
                or parallel_wrapper_attr(module) is not None
            ):
                return
            module_id = self.ctx.module_id(module)
            if not self._selected_module(module, module_id):
                return
            outputs, inputs = self._grad_stats(grad_output), self._grad_stats(grad_input)
            self._add_activity(
                self.ctx.step,
                "backward",
                {
                    "grad_inputs": inputs,
                    "grad_outputs": outputs,
                    "mechanism": mechanism,
                    "module_id": module_id,
                },
                self._lazy(outputs + inputs),
            )
        except Exception as exc:
            self.ctx.fault(where, exc)
