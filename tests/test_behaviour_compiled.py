"""Compiled modules, torch.func transforms, gradcheck and tensor subclasses: identical with and
without a recording open (``behaviour_support.run_twice``), with no recorder fault.

The compile behaviours return dynamo's own counters (frames compiled, graphs, graph
breaks) and the warnings that mention auditlog as part of their outcome, so the twin
harness checks that a recording changes none of them. Models are tiny and steps few:
compiling costs seconds per graph on two CPUs. The compiled models train where
``AUDITLOG_TEST_DEVICE`` says (inductor's Triton kernels on a device machine).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from behaviour_support import run_twice
from helpers import invoke
from torch import nn
from torch._dynamo.utils import counters
from torch.nn.utils import parametrize
from torch.testing._internal.two_tensor import TwoTensor
from truth_support import DEVICE

import auditlog
from auditlog.store.blobs import SnapshotStore


@pytest.fixture(autouse=True)
def _no_tqdm_monitor() -> Any:
    """Inductor's progress bars start tqdm's monitor thread, which outlives the test; a
    process with another thread never forks (test_parallel_verify counts on the fork)."""
    tqdm = pytest.importorskip("tqdm")
    interval = tqdm.tqdm.monitor_interval
    tqdm.tqdm.monitor_interval = 0
    yield
    tqdm.tqdm.monitor_interval = interval
    monitor = getattr(tqdm.tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()
        tqdm.tqdm.monitor = None


class Parent(nn.Module):
    """An eager parent around a compiled child."""

    def __init__(self, compile_child: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        body = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.body = torch.compile(body) if compile_child else body
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(torch.relu(self.inp(x))))


def dynamo_facts() -> dict[str, Any]:
    return {
        "frames": dict(counters["frames"]),
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def train_compiled(compile_root: bool, steps: int = 4) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model: nn.Module = Parent(compile_child=not compile_root).to(DEVICE)
        if compile_root:
            model = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(4, 8).to(DEVICE)).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    facts = dynamo_facts()
    torch._dynamo.reset()
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "losses": losses,
        "dynamo": facts,
        "auditlog_warnings": [
            str(w.message) for w in seen if "auditlog" in f"{w.filename} {w.message}"
        ],
    }


@pytest.mark.parametrize("policy", ["minimal", "debug"])
def test_a_compiled_child_under_an_eager_parent_compiles_and_trains_as_without_recording(
    tmp_path: Path, policy: str
) -> None:
    store = tmp_path / "store"
    outcome = run_twice(lambda: train_compiled(compile_root=False), store, policy)
    assert outcome["dynamo"]["frames"] == {
        "total": 1,
        "ok": 1,
    }  # the child, compiled once (run_twice: same recorded)
    assert outcome["dynamo"]["graph_breaks"] == 0
    with auditlog.open(store) as s:
        run = s.run()
        errors = list(run.events(kinds=["recorder_error"]))
        (flops,) = (e["payload"] for e in run.events(kinds=["flops"]))
    assert errors == []
    # No dispatch mode was opened: it would have stopped dynamo compiling the child.
    assert flops["compiled"] == ["body"] and "compiled code" in flops["skipped"]
    assert "forward_flops" not in flops


def test_a_fully_compiled_model_trains_as_without_recording(tmp_path: Path) -> None:
    store = tmp_path / "store"
    outcome = run_twice(lambda: train_compiled(compile_root=True), store, "debug")
    assert outcome["dynamo"]["graphs"] == 1 and outcome["dynamo"]["graph_breaks"] == 0
    with auditlog.open(store) as s:
        run = s.run()
        assert list(run.events(kinds=["recorder_error"])) == []
        forwards = list(run.module_calls("forward"))
        (flops,) = (e["payload"] for e in run.events(kinds=["flops"]))
    assert forwards  # the compiled root's calls are recorded, as the model's
    assert flops["compiled"] == ["(root)"]


class _BuildsInForward(nn.Module):
    """A compiled forward that builds a module each call (dynamo traces nn.Module.__init__)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.ReLU()(self.fc(x))


