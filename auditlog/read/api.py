"""The Python read API: ``auditlog.open(store)``, the entry point for notebooks and the CLI.

Every read command of the CLI is one call into this module, so a notebook and
the command line ask the same questions the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import RunNotFoundError, UsageError
from auditlog.read.runs import RunInfo, list_runs, select_run
from auditlog.store.eventstore import EventStore
from auditlog.store.location import SHARDS_DIR, StoreLocation, resolve_store

if TYPE_CHECKING:
    from auditlog.integrity.keys import KeyRing
    from auditlog.integrity.verify import SourcedStatement, VerifyReport
    from auditlog.read.diff import RunDiff
    from auditlog.read.diff_values import ValuesDiff
    from auditlog.read.run import Run
    from auditlog.store.readmodel.querysession import QuerySession
    from auditlog.store.readmodel.views import View

Progress = Callable[[int, int], None]


class Store:
    """An open store, for reading: its runs, their events, verification, SQL and diffs.

    Open one with ``auditlog.open`` (a directory, or a database URL; default
    ``$AUDITLOG_STORE`` or ``./.auditlog``). Use it as a context manager, or
    call ``close()``: an open store holds a database connection pool.

    Example::

        import auditlog

        with auditlog.open(".auditlog") as store:
            for info in store.runs():                       # oldest first
                print(info.run_id[:12], info.status, info.steps)
            run = store.run("latest")                       # id, unique prefix, name, latest~N
            print(run.info().argv, run.verify().ok)
            rows = store.query("select step, max(grad_norm) from steps group by step", run="latest")
            changes = store.diff("latest~1", "latest")      # what changed between two runs

    Runs are selected by full id, a unique id prefix, a run name (refused as
    ambiguous when several runs have it), ``latest`` or ``latest~N`` (N runs
    before the latest).
    """

    def __init__(self, store: EventStore) -> None:
        self.event_store = store

    @property
    def location(self) -> StoreLocation:
        """Where the store lives (``display()`` names it in messages)."""
        return self.event_store.location

    # ------------------------------------------------------------------ runs
    def runs(self) -> list[RunInfo]:
        """Every run, oldest first, with its derived status (completed, failed, crashed, ...)."""
        return list_runs(self.event_store)

    def select(self, selector: str = "latest") -> str:
        """The run id a selector names; ``RunNotFoundError`` when none or several match."""
        return select_run(self.event_store, selector)

    def run(self, selector: str = "latest", rank: int | None = None) -> Run:
        """One run, by selector (see the class docstring); ``rank``: the view of one rank
        of a multi-rank run (its events, its module tree, its values)."""
        from auditlog.read.run import Run  # here: `auditlog runs` never needs it

        return Run(self.event_store, self.select(selector), rank)

    @property
    def revision(self) -> str:
        """The store's schema revision (``auditlog db current``)."""
        return self.event_store.revision

    # ------------------------------------------------------------------ integrity
    def check_file(self) -> None:
        """The database's own structural check (``StoreError`` when the file is damaged)."""
        self.event_store.check_file(self.location.display())

    def verify(
        self,
        selector: str | None = None,
        *,
        keys: KeyRing | None = None,
        statements: Sequence[SourcedStatement] = (),
        progress: Callable[[str], Callable[[int], None] | None] | None = None,
    ) -> list[VerifyReport]:
        """Verify runs: ``selector`` names one run, ``"all"`` every run, None the latest
        (or the runs the exported head ``statements`` are about).

        The database file gets its own structural check first (``StoreError``
        when damaged). ``all`` covers the runs index, every run with events and
        every run with checkpoints or statements, so a run whose index row was
        deleted is still checked. ``progress(run_id)`` may return a per-event
        callback.
        """
        from auditlog.read.run import Run

        store = self.event_store
        self.check_file()
        reports = []
        for run_id in self._runs_to_verify(selector, statements):
            tick = progress(run_id) if progress is not None else None
            reports.append(
                Run(store, run_id).verify(keys=keys, statements=statements, progress=tick)
            )
        return reports

    def _runs_to_verify(
        self, selector: str | None, statements: Sequence[SourcedStatement]
    ) -> list[str]:
        stated = list(dict.fromkeys(s.run_id for _, s in statements))
        if selector == "all":
            return self._every_run(stated)
        if selector is None or selector == "latest":
            if stated and selector is None:
                return stated
            try:
                run_id = self.select("latest")
            except RunNotFoundError:
                # No run_started survives, yet events (or index rows) name runs: the
                # record was altered, and verify of those runs says where; "no runs
                # yet" would pass an edited store off as an empty one.
                found = self._every_run(stated)
                if not found:
                    raise
                return found
            if selector is None:
                return [run_id]
        run_id = self.select(selector)
        for source, statement in statements:
            if statement.run_id != run_id:
                raise UsageError(
                    f"exported head {source!r} is about run {statement.run_id[:12]}, not run {run_id[:12]}; "
                    "verify the statement's own run"
                )
        return [run_id]

    def _every_run(self, stated: list[str]) -> list[str]:
        """The runs index, every run with events, checkpoints or exported heads."""
        store = self.event_store
        indexed = [str(r["run_id"]) for r in store.run_rows()]
        others = set(store.recorded_run_ids()) | set(store.checkpointed_run_ids()) | set(stated)
        return indexed + sorted(others - set(indexed))

    # ------------------------------------------------------------------ questions
    def query_session(
        self,
        run: str | None = None,
        progress: Progress | None = None,
        rank: int | None = None,
        rebuild: bool = False,
    ) -> QuerySession:
        """A read-only DuckDB session over the documented views (``auditlog schema``).

        The read model is brought up to date first (rebuilt when ``rebuild``, or
        when it no longer matches the chain heads and the seal it was built
        from); ``run`` scopes every view to one run, ``rank`` to the streams of
        one rank. Close the session (or use ``with``) when done. The read model
        is a cache, not evidence: ``verify`` is.
        """
        from auditlog.store.readmodel.cache import ReadModel
        from auditlog.store.readmodel.querysession import QuerySession

        run_id = self.select(run) if run is not None else None
        session, _report = QuerySession.open(
            ReadModel(self.event_store), run_id, progress, rank, rebuild
        )
        return session

    def query(
        self,
        sql: str,
        run: str | None = None,
        rank: int | None = None,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """Rows of one read-only SQL statement over the views, as dicts.

        ``timeout``: seconds after which the query is cancelled (``QueryTimeoutError``).
        """
        with self.query_session(run, rank=rank) as session:
            result = session.execute(sql, timeout=timeout)
            return [dict(zip(result.columns, row, strict=True)) for row in result.rows]

    def diff(
        self, run_a: str = "latest~1", run_b: str = "latest", progress: Progress | None = None
    ) -> RunDiff:
        """What differs between two runs: construction, hyperparameters, code and environment."""
        from auditlog.read.diff import diff_runs

        return diff_runs(self.event_store, self.select(run_a), self.select(run_b), progress)

    def diff_values(
        self,
        run_a: str = "latest~1",
        run_b: str = "latest",
        atol: float | None = None,
        rtol: float | None = None,
        progress: Progress | None = None,
    ) -> ValuesDiff:
        """The first step and tensor where two runs' snapshotted values differ (needs torch)."""
        from auditlog.read.diff_values import first_divergence

        return first_divergence(
            self.event_store, self.select(run_a), self.select(run_b), atol, rtol, progress
        )

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the store's connections."""
        self.event_store.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(
    store: str | os.PathLike[str] | StoreLocation | None = None, *, allow_old: bool = False
) -> Store:
    """Open an existing store for reading (default ``$AUDITLOG_STORE`` or ``./.auditlog``).

    A missing, foreign, corrupt or newer store is refused with a ``StoreError``
    and left untouched; an older one too, unless ``allow_old`` (for ``auditlog
    db``), since reading it needs ``auditlog db upgrade`` first.
    """
    spec = store if isinstance(store, StoreLocation) or store is None else os.fspath(store)
    return Store(EventStore.open(spec, create=False, allow_old=allow_old))


# ``auditlog.open``: the public name (``open_store`` inside the package, where ``open`` is the builtin)
open = open_store


# ----------------------------------------------------------------------------------------
# What the CLI needs of the store itself: where a store is, its schema, and the catalogue
# of views. Here rather than imported from ``auditlog.store`` by the CLI, so that the CLI
# reaches the store only through this module (an import contract in pyproject.toml holds
# it to that). Imports are inside the functions: ``auditlog runs`` never pays for them.
__all__ = [
    "SHARDS_DIR",
    "Store",
    "head_revision",
    "open",
    "open_store",
    "parallel_file_checks",
    "resolve_store",
    "upgrade",
    "views",
    "views_markdown",
]


def head_revision() -> str:
    """The schema revision this version of auditlog writes (``auditlog db current``)."""
    from auditlog.store.schema import HEAD_REVISION

    return HEAD_REVISION


def upgrade(store: str | StoreLocation | None) -> tuple[str | None, str]:
    """Create the store if none exists, or bring it to the head revision (``auditlog db
    upgrade``): ``(revision before, revision after)``, ``before`` None for a new store.
    A foreign, corrupt or newer store is refused untouched."""
    from auditlog.store.eventstore import upgrade_store

    return upgrade_store(store)


def views() -> tuple[View, ...]:
    """The documented views ``query`` answers from, with their columns and meaning."""
    from auditlog.store.readmodel.views import VIEWS

    return VIEWS


def views_markdown() -> str:
    """docs/views.md's body: every view and column (``make docs``)."""
    from auditlog.store.readmodel.views import views_markdown as markdown

    return markdown()


@contextmanager
def parallel_file_checks(workers: int | None = None) -> Iterator[bool]:
    """While inside: worker processes check many small snapshot files beside this process
    when a verdict is about to (``auditlog.store.blobprove``; default one per usable CPU,
    at most 4, none on one CPU). For a long-lived reader such as ``auditlog ui``, whose
    first verdict on a run of thousands of small files would otherwise check them one by
    one. Yields whether workers run; verdicts are the same either way."""
    from auditlog.store import blobprove

    try:
        yield blobprove.start(workers)
    finally:
        blobprove.stop()
