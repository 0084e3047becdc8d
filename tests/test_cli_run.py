"""End-to-end tests of ``auditlog run`` through the real CLI in subprocesses.

Every recording here is a real ``python -m auditlog.cli.main run ...`` process
training a real model into a real SQLite store; the record is then read back
with the public read API (or the CLI) and compared with what the script did.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import EXAMPLES, invoke, load_example, run_auditlog
from torch import nn

import auditlog

pytestmark = pytest.mark.slow

# A tiny, fast training loop shared by the helper scripts written into tmp_path.
TINY_TRAIN = textwrap.dedent(
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)


    def train_step():
        x = torch.randn(16, 4)
        y = torch.randint(0, 2, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    """
)


def write_script(path: Path, body: str) -> Path:
    path.write_text(TINY_TRAIN + textwrap.dedent(body))
    return path


def check(
    proc: subprocess.CompletedProcess[str], code: int = 0
) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == code, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def latest_info(store: Path) -> auditlog.read.runs.RunInfo:
    with auditlog.open(store) as s:
        return s.run("latest").info()


def latest_events(store: Path, kinds: list[str]) -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return list(s.run("latest").events(kinds=kinds))


def latest_module_calls(store: Path) -> list[dict[str, Any]]:
    """Every recorded module call of the latest run (from its ``activity`` events)."""
    with auditlog.open(store) as s:
        return list(s.run("latest").module_calls())


def latest_verify_ok(store: Path) -> bool:
    with auditlog.open(store) as s:
        report = s.run("latest").verify()
    assert not report.problems, [p.describe() for p in report.problems]
    return report.ok


