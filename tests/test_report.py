"""``auditlog report``: one self-contained page, rendered by headless Chromium, fetching nothing."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke, run_auditlog
from torch import nn

import auditlog

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)",
)
MARKUP = "<img src=x onerror=alert(1)>"


def record_training(store: Path, hidden: int = 16, steps: int = 6) -> tuple[str, list[float]]:
    losses = []
    with auditlog.record(store, name="report-test") as run:
        run.annotate("dataset", name="blobs", sha256="0" * 64, rows=512)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))
        model.add_module(MARKUP, nn.Identity())  # a module name holding markup
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            loss = loss_fn(model(torch.randn(16, 4)), torch.randint(0, 3, (16,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        run.log(acc=0.75)
    assert run.run_id is not None
    return run.run_id, losses


def external_references(page: str) -> list[str]:
    """Everything in the page's real markup that could make a browser fetch something."""
    found: list[str] = []

    class Scan(HTMLParser):
        in_style = False

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag in (
                "script",
                "link",
                "iframe",
                "object",
                "embed",
                "base",
                "frame",
                "audio",
                "video",
            ):
                found.append(f"<{tag}>")
            for name, value in attrs:
                value = value or ""
                fetches = name in (
                    "src",
                    "href",
                    "srcset",
                    "action",
                    "data",
                    "poster",
                    "background",
                    "formaction",
                )
                if fetches and not value.startswith(("data:image/png;base64,", "#")):
                    found.append(f"{name}={value}")
                if name == "style" and re.search(r"url\(|@import", value, re.I):
                    found.append(f"style={value}")
            self.in_style = tag == "style"

        def handle_data(self, data: str) -> None:
            if self.in_style and re.search(r"url\(|@import", data, re.I):
                found.append("css url()")

    Scan().feed(page)
    return found


def test_report_page_holds_the_facts_escaped_and_self_contained(
    store: Path, tmp_path: Path
) -> None:
    run_id, losses = record_training(store)
    out = tmp_path / "report.html"
    done = invoke("report", "--store", str(store), "-o", str(out))
    assert done.exit_code == 0, done.stderr
    page = out.read_text()
    assert run_id in page and "report-test" in page
    assert "chain intact, unsigned" in page and "events in 1 stream(s): intact, unsigned" in page
    assert f"{losses[-1]:.6g}" in page  # the last loss, in the metrics table
    for module in ("(Sequential)", "Linear", "CrossEntropyLoss", "(CrossEntropyLoss)"):
        assert html.escape(module) in page
    assert MARKUP not in page and html.escape(MARKUP) in page
    assert "blobs" in page and "training FLOPs per step" in page and "131 params" in page
    assert page.count("data:image/png;base64,") == 4  # loss, metrics (acc), lr, grad-norm
    assert external_references(page) == []
    assert external_references('<img src="http://example.invalid/x.png">')  # the check can fail


def chromium(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--log-net-log={tmp_path / 'netlog.json'}",
            *extra,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )


