"""Exact facts of issue 28 part 4: the seed as an unsigned 64-bit value, the line
that constructed each module, and the model's order in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import invoke, query_session
from torch import nn

import auditlog


def _seeded_run(store: Path, seed: int) -> str:
    torch.manual_seed(seed)
    with auditlog.record(store=store) as run:
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert run.run_id is not None
    return run.run_id


@pytest.mark.parametrize("seed", [2**64 - 5, 2**63, 2**63 - 1, 12345])
def test_the_seed_is_exact_in_the_views_runs_and_report(tmp_path: Path, seed: int) -> None:
    store = tmp_path / "store"
    run_id = _seeded_run(store, seed)
    torch.manual_seed(0)
    with query_session(store) as session:
        rows = list(session.execute(
            "SELECT seed, typeof(seed), metadata ->> '$.seeds.torch_initial_seed' FROM runs"
        ).rows)
    assert rows == [(seed, "UBIGINT", str(seed))]
    listed = invoke("runs", "--store", str(store), "--format", "json")
    assert listed.exit_code == 0, listed.stderr
    assert [(r["run_id"], r["seed"]) for r in json.loads(listed.stdout)] == [(run_id, seed)]
    assert f'"seed": {seed}' in listed.stdout  # the JSON text itself, not a float
    csv = invoke("runs", "--store", str(store), "--format", "csv")
    assert str(seed) in csv.stdout.splitlines()[1].split(",")
    page = tmp_path / "report.html"
    written = invoke("report", "--store", str(store), "latest", "-o", str(page))
    assert written.exit_code == 0, written.stderr
    assert f"<th>seed at start</th><td>{seed}</td>" in page.read_text()
