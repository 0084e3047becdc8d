"""Metrics: the loss recorded with no code change, auditlog.log, the metrics view and command, FLOPs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke, run_auditlog
from torch import nn

import auditlog
from auditlog.core.errors import AuditlogError


def metric_rows(store: Path, run: str = "latest") -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return s.query(
            "select step, name, value, origin, module from metrics order by seq, position", run=run
        )


CROSS_ENTROPY_SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn
    import auditlog

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(12):
        x = torch.randn(32, 6)
        y = torch.randint(0, 3, (32,))
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("loss", step, repr(loss.item()))
        if step % 4 == 3:
            with torch.no_grad():
                acc = (model(x).argmax(1) == y).float().mean().item()
            auditlog.log(step=step, acc=acc)  # under auditlog run: the current recording
            print("acc", step, repr(acc))
    """
)


@pytest.mark.slow
def test_cross_entropy_loss_and_logged_accuracy_are_recorded_unchanged(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CROSS_ENTROPY_SCRIPT)
    store = tmp_path / "store"
    done = run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed: dict[str, dict[int, float]] = {"loss": {}, "acc": {}}
    for line in done.stdout.splitlines():
        name, step, value = line.split()
        printed[name][int(step)] = float(value)
    rows = metric_rows(store)
    losses = {r["step"]: r["value"] for r in rows if r["name"] == "loss"}
    assert losses == printed["loss"]  # exactly the numbers the script printed, every step
    assert all(
        r["origin"] == "loss_module" and r["module"] == "(CrossEntropyLoss)"
        for r in rows
        if r["name"] == "loss"
    )
    accs = {r["step"]: r["value"] for r in rows if r["name"] == "acc"}
    assert accs == printed["acc"] and len(accs) == 3
    # the eval forward under no_grad was not a training loss, and was not a loss at all (no loss module call)
    assert {r["name"] for r in rows} == {"loss", "acc"}

    table = invoke("metrics", "--store", str(store), "--format", "json")
    assert table.exit_code == 0, table.stderr
    by_step = {r["step"]: r for r in json.loads(table.stdout)}
    assert by_step[3]["acc"] == printed["acc"][3] and by_step[0]["loss"] == printed["loss"][0]
    assert by_step[0]["lr"] == 0.01 and by_step[0]["grad_norm"] > 0
    csv_out = invoke("metrics", "--store", str(store), "--format", "csv")
    assert (
        csv_out.stdout.splitlines()[0] == "step,loss,acc,lr,grad_norm,raw_grad_norm,nonfinite_grads"
    )
    assert len(csv_out.stdout.splitlines()) == 1 + 12


def test_hugging_face_model_output_loss_is_recorded(store: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers is in the test extra")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16)
    printed = []
    with auditlog.record(store):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(4):
            ids = torch.randint(0, 97, (2, 12))
            out = model(input_ids=ids, labels=ids)  # the loss is computed inside, from labels
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            printed.append(out.loss.item())
    rows = [r for r in metric_rows(store) if r["name"] == "loss"]
    assert [r["value"] for r in rows] == printed
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert {r["origin"] for r in rows} == {"model_output"} and {r["module"] for r in rows} == {
        "(GPT2LMHeadModel)"
    }


class LossInside(nn.Module):
    """A model that calls a loss module inside its forward and returns it in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)
        self.criterion = nn.MSELoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.fc(x)
        return {"out": out, "loss": self.criterion(out, y)}


def test_a_loss_seen_twice_is_recorded_once_and_eval_losses_are_named(store: Path) -> None:
    with auditlog.record(store, policy="minimal"):
        model = LossInside()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            result = model(torch.randn(4, 3), torch.randn(4, 1))
            opt.zero_grad()
            result["loss"].backward()
            opt.step()
        with torch.no_grad():
            evaluation = model(torch.randn(4, 3), torch.randn(4, 1))["loss"].item()
    rows = metric_rows(store)
    assert [(r["step"], r["name"], r["origin"]) for r in rows] == [
        (0, "loss", "loss_module"),
        (1, "loss", "loss_module"),
        (2, "loss", "loss_module"),
        (3, "eval_loss", "loss_module"),
    ]
    assert rows[-1]["value"] == evaluation and rows[0]["module"] == "criterion"


def test_log_checks_its_values_and_is_a_no_op_without_a_recording(store: Path) -> None:
    auditlog.log(acc=0.5)  # nothing active: checked, then nothing
    with pytest.raises(AuditlogError, match="at least one metric"):
        auditlog.log()
    with auditlog.record(store) as run:
        with pytest.raises(AuditlogError, match=r"log\(name=...\)"):
            run.log(name="text")
        with pytest.raises(AuditlogError, match="one real number"):
            run.log(vec=torch.ones(3))
        with pytest.raises(AuditlogError, match="step"):
            run.log(step=-1, acc=1.0)
        run.log(acc=torch.tensor(0.25), nan=float("nan"), count=3, flag=True)
        auditlog.log(step=9, top5=0.75)
    rows = metric_rows(store)
    values = {r["name"]: r["value"] for r in rows}
    assert (
        values["acc"] == 0.25
        and values["count"] == 3
        and values["flag"] == 1
        and values["top5"] == 0.75
    )
    assert values["nan"] != values["nan"]  # NaN survives the record
    assert next(r["step"] for r in rows if r["name"] == "top5") == 9
    assert {r["origin"] for r in rows} == {"user"}


def test_loss_capture_can_be_turned_off(store: Path) -> None:
    with auditlog.record(store, loss=False):
        model = nn.Linear(2, 1)
        nn.MSELoss()(model(torch.randn(3, 2)), torch.zeros(3, 1)).backward()
    assert metric_rows(store) == []


def test_flops_of_one_step_match_torch_flop_counter(store: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))

    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    expected_model = build()
    with FlopCounterMode(display=False) as counter:
        expected_model(x)  # the forward is measured; the backward is estimated as 2 x forward
    with auditlog.record(store):
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with auditlog.open(store) as s:
        events = list(s.run().events(kinds=["flops"]))
    assert len(events) == 1
    payload = events[0]["payload"]
    assert payload["forward_flops"] == counter.get_total_flops() > 0
    assert payload["flops"] == 3 * payload["forward_flops"]
    assert payload["closed_by"] == "forward" and payload["forwards"] == 1 and events[0]["step"] == 0
    assert "aten.convolution" in payload["by_operator"]


def test_the_recorders_own_statistics_stay_outside_the_counted_forward(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``debug`` every module call's statistics run during the counted first
    forward; they are not the model's operations: the counting mode sees the model's
    ops only (each op it sees costs ~70 us of Python dispatch), and counts the same."""
    from auditlog.capture import flops, torch_compat

    seen: list[str] = []

    def watching_mode() -> Any:
        mode = torch_compat.flop_counting_mode()
        counting = type(mode).__torch_dispatch__

        def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(str(func._overloadpacket))
            return counting(self, func, types, args, kwargs)

        monkeypatch.setattr(type(mode), "__torch_dispatch__", dispatch)
        return mode

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))

    x = torch.randn(16, 8)
    plain = build()
    with (
        watching_mode()
    ):  # the model's own forward ops (autograd's detach of a saved output included)
        plain(x)
    model_ops, seen[:] = list(seen), []
    monkeypatch.setattr(flops, "flop_counting_mode", watching_mode)
    with auditlog.record(store, policy="debug"):
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(x).pow(2).mean().backward()
        opt.step()
    with auditlog.open(store) as s:
        run = s.run()
        (event,) = list(run.events(kinds=["flops"]))
        activity = [e for e in run.events(kinds=["activity"]) if e["step"] == 0]
    assert "aten.addmm" in model_ops and seen == model_ops
    assert event["payload"]["forward_flops"] == 2 * 16 * (8 * 8 + 8 * 4)
    assert (
        len(activity[0]["payload"]["forward"]) == 4
    )  # and every call's statistics were still taken


