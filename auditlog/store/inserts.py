"""The events INSERT, one statement per pattern of NULL columns.

A row's NULLs (``step``, ``module_id``, ``tensor_id`` may be NULL)
are left out of the statement instead of bound as ``None``: the stdlib
``sqlite3`` binds ints, floats and strings directly but sends every other value,
``None`` included, through its adapter protocol, whose failed ``__adapt__`` and
``__conform__`` look-ups format two ``AttributeError`` messages per value. That
was ~3,300 CPU instructions per NULL, 2 NULLs in most events: ~1.4-2 us a row,
a tenth of the writer's time on a fast training step (benchmarks/instructions.py,
docs/performance.md). A column left out gets its default, NULL: the stored row is
the same (no migration gives these columns another default; a store altered to
have one would store that value, and ``verify`` would find those rows' hashes
wrong: the chain covers the NULL).

Rows keep their order (the store's ``id`` is the insertion order): a batch is
cut into runs of consecutive rows with the same pattern, one ``executemany``
each (in a training step's batch, nearly all rows share one pattern).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from auditlog.core.eventrow import BY_NAME, STORED_COLUMNS

EVENT_COLUMNS = STORED_COLUMNS  # what the writer inserts (core.eventrow defines them)
EVENT_VALUES = operator.itemgetter(*EVENT_COLUMNS)
"""A row dict's values in ``EVENT_COLUMNS`` order, as one tuple (one C call)."""

_NULLABLE = tuple(i for i, name in enumerate(EVENT_COLUMNS) if BY_NAME[name].nullable)
_NULLABLE_VALUES = operator.itemgetter(*_NULLABLE)
_NONE = type(None)

Pattern = tuple[type, ...]
"""The types of a row's nullable values (in ``_NULLABLE`` order): NoneType where NULL."""


class Inserts:
    """The statements of one parameter style, made once per pattern of NULLs."""

    def __init__(self, paramstyle: str) -> None:
        self.paramstyle = paramstyle
        self._made: dict[Pattern, tuple[str, Callable[[tuple[Any, ...]], Any] | None]] = {}

    def batches(
        self, rows: Sequence[dict[str, Any]]
    ) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
        """``(statement, parameter tuples)`` for each run of rows with the same NULLs, in order."""
        runs: list[tuple[Pattern, list[tuple[Any, ...]]]] = []
        last: Pattern | None = None
        current: list[tuple[Any, ...]] = []
        for values in map(EVENT_VALUES, rows):
            # the types of the nullable values, in C (a NULL's is NoneType): ~0.25 us a row
            pattern = tuple(map(type, _NULLABLE_VALUES(values)))
            if pattern != last:
                last, current = pattern, []
                runs.append((pattern, current))
            current.append(values)
        for pattern, values in runs:
            statement, pick = self._statement(pattern)
            yield statement, values if pick is None else list(map(pick, values))

    def _statement(self, pattern: Pattern) -> tuple[str, Callable[[tuple[Any, ...]], Any] | None]:
        made = self._made.get(pattern)
        if made is None:
            null = {i for i, kind in zip(_NULLABLE, pattern, strict=True) if kind is _NONE}
            kept = [i for i in range(len(EVENT_COLUMNS)) if i not in null]
            # (``kept`` always holds the columns that are never NULL: several positions, so
            # the getter gives a tuple)
            pick = None if not null else operator.itemgetter(*kept)
            made = self._made[pattern] = (
                insert_statement(self.paramstyle, [EVENT_COLUMNS[i] for i in kept]),
                pick,
            )
        return made


def insert_statement(paramstyle: str, columns: Sequence[str] = EVENT_COLUMNS) -> str:
    """The events INSERT of ``columns`` for a positional parameter style (rows are tuples)."""
    count = len(columns)
    if paramstyle == "qmark":
        marks = ["?"] * count
    elif paramstyle == "numeric":
        marks = [f":{i + 1}" for i in range(count)]
    else:  # format / pyformat (psycopg): %s is positional there
        marks = ["%s"] * count
    return f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join(marks)})"
