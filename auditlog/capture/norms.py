"""Per-parameter L2 norms in a few tensor ops per step, whatever the tensor count.

``torch._foreach_norm`` is one fused kernel on CUDA, but on CPU it runs one op
per tensor, which adds up to a large share of a step for a model of thousands of
small tensors (docs/performance.md). A ``NormPlan`` is worked out once per list of tensor
shapes (cached per optimizer, keyed by parameter identity): CPU tensors that
are small and share shape and dtype are stacked and reduced in one op per
group (such a model: a few groups). Mid-sized CPU float32 and
float64 tensors (up to ``DOT_MAX`` elements) are reduced by a BLAS dot product
through numpy: a torch op's dispatch costs several times a numpy ``dot``'s, and
on the benchmark MLP that makes the step's norms several times cheaper for the
same bytes (docs/performance.md).
A dot that overflows float32 (square sums past 3.4e38) is taken again by torch
in float64: such an overflow is not reported as a non-finite gradient. Large tensors, and every
tensor on another device, still
go through ``_foreach_norm`` (stacking a large tensor copies it for nothing,
the float32 accumulation of a very long dot loses digits, and on CUDA the fused
kernel is already one launch). The results are concatenated into ONE float32
tensor in input order: one conversion to bytes per vector per step, no Python
float per parameter.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from auditlog.capture.byobject import ByObject
from auditlog.capture.torch_compat import foreach_copy_, foreach_norm, foreach_sub_

SMALL = 16384
"""Largest tensor (elements) that is stacked with others of its shape rather than
reduced on its own: stacking copies it, which costs less than an op's dispatch
only while it is small."""

MIN_GROUP = 4
"""Fewest tensors of one shape worth a stacked reduction."""

GROUP_ELEMENTS = 1 << 20
"""Most elements stacked into one temporary (4 MiB of float32): the copy stays small."""

DOT_MAX = 1 << 22
"""Largest CPU float tensor (elements) reduced by numpy's ``dot``: beyond it the op's
dispatch is noise beside the bytes, and torch's accumulation keeps more digits."""