def test_a_module_built_inside_compiled_code_compiles_as_without_recording(tmp_path: Path) -> None:
    """The recorder's nn.Module.__init__ wrapper (capture/constructors.py) is never traced."""

    def train() -> dict[str, Any]:
        torch._dynamo.reset()
        counters.clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            model = torch.compile(_BuildsInForward())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(4, 8)).pow(2).mean().backward()
                opt.step()
        facts = dynamo_facts()
        torch._dynamo.reset()
        return {
            "params": [p.detach().clone() for p in model.parameters()],
            "dynamo": facts,
            "auditlog_warnings": [
                str(w.message) for w in seen if "auditlog" in f"{w.filename} {w.message}"
            ],
        }

    outcome = run_twice(train, tmp_path / "store", "minimal")
    assert (
        outcome["dynamo"]["frames"] == {"total": 1, "ok": 1}
        and outcome["dynamo"]["graph_breaks"] == 0
    )
    assert outcome["auditlog_warnings"] == []


def test_torch_func_transforms_over_a_functional_call(tmp_path: Path) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        params = {k: v.detach() for k, v in model.named_parameters()}
        x = torch.randn(5, 3)

        def loss(p: dict[str, torch.Tensor], xs: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(model, p, (xs,)).pow(2).mean()

        grads = torch.func.grad(loss)(params, x)
        per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(
            params, x.unsqueeze(1)
        )
        tangents = {k: torch.ones_like(v) for k, v in params.items()}
        value, jvp_out = torch.func.jvp(lambda p: loss(p, x), (params,), (tangents,))
        with torch.autograd.forward_ad.dual_level():
            dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
            forward_tangent = torch.autograd.forward_ad.unpack_dual(model(dual)).tangent
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):  # and ordinary training around them
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        return (
            grads,
            per_sample,
            value,
            jvp_out,
            forward_tangent,
            [p.detach() for p in model.parameters()],
        )

    run_twice(behaviour, tmp_path / "store", "debug")


def test_gradcheck_with_batched_gradients(tmp_path: Path) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2)).double()
        x = torch.randn(4, 3, dtype=torch.double, requires_grad=True)
        checked = torch.autograd.gradcheck(model, (x,), check_batched_grad=True)
        twice = torch.autograd.gradgradcheck(model, (x,))
        two_outputs = torch.autograd.gradcheck(
            lambda t: (model(t), model(t).sum()), (x,), check_batched_grad=True
        )
        return checked, twice, two_outputs

    store = tmp_path / "store"
    assert run_twice(behaviour, store, "debug") == (True, True, True)
    with auditlog.open(store) as s:
        assert list(s.run().events(kinds=["recorder_error"])) == []


