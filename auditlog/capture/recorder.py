"""The recorder: builds the components of one run, installs their hooks, removes exactly those.

Each concern is a component that owns its state and its hooks (``context.py``
lists them); they share one ``RecordingContext``. ``Recorder`` builds them,
hands each the others it talks to, registers their bound methods as torch's
hooks (no layer in between: a hook's cost is the component's method) and routes
what crosses concerns at the ends of a recording. The registration and
optimizer hooks stay installed for the whole recording; the per-call hooks
(forward, and full/legacy backward) take every module call off PyTorch's fast
path, so they are present only on the steps whose activity is sampled (once a
compiled module is seen, for the rest of the recording: dynamo recompiles when
torch's hook tables change). At every
optimizer step the recorder checks that its hooks are still in torch's tables
(other code may take them out, ``hooktables.py``) and puts back what is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from auditlog.capture import constructors
from auditlog.capture.activity import ActivityHooks
from auditlog.capture.backward import BackwardWatch
from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.construction import ConstructionHooks
from auditlog.capture.context import RecordingContext
from auditlog.capture.data import DataWatch
from auditlog.capture.flops import FlopCounting
from auditlog.capture.hooktables import HookTables, Register
from auditlog.capture.metrics import MetricHooks
from auditlog.capture.nonfinite import NonFiniteWatch
from auditlog.capture.optimizer import OptimizerHooks
from auditlog.capture.roots import RootTracking
from auditlog.capture.structure import StructureChecks
from auditlog.capture.torch_compat import FullBackwardFlag
from auditlog.core.policy import Policy

_ROOT_WATCH = ("root_watch_pre", "root_watch")


class Recorder:
    """Installs the global hooks and emits records for one run onto a ``RecordBuffer``.

    The session holds this one object; what it asks of a run goes to the part
    that does it: ``ctx`` (``emit``, ``settle``, ``step``, ``faults``, the
    session's ``step_barrier`` and ``failure``), ``construction.seal``,
    ``structure.check``, ``roots.snapshot``, ``metrics.log_metrics``, ``data``.
    """

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        ctx = self.ctx = RecordingContext(buffer, policy)
        # Built in the order they need each other; construction and the two it
        # calls when sealing (structure, roots) need each other both ways.
        self.construction = ConstructionHooks(ctx, self.check_in_place)
        self.roots = RootTracking(ctx, self.construction)
        self.structure = StructureChecks(ctx, self.construction, self.roots)
        self.construction.connect(self.structure, self.roots)
        self.flops = FlopCounting(ctx)
        self.metrics = MetricHooks(ctx, self.flops)
        self.nonfinite = NonFiniteWatch(ctx, self.metrics, self.roots)
        self.activity = ActivityHooks(
            ctx, self.construction, self.metrics, self.flops, self.check_in_place
        )
        self.steps = OptimizerHooks(
            ctx,
            self.construction,
            self.roots,
            self.structure,
            self.activity,
            self.metrics,
            self.nonfinite,
            self.update_call_hooks,
        )
        self._hooks = HookTables()
        self._call_kinds: list[str] = []  # per-call hooks, present on sampled steps only
        self._full_flag = FullBackwardFlag()
        self._hooks_verified_at = 0  # the step at which every hook was last found in place
        self._refused: set[str] = set()  # kinds torch would not take back: not captured any more
        # backward(), GradScaler.scale/step (backward.py): the loss, raw gradient norms
        self._backward = BackwardWatch(self.metrics, self.steps.norms, self.steps, ctx.fault)
        # one bound method: listen and unlisten it
        self._constructed = self.construction.on_constructed
        # DataLoader iterations, datasets, batch indices (data.py)
        self.data = DataWatch(ctx, ctx.policy.batch_hash_every)

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        """Register the registration and optimizer hooks, and the per-call hooks for step 0.

        Step 0 (until the first optimizer step returns) always has the forward hooks,
        so that the model is sealed at its first forward, before BatchNorm and the
        like change any buffer.
        """
        constructors.listen(self._constructed)  # where each module is built (constructors.py)
        add = self._hooks.install
        construction, steps, ctx = self.construction, self.steps, self.ctx
        add(
            "module_registration",
            construction._on_module_registered,
            nn_module.register_module_module_registration_hook,
        )
        add(
            "parameter_registration",
            construction._on_parameter_registered,
            nn_module.register_module_parameter_registration_hook,
        )
        add(
            "buffer_registration",
            construction._on_buffer_registered,
            nn_module.register_module_buffer_registration_hook,
        )
        add("optimizer_step_pre", steps._on_step_pre, optim_module.register_optimizer_step_pre_hook)
        add(
            "optimizer_step_post",
            steps._on_step_post,
            optim_module.register_optimizer_step_post_hook,
        )
        self._backward.install()
        if ctx.policy.data:
            self.data.install()
        self._full_flag.save_and_clear()
        ctx.sampling = ctx.policy.samples(0)
        self._install_call_hooks(forward_only=not ctx.sampling)

    def _install_call_hooks(self, forward_only: bool = False) -> None:
        if self._call_kinds:
            return
        activity, backward = self.activity, self.ctx.policy.backward
        kinds: list[tuple[str, Callable[..., Any], Register]] = [
            ("forward_pre", activity._on_forward_pre, nn_module.register_module_forward_pre_hook)
        ]
        # always_call: the call stack is unwound, and the failed call recorded, when
        # forward raises (docs/hooks.md: what a user can observe of it).
        kinds.append(
            (
                "forward",
                activity._on_forward,
                partial(nn_module.register_module_forward_hook, always_call=True),
            )
        )
        if not forward_only:
            if backward == "full":
                kinds.append(
                    (
                        "full_backward_pre",
                        activity._on_backward_pre,
                        nn_module.register_module_full_backward_pre_hook,
                    )
                )
                kinds.append(
                    (
                        "full_backward",
                        activity._on_full_backward,
                        nn_module.register_module_full_backward_hook,
                    )
                )
            elif backward == "legacy":
                kinds.append(
                    (
                        "backward",
                        activity._on_legacy_backward,
                        nn_module.register_module_backward_hook,
                    )
                )
        for kind, hook, register in kinds:
            if kind in self._refused:
                continue
            self._hooks.install(kind, hook, register, always_called=kind == "forward")
            self._call_kinds.append(kind)

    def check_in_place(self, module: torch.nn.Module, subtree: bool) -> None:
        """With ``backward="full"``, an in-place module (``ReLU(inplace=True)``) would make
        torch stop training ("Output 0 of BackwardHookFunction is a view and is being
        modified inplace"). Seen before it runs (construction's registration hook, or
        the first forward of a model built before recording), backward is recorded with
        gradient hooks instead (``grad``), with one notice and a ``recorder_error`` event."""
        ctx = self.ctx
        if ctx.policy.backward != "full":
            return
        for found in module.modules() if subtree else (module,):
            if getattr(found, "inplace", False) is True:
                culprit = f"{type(found).__name__}(inplace=True)"
                message = (
                    f"backward=full cannot record a model with an in-place module ({culprit}); "
                    "recording backward with gradient hooks (backward=grad) instead"
                )
                self.drop_full_backward_hooks()
                ctx.emit(
                    "recorder_error",
                    payload={"where": "backward", "type": "InPlaceModule", "message": message},
                )
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"auditlog: {message}\n")
                return

    def drop_full_backward_hooks(self) -> None:
        """Switch to ``backward="grad"`` and remove the full backward hooks now; modules
        called later are no longer wrapped by torch."""
        self.ctx.policy = dataclasses.replace(self.ctx.policy, backward="grad")
        for kind in ("full_backward_pre", "full_backward"):
            if kind in self._call_kinds:
                self._hooks.uninstall(kind)
                self._call_kinds.remove(kind)

    def _remove_call_hooks(self) -> None:
        while self._call_kinds:
            self._hooks.uninstall(self._call_kinds.pop())
        self.ctx.clear_call_stack()

    def _watch_roots(self, present: bool) -> None:
        """``RootWatch``: on unsampled steps, a light global pre/post pair that sees the
        outermost call of a root whose output carried a loss (metrics.py)."""
        self.metrics.restart_root_watch()
        has = self._hooks.has
        if (
            all(has(kind) or kind in self._refused for kind in _ROOT_WATCH)
            if present
            else not any(map(has, _ROOT_WATCH))
        ):
            return  # as it should be already: nothing to build (every step goes through here)
        kinds: list[tuple[str, Callable[..., Any], Register]] = [
            (
                "root_watch_pre",
                self.metrics._on_root_watch_pre,
                nn_module.register_module_forward_pre_hook,
            ),
            (
                "root_watch",
                self.metrics._on_root_watch,
                partial(nn_module.register_module_forward_hook, always_call=True),
            ),
        ]
        for kind, hook, register in kinds:
            if present and kind not in self._hooks.installed() and kind not in self._refused:
                self._hooks.install(kind, hook, register, always_called=kind == "root_watch")
            elif not present and kind in self._hooks.installed():
                self._hooks.uninstall(kind)

    def update_call_hooks(self) -> None:
        """At every optimizer step: check that every hook is still in torch's tables,
        then make the per-call hooks present exactly when the coming step is sampled
        (and the root watch when it is not, and a root's output carries the loss)."""
        self.verify_hooks("optimizer_step")
        if self.ctx.compiled_seen:
            # Dynamo guards on the global hook tables: a change would make it compile
            # every compiled module again (more graphs than an unrecorded run).
            # From the first compiled module on, the per-call hooks stay;
            # on unsampled steps they record no activity (they do the root watch's job).
            self._watch_roots(False)
            self._install_call_hooks()
        elif self.ctx.sampling:
            self._watch_roots(False)
            self._install_call_hooks()
        else:
            self._remove_call_hooks()
            self._watch_roots(self.metrics.loss_roots())

    def verify_hooks(self, where: str, repair: bool = True) -> list[str]:
        """Find hooks that other code took out of torch's tables; put them back.

        A kind that cannot be put back (torch refuses, e.g. full backward hooks
        after someone registered a legacy one) stops being captured. Either way one
        ``hooks_removed`` event says which, since which step, and where it was
        found; the first time also warns. Returns the kinds found missing.
        """
        ctx = self.ctx
        try:
            missing = self._hooks.missing()
            if not missing:
                self._hooks_verified_at = ctx.step
                return []
            reinstalled: list[str] = []
            stopped: dict[str, str] = {}
            for kind in missing if repair else ():
                try:
                    self._hooks.reinstall(kind)
                    reinstalled.append(kind)
                except Exception as exc:  # torch refused: capture of that kind ends, said so
                    self._hooks.stop(kind)
                    self._refused.add(kind)
                    if kind in self._call_kinds:
                        self._call_kinds.remove(kind)
                    stopped[kind] = f"{type(exc).__name__}: {exc}"[:500]
            since = self._hooks_verified_at
            payload: dict[str, Any] = {
                "hooks": missing,
                "reinstalled": reinstalled,
                "stopped": stopped,
                "since_step": since,
                "detected_at": where,
            }
            ctx.emit("hooks_removed", payload=payload)
            self._hooks_verified_at = ctx.step
            self._warn_hooks_removed(missing, reinstalled, since)
            if any(kind.endswith("_registration") for kind in reinstalled):
                self.structure.check(None, where)  # members added while nobody was listening
            return missing
        except Exception as exc:
            ctx.fault("hook_check", exc)
            return []

    def _warn_hooks_removed(self, missing: list[str], reinstalled: list[str], since: int) -> None:
        warned = self.ctx.warned
        if "hooks_removed" in warned:
            return
        warned.add("hooks_removed")
        done = "put them back" if reinstalled == missing else f"put back {reinstalled or 'none'}"
        try:
            warnings.warn(
                f"auditlog: other code removed auditlog's hooks {missing} from torch's global hook tables "
                f"(after step {since}, found at step {self.ctx.step}); auditlog {done} "
                "(recorded as a hooks_removed event; warned once)",
                RuntimeWarning,
                stacklevel=4,
            )
        except Exception:  # -W error: the event is the record
            pass

    def remove(self) -> None:
        """Remove exactly the hooks this recorder installed, and torch's flag as it was.

        Hooks found missing now are recorded first (``detected_at: run_end``)."""
        self.verify_hooks("run_end", repair=False)
        constructors.unlisten(self._constructed)
        self._backward.remove()
        self.data.remove()  # the batches still pending are emitted first
        self._call_kinds.clear()
        self.ctx.call_stack().clear()
        self.metrics.remove_metric_hooks()
        self.flops.stop_flops("run_end")
        self._hooks.remove_all()
        self._full_flag.restore()

    # ------------------------------------------------------------------ end
    def finish(self) -> None:
        """Run end: seal what was never sealed, check structure, take the final snapshot."""
        self.metrics.flush_metrics()
        self.activity.flush_activity()
        self.steps.norms.untracked_summary()  # parameter updates no step hook saw, if any
        if self.construction.unsealed:
            self.construction.seal(None, "run_end")
        roots = self.roots.live_roots()
        self.structure.check(roots, "run_end")
        if self.ctx.policy.snapshot_final and roots:
            self.roots.snapshot(roots, "run_end")
        self.roots.finish()
