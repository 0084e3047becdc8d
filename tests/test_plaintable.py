"""``cli.plaintable`` draws exactly what rich draws (into a pipe, or a terminal), or declines.

Many random tables (titles, empty ones, cells with spaces, narrow consoles) are
drawn both ways; every table the plain renderer accepts must be rich's text
byte for byte, and the ones it declines are the ones rich would lay out itself.
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

from auditlog.cli.plaintable import plain_table
from helpers import record_run
from rich.console import Console
from rich.table import Table
from rich.text import Text


def _rich(
    title: str | None,
    columns: list[str],
    rows: list[list[str]],
    width: int,
    colours: str | None = "none",
) -> str:
    """What rich prints: into a pipe (``colours="none"``), or as to a terminal with a colour system."""
    buffer = io.StringIO()
    terminal = {} if colours == "none" else {"force_terminal": True, "color_system": colours}
    console = Console(
        file=buffer,
        soft_wrap=False,
        width=width,
        markup=False,
        emoji=False,
        highlight=False,
        **terminal,
    )
    table = Table(
        title=None if title is None else Text(title), show_lines=False, header_style="bold"
    )
    for column in columns:
        table.add_column(Text(column), overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
    return buffer.getvalue()


def test_plain_tables_are_riches_text() -> None:
    rng = random.Random(7)
    drawn = declined = 0
    for _ in range(2000):
        columns = [
            "".join(rng.choice("ab z_") for _ in range(rng.randint(0, 8)))
            for _ in range(rng.randint(1, 6))
        ]
        rows = [
            [
                "".join(
                    rng.choice("ab 01.:-") for _ in range(rng.randint(0, rng.choice([3, 12, 40])))
                )
                for _ in columns
            ]
            for _ in range(rng.choice([0, 1, 2, 5]))
        ]
        title = rng.choice([None, "", "runs in /tmp/x", "t" * rng.randint(1, 60)])
        width = rng.choice([200, 80, 40])
        colours = rng.choice(["none", None, "standard", "256", "truecolor"])  # a pipe, or terminals
        lines = plain_table(title, columns, rows, width, bold=colours not in ("none", None))
        if lines is None:
            declined += 1
            continue
        drawn += 1
        expected = _rich(title, columns, rows, width, colours)
        assert "".join(line + "\n" for line in lines) == expected, (title, columns, rows, colours)
    assert drawn > 800 and declined > 100


def test_declines_what_rich_measures_itself() -> None:
    assert (
        plain_table(None, ["name"], [["naïve"]], 200) is None
    )  # not ASCII: rich's own cell widths
    assert plain_table(None, ["name"], [["a\tb"]], 200) is None
    assert (
        plain_table(None, ["a", "b"], [["x" * 150, "y" * 60]], 200) is None
    )  # too wide: rich folds
    assert plain_table("t" * 30, ["a"], [["b"]], 200) is None  # a title wider than the table wraps


def test_runs_into_a_pipe_needs_no_rich(tmp_path: Path) -> None:
    """``auditlog runs`` into a pipe: the same text as before, without importing rich."""
    store = tmp_path / "store"
    record_run(store, steps=1, name="plain", snapshot_initial=False, snapshot_final=False)
    probe = (
        "import sys\n"
        "from auditlog.cli.main import main\n"
        f"sys.argv = ['auditlog', 'runs', '--store', {str(store)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('rich' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr
    assert "plain" in done.stdout and done.stdout.splitlines()[1].startswith("┏")
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "auditlog.cli.main",
            "runs",
            "--store",
            str(store),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    info = json.loads(listed.stdout)[0]
    assert info["run_id"][:12] in done.stdout
