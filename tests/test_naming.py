"""Labels of modules and tensors (``auditlog.core.naming``), checked against PyTorch itself.

Each model is built live under ``auditlog.record``; the labels computed from the
replayed record must equal what ``named_modules()``/``named_parameters()`` say
of the live model, and collisions between roots must be made unique.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import auditlog
from auditlog.core.naming import Labels, attached_ids, label_state


def _labels(store: Path, build: object) -> tuple[Labels, object]:
    with auditlog.record(store, argv=["naming.py"]):
        built = build()  # type: ignore[operator]
    with auditlog.open(store) as s:
        run = s.run("latest")
        state = run.model_state()
        attached = attached_ids(run.events(kinds=["module_registered"]))
    return label_state(state, attached), built


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.LayerNorm(4)])
        self.shared = self.blocks[0]
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_single_model_labels_equal_named_modules_and_parameters(store: Path) -> None:
    labels, model = _labels(store, Tied)
    assert isinstance(model, Tied)
    module_labels = sorted(m.label for m in labels.modules.values())
    assert module_labels == sorted(["(Tied)", *(n for n, _ in model.named_modules() if n)])
    parameters = sorted(t.label for t in labels.tensors.values() if t.role == "parameter")
    assert parameters == sorted(n for n, _ in model.named_parameters())
    by_label = {t.label: t for t in labels.tensors.values()}
    # tied weight: first name as named_parameters() gives it, the other as an alias
    assert by_label["embed.weight"].aliases == ["head.weight"]
    assert "head.weight" not in by_label
    shared = {m.label: m for m in labels.modules.values()}["blocks.0"]
    assert shared.aliases == ["shared"]
    assert shared.parent_id is not None and labels.modules[shared.parent_id].label == "blocks"
    assert {t.label: t.role for t in labels.tensors.values()}["blocks.1.weight"] == "parameter"


def test_roots_without_descendants_do_not_prefix_the_model(store: Path) -> None:
    def build() -> tuple[nn.Module, nn.Module]:
        return nn.Sequential(nn.Linear(2, 2)), nn.CrossEntropyLoss()

    labels, _ = _labels(store, build)
    assert sorted(m.label for m in labels.modules.values()) == [
        "(CrossEntropyLoss)",
        "(Sequential)",
        "0",
    ]
    assert sorted(t.label for t in labels.tensors.values()) == ["0.bias", "0.weight"]


def test_the_largest_model_keeps_plain_names_others_are_prefixed_and_numbered(store: Path) -> None:
    def build() -> tuple[nn.Module, nn.Module, nn.Module]:
        torch.manual_seed(0)
        small = nn.Sequential(nn.Linear(2, 3))
        big = nn.Sequential(nn.Linear(3, 1), nn.Linear(1, 1))
        tie = nn.Sequential(nn.Linear(3, 1))
        return small, big, tie

    labels, _ = _labels(store, build)
    assert {m.label for m in labels.modules.values()} == {
        "(Sequential)",
        "(Sequential).0",
        "(Sequential)#2",
        "(Sequential)#3",
        "(Sequential)#3.0",
        "0",
        "1",
    }
    shapes = {t.label: t.info.shape for t in labels.tensors.values()}
    assert shapes["(Sequential).0.weight"] == [3, 2]
    assert shapes["0.weight"] == [1, 3]
    assert shapes["(Sequential)#3.0.weight"] == [1, 3]


def test_on_a_tie_the_first_model_keeps_plain_names(store: Path) -> None:
    def build() -> tuple[nn.Module, nn.Module]:
        return nn.Sequential(nn.Linear(2, 3)), nn.Sequential(nn.Linear(3, 1))

    labels, _ = _labels(store, build)
    shapes = {t.label: t.info.shape for t in labels.tensors.values()}
    assert shapes["0.weight"] == [3, 2]
    assert shapes["(Sequential)#2.0.weight"] == [1, 3]


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)


def test_a_deleted_submodule_is_detached_not_a_second_model(store: Path) -> None:
    """``del model.fc`` fires no hook; the structural check records it, and the
    module left over must not turn the model's names into prefixed ones."""

    def build() -> nn.Module:
        model = Two()
        del model.fc
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.head(torch.ones(1, 2)).sum().backward()
        opt.step()
        return model

    labels, model = _labels(store, build)
    assert isinstance(model, nn.Module)
    assert sorted(m.label for m in labels.modules.values()) == [
        "(Two)",
        "(detached Linear)",
        "head",
    ]
    tensors = sorted(t.label for t in labels.tensors.values())
    assert tensors == [
        "(detached Linear).bias",
        "(detached Linear).weight",
        "head.bias",
        "head.weight",
    ]
    assert [n for n in tensors if not n.startswith("(")] == sorted(
        n for n, _ in model.named_parameters()
    )
