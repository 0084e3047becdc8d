"""The columns of a stored event row, defined once.

Every place that lists the columns derives them from ``COLUMNS``: the SQL table
(``store/schema.py``), the insert (``store/eventstore.py``), the tuples ``verify``
reads (``store/queries.py``), the read model's Arrow copy and its DuckDB table
(``store/readmodel/arrowcopy.py``, ``tables.py``), the export's Parquet schema
(``archive/write.py``), the type check of a stored row (``integrity/chaincheck.py``),
the fields of an inclusion proof (``integrity/proofs.py``), the output of
``auditlog events`` and the row table of ``docs/events.md``.

What is hashed is fixed by the chain format (``core/chain.py``): the ``hashed``
columns, in this order, as one compact JSON array. Reordering, adding or removing a
hashed column is a new chain format; old records must still verify under the old
one. ``hashed_columns(n)`` is the canonical row of chain format ``n``.

``RETIRED`` are columns the table no longer has but an older chain format still
hashes, each with the value every stored row held: ``snapshot`` (always NULL;
snapshot contents are named in the ``snapshot_taken`` payload) was hashed by chain
format 1 between ``tensor_id`` and ``payload`` and dropped by revision 0005 with
chain format 2 (docs/events.md, "The event row"). A v1 event is hashed with that
NULL in its place, exactly as it was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowColumn:
    """One column of the ``events`` table.

    ``sql`` is the portable SQL type (``INTEGER``, ``BIGINT``, ``VARCHAR(n)``,
    ``TEXT``), ``arrow`` the pyarrow type alias of the column in Arrow copies and
    Parquet archives, ``json`` whether its text is a JSON document (the payload),
    ``hashed`` whether the chain hash covers it.
    """

    name: str
    sql: str
    arrow: str
    nullable: bool
    hashed: bool
    meaning: str
    json: bool = False

    @property
    def python(self) -> type:
        """The Python type a driver returns for a non-NULL value."""
        return int if self.arrow == "int64" else str


COLUMNS: tuple[RowColumn, ...] = (
    RowColumn(
        "id", "INTEGER", "int64", False, False, "insertion order in the event store (autoincrement)"
    ),
    RowColumn("run_id", "VARCHAR(32)", "string", False, True, "the run (32 hex digits)"),
    RowColumn(
        "stream", "INTEGER", "int64", False, True, "the run's stream: rank + 1000000 * segment"
    ),
    RowColumn("seq", "BIGINT", "int64", False, True, "position in the stream, 1-based, no gaps"),
    RowColumn(
        "ts_ns", "BIGINT", "int64", False, True, "wall-clock time in nanoseconds since the epoch"
    ),
    RowColumn("kind", "VARCHAR(32)", "string", False, True, "the event kind (below)"),
    RowColumn(
        "step",
        "BIGINT",
        "int64",
        True,
        True,
        "optimizer steps completed when the event was recorded",
    ),
    RowColumn(
        "module_id", "BIGINT", "int64", True, True, "the module the event is about (per-stream id)"
    ),
    RowColumn(
        "tensor_id", "BIGINT", "int64", True, True, "the tensor the event is about (per-stream id)"
    ),
    RowColumn(
        "payload",
        "TEXT",
        "string",
        False,
        True,
        "the kind's fields as JSON text, hashed verbatim",
        json=True,
    ),
    RowColumn(
        "hash", "VARCHAR(64)", "string", False, False, "SHA-256 chain hash (hex) of the event"
    ),
)

BY_NAME: dict[str, RowColumn] = {c.name: c for c in COLUMNS}


@dataclass(frozen=True)
class RetiredColumn:
    """A column the table no longer has that chain formats up to ``last_chain`` hash.

    Every stored row held NULL there, so a row without the column is hashed with
    NULL in its place. ``before``: the column it stood before in those formats'
    canonical rows; ``revision``: the store revision that dropped it.
    """

    column: RowColumn
    before: str
    last_chain: int
    revision: str


RETIRED: tuple[RetiredColumn, ...] = (
    RetiredColumn(
        RowColumn(
            "snapshot",
            "VARCHAR(64)",
            "string",
            True,
            True,
            "always NULL; snapshot contents are named in the snapshot_taken payload",
        ),
        before="payload",
        last_chain=1,
        revision="0005",
    ),
)

CHAIN_NUMBERS: tuple[int, ...] = (1, 2)
"""The chain formats (``core/chain.py``): 2, the current one, hashes ``HASHED_COLUMNS``."""


def _with_retired(names: tuple[str, ...], chain: int) -> tuple[str, ...]:
    """``names`` with the retired columns chain format ``chain`` hashes in their old places."""
    out = list(names)
    for retired in RETIRED:
        if chain <= retired.last_chain:
            out.insert(out.index(retired.before), retired.column.name)
    return tuple(out)


def hashed_columns(chain: int) -> tuple[str, ...]:
    """The canonical row of chain format ``chain``: the hashed columns in order, with the
    retired columns that format still hashes in their old places."""
    return _with_retired(tuple(c.name for c in COLUMNS if c.hashed), chain)


def retired_columns(chain: int) -> tuple[str, ...]:
    """The retired columns chain format ``chain`` hashes (NULL in every stored row)."""
    return tuple(r.column.name for r in RETIRED if chain <= r.last_chain)


ALL_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS)
"""Every column, ``id`` first: what the read model copies."""

STORED_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.name != "id")
"""What the writer inserts (the database assigns ``id``)."""

HASHED_COLUMNS: tuple[str, ...] = hashed_columns(CHAIN_NUMBERS[-1])
"""The canonical row of the current chain format, in order: the JSON array its hash covers."""

STREAM_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in COLUMNS if c.name not in ("run_id", "stream")
)
"""The columns of the rows of one stream (its run and stream given): ``verify``'s tuples."""

ARCHIVE_COLUMNS: tuple[str, ...] = tuple(c for c in STREAM_COLUMNS if c != "id")
"""An export's event files: run and stream are Hive partitions, ``id`` is the store's own."""


def archive_columns(chain: int) -> tuple[str, ...]:
    """The event files of archives written before the retired columns were dropped
    (``auditlog-archive-v1``: every stream of chain format 1, the retired columns in place)."""
    return _with_retired(ARCHIVE_COLUMNS, chain)


def arrow_type(name: str) -> str:
    """The Arrow type alias of a column, current or retired."""
    column = BY_NAME.get(name) or next(r.column for r in RETIRED if r.column.name == name)
    return column.arrow


JSON_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.json)


def output_columns() -> tuple[str, ...]:
    """The columns of ``auditlog events --format json|csv``: the stored row without ``id``,
    the time as ISO text, each id followed by its name from replay, and whether the event
    matches the chain, the payload last."""
    out: list[str] = []
    for name in STORED_COLUMNS:
        if name in JSON_COLUMNS:
            continue
        out.append({"ts_ns": "time"}.get(name, name))
        if name in ("module_id", "tensor_id"):
            out.append(name.removesuffix("_id"))
    return (*out, "chain_ok", *JSON_COLUMNS)


def columns_markdown() -> str:
    """The row table of ``docs/events.md``."""
    rows = ["| column | SQL | Arrow | null | hashed | meaning |", "|---|---|---|---|---|---|"]
    for c in COLUMNS:
        yes = {True: "yes", False: ""}
        rows.append(
            f"| `{c.name}` | {c.sql} | {c.arrow} | {yes[c.nullable]} | {yes[c.hashed]} | {c.meaning} |"
        )
    return "\n".join(rows) + "\n"
