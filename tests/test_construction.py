"""Construction events replay into exactly the live model; sealing captures real initial values."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from helpers import load_example
from torch import nn

import auditlog
from auditlog.core.replay import ModelState


def replayed(store: Path) -> ModelState:
    with auditlog.open(store) as s:
        return s.run("latest").model_state()


def assert_replay_matches(state: ModelState, model: nn.Module, requires_grad: bool = True) -> None:
    """Names, classes, shapes, dtypes, requires_grad and persistence equal the live model's.

    ``requires_grad=False`` skips that flag: freezing with ``requires_grad_`` fires no
    hook (detected by the structural check of the snapshots issue, not here).
    """
    root = state.root_by_class(type(model).__qualname__)
    live_modules = [
        (n, f"{type(m).__module__}.{type(m).__qualname__}") for n, m in model.named_modules()
    ]
    rep_modules = [(n, state.modules[m].cls) for n, m in state.named_modules(root)]
    assert rep_modules == live_modules
    live_params = [
        (n, list(p.shape), str(p.dtype)[6:], p.requires_grad if requires_grad else None)
        for n, p in model.named_parameters()
    ]
    rep_params = [
        (
            n,
            state.tensors[t].shape,
            state.tensors[t].dtype,
            state.tensors[t].requires_grad if requires_grad else None,
        )
        for n, t in state.named_parameters(root)
    ]
    assert rep_params == live_params
    live_buffers = [(n, list(b.shape), str(b.dtype)[6:]) for n, b in model.named_buffers()]
    rep_buffers = [
        (n, state.tensors[t].shape, state.tensors[t].dtype) for n, t in state.named_buffers(root)
    ]
    assert rep_buffers == live_buffers
    persistent = set(model.state_dict())
    for name, tensor_id in state.named_buffers(root):
        assert state.tensors[tensor_id].persistent == (name in persistent), name


@pytest.mark.parametrize("example", ["train_mlp", "train_cnn"])
def test_trained_example_replays_to_final_model(store: Path, example: str) -> None:
    mod = load_example(example)
    torch.manual_seed(0)
    with auditlog.record(store):
        model = mod.build_model()
        mod.train(model, epochs=2, quiet=True)
    assert_replay_matches(replayed(store), model)


def test_tied_weights_and_replaced_head(store: Path) -> None:
    lm = load_example("finetune_tied")
    torch.manual_seed(0)
    with auditlog.record(store):
        model = lm.TinyLM()
        assert model.lm_head.weight is model.embed.weight
        lm.pretrain(model, 2)
        old_head = model.lm_head
        lm.finetune(model, 2)
    state = replayed(store)
    assert_replay_matches(state, model, requires_grad=False)
    # the tied tensor: one id, registered under two names (embed.weight, old lm_head.weight)
    root = state.root_by_class("TinyLM")
    embed_id = dict(state.named_parameters(root))["embed.weight"]
    names = state.tensor_names()[embed_id]
    assert "embed.weight" in names
    old_head_node = [
        m
        for m in state.modules.values()
        if m.parameters.get("weight") == embed_id and m.cls and m.cls.endswith("Linear")
    ]
    assert len(old_head_node) == 1  # the detached, pre-finetune head still shows the tie
    assert old_head.weight is model.embed.weight
    # the new head was sealed when first used, with its own initial values
    assert (
        state.tensors[dict(state.named_parameters(root))["lm_head.weight"]].initial_sha256
        is not None
    )
    # the non-persistent causal mask buffer
    causal = dict(state.named_buffers(root))["causal"]
    assert state.tensors[causal].persistent is False


def test_sealed_hashes_are_initial_values_not_registration_memory(store: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store):
        model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            model(torch.randn(4, 6)).sum().backward()
            opt.step()
    state = replayed(store)
    root = state.root_by_class("Sequential")
    recorded = {n: state.tensors[t].initial_sha256 for n, t in state.named_parameters(root)}
    recorded.update({n: state.tensors[t].initial_sha256 for n, t in state.named_buffers(root)})
    assert recorded == {k: auditlog.tensor_hash(v) for k, v in initial.items()}
    # and they are not the final (trained) values
    assert recorded["0.weight"] != auditlog.tensor_hash(model[0].weight)
    stats = state.tensors[dict(state.named_parameters(root))["0.weight"]].initial_stats
    assert stats is not None
    assert stats["norm"] == pytest.approx(float(initial["0.weight"].norm()), rel=1e-6)


def test_explicit_seal_and_optimizer_step_seal(store: Path) -> None:
    with auditlog.record(store) as run:
        a = nn.Linear(3, 3)
        run.seal(a)
        b = nn.Linear(3, 3)  # never forwarded: sealed at the first optimizer step
        opt = torch.optim.SGD(b.parameters(), lr=0.1)
        b.weight.grad = torch.ones_like(b.weight)
        opt.step()
        unused = nn.Linear(2, 2)  # never used at all: sealed at run end
    with auditlog.open(store) as s:
        sealed = [e["payload"] for e in s.run().events(kinds=["construction_sealed"])]
    assert [p["trigger"] for p in sealed] == ["explicit", "optimizer_step", "run_end"]
    assert [len(p["tensors"]) for p in sealed] == [2, 2, 2]
    assert sealed[2]["tensors"][0]["sha256"] == auditlog.tensor_hash(unused.weight)


def test_source_locations_point_at_user_code(store: Path) -> None:
    here = str(Path(__file__).resolve())

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 3)
            self.act = nn.ReLU()

    with auditlog.record(store):
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        net = Net()
    del net
    with auditlog.open(store) as s:
        events = list(s.run().events(kinds=["module_registered", "parameter_registered"]))
    fc_reg = next(
        e["payload"]
        for e in events
        if e["kind"] == "module_registered" and e["payload"]["name"] == "fc"
    )
    fc_line = inspect.getsource(Net).splitlines()
    init_line = inspect.getsourcelines(Net)[1] + next(
        i for i, t in enumerate(fc_line) if "nn.Linear(2, 3)" in t
    )
    assert fc_reg["source"] == {
        "file": here,
        "line": init_line,
        "function": "__init__",
        "kind": "constructed",
    }
    assert fc_reg["parent_source"] == {
        "file": here,
        "line": line,
        "function": "test_source_locations_point_at_user_code",
        "kind": "constructed",
    }
    weight = next(
        e["payload"]
        for e in events
        if e["kind"] == "parameter_registered" and e["payload"]["name"] == "weight"
    )
    assert weight["source"]["file"] == here and weight["source"]["line"] == init_line
    act = next(
        e["payload"]
        for e in events
        if e["kind"] == "module_registered" and e["payload"]["name"] == "act"
    )
    assert act["source"]["line"] == init_line + 1


def test_member_replacement_semantics(store: Path) -> None:
    """Names move between parameters/buffers/children exactly as nn.Module does."""
    with auditlog.record(store):
        m = nn.Module()
        m.a = nn.Linear(1, 1)
        m.register_parameter("p", nn.Parameter(torch.zeros(2)))
        m.register_buffer("b", torch.ones(3))
        m.c = nn.ReLU()
        m.register_module("none_child", None)
        del m.p
        m.p = nn.Linear(2, 2)  # the name 'p' is now a child module
        m.b = torch.zeros(4)  # same buffer name, new tensor: keeps its position
        m.a = nn.Linear(1, 2)  # replaced child keeps its position
        m.register_parameter("q", None)
        m.register_buffer("nb", torch.zeros(1), persistent=False)
    state = replayed(store)
    root = state.root_by_class("Module")
    node = state.modules[root]
    assert list(node.children) == ["a", "c", "none_child", "p"]
    assert node.children["none_child"] is None
    assert list(node.buffers) == ["b", "nb"]
    assert state.tensors[node.buffers["b"]].shape == [4]
    assert state.tensors[node.buffers["nb"]].persistent is False
    assert state.tensors[node.buffers["b"]].persistent is True
    # 'p' was deleted with `del` (no hook fires), then re-assigned as a module: replay
    # sees the module registration and drops the stale parameter entry.
    assert "p" not in node.parameters
    # register_parameter(name, None) fires no hook in torch; it adds nothing to
    # named_parameters either, so the replayed names below still agree.
    assert "q" not in node.parameters
    assert [n for n, _ in state.named_modules(root)] == [n for n, _ in m.named_modules()]
    assert [n for n, _ in state.named_parameters(root)] == [n for n, _ in m.named_parameters()]
    assert [n for n, _ in state.named_buffers(root)] == [n for n, _ in m.named_buffers()]


def test_shared_module_named_once_like_torch(store: Path) -> None:
    with auditlog.record(store):
        shared = nn.Linear(2, 2)
        model = nn.Sequential(shared, nn.ReLU(), shared)
    state = replayed(store)
    root = state.root_by_class("Sequential")
    assert [n for n, _ in state.named_modules(root)] == [n for n, _ in model.named_modules()]
    assert [n for n, _ in state.named_parameters(root)] == [n for n, _ in model.named_parameters()]
    shared_id = dict(state.named_modules(root))["0"]
    assert state.module_names()[shared_id] == ["0"]  # named_modules-style dedup


def test_deferred_registrations_reach_the_store_on_flush_and_match_the_live_state(
    tmp_path: Path,
) -> None:
    """Registration hooks only queue facts (capture/registrations.py): ``run.flush()``
    alone makes them visible, in hook order, and the recorder's own replayed
    state (its structural checks read it) equals the store's."""
    store = tmp_path / "s"
    built_before = nn.Sequential(nn.Linear(2, 2))
    with auditlog.record(store) as run:
        model = nn.Sequential(
            nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.Tanh(), nn.Linear(4, 2))
        )
        extra = nn.Module()
        extra.register_parameter("nothing", None)
        extra.register_buffer("scratch", torch.zeros(2), persistent=False)
        extra.lazy = nn.LazyLinear(3)
        extra.adopted = built_before  # built before recording: adopted
        model.append(extra)
        assert run.flush()
        state = replayed(store)
        assert len(state.modules) == len(list(model.modules()))
        recorder = run.recorder
        assert recorder is not None
        live = recorder.ctx.state
        assert {
            m: (n.cls, n.children, n.parameters, n.buffers, n.source)
            for m, n in live.modules.items()
        } == {
            m: (n.cls, n.children, n.parameters, n.buffers, n.source)
            for m, n in state.modules.items()
        }
        assert {
            t: (i.shape, i.dtype, i.device, i.requires_grad, i.persistent, i.source)
            for t, i in live.tensors.items()
        } == {
            t: (i.shape, i.dtype, i.device, i.requires_grad, i.persistent, i.source)
            for t, i in state.tensors.items()
        }
