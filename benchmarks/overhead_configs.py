"""The configurations ``overhead.py`` times: bare, empty hooks, floors, auditlog presets, peers.

Each is a ``Config`` with ``begin``/``end`` around a training run and optional
hooks into the loop (``step``). The floors compute auditlog's numbers with the
library's own functions in plain hooks and record nothing, so each preset's
cost can be read against the price of the numbers it keeps.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from benchlib import record_options
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import auditlog
from auditlog.capture.norms import PlanCache
from auditlog.core.tensors import activity_stats


# ---------------------------------------------------------------------- configurations
class Config:
    """One way of training: hooks installed around model construction and the steps."""

    name = "bare"
    reported = ""  # what issue #5 measured on its machine

    def unavailable(self) -> str | None:
        """Why this configuration cannot run here (a missing package), or None."""
        return None

    def begin(self, scratch: Path) -> None:
        """Before the model is built."""

    def attach(self, model: nn.Module) -> None:
        """After the model and optimizer are built."""

    def after_step(self, step: int, model: nn.Module) -> None:
        """After each ``optimizer.step()``."""

    def settle(self) -> None:
        """After the warm-up steps, before timing: let one-off background work finish."""

    def window_end(self) -> None:
        """Right after the last timed step (before any teardown)."""

    def end(self) -> dict[str, Any]:
        """Tear down; return details for the report."""
        return {}


class EmptyForwardHooks(Config):
    name = "empty forward hooks"
    reported = "1.05x"

    def begin(self, scratch: Path) -> None:
        self.handles = [
            nn_module.register_module_forward_pre_hook(lambda m, a: None),
            nn_module.register_module_forward_hook(lambda m, a, o: None),
        ]

    def end(self) -> dict[str, Any]:
        for handle in self.handles:
            handle.remove()
        return {}


class EmptyForwardBackwardHooks(EmptyForwardHooks):
    name = "empty forward + full backward hooks"
    reported = "1.55x"

    def begin(self, scratch: Path) -> None:
        super().begin(scratch)
        self.flag = nn_module._global_is_full_backward_hook
        self.handles += [
            nn_module.register_module_full_backward_pre_hook(lambda m, g: None),
            nn_module.register_module_full_backward_hook(lambda m, gi, go: None),
        ]

    def end(self) -> dict[str, Any]:
        super().end()
        nn_module._global_is_full_backward_hook = self.flag  # torch never resets it
        return {}


class Floor(Config):
    """A floor configuration: hooks of our own whose time is summed in ``spent``
    (for the CPU-time attribution table, beside auditlog's hooks)."""

    spent = 0.0
    handles: list[Any]

    def timed(self, function: Callable[..., None]) -> Callable[..., None]:
        def wrapper(*args: Any) -> None:
            began = time.perf_counter()
            try:
                function(*args)
            finally:
                self.spent += time.perf_counter() - began

        return wrapper

    def end(self) -> dict[str, Any]:
        for handle in self.handles:
            handle.remove()
        return {}


class GradientNormsFloor(Floor):
    """The statistic every preset keeps on every step, computed and read with
    nothing recorded: the library's norm plan over the gradients per step
    (``auditlog.capture.norms``: one ``torch._foreach_norm`` for a small model), in an
    optimizer step hook, the plan kept per optimizer as the recorder keeps it (worked
    out at every step, as this floor once did, it read ~20 us a step high on the fast
    workload). No recorder that keeps per-step gradient norms can cost less;
    ``minimal`` is this plus the event, and ``audit`` adds its sampled work."""

    name = "floor: gradient norms every step, nothing recorded"

    def begin(self, scratch: Path) -> None:
        plans = PlanCache()

        def norms(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            held = [
                p for group in optimizer.param_groups for p in group["params"] if p.grad is not None
            ]
            if held:  # (a gradient has its parameter's shape: the parameters name the plan)
                grads = [p.grad for p in held]
                values = plans.norms(id(optimizer), tuple(map(id, held)), grads)  # type: ignore[arg-type]
                if values is not None:
                    values.tolist()

        self.handles = [optim_module.register_optimizer_step_pre_hook(self.timed(norms))]


class DebugStatisticsFloor(Floor):
    """``debug``'s numbers computed with nothing recorded: the same statistics of
    every distinct module output (leaf modules; a container returns its last
    child's tensor) with its zero elements and dead units, and of its gradient (a
    tensor hook), and gradient, parameter and exact update norms every step (a
    pre-step copy), with the library's own ``activity_stats`` and norm plans
    (``PlanCache``, kept per optimizer as the recorder keeps them). What ``debug``
    costs above this is the recorder (identity, events, queue, writer); what this
    costs is the price of the statistics themselves on this model."""

    name = "floor: debug's statistics, nothing recorded"

    def begin(self, scratch: Path) -> None:
        self.before: list[torch.Tensor] = []
        plans = PlanCache()  # norm plans kept per optimizer and purpose, as the recorder keeps them

        def on_output(module: nn.Module, args: Any, output: Any) -> None:
            if module._modules or not isinstance(output, torch.Tensor):
                return
            activity_stats(output, units=True)  # as debug's forward hook (forensic counts)
            if output.requires_grad:
                output.register_hook(timed_grad_stats)  # type: ignore[no-untyped-call]

        def grad_stats(grad: torch.Tensor) -> None:
            activity_stats(grad)

        timed_grad_stats = self.timed(grad_stats)

        def pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            live = [p for group in optimizer.param_groups for p in group["params"]]
            params = [p.detach() for p in live]
            if len(self.before) != len(params):
                self.before = [torch.empty_like(p) for p in params]
            torch._foreach_copy_(self.before, params)
            held = [p for p in live if p.grad is not None]
            grads = [p.grad for p in held]
            plans.norms(("grad", id(optimizer)), tuple(map(id, held)), grads).tolist()  # type: ignore[arg-type, union-attr]

        def post_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            live = [p for group in optimizer.param_groups for p in group["params"]]
            identity = tuple(map(id, live))
            params = [p.detach() for p in live]
            plans.norms(("param", id(optimizer)), identity, params).tolist()  # type: ignore[union-attr]
            torch._foreach_sub_(self.before, params)
            plans.norms(("update", id(optimizer)), identity, self.before).tolist()  # type: ignore[union-attr]

        self.handles = [
            nn_module.register_module_forward_hook(self.timed(on_output)),
            optim_module.register_optimizer_step_pre_hook(self.timed(pre_step)),
            optim_module.register_optimizer_step_post_hook(self.timed(post_step)),
        ]


class Auditlog(Config):
    """``auditlog.record`` with one of the presets."""

    def __init__(self, preset: str, overrides: dict[str, Any] | None = None) -> None:
        self.preset = preset
        self.name = f"auditlog {preset}"  # its target: ``overhead.workload_targets``
        self.overrides = overrides or {}

    def begin(self, scratch: Path) -> None:
        self.store = scratch / f"store-{self.preset}"
        self.recording = auditlog.record(
            self.store, **record_options(self.preset), **self.overrides
        )
        self.recording.__enter__()
        self.steps = 0

    def after_step(self, step: int, model: nn.Module) -> None:
        self.steps = step + 1

    def settle(self) -> None:
        # The writer hashes and stores the sealed initial values (and the run_started
        # event) right after the first forward: a one-off burst, reported apart from
        # the steady-state step time.
        began = time.perf_counter()
        self.recording.flush(None)
        self.startup = time.perf_counter() - began

    def window_end(self) -> None:
        writer = self.recording.writer
        assert writer is not None
        self.backlog = len(writer.buffer)
        self.blocked = writer.buffer.blocked_seconds

    def end(self) -> dict[str, Any]:
        began = time.perf_counter()
        self.recording.__exit__(None, None, None)
        closing = time.perf_counter() - began
        run_id = self.recording.run_id
        conn = sqlite3.connect(self.store / "events.db")
        try:
            kinds = dict(
                conn.execute(
                    "select kind, count(*) from events where run_id = ? group by kind", (run_id,)
                ).fetchall()
            )
            size = conn.execute(
                "select coalesce(sum(length(payload)), 0) from events where run_id = ?", (run_id,)
            ).fetchone()[0]
        finally:
            conn.close()
        shutil.rmtree(self.store, ignore_errors=True)
        return {
            "kinds": kinds,
            "payload_bytes": int(size),
            "steps": self.steps,
            "backlog": self.backlog,
            "blocked": self.blocked,
            "closing": closing,
            "startup": self.startup,
        }


class WandbRun:
    """One offline wandb run shared by every wandb configuration of a benchmark."""

    run: Any = None
    directory: Path | None = None

    @classmethod
    def get(cls) -> Any:
        if cls.run is None:
            import wandb

            cls.directory = Path(tempfile.mkdtemp(prefix="auditlog-bench-wandb-"))
            cls.run = wandb.init(
                project="auditlog-bench",
                dir=str(cls.directory),
                mode="offline",
                settings=wandb.Settings(
                    silent=True,
                    console="off",
                    x_disable_stats=True,
                    disable_git=True,
                    save_code=False,
                ),
            )
        return cls.run

    @classmethod
    def finish(cls) -> None:
        if cls.run is not None:
            cls.run.finish()
            cls.run = None
        if cls.directory is not None:
            shutil.rmtree(cls.directory, ignore_errors=True)


def quiet_offline_wandb_environment() -> None:
    """Make any wandb use in this process offline, silent and local (set before import)."""
    scratch = tempfile.mkdtemp(prefix="auditlog-bench-wandb-env-")
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_DIR=scratch,
        WANDB_CONFIG_DIR=scratch,
        WANDB_CACHE_DIR=scratch,
        WANDB_DATA_DIR=scratch,
    )


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


class WandbLogOnly(Config):
    """Control: the per-step ``run.log`` call that the wandb rows make, without watch."""

    name = "wandb.log per step (control)"

    def unavailable(self) -> str | None:
        return None if _importable("wandb") else "not installed"

    def begin(self, scratch: Path) -> None:
        self.run = WandbRun.get()

    def after_step(self, step: int, model: nn.Module) -> None:
        self.run.log({"step": step})


class WandbWatch(WandbLogOnly):
    def __init__(self, log_freq: int, reported: str) -> None:
        self.log_freq = log_freq
        self.name = f"wandb.watch(log='all', log_freq={log_freq}) offline"
        self.reported = reported

    def attach(self, model: nn.Module) -> None:
        import wandb

        self.model = model
        wandb.watch(model, log="all", log_freq=self.log_freq)

    def end(self) -> dict[str, Any]:
        import wandb

        wandb.unwatch(self.model)
        return {}


class TensorBoardHistograms(Config):
    name = "TensorBoard add_histogram, params+grads every 10 steps"
    reported = "4.4x"
    every = 10

    def unavailable(self) -> str | None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            return "not installed"
        return None

    def begin(self, scratch: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = scratch / "tensorboard"
        self.writer = SummaryWriter(str(self.directory))

    def after_step(self, step: int, model: nn.Module) -> None:
        if step % self.every:
            return
        for name, param in model.named_parameters():
            self.writer.add_histogram(name, param, step)
            if param.grad is not None:
                self.writer.add_histogram(f"{name}.grad", param.grad, step)

    def end(self) -> dict[str, Any]:
        self.writer.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        return {}


def configurations(peers: bool) -> list[Config]:
    configs: list[Config] = [
        Config(),
        EmptyForwardHooks(),
        EmptyForwardBackwardHooks(),
        GradientNormsFloor(),
        DebugStatisticsFloor(),
        Auditlog("minimal"),
        Auditlog("audit"),
        Auditlog("debug"),
    ]
    if peers:
        configs += [
            WandbLogOnly(),
            WandbWatch(10, "1.85x"),
            WandbWatch(1, "~10x"),
            TensorBoardHistograms(),
        ]
    return configs
