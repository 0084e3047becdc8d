"""``auditlog nonfinite``: the first NaN/Inf located from the record, or what to record next time."""

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


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class Sqrt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def log_model() -> nn.Sequential:
    """fc1 (frozen, output 1.0) -> log -> ... : finite until fc1's bias is planted negative."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(4, 8),
        Log(),  # BUILT_LOG
        nn.Linear(8, 8),
        nn.Tanh(),
        nn.Linear(8, 3),
    )
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(1.0)
    model[0].requires_grad_(False)
    return model


def train_log_model(steps: int = 10, plant_at: int = 7) -> list[float]:
    model = log_model()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    losses = []
    for step in range(steps):
        if step == plant_at:
            with torch.no_grad():
                model[0].bias.fill_(-1.0)  # log of a negative activation: NaN from here on
        loss = loss_fn(model(torch.randn(16, 4)), torch.randint(0, 3, (16,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def line_of(marker: str) -> int:
    text = Path(__file__).read_text().splitlines()
    return next(
        i for i, line in enumerate(text, 1) if line.rstrip().endswith(marker) and "def " not in line
    )


def finding(store: Path) -> dict[str, Any]:
    with auditlog.open(store) as s:
        return s.run().nonfinite().as_dict()


def test_forward_nan_names_its_producer_and_the_propagators(store: Path) -> None:
    with auditlog.record(store, policy="debug"):
        train_log_model()
    found = finding(store)
    assert found["found"] and found["decided"]
    assert (found["step"], found["phase"], found["producer_role"]) == (7, "forward", "module")
    producer = found["producer"]
    assert producer["module"] == "1" and producer["class"].endswith(".Log")
    assert producer["source"] == f"{__file__}:{line_of('# BUILT_LOG')}"
    assert producer["input_nonfinite"] == 0 and producer["nan"] > 0
    assert [p["module"] for p in found["propagators"]] == ["2", "3", "4", "(CrossEntropyLoss)"]
    assert [p["module"] for p in found["enclosing"]] == ["(Sequential)"]
    assert found["evidence"]["loss"] == 7 and found["evidence"]["gradients"] == 7

    shown = invoke("nonfinite", "--store", str(store))
    assert shown.exit_code == 0, shown.stderr
    assert (
        "step 7, forward: 1" in shown.stdout
        and "propagated by: 2, 3, 4, (CrossEntropyLoss)" in shown.stdout
    )
    assert (
        json.loads(invoke("nonfinite", "--store", str(store), "--format", "json").stdout) == found
    )


def test_backward_only_nan_is_located_in_backward(store: Path) -> None:
    with auditlog.record(store, policy="debug"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Sqrt(), nn.Linear(8, 3))  # BUILT_SQRT
        with torch.no_grad():
            model[0].weight.mul_(0.01)
            model[0].bias.fill_(1.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(8):
            if step == 5:
                with torch.no_grad():
                    model[0].bias.fill_(-100.0)  # ReLU gives exact zeros: sqrt'(0) is infinite
            out = model(torch.randn(16, 4))
            loss = nn.functional.cross_entropy(out, torch.randint(0, 3, (16,)))
            assert torch.isfinite(out).all()  # the forward stays finite
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 5:
                break
    found = finding(store)
    assert (found["step"], found["phase"]) == (5, "backward") and found["decided"]
    assert found["producer"]["module"] == "2" and found["producer"]["class"].endswith(".Sqrt")
    assert found["producer"]["source"] == f"{__file__}:{line_of('# BUILT_SQRT')}"
    assert "evidence" in found and "forward" not in found["evidence"]
    assert [p["module"] for p in found["propagators"]] == ["1"]  # ReLU's output gradient


def test_full_backward_hooks_name_the_module_whose_backward_made_it(store: Path) -> None:
    with auditlog.record(store, policy="debug", backward="full"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Sqrt(), nn.Linear(8, 3))
        with torch.no_grad():
            model[0].bias.fill_(-100.0)
        loss = nn.functional.cross_entropy(model(torch.randn(16, 4)), torch.randint(0, 3, (16,)))
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=0.01).step()
    found = finding(store)
    assert (found["step"], found["phase"], found["producer_role"]) == (0, "backward", "module")
    assert found["producer"]["module"] == "2" and found["producer"]["mechanism"] == "full"


class Functional(nn.Module):
    """NaN made by the parent's own code between two module calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.log(self.a(x) - 100.0))


def test_nan_from_code_between_modules_and_from_the_data(store: Path, tmp_path: Path) -> None:
    with auditlog.record(store, policy="debug"):
        model = Functional()
        model(torch.randn(2, 3)).sum().backward()
    found = finding(store)
    assert found["producer_role"] == "own_code" and found["producer"]["module"] == "(Functional)"
    assert [p["module"] for p in found["propagators"]] == ["b"]  # b was handed it
    other = tmp_path / "data"
    with auditlog.record(other, policy="debug"):
        model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        x = torch.randn(2, 3)
        x[0, 0] = float("nan")
        model(x).sum().backward()
    found = finding(other)
    assert found["producer_role"] == "input" and found["producer"]["module"] == "(Sequential)"
    assert "came from the data" in found["explanation"][0]


