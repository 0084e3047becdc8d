"""FSDP2 (``fully_shard``) on 2 CPU ranks (gloo): each rank snapshots its shards, restore
reassembles the full ``state_dict``, bitwise equal to the one torch gathers.

torch 2.13 runs FSDP2 on CPU with gloo, so this is the real thing, not a stand-in;
the GPU check (benchmarks/gpu_check.py) is not needed for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import EXAMPLES, assert_one_line_error, invoke
from launch_support import torchrun

pytestmark = pytest.mark.slow

SCRIPT = str(EXAMPLES / "train_fsdp.py")


@pytest.fixture(scope="module")
def fsdp_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One FSDP2 training of 3 steps, each rank recording into its own shard."""
    root = tmp_path_factory.mktemp("fsdp")
    torchrun(
        root,
        "run",
        "--store",
        str(root / "store"),
        "--shard",
        "--snapshot-every",
        "1",
        SCRIPT,
        "--steps",
        "3",
        "--save-full",
        str(root / "full"),
    )
    return root


def test_restore_equals_the_gathered_full_state_dict(fsdp_shards: Path) -> None:
    store = fsdp_shards / "store"
    assert invoke("combine", "--into", str(store)).exit_code == 0
    verified = invoke("verify", "--store", str(store))
    assert verified.exit_code == 0 and "2 stream(s): intact" in verified.stdout
    for step in (0, 2, 3):
        out = fsdp_shards / f"restored{step}.pt"
        result = invoke("restore", "--store", str(store), "--step", str(step), "-o", str(out))
        assert result.exit_code == 0, result.stderr
        restored = torch.load(out)
        gathered = torch.load(fsdp_shards / "full" / f"full_step{step}.pt")
        assert list(restored) == list(gathered)  # keys in order
        for key, value in gathered.items():
            assert restored[key].dtype == value.dtype and restored[key].shape == value.shape, key
            assert torch.equal(
                restored[key].view(torch.uint8), value.contiguous().view(torch.uint8)
            ), (step, key)


def test_each_rank_records_its_shard_and_where_it_lies(fsdp_shards: Path) -> None:
    store = fsdp_shards / "store"
    invoke("combine", "--into", str(store))
    for rank in (0, 1):
        [event] = [
            e
            for e in json.loads(
                invoke(
                    "events",
                    "--store",
                    str(store),
                    "--rank",
                    str(rank),
                    "--kind",
                    "snapshot_taken",
                    "--format",
                    "json",
                ).stdout
            )
            if e["step"] == 3 and e["payload"]["trigger"] == "step"
        ]
        shards = {t["tensor_id"]: t["shard"] for t in event["payload"]["snapshot"]["tensors"]}
        facts = [s for s in shards.values() if s["global_shape"] == [3, 16]]  # the uneven weight
        assert (
            facts and facts[0]["placements"] == ["Shard(dim=0)"] and facts[0]["mesh_shape"] == [2]
        )
        assert (facts[0]["coordinate"], facts[0]["offset"], facts[0]["local_shape"]) == (
            ([0], [0, 0], [2, 16]) if rank == 0 else ([1], [2, 0], [1, 16])
        )
    errors = invoke("events", "--store", str(store), "--kind", "recorder_error", "--format", "json")
    assert json.loads(errors.stdout) == []


def test_restore_says_why_it_cannot(fsdp_shards: Path) -> None:
    """Only rank 0's shard in the store: the missing half is named, nothing is guessed."""
    half = fsdp_shards / "half"
    [shard0] = [
        p for p in (fsdp_shards / "store" / "shards").iterdir() if p.name.split(".")[1] == "0"
    ]
    assert invoke("combine", "--into", str(half), str(shard0)).exit_code == 0
    result = invoke(
        "restore", "--store", str(half), "--step", "3", "-o", str(fsdp_shards / "half.pt")
    )
    assert_one_line_error(
        result, 1, "cannot reassemble 0.weight at step 3", "cover 64 of 128 elements"
    )
    assert not (fsdp_shards / "half.pt").exists()