def runs_json(store: Path) -> list[dict[str, Any]]:
    result = invoke("runs", "--store", str(store), "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("AUDITLOG_STORE", "AUDITLOG_RUN_ID")}


# --------------------------------------------------------------------------- replay vs live model
def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def assert_replay_equals(state: Any, root_cls: str, model: nn.Module) -> None:
    """The replayed module tree under the root of class ``root_cls`` is ``model``'s tree."""
    root = state.root_by_class(root_cls)

    replayed_modules = [(name, state.modules[mid].cls) for name, mid in state.named_modules(root)]
    live_modules = list(model.named_modules())
    assert [n for n, _ in replayed_modules] == [n for n, _ in live_modules]
    for (name, cls), (_, module) in zip(replayed_modules, live_modules, strict=True):
        assert cls is not None and cls.endswith("." + type(module).__name__), (
            name,
            cls,
            type(module),
        )

    replayed_params = [
        (name, state.tensors[tid].shape, state.tensors[tid].dtype)
        for name, tid in state.named_parameters(root)
    ]
    live_params = [(name, list(p.shape), _dtype_name(p)) for name, p in model.named_parameters()]
    assert replayed_params == live_params
    assert all(state.tensors[tid].role == "parameter" for _, tid in state.named_parameters(root))

    replayed_buffers = [
        (name, state.tensors[tid].shape, state.tensors[tid].dtype, state.tensors[tid].persistent)
        for name, tid in state.named_buffers(root)
    ]
    live_buffers = []
    for name, buf in model.named_buffers():
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        live_buffers.append(
            (name, list(buf.shape), _dtype_name(buf), leaf not in owner._non_persistent_buffers_set)
        )
    assert replayed_buffers == live_buffers


# --------------------------------------------------------------------------- shared recordings
class Launched:
    """A CLI (or plain python) process run by the background queue, awaited on first use."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.argv = argv
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self._done: subprocess.CompletedProcess[str] | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()

    def run(self) -> None:
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=cli_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            out, err = self.proc.communicate(timeout=300)
            self._done = subprocess.CompletedProcess(self.argv, self.proc.returncode, out, err)
        except BaseException as exc:
            self._error = exc
        finally:
            self._finished.set()

    def result(self) -> subprocess.CompletedProcess[str]:
        assert self._finished.wait(600), f"{self.argv} did not finish"
        if self._error is not None:
            raise self._error
        assert self._done is not None
        return self._done


class Background:
    """Runs ``Launched`` processes one after another on a thread.

    With two CPUs, one example training in the background plus one helper-script
    test in the foreground keeps both busy without the two fighting for one core.
    """

    def __init__(self) -> None:
        self.items: dict[str, Launched] = {}
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="example-runs", daemon=True)

    def add(self, key: str, item: Launched) -> None:
        self.items[key] = item

    def _loop(self) -> None:
        for item in self.items.values():
            if self.stopping:
                item._error = RuntimeError("not run: test module finished")
                item._finished.set()
            else:
                item.run()

    def stop(self) -> None:
        self.stopping = True
        for item in self.items.values():
            if item.proc is not None and item.proc.poll() is None:
                item.proc.kill()
        self.thread.join(60)


CNN_VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "backward-none": ("--backward", "none"),
    "every-3": ("--activity-every", "3"),
}


@pytest.fixture(scope="module", autouse=True)
def examples(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The example trainings this module checks (five recorded, one plain).

    Autouse: they start with the module's first test and run in the background
    while the tests of small helper scripts run; the tests that read them come last.
    """
    cli = [sys.executable, "-m", "auditlog.cli.main", "run", "--store", "S"]
    background = Background()

    def launch(key: str, argv: list[str]) -> None:
        background.add(key, Launched(argv, tmp_path_factory.mktemp(key)))

    launch("mlp", [*cli, str(EXAMPLES / "train_mlp.py"), "--epochs", "2", "--save", "out.pt"])
    launch(
        "cnn-plain",
        [sys.executable, str(EXAMPLES / "train_cnn.py"), "--epochs", "1", "--save", "a.pt"],
    )
    for key, options in CNN_VARIANTS.items():
        launch(
            f"cnn-{key}",
            [*cli, *options, str(EXAMPLES / "train_cnn.py"), "--epochs", "1", "--save", "b.pt"],
        )
    launch("tied", [*cli, str(EXAMPLES / "finetune_tied.py"), "--steps", "3", "--save", "ft.pt"])
    background.thread.start()
    yield background.items
    background.stop()


# --------------------------------------------------------------------------- failures and exit codes
def test_script_exception_is_reported_like_python(tmp_path: Path, store: Path) -> None:
    script = write_script(
        tmp_path / "boom_script.py",
        """
        for _ in range(2):
            train_step()
        raise ValueError("boom at step 2")
        """,
    )
    proc = check(run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path), 1)
    err = proc.stderr
    assert "Traceback (most recent call last)" in err
    assert "ValueError: boom at step 2" in err
    assert "boom_script.py" in err
    assert "auditlog/session.py" not in err
    assert "runpy" not in err
    assert "auditlog/execfile.py" not in err and "run_cmd.py" not in err and "click" not in err
    # the user's frame is the first (and only) frame of the traceback
    frames = [line for line in err.splitlines() if line.lstrip().startswith("File ")]
    assert len(frames) == 1 and "boom_script.py" in frames[0]

    info = latest_info(store)
    assert info.status == "failed"
    assert info.exit_code == 1
    assert info.steps == 2
    assert info.exception is not None
    assert info.exception["type"] == "ValueError"
    assert info.exception["message"] == "boom at step 2"
    assert latest_verify_ok(store)


@pytest.mark.parametrize("code,status", [(3, "failed"), (0, "completed")])
def test_sys_exit_code_is_passed_through(
    tmp_path: Path, store: Path, code: int, status: str
) -> None:
    script = write_script(
        tmp_path / "exiter.py",
        f"""
        import sys
        train_step()
        sys.exit({code})
        """,
    )
    check(run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path), code)
    info = latest_info(store)
    assert info.status == status
    assert info.exit_code == code
    assert info.steps == 1
    assert latest_verify_ok(store)


LONG_TRAIN = """
import time

for _ in range(5):
    train_step()
print("ready", flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    train_step()
print("finished without a signal", flush=True)
"""


def start_long_run(tmp_path: Path, store: Path) -> subprocess.Popen[bytes]:
    script = write_script(tmp_path / "long_train.py", LONG_TRAIN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "auditlog.cli.main", "run", "--store", str(store), str(script)],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen = b""
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while b"ready" not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"script never said ready: {seen + out!r} {err!r}")
        readable, _, _ = select.select([proc.stdout], [], [], remaining)
        if readable:
            chunk = os.read(proc.stdout.fileno(), 4096)
            seen += chunk
    # Keep training past "ready" until the record holds the first steps: the writer
    # flushes every 0.1 s, but on a loaded machine it may be seconds behind, and a
    # kill before then would (rightly) lose what was still queued.
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if store.exists() and _recorded_steps(store) >= 5:
            break
    time.sleep(0.3)
    return proc


