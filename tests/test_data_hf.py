"""The HF Trainer, unmodified, on a ``datasets.Dataset`` built in memory: the dataset is
identified by its Hugging Face fingerprint, and every batch's indices and the step that
trained on them equal what the model was fed.

Ground truth: token 0 of row ``i`` is ``i``, and a forward pre-hook on the model
(the user's own hook, not the recorder's) reads the sample indices of every batch
the model actually trained on; a callback counts the optimizer steps, so each
forward belongs to the step after those completed. The Trainer shuffles with its
own sampler (Accelerate's ``SeedableRandomSampler`` inside a ``BatchSampler``),
accumulates two batches per step, and iterates through Accelerate's
``DataLoaderShard``, which fetches one batch ahead of the loop: the record must
still tie each batch to the step that trained on it.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from data_support import events

import auditlog


def test_hf_trainer_on_a_datasets_dataset_records_its_fingerprint_and_every_batch(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("accelerate")
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    transformers.set_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
    )
    ids = torch.randint(20, 64, (12, 8), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = torch.arange(12)
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    fed: list[tuple[int, list[int]]] = []
    steps = [0]
    fingerprints: list[str] = []

    class Truth(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            fingerprints.append(kwargs["train_dataloader"].dataset._fingerprint)

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps[0] += 1

    def fed_to_model(module: Any, args: Any, kwargs: Any) -> None:
        fed.append((steps[0] + 1, kwargs["input_ids"][:, 0].tolist()))

    model.register_forward_pre_hook(fed_to_model, with_kwargs=True)
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        num_train_epochs=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=100,
    )
    logging.getLogger("transformers").setLevel(logging.ERROR)
    store = tmp_path / "store"
    with auditlog.record(store), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(model=model, args=args, train_dataset=data, callbacks=[Truth()]).train()

    assert len(fed) == 12 and steps[0] == 6  # 2 epochs of 6 batches, 2 batches per step
    with auditlog.open(store) as s:
        rows = s.query("select step, epoch, indices from batches order by seq, batch")
    assert [(r["step"], r["indices"]) for r in rows] == fed
    assert [r["epoch"] for r in rows] == [0] * 6 + [1] * 6
    assert sorted(i for _, indices in fed[:6] for i in indices) == list(
        range(12)
    )  # a permutation per epoch
    assert fed[:6] != fed[6:] and [i for _, b in fed[:6] for i in b] != list(
        range(12)
    )  # really shuffled

    (seen,) = events(store, "dataset_seen")
    identity = seen["identity"]
    assert seen["class"] == "datasets.arrow_dataset.Dataset" and seen["length"] == 12
    assert identity["method"] == "hf_datasets" and identity["hf_fingerprint"] == fingerprints[0]
    assert (
        identity["rows"] == 12
        and identity["columns"] == ["input_ids", "labels"]
        and identity["fingerprint"]
    )
    config = events(store, "loader_started")[1]["config"]
    assert (
        config["sampler"] == "accelerate.data_loader.SeedableRandomSampler"
        and config["shuffle"] is True
    )
    assert (
        config["batch_size"] == 2 and config["sampler_seed"] == 42
    )  # the Trainer's seed, read at epoch 1
