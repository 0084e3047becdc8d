"""Parameter swapping (torch.utils.swap_tensors) works under recording, and the record shows it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import invoke, run_auditlog
from torch import nn

import auditlog


@pytest.fixture
def swapping() -> Iterator[None]:
    """torch.__future__.set_swap_module_params_on_conversion(True), restored after."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_load_state_dict_and_to_float64_swap_under_recording(store: Path, swapping: None) -> None:
    with auditlog.record(store, policy="debug") as run:
        torch.manual_seed(0)
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        weight = model[0].weight
        other = _model()
        model.load_state_dict(other.state_dict())  # swaps every parameter
        assert model[0].weight is weight and torch.equal(weight, other[0].weight)
        run.snapshot(model, tag="loaded")
        model.to(torch.float64)  # swaps again
        assert model[0].weight is weight and weight.dtype == torch.float64
        model(torch.randn(8, 4, dtype=torch.float64)).sum().backward()
        opt.step()  # the optimizer still holds the same (swapped) objects
        run.snapshot(model, tag="float64")
        final = {k: v.clone() for k, v in model.state_dict().items()}
    with auditlog.open(store) as s:
        recorded = s.run()
        events = list(recorded.events())
        assert recorded.verify().ok
        state = recorded.model_state()
        rebuilt = recorded.state_dict()
    kinds = [e["kind"] for e in events]
    assert "recorder_error" not in kinds
    registered = {
        (e["module_id"], e["payload"]["name"]): e["tensor_id"]
        for e in events
        if e["kind"] == "parameter_registered"
    }
    steps = [e for e in events if e["kind"] == "optimizer_step"]
    # a swap keeps the tensor id: the same Parameter object, at the same place
    assert steps[0]["payload"]["tensor_ids"] == steps[1]["payload"]["tensor_ids"]
    changed = [
        e
        for e in events
        if e["kind"] == "structure_changed" and e["payload"]["change"] == "tensor_changed"
    ]
    assert {e["tensor_id"] for e in changed} >= set(steps[0]["payload"]["tensor_ids"])
    assert all(e["payload"]["after"] == {"dtype": "float64"} for e in changed)
    weight_id = steps[0]["payload"]["tensor_ids"][0]
    assert weight_id in registered.values()
    assert state.tensors[weight_id].dtype == "float64"
    loaded = next(
        e for e in events if e["kind"] == "snapshot_taken" and e["payload"]["tag"] == "loaded"
    )
    hashes = {t["tensor_id"]: t["sha256"] for t in loaded["payload"]["snapshot"]["tensors"]}
    assert hashes[weight_id] == auditlog.tensor_hash(other[0].weight.detach())
    assert rebuilt.keys() == final.keys()
    for key, value in final.items():
        assert rebuilt[key].dtype == value.dtype and torch.equal(rebuilt[key], value), key


def test_parametrization_registration_swaps_under_recording(store: Path, swapping: None) -> None:
    """register_parametrization with a right_inverse writes the original through
    swap_tensors when swapping is on (orthogonal does)."""
    with auditlog.record(store, policy="debug"):
        torch.manual_seed(0)
        lin = nn.Linear(3, 3)
        original = lin.weight
        nn.utils.parametrizations.orthogonal(lin)
        assert lin.parametrizations.weight.original is original
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        lin(torch.randn(2, 3)).sum().backward()
        opt.step()
        q = lin.weight.detach()
    assert torch.allclose(q @ q.T, torch.eye(3), atol=1e-5)
    with auditlog.open(store) as s:
        kinds = [e["kind"] for e in s.run().events()]
    assert "recorder_error" not in kinds


SWAP_SCRIPT = textwrap.dedent(
    """
    import hashlib, weakref
    import torch
    from torch import nn

    torch.__future__.set_swap_module_params_on_conversion(True)
    torch.manual_seed(0)

    def build():
        return nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 3))

    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(5, 6)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    weight = model[0].weight
    model.load_state_dict(build().state_dict())
    model.to(torch.float64)
    assert model[0].weight is weight
    opt = torch.optim.Adam(model.parameters(), lr=0.01)  # Adam's state would stay float32
    for _ in range(2):
        model(torch.randn(5, 6, dtype=torch.float64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        digest.update(key.encode() + str(value.dtype).encode() + value.numpy().tobytes())
    print("dtypes", sorted({str(p.dtype) for p in model.parameters()}))
    print("weakrefs", sum(weakref.getweakrefcount(t) for t in [*model.parameters(), *model.buffers()]))
    print("digest", digest.hexdigest())
    """
)


@pytest.mark.slow
def test_swapping_under_auditlog_run_matches_python(tmp_path: Path, store: Path) -> None:
    """Acceptance: load_state_dict and .to(torch.float64) with swapping on behave
    under `auditlog run` exactly as under `python`; verify passes; tree shows float64."""
    import subprocess

    script = tmp_path / "swap.py"
    script.write_text(SWAP_SCRIPT)
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stderr
    recorded = run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    assert recorded.stdout == plain.stdout
    assert "weakrefs 0" in plain.stdout and "['torch.float64']" in plain.stdout
    verified = invoke("verify", "--store", str(store))
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    tree = invoke("tree", "--store", str(store))
    assert tree.exit_code == 0
    tensor_lines = [line for line in tree.stdout.splitlines() if "weight" in line or "bias" in line]
    assert len(tensor_lines) == 6 and all("float64" in line for line in tensor_lines), tree.stdout
    with auditlog.open(store) as s:
        kinds = [e["kind"] for e in s.run().events()]
    assert "recorder_error" not in kinds and "structure_changed" in kinds
