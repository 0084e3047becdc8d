"""A small DistributedDataParallel training on CPU (gloo), for torchrun.

    torchrun --nproc_per_node=2 --no-python auditlog run examples/train_ddp.py --steps 5
    torchrun --nproc_per_node=2 -m auditlog run examples/train_ddp.py

Every rank trains the same model on its own batches; DDP averages the gradients,
so the ranks' weights stay identical. The loss is annotated each step
(``rank_steps.loss``) when recorded. ``--kill-rank``/``--fail-rank`` make a rank
die (SIGKILL) or raise, to see how the record tells which rank it was;
``--fail-restart`` limits the failure to one torchrun restart (elastic runs).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import auditlog


def init_process_group(restart: int) -> None:
    """``init_process_group("gloo")``, with a store prefix per torchrun restart.

    torchrun keeps its TCP store across elastic restarts, and gloo finds its peers
    through keys in it (torch 2.13): a restarted worker could read the address of
    a peer that died in the previous attempt and give up ("Connection refused").
    A prefix per restart gives every attempt keys of its own.
    """
    if restart == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo")
        return
    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=60),
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"restart{restart}", store),  # type: ignore[attr-defined]
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--kill-rank", type=int, default=None, help="this rank kills itself (SIGKILL)"
    )
    parser.add_argument("--fail-rank", type=int, default=None, help="this rank raises an exception")
    parser.add_argument(
        "--at-step", type=int, default=3, help="when --kill-rank/--fail-rank strike"
    )
    parser.add_argument(
        "--fail-restart", type=int, default=None, help="fail only in this torchrun restart"
    )
    args = parser.parse_args()

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    init_process_group(restart)
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    for step in range(args.steps):
        if step == args.at_step and args.fail_restart in (None, restart):
            if rank == args.kill_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == args.fail_rank:
                raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
        x = torch.randn(32, 8, generator=data)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recording = auditlog.current()
        if recording is not None:
            recording.annotate("loss", value=loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
