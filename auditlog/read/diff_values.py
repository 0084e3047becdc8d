"""Where two runs' stored values first differ (``auditlog diff --values``).

The first optimizer step, among the steps both runs snapshotted, and the first
tensor in ``state_dict`` order at that step, whose stored values differ
(bitwise, or beyond ``atol``/``rtol``). Content hashes decide equality without
reading a file; only differing tensors are loaded (and found equal after all
when their bytes are: one content under two content hash versions). Tensors
are matched by label after the renames the construction diff finds
(``auditlog.read.diff``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from auditlog.read.diff import Progress, RunFacts, jsonable, module_items, run_facts
from auditlog.read.diff_renames import find_renames, renamed_label
from auditlog.read.run import Run, pick_snapshot
from auditlog.store.blobs import BlobInfo, SnapshotStore
from auditlog.store.eventstore import EventStore


@dataclass
class TensorSide:
    """One side of a differing tensor: what it was and its statistics."""

    name: str
    sha256: str
    dtype: str
    shape: list[int]
    norm: float | None
    mean: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "dtype": self.dtype,
            "shape": self.shape,
            "norm": jsonable(self.norm),
            "mean": jsonable(self.mean),
        }


@dataclass
class Divergence:
    """The first tensor (at the first compared step) whose values differ."""

    step: int
    tensor: str
    a: TensorSide
    b: TensorSide
    max_abs_diff: float | None
    reason: str  # values | shape | dtype

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tensor": self.tensor,
            "reason": self.reason,
            "max_abs_diff": jsonable(self.max_abs_diff),
            "a": self.a.as_dict(),
            "b": self.b.as_dict(),
        }


@dataclass
class ValuesDiff:
    """``diff --values``: which steps were compared and the first divergence, if any."""

    mode: str  # bitwise | tolerance
    atol: float
    rtol: float
    steps_compared: list[int]
    steps_only_a: list[int]
    steps_only_b: list[int]
    tensors_only_a: list[str]
    tensors_only_b: list[str]
    compared: int
    equal_hashes: int
    first: Divergence | None

    @property
    def identical(self) -> bool:
        return self.first is None

    def as_dict(self) -> dict[str, Any]:
        """The ``values`` key of ``diff --values --format json`` (documented in the README)."""
        return {
            "mode": self.mode,
            "atol": self.atol,
            "rtol": self.rtol,
            "steps_compared": self.steps_compared,
            "steps_only_in_a": self.steps_only_a,
            "steps_only_in_b": self.steps_only_b,
            "tensors_only_in_a": self.tensors_only_a,
            "tensors_only_in_b": self.tensors_only_b,
            "tensors_compared": self.compared,
            "equal_by_hash": self.equal_hashes,
            "identical": self.identical,
            "first_divergence": self.first.as_dict() if self.first is not None else None,
        }


@dataclass
class _Values:
    """One run's snapshotted values: for each recorded step, tensor label -> content hash."""

    order: list[str]  # labels in the main root's state_dict order (tied tensors once)
    by_step: dict[int, dict[str, str]]


def _values(store: EventStore, run_id: str, facts: RunFacts) -> _Values:
    """Which content each tensor of the main model had at every step the run snapshotted.

    A step counts as recorded when every tensor of the model's state_dict has a
    snapshot for it, picked by the same rule as ``auditlog restore --step``
    (``reader.pick_snapshot``), so "step N" means the same here as there.
    """
    state = facts.state
    try:
        root = state.main_root()
    except KeyError:
        return _Values([], {})
    order: list[tuple[str, int]] = []
    seen: set[int] = set()
    for _key, tensor_id in state.state_dict_keys(root):
        if tensor_id in seen or tensor_id not in facts.labels.tensors:
            continue
        seen.add(tensor_id)
        order.append((facts.labels.tensors[tensor_id].label, tensor_id))
    steps = store.step_seqs(run_id, 0)
    boundary_zero = Run(store, run_id, stream=0).boundary(step=0)  # diff compares stream 0 (rank 0)
    candidates = sorted({h[0] for _, tid in order for h in state.tensors[tid].history})
    by_step: dict[int, dict[str, str]] = {}
    for step in candidates:
        end = boundary_zero if step == 0 else steps.get(step)
        if end is None:  # a snapshot dated to a step with no optimizer_step event (run end)
            end = state.last_seq
        picked: dict[str, str] = {}
        for label, tensor_id in order:
            sha = pick_snapshot(state.tensors[tensor_id].history, step, end, steps.get(step + 1))
            if sha is None:
                break
            picked[label] = sha
        else:
            by_step[step] = picked
    return _Values([label for label, _ in order], by_step)


