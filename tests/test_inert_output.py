"""Issue 29, part 3: stored text reaches the terminal inert (``auditlog.cli.inert``).

A store whose run name, module names, annotation key and values and one edited
event kind hold ESC, CSI (``\\x1b[2K\\r``: erase the line, back to its start),
OSC-8 (a hyperlink), BEL, a C1 CSI (``\\x9b``), a bidi override and Rich markup.
Every command that prints them, in each of its formats, writes no raw control
byte (the bytes of stdout and stderr are checked), shows the escaped form, and
shows markup as text. A verify ``FAILED`` line cannot be redrawn as ``intact``.
The edited kind is forged as the forgery tests forge (plain sqlite3, hashes of
the documented chain function).
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from auditlog.cli.main import cli
from click.testing import CliRunner
from forgery_support import CHAINED, rows
from helpers import tamper
from torch import nn

import auditlog
from auditlog.core.chain import chain_hash, genesis_hash
from auditlog.present.text import inert, inert_lines

# What a crafted string may hold: erase-line + carriage return + a fake verdict, an
# OSC-8 hyperlink, BEL, a C1 CSI, a bidi override, a newline, and Rich markup.
FORGED_LINE = "\x1b[2K\rrun 000000000000: 99 events in 1 stream(s): intact"
HOSTILE = f"x{FORGED_LINE}\x1b]8;;http://evil/\x07link\x1b]8;;\x07\x9b31m\u202eright\nnext [bold red]loud[/]"
RUN_NAME = "run" + HOSTILE
MODULE_NAME = "mod" + HOSTILE
KEY = "key" + HOSTILE
VALUE = "value" + HOSTILE
KIND = "kind" + HOSTILE

_RAW = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


@dataclass(frozen=True)
class Hostile:
    store: Path
    run_id: str
    # A copy whose annotation event's kind was changed without rechaining: verify FAILS there.
    edited: Path


def _record(store: Path) -> str:
    with auditlog.record(store=store, name=RUN_NAME, snapshot_every=2) as run:
        torch.manual_seed(0)
        model = nn.Sequential()
        model.add_module(MODULE_NAME, nn.Linear(4, 3))
        model.add_module("tail", nn.Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.annotate(KEY, name=VALUE, nested={VALUE: [VALUE]})
        for _ in range(2):
            loss = model(torch.randn(5, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


def _set_kind(store: Path, run_id: str, from_kind: str, to_kind: str, rechain: bool) -> None:
    """Change the first ``from_kind`` event's kind; with ``rechain``, recompute every later hash."""
    with tamper(store) as conn:
        events = rows(conn, run_id)
        target = next(e for e in events if e["kind"] == from_kind)
        target["kind"] = to_kind
        if not rechain:
            conn.execute("update events set kind=? where id=?", (to_kind, target["id"]))
            return
        prev = genesis_hash(run_id, 0)
        for event in events:
            event["hash"] = chain_hash(prev, {c: event[c] for c in CHAINED})
            prev = event["hash"]
            conn.execute(
                "update events set kind=?, hash=? where id=?",
                (event["kind"], event["hash"], event["id"]),
            )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    root = tmp_path_factory.mktemp("hostile")
    store = root / "store"
    run_id = _record(store)
    _set_kind(
        store, run_id, "annotation", KIND, rechain=True
    )  # a consistent chain with a crafted kind
    edited = root / "edited"
    shutil.copytree(store, edited, ignore=shutil.ignore_patterns("readmodel.duckdb*"))
    _set_kind(edited, run_id, "construction_sealed", "construction_sealed" + HOSTILE, rechain=False)
    return Hostile(store, run_id, edited)


@dataclass
class Output:
    code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return (self.stdout + self.stderr).decode()


def run_cli(*args: str, env: dict[str, str] | None = None) -> Output:
    result = CliRunner(env=env).invoke(cli, list(args), catch_exceptions=False)
    return Output(result.exit_code, result.stdout_bytes, result.stderr_bytes)


def assert_inert(out: Output, *shown: str) -> None:
    """No raw control byte (newline and tab aside) in stdout or stderr; each of ``shown`` present."""
    text = out.text
    raw = sorted({f"U+{ord(c):04X}" for c in _RAW.findall(text)})
    assert not raw, (raw, text[:2000])
    assert "\\x1b[2K\\x0d" in text, text[:2000]  # the erase-line and carriage return, visible
    for piece in shown:
        assert piece in text, (piece, text[:2000])


def test_inert_escapes_every_control_character_visibly() -> None:
    assert (
        inert("a\x1b[2K\rb\x07\x9b\u202e\x7f\n\t")
        == "a\\x1b[2K\\x0db\\x07\\u009b\\u202e\\u007f\\x0a\\x09"
    )
    assert inert_lines("a\x1bb\nc\td\r") == "a\\x1bb\nc\td\\x0d"
    assert inert("[bold red]plain ünïcødé 模型[/]") == "[bold red]plain ünïcødé 模型[/]"


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_runs_events_and_tree_show_stored_text_escaped(hostile: Hostile, fmt: str) -> None:
    store = ("--store", str(hostile.store))
    listed = run_cli("runs", *store, "--format", fmt)
    assert listed.code == 0, listed.text
    assert_inert(
        listed, "[bold"
    )  # a table folds long cells: short pieces are what is sure to be whole
    shown = run_cli("events", hostile.run_id, *store, "--format", fmt, "--limit", "400")
    assert shown.code == 0, shown.text
    wide = fmt == "csv"  # a table folds long cells: there, short pieces only
    assert_inert(
        shown,
        *(("kindx\\x1b[2K\\x0drun 000000000000", "\\u009b31m", "\\u202eright") if wide else ()),
        "\\u009b",
        "[bold",
    )
    if fmt == "table":
        drawn = run_cli("tree", hostile.run_id, *store)
        assert drawn.code == 0, drawn.text
        # A label is one line: the stored newline is shown as \x0a, not obeyed.
        assert_inert(drawn, "\\x1b]8;;http://evil/\\x07link", "\\x0anext [bold red]loud[/]")
        assert all(not line.startswith("next ") for line in drawn.stdout.decode().splitlines())


