"""The backward() and GradScaler wrappers (capture/backward.py): what they see, and that the
program does not see them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from behaviour_support import run_twice
from torch import nn
from torch.utils.checkpoint import checkpoint

import auditlog


def _losses(store: Path) -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return s.query(
            "select step, name, value, origin from metrics order by seq, position", run="latest"
        )


def _steps(store: Path) -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return [e["payload"] for e in s.run().events(kinds=["optimizer_step"])]


def test_reentrant_checkpointing_counts_one_backward(store: Path) -> None:
    """Reentrant checkpointing calls torch.autograd.backward inside the outer backward: only
    the outer one is the user's (one loss, raw norms of the whole backward), bitwise as plain."""

    def behaviour() -> Any:
        block = nn.Sequential(nn.Linear(5, 5), nn.Tanh())
        head = nn.Linear(5, 1)
        opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            x = torch.randn(4, 5, requires_grad=True)
            loss = head(checkpoint(block, x, use_reentrant=True)).pow(2).mean()
            loss.backward()
            opt.step()
        return [p.detach().clone() for p in [*block.parameters(), *head.parameters()]]

    run_twice(behaviour, store, "audit")
    assert [(r["step"], r["name"], r["origin"]) for r in _losses(store)] == [
        (0, "loss", "backward"),
        (1, "loss", "backward"),
    ]
    assert [p["grads_modified"] for p in _steps(store)] == [False, False]


def test_a_backward_that_is_not_a_loss_records_none_and_a_replaced_gradient_is_seen(
    store: Path,
) -> None:
    with auditlog.record(store):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = model(torch.randn(4, 3))
        torch.autograd.backward([out], [torch.ones_like(out)])  # an explicit gradient: no loss
        raw = [float(p.grad.norm()) for p in model.parameters()]
        model.weight.grad = model.weight.grad * 0.5  # replaced, not changed in place
        opt.step()
        (model(torch.randn(4, 3)).sum() * 1.0).backward(
            create_graph=True
        )  # double-backward capable
        opt.step()
    assert [r["name"] for r in _losses(store)] == ["loss"]  # the second backward's scalar only
    first, second = _steps(store)
    assert first["grads_modified"] is True
    assert first["raw_grad_norm"] == [
        pytest.approx(raw[0], rel=1e-6),
        pytest.approx(raw[1], rel=1e-6),
    ]
    assert first["grad_norm"][0] == pytest.approx(raw[0] * 0.5, rel=1e-6)
    assert second["grads_modified"] is False


def test_wrappers_are_put_back_and_a_wrapper_on_top_is_left_alone(store: Path) -> None:
    original = torch.autograd.backward
    calls: list[int] = []
    try:
        with auditlog.record(store):
            ours = torch.autograd.backward
            assert ours is not original

            def theirs(*args: Any, **kwargs: Any) -> Any:
                calls.append(1)
                return ours(*args, **kwargs)

            torch.autograd.backward = theirs  # other code wraps on top of the recorder
            model = nn.Linear(2, 1)
            model(torch.randn(3, 2)).sum().backward()
        assert torch.autograd.backward is theirs  # left as the other code set it
        model(torch.randn(3, 2)).sum().backward()  # ours, under theirs, now passes through
        assert calls == [1, 1] and model.weight.grad is not None
    finally:
        torch.autograd.backward = original
    try:
        with auditlog.record(store):
            raise RuntimeError("the user's own error")
    except RuntimeError:
        pass
    assert torch.autograd.backward is original
