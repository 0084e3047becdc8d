"""Metrics: the loss of every step where torch shows it, and the values a user logs.

Without any change to the training script the loss is read where PyTorch makes it
visible to hooks:

- the output of a loss module: any ``torch.nn.modules.loss._Loss``
  (``nn.CrossEntropyLoss``, ``nn.MSELoss`` ...), origin ``loss_module``;
- the output of a root module (the model) that carries one: ``ModelOutput.loss``
  of Hugging Face models, a ``loss`` key of a dict, a ``loss`` attribute; origin
  ``model_output``. A loss module called inside that root's forward returns the
  very tensor the output carries: it is recorded once.

- the scalar a ``backward()`` starts from (``backward.py``), origin ``backward``:
  a loss computed by a function (``F.cross_entropy(...)``) or custom code passes
  no module hook, but it is what the model trains on. When a loss module's or
  root's loss was recorded for the same backward, the backward's scalar is the
  same tensor (nothing more is recorded) or another one (``loss / accumulation``,
  a sum of losses): then it is recorded as ``backward_loss`` beside it. A scalar
  a ``GradScaler`` scaled is recorded unscaled (the value ``scale()`` was given).

Cost. The global per-call hooks are present only on sampled steps
(``recorder.py``), so the loss cannot come from them. Instead, the first time a
sampled step (step 0 always is one) sees a loss module called, that one module
gets its own forward hook (a ``ModuleTap``: copies and pickles of the module
carry an inert hook instead, so ``copy.deepcopy`` and ``torch.save`` keep
working), removed at the end of the recording. The model itself (a root) never
gets a hook of its own: adding one would show in its hook dicts, which user code
may count. When a root's output carried a loss on a sampled step (a Hugging
Face model given labels), a light global forward pre/post pair stays on the
unsampled steps too, and acts only on the outermost call of such a root
(``RootWatch``). Every other model keeps PyTorch's fast path on unsampled
steps. Each loss costs one entry: on CPU the value is read at once (``item()``:
nothing to wait for); on a device it goes to pinned host memory with a
non-blocking copy (``Scalar``) that the writer reads. No sync.

A loss that does not require grad (computed under ``torch.no_grad()``, an
evaluation) is named ``eval_loss``. The step's values leave as one ``metrics``
event when its optimizer step returns (before ``activity`` and
``optimizer_step``), like module activity.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from auditlog.capture.context import RecordingContext
from auditlog.capture.flops import FlopCounting
from auditlog.capture.payloads import Scalar
from auditlog.capture.taps import ModuleTap
from auditlog.capture.torch_compat import call_guard, compile_guard, is_loss_module, unwrap_compiled
from auditlog.core.chain import Clean, CleanList

# Metric entries held before they are emitted anyway (an evaluation loop with no
# optimizer steps must not grow memory without bound).
METRICS_FLUSH = 1024


def metric_value(value: Any) -> float | int | str | Scalar:
    """A number as a metric entry holds it: CPU values now, device values on their way.

    Raises ``TypeError`` for anything but a real number or a one-element tensor.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise TypeError(
                f"a metric tensor must hold one real number, not shape {tuple(value.shape)}"
            )
        if value.is_cpu:
            return metric_value(value.item())  # item() reads the value: no graph, no detach needed
        return Scalar(value)
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return metric_value(item())
    raise TypeError(
        f"a metric must be a number or a one-element tensor, not {type(value).__name__}"
    )


def _json_ready(value: Any) -> bool:
    """Is a metric value JSON as it is (a finite float, an int, text)? A NaN loss, or a
    device value still on its way, is left for the writer to make so."""
    kind = type(value)
    return kind is int or kind is str or (kind is float and value - value == 0.0)


