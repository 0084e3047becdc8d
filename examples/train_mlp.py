"""Train an MLP classifier on a synthetic, seeded data set (no downloads).

python examples/train_mlp.py --epochs 2
auditlog run examples/train_mlp.py --epochs 2
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class MLP(nn.Module):
    """A small residual-free MLP: Linear -> LayerNorm -> GELU blocks, then a head."""

    def __init__(
        self, features: int = 20, hidden: int = 64, depth: int = 3, classes: int = 4
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.body(x)))


def make_data(
    n: int = 512, features: int = 20, classes: int = 4, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs, one per class, from a private generator (the global RNG is untouched)."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=gen) * 2
    labels = torch.randint(0, classes, (n,), generator=gen)
    points = centers[labels] + torch.randn(n, features, generator=gen)
    return points, labels


def build_model() -> nn.Module:
    return MLP()


def train(
    model: nn.Module, epochs: int = 2, batch_size: int = 64, lr: float = 1e-3, quiet: bool = False
) -> list[float]:
    x, y = make_data()
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
        losses.append(total / len(dataset))
        if not quiet:
            print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}")
    return losses


def main(argv: list[str] | None = None) -> nn.Module:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save", default=None, help="write the final state_dict here (torch.save)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = build_model()
    train(model, epochs=args.epochs, lr=args.lr)
    if args.save:
        torch.save(model.state_dict(), args.save)
    return model


if __name__ == "__main__":
    main()
