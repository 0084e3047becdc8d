"""The documentation facts of a run: what a model's technical documentation asks, from the record.

The EU AI Act (Annex IV 2, Annex XI 1-2, the GPAI Model Documentation Form),
ISO/IEC 42001 (A.6.2.8, A.7.5) and the ML-BOM formats ask for the same
handful of facts about how a model was developed: its architecture and size,
the compute and time spent training it, the hardware, the data, the code and
libraries, the weights that came out, and whether the record can be trusted.
This module derives each of them once (``documentation_facts``) for the
CycloneDX and SPDX documents (``read.bom``), the report's technical
documentation section and ``auditlog bom --format json``.

Each fact names the events it came from (``evidence``: kind, stream and seq
of each, or the view that folds them), so an auditor can check it against the
chain with ``auditlog events`` or a proof (``auditlog prove``). A fact the
record cannot hold (energy where no counter was read, the intended purpose) is
present with ``value`` None and a ``note`` saying why: a gap is stated, never
left out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from auditlog.core.hashing import is_content_hash
from auditlog.read.forensics import questions
from auditlog.read.gaps import record_gaps

if TYPE_CHECKING:
    from auditlog.read.run import Run
    from auditlog.store.readmodel.forensics import ForensicQueries

BACKWARD_FACTOR = (
    2  # the recorded FLOP count estimates the backward as twice the forward (``flops`` events)
)

# Annotation keys a user sets for what the record cannot see (docs/compliance.md).
USER_SUPPLIED = {
    "intended_purpose": "the intended purpose and uses of the model (Annex IV 1(a); Annex XI 1.1(a))",
    "evaluation": "evaluation design, benchmarks and results (Annex IV 2(g); Annex XI 2.1)",
    "license": "the model's licence (Annex XI 1.1(f))",
    "limitations": "known limitations and foreseeable misuse (Annex IV 3)",
}


@dataclass
class Fact:
    """One documented fact: its value, where in the record it came from, and what it cannot say."""

    value: Any
    evidence: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None


@dataclass
class DocumentationFacts:
    """Every fact of a run at a step (None: the end of the run), by name (``FACT_NAMES`` order)."""

    run_id: str
    step: int | None
    facts: dict[str, Fact]

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "step": self.step,
            "facts": {k: asdict(v) for k, v in self.facts.items()},
        }

    def value(self, name: str) -> Any:
        return self.facts[name].value


FACT_NAMES = (
    "model",
    "architecture",
    "parameters",
    "training_compute",
    "training_time",
    "hardware",
    "energy",
    "datasets",
    "code",
    "frameworks",
    "hyperparameters",
    "metrics",
    "weights",
    "verification",
    *USER_SUPPLIED,
)


def documentation_facts(
    run: Run, step: int | None = None, verification: Fact | None = None
) -> DocumentationFacts:
    """The facts of ``run`` at ``step`` (its weights then; every other fact is of the whole run).

    ``verification``: the verdict when the caller has verified already (the report), else
    ``run.verify()`` runs here."""
    if step is not None:
        run.check_steps((step, step))
    started = next(iter(run.events(kinds=["run_started"])), None)
    meta: dict[str, Any] = dict(started["payload"]) if started is not None else {}
    start_ref = [_ref(started)] if started is not None else []
    info = run.info()
    with questions(run) as q:
        facts: dict[str, Fact] = {}
        facts["model"] = Fact(
            {
                "run_id": run.run_id,
                "name": info.name,
                "status": info.status,
                "steps": info.steps,
                "user": meta.get("user"),
                "host": meta.get("host"),
            },
            start_ref,
        )
        facts["architecture"], facts["parameters"] = _structure(q)
        facts["training_compute"] = _compute(q, info.steps)
        ended = q.events_of("run_ended")
        facts["training_time"] = Fact(
            {
                "wall_s": round(info.duration_s, 3),
                "started": _iso(info.started_ns),
                "ended": _iso(info.ended_ns),
                "per_stream": [
                    {
                        "stream": int(r["stream"]),
                        "wall_s": round(float(r["wall_s"]), 3),
                        **next(
                            (
                                {
                                    "rank": k.get("rank"),
                                    "segment": k.get("segment"),
                                    "status": k.get("status"),
                                }
                                for k in info.ranks
                                if k.get("stream") == r["stream"]
                            ),
                            {},
                        ),
                    }
                    for r in q.stream_spans()
                ],
            },
            [*start_ref, *(_view_ref(e, "run_ended") for e in ended[:8])],
            None
            if info.ended_ns
            else "the run has not ended: the time is to its last sign of life",
        )
        facts["hardware"] = _hardware(q, meta, start_ref)
        facts["energy"] = _energy(meta, ended, start_ref)
        facts["datasets"] = _datasets(q)
        git = meta.get("git") if isinstance(meta.get("git"), dict) else None
        facts["code"] = Fact(
            None
            if git is None
            else {k: git.get(k) for k in ("commit", "branch", "dirty", "diff_sha256")}
            | {
                "changed_files": [f.get("path") for f in (git.get("files") or [])][:100],
                "argv": meta.get("argv"),
            },
            start_ref,
            None
            if git
            else f"the code was not in a git repository (command line: {' '.join(meta.get('argv') or [])})",
        )
        facts["frameworks"] = Fact(
            {k: meta.get(k) for k in ("python", "torch", "cuda", "platform")}, start_ref
        )
        facts["hyperparameters"] = _hyperparameters(q)
        facts["metrics"] = _metrics(q)
        annotations = {a["key"]: a for a in q.annotations()}
        # Work that ran where no hook saw it: said beside the step count and the optimizers.
        gaps = record_gaps(q.kind_counts(), _payload(ended[0]) if ended else {})
        for name in ("model", "hyperparameters") if gaps else ():
            fact = facts[name]
            fact.note = "; ".join([*([fact.note] if fact.note else []), *gaps])
    facts["weights"] = _weights(run, step)
    facts["verification"] = verification if verification is not None else _verification(run)
    for key, what in USER_SUPPLIED.items():
        found = annotations.get(key)
        facts[key] = (
            Fact(_fields(found), [{"kind": "annotation", "key": key, "step": found["step"]}])
            if found is not None
            else Fact(
                None, [], f"not in the record: {what}; add it with run.annotate({key!r}, ...)"
            )
        )
    return DocumentationFacts(run.run_id, step, {name: facts[name] for name in FACT_NAMES})


def two_significant(n: int) -> str:
    """A count to two significant figures, as the GPAI Model Documentation Form asks (1.2e+06 -> "1.2M")."""
    if n < 1000:
        return f"{float(f'{n:.2g}'):g}"
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{float(f'{n / size:.2g}'):g}{unit}"
    return str(n)  # pragma: no cover - every n >= 1000 matched a unit


# ---------------------------------------------------------------------------- facts
def _structure(q: ForensicQueries) -> tuple[Fact, Fact]:
    modules = q.modules()
    roots = [m for m in modules if m["parent_id"] is None]
    layers: dict[str, int] = {}
    for m in modules:
        layers[str(m["class_name"])] = layers.get(str(m["class_name"]), 0) + 1
    tree = [
        {
            "module": m["module"],
            "class": m["class"],
            "depth": m["depth"],
            "parameters": int(m["own_parameters"]),
        }
        for m in modules
    ]
    evidence = [{"view": "modules", "kinds": ["module_registered"]}]
    architecture = Fact(
        {
            "roots": [m["class"] for m in roots],
            "modules": len(modules),
            "layer_types": dict(sorted(layers.items(), key=lambda kv: (-kv[1], kv[0]))),
            "tree": tree,
        },
        evidence,
        None if modules else "no module was recorded",
    )
    totals = q.parameter_totals()
    parameters = Fact(
        {
            "total": totals["total"],
            "trainable": totals["trainable"],
            "tensors": totals["tensors"],
            "total_2sf": two_significant(totals["total"]),
        },
        [{"view": "parameters", "kinds": ["parameter_registered"]}],
        "tied weights counted once; rank 0's (stream 0) model",
    )
    return architecture, parameters


def _compute(q: ForensicQueries, steps: int) -> Fact:
    measured = [
        json.loads(e["payload"]) | {"_ref": _view_ref(e, "flops")} for e in q.events_of("flops")
    ]
    if not measured:
        return Fact(
            None,
            [],
            "not measured: no FLOP count was recorded (policy flops=false, or no forward "
            "with gradients while recording)",
        )
    first = measured[0]
    if first.get("skipped"):
        return Fact(None, [first["_ref"]], f"not measured: {first['skipped']}")
    per_step = int(first.get("flops") or 0)
    return Fact(
        {
            "flops_per_step": per_step,
            "forward_flops": int(first.get("forward_flops") or 0),
            "steps": steps,
            "total_flops": per_step * steps,
            "total_2sf": two_significant(per_step * steps),
            "method": "one forward counted with torch.utils.flop_counter.FlopCounterMode "
            f"at step {first['_ref']['step']}, "
            f"the backward estimated as {BACKWARD_FACTOR} x the forward, times the optimizer steps; "
            "the optimizer update and evaluation not included",
        },
        [first["_ref"]],
    )


def _hardware(q: ForensicQueries, meta: dict[str, Any], start_ref: list[dict[str, Any]]) -> Fact:
    rows = q.parameter_devices()
    per_rank: dict[int, dict[str, int]] = {}
    for row in rows:
        per_rank.setdefault(int(row["stream"]), {})[str(row["device"])] = int(row["tensors"])
    types = sorted({device.split(":")[0] for devices in per_rank.values() for device in devices})
    return Fact(
        {
            "host": meta.get("host"),
            "world_size": meta.get("world_size"),
            "device_types": types,
            "devices_per_stream": {str(k): v for k, v in per_rank.items()},
        },
        [*start_ref, {"view": "parameters", "kinds": ["parameter_registered"]}],
        "the devices the model's parameters were on, per stream (rank); device models are not recorded",
    )


def _energy(
    meta: dict[str, Any], ended: list[dict[str, Any]], start_ref: list[dict[str, Any]]
) -> Fact:
    start = meta.get("energy")
    end = json.loads(ended[0]["payload"]).get("energy") if ended else None
    if not isinstance(start, dict) or not isinstance(end, dict):
        why = (
            "no energy counter could be read on this machine"
            if start is None
            else "the run did not end"
        )
        return Fact(None, start_ref, f"not measured: {why} (RAPL under /sys/class/powercap)")
    joules = 0.0
    zones = []
    for zone, begin in (start.get("zones") or {}).items():
        final = (end.get("zones") or {}).get(zone)
        if not isinstance(begin, dict) or not isinstance(final, dict):
            continue
        used = int(final["energy_uj"]) - int(begin["energy_uj"])
        if used < 0:  # the counter wrapped once (max_energy_range_uj)
            used += int(begin.get("max_energy_range_uj") or 0)
        joules += used / 1e6
        zones.append({"zone": zone, "name": begin.get("name"), "joules": round(used / 1e6, 6)})
    return Fact(
        {
            "joules": round(joules, 6),
            "kwh": joules / 3.6e6,
            "zones": zones,
            "source": start.get("source"),
        },
        [*start_ref, _view_ref(ended[0], "run_ended")],
        "CPU package and DRAM counters of the host, all processes on it included; GPUs not included",
    )


def _datasets(q: ForensicQueries) -> Fact:
    found: list[dict[str, Any]] = []
    evidence: list[dict[str, Any]] = []
    for event in q.events_of("dataset_seen"):
        payload = json.loads(event["payload"])
        identity = payload.get("identity") if isinstance(payload.get("identity"), dict) else {}
        found.append(
            {
                "source": "recorded",
                "dataset_id": payload.get("dataset_id"),
                "class": payload.get("class"),
                "kind": payload.get("kind"),
                "length": payload.get("length"),
                "method": identity.get("method"),
                "fingerprint": identity.get("fingerprint"),
                **{
                    k: identity[k]
                    for k in ("files_total", "bytes_total", "hf_fingerprint", "reason")
                    if k in identity
                },
            }
        )
        evidence.append(_view_ref(event, "dataset_seen"))
    for row in q.annotations():
        if str(row["key"]).lower() in ("dataset", "data", "datasets"):
            found.append({"source": "annotation", **_fields(row)})
            evidence.append({"kind": "annotation", "key": row["key"], "step": row["step"]})
    return Fact(
        found,
        evidence,
        None
        if found
        else "no dataset was recorded or annotated (run.annotate('dataset', name=..., sha256=...))",
    )


def _hyperparameters(q: ForensicQueries) -> Fact:
    """Each optimizer's class and its param groups' hyperparameters at its first step, the
    learning rate's range over the run (schedules) and the step count."""
    first: dict[Any, dict[str, Any]] = {}
    for event in q.events_of("optimizer_step"):
        payload = json.loads(event["payload"])
        key = payload.get("optimizer_id")
        if key not in first:
            groups = [
                {k: v for k, v in g.items() if k != "params"}
                for g in payload.get("param_groups") or []
                if isinstance(g, dict)
            ]
            first[key] = {
                "optimizer": payload.get("optimizer_class"),
                "param_groups": groups,
                "_ref": _view_ref(event, "optimizer_step"),
            }
    if not first:
        return Fact(None, [], "no optimizer step was recorded")
    steps = q.optimizer_steps()
    lrs = [float(r["lr"]) for r in steps if isinstance(r.get("lr"), (int, float))]
    value: dict[str, Any] = {
        "optimizers": [{k: v for k, v in o.items() if k != "_ref"} for o in first.values()],
        "steps": len(steps),
        "lr_range": [min(lrs), max(lrs)] if lrs else None,
    }
    if len(first) == 1:  # the common case, flat: what a model card lists as hyperparameters
        (only,) = first.values()
        value.update(
            {
                k: v
                for k, v in (only["param_groups"][0] if only["param_groups"] else {}).items()
                if isinstance(v, (int, float, str, bool, list))
            }
        )
    return Fact(
        value,
        [*(o["_ref"] for o in first.values()), {"view": "steps", "kinds": ["optimizer_step"]}],
    )


