"""Progress bars for long work: on a terminal only, silent in pipes and files.

Library functions report progress through a plain ``progress(done, total)``
callback and know nothing of terminals; this module turns that callback into a
``rich`` bar on stderr when stderr is a terminal, and into nothing otherwise, so
piped output (``--format json | jq``) never carries control characters.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from auditlog.cli.inert import raw

ProgressFn = Callable[[int, int], None]


@contextlib.contextmanager
def progress_bar(description: str, unit: str = "events") -> Iterator[ProgressFn | None]:
    """Yield a ``progress(done, total)`` callback drawing a bar, or None when not on a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TaskProgressColumn(),
        TimeRemainingColumn(),
    )
    # Beneath the command's InertStream: the bar's own escape sequences must pass.
    with Progress(*columns, console=Console(file=raw(sys.stderr)), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None)

        yield update
