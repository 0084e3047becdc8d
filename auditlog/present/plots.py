"""Pictures of a run as PNG, drawn with matplotlib (the optional extra ``auditlog[plot]``).

Figures are made with ``matplotlib.figure.Figure`` and the Agg canvas directly,
never through ``pyplot``: a notebook's or a script's backend and global figure
state are left alone. Heatmaps draw log10 of norms (they span magnitudes), a
diverging map centered on 0 for activation means and 0..1 for fractions;
non-finite cells are red, cells with no value (steps the policy did not
sample) light grey, so a NaN is never mistaken for a gap. Line plots mark the
first non-finite value with a red line.
"""

from __future__ import annotations

import io
import math
from typing import Any

from auditlog.core.errors import AuditlogError
from auditlog.read.series import Panel

INSTALL_HINT = "plotting needs matplotlib: pip install 'auditlog[plot]'"


def _matplotlib() -> Any:
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise AuditlogError(INSTALL_HINT) from None
    return matplotlib, Figure


def available() -> bool:
    """Is matplotlib installed?"""
    try:
        _matplotlib()
    except AuditlogError:
        return False
    return True


LABEL_CHARS = 80  # a module or metric name longer than this is cut: matplotlib lays out every glyph


def _short(text: str) -> str:
    """A label of at most ``LABEL_CHARS`` characters (a module name of megabytes took minutes to draw)."""
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 3] + "..."


def render_png(panels: list[Panel], title: str) -> bytes:
    """One PNG with every panel stacked vertically (every label cut to ``LABEL_CHARS``)."""
    matplotlib, figure_class = _matplotlib()
    import numpy as np

    heights = [max(2.6, 0.22 * len(p.rows) + 1.2) if p.kind == "heatmap" else 3.2 for p in panels]
    figure = figure_class(figsize=(10, sum(heights) + 0.6), dpi=100, layout="constrained")
    figure.suptitle(_short(title), fontsize=11)
    axes = figure.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        if panel.empty:
            ax.text(
                0.5,
                0.5,
                f"{_short(panel.title)}: nothing recorded",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_axis_off()
        elif panel.kind == "lines":
            _lines(ax, panel)
        else:
            _heatmap(ax, panel, figure, matplotlib, np)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _lines(ax: Any, panel: Panel) -> None:
    first_bad: int | None = None
    for name, points in panel.series.items():
        steps = [s for s, _ in points]
        values = [v if math.isfinite(v) else math.nan for _, v in points]
        ax.plot(
            steps,
            values,
            label=_short(name),
            linewidth=1.2,
            marker="." if len(points) < 60 else None,
        )
        bad = [s for s, v in points if not math.isfinite(v)]
        if bad and (first_bad is None or bad[0] < first_bad):
            first_bad = bad[0]
    if first_bad is not None:
        ax.axvline(
            first_bad,
            color="red",
            linewidth=1,
            linestyle="--",
            label=f"first NaN/Inf (step {first_bad})",
        )
    positive = [v for pts in panel.series.values() for _, v in pts if math.isfinite(v)]
    if positive and min(positive) > 0 and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
    ax.set_title(_short(panel.title), fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(_short(panel.ylabel))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _heatmap(ax: Any, panel: Panel, figure: Any, matplotlib: Any, np: Any) -> None:
    rows, steps = panel.rows, panel.steps
    data = np.full((len(rows), len(steps)), np.nan)
    bad = np.zeros((len(rows), len(steps)), dtype=bool)
    row_index = {r: i for i, r in enumerate(rows)}
    step_index = {s: j for j, s in enumerate(steps)}
    for (row, step), value in panel.cells.items():
        i, j = row_index[row], step_index[step]
        if math.isfinite(value):
            data[i, j] = value
        else:
            bad[i, j] = True
    colors = matplotlib.colormaps
    label = _short(panel.ylabel or panel.title)
    if panel.scale == "log":
        shown = np.where(data > 0, data, np.nan)
        shown = np.log10(shown)
        cmap, norm, label = colors["viridis"], None, f"log10 {_short(panel.title.lower())}"
    elif panel.scale == "diverging":
        shown = data
        limit = float(np.nanmax(np.abs(data))) if np.isfinite(data).any() else 1.0
        cmap = colors["PuOr_r"]
        norm = matplotlib.colors.Normalize(vmin=-limit or -1.0, vmax=limit or 1.0)
    elif panel.scale == "fraction":
        shown, cmap, norm = data, colors["Blues"], matplotlib.colors.Normalize(vmin=0.0, vmax=1.0)
    else:
        shown, cmap, norm = data, colors["viridis"], None
    cmap = cmap.with_extremes(bad="#dddddd")
    image = ax.imshow(
        np.ma.masked_invalid(shown), aspect="auto", interpolation="nearest", cmap=cmap, norm=norm
    )
    if bad.any():
        red = matplotlib.colors.ListedColormap(["#d62728"])
        ax.imshow(
            np.ma.masked_where(~bad, np.ones_like(data)),
            aspect="auto",
            interpolation="nearest",
            cmap=red,
        )
    figure.colorbar(image, ax=ax, label=label, fraction=0.03, pad=0.01)
    ax.set_yticks(
        range(len(rows)),
        labels=[_short(r) for r in rows],
        fontsize=max(5, min(9, int(400 / max(1, len(rows))))),
    )
    ticks = list(range(0, len(steps), max(1, len(steps) // 12)))
    ax.set_xticks(ticks, labels=[str(steps[t]) for t in ticks], fontsize=8)
    ax.set_xlabel("step")
    title = _short(panel.title) + (" (red: NaN/Inf; grey: not recorded)" if bad.any() else "")
    ax.set_title(title + (f"\n{_short(panel.note)}" if panel.note else ""), fontsize=10)
