"""verify covers snapshot files: a changed file fails naming tensor and file; a missing one is 'missing'."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import invoke
from torch import nn

import auditlog


def record(store: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=1):
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()


def snapshot_file(store: Path, tensor: str) -> Path:
    with auditlog.open(store) as s:
        run = s.run()
        state = run.model_state()
        tensor_id = dict(state.named_parameters(state.main_root()))[tensor]
        sha = state.tensors[tensor_id].snapshot_sha256
    assert sha is not None
    return store / "snapshots" / sha[:2] / f"{sha}.parquet"


def test_intact_store_checks_every_snapshot_file(store: Path) -> None:
    record(store)
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 0, result.stderr
    with auditlog.open(store) as s:
        report = s.run().verify()
    # initial values, 2 step snapshots and the final one: 4 parameters each, some identical
    assert report.ok and report.snapshots >= 8


def test_changed_snapshot_file_fails_naming_tensor_and_file(store: Path) -> None:
    record(store)
    path = snapshot_file(store, "1.weight")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 4
    assert "1.weight" in result.stderr and path.name in result.stderr and "modified" in result.stderr


def test_missing_snapshot_file_is_reported_as_missing(store: Path) -> None:
    record(store)
    path = snapshot_file(store, "0.bias")
    path.unlink()
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 4
    assert "0.bias" in result.stderr and "missing" in result.stderr and "Traceback" not in result.stderr
    restore = invoke("restore", "--store", str(store), "-o", str(store.parent / "x.pt"))
    assert restore.exit_code != 0 and "missing" in restore.stderr
