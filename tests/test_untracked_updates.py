"""Parameter updates no optimizer step hook saw are said so in the record, never left out silently.

An optimizer step inside ``torch.compile`` (PyTorch's own recipe for a faster step)
runs with its hooks traced away, and a hand-written update has none: the record of
such a run used to hold no ``optimizer_step`` event at all and look complete. Now the
first backward after such an update records ``untracked_updates`` (and warns once),
and run end records the totals. Training that steps through ``Optimizer.step`` —
gradient accumulation, a skipped GradScaler step, a second optimizer that starts
later, a closure — records none.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke
from torch import nn

import auditlog
from auditlog.core.packed import unpack_ints
from auditlog.store.eventstore import EventStore


def _events(store: Path) -> list[tuple[str, int | None, Any]]:
    """``(kind, tensor_id, payload)`` of every stored event."""
    events = EventStore.open(str(store))
    try:
        return [
            (row["kind"], row["tensor_id"], json.loads(row["payload"]))
            for run_id in events.recorded_run_ids()
            for row in events.iter_events(run_id)
        ]
    finally:
        events.engine.dispose()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def compiled_step(model: nn.Module, iterations: int) -> None:
    """PyTorch's recipe for a compiled optimizer step (backend ``eager``: dynamo's tracing
    without a compiler). Dynamo is reset first: past its recompile limit (each call here
    makes a new optimizer to guard on) it would run the step eagerly, hooks and all."""
    torch._dynamo.reset()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    @torch.compile(backend="eager")
    def step() -> None:
        opt.step()

    for i in range(iterations):
        x, y = _batch(i)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        step()


def by_hand(model: nn.Module, iterations: int) -> None:
    for i in range(iterations):
        x, y = _batch(i)
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad  # type: ignore[operator]


def _train(
    store: Path, loop: Callable[[nn.Module, int], None], iterations: int, policy: str = "audit"
) -> nn.Module:
    model = _model()
    with auditlog.record(store, policy=policy):
        loop(model, iterations)
    return model


def recorded_and_bare(store: str, loop_name: str, policy: str) -> tuple[bool, list[str]]:
    """Train recorded and bare: are the parameters bitwise equal, and the warnings of ours."""
    loop = globals()[loop_name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorded = _train(Path(store), loop, 5, policy)
    bare = _model()
    loop(bare, 5)
    same = all(
        torch.equal(a, b) for a, b in zip(recorded.parameters(), bare.parameters(), strict=True)
    )
    return same, [str(w.message) for w in caught if "untracked_updates" in str(w.message)]


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_untracked_updates import recorded_and_bare
print(json.dumps(recorded_and_bare(*sys.argv[2:])))
"""


@pytest.mark.parametrize("policy", ["minimal", "audit", "debug"])
@pytest.mark.parametrize("loop", ["compiled_step", "by_hand"])
def test_updates_no_step_hook_saw_are_recorded_and_warned_once(
    tmp_path: Path, loop: str, policy: str
) -> None:
    store = str(tmp_path / "store")
    if loop == "compiled_step":
        # In a process of its own: dynamo's first compile patches nn.Module.__init__ for the
        # rest of the process, which other tests of this worker must not inherit.
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(Path(__file__).parent), store, loop, policy],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        same, messages = json.loads(child.stdout.strip().splitlines()[-1])
    else:
        same, messages = recorded_and_bare(store, loop, policy)
    assert same  # the recording changed nothing the program computed
    events = _events(tmp_path / "store")
    assert not [e for e in events if e[0] == "optimizer_step"]  # none was seen: none is made up
    found = [payload for kind, _, payload in events if kind == "untracked_updates"]
    assert len(found) == 2, found
    first, last = found
    # the first finding: after the second backward, every parameter changed (4 of them)
    assert first["detected_at"] == "backward" and first["backwards"] == 1
    assert first["first_step"] == 0
    ids = unpack_ints(first["tensor_ids"])
    registered = {tensor_id for kind, tensor_id, _ in events if kind == "parameter_registered"}
    assert len(ids) == 4 and set(ids) == registered, (ids, registered)
    # at run end: the totals (backwards 2 to 5 each found the updates of the one before)
    assert last == {**last, "detected_at": "run_end", "backwards": 4, "first_step": 0}
    assert len(messages) == 1 and "4 parameter(s) changed" in messages[0]


