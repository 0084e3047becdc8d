"""Names in the read model: replay a stream's construction and label its modules and tensors.

Events carry identities; the ``modules`` and ``tensors`` tables of the
projection hold the labels ``auditlog.core.naming`` gives them, and every row
that carries a label is rewritten when a later registration changes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa

from auditlog.core.naming import Labels, attached_ids, label_state
from auditlog.core.replay import CONSTRUCTION_KINDS, ModelState, apply
from auditlog.core.values import stat_float
from auditlog.store.readmodel import tables


def replay_names(con: duckdb.DuckDBPyConnection, streams: list[tuple[str, int]]) -> None:
    """Replace the module and tensor rows of ``streams`` by a fresh replay of their construction.

    Construction events come from the projection and from the chunk being
    applied (``new_events``). Labels that changed are rewritten where rows
    already carry them (``tables.RELABEL``).
    """
    keys = pa.table({"run_id": [r for r, _ in streams], "stream": pa.array([s for _, s in streams], pa.int64())})
    con.register("touched_streams", keys)
    kinds = ", ".join(f"'{k}'" for k in CONSTRUCTION_KINDS)
    columns = "e.run_id, e.stream, e.seq, e.kind, e.module_id, e.tensor_id, e.payload"
    join = f"JOIN touched_streams t ON t.run_id = e.run_id AND t.stream = e.stream WHERE e.kind IN ({kinds})"
    cursor = con.execute(
        f"""SELECT {columns} FROM {tables.SCHEMA}.events e {join}
            UNION ALL
            SELECT {columns} FROM new_events e {join}
            ORDER BY 1, 2, 3"""
    )
    states: dict[tuple[str, int], ModelState] = {key: ModelState() for key in streams}
    attached: dict[tuple[str, int], set[int]] = {key: set() for key in streams}
    while True:
        rows = cursor.fetchmany(10_000)
        if not rows:
            break
        for run_id, stream, seq, kind, module_id, tensor_id, payload in rows:
            event = {"seq": seq, "kind": kind, "module_id": module_id, "tensor_id": tensor_id, "payload": payload}
            apply(states[(run_id, stream)], event)
            attached[(run_id, stream)] |= attached_ids([event])
    schema_ = tables.SCHEMA
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE old_modules AS
            SELECT x.run_id, x.stream, x.module_id, x.module FROM {schema_}.modules x
            JOIN touched_streams t ON t.run_id = x.run_id AND t.stream = x.stream"""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE old_tensors AS
            SELECT x.run_id, x.stream, x.tensor_id, x.name, x.module FROM {schema_}.tensors x
            JOIN touched_streams t ON t.run_id = x.run_id AND t.stream = x.stream"""
    )
    for table in ("modules", "tensors"):
        con.execute(
            f"""DELETE FROM {schema_}.{table} x USING touched_streams t
                WHERE x.run_id = t.run_id AND x.stream = t.stream"""
        )
    con.unregister("touched_streams")
    module_rows: list[dict[str, Any]] = []
    tensor_rows: list[dict[str, Any]] = []
    for (run_id, stream), state in states.items():
        labels = label_state(state, attached[(run_id, stream)])
        module_rows.extend(_module_rows(run_id, stream, state, labels))
        tensor_rows.extend(_tensor_rows(run_id, stream, labels))
    if module_rows:
        con.register("new_modules", pa.Table.from_pylist(module_rows, schema=MODULE_SCHEMA))
        con.execute(f"INSERT INTO {schema_}.modules SELECT * FROM new_modules")
        con.unregister("new_modules")
    if tensor_rows:
        con.register("new_tensors", pa.Table.from_pylist(tensor_rows, schema=TENSOR_SCHEMA))
        con.execute(f"INSERT INTO {schema_}.tensors SELECT * FROM new_tensors")
        con.unregister("new_tensors")
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE changed_modules AS
            SELECT n.run_id, n.stream, n.module_id, n.module FROM {schema_}.modules n
            JOIN old_modules o
                ON o.run_id = n.run_id AND o.stream = n.stream AND o.module_id = n.module_id
            WHERE o.module IS DISTINCT FROM n.module"""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE changed_tensors AS
            SELECT n.run_id, n.stream, n.tensor_id, n.name, n.module FROM {schema_}.tensors n
            JOIN old_tensors o
                ON o.run_id = n.run_id AND o.stream = n.stream AND o.tensor_id = n.tensor_id
            WHERE o.name IS DISTINCT FROM n.name OR o.module IS DISTINCT FROM n.module"""
    )
    counts = con.execute("SELECT (SELECT count(*) FROM changed_modules), (SELECT count(*) FROM changed_tensors)").fetchone()
    if counts is not None and (counts[0] or counts[1]):
        for sql in tables.RELABEL:
            con.execute(sql)
    for temp in ("old_modules", "old_tensors", "changed_modules", "changed_tensors"):
        con.execute(f"DROP TABLE {temp}")




MODULE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("stream", pa.int32()),
        ("module_id", pa.int64()),
        ("module", pa.string()),
        ("path", pa.string()),
        ("root", pa.string()),
        ("class", pa.string()),
        ("parent_id", pa.int64()),
        ("attr", pa.string()),
        ("depth", pa.int32()),
        ("aliases", pa.list_(pa.string())),
        ("n_children", pa.int32()),
        ("n_parameters", pa.int32()),
        ("n_buffers", pa.int32()),
        ("source_file", pa.string()),
        ("source_line", pa.int32()),
        ("source_function", pa.string()),
    ]
)

TENSOR_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("stream", pa.int32()),
        ("tensor_id", pa.int64()),
        ("role", pa.string()),
        ("name", pa.string()),
        ("aliases", pa.list_(pa.string())),
        ("module_id", pa.int64()),
        ("module", pa.string()),
        ("attr", pa.string()),
        ("shape", pa.list_(pa.int64())),
        ("numel", pa.int64()),
        ("dtype", pa.string()),
        ("device", pa.string()),
        ("requires_grad", pa.bool_()),
        ("persistent", pa.bool_()),
        ("source_file", pa.string()),
        ("source_line", pa.int32()),
        ("source_function", pa.string()),
        ("init_sha256", pa.string()),
        ("init_norm", pa.float64()),
        ("init_mean", pa.float64()),
        ("init_std", pa.float64()),
        ("init_min", pa.float64()),
        ("init_max", pa.float64()),
        ("init_nan", pa.int64()),
        ("init_inf", pa.int64()),
    ]
)


def _source_fields(source: dict[str, Any] | None) -> dict[str, Any]:
    source = source or {}
    line = source.get("line")
    return {
        "source_file": source.get("file"),
        "source_line": int(line) if isinstance(line, int) else None,
        "source_function": source.get("function"),
    }



def _stat_int(value: Any) -> int | None:
    number = stat_float(value)
    return None if number is None or not math.isfinite(number) else int(number)


def _module_rows(run_id: str, stream: int, state: ModelState, labels: Labels) -> Iterator[dict[str, Any]]:
    for module_id, label in labels.modules.items():
        node = state.modules[module_id]
        yield {
            "run_id": run_id,
            "stream": stream,
            "module_id": module_id,
            "module": label.label,
            "path": label.path,
            "root": label.root,
            "class": label.cls,
            "parent_id": label.parent_id,
            "attr": label.attr,
            "depth": label.depth,
            "aliases": label.aliases,
            "n_children": sum(1 for c in node.children.values() if c is not None),
            "n_parameters": sum(1 for t in node.parameters.values() if t is not None),
            "n_buffers": sum(1 for t in node.buffers.values() if t is not None),
            **_source_fields(node.source),
        }


def _tensor_rows(run_id: str, stream: int, labels: Labels) -> Iterator[dict[str, Any]]:
    for tensor_id, label in labels.tensors.items():
        info = label.info
        stats = info.initial_stats or {}
        shape = [int(d) for d in info.shape] if info.shape is not None else None
        yield {
            "run_id": run_id,
            "stream": stream,
            "tensor_id": tensor_id,
            "role": label.role,
            "name": label.label,
            "aliases": label.aliases,
            "module_id": label.module_id,
            "module": labels.module_label(label.module_id),
            "attr": label.attr,
            "shape": shape,
            "numel": math.prod(shape) if shape is not None else None,
            "dtype": info.dtype,
            "device": info.device,
            "requires_grad": info.requires_grad,
            "persistent": info.persistent,
            **_source_fields(info.source),
            "init_sha256": info.initial_sha256,
            "init_norm": stat_float(stats.get("norm")),
            "init_mean": stat_float(stats.get("mean")),
            "init_std": stat_float(stats.get("std")),
            "init_min": stat_float(stats.get("min")),
            "init_max": stat_float(stats.get("max")),
            "init_nan": _stat_int(stats.get("nan")),
            "init_inf": _stat_int(stats.get("inf")),
        }


