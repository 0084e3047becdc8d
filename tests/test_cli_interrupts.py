"""Issue 15, "every command behaves as a careful user expects": ``auditlog run`` and Ctrl-C.

One test per behaviour the issue asks for (its items 1-6, the crash of 17, 19
and 21; the section comments give the item), through the CLI. The
Ctrl-C tests send a real SIGINT to a real ``auditlog`` process; those and the
other subprocess tests are marked slow. What a user reads is compared exactly,
with ``python script.py`` itself where the issue says "as python does".
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from auditlog.cli.run_cmd import UNSIGNED_NOTE
from helpers import EXAMPLES, CliResult, invoke, record_run

import auditlog

SLOW_QUERY = (
    "select count(*) from range(100000000) a, range(100000000) b where a.range + b.range < 0"
)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("AUDITLOG_STORE", "AUDITLOG_RUN_ID")}


def auditlog_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "auditlog.cli.main", *args]


def start(command: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def wait_for_output(proc: subprocess.Popen[bytes], marker: bytes, timeout: float = 180) -> bytes:
    """Read stdout until ``marker`` appears; the process keeps running."""
    seen = b""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while marker not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"never printed {marker!r}: {seen + out!r} {err!r}")
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if readable:
            seen += os.read(proc.stdout.fileno(), 4096)
    return seen


def interrupt(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out.decode(), err.decode()


def one_error(result: CliResult, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


# "ready" comes from another thread while the main one is already waiting, so
# Ctrl-C always finds it in the same line (the one python reports).
WAITING = """\
import threading
import time


def wait():
    while True:
        time.sleep(0.05)


