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
    assert (
        "1.weight" in result.stderr and path.name in result.stderr and "modified" in result.stderr
    )


def test_missing_snapshot_file_is_reported_as_missing(store: Path) -> None:
    record(store)
    path = snapshot_file(store, "0.bias")
    path.unlink()
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 4
    assert (
        "0.bias" in result.stderr
        and "missing" in result.stderr
        and "Traceback" not in result.stderr
    )
    for name in ("x.pt", "x.safetensors"):
        restore = invoke("restore", "--store", str(store), "-o", str(store.parent / name))
        assert restore.exit_code == 4 and "0.bias" in restore.stderr and "missing" in restore.stderr


def test_one_changed_byte_is_caught_by_verify_and_refused_by_restore(store: Path) -> None:
    record(store)
    path = snapshot_file(store, "0.weight")
    original = path.read_bytes()
    with auditlog.open(store) as s:
        values = s.run().state_dict()["0.weight"].numpy().tobytes()
    where = original.find(
        values
    )  # floats are stored uncompressed: the values lie in the file as they are
    assert where > 0
    data = bytearray(original)
    data[where + 5] ^= 0x01  # one bit of one byte of one value
    path.write_bytes(bytes(data))
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 4 and "0.weight" in result.stderr and path.name in result.stderr
    assert "does not match its name" in result.stderr
    for name in ("x.pt", "x.safetensors"):
        out = store.parent / name
        restore = invoke("restore", "--store", str(store), "-o", str(out))
        assert restore.exit_code == 4, restore.stderr
        assert "0.weight" in restore.stderr and path.name in restore.stderr
        assert not out.exists() and not list(store.parent.glob(".auditlog-restore-*"))


def test_a_changed_byte_outside_the_values_is_caught_by_the_file_digest(store: Path) -> None:
    """Some footer bytes (the writer's name, say) change neither the values nor the schema
    pyarrow reports: the catalog's digest of the whole file still catches them."""
    record(store)
    path = snapshot_file(store, "0.weight")
    data = bytearray(path.read_bytes())
    where = data.find(b"parquet-cpp-arrow version")
    assert where > 0
    data[where] ^= 0x01
    path.write_bytes(bytes(data))
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 4 and "0.weight" in result.stderr
    assert (
        "the file's bytes hash to" in result.stderr
        and "file modified outside its values" in result.stderr
    )
    # the values are intact: restore, which checks the content hash, still answers them
    assert invoke("restore", "--store", str(store), "-o", str(store.parent / "x.pt")).exit_code == 0
