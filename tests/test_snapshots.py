"""Parquet snapshots: every dtype round-trips bitwise; identical content is stored once."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke
from snapshot_support import DTYPES, same_bits, sample
from torch import nn

import auditlog
from auditlog.core.tensors import tensor_hash
from auditlog.store.blobs import SnapshotError, SnapshotStore


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bitwise(tmp_path: Path, dtype: torch.dtype) -> None:
    store = SnapshotStore(tmp_path)
    full = sample(dtype)
    for tensor in (full, full.t(), full[::2, 1:], full[2, 3], full[:0]):
        info = store.put(tensor)
        back = store.get(info)
        assert same_bits(back, tensor.contiguous())
        assert info.sha256 == tensor_hash(tensor) == tensor_hash(back)
        assert store.check(info.sha256, info.as_row()) == []
        assert same_bits(store.read_verified(info.sha256, "t"), tensor.contiguous())
    special = torch.tensor([float("nan"), float("inf"), -0.0, 1e-30], dtype=torch.float32)
    assert same_bits(store.get(store.put(special)), special)


def test_large_tensor_is_written_in_bounded_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import auditlog.store.blobformat as snapshot_format

    monkeypatch.setattr(snapshot_format, "CHUNK_BYTES", 4096)
    store = SnapshotStore(tmp_path)
    big = torch.randn(10_000)  # 40,000 bytes -> 10 chunks of 4,096 bytes
    info = store.put(big)
    assert info.row_groups == 10
    import pyarrow.parquet as pq

    assert pq.ParquetFile(store.path(info.sha256)).num_row_groups == 10
    assert torch.equal(store.get(info), big)
    raw = torch.randn(3000).bfloat16()
    raw_info = store.put(raw)
    assert raw_info.layout == "raw" and raw_info.row_groups == 2
    assert same_bits(store.get(raw_info), raw)


def test_identical_content_is_stored_once(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    a = torch.arange(12.0).reshape(3, 4)
    first = store.put(a)
    second = store.put(a.clone())
    assert first.sha256 == second.sha256
    assert len(list(tmp_path.rglob("*.parquet"))) == 1
    other_shape = store.put(a.reshape(4, 3))
    assert other_shape.sha256 != first.sha256  # the hash covers the shape


def test_damaged_and_missing_files_are_reported(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    info = store.put(torch.randn(100))
    path = store.path(info.sha256)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert store.check(info.sha256, info.as_row()) != []
    path.unlink()
    assert store.check(info.sha256, info.as_row()) == ["missing"]
    with pytest.raises(SnapshotError, match="missing"):
        store.get(info)


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.parquet"))


def test_frozen_layers_do_not_grow_the_snapshot_directory(store: Path) -> None:
    torch.manual_seed(0)
    sizes: list[int] = []
    with auditlog.record(store, snapshot_every=1) as run:
        backbone = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
        for p in backbone.parameters():
            p.requires_grad_(False)
        model = nn.Sequential(backbone, nn.Linear(64, 2))
        opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            run.flush()
            sizes.append(dir_bytes(store / "snapshots"))
    with auditlog.open(store) as s:
        state = s.run().model_state()
        events = list(s.run().events(kinds=["snapshot_taken"]))
    root = state.root_by_class("Sequential")
    params = dict(state.named_parameters(root))
    frozen = [params[n] for n in ("0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias")]
    for tensor_id in frozen:
        hashes = {sha for _, _, sha in state.tensors[tensor_id].history}
        assert len(hashes) == 1  # one content, however often snapshotted
    head_bytes = 64 * 2 * 4 + 2 * 4
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    # each step adds the new head values only (plus Parquet overhead), never the backbone
    backbone_bytes = 2 * (64 * 64 + 64) * 4
    assert all(0 < g < backbone_bytes / 4 for g in growth), (growth, head_bytes)
    step_events = [e for e in events if e["payload"]["trigger"] == "step"]
    assert len(step_events) == 4
    assert all(e["payload"]["snapshot"]["new_bytes"] <= head_bytes for e in step_events)


def test_a_writer_that_cannot_keep_up_is_reported_never_skipped(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deliberately slowed snapshot writer (0.5 s per snapshot) and a snapshot every step
    of a model whose steps take milliseconds."""
    from auditlog.capture.roots import SNAPSHOT_BACKLOG
    from auditlog.store.blobwriter import BlobWriter

    original = BlobWriter.store

    def slow_store(self: BlobWriter, items: Any, *args: Any) -> Any:
        time.sleep(0.5)
        return original(self, items, *args)

    monkeypatch.setattr(BlobWriter, "store", slow_store)
    torch.manual_seed(0)
    live: dict[int, dict[str, torch.Tensor]] = {}
    with auditlog.record(store, snapshot_every=1):
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1, 6):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            live[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with auditlog.open(store) as opened:
        run = opened.run()
        events = [
            e for e in run.events(kinds=["snapshot_taken"]) if e["payload"]["trigger"] == "step"
        ]
        assert [e["step"] for e in events] == [1, 2, 3, 4, 5]  # every one taken, none skipped
        overruns = [e["payload"].get("overrun") for e in events]
        reported = [o for o in overruns if o is not None]
        assert overruns[0] is None and len(reported) >= 3, overruns
        # behind: one more than the backlog at most (training waited for the oldest beyond it)
        assert max(o["behind"] for o in reported) == SNAPSHOT_BACKLOG + 1
        assert all(o["waited_s"] > 0 for o in reported if o["behind"] > SNAPSHOT_BACKLOG)
        assert all(o["behind_bytes"] == o["behind"] * (4 * 2 + 2) * 4 for o in reported)
        assert all(e["payload"]["snapshot"]["write_s"] >= 0.5 for e in events)
        for step in range(1, 6):  # and every value is the one trained then
            restored = run.state_dict(step=step)
            assert all(torch.equal(restored[k], v) for k, v in live[step].items())
    rows = json.loads(invoke("snapshots", "--store", str(store), "--format", "json").stdout)
    assert [r["behind"] for r in rows if r["trigger"] == "step"] == [
        o["behind"] if o else 0 for o in overruns
    ]
    table = invoke("snapshots", "--store", str(store)).stdout
    overran = sum(1 for r in rows if r["behind"])  # the run-end snapshot may have been behind too
    assert (
        f"{overran} snapshots were due before earlier ones were stored" in table
        and "none was skipped" in table
    )
