"""``NormPlan``: per-parameter norms in a few ops, in input order, whatever the mix of tensors."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from auditlog.capture.norms import GROUP_ELEMENTS, NormPlan, PlanCache, norms_of


def mixed() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return (
        [torch.randn(8, 8) for _ in range(10)]
        + [torch.randn(300, 300)]  # large: reduced on its own
        + [torch.randn(5).half() for _ in range(6)]  # low precision: reduced in float32
        + [torch.randn(8, 8).t()]  # not contiguous
        + [torch.randn(3)] * 2  # a group too small to stack
        + [torch.full((4,), float("nan")), torch.full((4,), float("inf"))] * 2
        + [torch.randn(4096) for _ in range(600)]  # more than one stacked group
    )


def test_norms_in_input_order_as_one_float32_tensor() -> None:
    tensors = mixed()
    got = norms_of(tensors)
    assert got is not None and got.dtype == torch.float32 and got.shape == (len(tensors),)
    want = torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])
    assert torch.allclose(got, want, rtol=1e-6, equal_nan=True)
    plan = NormPlan(tensors)
    assert len(plan.groups) >= 3 and all(
        len(g) * tensors[g[0]].numel() <= max(GROUP_ELEMENTS, 4 * 4096) for g in plan.groups
    )
    assert norms_of([]) is None


def test_a_cached_plan_that_no_longer_fits_is_worked_out_again() -> None:
    cache = PlanCache()
    first = [torch.ones(8, 8) for _ in range(5)]
    assert torch.equal(cache.norms("k", 1, first), torch.full((5,), 8.0))  # type: ignore[arg-type]
    changed = [torch.ones(8, 8) for _ in range(4)] + [
        torch.ones(2, 2)
    ]  # same identity claimed, one reshaped
    assert torch.equal(cache.norms("k", 1, changed), torch.tensor([8.0, 8.0, 8.0, 8.0, 2.0]))  # type: ignore[arg-type]


def test_mid_sized_cpu_floats_by_dot_products_keep_nan_inf_and_survive_overflow() -> None:
    torch.manual_seed(1)
    big = torch.randn(300, 300)
    huge = torch.full((20000,), 3e19)  # each square overflows float32: the norm does not
    nan = torch.randn(20000)
    nan[7] = float("nan")
    inf = torch.randn(20000, dtype=torch.float64)
    inf[3] = float("inf")
    needs_grad = torch.randn(20000, requires_grad=True)
    tensors = [big, huge, nan, inf, needs_grad, torch.randn(20000).half()[::2]]
    plan = NormPlan(tensors)
    assert plan.dots == [0, 1, 2, 3, 4] and plan.rest == [5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflow is ours to handle, not the user's to read
        got = plan.norms(tensors)
    assert got is not None
    want = torch.stack([torch.linalg.vector_norm(t.detach().double()).float() for t in tensors[:5]])
    assert torch.allclose(got[:5], want, rtol=1e-5, equal_nan=True)
    got = got[:5]
    assert torch.allclose(got, want, rtol=1e-5, equal_nan=True)
    assert torch.isfinite(got[1]) and float(got[1]) == pytest.approx(3e19 * 20000**0.5, rel=1e-5)
    assert torch.isnan(got[2]) and torch.isinf(got[3])


def test_copies_and_differences_follow_the_plan_layout_on_reused_buffers() -> None:
    tensors = mixed()
    plan = NormPlan(tensors)
    before = plan.copy(tensors)
    again = plan.copy(tensors)
    assert all(a is b for a, b in zip(before, again, strict=True))  # the plan's buffers, reused
    after = [t + 0.5 for t in tensors]
    got = plan.difference_norms(before, after)
    want = torch.stack(
        [torch.linalg.vector_norm((t - a).float()) for t, a in zip(tensors, after, strict=True)]
    )
    assert got is not None and torch.allclose(got, want, rtol=1e-5, equal_nan=True)


def test_gradient_norms_read_from_the_parameters_or_none_for_the_general_path() -> None:
    params = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(6)] + [
        torch.nn.Parameter(torch.randn(300, 300))
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    plan = NormPlan(params)
    got = plan.grad_norms([p.grad for p in params])
    want = torch.stack([torch.linalg.vector_norm(p.grad) for p in params])  # type: ignore[arg-type]
    assert got is not None and torch.allclose(got, want, rtol=1e-5)
    params[2].grad = None
    assert plan.grad_norms([p.grad for p in params]) is None
    params[2].grad = torch.randn(8, 8)
    params[6].grad = None
    assert plan.grad_norms([p.grad for p in params]) is None
    params[6].grad = torch.randn(300, 300).to_sparse()
    assert plan.grad_norms([p.grad for p in params]) is None
    params[6].grad = torch.randn(300, 300)
    params[0].data = torch.randn(3, 3)  # changed shape in place: the plan no longer fits
    params[0].grad = torch.randn(3, 3)
    with pytest.raises(RuntimeError):
        plan.grad_norms([p.grad for p in params])


def test_a_small_model_plan_reads_gradients_in_one_call_or_none() -> None:
    """A few small tensors of distinct shapes: nothing stacked, one ``_foreach_norm``."""
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((16, 4), (4,), (1, 4), (1,))]
    for p in params:
        p.grad = torch.randn_like(p)
    plan = NormPlan(params)
    assert plan.plain
    got = plan.grad_norms([p.grad for p in params])
    want = torch.stack([torch.linalg.vector_norm(p.grad) for p in params])  # type: ignore[arg-type]
    assert got is not None and torch.equal(got, want)
    params[3].grad = None
    assert plan.grad_norms([p.grad for p in params]) is None
    params[3].grad = torch.randn(1)
    params[0].grad = torch.randn(16, 4).to_sparse()
    assert plan.grad_norms([p.grad for p in params]) is None


def test_a_parameter_reshaped_in_place_gets_a_new_plan_and_exact_norms(store: Path) -> None:
    """``p.data = ...`` keeps the object (the plan's identity) but not its shape: the
    step's norms come out right, from a plan worked out again."""
    import auditlog

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(16)) for _ in range(6)]
    expected: list[list[float]] = []
    with auditlog.record(store, policy="minimal"):
        opt = torch.optim.SGD(params, lr=0.1)
        for step in range(4):
            if step == 2:
                params[1].data = torch.randn(24)  # same object, new shape
            opt.zero_grad()
            sum((p * p).sum() for p in params).backward()  # type: ignore[union-attr]
            expected.append([float(p.grad.norm()) for p in params])  # type: ignore[union-attr]
            opt.step()
    with auditlog.open(store) as s:
        steps = [e["payload"]["grad_norm"] for e in s.run().events(kinds=["optimizer_step"])]
    assert len(steps) == 4
    for got, want in zip(steps, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-5)


def test_tensor_subclasses_keep_torch_reductions() -> None:
    class Tagged(torch.Tensor):
        pass

    plain = torch.randn(20000)
    tagged = plain.clone().as_subclass(Tagged)
    plan = NormPlan([plain, tagged, torch.nn.Parameter(plain.clone())])
    assert plan.dots == [0, 2] and plan.rest == [1]
    got = plan.norms([plain, tagged, plain])
    assert got is not None and torch.allclose(
        got, torch.linalg.vector_norm(plain).repeat(3), rtol=1e-5
    )