def _metrics(q: ForensicQueries) -> Fact:
    rows = q.metric_summary()
    values = [
        {
            "name": r["name"],
            "last": r["last"],
            "min": r["min"],
            "max": r["max"],
            "at_step": r["step"],
            "count": int(r["n"]),
        }
        for r in rows
    ]
    return Fact(
        values,
        [{"view": "metrics", "kinds": ["metrics", "activity", "optimizer_step"]}],
        None if values else "no loss or metric was recorded (auditlog.log(loss=...))",
    )


def _weights(run: Run, step: int | None) -> Fact:
    from auditlog.core.errors import AuditlogError

    try:
        plan = run.restore_plan(step=step)
    except AuditlogError as exc:
        return Fact(None, [], f"not available: {exc}")
    # A value an edited event gives that is not a content hash is never presented as one.
    crafted = [key for key, sha in plan if sha is not None and not is_content_hash(sha)]
    hashes = [{"key": key, "sha256": sha if is_content_hash(sha) else None} for key, sha in plan]
    missing = [key for key, sha in plan if sha is None]
    when = f"step {step}" if step is not None else "the end of the run"
    notes = [f"{len(missing)} tensor(s) had no snapshot at {when}"] if missing else []
    if crafted:
        notes.append(
            f"{len(crafted)} tensor(s) name a value that is not a content hash (record edited): "
            f"{', '.join(crafted[:5])}"
        )
    return Fact(
        {
            "at": when,
            "tensors": hashes,
            "algorithm": "auditlog tensor content hash (SHA-256 of dtype, shape and "
            "C-order bytes; docs/integrity.md)",
        },
        [{"kinds": ["snapshot_taken", "construction_sealed"], "view": "snapshots"}],
        "; ".join(notes) or None,
    )


