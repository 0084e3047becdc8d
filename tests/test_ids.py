"""Tensor ids hold no reference to tensors, yet stay right when id() values are reused."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import auditlog
from auditlog.capture.ids import ObjectIds, TensorIds


def test_a_tensor_keeps_its_id_and_gets_no_weak_reference() -> None:
    ids = TensorIds()
    lin = nn.Linear(2, 2)
    number, new = ids.get(lin.weight, lin, "parameter", "weight")
    assert new
    assert ids.get(lin.weight, lin, "parameter", "weight") == (number, False)
    assert ids.lookup(lin.weight) == number
    assert ids.object(number) is lin.weight
    assert weakref.getweakrefcount(lin.weight) == 0


def test_a_swapped_parameter_keeps_its_id() -> None:
    ids = TensorIds()
    lin = nn.Linear(2, 2)
    weight = lin.weight
    number, _ = ids.get(weight, lin, "parameter", "weight")
    torch.utils.swap_tensors(weight, nn.Parameter(torch.zeros(2, 2, dtype=torch.float64)))
    assert lin.weight is weight and weight.dtype == torch.float64
    assert ids.lookup(weight) == number


def test_an_address_reused_after_death_gets_a_new_id() -> None:
    """CPython reuses the memory of a dead object: the new tensor at the same id()
    must not inherit the dead one's id (registered the way torch's hook sees it:
    before the module's dict holds it)."""
    ids = TensorIds()
    lin = nn.Linear(2, 2)
    numbers: set[int] = set()
    reused = 0
    for _ in range(500):  # until CPython has reused a dead tensor's address a few times
        if reused >= 3:
            break
        param = nn.Parameter(torch.zeros(1))
        address = id(param)
        number, new = ids.get(param, lin, "parameter", "extra")
        lin.register_parameter("extra", param)
        assert new and number not in numbers
        numbers.add(number)
        del lin.extra, param  # removed from the module without a hook, then dead
        gc.collect()
        # Several live candidates, so one of them almost surely lands on the freed
        # address (a single allocation often does not: torch allocates in between).
        candidates = [torch.zeros(1) for _ in range(10)] + [
            nn.Parameter(torch.zeros(1)) for _ in range(10)
        ]
        reused += any(id(c) == address for c in candidates)
        assert all(ids.lookup(c) is None for c in candidates)
    assert reused, "CPython never reused an address: the test proves nothing"


def test_tied_weight_has_one_id_in_two_places() -> None:
    ids = TensorIds()
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    number, _ = ids.get(a.weight, a, "parameter", "weight")
    b.weight = a.weight
    assert ids.get(b.weight, b, "parameter", "weight") == (number, False)
    del a
    gc.collect()
    assert ids.lookup(b.weight) == number  # the other place still holds it


def test_a_tensor_only_an_optimizer_holds_is_known_through_the_optimizer() -> None:
    ids = TensorIds()
    bare = [torch.zeros(2, requires_grad=True) for _ in range(3)]
    opt = torch.optim.SGD(bare, lr=0.1)
    ids.note_optimizer(opt, bare)
    numbers = [ids.get(t, opt)[0] for t in bare]
    assert [ids.lookup(t) for t in bare] == numbers
    assert ids.object(numbers[1]) is bare[1]
    del opt
    gc.collect()
    assert ids.lookup(bare[0]) is None  # nobody recorded holds it any more


def test_forgotten_entries_are_purged() -> None:
    ids = TensorIds()
    keep = nn.Linear(2, 2)
    kept, _ = ids.get(keep.weight, keep, "parameter", "weight")
    for _ in range(5000):
        lin = nn.Linear(1, 1)
        ids.get(lin.weight, lin, "parameter", "weight")
    del lin
    gc.collect()
    assert len(ids) < 5000
    assert ids.lookup(keep.weight) == kept


def test_modules_are_held_weakly() -> None:
    ids = ObjectIds()
    lin = nn.Linear(1, 1)
    number, _ = ids.get(lin)
    assert ids.object(number) is lin
    ref = weakref.ref(lin)
    del lin
    gc.collect()
    assert ref() is None and ids.object(number) is None


