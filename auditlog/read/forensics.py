"""Where the first NaN/Inf came from, decided from what the run recorded (``auditlog nonfinite``).

Evidence, every kind with its first step (record convention: optimizer steps
completed when it happened): module outputs and inputs (``forward_stats``),
gradients at module outputs/inputs (``backward_stats``), the loss and other
metrics (``metrics``), and per-parameter gradient, update and value norms of the
optimizer step that ended the iteration (``steps``). The first step with any
evidence is *the* step; then:

- **forward**, when a forward call of that step returned NaN/Inf. Calls are
  recorded in completion order (a module finishes after its children), so the
  first call with a non-finite output is the innermost one that had it. When
  its inputs were finite (``input_nonfinite`` = 0) it produced the NaN itself.
  When they were not, the NaN came from code between module calls: the
  innermost enclosing call whose inputs were finite produced it in its own
  ``forward`` (or, when even the root's inputs held it, the data did). Later
  calls with non-finite outputs only propagated it; enclosing calls are listed
  apart.
- **backward**, when the forward was finite and gradients were not. With full
  (or legacy) module backward hooks, the producer is the first module in
  autograd's order whose output gradient was finite and input gradient not.
  With the default gradient hooks only output gradients are seen: the first
  module whose output gradient was non-finite received it from the module that
  consumed its output in the forward, the next call in completion order that is
  not one of its enclosing modules; that module's backward produced it.
- **loss**, when every module output was finite and the loss was not (a loss
  function with no module, or code after the last module call).
- **update**, when gradients were finite and the optimizer step made
  parameters non-finite.

When the step has no module activity, the answer says so and what to record
next time instead of guessing.
"""

from __future__ import annotations

import contextlib
import math
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from auditlog.core.payloadlimits import parse_payload
from auditlog.core.replay import attached_mark, built_at
from auditlog.core.values import finite_or_text
from auditlog.read.run import Run
from auditlog.store.readmodel.cache import ReadModel
from auditlog.store.readmodel.forensics import ForensicQueries
from auditlog.store.readmodel.querysession import QuerySession

Q = TypeVar("Q", bound=ForensicQueries)


@contextlib.contextmanager
def asking(run: Run, kind: type[Q]) -> Iterator[Q]:
    """Questions of ``kind`` over ``run`` on one query session (the read model is
    refreshed first): ``ForensicQueries``, or a subclass asking more (``DataQueries``)."""
    session, _ = QuerySession.open(ReadModel(run.store), run.run_id)
    try:
        yield kind(session)
    finally:
        session.close()


