"""``auditlog plot``: real PNGs whose pixels depend on the data, the data as CSV, many modules."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import pytest
import torch
from helpers import assert_one_line_error, invoke, run_auditlog
from torch import nn

import auditlog
from auditlog.read.series import PLOTS, group_names

matplotlib_image = pytest.importorskip(
    "matplotlib.image", reason="matplotlib is in the plot and test extras"
)


def train(store: Path, seed: int, lr: float, steps: int = 12) -> dict[tuple[str, int], float]:
    """Record a small MLP (debug policy); return the gradient norm of each module per step."""
    norms: dict[tuple[str, int], float] = {}
    with auditlog.record(store, policy="debug"):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
        )
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        for step in range(steps):
            loss = loss_fn(model(torch.randn(64, 8)), torch.randint(0, 4, (64,)))
            opt.zero_grad()
            loss.backward()
            for name, module in model.named_children():
                grads = [p.grad.norm() for p in module.parameters(recurse=False)]
                if grads:
                    norms[(name, step)] = float(torch.linalg.vector_norm(torch.stack(grads)))
            opt.step()
            scheduler.step()
    return norms


def pixels(path: Path) -> object:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib_image.imread(io.BytesIO(data), format="png")


def not_blank(image: object) -> None:
    import numpy as np

    array = np.asarray(image)
    assert array.ndim == 3 and array.shape[0] > 200 and array.shape[1] > 400
    colors = np.unique(array.reshape(-1, array.shape[2]).round(3), axis=0)
    assert len(colors) > 20, "a blank image"


def test_every_plot_is_a_png_that_depends_on_the_data(tmp_path: Path) -> None:
    import numpy as np

    first, second = tmp_path / "a", tmp_path / "b"
    train(first, seed=0, lr=0.1)
    train(second, seed=1, lr=0.5)
    for what in PLOTS:
        images = []
        for store in (first, second):
            out = tmp_path / f"{store.name}-{what}.png"
            done = invoke("plot", "--store", str(store), "latest", what, "-o", str(out))
            assert done.exit_code == 0, done.stderr
            image = pixels(out)
            not_blank(image)
            images.append(np.asarray(image))
        assert images[0].shape != images[1].shape or not np.array_equal(images[0], images[1]), what


def test_csv_holds_the_numbers_of_the_picture(store: Path) -> None:
    expected = train(store, seed=0, lr=0.1)
    done = invoke("plot", "--store", str(store), "latest", "grad-norm", "--format", "csv")
    assert done.exit_code == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    got = {
        (r["series"], int(r["step"])): float(r["value"])
        for r in rows
        if r["panel"] == "Gradient norm"
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=1e-5), key
    # The total beside it: the L2 norm of every module's, the raw one equal (nothing clipped).
    totals = {
        (r["series"], int(r["step"])): float(r["value"])
        for r in rows
        if r["panel"] == "Total gradient norm"
    }
    for step in {s for _, s in expected}:
        want = math.sqrt(sum(v * v for (_, s), v in expected.items() if s == step))
        for series in ("used by the update", "raw (as backward left it)"):
            assert math.isclose(totals[(series, step)], want, rel_tol=1e-5) or not math.isfinite(
                want
            ), (series, step)
    lr_rows = list(
        csv.DictReader(
            io.StringIO(
                invoke("plot", "--store", str(store), "latest", "lr", "--format", "csv").stdout
            )
        )
    )
    assert [float(r["value"]) for r in lr_rows][:9] == [0.1] * 4 + [0.05] * 4 + [0.025]
    loss = invoke(
        "plot",
        "--store",
        str(store),
        "latest",
        "loss",
        "--format",
        "csv",
        "-o",
        str(store.parent / "l.csv"),
    )
    assert loss.exit_code == 0 and len((store.parent / "l.csv").read_text().splitlines()) == 1 + 12


def test_hundreds_of_modules_are_grouped_by_prefix(store: Path, tmp_path: Path) -> None:
    with auditlog.record(store, policy="debug"):
        blocks = nn.Sequential(
            *[nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)) for _ in range(60)]
        )
        for layer in blocks.modules():
            if isinstance(layer, nn.Linear):
                nn.init.eye_(layer.weight)  # 180 layers deep, and gradients still far from 0
        opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
        for _ in range(3):
            blocks(torch.randn(2, 4)).sum().backward()
            opt.step()
    with auditlog.open(store) as s:
        run = s.run()
        panel = run.plot_panels("grad-norm", max_rows=40)[0]
        full = run.plot_panels("grad-norm", max_rows=1000)[0]
        wide = run.plot_panels("grad-norm", max_rows=60)[0]
    assert len(full.rows) == 180 and wide.rows[:3] == ["0", "1", "2"] and len(wide.rows) == 60
    assert "180 modules grouped by name prefix at depth 1" in wide.note
    members = [full.cells[(f"7.{i}", 1)] for i in range(3)]
    assert min(members) > 0
    assert math.isclose(wide.cells[("7", 1)], math.sqrt(sum(v * v for v in members)), rel_tol=1e-9)
    assert (
        len(panel.rows) == 30 and panel.rows[:2] == ["0…1", "2…3"] and "consecutive" in panel.note
    )
    members = [full.cells[(f"{b}.{i}", 1)] for b in (2, 3) for i in range(3)]
    assert math.isclose(
        panel.cells[("2…3", 1)], math.sqrt(sum(v * v for v in members)), rel_tol=1e-9
    )
    out = tmp_path / "many.png"
    assert (
        invoke("plot", "--store", str(store), "latest", "grad-norm", "-o", str(out)).exit_code == 0
    )
    not_blank(pixels(out))


def test_group_names_picks_the_deepest_prefix_that_fits() -> None:
    names = [f"layers.{i}.{part}" for i in range(10) for part in ("attn", "mlp")]
    mapping, depth = group_names(names, 12)
    assert depth == 2 and len(set(mapping.values())) == 10 and mapping["layers.3.mlp"] == "layers.3"
    assert group_names(names, 100) == ({n: n for n in names}, None)


def test_plot_needs_an_output_file(store: Path) -> None:
    train(store, seed=0, lr=0.1, steps=2)
    assert_one_line_error(invoke("plot", "--store", str(store), "latest", "loss"), 2, "-o FILE.png")


@pytest.mark.slow
def test_without_matplotlib_plot_says_how_to_install_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    train(store, seed=0, lr=0.1, steps=2)
    blocker = tmp_path / "blocker" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])}
    done = run_auditlog(
        "plot", "--store", str(store), "latest", "loss", "-o", str(tmp_path / "x.png"), env=env
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: plotting needs matplotlib: pip install 'auditlog[plot]'"
    csv_done = run_auditlog(
        "plot", "--store", str(store), "latest", "loss", "--format", "csv", env=env
    )
    assert csv_done.returncode == 0 and csv_done.stdout.startswith("panel,series,step,value")