class Double(nn.Module):
    """A parametrization with a right inverse: the original is written through it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def right_inverse(self, x: torch.Tensor) -> torch.Tensor:
        return x / 2


def test_a_wrapper_subclass_parametrization_trains_and_its_snapshot_restores_bitwise(
    tmp_path: Path,
) -> None:
    def behaviour() -> Any:
        model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
        w = model[0].weight.detach()
        model[0].weight = nn.Parameter(TwoTensor(w.clone(), w.clone() + 1))
        parametrize.register_parametrization(model[0], "weight", Double())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            loss = model(TwoTensor(torch.randn(3, 4), torch.randn(3, 4))).pow(2).sum()
            loss.backward()
            opt.step()
        recording = auditlog.current()
        if recording is not None:
            recording.snapshot(model, tag="end")
        original = model[0].parametrizations.weight.original
        return original.a.detach().clone(), original.b.detach().clone(), loss.detach().a

    store = tmp_path / "store"
    a, b, _ = run_twice(behaviour, store, "debug")
    with auditlog.open(store) as s:
        run = s.run()
        assert list(run.events(kinds=["recorder_error"])) == []
        (snapshot,) = [
            e["payload"]
            for e in run.events(kinds=["snapshot_taken"])
            if e["payload"].get("tag") == "end"
        ]
        shapes = [e["payload"] for e in run.events(kinds=["activity"])]
    assert shapes  # statistics were taken (of the inner tensors), none failed
    wrapped = [t for t in snapshot["snapshot"]["tensors"] if "subclass" in t]
    assert len(wrapped) == 1
    (entry,) = wrapped
    assert entry["subclass"]["type"] == "torch.testing._internal.two_tensor.TwoTensor"
    assert list(entry["subclass"]["inner"]) == ["a", "b"] and entry["subclass"]["ctx"] is None
    files = SnapshotStore(store / "snapshots")
    inner = {
        name: files.read_verified(sha, name) for name, sha in entry["subclass"]["inner"].items()
    }
    restored = TwoTensor.__tensor_unflatten__(inner, None, a.shape, a.stride())
    assert torch.equal(restored.a, a) and torch.equal(restored.b, b)
    assert restored.a.dtype == a.dtype and restored.b.dtype == b.dtype
    assert (
        entry["sha256"] == entry["subclass"]["inner"]["a"]
    )  # the first inner tensor stands for the whole
    assert entry["subclass"]["shape"] == list(a.shape) and entry["subclass"]["stride"] == list(
        a.stride()
    )

    # The Python API rebuilds the wrapper (its class is imported here); "first" gives the plain first inner.
    key = "0.parametrizations.weight.original"
    with auditlog.open(store) as s:
        run = s.run()
        assert list(run.wrappers_at()) == [key]
        whole = run.state_dict()[key]
        first = run.state_dict(wrappers="first")[key]
    assert type(whole) is TwoTensor and whole.shape == a.shape and whole.stride() == a.stride()
    assert torch.equal(whole.a, a) and torch.equal(whole.b, b) and not torch.equal(whole.a, whole.b)
    assert type(first) is torch.Tensor and torch.equal(first, a)


def test_restore_writes_a_wrappers_first_inner_tensor_and_says_so(tmp_path: Path) -> None:
    """``auditlog restore`` does not import the class a store names: the file holds the first
    inner tensor, and stderr says which keys held a subclass and how to rebuild them whole."""
    store = tmp_path / "store"
    with auditlog.record(store=store, snapshot_every=1) as recording:
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        w = model.weight.detach()
        model.weight = nn.Parameter(TwoTensor(w.clone(), w.clone() * 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            model(TwoTensor(torch.randn(4, 3), torch.randn(4, 3))).pow(2).sum().backward()
            opt.step()
        a, b = model.weight.a.detach().clone(), model.weight.b.detach().clone()
    assert recording.run_id is not None
    for name in ("w.pt", "w.safetensors"):
        result = invoke("restore", "--store", str(store), "-o", str(tmp_path / name))
        assert result.exit_code == 0, result.stderr
        assert (
            "note: weight held a tensor subclass (torch.testing._internal.two_tensor.TwoTensor)"
            in result.stderr
        )
        assert "Run.state_dict()" in result.stderr
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "w.safetensors"))["weight"], a)
    assert torch.equal(torch.load(tmp_path / "w.pt")["weight"], a)
    with auditlog.open(store) as s:
        run = s.run()
        whole = run.state_dict()["weight"]
        initial = run.state_dict(step=0)[
            "weight"
        ]  # the sealed initial value stores every inner tensor too
    assert torch.equal(whole.a, a) and torch.equal(whole.b, b)
    assert (
        type(initial) is TwoTensor and torch.equal(initial.a, w) and torch.equal(initial.b, w * 3)
    )


def test_a_wrapper_is_rebuilt_only_from_a_class_already_imported() -> None:
    """A store names a class; auditlog never imports it (a crafted store would run code), and a
    context stored as text cannot be rebuilt: both are refused with the reason."""
    from auditlog.core.errors import AuditlogError
    from auditlog.read.wrappers import wrapper_class

    facts = {
        "type": "torch.testing._internal.two_tensor.TwoTensor",
        "inner": {"a": "0" * 64, "b": "1" * 64},
        "ctx": None,
    }
    assert wrapper_class("w", facts) is TwoTensor
    with pytest.raises(AuditlogError, match="no tensor subclass imported in this process"):
        wrapper_class("w", {**facts, "type": "antigravity.Fly"})
    with pytest.raises(AuditlogError, match="no tensor subclass imported in this process"):
        wrapper_class("w", {**facts, "type": "os.path"})  # imported, but no tensor subclass
    with pytest.raises(AuditlogError, match="stored as text only"):
        wrapper_class("w", {**facts, "ctx": "{'scale': 2.0}"})
    with pytest.raises(AuditlogError, match="names no wrapper class"):
        wrapper_class("w", {**facts, "inner": {}})