def questions(run: Run) -> contextlib.AbstractContextManager[ForensicQueries]:
    """The forensic questions over ``run``."""
    return asking(run, ForensicQueries)


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def jsonable(value: Any) -> Any:
    """NaN and infinities as the record writes them (JSON has none)."""
    if isinstance(value, float):
        return finite_or_text(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value


NO_LOSS_HINT = (
    "no loss module, model output with a loss, or backward() on a scalar was seen; "
    "log it with auditlog.log(loss=...)"
)


# ---------------------------------------------------------------------------- metrics table
def metrics_table(q: ForensicQueries) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per step: every metric (the mean of its values at that step), and the learning
    rate, global gradient norm (the one the update used, and the raw one as backward left it)
    and non-finite gradients of the optimizer step that ended it."""
    by_step: dict[int, dict[str, list[float]]] = {}
    names: list[str] = []
    for metric in q.metrics():
        step, name = int(metric["step"]), str(metric["name"])
        if name not in names:
            names.append(name)
        by_step.setdefault(step, {}).setdefault(name, []).append(float(metric["value"]))
    optimizer = {int(r["iteration"]): r for r in q.optimizer_steps()}
    order = {"loss": 0, "eval_loss": 1}
    names.sort(key=lambda n: (order.get(n, 2), n))
    columns = ["step", *names, "lr", "grad_norm", "raw_grad_norm", "nonfinite_grads"]
    rows = []
    for step in sorted(set(by_step) | set(optimizer)):
        values = by_step.get(step, {})
        row: dict[str, Any] = {"step": step}
        for name in names:
            got = values.get(name)
            row[name] = sum(got) / len(got) if got else None
        opt = optimizer.get(step)
        row["lr"] = opt["lr"] if opt else None
        row["grad_norm"] = opt["grad_norm"] if opt else None
        row["raw_grad_norm"] = opt["raw_grad_norm"] if opt else None
        row["nonfinite_grads"] = opt["nonfinite_grads"] if opt else None
        rows.append(row)
    return columns, rows


# ---------------------------------------------------------------------------- findings
@dataclass
class Finding:
    """What ``auditlog nonfinite`` found (``as_dict`` is its stable JSON form)."""

    found: bool
    step: int | None = None
    phase: str | None = None
    producer: dict[str, Any] | None = None
    producer_role: str | None = None
    propagators: list[dict[str, Any]] = field(default_factory=list)
    enclosing: list[dict[str, Any]] = field(default_factory=list)
    parameters: list[dict[str, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    explanation: list[str] = field(default_factory=list)
    decided: bool = False
    next_time: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsonable(
            {
                "found": self.found,
                "decided": self.decided,
                "step": self.step,
                "phase": self.phase,
                "producer": self.producer,
                "producer_role": self.producer_role,
                "propagators": self.propagators,
                "enclosing": self.enclosing,
                "parameters": self.parameters,
                "evidence": self.evidence,
                "explanation": self.explanation,
                "next_time": self.next_time,
            }
        )
        return out


def _call(row: dict[str, Any]) -> dict[str, Any]:
    """A call as findings show it: module, class, where it was built, NaN/Inf counts."""
    source = None
    if row.get("source_file"):
        source = f"{row['source_file']}:{row['source_line']}{attached_mark(row.get('source_kind'))}"
    out = {
        "module": row.get("module"),
        "class": row.get("class"),
        "source": source,
        "call": row.get("call"),
    }
    for key in ("nan", "inf", "input_nonfinite", "output_nonfinite", "mechanism"):
        if key in row:
            out[key] = row[key]
    return out


def _nonfinite_out(row: dict[str, Any]) -> bool:
    return int(row.get("nan") or 0) + int(row.get("inf") or 0) > 0


class _Tree:
    """Ancestry of module ids (from the ``modules`` view)."""

    def __init__(self, modules: list[dict[str, Any]]) -> None:
        self.parent = {int(m["module_id"]): m["parent_id"] for m in modules}

    def ancestors(self, module_id: int) -> list[int]:
        out: list[int] = []
        current = self.parent.get(module_id)
        while current is not None and current not in out:
            out.append(int(current))
            current = self.parent.get(int(current))
        return out


def _record_next_time(q: ForensicQueries, step: int) -> str:
    """The command that records what was missing, for this run's own script."""
    run = q.run_row() or {}
    argv = [str(a) for a in (run.get("argv") or [])]
    target = " ".join(shlex.quote(a) for a in argv) if argv else "SCRIPT [ARGS]"
    return f"auditlog run --policy debug {target}"


def find_nonfinite(q: ForensicQueries) -> Finding:
    """Decide where the first NaN/Inf of the run came from (see the module docstring)."""
    evidence = {k: v for k, v in q.first_nonfinite().items() if v is not None}
    activity = q.activity_steps()
    if not evidence:
        sampled = activity["forward"]
        where = (
            "the loss or metrics"
            if q.has_loss()
            else "the metrics (no loss was recorded: " + NO_LOSS_HINT + ")"
        )
        text = [
            f"no NaN or infinity was recorded: not in {where}, nor in the gradient, update "
            "or parameter norms of any optimizer step"
            + (f", nor in module activity (steps {_steps_text(sampled)})" if sampled else "")
            + "."
        ]
        return Finding(found=False, decided=True, explanation=text)
    step = int(min(evidence.values()))
    finding = Finding(found=True, step=step, evidence=evidence)
    tree = _Tree(q.modules())
    if step in activity["forward"]:
        calls = q.forward_calls(step)
        first = next((i for i, c in enumerate(calls) if _nonfinite_out(c)), None)
        if first is not None:
            _forward(finding, calls, first, tree)
            return finding
        if step in activity["backward"] and _backward(finding, q, step, calls, tree):
            return finding
    _without_activity(finding, q, step, activity)
    return finding


def _forward(finding: Finding, calls: list[dict[str, Any]], first: int, tree: _Tree) -> None:
    finding.phase = "forward"
    culprit = calls[first]
    chain = tree.ancestors(int(culprit["module_id"]))
    producer, role = culprit, "module"
    if int(culprit.get("input_nonfinite") or 0) > 0:
        # Handed a NaN: the innermost enclosing call with finite inputs made it in its own
        # code; when the outermost call's inputs held it too, the data did.
        role = "input"
        for ancestor in chain:
            enclosing = next((c for c in calls[first + 1 :] if c["module_id"] == ancestor), None)
            if enclosing is None:  # not recorded (include/exclude): cannot tell
                role = "unknown"
                break
            producer = enclosing
            if int(enclosing.get("input_nonfinite") or 0) == 0:
                role = "own_code"
                break
    shown = _call(producer)
    finding.producer, finding.producer_role = shown, role
    ancestors = set(chain)
    later = [c for c in calls[first:] if _nonfinite_out(c) and c is not producer]
    finding.enclosing = [_call(c) for c in later if c["module_id"] in ancestors]
    finding.propagators = [_call(c) for c in later if c["module_id"] not in ancestors]
    name = producer["module"]
    where = f" ({built_at(shown['source'])})" if shown.get("source") else ""
    unmeasured = culprit.get("input_nonfinite") is None
    finding.decided = role in ("module", "own_code", "input") and not (
        role == "module" and unmeasured
    )
    if role == "module":
        finding.explanation.append(
            f"step {finding.step}, forward: {name}{where} returned NaN/Inf"
            + (
                " from finite inputs"
                if not unmeasured
                else " (its inputs were not measured: positional tensors only)"
            )
            + "; it produced it."
        )
    elif role == "own_code":
        finding.explanation.append(
            f"step {finding.step}, forward: {culprit['module']} was handed NaN/Inf by the code of "
            f"{name}{where} between its module calls: {name}'s own forward produced it."
        )
    elif role == "input":
        finding.explanation.append(
            f"step {finding.step}, forward: the input of {name}{where}, the outermost module "
            "recorded, already held NaN/Inf: it came from the data or from code outside the model."
        )
    else:
        finding.explanation.append(
            f"step {finding.step}, forward: {name}{where} was handed NaN/Inf by code that no recorded "
            "module call covers."
        )
    if finding.propagators:
        names = ", ".join(str(p["module"]) for p in finding.propagators[:8])
        more = f" and {len(finding.propagators) - 8} more" if len(finding.propagators) > 8 else ""
        finding.explanation.append(f"propagated by: {names}{more}.")


def _backward(
    finding: Finding, q: ForensicQueries, step: int, forward: list[dict[str, Any]], tree: _Tree
) -> bool:
    entries = q.backward_calls(step)
    bad = [
        i
        for i, e in enumerate(entries)
        if int(e["output_nonfinite"] or 0) + int(e["input_nonfinite"] or 0) > 0
    ]
    if not bad:
        return False
    finding.phase = "backward"
    first = bad[0]
    entry = entries[first]
    full = entry.get("input_nonfinite") is not None  # full/legacy hooks see input gradients
    producer: dict[str, Any] | None = None
    if full and int(entry["output_nonfinite"] or 0) == 0:
        producer = entry
        finding.producer_role = "module"
    elif not full:
        producer = _consumer(forward, int(entry["module_id"]), tree)
        finding.producer_role = "consumer" if producer is not None else "unknown"
    else:
        finding.producer_role = "unknown"
    shown = _call(producer) if producer is not None else {}
    finding.producer = shown or None
    finding.propagators = [_call(entries[i]) for i in bad if entries[i] is not producer]
    finding.parameters = q.nonfinite_parameters(step + 1)
    finding.decided = producer is not None
    if producer is not None and finding.producer_role == "module":
        finding.explanation.append(
            f"step {step}, backward: the forward was finite; {producer['module']} "
            f"({built_at(shown['source'])}) turned a finite gradient into NaN/Inf in its backward."
        )
    elif producer is not None:
        finding.explanation.append(
            f"step {step}, backward: the forward was finite; the first non-finite gradient is at the "
            f"output of {entry['module']}, which fed {producer['module']} "
            f"({built_at(shown['source'])}) in the forward: the backward of {producer['module']} "
            "(or of code between the two) produced it."
        )
    else:
        finding.explanation.append(
            f"step {step}, backward: the forward was finite; the first non-finite gradient reached "
            f"{entry['module']}, from code no recorded module call covers."
        )
    return True


def _consumer(forward: list[dict[str, Any]], module_id: int, tree: _Tree) -> dict[str, Any] | None:
    """The call that consumed ``module_id``'s output: the next completed call after its last
    call that is not one of its enclosing modules."""
    last = max((i for i, c in enumerate(forward) if c["module_id"] == module_id), default=None)
    if last is None:
        return None
    ancestors = set(tree.ancestors(module_id))
    return next((c for c in forward[last + 1 :] if c["module_id"] not in ancestors), None)


def _without_activity(
    finding: Finding, q: ForensicQueries, step: int, activity: dict[str, list[int]]
) -> None:
    """The step had no (usable) module activity: say what is known, and what to record."""
    evidence = finding.evidence
    losses = [m for m in q.metrics_at(step) if m["name"] == "loss"]
    loss_bad = any(not finite(m["value"]) for m in losses)
    finding.parameters = q.nonfinite_parameters(step + 1)
    caught = next((parse_payload(c["payload"], c) for c in q.caught() if c["step"] == step), None)
    if caught is not None and not finding.parameters:
        names = q.parameter_names()
        ids = caught.get("parameters") or [
            g["tensor_id"]
            for g in caught.get("gradients") or []
            if int((g.get("stats") or {}).get("nan", 0)) + int((g.get("stats") or {}).get("inf", 0))
        ]
        finding.parameters = [{"parameter": names.get(int(i), f"tensor {i}")} for i in ids]
    recorded = step in activity["forward"]
    if recorded and loss_bad:
        finding.phase = "loss"
        finding.decided = True
        finding.explanation.append(
            f"step {step}: every recorded module output was finite and the loss was not: the loss "
            "computation (a function, or code after the last module call) produced it."
        )
        return
    through_update = (
        evidence.get("gradients") is None
        and evidence.get("loss") is None
        and (evidence.get("parameters") == step or evidence.get("updates") == step)
    )
    if through_update or (caught is not None and caught.get("where") == "parameters"):
        finding.phase = "update"
        finding.decided = True
        finding.explanation.append(
            f"step {step}: gradients were finite, and optimizer step {step + 1} made parameters "
            "non-finite (a learning rate or update too large for the values)."
        )
        return
    bad_gradients = evidence.get("gradients") == step or (
        caught is not None and caught.get("where") == "gradients"
    )
    if loss_bad or (caught is not None and caught.get("where") == "loss"):
        finding.phase, what_bad = "forward", "the loss"
    elif bad_gradients:
        finding.phase, what_bad = "backward", "gradients"
    else:
        what_bad = "a metric"
    if caught is not None:
        finding.explanation.append(
            f"step {step}: caught before the update (nonfinite_check): full gradient statistics and the "
            "parameters before the update are in the record (auditlog events --kind nonfinite_found; "
            f"auditlog restore --step {step})."
        )
    have = "forward but no backward activity" if recorded else "no module activity"
    finding.next_time = _record_next_time(q, step)
    finding.explanation.append(
        f"step {step}: {what_bad} became non-finite, but the run recorded {have} at step {step} "
        f"(activity was recorded at steps {_steps_text(activity['forward']) or 'none'}), so the module "
        "that produced it cannot be named from this record."
    )
    finding.explanation.append(
        f"Record it next time with: {finding.next_time}  (module statistics at every step; or keep "
        f"your policy and add activity_first = {step + 1} to auditlog.toml to cover steps 0..{step})."
    )


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return ""
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return ", ".join(map(str, steps[:6])) + f", ... {steps[-1]} ({len(steps)} steps)"
