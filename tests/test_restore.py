"""The model at any step: restore state_dicts bitwise; replay structure through unhooked changes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke, load_example
from torch import nn

import auditlog


def copy_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_bitwise(
    restored: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], ordered: bool = True
) -> None:
    assert list(restored) == list(expected) if ordered else sorted(restored) == sorted(expected)
    for key, value in expected.items():
        assert restored[key].dtype == value.dtype and restored[key].shape == value.shape, key
        assert bits(restored[key]) == bits(value), key


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.embed(tokens))))


def small_transformer() -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return nn.Sequential(
        nn.Linear(4, 16),
        nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
        nn.Linear(16, 1),
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], torch.Tensor]]] = {
    "mlp": (
        lambda: load_example("train_mlp").build_model(),
        lambda g: torch.randn(8, 20, generator=g),
    ),
    "cnn_batchnorm": (
        lambda: load_example("train_cnn").build_model(),
        lambda g: torch.randn(4, 1, 16, 16, generator=g),
    ),
    "transformer": (small_transformer, lambda g: torch.randn(2, 5, 4, generator=g)),
    "tied": (TiedLM, lambda g: torch.randint(0, 20, (4, 6), generator=g)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_restore_at_each_step_is_bitwise_equal_to_training(store: Path, name: str) -> None:
    build, batch = MODELS[name]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    copies: dict[int, dict[str, torch.Tensor]] = {}
    with auditlog.record(store, snapshot_every=1):
        model = build()
        copies[0] = copy_state(model)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for step in range(1, 5):
            out = model(batch(gen))
            out.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            copies[step] = copy_state(model)
    with auditlog.open(store) as s:
        run = s.run()
        for step in (0, 1, 2, 4):
            restored = run.state_dict(step=step)
            assert_bitwise(restored, copies[step])
            fresh = build()
            fresh.load_state_dict(restored, strict=True)
        end = run.state_dict()
    assert_bitwise(end, copies[4])


def test_restore_cli_writes_safetensors_and_torch_files(store: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=2):
        model = TiedLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randint(0, 20, (2, 3))).sum().backward()
            opt.step()
        expected = copy_state(model)
    out = tmp_path / "ckpt.safetensors"
    result = invoke("restore", "--store", str(store), "--step", "4", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    from safetensors.torch import load_file

    assert_bitwise(load_file(out), expected, ordered=False)  # safetensors sorts keys
    pt = tmp_path / "ckpt.pt"
    result = invoke("restore", "--store", str(store), "latest", "--step", "4", "-o", str(pt))
    assert result.exit_code == 0, result.stderr
    loaded = torch.load(pt, weights_only=True)
    assert_bitwise(loaded, expected)
    TiedLM().load_state_dict(loaded, strict=True)
    # refusing to overwrite, then --force
    again = invoke("restore", "--store", str(store), "--step", "4", "-o", str(pt))
    assert again.exit_code == 1 and "--force" in again.stderr
    assert (
        invoke("restore", "--store", str(store), "--step", "4", "-o", str(pt), "--force").exit_code
        == 0
    )


def test_restore_refuses_steps_without_snapshots_naming_tensors(
    store: Path, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=2):
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(5, 3)).sum().backward()
            opt.step()
    out = tmp_path / "x.pt"
    result = invoke("restore", "--store", str(store), "--step", "3", "-o", str(out))
    assert result.exit_code == 1
    assert "no snapshot of 0.weight" in result.stderr and "step 3" in result.stderr
    assert not out.exists() and not list(tmp_path.glob("auditlog-restore-*"))
    bad_step = invoke("restore", "--store", str(store), "--step", "9", "-o", str(out))
    assert bad_step.exit_code == 2 and "no step 9" in bad_step.stderr
    bad_ext = invoke("restore", "--store", str(store), "-o", str(tmp_path / "x.txt"))
    assert bad_ext.exit_code == 2 and "format" in bad_ext.stderr


def test_restore_allow_partial_skips_unsnapshotted(store: Path, tmp_path: Path) -> None:
    with auditlog.record(store, snapshot_initial=False, snapshot_final=False) as run:
        model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        model(torch.randn(2, 3))
        run.snapshot(model[0], tag="first-layer-only")
    result = invoke("restore", "--store", str(store), "-o", str(tmp_path / "p.pt"))
    assert result.exit_code == 1 and "1.weight" in result.stderr
    result = invoke(
        "restore", "--store", str(store), "-o", str(tmp_path / "p.pt"), "--allow-partial"
    )
    assert result.exit_code == 0, result.stderr
    partial = torch.load(tmp_path / "p.pt", weights_only=True)
    assert set(partial) == {"0.weight", "0.bias"}


def live_structure(model: nn.Module) -> dict[str, Any]:
    return {
        "modules": [(n, type(m).__name__) for n, m in model.named_modules()],
        "params": [
            (n, list(p.shape), str(p.dtype)[6:], p.requires_grad)
            for n, p in model.named_parameters()
        ],
        "buffers": [(n, list(b.shape), str(b.dtype)[6:]) for n, b in model.named_buffers()],
    }


def replayed_structure(state: Any, root: int) -> dict[str, Any]:
    return {
        "modules": [
            (n, state.modules[m].cls.rsplit(".", 1)[-1]) for n, m in state.named_modules(root)
        ],
        "params": [
            (n, state.tensors[t].shape, state.tensors[t].dtype, state.tensors[t].requires_grad)
            for n, t in state.named_parameters(root)
        ],
        "buffers": [
            (n, state.tensors[t].shape, state.tensors[t].dtype)
            for n, t in state.named_buffers(root)
        ],
    }


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.aux = nn.Linear(8, 8)  # not used in forward; deleted mid-run
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_replay_follows_changes_no_hook_reports(store: Path) -> None:
    torch.manual_seed(0)
    live: dict[int, dict[str, Any]] = {}
    with auditlog.record(store, activity_every=1, check_every=1, check_share=0):
        model = Net()
        live[0] = live_structure(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(dtype: torch.dtype = torch.float32) -> None:
            model(torch.randn(6, 4, dtype=dtype)).sum().backward()
            opt.step()
            opt.zero_grad()

        step()
        live[1] = live_structure(model)
        model.head = nn.Linear(8, 3)  # head replacement (a hook sees this)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        step()
        live[2] = live_structure(model)
        del model.aux  # no hook
        for p in model.body[0].parameters():
            p.requires_grad_(False)  # no hook
        step()
        live[3] = live_structure(model)
        model.half()  # no hook: parameters keep their identity, dtype changes
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
        step(torch.float16)
        live[4] = live_structure(model)
    with auditlog.open(store) as s:
        run = s.run()
        for k, expected in live.items():
            state = run.state_at(step=k)
            assert replayed_structure(state, state.root_by_class("Net")) == expected, f"step {k}"
        changes = [e["payload"] for e in run.events(kinds=["structure_changed"])]
    kinds = {(c["change"], c["member"]) for c in changes}
    assert ("removed", "module") in kinds and ("tensor_changed", "parameter") in kinds
    # .half() gives BatchNorm new float16 buffer tensors (assigned into _buffers, no hook)
    with auditlog.open(store) as s:
        rebuffered = [
            e
            for e in s.run().events(kinds=["buffer_registered"])
            if e["payload"].get("detected_at")
        ]
    assert {e["payload"]["name"] for e in rebuffered} == {"running_mean", "running_var"}


def test_replay_at_seq_and_tree_cli(store: Path) -> None:
    with auditlog.record(store) as run:
        model = Net().eval()  # eval: the forward leaves BatchNorm statistics unchanged
        model(torch.randn(3, 4))
        run.snapshot(model, tag="built")
    tree = invoke("tree", "--store", str(store), "--format", "json")
    assert tree.exit_code == 0, tree.stderr
    import json

    (root,) = json.loads(tree.stdout)
    assert root["class"].endswith("Net") and [c["name"] for c in root["children"]] == [
        "body",
        "aux",
        "head",
    ]
    body = root["children"][0]
    linear = body["children"][0]
    assert linear["parameters"][0]["name"] == "weight" and linear["parameters"][0]["shape"] == [
        8,
        4,
    ]
    assert linear["parameters"][0]["sha256"] is not None
    assert "test_restore.py" in (linear["source"] or "")
    table = invoke("tree", "--store", str(store))
    assert table.exit_code == 0 and "BatchNorm1d" in table.stdout and "running_mean" in table.stdout
    early = invoke("tree", "--store", str(store), "--seq", "3", "--format", "json")
    assert early.exit_code == 0
    snaps = invoke("snapshots", "--store", str(store))
    assert snaps.exit_code == 0 and "built" in snaps.stdout and "dedup" in snaps.stdout
    snaps_json = invoke("snapshots", "--store", str(store), "--format", "json")
    rows = json.loads(snaps_json.stdout)
    assert [r["trigger"] for r in rows] == ["sealed", "explicit", "run_end"]
    assert rows[1]["tag"] == "built" and rows[1]["new_bytes"] == 0  # same values as sealed


class MixedDtypes(nn.Module):
    """Every kind of value a snapshot holds: bf16 weights, a 4 MiB float32 table (written
    while hashed), bool and int64 buffers, a 0-d and an empty buffer, a tied weight."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(2048, 512)
        self.proj = nn.Linear(512, 16).to(torch.bfloat16)
        self.out = nn.Linear(16, 16, bias=False)
        self.tied = self.out  # the same module (and weight) under two names
        self.register_buffer("mask", torch.arange(16) % 3 == 0)
        self.register_buffer("counts", torch.arange(16, dtype=torch.int64))
        self.register_buffer("scale", torch.tensor(0.5))
        self.register_buffer("nothing", torch.zeros(0, 3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.proj(self.table(ids).to(torch.bfloat16)).float()
        return self.out(hidden * self.mask * self.scale)


def test_every_kind_of_value_restores_bitwise_through_both_formats(
    store: Path, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=1):
        model = MixedDtypes()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randint(0, 2048, (4, 3))).pow(2).mean().backward()
            with torch.no_grad():
                model.counts += 1  # an integer buffer that changes (before the step's snapshot)
            opt.step()
        expected = copy_state(model)
    with auditlog.open(store) as opened:
        assert_bitwise(opened.run().state_dict(step=2), expected)
    from safetensors import safe_open
    from safetensors.torch import load_file

    st = tmp_path / "mixed.safetensors"
    assert invoke("restore", "--store", str(store), "--step", "2", "-o", str(st)).exit_code == 0
    assert_bitwise(load_file(st), expected, ordered=False)
    with safe_open(str(st), "pt") as handle:
        metadata = handle.metadata()
    assert json.loads(metadata["auditlog.key_order"]) == list(expected)  # the state_dict's order
    pt = tmp_path / "mixed.pt"
    assert invoke("restore", "--store", str(store), "--step", "2", "-o", str(pt)).exit_code == 0
    assert_bitwise(torch.load(pt, weights_only=True), expected)
    MixedDtypes().load_state_dict(load_file(st), strict=True)