def test_a_module_noted_at_construction_has_no_id_until_first_seen_and_is_forgotten() -> None:
    ids = ObjectIds()
    relu = nn.ReLU()
    site = (test_modules_are_held_weakly.__code__, 7)
    ids.note(relu, site)
    assert ids.lookup(relu) is None and len(ids) == 1  # noted: no id given out yet
    ids.note(relu, (site[0], 8))  # a second __init__ on a live module keeps the first note
    first, _ = ids.get(nn.Linear(1, 1))
    ref, new = ids.get_ref(relu)
    assert new and ref.number == first + 1 and (ref.code, ref.line, ref.attached) == (*site, False)
    assert ids.get_ref(relu) == (ref, False) and ids.object(ref.number) is relu
    noted_only = nn.ReLU()
    ids.note(noted_only, site)
    del relu, noted_only, ref
    gc.collect()
    assert len(ids) == 0


def _weakref_counts(model: nn.Module) -> list[int]:
    return [weakref.getweakrefcount(t) for t in [*model.parameters(), *model.buffers()]]


@pytest.mark.parametrize("policy", ["debug", "audit"])
def test_recorded_model_has_no_weak_references_on_parameters_or_buffers(
    store: Path, policy: str
) -> None:
    """Acceptance: weakref.getweakrefcount(p) == 0 for every parameter and buffer,
    during construction, training, snapshots and after the recording."""
    with auditlog.record(store, policy=policy, backward="grad", snapshot_every=1) as run:
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4))
        model[3].weight = model[0].weight  # tied
        assert set(_weakref_counts(model)) == {0}
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(3):
            out = model(torch.randn(8, 4))
            assert weakref.getweakrefcount(out) == 0  # activations too
            assert set(_weakref_counts(model)) == {0}
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        run.snapshot(model)
        assert set(_weakref_counts(model)) == {0}
    assert set(_weakref_counts(model)) == {0}
    with auditlog.open(store) as s:
        kinds = [e["kind"] for e in s.run().events()]
    assert kinds.count("snapshot_taken") >= 4 and "recorder_error" not in kinds


def test_no_recorder_hook_stays_on_a_parameter_a_module_returns(store: Path) -> None:
    """A module may return a parameter (a learned positional embedding): the
    recorder's gradient hook on it leaves at the step's end."""

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.ones(3))

        def forward(self) -> torch.Tensor:
            return self.table

    with auditlog.record(store, policy="debug"):
        model = Positions()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            (model() * 2).sum().backward()
            opt.step()
            assert not model.table._backward_hooks
    with auditlog.open(store) as s:
        calls = list(s.run().module_calls("backward"))
    assert len(calls) == 3  # each step's gradient was still seen


def test_an_optimizer_step_that_raises_keeps_no_parameter_alive(store: Path) -> None:
    """The step's pre hook ran, its post hook never does: nothing of the model stays."""
    with auditlog.record(store):
        model = nn.Linear(3, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def refuse(optimizer: Any, args: Any, kwargs: Any) -> None:
            raise RuntimeError("step refused")

        opt.register_step_pre_hook(refuse)  # runs after the recorder's global pre hook
        model(torch.randn(2, 3)).sum().backward()
        with pytest.raises(RuntimeError, match="step refused"):
            opt.step()
        ref = weakref.ref(model.weight)
        del model, opt
        gc.collect()
        assert ref() is None


def test_a_tensor_two_modules_return_is_measured_once_without_a_reference(store: Path) -> None:
    """The container's call finds the child's gradient hook on the very tensor: it
    reuses the statistics and adds itself to that hook, holding nothing."""
    with auditlog.record(store, policy="debug") as run:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        out = model(torch.randn(3, 4))
        recorder = run.recorder
        assert recorder is not None
        entries = [
            entry
            for _, direction, entry, _ in recorder.activity._activity
            if direction == "forward"
        ]
        assert len(entries) == 3  # Linear, Linear, Sequential
        assert entries[2]["outputs"][0] is entries[1]["outputs"][0]
        assert entries[1]["outputs"][0] is not entries[0]["outputs"][0]
        hooks = list(out._backward_hooks.values())
        assert len(hooks) == 1 and hooks[0].modules == [
            entries[1]["module_id"],
            entries[2]["module_id"],
        ]
        assert weakref.getweakrefcount(out) == 0
        out.sum().backward()
