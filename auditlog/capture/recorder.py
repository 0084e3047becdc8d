"""The recorder: installs the global hooks for one run and removes exactly those.

Assembled from one mixin per concern (see ``base.py``). The registration and
optimizer hooks stay installed for the whole recording; the per-call hooks
(forward, and full/legacy backward) take every module call off PyTorch's fast
path, so they are present only on the steps whose activity is sampled.
"""

from __future__ import annotations

from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.hooks import RemovableHandle

from auditlog.capture.activity import ActivityHooks
from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.construction import ConstructionHooks
from auditlog.capture.flops import FlopCounting
from auditlog.capture.metrics import MetricHooks
from auditlog.capture.nonfinite import NonFiniteWatch
from auditlog.capture.optimizer import OptimizerHooks
from auditlog.capture.roots import RootTracking
from auditlog.capture.structure import StructureChecks
from auditlog.capture.torch_compat import FullBackwardFlag
from auditlog.core.policy import Policy


class Recorder(
    ConstructionHooks,
    RootTracking,
    StructureChecks,
    ActivityHooks,
    OptimizerHooks,
    MetricHooks,
    FlopCounting,
    NonFiniteWatch,
):
    """Installs the global hooks and emits records for one run onto a ``RecordBuffer``."""

    def __init__(self, buffer: RecordBuffer, policy: Policy | None = None) -> None:
        super().__init__(buffer, policy)
        self._handles: list[RemovableHandle] = []
        self._call_handles: list[RemovableHandle] = []  # per-call hooks, present on sampled steps only
        self._full_flag = FullBackwardFlag()

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
        self._full_flag.save_and_clear()
        self.sampling = self.policy.samples(0)
        self._install_call_hooks(forward_only=not self.sampling)

    def _install_call_hooks(self, forward_only: bool = False) -> None:
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

    def _remove_call_hooks(self) -> None:
        while self._call_handles:
            self._call_handles.pop().remove()
        self.call_stack().clear()
        self._inputs.clear()

    def update_call_hooks(self) -> None:
        """Per-call hooks present exactly when the coming step is sampled."""
        if self.sampling:
            self._install_call_hooks()
        else:
            self._remove_call_hooks()

    def remove(self) -> None:
        """Remove exactly the hooks this recorder installed, and torch's flag as it was."""
        self._remove_call_hooks()
        self.remove_metric_hooks()
        self.stop_flops("run_end")
        while self._handles:
            self._handles.pop().remove()
        self._full_flag.restore()

    # ------------------------------------------------------------------ end
    def finish(self) -> None:
        """Run end: seal what was never sealed, check structure, take the final snapshot."""
        self.flush_metrics()
        self.flush_activity()
        if self._unsealed:
            self.seal(None, "run_end")
        roots = self.live_roots()
        self.check(roots, "run_end")
        if self.policy.snapshot_final and roots:
            self.snapshot(roots, "run_end")
        self._finished = True
        self.release_roots()
