"""The JSON answers of ``auditlog ui``, each built from the read API and nothing else.

Every answer is what a read command already computes: the runs of
``auditlog runs`` (``read.runs.list_runs``), the tree of ``auditlog tree``
(``read.tree.tree_json``), the series of ``auditlog plot`` (``read.series``),
the finding of ``auditlog nonfinite`` (``read.forensics``), the verdict of
``auditlog verify`` in the report's words (``present.report.verify_verdict``),
the snapshots of ``auditlog snapshots``, ``auditlog diff`` (and ``--values``)
and the sandboxed session of ``auditlog query``. This module only picks,
pages and shapes them for the page; it writes nothing and runs no SQL of its own.

Values go out as JSON with NaN and infinities as the record writes them
(``"NaN"``, ``"Infinity"``, ``"-Infinity"``: JSON has no such numbers), so a
non-finite loss reaches the chart as a value to mark, never as a gap.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import shlex
import uuid
from typing import Any

from auditlog.core.errors import UsageError
from auditlog.core.values import finite_or_text
from auditlog.present.report import BADGES, UNSIGNED_NOTE, verify_verdict
from auditlog.read.api import Store
from auditlog.read.data import DATASET_COLUMNS, LOADER_COLUMNS, data_questions, data_summary
from auditlog.read.forensics import find_nonfinite, questions
from auditlog.read.gaps import record_gaps
from auditlog.read.run import Run
from auditlog.read.runs import RunInfo
from auditlog.read.series import Panel, panels, total_grad_norms
from auditlog.read.tree import tree_json

PAGE_LIMIT = 500  # runs per answer at most
QUERY_ROWS = 1000  # rows of a query answer at most (as `auditlog query` shows in a table)
SORTS = ("started", "name", "status", "steps", "duration", "commit", "signed")


def plain(value: Any) -> Any:
    """A value as JSON can hold it: non-finite floats as text, times in ISO 8601, bytes in hex."""
    if isinstance(value, float):
        return value if math.isfinite(value) else finite_or_text(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    return str(value)


def dumps(value: Any) -> bytes:
    """The response body: ``plain`` JSON (``allow_nan=False``: a NaN that slipped through is a bug)."""
    return json.dumps(
        plain(value), ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode()


# ---------------------------------------------------------------------------- runs
def run_row(info: RunInfo, signed: bool) -> dict[str, Any]:
    """One row of the runs page: ``auditlog runs --format json`` plus whether the store
    holds signed checkpoints of it (a claim; the run page's verdict checks them)."""
    row = info.as_dict()
    return {
        "run_id": row["run_id"],
        "name": row["name"],
        "status": row["status"],
        "status_detail": row["status_detail"],
        "steps": row["steps"],
        "git_commit": row["git_commit"],
        "git_dirty": row["git_dirty"],
        "started": row["started"],
        "duration_s": row["duration_s"],
        "events": row["events"],
        "world_size": row["world_size"],
        "signed": signed,
    }


def _sort_key(sort: str) -> Any:
    def key(row: dict[str, Any]) -> Any:
        value = row[
            "duration_s" if sort == "duration" else "git_commit" if sort == "commit" else sort
        ]
        return (value is None, value if value is not None else 0)

    return key


def runs_page(
    store: Store,
    text: str = "",
    status: str = "",
    sort: str = "started",
    descending: bool = True,
    offset: int = 0,
    limit: int = 100,
) -> dict[str, Any]:
    """A page of the runs, filtered (``text`` in the name, id or commit; ``status``) and
    sorted, with how many match: the page asks for the rows it shows, never all of them."""
    if sort not in SORTS:
        raise UsageError(f"cannot sort by {sort!r}; one of: {', '.join(SORTS)}")
    if offset < 0 or not 0 < limit <= PAGE_LIMIT:
        raise UsageError(f"offset must be >= 0 and limit 1..{PAGE_LIMIT}")
    signed = set(store.event_store.checkpointed_run_ids())
    rows = [run_row(info, info.run_id in signed) for info in store.runs()]
    statuses = sorted({str(r["status"]) for r in rows})
    needle = text.strip().lower()
    if needle:
        rows = [
            r
            for r in rows
            if any(needle in str(r[k] or "").lower() for k in ("name", "run_id", "git_commit"))
        ]
    if status:
        rows = [r for r in rows if r["status"] == status]
    rows.sort(key=_sort_key(sort), reverse=descending)
    return {
        "total": len(rows),
        "offset": offset,
        "limit": limit,
        "statuses": statuses,
        "rows": rows[offset : offset + limit],
    }


# ---------------------------------------------------------------------------- one run
def run_summary(store: Store, run: Run) -> dict[str, Any]:
    """The run page's facts: summary, totals, the data it trained on (as ``auditlog data``
    shows it), annotations, the non-finite finding, snapshots with the command that
    restores each, and the last step (the slider's end). One query session answers all."""
    with data_questions(run) as q:
        row = q.run_row() or {}
        totals = q.parameter_totals()
        annotations = q.annotations()
        finding = find_nonfinite(q)
        flops = q.events_of("flops")
        data = data_summary(q)
        kinds = q.kind_counts()
        ended = q.events_of("run_ended")
    try:
        metadata = json.loads(row.get("metadata") or "{}") or {}
    except ValueError:
        metadata = {}
    snapshots, stored = run.snapshots()
    where = store.location.display()
    for snap in snapshots:
        snap["restore"] = restore_command(where, run.run_id, snap["step"])
    return {
        # The runs view's row: the facts of `auditlog runs`, status derived the same way.
        "run": {k: v for k, v in row.items() if k != "metadata"} | {"run_id": run.run_id},
        "metadata": {
            k: metadata.get(k)
            for k in ("cwd", "code_path", "policy", "auditlog", "git")
            if isinstance(metadata, dict)
        },
        "totals": totals,
        "annotations": [a | {"fields": _json_or_text(a["fields"])} for a in annotations],
        "data": {
            "datasets": {"columns": list(DATASET_COLUMNS), "rows": data.dataset_rows()},
            "loaders": {"columns": list(LOADER_COLUMNS), "rows": data.loader_rows()},
        },
        "finding": finding.as_dict(),
        "snapshots": snapshots,
        "snapshot_bytes": stored,
        "flops": [_json_or_text(e["payload"]) for e in flops[:1]],
        "last_step": int(row.get("steps") or 0),
        # what the record says it does not hold (the report's outcome shows the same)
        "gaps": record_gaps(kinds, _ended_payload(ended)),
    }


def _ended_payload(ended: list[dict[str, Any]]) -> dict[str, Any]:
    payload = _json_or_text(ended[0]["payload"]) if ended else None
    return payload if isinstance(payload, dict) else {}


def restore_command(store: str, run_id: str, step: int | None) -> str:
    """The ``auditlog restore`` line that writes this snapshot's state_dict (quoted for a shell)."""
    where = "end" if step is None else f"step{step}"
    argv = ["auditlog", "restore", "--store", store, run_id[:12]]
    if step is not None:
        argv += ["--step", str(step)]
    return shlex.join([*argv, "-o", f"{run_id[:12]}-{where}.safetensors"])


def _json_or_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def verdict(run: Run) -> dict[str, Any]:
    """``auditlog verify`` of the run as the report words it, with its badge."""
    found = verify_verdict(run)
    label, tone = BADGES[found["assurance"]]
    return found | {
        "badge": label,
        "tone": tone,
        "note": UNSIGNED_NOTE if found["assurance"] == "unsigned" else None,
    }


def tree_at(run: Run, step: int | None) -> dict[str, Any]:
    """The module tree after ``step`` optimizer steps (None: the end), with parameter counts:
    each node's own and its subtree's (a tensor shared by two modules counted once)."""
    state = run.state_at(step=step)
    if not state.modules:
        return {"step": step, "roots": [], "modules": 0, "parameters": 0}
    roots = [tree_json(state, r, "") for r in state.roots()]
    main = state.main_root()
    roots.sort(key=lambda r: r["module_id"] != main)
    for root in roots:
        _count(root)
    return {
        "step": step,
        "roots": roots,
        "modules": sum(_modules(r) for r in roots),
        "parameters": sum(int(r["total_parameters"]) for r in roots),
    }


def _count(node: dict[str, Any]) -> dict[int, int]:
    """Fill ``own_parameters`` and ``total_parameters`` (elements); return tensor id -> size
    of every parameter in the subtree (by id: a tied weight counts once)."""
    sizes = {
        int(t["tensor_id"]): math.prod(int(d) for d in t["shape"] or []) for t in node["parameters"]
    }
    node["own_parameters"] = sum(sizes.values())
    for child in node["children"]:
        sizes.update(_count(child))
    node["total_parameters"] = sum(sizes.values())
    return sizes


def _modules(node: dict[str, Any]) -> int:
    return 1 + sum(_modules(c) for c in node["children"])


def panel_json(panel: Panel) -> dict[str, Any]:
    """A panel for the page: lines as ``{name: [[step, value], ...]}``, heatmaps as rows x steps."""
    out: dict[str, Any] = {
        "title": panel.title,
        "kind": panel.kind,
        "ylabel": panel.ylabel,
        "scale": panel.scale,
        "note": panel.note,
    }
    if panel.kind == "lines":
        out["series"] = {name: [[s, v] for s, v in points] for name, points in panel.series.items()}
    else:
        out["rows"], out["steps"] = panel.rows, panel.steps
        out["cells"] = [[panel.cells.get((r, s)) for s in panel.steps] for r in panel.rows]
    return out


def curves(run: Run) -> dict[str, Any]:
    """Every curve of the run page: loss, learning rate, the used and raw gradient norms,
    update/parameter norm ratios and activation statistics (``auditlog plot``'s data)."""
    with questions(run) as q:
        found = {
            "loss": panels(q, "loss"),
            "lr": panels(q, "lr"),
            "grad_norm": [total_grad_norms(q)],
            "update_ratio": panels(q, "update-ratio"),
            "activations": panels(q, "activations"),
        }
    return {key: [panel_json(p) for p in shown] for key, shown in found.items()}


# ---------------------------------------------------------------------------- compare
def compare(store: Store, selectors: list[str]) -> dict[str, Any]:
    """Two or more runs: each one's identity and curves, and ``auditlog diff`` of the first
    against each other one."""
    if len(selectors) < 2:
        raise UsageError("compare needs two or more runs")
    ids = list(dict.fromkeys(store.select(s) for s in selectors))
    if len(ids) < 2:
        raise UsageError("compare needs two different runs")
    runs = []
    for run_id in ids:
        run = store.run(run_id)
        with questions(run) as q:
            loss, lr, grad = panels(q, "loss")[0], panels(q, "lr")[0], total_grad_norms(q)
        info = run.info()
        runs.append(
            {
                "run_id": run_id,
                "name": info.name,
                "status": info.status,
                "steps": info.steps,
                "git_commit": info.git_commit,
                "git_dirty": info.git_dirty,
                "curves": {
                    "loss": panel_json(loss),
                    "lr": panel_json(lr),
                    "grad_norm": panel_json(grad),
                },
            }
        )
    diffs = [store.diff(ids[0], other).as_dict() for other in ids[1:]]
    return {"runs": runs, "diffs": diffs}


def compare_values(store: Store, run_a: str, run_b: str) -> dict[str, Any]:
    """``auditlog diff --values``: the first step and tensor where snapshotted values differ."""
    result: dict[str, Any] = store.diff_values(run_a, run_b).as_dict()
    return result


# ---------------------------------------------------------------------------- query
def query(store: Store, sql: str, run: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """One statement in the sandbox of ``auditlog query`` (refused unless read-only; DuckDB
    locked down), its first ``QUERY_ROWS`` rows and whether there were more."""
    if not sql.strip():
        raise UsageError("no SQL given")
    with store.query_session(run) as session:
        result = session.execute(sql, timeout=timeout)
        rows: list[list[Any]] = []
        more = False
        for row in result.rows:
            if len(rows) == QUERY_ROWS:
                more = True
                break
            rows.append(list(row))
    return {"columns": result.columns, "types": result.types, "rows": rows, "more": more}


def schema() -> list[dict[str, Any]]:
    """The views a query reads (``auditlog schema``)."""
    from auditlog.store.readmodel.views import VIEWS

    return [
        {
            "view": v.name,
            "doc": v.doc,
            "columns": [{"name": c.name, "type": c.type} for c in v.columns],
        }
        for v in VIEWS
    ]
