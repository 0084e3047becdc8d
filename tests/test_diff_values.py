"""``auditlog diff --values``: the first step and tensor whose stored values differ.

Runs are recorded in-process with a snapshot every step (or every second step)
into one store, once for the module; each test compares a pair of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke
from torch import nn

import auditlog
from auditlog.read.diff_values import first_divergence
from auditlog.store.eventstore import EventStore


def train(store: Path, steps: int = 5, every: int = 1, lr_from_3: float | None = None) -> str:
    """A seeded run whose optimizer's group 0 is the *last* layer.

    Changing group 0's learning rate before step 3 therefore leaves ``0.weight``
    and ``0.bias`` (first in state_dict order) equal at step 3: the first
    affected tensor in state_dict order is ``2.weight``.
    """
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=every, argv=["train.py"]) as rec:
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        opt = torch.optim.SGD(
            [{"params": model[2].parameters()}, {"params": model[0].parameters()}], lr=0.1
        )
        for step in range(1, steps + 1):
            if step == 3 and lr_from_3 is not None:
                opt.param_groups[0]["lr"] = lr_from_3
            opt.zero_grad()
            model(torch.randn(8, 3)).pow(2).mean().backward()
            opt.step()
    assert rec.run_id is not None
    return rec.run_id


class Runs:
    def __init__(self, store: Path, runs: dict[str, str]) -> None:
        self.store = store
        self.ids = runs

    def values(self, a: str, b: str, **tolerances: float) -> Any:
        event_store = EventStore.open(self.store)
        try:
            return first_divergence(event_store, self.ids[a], self.ids[b], **tolerances)
        finally:
            event_store.close()

    def cli(self, a: str, b: str, *options: str) -> Any:
        return invoke(
            "diff", "--store", str(self.store), self.ids[a], self.ids[b], "--values", *options
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    # Record outside any git work tree: module fixtures run before the per-test
    # working directory is set, and a live work tree can change between runs.
    home = tmp_path_factory.mktemp("values")
    store = home / "store"
    previous = os.getcwd()
    os.chdir(home)
    try:
        ids = {
            "base": train(store),
            "same": train(store),
            "lr": train(store, lr_from_3=0.3),
            "tiny": train(store, lr_from_3=0.1 * (1 + 1e-6)),
            "short": train(store, steps=4, every=2),
        }
    finally:
        os.chdir(previous)
    return Runs(store, ids)


def test_identical_seeded_runs_have_no_value_difference(runs: Runs) -> None:
    result = runs.values("base", "same")
    assert result.identical and result.first is None
    assert result.steps_compared == [0, 1, 2, 3, 4, 5]
    assert result.steps_only_a == result.steps_only_b == []
    assert result.compared == result.equal_hashes == 6 * 4  # every tensor equal by hash, none read
    text = runs.cli("base", "same")
    assert text.exit_code == 0, text.stderr
    assert "compared steps 0-5" in text.stdout and "no value differences" in text.stdout
    assert text.stdout.splitlines()[-1] == "no differences"


def test_lr_change_from_step_3_diverges_at_step_3_on_the_first_affected_tensor(runs: Runs) -> None:
    result = runs.values("base", "lr")
    first = result.first
    assert first is not None
    assert (first.step, first.tensor, first.reason) == (3, "2.weight", "values")
    with auditlog.open(runs.store) as store:
        a = store.run(runs.ids["base"]).state_dict(step=3)
        b = store.run(runs.ids["lr"]).state_dict(step=3)
    assert torch.equal(a["0.weight"], b["0.weight"]) and torch.equal(a["0.bias"], b["0.bias"])
    assert first.max_abs_diff == pytest.approx(float((a["2.weight"] - b["2.weight"]).abs().max()))
    assert first.a.norm == pytest.approx(float(a["2.weight"].double().norm()))
    assert first.b.norm == pytest.approx(float(b["2.weight"].double().norm()))
    assert first.b.mean == pytest.approx(float(b["2.weight"].double().mean()))

    document = json.loads(runs.cli("lr", "base", "--format", "json").stdout)
    values = document["values"]
    assert document["identical"] is False
    assert values["first_divergence"]["step"] == 3
    assert values["first_divergence"]["tensor"] == "2.weight"
    assert values["steps_compared"] == [0, 1, 2, 3, 4, 5]
    text = runs.cli("base", "lr").stdout
    assert "first divergence: step 3, 2.weight" in text
    assert "values diverge at step 3 (2.weight)" in text.splitlines()[-1]


def test_different_lengths_and_cadences_compare_the_common_steps(runs: Runs) -> None:
    result = runs.values("base", "short")
    assert result.steps_compared == [0, 2, 4]
    assert result.steps_only_a == [1, 3, 5] and result.steps_only_b == []
    assert result.identical  # same seed and data: equal wherever both recorded
    text = runs.cli("base", "short").stdout
    assert "compared steps 0, 2, 4" in text
    assert "steps only in run A 1, 3, 5; only in run B none" in text


def test_atol_hides_a_tiny_difference_that_bitwise_reports(runs: Runs) -> None:
    bitwise = runs.values("base", "tiny")
    assert bitwise.first is not None and bitwise.first.step == 3
    assert bitwise.first.max_abs_diff is not None and 0 < bitwise.first.max_abs_diff < 1e-5
    tolerant = runs.values("base", "tiny", atol=1e-5)
    assert tolerant.identical and tolerant.mode == "tolerance"
    assert tolerant.equal_hashes < tolerant.compared  # differing hashes were loaded and compared
    document = json.loads(runs.cli("base", "tiny", "--atol", "1e-5", "--format", "json").stdout)
    assert document["values"]["identical"] is True and document["values"]["atol"] == 1e-5
    # the large change stays a difference under the same tolerance
    assert runs.values("base", "lr", atol=1e-5).first is not None


def test_tolerance_options_need_values(runs: Runs) -> None:
    result = invoke(
        "diff", "--store", str(runs.store), runs.ids["base"], runs.ids["same"], "--atol", "1e-3"
    )
    assert result.exit_code == 2 and "--values" in result.stderr
    negative = runs.cli("base", "same", "--rtol", "-1")
    assert negative.exit_code == 2 and "--rtol" in negative.stderr


def test_runs_of_two_content_hash_versions_compare_equal_where_their_values_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run recorded before content hash v2 named its large tensors by v1: the same
    values have another name in a new run. Neither diff may call them different."""
    from auditlog.core import hashing
    from auditlog.read.diff import diff_runs
    from auditlog.recording import metadata

    store = tmp_path / "store"

    def big_run() -> str:
        torch.manual_seed(0)
        with auditlog.record(store, snapshot_every=1, argv=["train.py"]) as rec:
            model = nn.Linear(1100, 1000)  # 4.4 MB of weight: over one 4 MiB leaf
            opt = torch.optim.SGD(model.parameters(), lr=0.0)  # values unchanged by the step
            model(torch.randn(2, 1100)).sum().backward()
            opt.step()
        assert rec.run_id is not None
        return rec.run_id

    with monkeypatch.context() as old:  # as a recorder before v2 hashed: v1 throughout
        old.setattr(hashing, "LEAF_BYTES", 1 << 40)
        old.setattr(metadata, "CONTENT_HASH_VERSION", 1)
        run_v1 = big_run()
    run_v2 = big_run()
    event_store = EventStore.open(store)
    try:
        hashes = [
            {
                e["payload"]["tensors"][0]["sha256"]
                for e in map(_loaded, event_store.iter_events(run, kinds=["construction_sealed"]))
            }
            for run in (run_v1, run_v2)
        ]
        assert hashes[0] != hashes[1]  # the weight's names differ
        construction = diff_runs(event_store, run_v1, run_v2)
        assert construction.init_values_differ == [] and not [
            c for c in construction.changes if "init" in c.fields
        ]
        values = first_divergence(event_store, run_v1, run_v2)
        assert (
            values.first is None and values.compared > values.equal_hashes
        )  # read, and found equal
        third = big_run()  # one version: equal names, nothing read
        assert (
            first_divergence(event_store, run_v2, third).compared
            == first_divergence(event_store, run_v2, third).equal_hashes
        )
    finally:
        event_store.close()


def _loaded(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "payload": json.loads(row["payload"])}
