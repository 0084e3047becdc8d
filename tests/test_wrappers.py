"""Data-parallel wrappers are not part of the model: the record keeps the user's model.

``nn.DataParallel`` on CPU calls the model directly, which makes it a real
wrapper to record in-process; DDP itself is covered by tests/test_torchrun.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import invoke
from torch import nn

import auditlog
from auditlog.capture.wrappers import parallel_wrapper_attr, unwrap_model

pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


class MyDataParallel(nn.DataParallel):  # type: ignore[type-arg]
    """A user's subclass of a wrapper is a wrapper too."""


def _train(store: Path, wrapper: type[nn.Module]) -> str:
    with auditlog.record(store, activity_every=1) as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        wrapped = wrapper(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        for _ in range(2):
            loss = wrapped(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


def test_wrapper_detection() -> None:
    model = nn.Linear(2, 2)
    assert parallel_wrapper_attr(nn.DataParallel(model)) == "module"
    assert parallel_wrapper_attr(MyDataParallel(model)) == "module"
    assert parallel_wrapper_attr(model) is None
    assert unwrap_model(MyDataParallel(torch.compile(model))) is model


def test_the_tree_and_names_are_the_users_model(store: Path) -> None:
    _train(store, MyDataParallel)
    [tree] = json.loads(invoke("tree", "--store", str(store), "--format", "json").stdout)
    assert tree["class"] == "torch.nn.modules.container.Sequential"
    assert tree["wrapped_by"] == [f"{__name__}.MyDataParallel"]
    assert [c["name"] for c in tree["children"]] == ["0", "1", "2"]
    rows = json.loads(
        invoke(
            "query",
            "--store",
            str(store),
            "--format",
            "json",
            "select distinct module from forward_stats union "
            "select distinct module from backward_stats union "
            "select distinct parameter from steps order by 1",
        ).stdout
    )
    names = [r["module"] for r in rows]
    assert names == ["(Sequential)", "0", "0.bias", "0.weight", "1", "2", "2.bias", "2.weight"]
    assert not any("module" in n or "DataParallel" in n for n in names)
    wrapped = json.loads(
        invoke(
            "events", "--store", str(store), "--kind", "module_wrapped", "--format", "json"
        ).stdout
    )
    assert [(e["module"], e["payload"]["attr"]) for e in wrapped] == [("(Sequential)", "module")]
    assert wrapped[0]["payload"]["source"]["file"] == __file__


def test_restore_gives_the_models_state_dict(store: Path, tmp_path: Path) -> None:
    _train(store, nn.DataParallel)
    out = tmp_path / "w.pt"
    assert invoke("restore", "--store", str(store), "-o", str(out)).exit_code == 0
    assert list(torch.load(out)) == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]  # no "module." prefix
