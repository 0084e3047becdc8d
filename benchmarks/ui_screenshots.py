"""The screenshots of docs/ui.md: each page of ``auditlog ui`` in chromium, via Playwright.

Records three small runs (one with a NaN planted in the loss at step 3, one
with Tanh where the others have ReLU, one with a module added after step 3),
serves them with the real ``auditlog ui`` and saves a PNG of the runs page, a
run page (its integrity and its data sections), the compare page and the SQL page. Needs Debian's chromium and the
``playwright`` package (the dev extra).

    python benchmarks/ui_screenshots.py [--out docs/ui]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import auditlog


def record(
    store: Path,
    name: str,
    activation: type[nn.Module],
    nan_at: int | None = None,
    grow_at: int | None = None,
) -> str:
    with auditlog.record(store, name=name, snapshot_every=4) as run:
        run.annotate("dataset", name="blobs", licence="CC-BY-4.0", source="generated in the script")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), activation(), nn.Linear(16, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        blobs = TensorDataset(torch.randn(384, 4), torch.randint(0, 3, (384,)))
        loader = DataLoader(
            blobs, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(1)
        )
        for step, (x, y) in enumerate(loader):  # 12 batches: the data section's coverage is 100%
            if step == grow_at:
                model.add_module("head", nn.Identity())
            if step == nan_at:
                x[0, 0] = float("nan")
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/ui"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (apt-get install -y chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        base_id = record(store, "baseline", nn.ReLU, grow_at=6)
        record(store, "tanh-lr0.1", nn.Tanh)
        nan_id = record(store, "nan-at-step-3", nn.ReLU, nan_at=3)
        env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
        server = subprocess.Popen(
            [sys.executable, "-m", "auditlog.cli.main", "ui", "--store", str(store), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert server.stdout is not None
        found = re.search(r"at (http://\S+/) ", server.stdout.readline())
        assert found
        url = found.group(1)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
                )
                page = browser.new_page(viewport={"width": 1100, "height": 760})
                page.goto(url)
                page.locator("#runs tbody tr").nth(2).wait_for()
                page.check(f'input[aria-label="select {base_id}"]')
                page.check(f'input[aria-label="select {nan_id}"]')
                page.screenshot(path=str(args.out / "runs.png"))
                page.goto(url + "#/run/" + nan_id)
                page.locator('.chart[data-title="Loss"] .nonfinite-mark').wait_for()
                page.locator("#verdict").wait_for()
                page.set_viewport_size({"width": 1100, "height": 1000})
                page.evaluate(
                    "document.getElementById('integrity').scrollIntoView()"
                )  # CDP, not eval in the page
                page.wait_for_timeout(200)
                page.screenshot(path=str(args.out / "run.png"))
                page.evaluate("document.getElementById('data').scrollIntoView()")
                page.wait_for_timeout(200)
                page.screenshot(path=str(args.out / "run-data.png"))
                page.goto(url + f"#/compare?runs={base_id},{nan_id}")
                page.locator(".diff").wait_for()
                page.wait_for_timeout(200)
                page.screenshot(path=str(args.out / "compare.png"), full_page=True)
                page.goto(url + "#/query")
                page.fill(
                    "#sql",
                    "select r.name, max(s.grad_norm) as max_grad_norm, count(*) as rows\n"
                    "from steps s join runs r using (run_id) group by r.name order by r.name",
                )
                page.click("#run-query")
                page.locator("#result table").wait_for()
                page.screenshot(path=str(args.out / "query.png"))
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    for name in ("runs", "run", "run-data", "compare", "query"):
        print(
            f"wrote {args.out / (name + '.png')} ({(args.out / (name + '.png')).stat().st_size // 1024} KiB)"
        )


if __name__ == "__main__":
    main()
