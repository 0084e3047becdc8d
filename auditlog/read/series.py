"""The data behind every picture of a run (``auditlog plot``, ``auditlog report``), as numbers.

A picture is a list of ``Panel`` s: line panels (loss, metrics, learning rate)
hold one series per name; heatmap panels (gradient, parameter and update
norms, activations, dead units) hold modules x steps. The same panels are what
``auditlog plot --format csv`` writes, so every picture's data is there to
check.

Hundreds of modules do not fit as rows. Past ``max_rows`` modules are grouped
by name prefix: the deepest prefix depth (``body.3.attn`` has depth 3) whose
groups fit is used (and when even the top-level names are too many, consecutive
runs of them: ``0…4``), and a group's value is what its members add up to: the L2
norm of all their parameters for norms (so the rows still mean what they say),
the mean of the members for activations and dead units. The panel's note says
so.

Rows are in the model's order (the ``modules`` view's ``ordinal``: depth-first,
children in registration order, as ``auditlog tree`` shows them), so the first
layer is the top row whatever the names sort like (``alpha_head`` after
``layers.11`` when it was registered last); a group sits where its first
member does. Names the module tree does not know (a module of another stream)
follow, in natural order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from auditlog.store.readmodel.forensics import ForensicQueries


PLOTS: dict[str, str] = {
    "loss": "the training loss (and eval_loss) per step",
    "metrics": "every metric (losses and auditlog.log values) per step",
    "lr": "the learning rate of every param group per step",
    "grad-norm": "heatmap: gradient L2 norm of each module's parameters per step, and the total "
    "gradient norm the update used beside the raw one as backward left it (before clipping)",
    "param-norm": "heatmap: L2 norm of each module's parameters per step",
    "update-ratio": "heatmap: update norm / parameter norm of each module per step",
    "activations": "heatmaps: mean and std of each module's output per sampled step",
    "dead-units": "heatmap: fraction of each module's output units that were 0 for the whole batch",
}
MAX_ROWS = 40
HEATMAPS = ("grad-norm", "param-norm", "update-ratio", "activations", "dead-units")


@dataclass
class Panel:
    """One plot: lines (``series``) or a heatmap (``rows`` x ``steps`` in ``cells``)."""

    title: str
    kind: str  # "lines" | "heatmap"
    ylabel: str = ""
    scale: str = "linear"  # "linear" | "log" | "diverging" | "fraction"
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    cells: dict[tuple[str, int], float] = field(default_factory=dict)
    note: str = ""

    @property
    def empty(self) -> bool:
        return not (self.cells if self.kind == "heatmap" else any(self.series.values()))

    def long_rows(self) -> list[dict[str, Any]]:
        """The panel's numbers, one row per point: panel, series (or module), step, value."""
        if self.kind == "heatmap":
            return [
                {"panel": self.title, "series": row, "step": step, "value": self.cells[(row, step)]}
                for row in self.rows
                for step in self.steps
                if (row, step) in self.cells
            ]
        return [
            {"panel": self.title, "series": name, "step": step, "value": value}
            for name, points in self.series.items()
            for step, value in points
        ]


def natural_key(name: str) -> list[Any]:
    """``body.10`` after ``body.9``: digit runs compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def model_order(order: dict[str, int] | None) -> Callable[[str], tuple[Any, ...]]:
    """Sort key of module names (and name prefixes) in the model's order.

    ``order``: module name -> ordinal (``ForensicQueries.module_order``). A prefix
    that is no module's name (a group ``0…4``) sorts with its first member;
    unknown names come last, in natural order.
    """
    known = order or {}
    first: dict[str, int] = {}
    for name, ordinal in known.items():
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if ordinal < first.get(prefix, ordinal + 1):
                first[prefix] = ordinal

    def key(name: str) -> tuple[Any, ...]:
        head = name.split("…")[0]
        ordinal = known.get(head, first.get(head))
        return (0, ordinal, []) if ordinal is not None else (1, 0, natural_key(name))

    return key


def group_names(
    names: list[str], max_rows: int, order: dict[str, int] | None = None
) -> tuple[dict[str, str], int | None]:
    """Map each module name to its row: itself, or its prefix at the deepest depth that fits.

    Returns the mapping and the depth used (None: no grouping was needed).
    ``order``: the model's order (``model_order``), for ranges of top-level names.
    """
    if len(names) <= max_rows:
        return {n: n for n in names}, None
    deepest = max(n.count(".") + 1 for n in names)
    for depth in range(deepest - 1, 0, -1):
        mapping = {n: ".".join(n.split(".")[:depth]) for n in names}
        if len(set(mapping.values())) <= max_rows:
            return mapping, depth
    # Too many top-level names even so (a flat stack of layers): consecutive ranges of them.
    tops = sorted({n.split(".")[0] for n in names}, key=model_order(order))
    size = math.ceil(len(tops) / max_rows)
    label = {}
    for start in range(0, len(tops), size):
        chunk = tops[start : start + size]
        for top in chunk:
            label[top] = chunk[0] if len(chunk) == 1 else f"{chunk[0]}…{chunk[-1]}"
    return {n: label[n.split(".")[0]] for n in names}, 0


def _heatmap(
    title: str,
    values: list[tuple[str, int, float | None]],
    combine: Callable[[list[float]], float],
    max_rows: int,
    scale: str,
    ylabel: str = "",
    order: dict[str, int] | None = None,
) -> Panel:
    """Rows x steps from ``(module, step, value)``; members of a group are combined; rows in
    the model's order (``order``: name -> ordinal)."""
    key = model_order(order)
    names = sorted({m for m, _, _ in values}, key=key)
    mapping, depth = group_names(names, max_rows, order)
    grouped: dict[tuple[str, int], list[float]] = {}
    for module, step, value in values:
        if value is None:
            continue
        grouped.setdefault((mapping[module], step), []).append(float(value))
    rows = sorted({mapping[n] for n in names}, key=key)
    steps = sorted({s for _, s in grouped})
    note = ""
    if depth == 0:
        note = (
            f"{len(names)} modules grouped into {len(rows)} rows of consecutive top-level modules"
        )
    elif depth is not None:
        note = f"{len(names)} modules grouped by name prefix at depth {depth} into {len(rows)} rows"
    cells = {key: combine(members) for key, members in grouped.items()}
    return Panel(
        title, "heatmap", ylabel=ylabel, scale=scale, rows=rows, steps=steps, cells=cells, note=note
    )


