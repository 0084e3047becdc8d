"""``auditlog diff``: construction, hyperparameter, code and metadata differences.

The central test records one script at two commits of a temporary git repository
with ``auditlog run`` (real subprocesses) and checks that exactly the committed
changes are reported: a layer width change, an added Dropout and a changed
initializer, plus the two commits. The other tests record in-process.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke, run_auditlog

import auditlog
from auditlog.present.diff_text import diff_text
from auditlog.read.diff import diff_runs, distribution_changed
from auditlog.store.eventstore import EventStore

MODEL_V1 = textwrap.dedent(
    """\
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.hidden = nn.Linear(16, 16)
            self.act = nn.ReLU()
            self.out = nn.Linear(16, 2)

            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02)
                    nn.init.zeros_(module.bias)

        def forward(self, x):
            return self.out(self.act(self.hidden(self.embed(x))))
    """
)

# v2: hidden width 16 -> 32 (and out's input with it), a Dropout in the blank line
# (so no other construction line moves), embed's init std 0.02 -> 0.5.
MODEL_V2 = textwrap.dedent(
    """\
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.hidden = nn.Linear(16, 32)
            self.act = nn.ReLU()
            self.out = nn.Linear(32, 2)
            self.drop = nn.Dropout(0.1)
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02)
                    nn.init.zeros_(module.bias)
            nn.init.normal_(self.embed.weight, std=0.5)

        def forward(self, x):
            return self.out(self.drop(self.act(self.hidden(self.embed(x)))))
    """
)

TRAIN = textwrap.dedent(
    """\
    import torch
    from model import Net

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    """
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def by_name(changes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in changes}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_two_code_versions_report_exactly_the_committed_changes(tmp_path: Path) -> None:
    # The lines that construct unchanged modules stay where they were, so their
    # source locations compare equal; the Dropout takes a blank line after them.
    v1_lines, v2_lines = MODEL_V1.splitlines(), MODEL_V2.splitlines()
    assert v2_lines[:7] == v1_lines[:7] and v2_lines[8] == v1_lines[8]
    assert v1_lines[10] == "" and "Dropout" in v2_lines[10]

    repo, store = tmp_path / "repo", tmp_path / "store"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "tests@example.invalid")
    git(repo, "config", "user.name", "Tests")
    git(repo, "config", "commit.gpgsign", "false")
    (repo / "train.py").write_text(TRAIN)
    commits = []
    for version in (MODEL_V1, MODEL_V2):
        (repo / "model.py").write_text(version)
        git(repo, "add", "model.py", "train.py")
        git(repo, "commit", "-q", "-m", "model")
        commits.append(git(repo, "rev-parse", "HEAD"))
        done = run_auditlog("run", "--store", str(store), "train.py", cwd=repo)
        assert done.returncode == 0, done.stderr

    result = invoke("diff", "--store", str(store), "latest~1", "latest", "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["identical"] is False
    assert (report["a"]["git_commit"], report["b"]["git_commit"]) == tuple(commits)
    assert report["code"] == [
        {
            "change": "changed",
            "name": "git",
            "fields": {"commit": {"a": commits[0], "b": commits[1]}},
            "a": report["code"][0]["a"],
            "b": report["code"][0]["b"],
        }
    ]

    modules = by_name(report["modules"])
    assert set(modules) == {"drop"}
    assert modules["drop"]["change"] == "added"
    assert modules["drop"]["b"]["class"] == "torch.nn.modules.dropout.Dropout"
    assert modules["drop"]["b"]["source"] == "model.py:11"

    parameters = by_name(report["parameters"])
    assert set(parameters) == {"hidden.weight", "hidden.bias", "out.weight", "embed.weight"}
    assert parameters["hidden.weight"]["fields"] == {"shape": {"a": [16, 16], "b": [32, 16]}}
    assert parameters["hidden.bias"]["fields"] == {"shape": {"a": [16], "b": [32]}}
    assert parameters["out.weight"]["fields"] == {"shape": {"a": [2, 16], "b": [2, 32]}}
    assert set(parameters["embed.weight"]["fields"]) == {"init"}
    init = parameters["embed.weight"]["fields"]["init"]
    assert init["a"]["std"] == pytest.approx(0.02, rel=0.3)
    assert init["b"]["std"] == pytest.approx(0.5, rel=0.3)

    assert report["buffers"] == []
    assert report["hyperparameters"] == []
    assert report["metadata"] == []
    assert report["init_values_differ"] == []

    text = invoke("diff", "--store", str(store), "latest~1", "latest").stdout
    assert commits[0][:10] in text and commits[1][:10] in text
    assert "+ drop" in text and "Dropout" in text
    assert "shape [16, 16] → [32, 16]" in text
    assert "no differences" not in text.splitlines()[-1]


# --------------------------------------------------------------------------- in-process runs
def load_model(path: Path, source: str) -> Any:
    """Import ``source`` as a fresh module from one fixed file (a new code version)."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("model_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(
    store: Path, module: Any, steps: int = 3, weight_decay: float = 0.0, decay_lr: bool = False
) -> str:
    torch.manual_seed(0)
    with auditlog.record(store, argv=["train.py"]) as run:
        model = module.Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=weight_decay)
        scheduler = (
            torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if decay_lr else None
        )
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 4)).sum().backward()
            opt.step()
            if scheduler is not None:
                scheduler.step()
    assert run.run_id is not None
    return run.run_id


