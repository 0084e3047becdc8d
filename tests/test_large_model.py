"""A 5,000-module model (2,500 x Linear(8,8)+Tanh): restore is bitwise the live state,
verify finds it intact, tree lists every module (issue 16; timings: benchmarks/replay.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import invoke
from safetensors.torch import load_file
from torch import nn

import auditlog

LAYERS = 2500


def build() -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(8, 8), nn.Tanh()]
    return nn.Sequential(*layers)


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.slow
def test_restore_of_5000_modules_is_bitwise_the_live_state(store: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, name="wide"):  # default policy: sealed initial and final snapshots
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
        live = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert len(live) == 2 * LAYERS
    out = tmp_path / "end.safetensors"
    result = invoke("restore", "--store", str(store), "-o", str(out))
    assert result.exit_code == 0, result.stderr
    restored = load_file(out)
    assert sorted(restored) == sorted(live)
    for key, value in live.items():
        assert restored[key].dtype == value.dtype and restored[key].shape == value.shape, key
        assert bits(restored[key]) == bits(value), key
    with auditlog.open(store) as opened:
        assert opened.run("latest").verify().ok
    tree = invoke("tree", "--store", str(store))
    assert tree.exit_code == 0, tree.stderr
    lines = tree.stdout.splitlines()
    assert len(lines) == 1 + 2 * LAYERS + 2 * LAYERS  # the root, each module, each weight and bias
    assert lines[-1].startswith("└── 4999 (Tanh)")