def page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked for (Chromium's own background requests are not the page's)."""
    log = json.loads(netlog.read_text())
    types = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    out = []
    for event in log["events"]:
        params: dict[str, Any] = event.get("params") or {}
        started = types.get(event["type"]) == "URL_REQUEST_START_JOB" and "url" in params
        if started and params.get("initiator") != "not an origin":
            out.append(params["url"])
    return out


@pytest.mark.slow
@needs_chromium
def test_report_renders_in_headless_chromium_without_network(store: Path, tmp_path: Path) -> None:
    import numpy as np
    from matplotlib import image as mpimg

    run_id, losses = record_training(store)
    out = tmp_path / "report.html"
    assert invoke("report", "--store", str(store), "-o", str(out)).exit_code == 0
    shot = tmp_path / "shot.png"
    done = chromium(out, tmp_path, f"--screenshot={shot}", "--window-size=1200,2400")
    assert shot.exists(), done.stderr[-2000:]
    pixels = np.asarray(mpimg.imread(str(shot)))
    assert len(np.unique(pixels.reshape(-1, pixels.shape[2]).round(2), axis=0)) > 50  # not blank
    assert page_requests(tmp_path / "netlog.json") == []
    dom = chromium(out, tmp_path, "--dump-dom")
    text = re.sub(r"<[^>]+>", " ", dom.stdout)
    text = html.unescape(re.sub(r"\s+", " ", text))
    assert run_id in text and "chain intact, unsigned" in text and "intact" in text
    assert "(Sequential)" in text and "CrossEntropyLoss" in text and MARKUP in text
    assert f"{losses[-1]:.6g}" in text

    planted = tmp_path / "planted.html"  # the network check can fail
    planted.write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
    chromium(planted, tmp_path, "--dump-dom")
    assert page_requests(tmp_path / "netlog.json") == ["http://example.invalid/x.png"]


@pytest.mark.slow
def test_report_of_a_failed_and_of_a_crashed_run(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = tmp_path / "fails.py"
    body = """
        import os, sys, torch
        from torch import nn
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            loss = nn.functional.mse_loss(model(torch.randn(4, 3)), torch.zeros(4, 1))
            opt.zero_grad(); loss.backward(); opt.step()
            if step == 3:
                if sys.argv[1] == "raise":
                    raise RuntimeError("diverged <badly>")
                os._exit(9)  # no run_ended: found crashed later
        """
    script.write_text(textwrap.dedent(body))
    assert (
        run_auditlog("run", "--store", str(store), str(script), "raise", cwd=tmp_path).returncode
        == 1
    )
    failed = tmp_path / "failed.html"
    assert invoke("report", "--store", str(store), "-o", str(failed)).exit_code == 0
    page = failed.read_text()
    assert (
        "failed" in page and "RuntimeError: diverged &lt;badly&gt;" in page and "Traceback" in page
    )
    assert re.search(r"optimizer steps completed</th><td>4<", page)

    crash = run_auditlog(
        "run", "--store", str(store), "--durability", "step", str(script), "exit", cwd=tmp_path
    )
    assert (
        crash.returncode == 9
    )  # every step committed before training went on: the record reaches step 4
    crashed = tmp_path / "crashed.html"
    assert invoke("report", "--store", str(store), "-o", str(crashed)).exit_code == 0
    page = crashed.read_text()
    assert "crashed" in page and "no run_ended event" in page
    assert re.search(r"optimizer steps completed</th><td>4<", page)


def test_compare_page_shows_the_diff_and_both_curves(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first, _ = record_training(store, hidden=16)
    second, _ = record_training(store, hidden=32)
    out = tmp_path / "diff.html"
    done = invoke("report", "--store", str(store), first, "--compare", second, "-o", str(out))
    assert done.exit_code == 0, done.stderr
    page = out.read_text()
    assert first[:12] in page and second[:12] in page and "differences found" in page
    assert "0.weight" in page and "[16, 4] → [32, 4]" in page
    assert page.count("data:image/png;base64,") == 1 and external_references(page) == []
    same = invoke(
        "report",
        "--store",
        str(store),
        first,
        "--compare",
        first,
        "-o",
        str(tmp_path / "same.html"),
    )
    assert (
        same.exit_code == 0
        and "identical construction and settings" in (tmp_path / "same.html").read_text()
    )


def test_report_carries_the_signed_verdict_and_a_failed_one(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    key = tmp_path / "keys" / "signing_key"
    assert invoke("keygen", "-o", str(key)).exit_code == 0
    monkeypatch.setenv(
        "AUDITLOG_KEY", str(key)
    )  # signs while recording; its .pub is trusted when reading
    run_id, _ = record_training(store, steps=2)
    out = tmp_path / "signed.html"
    assert invoke("report", "--store", str(store), "-o", str(out)).exit_code == 0
    page = out.read_text()
    assert "signed checkpoint(s): intact" in page and "No signed checkpoint" not in page
    conn = sqlite3.connect(store / "events.db")
    conn.execute(
        "delete from events where run_id=? and seq > (select max(seq) - 2 from events where run_id=?)",
        (run_id, run_id),
    )
    conn.commit()
    conn.close()
    assert (
        invoke("report", "--store", str(store), "-o", str(out)).exit_code == 0
    )  # a report still comes out
    page = out.read_text()
    assert "record NOT verified" in page and "FAILED" in page and "cut off" in page
