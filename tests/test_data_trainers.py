"""Which samples each step consumed, behind trainers that read batches ahead of their loop
(capture/readahead.py): PyTorch Lightning and Hugging Face Accelerate.

Ground truth comes from inside the training step: each map-style dataset returns its
own sample index beside the sample, and each iterable one is hashed with the public
``auditlog.batch_hash``, so the script knows exactly which batch every step received;
the step it trains is the optimizer steps completed then, plus one. The sampler also
writes down what it yielded: the record must equal both.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import auditlog


def events(store: Path, kind: str) -> list[dict[str, Any]]:
    """The payloads of the run's events of ``kind``, in order."""
    with auditlog.open(store) as s:
        return [e["payload"] for e in s.run().events() if e["kind"] == kind]


Truth = list[tuple[int, Any]]  # (the step that trained on it, its indices or its hash) per batch


class Indexed(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int = 24) -> None:
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(5))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], i


class Unsized(torch.utils.data.Sampler[int]):
    """A seeded permutation per epoch, without ``__len__`` (so Lightning prefetches), that
    writes down every index it yields."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.generator, self.yielded = n, torch.Generator().manual_seed(seed), []

    def __iter__(self) -> Any:
        for i in torch.randperm(self.n, generator=self.generator).tolist():
            self.yielded.append(i)
            yield i


class Stream(IterableDataset[dict[str, torch.Tensor]]):
    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(9)
        for i in range(20):
            yield {"x": torch.randn(4, generator=g), "i": torch.tensor(i)}


def recorded(store: Path) -> Truth:
    """(the step that trained on it, its indices or hash) per recorded batch that trained one."""
    out: Truth = []
    for p in events(store, "batches"):
        if p.get("iterable"):
            out += [(s + 1, h) for s, h in zip(p["steps"], p["hashes"], strict=True)]
            continue
        flat = iter(p["indices"])
        out += [
            (s + 1, [next(flat) for _ in range(n)])
            for s, n in zip(p["steps"], p["sizes"], strict=True)
        ]
    return out


# ---------------------------------------------------------------------------------- Lightning
def _lightning(store: Path, tmp_path: Path, loader: DataLoader[Any], key: Any) -> Truth:
    pl = pytest.importorskip("pytorch_lightning")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)
            self.truth: Truth = []

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            # global_step: optimizer steps completed; this batch trains the next one
            self.truth.append((self.trainer.global_step + 1, key(batch)))
            x = batch["x"] if isinstance(batch, dict) else batch[0]
            return self.net(x).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    module = Module()
    trainer = pl.Trainer(
        max_epochs=2,
        accumulate_grad_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path / "pl"),
    )
    with auditlog.record(store), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return module.truth


def _indices(batch: Any) -> list[int]:
    return [int(i) for i in batch[1]]


def test_lightning_prefetching_an_unsized_loader_ties_each_batch_to_its_step(
    store: Path, tmp_path: Path
) -> None:
    sampler = Unsized(24, seed=3)
    truth = _lightning(
        store, tmp_path, DataLoader(Indexed(), batch_size=4, sampler=sampler), _indices
    )
    assert len(truth) == 12 and truth[-1][0] == 6  # 2 epochs of 6 batches, 2 batches a step
    assert [i for _, indices in truth for i in indices] == sampler.yielded
    assert recorded(store) == truth


def test_lightning_sized_loader_shuffled(store: Path, tmp_path: Path) -> None:
    loader = DataLoader(
        Indexed(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(4)
    )
    truth = _lightning(store, tmp_path, loader, _indices)
    assert len(truth) == 12 and recorded(store) == truth


def test_lightning_iterable_dataset_batches_hashed_and_tied_to_their_step(
    store: Path, tmp_path: Path
) -> None:
    truth = _lightning(store, tmp_path, DataLoader(Stream(), batch_size=4), auditlog.batch_hash)
    assert len(truth) == 10 and len({h for _, h in truth}) == 5  # the same five batches each epoch
    assert recorded(store) == truth


# --------------------------------------------------------------------------------- Accelerate
def _accelerate(store: Path, loader: DataLoader[Any], key: Any, expect: str) -> Truth:
    accelerate = pytest.importorskip("accelerate")
    truth: Truth = []
    with auditlog.record(store):
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
        model, opt, prepared = accelerator.prepare(
            nn.Linear(4, 1), torch.optim.SGD(nn.Linear(4, 1).parameters()), loader
        )
        assert type(prepared).__name__ == expect
        opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.05))
        steps = 0  # optimizer steps that updated (accelerate skips the others)
        for _ in range(2):
            for batch in prepared:
                truth.append((steps + 1, key(batch)))
                with accelerator.accumulate(model):
                    x = batch["x"] if isinstance(batch, dict) else batch[0]
                    accelerator.backward(model(x).pow(2).mean())
                    opt.step()
                    steps += int(accelerator.sync_gradients)
                    opt.zero_grad()
    return truth


def test_accelerate_prepared_loader_ties_each_batch_to_its_step(store: Path) -> None:
    sampler = Unsized(24, seed=6)
    truth = _accelerate(
        store, DataLoader(Indexed(), batch_size=4, sampler=sampler), _indices, "DataLoaderShard"
    )
    assert len(truth) == 12 and [i for _, indices in truth for i in indices] == sampler.yielded
    assert recorded(store) == truth


def test_accelerate_dispatched_iterable_dataset_batches_hashed_and_tied_to_their_step(
    store: Path,
) -> None:
    truth = _accelerate(
        store, DataLoader(Stream(), batch_size=4), auditlog.batch_hash, "DataLoaderDispatcher"
    )
    assert len(truth) == 10 and recorded(store) == truth