def _recorded_steps(store: Path) -> int:
    """Steps of the latest run as committed so far (0 while the store is being created)."""
    try:
        return latest_info(store).steps
    except Exception:  # the run's first events are not committed yet
        return 0


def test_sigterm_records_interrupted_and_dies_by_sigterm(tmp_path: Path, store: Path) -> None:
    proc = start_long_run(tmp_path, store)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
    assert b"finished without a signal" not in out
    assert b"Traceback" not in err

    info = latest_info(store)
    assert info.status == "interrupted"
    assert info.steps > 5
    assert latest_verify_ok(store)
    ended = latest_events(store, ["run_ended"])
    assert len(ended) == 1
    assert ended[0]["payload"]["signal"] == "SIGTERM"
    assert ended[0]["payload"]["status"] == "interrupted"


def test_kill9_shows_crashed_and_store_stays_usable(tmp_path: Path, store: Path) -> None:
    proc = start_long_run(tmp_path, store)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    rows = runs_json(store)
    assert len(rows) == 1
    assert rows[0]["status"] == "crashed"
    assert rows[0]["ended"] is None
    assert rows[0]["steps"] >= 5
    assert latest_verify_ok(store)
    assert latest_events(store, ["run_ended"]) == []

    script = write_script(tmp_path / "after.py", "train_step()\ntrain_step()\n")
    check(run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path))
    rows = runs_json(store)
    assert [r["status"] for r in rows] == ["crashed", "completed"]
    assert rows[1]["steps"] == 2
    verified = invoke("verify", "--store", str(store), "all")
    assert verified.exit_code == 0, verified.stdout + verified.stderr


# --------------------------------------------------------------------------- how the target is run
def test_run_module_with_dash_m(tmp_path: Path, store: Path) -> None:
    pkg = tmp_path / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write_script(
        pkg / "__main__.py",
        """
        import json
        import sys
        train_step()
        train_step()
        print("ARGV=" + json.dumps(sys.argv[1:]))
        print("NAME=" + __name__)
        """,
    )
    proc = check(
        run_auditlog(
            "run", "--store", str(store), "-m", "trainpkg", "--lr", "0.5", "x", cwd=tmp_path
        )
    )
    assert 'ARGV=["--lr", "0.5", "x"]' in proc.stdout
    assert "NAME=__main__" in proc.stdout
    info = latest_info(store)
    assert info.status == "completed" and info.steps == 2
    assert info.argv == ["trainpkg", "--lr", "0.5", "x"]


def test_arguments_after_script_belong_to_the_script(tmp_path: Path, store: Path) -> None:
    script = tmp_path / "show_args.py"
    script.write_text("import json, sys\nprint('ARGV=' + json.dumps(sys.argv[1:]))\n")
    proc = check(
        run_auditlog(
            "run",
            "--store",
            str(store),
            str(script),
            "--store",
            "xyz",
            "--name",
            "q",
            "-m",
            cwd=tmp_path,
        )
    )
    assert 'ARGV=["--store", "xyz", "--name", "q", "-m"]' in proc.stdout
    assert not (tmp_path / "xyz").exists()
    info = latest_info(store)
    assert info.name is None
    assert info.status == "completed"
    assert info.argv[1:] == ["--store", "xyz", "--name", "q", "-m"]


# --------------------------------------------------------------------------- git metadata
def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_and_dirty_flag(tmp_path: Path, store: Path) -> None:
    repo = tmp_path / "repo"
    script, head = make_repo(repo)

    # cwd and store are outside the repo, so only the script decides the git state
    check(run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path))
    rows = runs_json(store)
    assert rows[-1]["git_commit"] == head
    assert rows[-1]["git_dirty"] is False
    started = latest_events(store, ["run_started"])[0]["payload"]
    assert started["git"]["diff_sha256"] is None

    script.write_text(script.read_text() + "train_step()\n")
    check(run_auditlog("run", "--store", str(store), str(script), cwd=tmp_path))
    rows = runs_json(store)
    assert len(rows) == 2
    assert rows[-1]["git_commit"] == head
    assert rows[-1]["git_dirty"] is True
    assert rows[-1]["steps"] == 2
    started = latest_events(store, ["run_started"])[0]["payload"]
    diff = started["git"]["diff_sha256"]
    assert isinstance(diff, str) and len(diff) == 64
    table = invoke("runs", "--store", str(store))
    assert head[:10] + "+dirty" in table.stdout


