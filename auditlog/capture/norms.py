"""Per-parameter L2 norms in a few tensor ops per step, whatever the tensor count.

``torch._foreach_norm`` is one fused kernel on CUDA, but on CPU it runs one op
per tensor: ~13 us each, 65 ms a step for a model of 5,000 small tensors
(measured, 1 thread). A ``NormPlan`` is worked out once per list of tensor
shapes (cached per optimizer, keyed by parameter identity): CPU tensors that
are small and share shape and dtype are stacked and reduced in one op per
group (the 5,000 tensors above: 2 groups, ~1 ms); large tensors, and every
tensor on another device, still go through ``_foreach_norm`` (stacking a large
tensor copies it for nothing, and on CUDA the fused kernel is already one
launch). The results are concatenated into ONE float32 tensor in input order:
one conversion to bytes per vector per step, no Python float per parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from auditlog.capture.torch_compat import foreach_norm

SMALL = 16384
"""Largest tensor (elements) that is stacked with others of its shape rather than
reduced on its own: stacking copies it, which costs less than an op's dispatch
(~5-10 us) only while it is small."""

MIN_GROUP = 4
"""Fewest tensors of one shape worth a stacked reduction."""

GROUP_ELEMENTS = 1 << 20
"""Most elements stacked into one temporary (4 MiB of float32): the copy stays small."""


class NormPlan:
    """How to compute the norms of tensors of given shapes: stacked groups plus the rest.

    ``groups``: lists of positions reduced together (same shape, dtype, CPU);
    ``rest``: positions reduced one by one by ``_foreach_norm``; ``order``: the
    permutation back to input order (None when the concatenation already is).
    """

    __slots__ = ("groups", "order", "rest", "size")

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        by_kind: dict[tuple[object, ...], list[int]] = {}
        rest: list[int] = []
        for i, t in enumerate(tensors):
            if t.device.type == "cpu" and t.numel() <= SMALL and t.is_contiguous():
                by_kind.setdefault((tuple(t.shape), t.dtype), []).append(i)
            else:
                rest.append(i)
        self.groups: list[list[int]] = []
        for members in by_kind.values():
            if len(members) >= MIN_GROUP:
                # Bounded copies: at most GROUP_ELEMENTS elements stacked at once.
                per = max(MIN_GROUP, GROUP_ELEMENTS // max(1, tensors[members[0]].numel()))
                self.groups.extend(members[i : i + per] for i in range(0, len(members), per))
            else:
                rest.extend(members)
        rest.sort()
        self.rest = rest
        self.size = len(tensors)
        placed = [i for members in self.groups for i in members] + rest
        if placed == list(range(self.size)):
            self.order: torch.Tensor | None = None
        else:
            inverse = [0] * self.size
            for position, i in enumerate(placed):
                inverse[i] = position
            self.order = torch.tensor(inverse, dtype=torch.long)

    def norms(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """One 1-D float32 tensor: the L2 norm of each tensor, in input order (no sync)."""
        if not tensors:
            return None
        parts: list[torch.Tensor] = []
        for members in self.groups:
            stacked = torch.stack([tensors[i] for i in members]).reshape(len(members), -1)
            if stacked.dtype != torch.float32:
                stacked = stacked.float()
            parts.append(torch.linalg.vector_norm(stacked, dim=1))
        if self.rest:
            parts.append(_stacked_foreach([tensors[i] for i in self.rest]))
        out = parts[0] if len(parts) == 1 else _cat(parts)
        if self.order is not None:
            out = out[self._order_on(out.device)]
        return out

    def _order_on(self, device: torch.device) -> torch.Tensor:
        """The permutation on ``device``, copied there once (a copy per step from
        pageable host memory would make the training thread wait for it)."""
        order = self.order
        assert order is not None
        if order.device != device:
            order = self.order = order.to(device)
        return order


def _stacked_foreach(tensors: list[torch.Tensor]) -> torch.Tensor:
    norms = foreach_norm(tensors)
    try:
        return torch.stack(norms).float()  # one device: the common case, no per-norm checks
    except RuntimeError:  # several devices: gathered on the first (a rare, blocking case)
        device = tensors[0].device
        return torch.stack([n.float().to(device) for n in norms])


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.cat(parts)
    except RuntimeError:  # several devices
        device = parts[0].device
        return torch.cat([p.to(device) for p in parts])


class PlanCache:
    """``NormPlan`` s kept per caller-chosen key (an optimizer and a purpose), each valid
    for one identity of the parameter list: worked out again only when that changes."""

    __slots__ = ("_plans",)

    def __init__(self) -> None:
        self._plans: dict[object, tuple[object, NormPlan]] = {}

    def norms(self, key: object, identity: object, tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """The norms of ``tensors`` (see ``NormPlan.norms``) with the plan cached under ``key``.

        ``identity`` stands for the tensors' shapes (the parameters' ids, say: a
        gradient has its parameter's shape). Should a cached plan not fit after
        all (stacking raises), it is worked out again from the tensors themselves.
        """
        cached = self._plans.get(key)
        if cached is not None and cached[0] == identity and cached[1].size == len(tensors):
            try:
                return cached[1].norms(tensors)
            except RuntimeError:
                pass
        plan = NormPlan(tensors)
        self._plans[key] = (identity, plan)
        return plan.norms(tensors)


def norms_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """L2 norm of each tensor, as one 1-D float32 tensor (input order), without a sync
    (a plan worked out for this call: ``PlanCache`` keeps them for repeated lists)."""
    if not tensors:
        return None
    return NormPlan(tensors).norms(tensors)
