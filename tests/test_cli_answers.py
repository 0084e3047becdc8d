"""Issue 15, "every command behaves as a careful user expects": the read commands.

One test per behaviour the issue asks for (its items 7-18, 20-23; the section
comments give the item), through the CLI, with the exit code and the exact line a user reads. The
items about ``auditlog run`` and
Ctrl-C (1-6, 17's crash, 19, 21) need real processes: ``test_cli_interrupts.py``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import REPO, CliResult, invoke, record_run
from safetensors import safe_open
from torch import nn

import auditlog
from auditlog.integrity.findings import VERDICTS


def one_error(result: CliResult, code: int) -> str:
    """The single ``Error: ...`` line (and nothing else) of a failed command."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def flat(text: str) -> list[str]:
    """Output lines with runs of spaces collapsed (tables and diff columns pad)."""
    return [" ".join(line.split()) for line in text.splitlines()]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store with one run of 2 optimizer steps (snapshots only at the start and end)."""
    root = tmp_path_factory.mktemp("plain")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        run_id = record_run(root / "store", steps=2, name="plain")
    return root / "store", run_id


# --------------------------------------------------------------------------- 7
class Echo(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _markup_run(store: Path, name: str, arg: str) -> str:
    weird = type("[red]Weird\\", (Echo,), {})
    with auditlog.record(store, name=name, argv=["mark[b]up.py", arg]) as run:
        model = nn.Sequential()
        model.add_module("[/x]", nn.Linear(2, 2))
        inner = weird()
        inner.register_parameter("[foo]hidden", nn.Parameter(torch.ones(2)))
        model.add_module("b\\", inner)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.randn(3, 2)).sum() + inner.get_parameter("[foo]hidden").sum()
        loss.backward()
        opt.step()
    assert run.run_id is not None
    return run.run_id


def test_names_arguments_and_classes_are_printed_literally(store: Path) -> None:
    first = _markup_run(store, "[/x]", "[bold]arg\\")
    _markup_run(store, "[foo]hidden", "x")
    s = ("--store", str(store))
    runs = invoke("runs", *s)
    assert runs.exit_code == 0, runs.stderr
    rows = flat(runs.stdout)
    assert any("[/x]" in r and "mark[b]up.py [bold]arg\\ " in r for r in rows), runs.stdout
    assert any("[foo]hidden" in r for r in rows), runs.stdout
    events = invoke("events", *s, first)
    assert events.exit_code == 0, events.stderr
    event_lines = flat(events.stdout)
    assert any("│ [/x] │ [/x].weight │ weight [2, 2] float32 │" in line for line in event_lines), (
        events.stdout
    )
    assert any(
        "│ b\\ │ b\\.[foo]hidden │ [foo]hidden [2] float32 │" in line for line in event_lines
    )
    assert any("│ b\\ = [red]Weird\\ │" in line for line in event_lines), events.stdout
    tree = invoke("tree", *s, first)
    assert tree.exit_code == 0, tree.stderr
    tree_lines = flat(tree.stdout)
    assert any(line.startswith("├── [/x] (Linear)") for line in tree_lines), tree.stdout
    assert any(line.startswith("└── b\\ ([red]Weird\\) ") for line in tree_lines), tree.stdout
    assert any("[foo]hidden [2] float32" in line for line in tree_lines), tree.stdout
    query = invoke("query", *s, "--run", first, "select name, argv from runs")
    assert query.exit_code == 0, query.stderr
    assert "│ [/x] │" in query.stdout and '"[bold]arg\\\\"' in query.stdout
    diff = invoke("diff", *s, first, "latest")
    assert diff.exit_code == 0, diff.stderr
    diff_lines = flat(diff.stdout)
    assert diff_lines[0].startswith(f"run A {first[:12]} '[/x]' ")
    assert "~ argv [mark[b]up.py, [bold]arg\\] → [mark[b]up.py, x]" in diff_lines, diff.stdout


# --------------------------------------------------------------------------- 8
@pytest.mark.parametrize("command", ["tree", "diff"])
def test_tree_and_diff_offer_only_the_formats_they_have(
    plain: tuple[Path, str], command: str
) -> None:
    help_text = invoke(command, "-h").stdout
    assert "[table|json]" in help_text and "csv" not in help_text
    refused = invoke(command, "--store", str(plain[0]), "--format", "csv")
    assert (
        one_error(refused, 2)
        == "Error: Invalid value for '--format': 'csv' is not one of 'table', 'json'."
    )


# --------------------------------------------------------------------------- 9
@pytest.mark.parametrize(
    "command, usage",
    [
        ("events", "auditlog events [OPTIONS] [RUN]"),
        ("tree", "auditlog tree [OPTIONS] [RUN]"),
        ("diff", "auditlog diff [OPTIONS] [RUN_A] [RUN_B]"),
        ("verify", "auditlog verify [OPTIONS] [RUN|all]"),
        ("restore", "auditlog restore [OPTIONS] [RUN]"),
        ("snapshots", "auditlog snapshots [OPTIONS] [RUN]"),
        ("checkpoint", "auditlog checkpoint [OPTIONS] [RUN|all]"),
        ("export-head", "auditlog export-head [OPTIONS] [RUN]"),
    ],
)
def test_usage_lines_show_optional_arguments_in_brackets(command: str, usage: str) -> None:
    from auditlog.cli.main import cli
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [command, "-h"], prog_name="auditlog")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == f"Usage: {usage}"


# --------------------------------------------------------------------------- 10
@pytest.mark.parametrize("command", [("tree",), ("restore", "-o", "out.pt")])
def test_step_and_seq_together_are_refused(
    plain: tuple[Path, str], command: tuple[str, ...]
) -> None:
    result = invoke(*command, "--store", str(plain[0]), "--step", "1", "--seq", "4")
    assert (
        one_error(result, 2)
        == "Error: --step and --seq both name a point in the run; give one of them"
    )
    assert not Path("out.pt").exists()


# --------------------------------------------------------------------------- 11
def test_a_step_or_seq_beyond_the_run_is_an_error_naming_its_end(plain: tuple[Path, str]) -> None:
    store, run_id = plain
    s = ("--store", str(store))
    no_step = f"Error: run {run_id[:12]} has no step 999 (it recorded steps 0..2)"
    assert one_error(invoke("events", *s, "--step", "999"), 2) == no_step
    assert one_error(invoke("events", *s, "--step", "999:1000"), 2) == no_step
    assert one_error(invoke("tree", *s, "--step", "999"), 2) == no_step
    assert one_error(invoke("restore", *s, "--step", "999", "-o", "x.pt"), 2) == no_step
    last_seq = len(json.loads(invoke("events", *s, "--format", "json").stdout))
    no_seq = f"Error: run {run_id[:12]} has no seq 99999 (its events are seq 1..{last_seq})"
    assert one_error(invoke("tree", *s, "--seq", "99999"), 2) == no_seq
    assert invoke("events", *s, "--step", "1:999").exit_code == 0  # a range may end beyond the run


# --------------------------------------------------------------------------- 12
def test_a_filter_that_matches_nothing_says_so(plain: tuple[Path, str]) -> None:
    store, run_id = plain
    s = ("--store", str(store))
    bad_glob = invoke("events", *s, "--module", "[")
    assert one_error(bad_glob, 1) == f"Error: no module of run {run_id[:12]} matches '['"
    none = invoke("events", *s, "--kind", "recorder_error", "--format", "json")
    assert none.exit_code == 0
    assert json.loads(none.stdout) == []
    assert none.stderr == f"auditlog: no event of run {run_id[:12]} matches these filters\n"


# --------------------------------------------------------------------------- 13
def test_a_name_several_runs_have_is_refused_with_the_candidates(store: Path) -> None:
    older = record_run(store, name="dup")
    newer = record_run(store, name="dup")
    result = invoke("events", "--store", str(store), "dup")
    assert one_error(result, 1) == (
        f"Error: run name 'dup' is ambiguous: 2 runs have it ({older[:12]}, {newer[:12]}, newest last); "
        "select one by id"
    )
    assert invoke("events", "--store", str(store), newer[:8], "--limit", "1").exit_code == 0


# --------------------------------------------------------------------------- 14
def test_events_and_query_name_tensors_and_modules_by_one_rule(store: Path) -> None:
    with auditlog.record(store, name="template"):
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        model = nn.Sequential(
            nn.Embedding(10, 8), nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randint(0, 10, (2, 4))).sum().backward()
        opt.step()
    s = ("--store", str(store))
    events = json.loads(invoke("events", *s, "--format", "json").stdout)
    tensors = {e["tensor_id"]: e["tensor"] for e in events if e["tensor_id"] is not None}
    modules = {e["module_id"]: e["module"] for e in events if e["module_id"] is not None}
    viewed = json.loads(
        invoke(
            "query", *s, "--format", "json", "select tensor_id, parameter as name from parameters"
        ).stdout
    )
    viewed_modules = json.loads(
        invoke("query", *s, "--format", "json", "select module_id, module from modules").stdout
    )
    assert tensors == {r["tensor_id"]: r["name"] for r in viewed if r["tensor_id"] in tensors}
    assert modules == {
        r["module_id"]: r["module"] for r in viewed_modules if r["module_id"] in modules
    }
    names = set(tensors.values())
    assert {n for n, _ in model.named_parameters()} <= names  # the model's own names, plain
    assert "(TransformerEncoderLayer).linear1.weight" in names  # the template layer, prefixed
    assert not any(n.startswith("(Sequential)") for n in names)


# --------------------------------------------------------------------------- 15
def test_restore_checks_before_it_writes(plain: tuple[Path, str], tmp_path: Path) -> None:
    store, run_id = plain
    s = ("--store", str(store))
    empty = invoke("restore", *s, "--step", "1", "--allow-partial", "-o", "r.pt")
    assert (
        one_error(empty, 1)
        == f"Error: no tensor of run {run_id[:12]} was snapshotted at step 1; nothing to restore"
    )
    missing = invoke("restore", *s, "-o", "/nonexistent/dir/r.pt")
    assert (
        one_error(missing, 1)
        == "Error: directory '/nonexistent/dir' does not exist; create it first"
    )
    assert not Path("/nonexistent").exists()
    unknown = invoke("restore", *s, "-o", "x.bin")
    assert one_error(unknown, 2) == (
        "Error: cannot tell the format of 'x.bin' from its extension: name it .safetensors, .pt or .pth, "
        "or give --format"
    )
    assert not list(tmp_path.glob("*.bin"))
    old = os.umask(0o022)
    try:
        written = invoke("restore", *s, "-o", "r.safetensors")
    finally:
        os.umask(old)
    assert written.exit_code == 0, written.stderr
    assert (
        written.stdout == f"wrote 4 tensors of run {run_id[:12]} at end of run to r.safetensors\n"
    )
    assert stat.S_IMODE(Path("r.safetensors").stat().st_mode) == 0o644
    with auditlog.open(store) as opened:
        expected = list(opened.run(run_id).state_dict())
    with safe_open("r.safetensors", "pt") as restored:
        assert list(restored.keys()) == sorted(expected)  # safetensors sorts its header
        assert json.loads(restored.metadata()["auditlog.key_order"]) == expected


# --------------------------------------------------------------------------- 16
def _diff_run(
    store: Path, argv: str, snapshot_every: int, redraw: bool, at_second_line: bool
) -> str:
    with auditlog.record(store, argv=[argv], snapshot_every=snapshot_every) as run:
        torch.manual_seed(0)
        if redraw:
            torch.randn(3)  # the generator is consumed differently: same distribution, other values
        if at_second_line:
            model = nn.Linear(64, 64, bias=False)
        else:
            model = nn.Linear(64, 64, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 64)).sum().backward()
        opt.step()
    assert run.run_id is not None
    return run.run_id


def test_diff_names_changed_keys_moves_and_can_exit_1(store: Path) -> None:
    a = _diff_run(store, "a.py", 0, False, False)
    b = _diff_run(store, "b.py", 4, True, True)
    result = invoke("diff", "--store", str(store), a, b)
    assert result.exit_code == 0, result.stderr
    lines = flat(result.stdout)
    assert "~ policy snapshot_every 0 → 4" in lines, result.stdout
    assert "~ argv [a.py] → [b.py]" in lines, result.stdout
    moved = [line for line in lines if line.startswith("↕ ")]
    assert len(moved) == 2 and moved[0].startswith("↕ (Linear) source ") and " → " in moved[0], (
        result.stdout
    )
    assert "Modules (1 moved)" in lines and "Parameters (1 moved)" in lines
    assert (
        "Initial values 1 tensor was drawn again from the same distribution "
        "(the random generator was consumed differently): weight"
    ) in lines
    assert invoke("diff", "--store", str(store), "--exit-code", a, b).exit_code == 1
    same = invoke("diff", "--store", str(store), "--exit-code", a, a)
    assert same.exit_code == 0 and flat(same.stdout)[-1] == "no differences"


# --------------------------------------------------------------------------- 17 (the crash itself: test_cli_interrupts)
def test_verify_all_on_an_empty_store_says_no_runs(store: Path) -> None:
    assert invoke("db", "upgrade", "--store", str(store)).exit_code == 0
    result = invoke("verify", "--store", str(store), "all")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"no runs in {store}: nothing to verify\n"


# --------------------------------------------------------------------------- 18
def test_a_missing_public_key_is_named_and_refusals_name_the_statement(
    plain: tuple[Path, str],
) -> None:
    store, _ = plain
    missing = invoke("verify", "--store", str(store), "--key", "missing.pub")
    assert one_error(missing, 1) == "Error: no public key at 'missing.pub': no such file"
    allowed = "only read-only queries are allowed (SELECT, WITH, FROM, DESCRIBE, SHOW, EXPLAIN)"
    insert = invoke("query", "--store", str(store), "insert into runs values (1)")
    assert one_error(insert, 2) == f"Error: {allowed}; refused an INSERT statement"
    install = invoke("query", "--store", str(store), "install httpfs")
    assert one_error(install, 2) == f"Error: {allowed}; refused an INSTALL statement"


# --------------------------------------------------------------------------- 20
def test_help_lists_every_exit_code_and_library_errors_name_no_flags(
    plain: tuple[Path, str],
) -> None:
    help_text = " ".join(invoke("-h").stdout.split())
    assert (
        "Exit codes: 0 ok, 1 error, 2 usage, 3 store refused, 4 verify failed, "
        "5 recording failed (--on-error fail), 130 interrupted."
    ) in help_text
    store, run_id = plain
    restore = invoke("restore", "--store", str(store), "--step", "1", "-o", "r.pt")
    assert one_error(restore, 1) == (
        "Error: no snapshot of 0.weight, 0.bias, 2.weight, 2.bias at step 1 "
        "(record with snapshot_every, or allow a partial state_dict)"
    )
    with auditlog.open(store) as opened, pytest.raises(auditlog.AuditlogError) as raised:
        opened.run(run_id).state_dict(step=1)
    assert "--" not in str(raised.value)


# --------------------------------------------------------------------------- 22
def _read_only_bind(source: Path, target: Path) -> bool:
    target.mkdir()
    if subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True
    ).returncode:
        return False
    if subprocess.run(
        ["mount", "-o", "remount,bind,ro", str(target)], capture_output=True
    ).returncode:
        subprocess.run(["umount", str(target)], check=False)
        return False
    return True


def test_a_read_only_store_directory_is_read_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "archive"
    run_id = record_run(source, steps=2)
    mounted = tmp_path / "readonly"
    if not _read_only_bind(source, mounted):
        pytest.skip("cannot make a read-only mount here (needs mount privileges)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    try:
        before = sorted(p.name for p in source.iterdir())
        runs = invoke("runs", "--store", str(mounted), "--format", "json")
        assert runs.exit_code == 0, runs.stderr
        assert [r["run_id"] for r in json.loads(runs.stdout)] == [run_id]
        verified = invoke("verify", "--store", str(mounted), "all")
        assert verified.exit_code == 0, verified.stderr
        assert verified.stdout.splitlines()[0].endswith(": " + VERDICTS["unsigned"])
        counted = invoke(
            "query", "--store", str(mounted), "--format", "csv", "select count(*) as n from runs"
        )
        assert counted.exit_code == 0, counted.stderr
        assert counted.stdout == "n\n1\n"
        assert (
            sorted(p.name for p in source.iterdir()) == before
        )  # nothing written beside the store
    finally:
        subprocess.run(["umount", str(mounted)], check=False)
    # newest events in a -wal without its -shm: cannot be read in place, and says why
    writer = sqlite3.connect(source / "events.db")
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute(
            "UPDATE runs SET last_seen_ns = last_seen_ns + 1"
        )  # the heartbeat: not chained
        writer.commit()
        copy = tmp_path / "copy"
        copy.mkdir()
        for name in ("events.db", "events.db-wal"):
            (copy / name).write_bytes((source / name).read_bytes())
    finally:
        writer.close()
    mounted_copy = tmp_path / "readonly-copy"
    assert _read_only_bind(copy, mounted_copy)
    try:
        refused = invoke("runs", "--store", str(mounted_copy))
        assert one_error(refused, 3) == (
            f"Error: store '{mounted_copy}' is read-only and its newest events are in events.db-wal "
            "without events.db-shm; SQLite cannot read them in place: copy the store to a writable directory"
        )
    finally:
        subprocess.run(["umount", str(mounted_copy)], check=False)


# --------------------------------------------------------------------------- 23
def _complete(words: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What bash completion offers after ``words`` (Click's bash_complete protocol)."""
    env = {
        "_AUDITLOG_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
    }
    from auditlog.cli.main import cli
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [], env=env, prog_name="auditlog")
    assert result.exit_code == 0, result.output
    return [line.split(",", 1)[1] for line in result.stdout.splitlines()]


