"""Every recorded number is the one the program used, whatever the step's shape.

Each scenario is real training that writes down its own truth at the moment it
uses a number (``truth_support``); the record must agree step by step under
``minimal``, ``audit`` and ``debug``. Step shapes: the plain loop, a loss
computed by a function, ``step(closure)`` with clipping inside the closure,
LBFGS, gradient accumulation with clipping, a ``GradScaler`` that skips a step
(with ``unscale_`` and clipping), a fused optimizer handed the scaler's scale,
two optimizers, a param group added mid-run, foreach and fused optimizers,
``ZeroRedundancyOptimizer`` (an optimizer stepping another inside its step).
The HF Trainer and Lightning run unmodified in ``test_ground_truth_trainers``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from truth_support import DEVICE, Truth, compare, record

POLICIES = ("minimal", "audit", "debug")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(DEVICE)


def _batch(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 6).to(DEVICE), torch.randint(0, 3, (n,)).to(DEVICE)


def plain_loop(truth: Truth) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    truth.optimizers.append(opt)
    criterion = nn.CrossEntropyLoss()
    for _ in range(4):
        x, y = _batch()
        opt.zero_grad()
        loss = criterion(model(x), y)
        truth.losses.append(loss.item())
        loss.backward()
        truth.after_backward()
        truth.consumed()
        opt.step()
        truth.stepped()


def function_loss(truth: Truth) -> None:
    """``F.cross_entropy``: no loss module, the loss is the scalar backward starts from."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    truth.optimizers.append(opt)
    for _ in range(4):
        x, y = _batch()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y) + 0.01 * sum(p.pow(2).sum() for p in model.parameters())
        truth.losses.append(loss.item())
        loss.backward()
        truth.after_backward()
        truth.consumed()
        opt.step()
        truth.stepped()


def closure_with_clipping(truth: Truth) -> None:
    """``step(closure)``: the gradients exist only once step() ran the closure."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    truth.optimizers.append(opt)
    x, y = _batch()
    for _ in range(4):

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            truth.losses.append(loss.item())
            loss.backward()
            truth.after_backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            truth.consumed()
            return loss

        opt.step(closure)
        truth.stepped()


def lbfgs(truth: Truth) -> None:
    """LBFGS evaluates the closure several times a step: the last evaluation is recorded."""
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    truth.optimizers.append(opt)
    x, y = _batch()
    criterion = nn.CrossEntropyLoss()
    for _ in range(3):

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = criterion(model(x), y)
            truth.losses.append(loss.item())
            loss.backward()
            truth.after_backward()
            truth.consumed()
            return loss

        opt.step(closure)
        truth.stepped()


def accumulation_with_clipping(truth: Truth) -> None:
    """Four micro-batches a step, the loss divided for accumulation, clipped before the step."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    truth.optimizers.append(opt)
    criterion = nn.CrossEntropyLoss()
    for _ in range(3):
        opt.zero_grad()
        for _ in range(4):
            x, y = _batch(6)
            loss = criterion(model(x), y)
            truth.losses.append(loss.item())
            (loss / 4).backward()
            truth.after_backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        truth.consumed()
        opt.step()
        truth.stepped()


def grad_scaler(truth: Truth) -> None:
    """A GradScaler (on DEVICE): ``unscale_``, clipping, and a step it skips on an inf gradient."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    truth.optimizers.append(opt)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=256.0)
    for i in range(5):
        x, y = _batch()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        truth.losses.append(loss.item())
        scaler.scale(loss).backward()
        if i == 2:
            with torch.no_grad():
                next(model.parameters()).grad[0, 0] = float("inf")  # an overflow
        truth.after_backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)  # finite gradients stay as they are
        truth.consumed()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale:
            truth.skip()
        else:
            truth.stepped()


def fused_with_scaler(truth: Truth) -> None:
    """A fused optimizer is handed the scaler's scale and unscales inside its kernel."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    truth.optimizers.append(opt)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=1024.0)
    for _ in range(3):
        x, y = _batch()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        truth.losses.append(loss.item())
        scaler.scale(loss).backward()
        truth.after_backward()
        params = truth.params(0)
        truth.consumed()
        truth.steps[-1].used = [float(p.grad.detach().double().norm()) / 1024.0 for p in params]  # type: ignore[union-attr]
        scaler.step(opt)
        scaler.update()
        truth.stepped()


