"""``NormPlan``: per-parameter norms in a few ops, in input order, whatever the mix of tensors."""

from __future__ import annotations

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
    assert len(plan.groups) >= 3 and all(len(g) * tensors[g[0]].numel() <= max(GROUP_ELEMENTS, 4 * 4096) for g in plan.groups)
    assert norms_of([]) is None


def test_a_cached_plan_that_no_longer_fits_is_worked_out_again() -> None:
    cache = PlanCache()
    first = [torch.ones(8, 8) for _ in range(5)]
    assert torch.equal(cache.norms("k", 1, first), torch.full((5,), 8.0))  # type: ignore[arg-type]
    changed = [torch.ones(8, 8) for _ in range(4)] + [torch.ones(2, 2)]  # same identity claimed, one reshaped
    assert torch.equal(cache.norms("k", 1, changed), torch.tensor([8.0, 8.0, 8.0, 8.0, 2.0]))  # type: ignore[arg-type]
