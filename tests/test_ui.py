"""``auditlog ui``: the JSON answers and guards over HTTP, then the pages in a real browser.

The store holds three small recorded runs: ``grows`` (a module added after
step 3), ``nan`` (Tanh instead of ReLU, and a NaN planted in the input at step
3, so the loss is NaN from there on) and one named ``<script>alert(1)</script>``.
The browser part drives Debian's chromium with Playwright against the real
``auditlog ui`` command, and is skipped when either is missing.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import auditlog

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from auditlog.ui import data
from auditlog.ui.app import CSP, create_app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCRIPT_NAME = "<script>alert(1)</script>"


# A dataset class whose name is markup: the run page must show it as text.
ScriptDataset = type(SCRIPT_NAME, (TensorDataset,), {})


def shuffled_order() -> list[int]:
    """The order a DataLoader(shuffle=True, generator seeded 1) draws 96 samples in, found
    outside any recording so that the loader run can feed the very batches of the others."""
    drawn = DataLoader(
        range(96), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    return [int(i) for batch in drawn for i in batch]


def record(
    store: Path,
    name: str,
    activation: type[nn.Module],
    nan_at: int | None = None,
    grow_at: int | None = None,
    loader: bool = False,
) -> str:
    order = shuffled_order() if loader else []
    with auditlog.record(store, name=name, snapshot_every=1) as run:
        run.annotate("dataset", name="blobs", rows=64)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), activation(), nn.Linear(8, 3))
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = None
        if loader:
            # Only this run iterates a DataLoader (the others record no data). Its samples
            # are placed where the shuffle draws them, so that it trains on the same batches
            # as the others and its values equal theirs.
            drawn = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(6)]
            xs, ys = torch.cat([x for x, _ in drawn]), torch.cat([y for _, y in drawn])
            where = torch.tensor(order)
            placed_x, placed_y = torch.empty_like(xs), torch.empty_like(ys)
            placed_x[where], placed_y[where] = xs, ys
            batches = iter(
                DataLoader(
                    ScriptDataset(placed_x, placed_y),
                    batch_size=16,
                    shuffle=True,
                    generator=torch.Generator().manual_seed(1),
                )
            )
        for step in range(6):
            if step == grow_at:
                model.add_module("head", nn.Identity())
            x, y = (
                next(batches)
                if batches is not None
                else (torch.randn(16, 4), torch.randint(0, 3, (16,)))
            )
            if step == nan_at:
                x[0, 0] = float("nan")
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("ui") / "store"
    ids = {
        "grows": record(store, "grows", nn.ReLU, grow_at=3),
        "nan": record(store, "nan", nn.Tanh, nan_at=3),
        "script": record(store, SCRIPT_NAME, nn.ReLU, loader=True),
    }
    return {"store": store, "ids": ids}


@pytest.fixture(scope="module")
def client(recorded: dict[str, Any]) -> Iterator[TestClient]:
    with auditlog.open(recorded["store"]) as store:
        yield TestClient(create_app(store), base_url="http://127.0.0.1")


# ---------------------------------------------------------------------------- HTTP
def test_runs_page_filters_sorts_and_pages(client: TestClient, recorded: dict[str, Any]) -> None:
    every = client.get("/api/runs").json()
    assert every["total"] == 3 and [r["name"] for r in every["rows"]] == [
        SCRIPT_NAME,
        "nan",
        "grows",
    ]
    row = every["rows"][0]
    assert row["status"] == "completed" and row["steps"] == 6 and row["signed"] is False
    assert {"git_commit", "git_dirty", "started", "duration_s"} <= set(row)
    by_name = client.get("/api/runs", params={"sort": "name", "order": "asc"}).json()
    assert [r["name"] for r in by_name["rows"]] == [SCRIPT_NAME, "grows", "nan"]
    assert [r["run_id"] for r in client.get("/api/runs", params={"q": "NaN"}).json()["rows"]] == [
        recorded["ids"]["nan"]
    ]
    paged = client.get("/api/runs", params={"offset": 1, "limit": 1}).json()
    assert paged["total"] == 3 and [r["name"] for r in paged["rows"]] == ["nan"]
    assert client.get("/api/runs", params={"status": "crashed"}).json()["total"] == 0
    bad = client.get("/api/runs", params={"sort": "nonsense"})
    assert bad.status_code == 400 and "cannot sort by 'nonsense'" in bad.json()["error"]


def test_run_answer_holds_finding_snapshots_and_annotations(
    client: TestClient, recorded: dict[str, Any]
) -> None:
    summary = client.get("/api/runs/nan").json()
    assert summary["gaps"] == []  # every update went through an optimizer step that was seen
    assert summary["run"]["run_id"] == recorded["ids"]["nan"] and summary["last_step"] == 6
    assert summary["finding"]["found"] and summary["finding"]["step"] == 3
    assert (
        summary["annotations"][0]["key"] == "dataset"
        and summary["annotations"][0]["fields"]["rows"] == 64
    )
    steps = [s["step"] for s in summary["snapshots"]]
    assert steps[0] == 0 and 6 in steps
    command = summary["snapshots"][1]["restore"]
    assert command.startswith("auditlog restore --store ") and "--step 1 -o" in command
    assert summary["totals"]["total"] == 4 * 8 + 8 + 8 * 3 + 3
    missing = client.get("/api/runs/nosuchrun")
    assert missing.status_code == 404 and "no run matches 'nosuchrun'" in missing.json()["error"]


def test_run_answer_holds_the_data_as_auditlog_data_shows_it(
    client: TestClient, recorded: dict[str, Any]
) -> None:
    """The datasets and loaders of ``auditlog data RUN --format json``, in the rows the
    CLI's table shows (one presentation: ``read.data``)."""
    shown = client.get("/api/runs/" + recorded["ids"]["script"]).json()["data"]
    cli = invoke(
        "data", "--store", str(recorded["store"]), recorded["ids"]["script"], "--format", "json"
    )
    assert cli.exit_code == 0, cli.stderr
    facts = json.loads(cli.stdout)["datasets"][0]
    [dataset] = shown["datasets"]["rows"]
    assert (
        dataset["class"] == SCRIPT_NAME
        and dataset["method"] == "tensors"
        and dataset["length"] == 96
    )
    assert dataset["fingerprint"] == facts["fingerprint"][:16] and len(facts["fingerprint"]) == 64
    assert (dataset["batches"], dataset["samples"], dataset["coverage"]) == (6, 96, "100.0%")
    [loader] = shown["loaders"]["rows"]
    assert (loader["batch_size"], loader["shuffle"], loader["seed"]) == (16, True, 1)
    assert shown["datasets"]["columns"][:3] == ["rank", "dataset", "class"]
    none = client.get("/api/runs/" + recorded["ids"]["nan"]).json()["data"]
    assert none["datasets"]["rows"] == [] and none["loaders"]["rows"] == []


