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


class _Ordered(nn.Module):
    """12 numbered layers, then a head whose name sorts first: names sort unlike the model."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(12)])
        self.alpha_head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha_head(self.layers(x))


MODEL_ORDER = ["layers", *[f"layers.{i}" for i in range(12)], "alpha_head"]


def test_report_tree_views_and_heatmaps_follow_the_models_order(tmp_path: Path) -> None:
    store = tmp_path / "store"
    torch.manual_seed(0)
    with auditlog.record(store=store, activity_every=1) as run:
        model = _Ordered()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(5, 4)).pow(2).mean().backward()
            opt.step()
    with query_session(store) as session:
        rows = list(session.execute("SELECT module FROM modules WHERE depth > 0 ORDER BY ordinal").rows)
    assert [r[0] for r in rows] == MODEL_ORDER
    opened = auditlog.open(store)
    try:
        recorded = opened.run(run.run_id or "latest")
        grad = recorded.plot_panels("grad-norm")[0]
        assert grad.rows == MODEL_ORDER[1:]  # modules with parameters of their own
        grouped = recorded.plot_panels("grad-norm", max_rows=5)[0]
        assert grouped.rows[0].startswith("layers") and grouped.rows[-1] == "alpha_head", grouped.rows
        for what in ("activations", "dead-units"):
            for panel in recorded.plot_panels(what):
                names = [r for r in panel.rows if r in MODEL_ORDER]
                assert names == sorted(names, key=MODEL_ORDER.index), (what, panel.rows)
    finally:
        opened.close()
    page = tmp_path / "report.html"
    assert invoke("report", "--store", str(store), "latest", "-o", str(page)).exit_code == 0
    html = page.read_text()
    tree = html[html.index('<ul class="tree">'):]
    positions = [tree.index(f"<code>{attr}</code> ") for attr in ["layers", *map(str, range(12)), "alpha_head"]]
    assert positions == sorted(positions), positions
