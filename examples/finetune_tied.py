"""A tiny causal language model with tied embeddings, fine-tuned with a new head.

Shows what the record keeps when a model changes after construction: the output
projection shares its weight with the token embedding (one tensor, two names),
and after pre-training a classification head replaces the LM head while the
lower layers are frozen.

    auditlog run examples/finetune_tied.py --steps 10
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, 16, dim))
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied weights
        self.register_buffer(
            "causal", nn.Transformer.generate_square_subsequent_mask(16), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:, :n]
        h = self.encoder(h, mask=self.causal[:n, :n], is_causal=True)
        return self.lm_head(self.norm(h))


def batches(steps: int, vocab: int = 50, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (8, 16), generator=gen) for _ in range(steps)]


def pretrain(model: TinyLM, steps: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for tokens in batches(steps):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()


def finetune(model: TinyLM, steps: int, classes: int = 3) -> None:
    model.lm_head = nn.Linear(model.norm.normalized_shape[0], classes)  # new head
    for p in model.embed.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for tokens in batches(steps, seed=1):
        labels = tokens[:, 0] % classes
        loss = nn.functional.cross_entropy(model(tokens)[:, -1], labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main(argv: list[str] | None = None) -> nn.Module:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = TinyLM()
    pretrain(model, args.steps)
    finetune(model, args.steps)
    if args.save:
        torch.save(model.state_dict(), args.save)
    return model


if __name__ == "__main__":
    main()
