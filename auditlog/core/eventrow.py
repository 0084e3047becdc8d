"""The columns of a stored event row, defined once.

Every place that lists the columns derives them from ``COLUMNS``: the SQL table
(``store/schema.py``), the insert (``store/eventstore.py``), the tuples ``verify``
reads (``store/queries.py``), the read model's Arrow copy
(``store/readmodel/arrowcopy.py``), the export's Parquet schema
(``archive/write.py``), the type check of a stored row (``integrity/chaincheck.py``),
the fields of an inclusion proof (``integrity/proofs.py``), the output of
``auditlog events`` and the row table of ``docs/events.md``.

What is hashed is fixed by the chain format (``core/chain.py``): the ``hashed``
columns, in this order, as one compact JSON array. Reordering or adding a hashed
column is a new chain format; old records must still verify under the old one.

The ``snapshot`` column is always NULL: snapshot contents are named in the
``snapshot_taken`` payload instead (a snapshot holds many tensors, a column holds
one hash). It stays because it is part of every hashed row since the first chain
format: dropping it changes the bytes every stored event was hashed from, so it
needs a chain-format version and a verifier that keeps the old one
(docs/events.md, "The event row").
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
        "snapshot",
        "VARCHAR(64)",
        "string",
        True,
        True,
        "always NULL (kept for the chain format; see above)",
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

ALL_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS)
"""Every column, ``id`` first: what the read model copies."""

STORED_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.name != "id")
"""What the writer inserts (the database assigns ``id``)."""

HASHED_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.hashed)
"""The canonical row, in order: the JSON array the chain hash covers."""

STREAM_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in COLUMNS if c.name not in ("run_id", "stream")
)
"""The columns of the rows of one stream (its run and stream given): ``verify``'s tuples."""

ARCHIVE_COLUMNS: tuple[str, ...] = tuple(c for c in STREAM_COLUMNS if c != "id")
"""An export's event files: run and stream are Hive partitions, ``id`` is the store's own."""

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
