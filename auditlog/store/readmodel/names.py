"""Module and tensor rows of the read model, from a Python replay of construction.

``ReadModel._replay_names`` replays the construction events of the streams a
refresh touched (``auditlog.core.replay``), labels them (``auditlog.core.naming``)
and writes these rows; the derivations copy the labels into every other table.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from auditlog.core.naming import Labels
from auditlog.core.replay import ModelState
from auditlog.core.values import stat_float

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
        ("source_kind", pa.string()),
        ("ordinal", pa.int32()),
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


def module_rows(
    run_id: str, stream: int, state: ModelState, labels: Labels
) -> Iterator[dict[str, Any]]:
    # ``labels.modules`` is in the model's order (naming._walk: roots in order of
    # first appearance, each depth-first with children in registration order, as
    # named_modules() and ``auditlog tree`` list them): ``ordinal`` keeps it.
    for ordinal, (module_id, label) in enumerate(labels.modules.items()):
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
            "source_kind": (node.source or {}).get("kind"),
            "ordinal": ordinal,
        }


def tensor_rows(run_id: str, stream: int, labels: Labels) -> Iterator[dict[str, Any]]:
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