_DOT_DTYPES = (torch.float32, torch.float64)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class NormPlan:
    """How to compute the norms of tensors of given shapes: stacked groups plus the rest.

    ``groups``: lists of positions reduced together (same shape, dtype, CPU);
    ``dots``: positions reduced by numpy's ``dot`` (mid-sized CPU floats);
    ``rest``: positions reduced one by one by ``_foreach_norm``; ``order``: the
    permutation back to input order (None when the concatenation already is).
    """

    __slots__ = (
        "_copies",
        "_group_picks",
        "_tail_pick",
        "dots",
        "groups",
        "order",
        "plain",
        "rest",
        "size",
        "tail",
    )

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        by_kind: dict[tuple[object, ...], list[int]] = {}
        rest: list[int] = []
        self.dots: list[int] = []
        self._copies: list[torch.Tensor] | None = None
        for i, t in enumerate(tensors):
            if t.device.type != "cpu" or not t.is_contiguous():
                rest.append(i)
            elif t.numel() <= SMALL:
                by_kind.setdefault((tuple(t.shape), t.dtype), []).append(i)
            elif (
                t.numel() <= DOT_MAX
                and t.dtype in _DOT_DTYPES
                and type(t) in _PLAIN
                and not (t.is_conj() or t.is_neg())
            ):  # plain tensors only: a subclass's own __torch_function__ decides what it does
                self.dots.append(i)
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
        self.tail = self.dots + rest  # the tensors not stacked, in the order they are reduced
        # Each group's and the tail's positions as one C call (``operator.itemgetter``):
        # a comprehension per group cost ~8 bytecodes per tensor, at every step.
        self._group_picks = [_picker(members) for members in self.groups]
        self._tail_pick = _picker(self.tail) if self.tail else None
        self.size = len(tensors)
        placed = [i for members in self.groups for i in members] + self.dots + rest
        if placed == list(range(self.size)):
            self.order: torch.Tensor | None = None
        else:
            inverse = [0] * self.size
            for position, i in enumerate(placed):
                inverse[i] = position
            self.order = torch.tensor(inverse, dtype=torch.long)
        # Nothing stacked and nothing by dot products, in input order (a small model's
        # few tensors of distinct shapes): ``grad_norms`` takes a shorter path.
        self.plain = not self.groups and not self.dots and self.order is None

    def norms(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """One 1-D float32 tensor: the L2 norm of each tensor, in input order (no sync)."""
        if not tensors:
            return None
        return self._reduce(tensors)

    def grad_norms(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
        """``norms`` of the gradients of the parameters the plan was worked out for, in
        their order (a gradient has its parameter's shape), read by the caller once.

        None when a gradient is absent or not strided: the caller then takes the
        general path (``norms`` of the gradients present). RuntimeError when the
        plan no longer fits (a parameter changed shape in place: the caller works
        out a new plan).
        """
        if not grads:
            return None
        # (ids compared: ``None in grads`` would call Tensor.__eq__)
        if NONE_ID in map(id, grads) or set(map(_LAYOUT, grads)) != _STRIDED:
            return None
        if self.plain:  # every tensor reduced by _foreach_norm: one list, one call, no permutation
            return _stacked_foreach(grads)  # type: ignore[arg-type]
        return self._reduce(grads)  # type: ignore[arg-type]

    def _reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Stack each group, take the others as they are, reduce (``_reduce_parts``)."""
        laid = [torch.stack(pick(tensors)) for pick in self._group_picks]
        tail = [] if self._tail_pick is None else list(self._tail_pick(tensors))
        return self._reduce_parts(laid + tail)

    def copy(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors' values now, laid out as the plan reduces them (for
        ``difference_norms`` later): one stacked copy per group, one per other tensor.

        CPU: into buffers the plan keeps (a fresh allocation per step faults its
        pages in, several times the copy: docs/performance.md) and, for the
        groups, one ``stack`` each where a per-tensor copy costs a dispatch per tensor.
        Other devices: clones, so the caching allocator reuses their memory and
        nothing stays resident between steps.
        """
        rest = [tensors[i] for i in self.tail]
        if any(t.device.type != "cpu" for t in rest):
            return [torch.stack([tensors[i] for i in members]) for members in self.groups] + [
                t.clone() for t in rest
            ]
        buffers = self._copies
        if buffers is None:
            buffers = self._copies = [
                torch.empty(
                    (len(members), *tensors[members[0]].shape), dtype=tensors[members[0]].dtype
                )
                for members in self.groups
            ] + [torch.empty_like(t, memory_format=torch.contiguous_format) for t in rest]
        for buffer, members in zip(buffers, self.groups, strict=False):
            torch.stack([tensors[i] for i in members], out=buffer)
        if rest:
            foreach_copy_(buffers[len(self.groups) :], rest)
        return buffers

    def difference_norms(
        self, before: list[torch.Tensor], tensors: Sequence[torch.Tensor]
    ) -> torch.Tensor | None:
        """Norms of ``before - tensors`` per tensor (``before`` from ``copy``; it is
        overwritten with the difference), in input order."""
        if not tensors:
            return None
        groups = len(self.groups)
        for buffer, members in zip(before, self.groups, strict=False):
            buffer.sub_(torch.stack([tensors[i] for i in members]))
        rest = before[groups:]
        if rest:
            foreach_sub_(rest, [tensors[i] for i in self.tail])
        return self._reduce_parts(before)

    def _reduce_parts(self, parts_in: list[torch.Tensor]) -> torch.Tensor:
        """Norms from the plan's layout (``copy``'s too): one stacked tensor per group,
        then the dot-product tensors, then the others; concatenated in input order."""
        parts: list[torch.Tensor] = []
        groups = len(self.groups)
        for stacked, members in zip(parts_in, self.groups, strict=False):
            stacked = stacked.reshape(len(members), -1)
            if stacked.dtype != torch.float32:
                stacked = stacked.float()
            parts.append(torch.linalg.vector_norm(stacked, dim=1))
        dots = parts_in[groups : groups + len(self.dots)]
        if dots:
            parts.append(_dot_norms(dots))
        rest = parts_in[groups + len(self.dots) :]
        if rest:
            parts.append(_stacked_foreach(rest))
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


_LAYOUT = operator.attrgetter("layout")
_STRIDED = {torch.strided}
NONE_ID = id(None)
"""``id(None)``: a list of tensors is searched for None by ids, as ``None in tensors``
would call ``Tensor.__eq__``."""


def _picker(members: list[int]) -> Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]:
    """The tensors at ``members`` of a sequence, as a tuple, in one C call."""
    pick = operator.itemgetter(*members)
    if len(members) == 1:  # itemgetter of one position gives the item itself
        return lambda tensors: (pick(tensors),)
    return pick


def _dot_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """L2 norms of contiguous CPU float tensors by BLAS dot products (float32 result).

    ``.numpy()`` views the memory (no copy); a tensor that requires grad is
    viewed through ``detach()``. A square sum that is not finite is taken again
    by torch in float64: a NaN or infinity stays one, an overflow of the float32
    dot does not (torch's own float32 norm overflows there too).
    """
    squares = np.empty(len(tensors), dtype=np.float64)
    with np.errstate(
        all="ignore"
    ):  # an overflow is handled below, never a warning in the user's output
        for i, t in enumerate(tensors):
            a = (t.detach() if t.requires_grad else t).numpy().reshape(-1)
            squares[i] = np.dot(a, a)
    norms = np.sqrt(squares)
    if not np.isfinite(squares).all():
        for i in np.flatnonzero(~np.isfinite(squares)).tolist():
            norms[i] = float(torch.linalg.vector_norm(tensors[i].detach(), dtype=torch.float64))
    return torch.from_numpy(norms.astype(np.float32))


def _stacked_foreach(tensors: list[torch.Tensor]) -> torch.Tensor:
    norms = foreach_norm(tensors)
    try:
        out = torch.stack(norms)  # one device: the common case, no per-norm checks
        return out if out.dtype is torch.float32 else out.float()
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
    """``NormPlan`` s kept per caller-chosen key (an optimizer and a purpose, or the
    optimizer itself), each valid for one identity of the parameter list: worked
    out again only when that changes. ``weak``: keyed by objects held weakly (a plan
    and the copies it keeps go with its optimizer)."""

    __slots__ = ("_plans",)

    def __init__(self, weak: bool = False) -> None:
        # (weakly: ``ByObject``, where a ``WeakKeyDictionary`` made a weak reference at
        # every lookup, and a plan is looked up every step)
        self._plans: dict[Any, tuple[object, NormPlan]] | ByObject[tuple[object, NormPlan]] = (
            ByObject() if weak else {}
        )

    def plan(self, key: object, identity: object, tensors: Sequence[torch.Tensor]) -> NormPlan:
        """The plan under ``key`` for ``identity`` (``identity`` stands for the tensors'
        shapes: the parameters' ids, say; a gradient has its parameter's shape),
        worked out from ``tensors`` when there is none that fits."""
        cached = self._plans.get(key)
        if cached is not None and cached[0] == identity and cached[1].size == len(tensors):
            return cached[1]
        plan = NormPlan(tensors)
        self._plans[key] = (identity, plan)
        return plan

    def forget(self, key: object) -> None:
        """Drop the plan under ``key``: it no longer fits (a shape changed in place)."""
        self._plans.pop(key, None)

    def norms(
        self, key: object, identity: object, tensors: Sequence[torch.Tensor]
    ) -> torch.Tensor | None:
        """The norms of ``tensors`` (see ``NormPlan.norms``) with the plan cached under
        ``key``; should a cached plan not fit after all (stacking raises), it is
        worked out again from the tensors themselves."""
        try:
            return self.plan(key, identity, tensors).norms(tensors)
        except RuntimeError:
            self.forget(key)
            return self.plan(key, identity, tensors).norms(tensors)


def norms_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """L2 norm of each tensor, as one 1-D float32 tensor (input order), without a sync
    (a plan worked out for this call: ``PlanCache`` keeps them for repeated lists)."""
    if not tensors:
        return None
    return NormPlan(tensors).norms(tensors)