def test_tree_changes_with_the_step(client: TestClient) -> None:
    before = client.get("/api/runs/grows/tree", params={"step": 2}).json()
    after = client.get("/api/runs/grows/tree", params={"step": 6}).json()
    names = lambda tree: [c["name"] for c in tree["roots"][0]["children"]]  # noqa: E731
    assert names(before) == ["0", "1", "2"] and names(after) == ["0", "1", "2", "head"]
    root = after["roots"][0]
    assert (
        root["class"] == "torch.nn.modules.container.Sequential" and root["total_parameters"] == 67
    )
    assert root["children"][0]["own_parameters"] == 40 and root["source"].endswith(
        ".py:" + root["source"].split(":")[-1]
    )
    weight = root["children"][0]["parameters"][0]
    assert (
        weight["snapshot_step"] == 6
        and before["roots"][0]["children"][0]["parameters"][0]["snapshot_step"] == 2
    )
    beyond = client.get("/api/runs/grows/tree", params={"step": 99})
    assert beyond.status_code == 400 and "has no step 99" in beyond.json()["error"]
    assert client.get("/api/runs/grows/tree", params={"step": "x"}).status_code == 400


def test_curves_keep_non_finite_values_as_text(client: TestClient) -> None:
    curves = client.get("/api/runs/nan/curves").json()
    loss = curves["loss"][0]["series"]["loss"]
    assert [s for s, _ in loss] == [0, 1, 2, 3, 4, 5]
    assert [v for _, v in loss][3:] == ["NaN", "NaN", "NaN"] and all(
        isinstance(v, float) for _, v in loss[:3]
    )
    assert set(curves["grad_norm"][0]["series"]) == {
        "used by the update",
        "raw (as backward left it)",
    }
    assert curves["lr"][0]["series"]["optimizer 1 group 0"][0] == [0, 0.1]
    assert curves["update_ratio"][0]["kind"] == "heatmap" and curves["activations"][0]["rows"]