def make_repo(repo: Path) -> tuple[Path, str]:
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "tests@example.invalid")
    git(repo, "config", "user.name", "Tests")
    git(repo, "config", "commit.gpgsign", "false")
    script = write_script(repo / "train.py", "train_step()\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "initial")
    return script, git(repo, "rev-parse", "HEAD")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_store_inside_repo_does_not_make_code_dirty(tmp_path: Path) -> None:
    """The default store ./.auditlog inside the repository is not part of the code."""
    repo = tmp_path / "repo"
    script, head = make_repo(repo)
    store = repo / ".auditlog"

    check(run_auditlog("run", "train.py", cwd=repo))
    assert store.is_dir()
    rows = runs_json(store)
    assert rows[-1]["git_commit"] == head
    assert rows[-1]["git_dirty"] is False

    script.write_text(script.read_text() + "train_step()\n")
    check(run_auditlog("run", "train.py", cwd=repo))
    check(run_auditlog("run", "train.py", cwd=repo))
    rows = runs_json(store)
    assert [r["git_dirty"] for r in rows] == [False, True, True]
    diffs = [e["payload"]["git"]["diff_sha256"] for e in _all_run_started(store)]
    assert diffs[0] is None
    # the same code hashes the same although the store grew in between
    assert isinstance(diffs[1], str) and diffs[1] == diffs[2]


def _all_run_started(store: Path) -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return [next(iter(s.run(r.run_id).events(kinds=["run_started"]))) for r in s.runs()]


# --------------------------------------------------------------------------- basic run
def test_run_mlp_records_completed_run(examples: dict[str, Launched]) -> None:
    proc = check(examples["mlp"].result())
    store, out = examples["mlp"].cwd / "S", examples["mlp"].cwd / "out.pt"
    assert "epoch 1: loss" in proc.stdout and "epoch 2: loss" in proc.stdout
    assert "auditlog: recording run " in proc.stderr
    assert out.exists()

    listed = check(run_auditlog("runs", "--store", str(store), "--format", "json"))
    rows = json.loads(listed.stdout)
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "completed"
    assert row["exit_code"] == 0
    assert row["steps"] == 16  # 512 samples / batch 64 * 2 epochs
    assert row["argv"][0].endswith("train_mlp.py")
    assert "--epochs" in row["argv"] and row["argv"][row["argv"].index("--epochs") + 1] == "2"
    assert row["events"] > 16
    # the run id announced on stderr is the one recorded
    assert f"recording run {row['run_id']}" in proc.stderr

    verified = invoke("verify", "--store", str(store), "latest")
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert "intact" in verified.stdout


def test_replay_equals_final_mlp(examples: dict[str, Launched]) -> None:
    check(examples["mlp"].result())
    store, out = examples["mlp"].cwd / "S", examples["mlp"].cwd / "out.pt"
    model = load_example("train_mlp").build_model()
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)
    with auditlog.open(store) as s:
        state = s.run("latest").model_state()
    assert_replay_equals(state, "MLP", model)


def test_replay_equals_final_cnn(examples: dict[str, Launched]) -> None:
    check(examples["cnn-default"].result())
    store, out = examples["cnn-default"].cwd / "S", examples["cnn-default"].cwd / "b.pt"
    model = load_example("train_cnn").build_model()
    model.load_state_dict(torch.load(out, weights_only=True), strict=True)
    with auditlog.open(store) as s:
        state = s.run("latest").model_state()
    assert_replay_equals(state, "SmallCNN", model)
    root = state.root_by_class("SmallCNN")
    buffers = dict(state.named_buffers(root))
    assert "features.1.running_mean" in buffers and "features.5.num_batches_tracked" in buffers
    assert state.tensors[buffers["features.1.running_mean"]].persistent is True
    assert state.tensors[buffers["features.1.running_var"]].persistent is True
    assert state.tensors[buffers["features.1.num_batches_tracked"]].dtype == "int64"


