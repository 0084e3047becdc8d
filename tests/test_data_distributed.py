"""``DistributedSampler`` on 2 gloo ranks under ``torchrun``: each rank's record of its
batches equals what that rank's sampler yielded, and ``auditlog data --sample`` names
the rank (and step) that trained on a sample; and an ``IterableDataset`` on 2 ranks:
``--batch-hash`` names the ranks that trained on a batch.

The script is an ordinary DDP loop, unaware of the recorder; it takes its own
ground truth: the dataset returns each sample's index beside it, so the script
knows the indices of every batch and the optimizer step (its own count) that
consumed them, and it checks those against the sampler's permutation for the
epoch (``list(sampler)`` draws from the sampler's own seeded generator, never
from the global RNG). Each rank writes its truth to a JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import invoke
from launch_support import torchrun

pytestmark = pytest.mark.slow

SCRIPT = """
import json, sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
data = TensorDataset(torch.randn(22, 4, generator=torch.Generator().manual_seed(3)), torch.arange(22))
sampler = DistributedSampler(data, shuffle=True, seed=7)  # 11 samples per rank
loader = DataLoader(data, batch_size=3, sampler=sampler)
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 0
truth = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    permutation = list(sampler)  # what the sampler yields this epoch (its own generator)
    drawn = []
    for x, index in loader:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        steps += 1
        truth.append([rank, steps, index.tolist()])
        drawn += index.tolist()
    assert drawn == permutation, (drawn, permutation)
with open(sys.argv[1] + f".{rank}.json", "w") as f:
    json.dump(truth, f)
dist.destroy_process_group()
"""


def _cli(*args: str) -> Any:
    result = invoke(*args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_each_rank_records_the_indices_its_distributed_sampler_yielded(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    store = str(tmp_path / "store")
    torchrun(tmp_path, "run", "--store", store, str(script), str(tmp_path / "truth"))
    truth = [
        (row[0], row[1], row[2])
        for rank in (0, 1)
        for row in json.loads((tmp_path / f"truth.{rank}.json").read_text())
    ]
    assert len(truth) == 2 * 2 * 4  # 2 ranks, 2 epochs, 4 batches of 11 samples each

    rows = _cli(
        "query",
        "--store",
        store,
        "select rank, step, indices from batches order by rank, seq, batch",
    )
    assert [(r["rank"], r["step"], r["indices"]) for r in rows] == truth
    # The two ranks' shards of one epoch are disjoint and together cover the dataset.
    first = [
        set(i for rank, step, indices in truth if rank == r and step <= 4 for i in indices)
        for r in (0, 1)
    ]
    assert not first[0] & first[1] and len(first[0] | first[1]) == 22
    started = _cli("events", "--store", store, "--kind", "loader_started")
    states = sorted(
        (
            e["payload"]["config"]["sampler_state"]["rank"],
            e["payload"]["epoch"],
            e["payload"]["config"]["sampler_state"]["epoch"],
        )
        for e in started
    )
    assert states == [(0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 1)]

    for sample in (0, 5, 21):
        expected = [
            {"rank": rank, "step": step} for rank, step, indices in truth if sample in indices
        ]
        answer = _cli("data", "--store", store, "--sample", str(sample))
        assert answer["trained_steps"] == expected and answer["drawn"] == 2  # once per epoch
        text = (
            invoke("data", "--store", store, "--sample", str(sample))
            .stdout.strip()
            .splitlines()[-1]
        )
        where = ", ".join(f"step {e['step']} (rank {e['rank']})" for e in expected)
        assert text == f"sample {sample} was drawn 2 times; trained at {where}"
    summary = _cli("data", "--store", store)
    assert [
        (d["rank"], d["samples_drawn"], d["distinct_samples"]) for d in summary["datasets"]
    ] == [
        (0, 22, len({i for rank, _, indices in truth if rank == 0 for i in indices})),
        (1, 22, len({i for rank, _, indices in truth if rank == 1 for i in indices})),
    ]


ITERABLE_SCRIPT = '''
import json, sys
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset
import auditlog

dist.init_process_group("gloo")
rank = dist.get_rank()

class Shard(IterableDataset):
    """Each rank's stream: one batch every rank yields, then two of its own."""
    def __iter__(self):
        yield {"x": torch.ones(2, 4)}
        for i in range(2):
            yield {"x": torch.full((2, 4), float(10 * rank + i + 2))}

torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, truth = 0, []
for batch in DataLoader(Shard(), batch_size=None):
    model(batch["x"]).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    steps += 1
    truth.append([rank, steps, auditlog.batch_hash(batch)])
with open(sys.argv[1] + f".{rank}.json", "w") as f:
    json.dump(truth, f)
dist.destroy_process_group()
'''


def test_batch_hash_names_the_ranks_that_trained_on_a_batch_of_an_iterable_dataset(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(ITERABLE_SCRIPT)
    store = str(tmp_path / "store")
    torchrun(tmp_path, "run", "--store", store, str(script), str(tmp_path / "truth"))
    truth = [
        tuple(row)
        for rank in (0, 1)
        for row in json.loads((tmp_path / f"truth.{rank}.json").read_text())
    ]
    rows = _cli(
        "query", "--store", store, "select rank, step, hash from batches order by rank, seq, batch"
    )
    assert [(r["rank"], r["step"], r["hash"]) for r in rows] == truth
    common, own = truth[0][2], truth[4][2]  # every rank's first batch; rank 1's second
    assert truth[3][2] == common
    text = invoke("data", "--store", store, "--batch-hash", common).stdout.strip().splitlines()[-1]
    assert (
        text
        == f"batch {common[:16]} was drawn 2 times; trained at step 1 (rank 0), step 1 (rank 1)"
    )
    text = invoke("data", "--store", store, "--batch-hash", own).stdout.strip().splitlines()[-1]
    assert text == f"batch {own[:16]} was drawn 1 time; trained at step 2 (rank 1)"