def _metrics_payload(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``metrics`` event's payload; ``Clean`` when every entry is (the writer does not walk it)."""
    if all(type(entry) is Clean for entry in entries):
        return Clean(metrics=CleanList(entries))
    return {"metrics": entries}


class _Watched(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a watched module that knows its key in ``MetricHooks._watched``."""

    __slots__ = ("key",)
    key: int


class MetricHooks:
    """Hooks on loss modules and roots, and the pending metric entries of the step.

    The outermost module call (``root_entered``/``root_left``, from the activity's
    forward hooks or the root watch) is also where one forward's FLOPs are
    counted (``flops``)."""

    def __init__(self, ctx: RecordingContext, flops: FlopCounting) -> None:
        self.ctx = ctx
        self.flops = flops
        self._metric_handles: list[RemovableHandle] = []
        # Loss modules and roots already watched, by id: a weak reference checked for
        # identity (a ``WeakKeyDictionary`` test makes a new weak reference at every call).
        self._watched: dict[int, _Watched] = {}
        self._metrics: list[tuple[int, dict[str, Any]]] = []
        self._root_depth = 0
        self._losses_in_root: set[int] = set()
        # Roots whose output carried a loss, and the call depth the RootWatch hooks keep.
        self._loss_roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._watch_depth = 0
        self._last_loss: tuple[int, Any] | None = None
        # ids of the training losses recorded since the last backward started (is the
        # backward's scalar one of them?)
        self._since_backward: list[int] = []

    # ------------------------------------------------------------------ watching
    def watch_call(self, called: torch.nn.Module, root_call: bool) -> None:
        """Called by the global forward pre hook (sampled steps): hook the loss modules."""
        seen = self._watched.get(id(called))
        if seen is not None and seen() is called:
            return
        if is_loss_module(unwrap_compiled(called)):
            self._watch(called)
            if self.ctx.policy.loss:
                self._metric_handles.append(
                    called.register_forward_hook(ModuleTap(self._on_loss_output))
                )
        elif root_call:
            self._watch(called)

    def _watch(self, module: torch.nn.Module) -> None:
        ref = self._watched[id(module)] = _Watched(module, self._unwatch)
        ref.key = id(module)

    def _unwatch(self, ref: _Watched) -> None:
        """A watched module died: its entry goes (a loss module built in every step's
        expression would otherwise leave one per step)."""
        if self._watched.get(ref.key) is ref:
            del self._watched[ref.key]

    def remove_metric_hooks(self) -> None:
        """Remove the per-module hooks this recorder added (recording ends)."""
        while self._metric_handles:
            self._metric_handles.pop().remove()
        self._watched = {}

    def root_entered(self, module: torch.nn.Module) -> None:
        """The outermost module call of this thread begins (a root's forward)."""
        try:
            self._root_depth += 1
            if self._root_depth == 1:
                self._losses_in_root.clear()
            self.flops.flops_root_started(module)
        except Exception as exc:
            self.ctx.fault("root_pre_hook", exc)

    def root_left(self, module: torch.nn.Module, output: Any) -> None:
        """The outermost module call returned: record the loss its output carries, if any."""
        try:
            self.flops.flops_root_finished(module)
            self._root_depth = max(0, self._root_depth - 1)
            if not self.ctx.policy.loss or output is None or isinstance(output, torch.Tensor):
                return
            if isinstance(output, dict):
                value = output.get("loss")
            elif isinstance(output, (tuple, list)):
                return  # positional outputs say nothing about which one is the loss
            else:
                value = getattr(output, "loss", None)
            if isinstance(value, torch.Tensor):
                if value.numel() == 1 and id(value) not in self._losses_in_root:
                    self._record_loss(module, value, "model_output")
                    self._loss_roots.add(unwrap_compiled(module))
                    if value.requires_grad:
                        self._since_backward.append(id(value))
            elif isinstance(value, (float, int)) and not isinstance(value, bool):
                self._record_loss(module, value, "model_output")
                self._loss_roots.add(unwrap_compiled(module))
        except Exception as exc:
            self.ctx.fault("root_forward_hook", exc)

    def restart_root_watch(self) -> None:
        """Every optimizer step, before the root watch is put in place or taken out:
        no outermost call is in progress between steps, whatever the depth says."""
        self._watch_depth = 0

    def loss_roots(self) -> bool:
        """Must outermost calls be seen on unsampled steps (a root's output has carried a loss)?"""
        return bool(self._loss_roots)

    def _watched_root(self, module: torch.nn.Module) -> bool:
        return unwrap_compiled(module) in self._loss_roots

    @call_guard
    def _on_root_watch_pre(self, module: torch.nn.Module, args: Any) -> None:
        """Unsampled steps: the global pre hook of ``RootWatch``, acting on the outermost call."""
        depth = self._watch_depth
        self._watch_depth = depth + 1
        if depth == 0 and self._watched_root(module):
            self.root_entered(module)
        return None

    @call_guard
    def _on_root_watch(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._watch_depth = max(0, self._watch_depth - 1)
        if self._watch_depth == 0 and self._watched_root(module):
            self.root_left(module, output)
        return None

    @compile_guard
    def _on_loss_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        try:
            if isinstance(output, torch.Tensor) and output.numel() == 1:
                if self._root_depth:
                    self._losses_in_root.add(id(output))
                self._record_loss(module, output, "loss_module")
                if output.requires_grad:
                    self._since_backward.append(id(output))
        except Exception as exc:
            self.ctx.fault("loss_forward_hook", exc)
        return None

    def backward_started(self, root: torch.Tensor | None, scaled_from: Any) -> None:
        """An outermost ``backward()`` starts from ``root`` (a scalar, or None when it is not
        one); ``scaled_from``: ``(value, id)`` of the loss a ``GradScaler`` scaled into it."""
        since, self._since_backward = self._since_backward, []
        if root is None or not self.ctx.policy.loss or not root.requires_grad:
            return
        if scaled_from is not None:
            value, source = scaled_from
            if source in since:
                return  # the loss module's or model's own loss: recorded already
        else:
            source = id(root)
            if source in since:
                return
            value = metric_value(root)
        entry = (Clean if _json_ready(value) else dict)(
            name="backward_loss" if since else "loss",
            value=value,
            origin="backward",
            module_id=None,
        )
        if scaled_from is not None:
            entry["scaled"] = True
        self._add_metric(entry, training=True)

    def _record_loss(
        self, module: torch.nn.Module, value: torch.Tensor | float, origin: str
    ) -> None:
        training = (
            value.requires_grad if isinstance(value, torch.Tensor) else torch.is_grad_enabled()
        )
        number = metric_value(value)
        entry = (Clean if _json_ready(number) else dict)(
            name="loss" if training else "eval_loss",
            value=number,
            origin=origin,
            module_id=self.ctx.module_id(unwrap_compiled(module)),
        )
        self._add_metric(entry, training)

    def _add_metric(self, entry: dict[str, Any], training: bool) -> None:
        self._metrics.append((self.ctx.step, entry))
        if training and entry["name"] == "loss":
            self._last_loss = (self.ctx.step, entry["value"])
        if len(self._metrics) >= METRICS_FLUSH:
            self.flush_metrics()

    def last_loss(self) -> Any:
        """The last training loss of the current step (a number, text or ``Scalar``), or None."""
        last = self._last_loss
        return last[1] if last is not None and last[0] == self.ctx.step else None

    # ------------------------------------------------------------------ emitting
    def flush_metrics(self, skipped: bool = False) -> None:
        """Emit the held loss entries: one ``metrics`` event per step they belong to.

        ``skipped``: they belong to an iteration whose optimizer step was skipped
        (``step_skipped``): marked so, and not that step's loss."""
        if not self._metrics:
            return
        held, self._metrics = self._metrics, []
        step = held[0][0]
        if len(held) == 1 or all(s == step for s, _ in held):  # the usual case: one step's
            entries = [entry for _, entry in held]
            if skipped:
                for entry in entries:
                    entry["skipped"] = True
            self.ctx.emit("metrics", None, None, _metrics_payload(entries), step=step)
            return
        by_step: dict[int, list[dict[str, Any]]] = {}
        for step, entry in held:
            if skipped:
                entry["skipped"] = True
            by_step.setdefault(step, []).append(entry)
        for step, entries in by_step.items():
            self.ctx.emit("metrics", None, None, _metrics_payload(entries), step=step)

    def log_metrics(self, values: dict[str, Any], step: int | None = None) -> None:
        """``auditlog.log(...)``: one ``metrics`` event now with the user's values.

        Values come converted by ``metric_value`` (``Recording.log`` checks them
        first); ``step`` is the user's own step number, kept beside the run's
        step count.
        """
        entries = []
        for name, value in values.items():
            entry: dict[str, Any] = {
                "name": name,
                "value": value,
                "origin": "user",
                "module_id": None,
            }
            if step is not None:
                entry["step"] = step
            entries.append(entry)
        self.ctx.emit("metrics", None, None, {"metrics": entries})
