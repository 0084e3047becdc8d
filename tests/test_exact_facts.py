"""Exact facts of issue 28 part 4: the seed as an unsigned 64-bit value, the line
that constructed each module, and the model's order in the report."""

from __future__ import annotations

import inspect
import json
import runpy
from pathlib import Path
from typing import Any

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
        rows = list(
            session.execute(
                "SELECT seed, typeof(seed), metadata ->> '$.seeds.torch_initial_seed' FROM runs"
            ).rows
        )
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
        rows = list(
            session.execute("SELECT module FROM modules WHERE depth > 0 ORDER BY ordinal").rows
        )
    assert [r[0] for r in rows] == MODEL_ORDER
    opened = auditlog.open(store)
    try:
        recorded = opened.run(run.run_id or "latest")
        grad = recorded.plot_panels("grad-norm")[0]
        assert grad.rows == MODEL_ORDER[1:]  # modules with parameters of their own
        grouped = recorded.plot_panels("grad-norm", max_rows=5)[0]
        assert grouped.rows[0].startswith("layers") and grouped.rows[-1] == "alpha_head", (
            grouped.rows
        )
        for what in ("activations", "dead-units"):
            for panel in recorded.plot_panels(what):
                names = [r for r in panel.rows if r in MODEL_ORDER]
                assert names == sorted(names, key=MODEL_ORDER.index), (what, panel.rows)
    finally:
        opened.close()
    page = tmp_path / "report.html"
    assert invoke("report", "--store", str(store), "latest", "-o", str(page)).exit_code == 0
    html = page.read_text()
    tree = html[html.index('<ul class="tree">') :]
    positions = [
        tree.index(f"<code>{attr}</code> ")
        for attr in ["layers", *map(str, range(12)), "alpha_head"]
    ]
    assert positions == sorted(positions), positions


# A script as a user writes it: parameterless modules built on one line and attached
# on another; a module built before the recording, a deepcopy and a module built in
# a thread. ``# at: NAME`` marks the lines the test looks for.
BUILD = """\
import copy
import threading

import torch
from torch import nn

import auditlog


class Half(nn.Module):
    def __init__(self):
        super().__init__()  # the walk passes this user __init__ of the module itself
        self.k = 0.5

    def forward(self, x):
        return self.k * x


before_linear = nn.Linear(4, 4)  # at: before_linear
before_act = nn.GELU()  # at: before_act
with auditlog.record(store=STORE) as run:
    layers = []
    layers.append(nn.Linear(4, 4))  # at: linear
    {gap}layers.append(nn.ReLU())  # at: relu
    layers.append(copy.deepcopy(layers[-1]))  # at: deepcopy
    layers += [before_act, before_linear]
    built = []
    thread = threading.Thread(target=lambda: built.append(nn.Dropout(0.0)))  # at: thread
    thread.start()
    thread.join()
    layers += built
    half = Half()  # at: half
    model = nn.Sequential(*layers, half)  # at: sequential
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
RUN_ID = run.run_id
"""
# model index -> (marker of its line, kind)
EXPECTED = {
    "0": ("linear", "constructed"),  # Linear: its own parameters register inside its __init__
    "1": ("relu", "constructed"),  # ReLU: nothing registers before nn.Sequential attaches it
    "2": ("sequential", "attached"),  # a deepcopy never runs __init__
    "3": ("sequential", "attached"),  # GELU built before recording
    "4": ("sequential", "attached"),  # Linear built before recording (adopted)
    "5": ("thread", "constructed"),  # Dropout built in another thread
    "6": ("half", "constructed"),  # a user module without parameters
}


def _run_script(path: Path, store: Path, gap: str = "") -> tuple[str, dict[str, int]]:
    """Write and run the script (in this process: its frames are the user code);
    its run id and the line of each marker."""
    text = BUILD.replace("{gap}", gap)
    path.write_text(text)
    lines = {
        line.rsplit("# at: ", 1)[1]: number
        for number, line in enumerate(text.splitlines(), 1)
        if "# at: " in line
    }
    torch.manual_seed(0)
    done = runpy.run_path(str(path), init_globals={"STORE": str(store)})
    return str(done["RUN_ID"]), lines


