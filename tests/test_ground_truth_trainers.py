"""Real trainers, unmodified: the HF Trainer and Lightning record the numbers they used.

Both step with gradient accumulation and clipping; Lightning's automatic
optimization always calls ``optimizer.step(closure)`` (the closure runs the
training step, backward and clipping), the case the recorder got wrong before
(it recorded the previous step's gradients). They train where
``AUDITLOG_TEST_DEVICE`` says (the CPU here; the GPU on a device machine). The
truth is taken by the trainers' own callbacks at the moment the update reads the gradients: the HF
Trainer's ``on_pre_optimizer_step`` (after its clipping; its logged
``grad_norm`` is the norm before clipping), Lightning's
``configure_gradient_clipping`` around ``clip_gradients``.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from truth_support import DEVICE, Truth, compare, record

POLICIES = ("minimal", "audit", "debug")


def _total(norms: list[float | None]) -> float:
    return sum(n * n for n in norms if n is not None) ** 0.5


@pytest.mark.parametrize("policy", POLICIES)
def test_lightning_automatic_optimization_with_accumulation_and_clipping(
    tmp_path: Path, policy: str
) -> None:
    pl = pytest.importorskip("pytorch_lightning")

    class Module(pl.LightningModule):
        def __init__(self, truth: Truth) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
            self.truth = truth

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.truth.losses.append(
                loss.item() / 2
            )  # Lightning divides by accumulate_grad_batches
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            self.truth.optimizers.append(opt)
            return opt

        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
        ) -> None:
            self.truth.after_backward()  # inside the closure, after the last micro-batch's backward
            self.clip_gradients(
                optimizer,
                gradient_clip_val=gradient_clip_val,
                gradient_clip_algorithm=gradient_clip_algorithm,
            )
            self.truth.consumed()

        def on_train_batch_end(self, outputs: Any, batch: Any, index: int) -> None:
            self.truth.stepped()

    def scenario(truth: Truth) -> None:
        data = torch.utils.data.TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
        loader = torch.utils.data.DataLoader(data, batch_size=6)
        trainer = pl.Trainer(
            max_steps=4,
            accumulate_grad_batches=2,
            gradient_clip_val=0.05,
            accelerator="gpu" if DEVICE == "cuda" else "cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path / "pl"),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(truth), loader)

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    truth, run_id = record(tmp_path / "store", policy, scenario)
    assert len(truth.steps) == 4 and all(s.raw != s.used for s in truth.steps)  # every step clipped
    compare(tmp_path / "store", run_id, truth)


@pytest.mark.parametrize("policy", ("audit",))
def test_hf_trainer_with_accumulation_and_clipping(tmp_path: Path, policy: str) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    logged: list[dict[str, Any]] = []

    class Truthful(TrainerCallback):
        def __init__(self, truth: Truth) -> None:
            self.truth = truth

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not self.truth.optimizers:
                self.truth.optimizers.append(
                    kwargs["optimizer"].optimizer
                )  # accelerate's wrapper holds it
            self.truth.consumed()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.truth.stepped()

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if logs and "grad_norm" in logs:
                logged.append(dict(logs))

    def scenario(truth: Truth) -> None:
        transformers.set_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
        )
        ids = torch.randint(0, 64, (16, 8))
        data = [{"input_ids": row, "labels": row} for row in ids]
        args = TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            max_steps=4,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_grad_norm=0.05,
            logging_steps=1,
            report_to=[],
            use_cpu=DEVICE == "cpu",
            save_strategy="no",
            learning_rate=1e-3,
            disable_tqdm=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Trainer(model=model, args=args, train_dataset=data, callbacks=[Truthful(truth)]).train()

    logging.getLogger("transformers").setLevel(logging.ERROR)
    truth, run_id = record(tmp_path / "store", policy, scenario)
    assert len(truth.steps) == 4
    # No truth of our own for the raw gradients inside the Trainer: its logged grad_norm is
    # the total norm clip_grad_norm_ found before clipping.
    compare(tmp_path / "store", run_id, truth, check_raw=False, check_loss=False)
    import auditlog

    with auditlog.open(tmp_path / "store") as s:
        steps = s.query(
            "select step, sqrt(sum(raw_grad_norm * raw_grad_norm)) as raw, bool_and(grads_modified) as clipped "
            "from steps group by step order by step",
            run=run_id,
        )
        losses = s.query(
            "select origin, count(*) as n from metrics where name = 'loss' group by origin",
            run=run_id,
        )
    assert [r["clipped"] for r in steps] == [True] * 4
    assert len(logged) == 4
    for row, log in zip(steps, logged, strict=True):
        assert row["raw"] == pytest.approx(float(log["grad_norm"]), rel=1e-5)
        assert row["raw"] > _total(truth.steps[row["step"] - 1].used) * 2  # really clipped
    assert losses == [
        {"origin": "model_output", "n": 8}
    ]  # one per micro-batch, from the model's output


def test_lightning_manual_optimization(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning")

    class Manual(pl.LightningModule):
        def __init__(self, truth: Truth) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
            self.truth = truth

        def training_step(self, batch: Any, index: int) -> None:
            opt = self.optimizers()
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.truth.losses.append(loss.item())
            opt.zero_grad()
            self.manual_backward(loss)
            self.truth.after_backward()
            self.clip_gradients(opt, gradient_clip_val=0.05, gradient_clip_algorithm="norm")
            self.truth.consumed()
            opt.step()
            self.truth.stepped()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            opt = torch.optim.Adam(self.parameters(), lr=0.01)
            self.truth.optimizers.append(opt)
            return opt

    def scenario(truth: Truth) -> None:
        data = torch.utils.data.TensorDataset(torch.randn(24, 6), torch.randint(0, 3, (24,)))
        trainer = pl.Trainer(
            max_steps=3,
            accelerator="gpu" if DEVICE == "cuda" else "cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path / "pl"),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Manual(truth), torch.utils.data.DataLoader(data, batch_size=8))

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    truth, run_id = record(tmp_path / "store", "audit", scenario)
    assert len(truth.steps) == 3
    compare(tmp_path / "store", run_id, truth)


def test_accelerate_with_accumulation_and_clipping(tmp_path: Path) -> None:
    accelerate = pytest.importorskip("accelerate")

    def scenario(truth: Truth) -> None:
        accelerator = accelerate.Accelerator(cpu=DEVICE == "cpu", gradient_accumulation_steps=2)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        truth.optimizers.append(inner)
        data = torch.utils.data.TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,)))
        model, opt, loader = accelerator.prepare(
            model, inner, torch.utils.data.DataLoader(data, batch_size=4)
        )
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                truth.losses.append(loss.item() / 2)  # accelerate divides by the accumulation steps
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    truth.after_backward()
                    accelerator.clip_grad_norm_(model.parameters(), 0.05)
                    truth.consumed()
                opt.step()
                if accelerator.sync_gradients:
                    truth.stepped()
                opt.zero_grad()

    truth, run_id = record(tmp_path / "store", "audit", scenario)
    assert len(truth.steps) == 4
    compare(tmp_path / "store", run_id, truth)
