"""The documentation tells the truth: generated pages are current, links resolve,
and every command the README shows runs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from auditlog.cli.main import cli
from auditlog.cli.reference import cli_markdown, pages
from helpers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = (
    "how-it-works.md",
    "policy.md",
    "snapshots.md",
    "query.md",
    "views.md",
    "events.md",
    "integrity.md",
    "cli.md",
    "python.md",
    "performance.md",
    "development.md",
    "CHANGELOG.md",
    "hooks.md",
    "forensics.md",
    "distributed.md",
    "compliance.md",
    "ui.md",
    "data.md",
)


def test_readme_is_a_short_pitch() -> None:
    assert len(README.read_bytes()) <= 12_000


@pytest.mark.parametrize("name", PAGES)
def test_docs_page_exists(name: str) -> None:
    assert (DOCS / name).is_file()


@pytest.mark.parametrize("name", sorted(pages()))
def test_generated_page_is_current(name: str) -> None:
    assert (DOCS / name).read_text() == pages()[name], f"docs/{name} is stale: run `make docs`"


def test_the_cli_reference_sees_an_option_change() -> None:
    """A new option changes the generated page, so the check above fails until `make docs`."""
    before = cli_markdown(cli)
    command = cli.commands["runs"]
    extra = click.Option(["--planted"], help="An option nobody documented.")
    command.params.append(extra)
    try:
        after = cli_markdown(cli)
    finally:
        command.params.remove(extra)
    assert before != after and "--planted" in after and "--planted" not in before


def test_links_resolve() -> None:
    broken = []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken


def readme_commands() -> list[str]:
    """Every ``$ command`` line of the README's console blocks, in order."""
    blocks = re.findall(r"```console\n(.*?)```", README.read_text(), flags=re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def test_readme_shows_commands() -> None:
    commands = readme_commands()
    assert len(commands) >= 10 and all(c.startswith("auditlog ") for c in commands)


def test_readme_make_targets_exist() -> None:
    for target in re.findall(r"^make (\w+)", README.read_text(), flags=re.M):
        done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AUDITLOG_STORE", "AUDITLOG_RUN_ID", "AUDITLOG_KEY")
    }
    for command in readme_commands():
        argv = [sys.executable, "-m", "auditlog.cli.main", *shlex.split(command)[1:]]
        done = subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
        assert done.stdout.strip() or done.stderr.strip(), command  # every command says something