def _accumulation(model: nn.Module, iterations: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(iterations):
        x, y = _batch(i)
        nn.functional.mse_loss(model(x), y).backward()
        if i % 3 == 2:
            opt.step()
            opt.zero_grad()


def _scaler_skips(model: nn.Module, iterations: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for i in range(iterations):
        x, y = _batch(i)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if i == 1:
            loss = loss * float("inf")  # the scaler skips this step
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def _second_optimizer_later(model: nn.Module, iterations: int) -> None:
    first, second = model[0], model[2]  # type: ignore[index]
    opt_a = torch.optim.SGD(first.parameters(), lr=0.05)
    opt_b = torch.optim.SGD(second.parameters(), lr=0.05)
    for i in range(iterations):
        x, y = _batch(i)
        opt_a.zero_grad()
        opt_b.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt_a.step()
        if i >= 3:
            opt_b.step()


def _closure(model: nn.Module, iterations: int) -> None:
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    for i in range(iterations):
        x, y = _batch(i)

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)


def _frozen_by_hand_between_steps(model: nn.Module, iterations: int) -> None:
    """A clamp of the weights after each step (WGAN's clipping): a step was seen in between."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(iterations):
        x, y = _batch(i)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.5, 0.5)


@pytest.mark.parametrize(
    "loop",
    [
        _accumulation,
        _scaler_skips,
        _second_optimizer_later,
        _closure,
        _frozen_by_hand_between_steps,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_training_through_optimizer_steps_records_no_untracked_update(
    tmp_path: Path, loop: Callable[[nn.Module, int], None]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no warning of ours either
        _train(tmp_path / "store", loop, 8)
    events = _events(tmp_path / "store")
    kinds = [kind for kind, _, _ in events]
    assert "optimizer_step" in kinds
    assert "untracked_updates" not in kinds
    (ended,) = [payload for kind, _, payload in events if kind == "run_ended"]
    assert "compiled_frames" not in ended  # nothing ran compiled


def test_the_report_says_the_steps_it_counts_are_not_all_the_updates(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _train(store, by_hand, 3)
    page = tmp_path / "report.html"
    assert invoke("report", "--store", str(store), "latest", "-o", str(page)).exit_code == 0
    text = page.read_text()
    assert "no optimizer step hook saw it" in text
    assert "untracked_updates" in text
    # a run that steps through its optimizer carries no such note
    plain = tmp_path / "plain"
    _train(plain, _accumulation, 6)
    assert invoke("report", "--store", str(plain), "latest", "-o", str(page)).exit_code == 0
    assert "no optimizer step hook saw it" not in page.read_text()


_WHOLE_STEP = """
import sys, torch, auditlog
from torch import nn
torch.manual_seed(0)
with auditlog.record(sys.argv[1], policy="audit"):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")
    def train_step(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for i in range(4):
        train_step(torch.randn(5, 4), torch.randn(5, 1))
"""


def test_a_training_step_compiled_whole_leaves_a_record_that_says_so(tmp_path: Path) -> None:
    """Forward, backward and step in one compiled function: dynamo traces every hook, so
    the record holds the model's construction and no step; run_ended says how many frames
    ran compiled, stderr says why no step is there, and so does the report."""
    store = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", _WHOLE_STEP, str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "no optimizer step was seen" in child.stderr and "torch.compile compiled" in child.stderr
    events = _events(store)
    kinds = {kind for kind, _, _ in events}
    assert "module_registered" in kinds and "optimizer_step" not in kinds
    (ended,) = [payload for kind, _, payload in events if kind == "run_ended"]
    assert ended["compiled_frames"] > 0 and ended["steps"] == 0
    page = tmp_path / "report.html"
    assert invoke("report", "--store", str(store), "latest", "-o", str(page)).exit_code == 0
    assert "frame(s) during the run" in page.read_text()


class _Sam(torch.optim.Optimizer):
    """Sharpness-aware minimization as its usual implementation steps: ``first_step``
    moves the weights in place (no ``Optimizer.step``, so no hook), ``second_step`` moves
    them back and steps the base optimizer."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})
        self.base = torch.optim.SGD(self.param_groups, lr=lr)
        self.param_groups = self.base.param_groups

    @torch.no_grad()
    def first_step(self) -> None:
        for p in (p for g in self.param_groups for p in g["params"] if p.grad is not None):
            self.state[p]["e"] = 0.05 * p.grad
            p.add_(self.state[p]["e"])

    @torch.no_grad()
    def second_step(self) -> None:
        for p in (p for g in self.param_groups for p in g["params"] if "e" in self.state[p]):
            p.sub_(self.state[p]["e"])
        self.base.step()


def test_sams_perturbation_before_the_first_step_is_the_one_finding(tmp_path: Path) -> None:
    """Once its base optimizer has stepped, its parameters are held by an optimizer seen
    stepping and are no longer looked at: the perturbation is found once, at step 0, and
    every step is recorded."""
    store = tmp_path / "store"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with auditlog.record(store, policy="audit"):
            model = _model()
            opt = _Sam(model.parameters(), lr=0.05)
            for i in range(4):
                x, y = _batch(i)
                nn.functional.mse_loss(model(x), y).backward()
                opt.first_step()
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.second_step()
                opt.zero_grad()
    events = _events(store)
    found = [(kind, payload) for kind, _, payload in events if kind == "untracked_updates"]
    assert [p["first_step"] for _, p in found] == [0] and found[0][1]["backwards"] == 1
    assert sum(kind == "optimizer_step" for kind, _, _ in events) == 4
    # the bill of materials gives the optimizer's hyperparameters with the gap beside them
    if importlib.util.find_spec("cyclonedx") is not None:
        bom = tmp_path / "bom.json"
        assert invoke("bom", "--store", str(store), "-o", str(bom)).exit_code == 0
        properties = {
            p["name"]: p["value"]
            for p in json.loads(bom.read_text())["metadata"]["component"]["properties"]
        }
        assert "torch.optim.sgd.SGD" in properties["auditlog:hyperparameters"]
        assert "no optimizer step hook saw it" in properties["auditlog:hyperparameters:note"]


def test_the_documentation_facts_carry_the_gap_beside_the_step_count(tmp_path: Path) -> None:
    """The bill of materials and the facts behind the EU AI Act headings do not present a
    step count that misses updates as the whole training: the note goes with it."""
    pytest.importorskip("cyclonedx")
    store = tmp_path / "store"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _train(store, by_hand, 3)
    out = tmp_path / "facts.json"
    assert invoke("bom", "--store", str(store), "--format", "json", "-o", str(out)).exit_code == 0
    facts = json.loads(out.read_text())["facts"]
    assert "no optimizer step hook saw it" in facts["model"]["note"]
    assert facts["model"]["value"]["steps"] == 0
    assert "no optimizer step was recorded" in facts["hyperparameters"]["note"]
    assert "no optimizer step hook saw it" in facts["hyperparameters"]["note"]
    bom = tmp_path / "bom.json"
    done = invoke("bom", "--store", str(store), "--format", "cyclonedx", "-o", str(bom))
    assert done.exit_code == 0, done.output
    properties = {
        p["name"]: p["value"]
        for component in [json.loads(bom.read_text())["metadata"]["component"]]
        for p in component.get("properties", [])
    }
    assert "no optimizer step hook saw it" in properties["auditlog:hyperparameters"]
    if importlib.util.find_spec("spdx_python_model") is not None:
        spdx = tmp_path / "spdx.json"
        done = invoke("bom", "--store", str(store), "--format", "spdx", "-o", str(spdx))
        assert done.exit_code == 0, done.output
        (package,) = [
            e for e in json.loads(spdx.read_text())["@graph"] if e.get("type") == "ai_AIPackage"
        ]
        assert "no optimizer step hook saw it" in package["ai_informationAboutTraining"]
    # a run that stepped through its optimizer has no such note
    plain = tmp_path / "plain"
    _train(plain, _accumulation, 6)
    assert invoke("bom", "--store", str(plain), "--format", "json", "-o", str(out)).exit_code == 0
    facts = json.loads(out.read_text())["facts"]
    assert not facts["model"]["note"] and not facts["hyperparameters"]["note"]
