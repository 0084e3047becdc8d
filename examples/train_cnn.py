"""Train a small CNN with BatchNorm and in-place ReLU on synthetic 16x16 images.

auditlog run examples/train_cnn.py --epochs 2
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def make_data(n: int = 256, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class decides where a bright square sits, plus noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=gen)
    images = torch.randn(n, 1, 16, 16, generator=gen) * 0.3
    for i, label in enumerate(labels.tolist()):
        row = 2 + 4 * label
        images[i, 0, row : row + 4, 4:8] += 2.0
    return images, labels


def build_model() -> nn.Module:
    return SmallCNN()


def train(model: nn.Module, epochs: int = 2, lr: float = 0.05, quiet: bool = False) -> list[float]:
    x, y = make_data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for epoch in range(epochs):
        model.train()
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
        losses.append(total / len(x))
        if not quiet:
            print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}")
    return losses


def main(argv: list[str] | None = None) -> nn.Module:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="write the final state_dict here (torch.save)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = build_model()
    train(model, epochs=args.epochs)
    if args.save:
        torch.save(model.state_dict(), args.save)
    return model


if __name__ == "__main__":
    main()
