"""A small FSDP2 (``fully_shard``) training on CPU (gloo), for torchrun.

    torchrun --nproc_per_node=2 --no-python auditlog run --snapshot-every 1 examples/train_fsdp.py

Every parameter becomes a DTensor sharded over the ranks (``Shard(0)``); each
rank's recording stores only its shard, and ``auditlog restore`` reassembles
the full ``state_dict``. ``--save-full DIR`` writes the full state dict that
torch gathers (``get_model_state_dict(full_state_dict=True)``) before training
and after every step, to compare with what ``auditlog restore --step N`` rebuilds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def save_full(model: nn.Module, directory: Path | None, step: int) -> None:
    """The full state dict gathered by torch (a collective: every rank calls it), saved by rank 0."""
    if directory is None:
        return
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(full, directory / f"full_step{step}.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--save-full", type=Path, default=None, metavar="DIR")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))  # 3 rows: uneven shards
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 + dist.get_rank())
    save_full(model, args.save_full, 0)
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 8, generator=data)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        save_full(model, args.save_full, step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