def test_shell_completion_offers_runs_names_and_kinds(
    plain: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, run_id = plain
    offered = _complete(f"auditlog events --store {store} ", monkeypatch)
    assert offered == ["latest", run_id, "plain"]
    assert _complete(f"auditlog verify --store {store} al", monkeypatch) == [
        "all"
    ]  # "l": no run id starts so
    assert _complete(f"auditlog events --store {store} {run_id[:6]}", monkeypatch) == [run_id]
    assert _complete("auditlog events --kind run_", monkeypatch) == ["run_started", "run_ended"]
    assert _complete("auditlog schema st", monkeypatch) == ["steps"]
    assert _complete("auditlog events --store /nonexistent ", monkeypatch) == ["latest"]
    help_text = " ".join(invoke("-h").stdout.split())
    assert 'eval "$(_AUDITLOG_COMPLETE=bash_source auditlog)"' in help_text


def test_make_test_installs_only_when_pyproject_changed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".installed").write_text("")
    os.utime(venv / ".installed", (2**31, 2**31))  # newer than pyproject.toml
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), "test", f"VENV={venv}"], capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr
    assert [line for line in dry.stdout.splitlines() if not line.startswith("make")] == [
        f"{venv}/bin/python -m pytest -q -n 2 --dist loadfile"
    ]
    os.utime(venv / ".installed", (0, 0))  # older: pyproject.toml changed since
    stale = subprocess.run(
        ["make", "-n", "-C", str(REPO), "test", f"VENV={venv}"], capture_output=True, text=True
    )
    assert "pip install" in stale.stdout
