"""SQL text for the documented views: scoping to a run or a rank, and the snapshot values relation.

``views.py`` holds the views' definitions (the contract); this module builds the
SQL a session runs from them (see the docstring of ``views.py`` for why
``tensor_values`` reads explicit file lists).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from auditlog.core.ranks import STREAM_STRIDE
from auditlog.store.readmodel.tables import SCHEMA

if TYPE_CHECKING:
    from auditlog.store.readmodel.views import View

# Stored tables a view may name, and the temporary table of run liveness that
# the query session computes in Python (status needs the process table).
BASE_TABLES: tuple[str, ...] = (
    "events",
    "stream_stats",
    "run_started",
    "run_ended",
    "forward_stats",
    "backward_stats",
    "steps",
    "modules",
    "tensors",
    "snapshots",
    "snapshot_catalog",
    "metrics",
    "batches",
)
RUNS_LIVE = "_runs_live"
# Sources without a stream column (a rank filter leaves them whole).
UNSTREAMED = frozenset(("runs_live", "snapshot_catalog"))

# The relation (sha256, index, value) that tensor_values reads, when no native
# snapshot file exists (or the session has no snapshots directory).
NO_VALUES = (
    '(SELECT NULL::VARCHAR AS sha256, NULL::BIGINT AS "index", NULL::DOUBLE AS value WHERE false)'
)


def quote_literal(value: str) -> str:
    """A SQL string literal (run ids are hex, but never trust that in SQL text)."""
    return "'" + value.replace("'", "''") + "'"


def view_sql(
    view: View, run_id: str | None, snapshot_values: str = NO_VALUES, rank: int | None = None
) -> str:
    """The view's SELECT, over all runs or restricted to ``run_id``, and to one ``rank``.

    ``snapshot_values`` is the relation ``tensor_values`` reads (see
    ``snapshot_values_sql``); it is built from the already scoped catalog. A rank
    keeps the rows of its streams (every segment: ``stream % STREAM_STRIDE = rank``).
    """
    sources = {base: f"{SCHEMA}.{base}" for base in BASE_TABLES}
    sources["runs_live"] = RUNS_LIVE
    conditions: dict[str, list[str]] = {k: [] for k in sources}
    if run_id is not None:
        for key in conditions:
            conditions[key].append(f"run_id = {quote_literal(run_id)}")
    if rank is not None:
        for key in conditions:
            if key not in UNSTREAMED:
                conditions[key].append(f"stream % {STREAM_STRIDE} = {int(rank)}")
    sources = {
        k: (f"(SELECT * FROM {v} WHERE {' AND '.join(conditions[k])})" if conditions[k] else v)
        for k, v in sources.items()
    }
    if run_id is not None:
        sources["snapshot_catalog"] = scoped_catalog(run_id)
    elif rank is not None:
        sources["snapshot_catalog"] = f"{SCHEMA}.snapshot_catalog"
    sources["snapshot_values"] = snapshot_values
    return view.sql.format(**sources)


def scoped_catalog(run_id: str | None) -> str:
    """The catalog relation, restricted to the contents ``run_id`` snapshotted (when given)."""
    if run_id is None:
        return f"{SCHEMA}.snapshot_catalog"
    return (
        f"(SELECT * FROM {SCHEMA}.snapshot_catalog WHERE sha256 IN "
        f"(SELECT sha256 FROM {SCHEMA}.snapshots WHERE run_id = {quote_literal(run_id)}))"
    )


def snapshot_values_sql(directory: str, files_by_dtype: dict[str, list[str]]) -> str:
    """The (sha256, index, value) relation over native-layout snapshot files.

    ``files_by_dtype`` maps a dtype to catalog ``file`` paths (relative to
    ``directory``). Files of one dtype share one Parquet schema, so each dtype is
    one ``read_parquet`` over an explicit list; the hash is taken from the file
    name so that a ``sha256`` filter prunes files before they are opened.
    """
    parts = []
    for dtype in sorted(files_by_dtype):
        files = files_by_dtype[dtype]
        if not files:
            continue
        listed = ", ".join(quote_literal(directory.rstrip("/") + "/" + f) for f in files)
        parts.append(
            "SELECT regexp_extract(filename, '([0-9a-f]{64})\\.parquet$', 1) AS sha256, "
            'file_row_number AS "index", value::DOUBLE AS value '
            f"FROM read_parquet([{listed}], filename = true, file_row_number = true)"
        )
    if not parts:
        return NO_VALUES
    return "(" + " UNION ALL ".join(parts) + ")"
