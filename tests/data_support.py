"""Datasets that know their own indices, the training loop that notes which
step consumed each batch, and a folder dataset shaped like ImageFolder: the
ground truth the data-capture tests (``test_data*.py``) compare the record with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import auditlog

Truth = list[tuple[int, list[int]]]


def indexed_tensors(n: int = 40, features: int = 4) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(n, features, generator=generator), torch.arange(n))


def train(loader: DataLoader[Any], run: Any, epochs: int = 1, accumulate: int = 1) -> Truth:
    """A plain loop; returns (the step that consumed it, its indices) per batch."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    truth: Truth = []
    window: list[list[int]] = []
    for _ in range(epochs):
        for i, (x, index) in enumerate(loader):
            window.append(index.tolist())
            model(x).pow(2).mean().backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
                truth += [(run.step, w) for w in window]
                window = []
    return truth


def events(store: Path, kind: str) -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return [e["payload"] for e in s.run().events() if e["kind"] == kind]


class Folder(Dataset[tuple[torch.Tensor, int]]):
    """ImageFolder's shape without torchvision: ``root``, ``samples`` of (path, class), ``imgs``."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.samples = [(str(p), int(p.parent.name)) for p in sorted(root.glob("*/*.bin"))]
        self.imgs = self.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data = Path(self.samples[index][0]).read_bytes()
        return torch.tensor(list(data[:4]), dtype=torch.float32), index


def write_folder(root: Path) -> Path:
    for cls in range(2):
        (root / str(cls)).mkdir(parents=True)
        for i in range(6):
            (root / str(cls) / f"{i}.bin").write_bytes(bytes([cls, i, 1, 2]) * 16)
    return root