def l2(members: list[float]) -> float:
    """The L2 norm of tensors whose norms these are."""
    return math.sqrt(sum(v * v for v in members))


def mean(members: list[float]) -> float:
    return sum(members) / len(members)


def total_grad_norms(q: ForensicQueries) -> Panel:
    """The total gradient norm per step as the update used it and as backward left it: a
    clipped step shows the raw line above the used one."""
    used: list[tuple[int, float]] = []
    raw: list[tuple[int, float]] = []
    for row in q.optimizer_steps():
        if row["grad_norm"] is not None:
            used.append((int(row["iteration"]), float(row["grad_norm"])))
        if row["raw_grad_norm"] is not None:
            raw.append((int(row["iteration"]), float(row["raw_grad_norm"])))
    series = {"used by the update": used}
    if raw:
        series["raw (as backward left it)"] = raw
    return Panel("Total gradient norm", "lines", ylabel="L2 norm", series=series)


def panels(q: ForensicQueries, what: str, max_rows: int = MAX_ROWS) -> list[Panel]:
    """The panels of one picture (``what``: a key of ``PLOTS``)."""
    if what in ("loss", "metrics"):
        series: dict[str, list[tuple[int, float]]] = {}
        for row in q.metrics():
            name = str(row["name"])
            if what == "loss" and not name.endswith("loss"):
                continue
            series.setdefault(name, []).append((int(row["step"]), float(row["value"])))
        title = "Loss" if what == "loss" else "Metrics"
        return [Panel(title, "lines", ylabel="value", series=_mean_per_step(series))]
    if what == "lr":
        lines: dict[str, list[tuple[int, float]]] = {}
        for row in q.learning_rates():
            label = f"optimizer {row['optimizer_id']} group {row['param_group']}"
            lines.setdefault(label, []).append((int(row["step"]), float(row["lr"])))
        return [Panel("Learning rate", "lines", ylabel="lr", series=lines)]
    order = q.module_order() if what in HEATMAPS else None
    if what in ("grad-norm", "param-norm", "update-ratio"):
        norms = q.module_norms()
        if what == "update-ratio":
            updates = [(r["module"], int(r["step"]), r["update_norm"]) for r in norms]
            params = [(r["module"], int(r["step"]), r["param_norm"]) for r in norms]
            top = _heatmap("Update norm", updates, l2, max_rows, "log", order=order)
            bottom = _heatmap("Parameter norm", params, l2, max_rows, "log", order=order)
            cells = {
                key: value / bottom.cells[key]
                for key, value in top.cells.items()
                if key in bottom.cells and bottom.cells[key] != 0.0
            }
            steps = sorted({s for _, s in cells})
            return [
                Panel(
                    "Update / parameter norm",
                    "heatmap",
                    scale="log",
                    rows=top.rows,
                    steps=steps,
                    cells=cells,
                    note=top.note,
                )
            ]
        column = "grad_norm" if what == "grad-norm" else "param_norm"
        title = "Gradient norm" if what == "grad-norm" else "Parameter norm"
        heatmap = _heatmap(
            title,
            [(r["module"], int(r["step"]), r[column]) for r in norms],
            l2,
            max_rows,
            "log",
            order=order,
        )
        if what == "param-norm":
            return [heatmap]
        return [heatmap, total_grad_norms(q)]
    if what == "activations":
        acts = q.activations()
        return [
            _heatmap(
                "Activation mean",
                [(r["module"], int(r["step"]), r["mean"]) for r in acts],
                mean,
                max_rows,
                "diverging",
                order=order,
            ),
            _heatmap(
                "Activation std",
                [(r["module"], int(r["step"]), r["std"]) for r in acts],
                mean,
                max_rows,
                "log",
                order=order,
            ),
        ]
    if what == "dead-units":
        acts = q.activations()
        return [
            _heatmap(
                "Dead units (fraction)",
                [(r["module"], int(r["step"]), r["dead_fraction"]) for r in acts],
                mean,
                max_rows,
                "fraction",
                order=order,
            )
        ]
    raise ValueError(f"unknown plot {what!r}")


def _mean_per_step(
    series: dict[str, list[tuple[int, float]]],
) -> dict[str, list[tuple[int, float]]]:
    """Several values of one name at one step (gradient accumulation): their mean."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name, points in series.items():
        by_step: dict[int, list[float]] = {}
        for step, value in points:
            by_step.setdefault(step, []).append(value)
        out[name] = [(step, mean(values)) for step, values in sorted(by_step.items())]
    return out