def test_verify_verdict_is_worded_as_verify_words_it(
    client: TestClient, recorded: dict[str, Any]
) -> None:
    verdict = client.get("/api/runs/grows/verify").json()
    assert (
        verdict["ok"]
        and verdict["assurance"] == "unsigned"
        and verdict["badge"] == "chain intact, unsigned"
    )
    done = invoke("verify", "--store", str(recorded["store"]), "grows")
    assert done.exit_code == 0 and verdict["text"] in done.stdout
    assert verdict["note"].startswith("Not signed:")


def test_compare_overlays_curves_and_diffs_construction(
    client: TestClient, recorded: dict[str, Any]
) -> None:
    found = client.get("/api/compare", params={"runs": "grows,nan"}).json()
    assert [r["name"] for r in found["runs"]] == ["grows", "nan"]
    assert "NaN" in [v for _, v in found["runs"][1]["curves"]["loss"]["series"]["loss"]]
    modules = {c["name"]: c for c in found["diffs"][0]["modules"]}
    assert modules["1"]["fields"]["class"] == {
        "a": "torch.nn.modules.activation.ReLU",
        "b": "torch.nn.modules.activation.Tanh",
    }
    assert modules["head"]["change"] == "removed"
    one = client.get("/api/compare", params={"runs": "grows"})
    assert one.status_code == 400 and "two or more runs" in one.json()["error"]
    values = client.get("/api/compare/values", params={"a": "grows", "b": "nan"}).json()
    assert (
        values["first_divergence"]["step"] == 1
        and values["first_divergence"]["tensor"] == "0.weight"
    )
    same = client.get(
        "/api/compare/values", params={"a": "grows", "b": recorded["ids"]["script"]}
    ).json()
    assert same["identical"] and same["steps_compared"] == [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
    ]  # Identity changes no value


def test_query_runs_in_the_sandbox_of_auditlog_query(client: TestClient) -> None:
    names = client.get(
        "/api/query", params={"sql": "select name from runs order by started"}
    ).json()
    assert names["columns"] == ["name"] and names["rows"] == [["grows"], ["nan"], [SCRIPT_NAME]]
    scoped = client.get(
        "/api/query", params={"sql": "select count(distinct run_id) as n from events", "run": "nan"}
    )
    assert scoped.json()["rows"] == [[1]]
    nan = client.get(
        "/api/query", params={"sql": "select value from metrics where not isfinite(value) limit 1"}
    )
    assert nan.json()["rows"] == [["NaN"]]
    for refused in ("delete from events", "select * from read_csv('/etc/passwd')", "attach 'x.db'"):
        answer = client.get("/api/query", params={"sql": refused})
        assert answer.status_code in (400, 422) and answer.json()["error"], refused
    assert client.get("/api/query", params={"sql": ""}).status_code == 400
    assert "events" in [v["view"] for v in client.get("/api/schema").json()]