def test_replay_tied_weights_and_head_replacement(examples: dict[str, Launched]) -> None:
    check(examples["tied"].result())
    store, saved = examples["tied"].cwd / "S", examples["tied"].cwd / "ft.pt"
    info = latest_info(store)
    assert info.status == "completed" and info.steps == 6  # 3 pretrain + 3 finetune steps
    assert latest_verify_ok(store)

    ft = load_example("finetune_tied")
    with auditlog.open(store) as s:
        run = s.run("latest")
        final = run.model_state()
        root = final.root_by_class("TinyLM")
        head_regs = [
            e
            for e in run.events(kinds=["module_registered"])
            if e["module_id"] == root and e["payload"]["name"] == "lm_head"
        ]
        assert len(head_regs) == 2, head_regs  # built in __init__, replaced by finetune()
        before = run.model_state(upto_seq=head_regs[1]["seq"] - 1)

    # Before fine-tuning: the freshly built TinyLM, one tensor under two names.
    torch.manual_seed(0)
    assert_replay_equals(before, "TinyLM", ft.TinyLM())
    pre_root = before.root_by_class("TinyLM")
    pre_modules = dict(before.named_modules(pre_root))
    embed_w = before.modules[pre_modules["embed"]].parameters["weight"]
    old_head = pre_modules["lm_head"]
    assert before.modules[old_head].parameters["weight"] == embed_w
    assert sorted(before.tensor_names()[embed_w]) == ["embed.weight", "lm_head.weight"]
    assert "lm_head.weight" not in dict(
        before.named_parameters(pre_root)
    )  # deduplicated like torch

    # After fine-tuning: the new Linear(32, 3) head, not tied to anything.
    live = ft.TinyLM()
    live.lm_head = nn.Linear(32, 3)
    live.load_state_dict(torch.load(saved, weights_only=True), strict=True)
    assert_replay_equals(final, "TinyLM", live)
    modules = dict(final.named_modules(root))
    new_head = modules["lm_head"]
    assert new_head != old_head
    assert (final.modules[new_head].cls or "").endswith(".Linear")
    params = dict(final.named_parameters(root))
    assert final.tensors[params["lm_head.weight"]].shape == [3, 32]
    assert final.tensors[params["lm_head.bias"]].shape == [3]
    assert params["lm_head.weight"] != params["embed.weight"]
    buffers = dict(final.named_buffers(root))
    assert final.tensors[buffers["causal"]].persistent is False


# --------------------------------------------------------------------------- numerics untouched
def assert_state_dicts_bitwise_equal(a_path: Path, b_path: Path) -> None:
    a = torch.load(a_path, weights_only=True)
    b = torch.load(b_path, weights_only=True)
    assert list(a) == list(b)
    for key in a:
        ta, tb = a[key], b[key]
        assert ta.dtype == tb.dtype and ta.shape == tb.shape, key
        bytes_a = ta.contiguous().reshape(-1).view(torch.uint8)
        bytes_b = tb.contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(bytes_a, bytes_b), f"{key} differs between plain and recorded training"


@pytest.mark.parametrize("variant", list(CNN_VARIANTS))
def test_recorded_training_is_bitwise_identical(
    examples: dict[str, Launched], variant: str
) -> None:
    check(examples["cnn-plain"].result())
    recorded = examples[f"cnn-{variant}"]
    check(recorded.result())
    store = recorded.cwd / "S"
    assert_state_dicts_bitwise_equal(examples["cnn-plain"].cwd / "a.pt", recorded.cwd / "b.pt")
    options = CNN_VARIANTS[variant]

    info = latest_info(store)
    assert info.status == "completed" and info.steps == 8  # 256 / 32, one epoch
    activity = latest_module_calls(store)
    forwards = [e for e in activity if e["kind"] == "forward"]
    backwards = [e for e in activity if e["kind"] == "backward"]
    assert forwards
    if options == ("--backward", "none"):
        assert backwards == []
    else:
        assert backwards
    if options == ("--activity-every", "3"):
        steps = {e["step"] for e in activity}
        assert steps and all(s % 3 == 0 for s in steps), steps
        assert len(steps) >= 2
    else:
        # the default (audit) policy samples step 0 and every 10th: 8 steps -> step 0 only
        assert {e["step"] for e in forwards} == {0}
