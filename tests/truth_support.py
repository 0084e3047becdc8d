"""Ground truth for recorded numbers: the training script measures them itself.

A scenario is a training loop that, besides training, writes down what the
program really used, at the moment it used it: the gradient norms when the
update consumes them (inside the closure after backward and clipping, after
``unscale_``, per optimizer), the gradient norms as backward left them, the
learning rate, the loss it called ``backward()`` on, the parameters before and
after each update, and which steps a ``GradScaler`` skipped. ``compare`` then
checks the record against it, step by step. No number is computed from the
record itself: a recorder that takes a number at the wrong moment fails here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import auditlog

REL = 1e-5
ABS = 1e-7

# Where the scenarios train: the CPU here; a machine with a GPU runs the same scenarios
# with AUDITLOG_TEST_DEVICE=cuda (docs/development.md, "Device checks").
DEVICE = os.environ.get("AUDITLOG_TEST_DEVICE", "cpu")


def grad_norms(params: list[torch.Tensor]) -> list[float | None]:
    """The L2 norm of each parameter's gradient now (None where it has none)."""
    return [None if p.grad is None else float(p.grad.detach().double().norm()) for p in params]


def value_norms(tensors: list[torch.Tensor]) -> list[float]:
    return [float(t.detach().double().norm()) for t in tensors]


@dataclass
class TrueStep:
    """One optimizer step as the program saw it."""

    optimizer: int  # which of the scenario's optimizers (its index)
    used: list[float | None]
    raw: list[float | None] | None = None
    lr: float | None = None
    update: list[float] | None = None
    param: list[float] | None = None


@dataclass
class Truth:
    """What a scenario wrote down while it trained."""

    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    steps: list[TrueStep] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # the scalar each iteration trained on
    skipped: list[int] = field(
        default_factory=list
    )  # executed steps completed when a skip happened
    raw_pending: dict[int, list[float | None]] = field(default_factory=dict)
    before: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    _open: bool = False  # a step's gradients were consumed and its update is not done yet

    def params(self, index: int) -> list[torch.Tensor]:
        return [p for g in self.optimizers[index].param_groups for p in g["params"]]

    def after_backward(self, index: int = 0) -> None:
        """The gradients as this backward left them (call right after ``backward()``)."""
        self.raw_pending[index] = grad_norms(self.params(index))

    def consumed(self, index: int = 0) -> None:
        """The optimizer is about to use the gradients as they are now (call right before
        the update reads them: before ``step()``, or last thing in the closure)."""
        params = self.params(index)
        step = TrueStep(index, grad_norms(params), self.raw_pending.get(index))
        step.lr = float(self.optimizers[index].param_groups[0]["lr"])
        if self.steps and self.steps[-1].optimizer == index and self._open:
            self.steps[-1] = step  # a closure evaluated again (LBFGS): the last evaluation counts
        else:
            self.before[index] = [p.detach().clone() for p in params]
            self.steps.append(step)
        self._open = True

    def stepped(self, index: int = 0) -> None:
        """The update is done (call right after ``step()``; nothing when no step was open)."""
        if not self._open:
            return
        params = self.params(index)
        step = self.steps[-1]
        step.update = value_norms(
            [b - p.detach() for b, p in zip(self.before[index], params, strict=True)]
        )
        step.param = value_norms(params)
        self._open = False
        self.raw_pending.pop(index, None)

    def skip(self, index: int = 0) -> None:
        """The update did not happen (a GradScaler found inf/NaN)."""
        self.steps.pop()
        self.skipped.append(len(self.steps))
        self._open = False
        self.raw_pending.pop(index, None)


def record(store: Path, policy: str, scenario: Any, **options: Any) -> tuple[Truth, str]:
    """Run ``scenario(truth)`` under a recording; the truth it wrote and the run id."""
    truth = Truth()
    with auditlog.record(store, policy=policy, norms_every=1, **options) as run:
        torch.manual_seed(0)
        scenario(truth)
        recorder = run.recorder
        assert recorder is not None
        faults = recorder.ctx.faults
    assert faults == 0, "the recorder reported faults"
    assert run.run_id is not None
    return truth, run.run_id


def _close(got: float | None, want: float | None, where: str) -> None:
    if want is None:
        assert got is None, f"{where}: recorded {got}, the program had no gradient"
        return
    assert got is not None, f"{where}: not recorded, the program used {want}"
    assert abs(got - want) <= ABS + REL * abs(want), (
        f"{where}: recorded {got}, the program used {want}"
    )


def compare(
    store: Path, run_id: str, truth: Truth, check_raw: bool = True, check_loss: bool = True
) -> None:
    """The record agrees with the truth, step by step: executed steps, skipped steps, the
    gradient norms used and raw, lr, update and parameter norms, and the loss."""
    with auditlog.open(store) as s:
        run = s.run(run_id)
        events = list(run.events(kinds=["optimizer_step", "step_skipped", "metrics"]))
    steps = [e for e in events if e["kind"] == "optimizer_step"]
    assert len(steps) == len(truth.steps), (
        f"{len(steps)} steps recorded, {len(truth.steps)} executed"
    )
    ids: dict[int, int] = {}
    for n, (event, want) in enumerate(zip(steps, truth.steps, strict=True), start=1):
        p = event["payload"]
        assert event["step"] == n
        assert ids.setdefault(want.optimizer, p["optimizer_id"]) == p["optimizer_id"], (
            f"step {n}: optimizer"
        )
        used = p["grad_norm"]
        assert len(used) == len(want.used), (
            f"step {n}: {len(used)} norms for {len(want.used)} parameters"
        )
        for i, (got, exp) in enumerate(zip(used, want.used, strict=True)):
            _close(got, exp, f"step {n} grad_norm[{i}]")
        if check_raw and want.raw is not None:
            raw = p.get("raw_grad_norm") if p.get("grads_modified") else used
            assert p.get("grads_modified") is not None, f"step {n}: raw gradient unknown"
            assert p["grads_modified"] == (want.raw != want.used), (
                f"step {n}: grads_modified {p['grads_modified']}"
            )
            for i, (got, exp) in enumerate(zip(raw, want.raw, strict=True)):
                _close(got, exp, f"step {n} raw_grad_norm[{i}]")
        assert p["param_groups"][0]["lr"] == pytest.approx(want.lr, rel=1e-7), f"step {n}: lr"
        if p.get("update_norm") is not None and want.update is not None:
            for i, (got, exp) in enumerate(zip(p["update_norm"], want.update, strict=True)):
                _close(got, exp, f"step {n} update_norm[{i}]")
        if p.get("param_norm") is not None and want.param is not None:
            for i, (got, exp) in enumerate(zip(p["param_norm"], want.param, strict=True)):
                _close(got, exp, f"step {n} param_norm[{i}]")
    skipped = [e["step"] for e in events if e["kind"] == "step_skipped"]
    assert skipped == truth.skipped, f"skipped steps recorded {skipped}, executed {truth.skipped}"
    if check_loss:
        losses = [
            m["value"]
            for e in events
            if e["kind"] == "metrics"
            for m in e["payload"]["metrics"]
            if m["name"] == "loss"
        ]
        assert len(losses) == len(truth.losses), (
            f"{len(losses)} losses recorded, {len(truth.losses)} trained on"
        )
        for i, (got, exp) in enumerate(zip(losses, truth.losses, strict=True)):
            _close(got, exp, f"loss {i}")