def test_a_clean_run_has_no_finding(store: Path) -> None:
    with auditlog.record(store, policy="debug"):
        train_log_model(steps=3, plant_at=99)
    found = finding(store)
    assert found["found"] is False and found["decided"] and "no NaN" in found["explanation"][0]


@pytest.mark.slow
def test_a_run_without_the_statistics_says_what_to_record(tmp_path: Path) -> None:
    script = tmp_path / "diverge.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            from torch import nn
            sys.path.insert(0, sys.argv[1])
            from test_nonfinite import train_log_model
            train_log_model()
            """
        )
    )
    store = tmp_path / "store"
    done = run_auditlog(
        "run", "--store", str(store), str(script), str(Path(__file__).parent), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    found = finding(store)
    assert found["found"] and not found["decided"] and found["step"] == 7
    assert found["producer"] is None
    assert found["next_time"] == f"auditlog run --policy debug {script} {Path(__file__).parent}"
    shown = invoke("nonfinite", "--store", str(store)).stdout
    assert (
        "no module activity at step 7" in shown
        and f"Record it next time with: {found['next_time']}" in shown
    )
    assert "activity_first = 8" in shown


def test_nonfinite_check_records_gradients_and_the_last_finite_state_on_the_same_step(
    store: Path,
) -> None:
    before: dict[str, torch.Tensor] = {}
    with auditlog.record(store, nonfinite_check=True, snapshot_final=False):
        model = log_model()
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        for step in range(9):
            if step == 7:
                with torch.no_grad():
                    model[0].bias.fill_(-1.0)
                before = {k: v.clone() for k, v in model.state_dict().items()}
            loss = loss_fn(model(torch.randn(16, 4)), torch.randint(0, 3, (16,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    with auditlog.open(store) as s:
        run = s.run()
        events = list(run.events(kinds=["nonfinite_found", "snapshot_taken"]))
        restored = run.state_dict(step=7)
        kinds = [(e["kind"], e["step"]) for e in events]
        activity_steps = sorted({e["step"] for e in run.events(kinds=["activity"])})
    assert kinds[0] == ("nonfinite_found", 7) and set(kinds[1:]) == {
        ("snapshot_taken", 7)
    }  # model, loss module
    caught = events[0]["payload"]
    assert caught["where"] == "loss" and caught["snapshot"] is True and caught["loss"] == "NaN"
    assert len(caught["gradients"]) == 4 and all(g["stats"]["nan"] > 0 for g in caught["gradients"])
    assert {e["payload"]["trigger"] for e in events[1:]} == {"last_finite"}
    assert restored.keys() == before.keys()
    assert all(
        torch.equal(restored[k], before[k]) for k in before
    )  # the values before the bad update
    assert 8 in activity_steps  # activity from the next step on


def test_keep_finite_state_keeps_the_parameters_before_an_exploding_update(store: Path) -> None:
    with auditlog.record(store, keep_finite_state=True, snapshot_final=False):
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(5):
            if step == 3:
                for group in opt.param_groups:
                    group["lr"] = 3e38  # finite gradients, an update that overflows float32
                good = {k: v.clone() for k, v in model.state_dict().items()}
            loss = model(torch.randn(4, 3)).pow(2).mean() * (1000.0 if step == 3 else 1.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with auditlog.open(store) as s:
        run = s.run()
        events = list(run.events(kinds=["nonfinite_found", "snapshot_taken"]))
        restored = run.state_dict(step=3)
        found = run.nonfinite().as_dict()
    assert [(e["kind"], e["step"]) for e in events] == [
        ("nonfinite_found", 3),
        ("snapshot_taken", 3),
    ]
    assert events[0]["payload"]["where"] == "parameters"
    assert all(torch.equal(restored[k], good[k]) for k in good)
    assert found["phase"] == "update" and found["step"] == 3, found


def test_forensic_options_leave_training_bitwise_identical(store: Path) -> None:
    """Loss hooks, FLOP counting, input checks, the pre-step check and the per-step copy change nothing."""
    from helpers import load_example

    mlp = load_example("train_mlp")

    def run() -> list[bytes]:
        torch.manual_seed(0)
        model = mlp.build_model()
        mlp.train(model, epochs=1, quiet=True)
        return [p.detach().numpy().tobytes() for p in model.parameters()]

    plain = run()
    rng = torch.get_rng_state()
    with auditlog.record(store, policy="debug", keep_finite_state=True):
        recorded = run()
        assert torch.equal(torch.get_rng_state(), rng)
    assert plain == recorded
    with auditlog.open(store) as s:
        kinds = {e["kind"] for e in s.run().events(kinds=["metrics", "flops"])}
    assert kinds == {"metrics", "flops"}
