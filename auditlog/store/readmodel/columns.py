"""What a documented view is made of (``views.py``): its columns and the columns many share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    doc: str


@dataclass(frozen=True)
class View:
    """One view: what a row is, its columns, and its SQL over the stored tables."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    sql: str


def _c(name: str, type_: str, doc: str) -> Column:
    return Column(name, type_, doc)


_TIME = _c("time", "TIMESTAMP", "wall-clock time of the event (UTC)")
_RUN = _c("run_id", "VARCHAR", "run id")
_STREAM = _c("stream", "INTEGER", "stream (distributed rank) the event was recorded in")
_SEQ = _c("seq", "BIGINT", "sequence number of the event in its stream")
_STEP = _c("step", "BIGINT", "optimizer steps completed when the event happened")
_MODULE_ID = _c("module_id", "BIGINT", "module identity within the run's stream")
_CALL = _c(
    "call",
    "INTEGER",
    "position of the module call in its step's activity event (call order, 0-based)",
)
_MODULE = _c("module", "VARCHAR", "qualified module name from replay (roots: (Class))")