def test_each_module_has_its_constructing_line_or_is_labelled_attached(tmp_path: Path) -> None:
    store, script = tmp_path / "store", tmp_path / "build_model.py"
    run_id, lines = _run_script(script, store)
    expected = {name: (lines[marker], kind) for name, (marker, kind) in EXPECTED.items()}

    with auditlog.open(store) as opened:
        events = [e["payload"] for e in opened.run(run_id).events(kinds=["module_registered"])]
    attached = {
        e["name"]: e["source"] for e in events if e.get("parent_class", "").endswith("Sequential")
    }
    assert {name: (s["line"], s["kind"]) for name, s in attached.items()} == expected
    assert {s["file"] for s in attached.values()} == {str(script)}
    assert attached["1"]["function"] == "<module>" and attached["5"]["function"] == "<lambda>"
    (first,) = [e for e in events if "parent_source" in e]
    assert (first["parent_source"]["line"], first["parent_source"]["kind"]) == (
        lines["sequential"],
        "constructed",
    )

    tree = invoke("tree", "--store", str(store), run_id, "--format", "json")
    assert tree.exit_code == 0, tree.stderr
    (root,) = json.loads(tree.stdout)
    shown = {c["name"]: (c["source"].rsplit(":", 1), c["source_kind"]) for c in root["children"]}
    assert {name: (int(where[1]), kind) for name, (where, kind) in shown.items()} == expected
    text = invoke("tree", "--store", str(store), run_id).stdout
    assert f"1 (ReLU) {script.name}:{lines['relu']}\n" in text.replace(str(script), script.name)
    assert f"3 (GELU) {script.name}:{lines['sequential']} (attached)\n" in text.replace(
        str(script), script.name
    )

    with query_session(store) as session:
        rows = list(
            session.execute(
                "SELECT module, source_file, source_line, source_kind FROM modules WHERE depth = 1 ORDER BY ordinal"
            ).rows
        )
    assert {m: (line, kind) for m, _, line, kind in rows} == expected
    assert {f for _, f, _, _ in rows} == {str(script)}

    page = tmp_path / "report.html"
    assert invoke("report", "--store", str(store), run_id, "-o", str(page)).exit_code == 0
    html = page.read_text()
    assert f"{script.name}:{lines['relu']}</span>" in html
    assert f"{script.name}:{lines['sequential']} (attached)</span>" in html


def test_diff_says_a_constructing_line_moved(tmp_path: Path) -> None:
    store, script = tmp_path / "store", tmp_path / "build_model.py"
    first, lines_a = _run_script(script, store)
    second, lines_b = _run_script(script, store, gap="pass\n    ")  # the ReLU one line down
    assert lines_b["relu"] == lines_a["relu"] + 1 and lines_b["linear"] == lines_a["linear"]
    result = invoke("diff", "--store", str(store), first, second, "--format", "json")
    assert result.exit_code == 0, result.stderr
    modules = {c["name"]: c for c in json.loads(result.stdout)["modules"]}
    name = script.name  # relative to the run's directory
    assert modules["1"]["fields"] == {
        "source": {"a": f"{name}:{lines_a['relu']}", "b": f"{name}:{lines_b['relu']}"}
    }
    moved = {
        "a": f"{name}:{lines_a['sequential']} (attached)",
        "b": f"{name}:{lines_b['sequential']} (attached)",
    }
    assert modules["3"]["fields"] == {"source": moved}
    assert "0" not in modules  # the Linear did not move
    text = invoke("diff", "--store", str(store), first, second).stdout
    assert f"source {name}:{lines_a['relu']} → {name}:{lines_b['relu']}" in text, text


class _NoSuperInit(nn.Module):
    """A module whose constructor never reaches nn.Module.__init__."""

    def __init__(self) -> None:
        self.made = True


def test_the_constructor_wrapper_changes_nothing_and_is_taken_out(tmp_path: Path) -> None:
    original = nn.Module.__dict__["__init__"]
    plain = nn.ReLU()
    with auditlog.record(store=tmp_path / "store"):
        assert nn.Module.__dict__["__init__"] is not original
        assert inspect.signature(nn.Module.__init__) == inspect.signature(original)
        odd = _NoSuperInit()
        assert odd.made and "_modules" not in vars(odd)
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            nn.Module(bogus=1)
        with pytest.raises(RuntimeError, match="Trying to create tensor with negative dimension"):
            nn.Linear(-1, 2)
        assert vars(nn.ReLU()) == vars(plain)
    assert nn.Module.__dict__["__init__"] is original
    with auditlog.open(tmp_path / "store") as opened:
        assert list(opened.run().events(kinds=["recorder_error"])) == []


def test_a_wrapper_put_over_ours_is_left_in_place_and_ours_serves_the_next_recording(
    tmp_path: Path,
) -> None:
    """Dynamo wraps nn.Module.__init__ at a process's first torch.compile: taking ours
    out then would take theirs too. Ours stays inside theirs, inert, and is reused."""
    original = nn.Module.__dict__["__init__"]
    seen: list[str] = []
    with auditlog.record(store=tmp_path / "a"):
        ours = nn.Module.__dict__["__init__"]

        def __init__(self: nn.Module, *args: Any, **kwargs: Any) -> None:  # theirs
            seen.append(type(self).__name__)
            ours(self, *args, **kwargs)

        nn.Module.__init__ = __init__  # type: ignore[method-assign]
    try:
        assert nn.Module.__dict__["__init__"] is __init__  # not taken from under them
        nn.ReLU()
        assert seen == ["ReLU"]
        with auditlog.record(store=tmp_path / "b"):
            layers = [nn.Linear(2, 2)]
            line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            layers.append(nn.ReLU())
            nn.Sequential(*layers)
        with auditlog.open(tmp_path / "b") as opened:
            (relu,) = [
                e["payload"]
                for e in opened.run().events(kinds=["module_registered"])
                if e["payload"]["name"] == "1"
            ]
        assert (relu["source"]["line"], relu["source"]["kind"]) == (line, "constructed")
    finally:
        nn.Module.__init__ = ours  # type: ignore[method-assign]
        with auditlog.record(store=tmp_path / "c"):
            pass  # the last one out finds ours in place again and restores the original
    assert nn.Module.__dict__["__init__"] is original