def _verification(run: Run) -> Fact:
    from auditlog.core.errors import AuditlogError

    try:
        report = run.verify()
    except AuditlogError as exc:
        return Fact({"ok": False, "assurance": "failed"}, [], f"could not verify: {exc}")
    return Fact(
        {
            "ok": report.ok,
            "assurance": report.assurance,
            "verdict": report.verdict,
            "events": report.events,
            "checkpoints": report.checkpoints,
        },
        [{"command": f"auditlog verify {run.run_id}"}],
    )


# ---------------------------------------------------------------------------- helpers
def _payload(event: dict[str, Any]) -> dict[str, Any]:
    try:
        payload = json.loads(event["payload"])
    except (TypeError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def _ref(event: dict[str, Any]) -> dict[str, Any]:
    return {"kind": event["kind"], "stream": event.get("stream", 0), "seq": event["seq"]}


def _view_ref(row: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"kind": kind, "seq": row["seq"], "step": row["step"]}


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    try:
        fields = json.loads(row["fields"]) if isinstance(row["fields"], str) else row["fields"]
    except ValueError:
        fields = None
    return fields if isinstance(fields, dict) else {"value": fields}


def _iso(ns: int | None) -> str | None:
    from auditlog.core.values import iso

    return iso(ns) if ns else None