threading.Timer(0.3, lambda: print("ready", flush=True)).start()
wait()
"""


# --------------------------------------------------------------------------- 1
@pytest.mark.slow
def test_ctrl_c_prints_and_stores_the_traceback_python_prints(tmp_path: Path) -> None:
    script = tmp_path / "long.py"
    script.write_text(WAITING)
    plain = start([sys.executable, "long.py"], tmp_path)
    wait_for_output(plain, b"ready")
    plain_code, _, python_says = interrupt(plain)
    assert plain_code == -signal.SIGINT
    store = tmp_path / "store"
    recorded = start(auditlog_cmd("run", "--store", str(store), "long.py"), tmp_path)
    wait_for_output(recorded, b"ready")
    code, _, err = interrupt(recorded)
    assert code == 130
    notice, unsigned, *traceback_lines = err.splitlines(keepends=True)
    assert notice.startswith("auditlog: recording run ")
    assert unsigned == UNSIGNED_NOTE + "\n"
    assert "".join(traceback_lines) == python_says
    assert python_says.startswith(
        f'Traceback (most recent call last):\n  File "{script}", line 11, in <module>\n'
    )
    assert python_says.endswith("KeyboardInterrupt\n")
    with auditlog.open(store) as opened:
        info = opened.run("latest").info()
    assert info.status == "interrupted" and info.exit_code == 130
    assert info.exception is not None and info.exception["traceback"] == python_says


# --------------------------------------------------------------------------- 2
@pytest.mark.slow
def test_ctrl_c_while_auditlog_run_starts_is_one_line_and_no_run(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('started')\n")
    store = tmp_path / "store"
    proc = start(auditlog_cmd("run", "--store", str(store), "train.py"), tmp_path)
    deadline = time.monotonic() + 120
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text():  # torch is being imported
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.002)
    code, out, err = interrupt(proc)
    assert (code, out, err) == (130, "", "Error: interrupted\n")
    assert not store.exists()  # nothing recorded, not even a store


# --------------------------------------------------------------------------- 3
def test_run_dash_m_on_a_package_without_main_is_one_line_and_no_run(tmp_path: Path) -> None:
    (tmp_path / "trainpkg").mkdir()
    (tmp_path / "trainpkg" / "__init__.py").write_text("")
    result = invoke("run", "--store", str(tmp_path / "store"), "-m", "trainpkg")
    assert one_error(result, 1) == (
        "Error: no module named trainpkg.__main__; 'trainpkg' is a package and cannot be directly executed"
    )
    missing = invoke("run", "--store", str(tmp_path / "store"), "-m", "trainpkg.nothere")
    assert one_error(missing, 1) == "Error: no module named trainpkg.nothere"
    assert not (tmp_path / "store").exists()


# --------------------------------------------------------------------------- 4
@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("query")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        record_run(root / "store", steps=1)
    return root / "store"


@pytest.mark.slow
def test_ctrl_c_cancels_a_running_query(small_store: Path, tmp_path: Path) -> None:
    proc = start(auditlog_cmd("query", "--store", str(small_store), SLOW_QUERY), tmp_path)
    deadline = time.monotonic() + 120
    # The seal is written once the refresh is done, before the query starts: interrupted
    # earlier, the next command would (rightly) say it rebuilt an unsealed read model.
    while not (small_store / "readmodel.duckdb.seal").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(1.0)  # DuckDB is counting
    assert interrupt(proc) == (130, "", "Error: interrupted\n")


def test_query_timeout_cancels_the_query(small_store: Path) -> None:
    warm = invoke("query", "--store", str(small_store), "select 1 as one")  # the read model, sealed
    assert warm.exit_code == 0, warm.stderr
    result = invoke("query", "--store", str(small_store), "--timeout", "0.5", SLOW_QUERY)
    assert one_error(result, 1) == "Error: query cancelled: it ran past its time limit of 0.5 s"


def test_query_tables_are_capped_and_csv_streams_every_row(small_store: Path) -> None:
    table = invoke("query", "--store", str(small_store), "select range as n from range(1500)")
    assert table.exit_code == 0, table.stderr
    cells = [
        line.split("│")[1].strip() for line in table.stdout.splitlines() if line.startswith("│")
    ]
    assert cells == [str(n) for n in range(1000)]
    assert table.stderr == (
        "auditlog: showing the first 1000 rows; more were left out "
        "(--max-rows N, 0 for all; --format csv or json streams every row)\n"
    )
    every = invoke(
        "query",
        "--store",
        str(small_store),
        "--max-rows",
        "0",
        "select range as n from range(1500)",
    )
    assert every.stderr == "" and every.stdout.count("│ 1499 │") == 1
    csv = invoke(
        "query",
        "--store",
        str(small_store),
        "--format",
        "csv",
        "select range as n from range(200000)",
    )
    assert csv.exit_code == 0 and csv.stdout.splitlines() == ["n", *(str(n) for n in range(200000))]


# --------------------------------------------------------------------------- 5
@pytest.mark.slow
def test_record_inside_auditlog_run_joins_the_run(tmp_path: Path) -> None:
    (tmp_path / "inner.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            import auditlog

            with auditlog.record(name="inner-name", snapshot_every=1) as run:
                model = nn.Linear(2, 2)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
                run.annotate("dataset", name="d1")
                print("RUN", run.run_id, auditlog.current().run_id, flush=True)
            """
        )
    )
    store = tmp_path / "store"
    done = subprocess.run(
        auditlog_cmd("run", "--store", str(store), "inner.py"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    with auditlog.open(store) as opened:
        infos = opened.runs()
        assert len(infos) == 1 and infos[0].name == "inner-name" and infos[0].steps == 1
        run_id = infos[0].run_id
        keys = [e["payload"]["key"] for e in opened.run("inner-name").events(kinds=["annotation"])]
    assert done.stdout == f"RUN {run_id} {run_id}\n"
    assert done.stderr.splitlines() == [
        f"auditlog: recording run {run_id} into {store}",
        UNSIGNED_NOTE,
        f"auditlog: record() joins the recording of `auditlog run` (run {run_id[:12]}); named 'inner-name'; "
        "store and policy options of record() ignored",
    ]
    assert keys == ["auditlog.record", "dataset"]


# --------------------------------------------------------------------------- 6
@pytest.mark.slow
def test_run_passes_argv0_as_the_path_as_typed(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "show.py").write_text(
        "import sys\nprint(sys.argv[0], __file__, __name__, sys.argv[1:])\n"
    )
    python = subprocess.run(
        [sys.executable, "sub/show.py", "a"], cwd=tmp_path, capture_output=True, text=True
    )
    recorded = subprocess.run(
        auditlog_cmd("run", "--store", "store", "sub/show.py", "a"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert recorded.returncode == 0, recorded.stderr
    assert (
        recorded.stdout
        == python.stdout
        == f"sub/show.py {tmp_path / 'sub' / 'show.py'} __main__ ['a']\n"
    )


# --------------------------------------------------------------------------- 17
@pytest.mark.slow
def test_a_crashed_run_lasts_until_its_last_event(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(
        textwrap.dedent(
            """
            import time
            import torch
            from torch import nn

            model = nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
                time.sleep(0.6)
            print("ready", flush=True)
            time.sleep(600)
            """
        )
    )
    store = tmp_path / "store"
    proc = start(auditlog_cmd("run", "--store", str(store), "crash.py"), tmp_path)
    wait_for_output(proc, b"ready")
    time.sleep(0.5)  # the writer commits within 0.1 s
    proc.kill()
    proc.communicate(timeout=60)

    def the_crashed() -> dict[str, object]:
        rows = json.loads(invoke("runs", "--store", str(store), "--format", "json").stdout)
        return next(r for r in rows if r["argv"] == ["crash.py"])

    before = the_crashed()
    assert before["status"] == "crashed"
    assert float(str(before["duration_s"])) >= 1.2  # three steps 0.6 s apart: not 0.0
    (tmp_path / "next.py").write_text("pass\n")
    later = subprocess.run(
        auditlog_cmd("run", "--store", str(store), "next.py"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
    )
    assert later.returncode == 0
    after = the_crashed()  # closed by the next recording: still the time of its last event
    assert after["status"] == "crashed" and after["duration_s"] == before["duration_s"]
    ended = json.loads(
        invoke(
            "events",
            "--store",
            str(store),
            str(after["run_id"]),
            "--kind",
            "run_ended",
            "--format",
            "json",
        ).stdout
    )
    from auditlog.cli.events_cmd import summarize

    detected_by = ended[0]["payload"]["detected_by"]
    assert (
        summarize("run_ended", ended[0]["payload"])
        == f"crashed (exit code unknown), detected by run {detected_by[:12]}"
    )


# --------------------------------------------------------------------------- 19
@pytest.mark.slow
def test_backward_full_falls_back_to_grad_for_in_place_modules(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = subprocess.run(
        auditlog_cmd(
            "run",
            "--store",
            str(store),
            "--backward",
            "full",
            str(EXAMPLES / "train_cnn.py"),
            "--epochs",
            "1",
        ),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    message = (
        "backward=full cannot record a model with an in-place module (ReLU(inplace=True)); "
        "recording backward with gradient hooks (backward=grad) instead"
    )
    assert done.stderr.splitlines()[1:] == [UNSIGNED_NOTE, f"auditlog: {message}"]
    with auditlog.open(store) as opened:
        run = opened.run("latest")
        assert run.info().status == "completed"
        faults = [e["payload"] for e in run.events(kinds=["recorder_error"])]
        backward_calls = [c for c in run.module_calls(direction="backward")]
    assert faults == [{"where": "backward", "type": "InPlaceModule", "message": message}]
    assert backward_calls  # gradients were still recorded


# --------------------------------------------------------------------------- 21
@pytest.mark.slow
def test_live_models_snapshot_at_run_end_dropped_ones_when_released(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn


            def train(model):
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                model(torch.ones(1, model[0].in_features)).sum().backward()
                opt.step()


            def main():
                local = nn.Sequential(nn.Linear(3, 3))  # dropped when main() returns
                train(local)


            model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # a global: alive to the end
            train(model)
            main()
            """
        )
    )
    store = tmp_path / "store"
    done = subprocess.run(
        auditlog_cmd("run", "--store", str(store), "two.py"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(invoke("snapshots", "--store", str(store), "--format", "json").stdout)
    assert [(r["trigger"], r["module"]) for r in rows] == [
        ("sealed", "(Sequential)"),
        (
            "sealed",
            "(Sequential)#2",
        ),  # sealed at its optimizer step: named by the root of its tensors
        ("released", "(Sequential)#2"),
        ("run_end", "(Sequential)"),
    ]
    assert "released" in (Path(__file__).parents[1] / "docs" / "events.md").read_text()