def two_optimizers(truth: Truth) -> None:
    """Two models, two optimizers, one backward each (a GAN's shape)."""
    a, b = _model(), nn.Linear(3, 1).to(DEVICE)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(b.parameters(), lr=0.01)
    truth.optimizers.extend([opt_a, opt_b])
    for _ in range(3):
        x, _ = _batch()
        opt_a.zero_grad()
        opt_b.zero_grad()
        loss_b = b(a(x).detach()).pow(2).mean()
        truth.losses.append(loss_b.item())
        loss_b.backward()
        truth.after_backward(1)
        truth.consumed(1)
        opt_b.step()
        truth.stepped(1)
        loss_a = -b(a(x)).mean()
        truth.losses.append(loss_a.item())
        opt_b.zero_grad()
        loss_a.backward()
        truth.after_backward(0)
        truth.consumed(0)
        opt_a.step()
        truth.stepped(0)


def group_added(truth: Truth) -> None:
    """A param group added mid-run (unfreezing a head)."""
    body, head = _model(), nn.Linear(3, 3).to(DEVICE)
    opt = torch.optim.SGD(body.parameters(), lr=0.1)
    truth.optimizers.append(opt)
    for i in range(4):
        if i == 2:
            opt.add_param_group({"params": head.parameters(), "lr": 0.01})
        x, y = _batch()
        opt.zero_grad()
        head.zero_grad()
        loss = F.cross_entropy(head(body(x)), y)
        truth.losses.append(loss.item())
        loss.backward()
        truth.after_backward()
        truth.consumed()
        opt.step()
        truth.stepped()


def foreach_and_fused(truth: Truth) -> None:
    model = _model()
    opts = [
        torch.optim.AdamW(model[0].parameters(), lr=0.01, foreach=True),
        torch.optim.AdamW(model[2].parameters(), lr=0.01, fused=True),
    ]
    truth.optimizers.extend(opts)
    for _ in range(3):
        x, y = _batch()
        for o in opts:
            o.zero_grad()
        loss = F.cross_entropy(model(x), y)
        truth.losses.append(loss.item())
        loss.backward()
        for i, o in enumerate(opts):
            truth.after_backward(i)
            truth.consumed(i)
            o.step()
            truth.stepped(i)


def zero_redundancy(truth: Truth) -> None:
    """ZeroRedundancyOptimizer steps a local optimizer inside its own step: one step each."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    with tempfile.TemporaryDirectory() as where:
        dist.init_process_group("gloo", init_method=f"file://{where}/init", rank=0, world_size=1)
        try:
            model = _model()
            opt = ZeroRedundancyOptimizer(
                model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1
            )
            truth.optimizers.append(opt)
            for _ in range(3):
                x, y = _batch()
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                truth.losses.append(loss.item())
                loss.backward()
                truth.after_backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                truth.consumed()
                opt.step()
                truth.stepped()
        finally:
            dist.destroy_process_group()


SCENARIOS = {
    "plain": plain_loop,
    "function_loss": function_loss,
    "closure_clipped": closure_with_clipping,
    "lbfgs": lbfgs,
    "accumulation_clipped": accumulation_with_clipping,
    "grad_scaler": grad_scaler,
    "fused_scaler": fused_with_scaler,
    "two_optimizers": two_optimizers,
    "group_added": group_added,
    "foreach_fused": foreach_and_fused,
    "zero_redundancy": zero_redundancy,
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_record_agrees_with_the_program(tmp_path: Path, name: str, policy: str) -> None:
    truth, run_id = record(tmp_path / "store", policy, SCENARIOS[name])
    # LBFGS: each closure evaluation is a backward; the record's loss is each one's.
    compare(tmp_path / "store", run_id, truth)