def test_flop_counting_never_pops_a_mode_the_user_entered_inside_it(store: Path) -> None:
    """A mode the user enters inside the measured forward stays theirs: ours is left at
    the next chance (run end here), never popped over theirs; and ours is never open
    across the user's own code (it would keep parameters from being swapped)."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return func(*args, **(kwargs or {}))

    class EntersAMode(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.mode: Passthrough | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.mode = Passthrough()
            self.mode.__enter__()  # left open past the forward: ours cannot close under it
            return self.fc(x)

    with auditlog.record(store):
        model = EntersAMode()
        out = model(torch.randn(3, 4))
        assert _get_current_dispatch_mode() is model.mode
        assert model.mode is not None
        model.mode.__exit__(None, None, None)
        out.sum().backward()
        # the user's mode is gone: ours is closed at the end of the recording
    assert _get_current_dispatch_mode() is None
    with auditlog.open(store) as s:
        (event,) = list(s.run().events(kinds=["flops"]))
    assert event["payload"]["closed_by"] == "run_end" and event["payload"]["forward_flops"] > 0


def test_flop_counting_leaves_nothing_open_across_user_code(store: Path) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with auditlog.record(store):
        model = nn.Linear(4, 2)
        loss = model(torch.randn(3, 4)).sum()
        assert _get_current_dispatch_mode() is None  # the measured forward is over
        loss.backward()
    with auditlog.open(store) as s:
        (event,) = list(s.run().events(kinds=["flops"]))
    assert event["payload"]["closed_by"] == "forward"


def test_a_loss_computed_by_a_function_is_recorded_and_no_loss_is_said(
    store: Path, tmp_path: Path
) -> None:
    """``F.mse_loss``: the scalar backward() starts from is the loss; a run that trained on no
    scalar says so in ``metrics``, ``nonfinite`` and ``plot loss`` (which fails)."""
    with auditlog.record(store, name="function"):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.zeros(8, 1))
            losses.append(loss.item())
            loss.backward()
            opt.step()
    rows = metric_rows(store)
    assert [(r["step"], r["name"], r["origin"]) for r in rows] == [
        (i, "loss", "backward") for i in range(3)
    ]
    assert [r["value"] for r in rows] == pytest.approx(losses, rel=1e-7)
    assert (
        invoke(
            "plot", "--store", str(store), "latest", "loss", "-o", str(tmp_path / "l.png")
        ).exit_code
        == 0
    )

    with auditlog.record(store, name="no loss"):
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = model(torch.randn(8, 4))
        out.backward(torch.ones_like(out))  # not a scalar: nothing says what the loss was
        opt.step()
    shown = invoke("metrics", "--store", str(store), "latest")
    assert shown.exit_code == 0 and "loss" not in shown.stdout.splitlines()[0]
    assert "no loss was recorded" in shown.stderr and "auditlog.log(loss=...)" in shown.stderr
    found = invoke("nonfinite", "--store", str(store), "latest")
    assert found.exit_code == 0 and "no loss was recorded" in found.stdout
    target = tmp_path / "none.png"
    refused = invoke("plot", "--store", str(store), "latest", "loss", "-o", str(target))
    assert refused.exit_code == 1 and not target.exists()
    assert refused.stderr.startswith("Error: run ") and "recorded no loss" in refused.stderr
    assert (
        "auditlog.log(loss=...)" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    )