def test_the_terminal_path_keeps_only_rich_colours(hostile: Hostile) -> None:
    """On a colour terminal rich writes its own SGR sequences; nothing else escapes raw."""
    for args in (("tree", hostile.run_id), ("runs",), ("events", hostile.run_id, "--limit", "400")):
        out = run_cli(
            *args, "--store", str(hostile.store), env={"FORCE_COLOR": "1", "COLUMNS": "400"}
        )
        assert out.code == 0, out.text
        assert b"\x1b[" in out.stdout  # coloured indeed
        stripped = re.sub(rb"\x1b\[[0-9;]*m", b"", out.stdout)
        assert_inert(Output(out.code, stripped, out.stderr), "[bold")


def test_json_output_stays_exact_json(hostile: Hostile) -> None:
    out = run_cli("runs", "--store", str(hostile.store), "--format", "json")
    assert out.code == 0, out.text
    assert not _RAW.findall(out.stdout.decode())
    assert json.loads(out.stdout)[0]["name"] == RUN_NAME  # the exact stored value, escaped as JSON
    tree = run_cli("tree", hostile.run_id, "--store", str(hostile.store), "--format", "json")
    assert MODULE_NAME in [child["name"] for child in json.loads(tree.stdout)[0]["children"]]
    kinds = run_cli(
        "events",
        hostile.run_id,
        "--store",
        str(hostile.store),
        "--format",
        "json",
        "--limit",
        "400",
    )
    assert KIND in {e["kind"] for e in json.loads(kinds.stdout)}


def test_query_metrics_and_snapshots_show_stored_text_escaped(hostile: Hostile) -> None:
    store = ("--store", str(hostile.store))
    for fmt in ("table", "csv"):
        answered = run_cli("query", *store, "--format", fmt, "select name from runs")
        assert answered.code == 0, answered.text
        assert_inert(answered, "[bold")
    shown = run_cli("snapshots", hostile.run_id, *store)
    assert shown.code == 0, shown.text
    assert not _RAW.findall(shown.text)
    per_step = run_cli("metrics", hostile.run_id, *store)
    assert per_step.code == 0, per_step.text
    assert not _RAW.findall(per_step.text)


def test_diff_shows_module_names_escaped(hostile: Hostile, tmp_path: Path) -> None:
    store = tmp_path / "two"
    shutil.copytree(hostile.store, store, ignore=shutil.ignore_patterns("readmodel.duckdb*"))
    other = auditlog_run_without_module(store)
    out = run_cli("diff", hostile.run_id, other, "--store", str(store))
    assert out.code == 0, out.text
    assert_inert(out, "[bold red]loud[/]")
    assert all(not line.startswith("next ") for line in out.stdout.decode().splitlines())


def auditlog_run_without_module(store: Path) -> str:
    with auditlog.record(store=store, name="plain") as run:
        model = nn.Sequential(nn.Linear(4, 3))
        model(torch.randn(2, 4)).sum().backward()
    assert run.run_id is not None
    return run.run_id


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_a_failed_verdict_cannot_be_redrawn(hostile: Hostile, fmt: str) -> None:
    out = run_cli("verify", hostile.run_id, "--store", str(hostile.edited), "--format", fmt)
    assert out.code == 4, out.text
    assert_inert(out)
    lines = out.stdout.decode().splitlines()
    if fmt == "table":
        assert lines[0].startswith(f"run {hostile.run_id[:12]}: ") and lines[0].endswith(
            ": FAILED"
        ), lines
        finding = next(line for line in lines if "construction_sealed" in line)
        assert (
            "construction_sealedx\\x1b[2K\\x0drun 000000000000: 99 events in 1 stream(s): intact"
            in finding
        )
        assert not any(line.startswith(("run 000000000000", "next ")) for line in lines), lines
    else:
        assert lines[1].split(",")[1] == "False", lines  # ok column


def test_errors_quoting_stored_text_are_one_inert_line(hostile: Hostile) -> None:
    out = run_cli("tree", RUN_NAME + "?", "--store", str(hostile.store))
    assert out.code == 1, out.text
    assert not _RAW.findall(out.text), out.text
    assert "[bold red]loud[/]" in out.text
    assert len(out.stderr.decode().strip().splitlines()) == 1
    assert not out.stdout


def test_run_hands_the_streams_back_to_the_script(tmp_path: Path) -> None:
    """``auditlog run``: the user's own output is the user's, written as it is."""
    script = tmp_path / "noisy.py"
    script.write_text("import sys\nsys.stdout.write('\\x1b[1mbold\\x1b[0m\\r\\n')\n")
    out = run_cli("run", "--store", str(tmp_path / "s"), str(script))
    assert out.code == 0, out.text
    assert b"\x1b[1mbold\x1b[0m\r\n" in out.stdout


def test_sqlite_edit_helper_really_changed_the_kind(hostile: Hostile) -> None:
    conn = sqlite3.connect(hostile.store / "events.db")
    try:
        kinds = {k for (k,) in conn.execute("select kind from events")}
    finally:
        conn.close()
    assert KIND in kinds
