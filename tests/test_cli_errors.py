"""CLI conventions: help everywhere, run selection, argument errors as one line.

Errors are a single ``Error: ...`` line on stderr with the documented exit code
(1 error, 2 usage, 3 store refused), and never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from auditlog.cli.main import cli
from helpers import CliResult, assert_one_line_error, invoke, record_run

from auditlog.core.kinds import KINDS

# Two runs whose ids share the prefix "abc" (crafted: random uuids share a
# prefix only by chance), recorded in this order with these names.
FIRST_ID = "abc1" + "0" * 28
SECOND_ID = "abc2" + "f" * 28


def event_run_ids(result: CliResult) -> set[str]:
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows, "no events listed"
    return {r["run_id"] for r in rows}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with FIRST_ID (name 'baseline') then SECOND_ID (name 'tuned'); read-only in tests."""
    path = tmp_path_factory.mktemp("runs") / "store"
    # record from inside the temp dir: run_started inspects the cwd's git repository
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path.parent)
        assert record_run(path, name="baseline", run_id=FIRST_ID) == FIRST_ID
        assert record_run(path, steps=3, name="tuned", run_id=SECOND_ID) == SECOND_ID
    return path


def events(store: Path, *args: str) -> CliResult:
    return invoke("events", "--store", str(store), "--format", "json", "--limit", "5", *args)


# --------------------------------------------------------------------------- help
def _walk(
    command: click.Command, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):  # Click's API: the root group loads each command on demand
        ctx = click.Context(command)
        for name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            found.extend(_walk(sub, (*path, name)))
    return found


COMMANDS = _walk(cli)


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"", "run", "runs", "events", "verify", "db", "db current", "db upgrade"} <= names


@pytest.mark.parametrize(
    "path, command", COMMANDS, ids=[" ".join(p) or "auditlog" for p, _ in COMMANDS]
)
def test_every_command_has_help_and_dash_h(path: tuple[str, ...], command: click.Command) -> None:
    assert command.help and command.help.strip(), f"`auditlog {' '.join(path)}` has no help text"
    result = invoke(*path, "-h")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Usage: ")
    first_line = command.help.strip().splitlines()[0]
    assert first_line.split()[0] in result.stdout
    assert "--help" in result.stdout and "-h" in result.stdout
    assert result.stderr == ""
    # --help says the same
    assert invoke(*path, "--help").stdout == result.stdout


# --------------------------------------------------------------------------- run selection
def test_unknown_run_id_is_an_error(two_runs: Path) -> None:
    assert_one_line_error(events(two_runs, "zzz"), 1, "no run matches", "'zzz'")
    assert_one_line_error(
        invoke("verify", "--store", str(two_runs), "0123456789abcdef"), 1, "no run matches"
    )


def test_ambiguous_prefix_is_an_error(two_runs: Path) -> None:
    line = assert_one_line_error(events(two_runs, "abc"), 1, "ambiguous", "'abc'", "2 runs")
    assert FIRST_ID[:12] in line and SECOND_ID[:12] in line
    assert_one_line_error(invoke("verify", "--store", str(two_runs), "ab"), 1, "ambiguous")


@pytest.mark.parametrize(
    "selector, expected",
    [
        (FIRST_ID, FIRST_ID),
        (SECOND_ID, SECOND_ID),
        ("abc1", FIRST_ID),
        ("abc2f", SECOND_ID),
        ("ABC1", FIRST_ID),  # prefixes are case-insensitive, ids are lowercase hex
        ("latest", SECOND_ID),
        ("latest~0", SECOND_ID),
        ("latest~1", FIRST_ID),
        ("baseline", FIRST_ID),
        ("tuned", SECOND_ID),
    ],
)
def test_run_selectors(two_runs: Path, selector: str, expected: str) -> None:
    assert event_run_ids(events(two_runs, selector)) == {expected}


def test_latest_is_the_default_run(two_runs: Path) -> None:
    assert event_run_ids(events(two_runs)) == {SECOND_ID}
    result = invoke("verify", "--store", str(two_runs))
    assert result.exit_code == 0, result.stderr
    assert SECOND_ID[:12] in result.stdout and FIRST_ID[:12] not in result.stdout


@pytest.mark.parametrize("selector", ["latest~2", "latest~x", "latest~-1", "latest~"])
def test_latest_beyond_the_oldest_run_is_an_error(two_runs: Path, selector: str) -> None:
    assert_one_line_error(events(two_runs, selector), 1, f"no run '{selector}'")


def test_verify_selects_runs_the_same_way(two_runs: Path) -> None:
    result = invoke("verify", "--store", str(two_runs), "baseline")
    assert result.exit_code == 0, result.stderr
    assert f"run {FIRST_ID[:12]}:" in result.stdout and "intact" in result.stdout
    result = invoke("verify", "--store", str(two_runs), "latest~1")
    assert result.exit_code == 0 and f"run {FIRST_ID[:12]}:" in result.stdout


def test_empty_store_says_no_runs_yet(store: Path) -> None:
    assert invoke("db", "upgrade", "--store", str(store)).exit_code == 0
    for command in (("events",), ("verify",), ("events", "latest~1"), ("verify", "abc")):
        assert_one_line_error(invoke(*command, "--store", str(store)), 1, "no runs yet")
    result = invoke("runs", "--store", str(store), "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout) == []


# --------------------------------------------------------------------------- events filters
def test_unknown_kind_is_a_usage_error_listing_the_kinds(two_runs: Path) -> None:
    line = assert_one_line_error(
        events(two_runs, "--kind", "bogus"), 2, "unknown event kind 'bogus'"
    )
    for kind in KINDS:
        assert kind in line
    # a known kind filters
    result = events(two_runs, "--kind", "optimizer_step")
    assert result.exit_code == 0, result.stderr
    assert {r["kind"] for r in json.loads(result.stdout)} == {"optimizer_step"}


@pytest.mark.parametrize("text", ["abc", "3:1", "-1", "1:2:3", "", "1.5", "1:x"])
def test_bad_step_range_is_a_usage_error(two_runs: Path, text: str) -> None:
    assert_one_line_error(events(two_runs, f"--step={text}"), 2, "bad step range")
    if text:
        assert_one_line_error(events(two_runs, "--step", text), 2, "bad step range")


@pytest.mark.parametrize(
    "text, low, high", [("2", 2, 2), ("1:2", 1, 2), ("2:", 2, 3), (":1", 0, 1), (" 1 : 3 ", 1, 3)]
)
def test_good_step_ranges_filter(two_runs: Path, text: str, low: int, high: int) -> None:
    result = invoke("events", "--store", str(two_runs), "--format", "json", "--step", text)
    assert result.exit_code == 0, result.stderr
    steps = {r["step"] for r in json.loads(result.stdout)}
    assert steps == set(range(low, high + 1)), steps


def test_unknown_format_is_a_click_usage_error(two_runs: Path) -> None:
    result = invoke("events", "--store", str(two_runs), "--format", "xml")
    assert result.exit_code == 2
    assert "Traceback" not in result.stderr
    assert "Invalid value for '--format'" in result.stderr and "xml" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ("events", "--limit", "0"),
        ("runs", "--limit", "-3"),
        ("verify", "--bogus-option"),
        ("nosuchcommand",),
        ("db", "downgrade"),
    ],
)
def test_other_usage_errors_exit_2_without_traceback(two_runs: Path, args: tuple[str, ...]) -> None:
    result = (
        invoke(*args, "--store", str(two_runs)) if args[0] != "nosuchcommand" else invoke(*args)
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert "Error:" in result.stderr