def test_only_get_is_answered_and_every_answer_has_the_csp(client: TestClient) -> None:
    for path in ("/", "/api/runs", "/api/query?sql=select+1", "/static/pages.js"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            refused = client.request(method, path)
            assert (
                refused.status_code == 405 and refused.headers["content-security-policy"] == CSP
            ), (method, path)
    for path in (
        "/",
        "/api/runs",
        "/static/pages.js",
        "/static/vendor/uPlot.iife.min.js",
        "/static/nothing.js",
        "/api/runs/nosuchrun",
    ):
        answer = client.get(path)
        assert (
            answer.headers["content-security-policy"] == CSP
            and answer.headers["x-content-type-options"] == "nosniff"
        )
    assert "default-src 'self'" in CSP and "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    page = client.get("/").text
    assert "<script>" not in page and "style=" not in page.lower()  # no inline script or style
    assert re.findall(r'(?:src|href)="([^"]+)"', page) == [
        "data:,",
        "/static/vendor/uPlot.min.css",
        "/static/app.css",
        "#/runs",
        "#/runs",
        "#/query",
        "/static/vendor/uPlot.iife.min.js",
        "/static/draw.js",
        "/static/pages.js",
    ]


def test_a_foreign_host_header_is_refused(client: TestClient) -> None:
    """A page elsewhere that rebinds its DNS name to 127.0.0.1 still sends its own Host."""
    assert client.get("/api/runs", headers={"host": "evil.example"}).status_code == 400
    assert client.get("/api/runs", headers={"host": "localhost:8765"}).status_code == 200


def test_json_never_carries_a_bare_nan() -> None:
    assert (
        data.dumps({"a": [math.nan, math.inf, -math.inf, 1.5]})
        == b'{"a":["NaN","Infinity","-Infinity",1.5]}'
    )


# ---------------------------------------------------------------------------- the command
def test_a_missing_extra_is_one_line(recorded: dict[str, Any]) -> None:
    probe = (
        "import sys; sys.modules['uvicorn'] = None; from auditlog.cli.main import main; "
        f"sys.argv = ['auditlog', 'ui', '--store', {str(recorded['store'])!r}]; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: the web UI needs the optional extra: pip install 'auditlog[ui]' "
        "(starlette and uvicorn)"
    )


def test_a_port_in_use_is_one_line(recorded: dict[str, Any]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = invoke("ui", "--store", str(recorded["store"]), "--port", str(port))
    assert done.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert done.stderr.count("\n") == 1


def serve(store: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """The real ``auditlog ui`` on a free port, and its URL (its first line)."""
    env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "auditlog.cli.main",
            "ui",
            "--store",
            str(store),
            "--port",
            "0",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    found = re.search(r"at (http://\S+/) ", line)
    assert found, line + server.stderr.read() if server.stderr else line
    return server, found.group(1)


def stop(server: subprocess.Popen[str]) -> str:
    server.terminate()
    _, err = server.communicate(timeout=30)
    return err


def test_another_host_is_served_with_a_warning(recorded: dict[str, Any]) -> None:
    server, url = serve(recorded["store"], "--host", "0.0.0.0")
    err = stop(server)
    assert url.startswith("http://0.0.0.0:")
    assert (
        "warning: serving on 0.0.0.0: anyone who can reach this address can read the whole record"
        in err
    )


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (Linux's /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_check_workers_start_with_the_server_and_end_with_it(recorded: dict[str, Any]) -> None:
    server, url = serve(recorded["store"], "--check-workers", "2")
    workers = children_of(server.pid)  # forked before it listens: there when the URL is
    command = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert len(workers) == 2
    assert all(Path(f"/proc/{pid}/cmdline").read_bytes() == command for pid in workers)
    with urllib.request.urlopen(url + "api/runs/latest/verify", timeout=60) as answer:
        assert json.loads(answer.read())["ok"] is True
    stop(server)  # SIGTERM, re-raised by uvicorn after its shutdown: no cleanup of ours runs
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in workers):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def test_a_negative_worker_count_is_one_line(recorded: dict[str, Any]) -> None:
    done = invoke("ui", "--store", str(recorded["store"]), "--check-workers", "-1")
    assert done.exit_code == 2 and "--check-workers" in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr


def test_no_check_workers_when_asked_for_none(recorded: dict[str, Any]) -> None:
    server, _ = serve(recorded["store"], "--check-workers", "0")
    try:
        assert children_of(server.pid) == set()
    finally:
        stop(server)


# ---------------------------------------------------------------------------- the browser
RED_PIXELS = """(box) => {
  const canvas = box.querySelector("canvas");
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let red = 0;
  for (let i = 0; i < pixels.length; i += 4) if (pixels[i] > 190 && pixels[i + 1] < 70 && pixels[i + 2] < 70) red++;
  return red;
}"""


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)
def test_the_pages_in_a_real_browser(recorded: dict[str, Any]) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    server, url = serve(recorded["store"])
    problems: list[str] = []
    requests: list[str] = []
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on(
                "console",
                lambda m: (
                    problems.append(f"console {m.type}: {m.text}")
                    if m.type in ("error", "warning")
                    else None
                ),
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            browse(page, url, recorded["ids"])
            browsed = list(requests)
            # The checks can fail: an image from elsewhere is seen, refused by the CSP, and said so.
            page.evaluate(
                "() => { const i = new Image(); i.src = 'http://example.invalid/x.png'; document.body.append(i); }"
            )
            page.wait_for_timeout(300)
            browser.close()
    finally:
        stop(server)
    refused = [p for p in problems if "example.invalid" in p and "Content Security Policy" in p]
    assert refused, problems
    assert [p for p in problems if p not in refused] == []
    assert browsed and all(r.startswith(url) for r in browsed), [
        r for r in browsed if not r.startswith(url)
    ]
    assert requests[len(browsed) :] == ["http://example.invalid/x.png"]


def browse(page: Any, url: str, ids: dict[str, str]) -> None:
    from playwright.sync_api import expect

    page.goto(url)
    rows = page.locator("#runs tbody tr")
    rows.nth(2).wait_for()
    assert rows.count() == 3
    assert (
        page.locator(f'#runs tr[data-run="{ids["script"]}"] td:nth-child(2)').inner_text()
        == SCRIPT_NAME
    )
    assert page.evaluate("document.querySelectorAll('script').length") == 3  # ours only
    page.fill('input[aria-label="filter"]', "grow")
    expect(rows).to_have_count(1)

    # a run: the tree at a step, then at the end
    page.click("#runs tbody tr a")
    page.locator("#tree ul.tree").wait_for()
    assert page.locator('li[data-module="head"]').count() == 1
    page.locator("#step").fill("2")
    page.wait_for_selector('#tree[data-step="2"]')
    assert page.locator('li[data-module="head"]').count() == 0
    assert page.inner_text("#tree-counts").startswith("5 modules, 67 parameters at step 2")
    page.locator("#step").fill("6")
    page.wait_for_selector('#tree[data-step="6"]')
    assert page.locator('li[data-module="head"]').count() == 1
    page.wait_for_selector("#verdict")
    assert "chain intact, unsigned" in page.inner_text("#verdict")
    assert page.locator("#gaps").count() == 0  # nothing ran where no hook saw it

    # the data a run trained on, a dataset class named with markup shown as text
    page.goto(url + "#/run/" + ids["script"])
    page.locator("#data table").first.wait_for()
    assert page.locator("#data tbody td:nth-child(3)").first.inner_text() == SCRIPT_NAME
    assert "tensors" in page.inner_text("#data")
    assert page.evaluate("document.querySelectorAll('script').length") == 3  # still ours only

    # the planted NaN, marked on the loss curve (and listed under it)
    page.goto(url + "#/run/" + ids["nan"])
    loss = page.locator('.chart[data-title="Loss"]')
    loss.locator(".nonfinite-mark").wait_for()
    assert loss.locator(".nonfinite-mark").inner_text().startswith("loss NaN at steps 3, 4, 5")
    assert loss.evaluate(RED_PIXELS) > 100
    assert page.locator('.chart[data-title="Learning rate"]').evaluate(RED_PIXELS) == 0
    assert "NaN/Inf at step 3" in page.inner_text("#nonfinite")

    # compare two runs, reached from the runs list
    page.goto(url + "#/runs")
    page.fill('input[aria-label="filter"]', "")
    page.locator("#runs tbody tr").nth(2).wait_for()
    page.check(f'input[aria-label="select {ids["grows"]}"]')
    page.check(f'input[aria-label="select {ids["nan"]}"]')
    page.click("#compare")
    page.locator(".diff").wait_for()
    changed = page.locator(
        ".diff tr", has_text="torch.nn.modules.activation.ReLU → torch.nn.modules.activation.Tanh"
    )
    assert changed.locator("td").nth(1).inner_text() == "1"
    assert (
        page.locator('.chart[data-title="Loss"] .nonfinite-mark')
        .inner_text()
        .startswith("B: loss NaN")
    )

    # a query
    page.goto(url + "#/query")
    page.fill("#sql", "select name from runs order by started")
    page.click("#run-query")
    page.locator("#result table").wait_for()
    assert page.locator("#result td").all_inner_texts() == ["grows", "nan", SCRIPT_NAME]


def _updated_by_hand(store: Path) -> None:
    """A run whose parameters change between backward passes with no optimizer step."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # its untracked_updates warning
        with auditlog.record(store, name="by hand"):
            torch.manual_seed(0)
            model = nn.Linear(4, 2)
            for _ in range(3):
                model.zero_grad()
                model(torch.randn(5, 4)).pow(2).mean().backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.1 * p.grad  # type: ignore[operator]


@pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"
)
def test_a_run_page_says_what_the_record_does_not_hold(tmp_path: Path) -> None:
    """The report's outcome and the run page word a gap in the record the same way."""
    sync_api = pytest.importorskip("playwright.sync_api")
    store = tmp_path / "store"
    _updated_by_hand(store)
    with auditlog.open(store) as opened:
        client = TestClient(create_app(opened), base_url="http://127.0.0.1")
        run_id = client.get("/api/runs").json()["rows"][0]["run_id"]
        gaps = client.get("/api/runs/" + run_id).json()["gaps"]
    assert len(gaps) == 1 and "no optimizer step hook saw it" in gaps[0]
    server, url = serve(store)
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page()
            page.goto(url + "#/run/" + run_id)
            page.locator("#gaps li").wait_for()
            assert gaps[0] in page.inner_text("#gaps")
            browser.close()
    finally:
        stop(server)
