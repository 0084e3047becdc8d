"""The report's "technical documentation" section: the EU AI Act's headings, answered from the record.

Laid out by Annex IV point 2 (high-risk AI systems: the elements of the system
and the process of its development) and Annex XI section 1 points 1-2 (the
technical documentation of a general-purpose AI model). Each row is one
requirement: what the record says (``read.docfacts``), a link to the report
section that shows it in full, and the events it came from. What the record
cannot know (intended purpose, evaluation, licence, limitations) is read from
annotations of those names, or marked missing with the call that supplies it:
the section states the gaps instead of hiding them. docs/compliance.md maps
the same rows to ISO/IEC 42001.
"""

from __future__ import annotations

import json
from typing import Any

from auditlog.present.report_html import badge, esc
from auditlog.read.docfacts import DocumentationFacts, Fact

# (requirement, the facts that answer it, the report section that shows them in full)
ANNEX_IV_2 = (
    ("2(a) methods and steps of development", ("code", "frameworks", "hyperparameters"), "summary"),
    (
        "2(b) design specifications, key design choices",
        ("architecture", "hyperparameters"),
        "model",
    ),
    (
        "2(c) system architecture; computational resources to develop and train",
        ("architecture", "training_compute", "hardware", "training_time"),
        "compute",
    ),
    ("2(d) data requirements: training data, provenance, characteristics", ("datasets",), "data"),
    ("2(g) validation and testing: metrics, test logs", ("metrics", "evaluation"), "training"),
    (
        "2(h) integrity of the record (cybersecurity of the evidence)",
        ("verification", "weights"),
        "integrity",
    ),
)
ANNEX_XI_1 = (
    ("1.1(a) tasks the model is intended to perform", ("intended_purpose",), None),
    ("1.1(d) architecture and number of parameters", ("architecture", "parameters"), "model"),
    ("1.1(f) licence", ("license",), None),
    ("1.2(b) design specifications and training process", ("hyperparameters", "code"), "training"),
    ("1.2(c) data used for training: type, provenance, size", ("datasets",), "data"),
    (
        "1.2(d) computational resources: FLOPs, training time",
        ("training_compute", "training_time"),
        "compute",
    ),
    ("1.2(e) known or estimated energy consumption", ("energy",), "compute"),
)


def techdoc_section(facts: DocumentationFacts) -> str:
    """The section body: two tables (Annex IV 2, Annex XI 1) and the count of gaps."""
    missing = sorted(
        {
            name
            for rows in (ANNEX_IV_2, ANNEX_XI_1)
            for _, names, _ in rows
            for name in names
            if facts.facts[name].value in (None, [], {})
        }
    )
    intro = (
        "<p>The EU AI Act's technical documentation headings, answered from this record. "
        "Each answer names the events it came from; <code>auditlog bom --format json</code> gives the same "
        "facts as data, and <code>--format cyclonedx|spdx</code> as standard documents. "
        + (
            f"{badge(f'{len(missing)} missing', 'warn')} "
            if missing
            else f"{badge('nothing missing', 'ok')} "
        )
        + "What the record cannot know is supplied with <code>run.annotate(name, text=...)</code>.</p>"
    )
    return (
        intro
        + "<h3>Annex IV, point 2 (high-risk AI systems)</h3>"
        + _rows(facts, ANNEX_IV_2)
        + "<h3>Annex XI, section 1 (general-purpose AI models)</h3>"
        + _rows(facts, ANNEX_XI_1)
    )


def _rows(
    facts: DocumentationFacts, rows: tuple[tuple[str, tuple[str, ...], str | None], ...]
) -> str:
    body = []
    for requirement, names, anchor in rows:
        answers = [_answer(name, facts.facts[name]) for name in names]
        where = f' <a href="#{esc(anchor)}">(details)</a>' if anchor else ""
        evidence = "; ".join(
            _evidence(facts.facts[name]) for name in names if facts.facts[name].evidence
        )
        body.append(
            f"<tr><th>{esc(requirement)}{where}</th><td>{'<br>'.join(answers)}</td>"
            f'<td class="muted">{esc(evidence)}</td></tr>'
        )
    return (
        "<table><thead><tr><th>requirement</th><th>from the record</th><th>evidence</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _answer(name: str, fact: Fact) -> str:
    label = name.replace("_", " ")
    if fact.value in (None, [], {}):
        return f"<b>{esc(label)}</b>: {badge('missing', 'warn')} {esc(fact.note or '')}"
    return f"<b>{esc(label)}</b>: {esc(_summary(name, fact.value))}" + (
        f' <span class="muted">({esc(fact.note)})</span>' if fact.note else ""
    )


def _summary(name: str, value: Any) -> str:
    """A one-line reading of a fact (the JSON has it all)."""
    if name == "parameters":
        return f"{value['total']:,} parameters ({value['total_2sf']}), {value['trainable']:,} trainable"
    if name == "architecture":
        layers = ", ".join(f"{n} x{c}" for n, c in list(value["layer_types"].items())[:8])
        return f"{', '.join(value['roots'])}: {value['modules']} modules ({layers})"
    if name == "training_compute":
        return f"{value['total_flops']:,} FLOPs ({value['total_2sf']}): {value['method']}"
    if name == "training_time":
        return (
            f"{value['wall_s']:.1f} s wall, {value['started']} to {value['ended'] or 'not ended'}"
        )
    if name == "energy":
        return f"{value['joules']:.1f} J ({value['kwh']:.6f} kWh)"
    if name == "datasets":
        return "; ".join(str(d.get("name") or d.get("class") or d) for d in value)
    if name == "verification":
        return f"{value['verdict']} ({value['assurance']})"
    if name == "weights":
        return f"{len(value['tensors'])} tensors at {value['at']}, content hashes in the BOM"
    if name == "metrics":
        return "; ".join(f"{m['name']} {m['last']:.6g} at step {m['at_step']}" for m in value[:6])
    if name == "code":
        return f"commit {value.get('commit')}" + (" (dirty)" if value.get("dirty") else "")
    if isinstance(value, dict) and len(value) == 1:
        return str(next(iter(value.values())))
    return json.dumps(value, sort_keys=True, default=str)[:300]


def _evidence(fact: Fact) -> str:
    parts = []
    for ref in fact.evidence[:4]:
        if "seq" in ref:
            parts.append(f"{ref.get('kind')} seq {ref['seq']}")
        elif "view" in ref:
            parts.append(f"view {ref['view']}")
        elif "command" in ref:
            parts.append(str(ref["command"]))
        elif "key" in ref:
            parts.append(f"annotation {ref['key']}")
    return ", ".join(parts)