SMALL_V1 = textwrap.dedent(
    """\
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 8)
            self.act = nn.ReLU()
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            return self.head(self.act(self.fc(x)))
    """
)
SMALL_V2 = (
    SMALL_V1.replace("self.fc = ", "self.proj = ")
    .replace("self.fc(x)", "self.proj(x)")
    .replace("nn.ReLU()", "nn.GELU()")
)


def test_identical_seeded_runs_report_no_difference(tmp_path: Path, store: Path) -> None:
    module = load_model(tmp_path / "model.py", SMALL_V1)
    first, second = record(store, module), record(store, module)
    event_store = EventStore.open(store)
    try:
        result = diff_runs(event_store, first, second)
    finally:
        event_store.close()
    assert result.identical, [c.as_dict() for c in result.changes]
    assert result.changes == [] and result.init_values_differ == []
    text = invoke("diff", "--store", str(store)).stdout
    assert text.splitlines()[-1] == "no differences"


def test_rename_class_change_and_hyperparameters(tmp_path: Path, store: Path) -> None:
    first = record(store, load_model(tmp_path / "model.py", SMALL_V1))
    second = record(
        store, load_model(tmp_path / "model.py", SMALL_V2), weight_decay=0.01, decay_lr=True
    )
    result = json.loads(
        invoke("diff", "--store", str(store), first, second, "--format", "json").stdout
    )

    modules = by_name(result["modules"])
    assert set(modules) == {"fc", "act"}
    assert modules["fc"]["change"] == "renamed" and modules["fc"]["new_name"] == "proj"
    assert modules["fc"]["fields"] == {}  # same class, contents and source line
    assert modules["act"]["change"] == "changed"
    assert modules["act"]["fields"] == {
        "class": {"a": "torch.nn.modules.activation.ReLU", "b": "torch.nn.modules.activation.GELU"}
    }
    # the renamed layer's parameters are compared under the new name: same initial values
    assert result["parameters"] == [] and result["init_values_differ"] == []

    (optimizer,) = result["hyperparameters"]
    assert optimizer["name"] == "optimizer 0 (SGD)"
    fields = optimizer["fields"]
    assert fields["group 0 weight_decay"] == {"a": 0, "b": 0.01}
    assert fields["group 0 params"]["b"] == ["proj.weight", "proj.bias", "head.weight", "head.bias"]
    assert fields["lr schedule"] == {
        "a": {"optimizer_step": 2, "lr": [0.1]},
        "b": {"optimizer_step": 2, "lr": [0.05]},
    }
    # an LR scheduler adds initial_lr to the param groups it drives
    assert fields["group 0 initial_lr"] == {"a": None, "b": 0.1}
    assert set(fields) == {
        "group 0 weight_decay",
        "group 0 params",
        "group 0 initial_lr",
        "lr schedule",
    }
    assert result["metadata"] == [] and result["code"] == []

    text = invoke("diff", "--store", str(store), first, second).stdout
    assert "→ fc → proj" in text
    assert "class ReLU → GELU" in text
    # Python users get the same text from the presentation layer the CLI draws with
    with auditlog.open(store) as opened:
        shown = diff_text(opened.diff(first, second))
    assert "→ fc → proj" in shown and "class ReLU → GELU" in shown
    assert shown.splitlines()[-1] == text.splitlines()[-1] and "\x1b" not in shown


def test_distribution_change_is_told_from_a_redraw() -> None:
    def stats(t: torch.Tensor) -> dict[str, Any]:
        return {
            "numel": t.numel(),
            "mean": t.mean().item(),
            "std": t.std().item(),
            "nan": 0,
            "inf": 0,
        }

    gen = torch.Generator().manual_seed(1)
    a = torch.randn(64, 64, generator=gen) * 0.02
    redraw = torch.randn(64, 64, generator=gen) * 0.02
    assert not distribution_changed(stats(a), stats(redraw))
    assert distribution_changed(stats(a), stats(redraw * 1.5))
    assert distribution_changed(stats(a), stats(redraw + 0.01))
    small_a, small_b = torch.randn(2, generator=gen), torch.randn(2, generator=gen)
    assert not distribution_changed(stats(small_a), stats(small_b))  # too few elements to tell
    ones, twos = torch.ones(8), torch.full((8,), 2.0)
    assert distribution_changed(stats(ones), stats(twos))
    assert not distribution_changed(stats(ones), stats(torch.ones(8)))
    assert distribution_changed(stats(a), {**stats(redraw), "nan": 3})


def test_diff_refuses_csv(store: Path, tmp_path: Path) -> None:
    record(store, load_model(tmp_path / "model.py", SMALL_V1), steps=1)
    result = invoke("diff", "--store", str(store), "latest", "latest", "--format", "csv")
    assert result.exit_code == 2
    assert (
        result.stderr
        == "Error: Invalid value for '--format': 'csv' is not one of 'table', 'json'.\n"
    )