def _as_float64(tensor: torch.Tensor) -> torch.Tensor:
    """A float64 copy for statistics and tolerances (complex as its real/imag pairs)."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.to(torch.float64)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    )


def _side_stats(name: str, blob: BlobInfo, tensor: torch.Tensor | None) -> TensorSide:
    norm = mean = None
    if tensor is not None and tensor.numel():
        values = _as_float64(tensor)
        norm, mean = float(values.norm()), float(values.mean())
    return TensorSide(name, blob.sha256, blob.dtype, list(blob.shape), norm, mean)


def first_divergence(
    store: EventStore,
    run_a: str,
    run_b: str,
    atol: float | None = None,
    rtol: float | None = None,
    progress: Progress | None = None,
) -> ValuesDiff:
    """The first step, and the first tensor in state_dict order, where the values of two runs differ.

    Only steps both runs snapshotted are compared. Tensors are matched by label
    after the renames the construction diff finds. Equal content hashes are
    equal values and are never read. Without tolerances a differing hash is a
    difference (bitwise); with ``atol``/``rtol`` both values are loaded and
    compared as ``torch.allclose`` does (``|a - b| <= atol + rtol * |b|``).
    """
    tolerant = atol is not None or rtol is not None
    atol_f, rtol_f = float(atol or 0.0), float(rtol or 0.0)
    facts_a = run_facts(store, run_a, lambda _n: None)
    facts_b = run_facts(store, run_b, lambda _n: None)
    renames = find_renames(facts_a, facts_b, module_items(facts_a), module_items(facts_b))
    values_a, values_b = _values(store, run_a, facts_a), _values(store, run_b, facts_b)
    common = sorted(set(values_a.by_step) & set(values_b.by_step))
    matched = [(label, renamed_label(label, renames)) for label in values_a.order]
    names_b = set(values_b.order)
    pairs = [(a, b) for a, b in matched if b in names_b]
    paired_b = {b for _, b in pairs}
    result = ValuesDiff(
        mode="tolerance" if tolerant else "bitwise",
        atol=atol_f,
        rtol=rtol_f,
        steps_compared=common,
        steps_only_a=sorted(set(values_a.by_step) - set(values_b.by_step)),
        steps_only_b=sorted(set(values_b.by_step) - set(values_a.by_step)),
        tensors_only_a=[a for a, b in matched if b not in names_b],
        tensors_only_b=[b for b in values_b.order if b not in paired_b],
        compared=0,
        equal_hashes=0,
        first=None,
    )
    snapshots = SnapshotStore(store.location.snapshots)
    total, done = len(common) * len(pairs), 0
    for step in common:
        hashes_a, hashes_b = values_a.by_step[step], values_b.by_step[step]
        for name_a, name_b in pairs:
            done += 1
            if progress is not None:
                progress(done, total)
            result.compared += 1
            sha_a, sha_b = hashes_a[name_a], hashes_b[name_b]
            if sha_a == sha_b:
                result.equal_hashes += 1
                continue
            found = _compare(
                snapshots, store, step, name_a, name_b, sha_a, sha_b, tolerant, atol_f, rtol_f
            )
            if found is not None:
                result.first = found
                if progress is not None:
                    progress(total, total)
                return result
    return result


def _compare(
    snapshots: SnapshotStore,
    store: EventStore,
    step: int,
    name_a: str,
    name_b: str,
    sha_a: str,
    sha_b: str,
    tolerant: bool,
    atol: float,
    rtol: float,
) -> Divergence | None:
    """Two different contents of one tensor: a ``Divergence``, or None when within tolerance."""
    # Read back and checked against the chained hashes (IntegrityError naming tensor and file).
    tensor_a = snapshots.read_verified(sha_a, f"{name_a} at step {step} of run A")
    tensor_b = snapshots.read_verified(sha_b, f"{name_b} at step {step} of run B")
    blob_a, blob_b = snapshots.describe(sha_a), snapshots.describe(sha_b)
    reason = "values"
    if blob_a.shape != blob_b.shape:
        reason = "shape"
    elif blob_a.dtype != blob_b.dtype:
        reason = "dtype"
    max_abs: float | None = None
    if reason == "values":
        if _same_bits(tensor_a, tensor_b):
            return None  # one content named under two hash versions (a run recorded before v2)
        wide_a, wide_b = _as_float64(tensor_a), _as_float64(tensor_b)
        if tolerant and torch.allclose(wide_a, wide_b, rtol=rtol, atol=atol):
            return None
        max_abs = float((wide_a - wide_b).abs().max()) if wide_a.numel() else 0.0
    return Divergence(
        step=step,
        tensor=name_b,
        a=_side_stats(name_a, blob_a, tensor_a),
        b=_side_stats(name_b, blob_b, tensor_b),
        max_abs_diff=max_abs,
        reason=reason,
    )
