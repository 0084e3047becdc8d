"""ML bills of materials from the record: CycloneDX 1.6 ML-BOM and SPDX 3.0.1 (AI and Dataset profiles).

Auditors' and governance tools read standard documents, not our own formats.
Both documents are built from ``read.docfacts`` (one derivation of every fact)
with the ecosystem's own libraries, an optional extra (``auditlog[compliance]``):

- **CycloneDX** through ``cyclonedx-python-lib``: the model is the BOM's
  subject, a ``machine-learning-model`` component whose nested ``data``
  components are its tensors (each with the auditlog content hash, SHA-256,
  of its value at the step: docs/integrity.md says how it is computed); the
  datasets are ``data`` components, the training code an ``application``
  component versioned by its commit, torch and Python ``framework`` /
  ``platform`` components. The library has no model of CycloneDX's
  ``modelCard`` yet, so that one object is added to the library's JSON output
  and the whole document is then checked by the library's own strict JSON
  schema validator: what is written always validates.
- **SPDX 3.0.1** through ``spdx-python-model`` (the bindings the SPDX project
  generates from its model): an ``AIPackage`` (hyperparameters, training
  information, energy, metrics, limitations) ``trainedOn`` each
  ``DatasetPackage``, inside an ``SpdxDocument``.

Every number carries the record's provenance in a property or comment
(``auditlog:evidence``) so a reader can go back to the events.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import AuditlogError
from auditlog.core.version import __version__

if TYPE_CHECKING:
    from auditlog.read.docfacts import DocumentationFacts

FORMATS = ("cyclonedx", "spdx")
MISSING_EXTRA = "the bom needs the optional extra: pip install 'auditlog[compliance]'"


def bom_document(facts: DocumentationFacts, fmt: str) -> dict[str, Any]:
    """The document for ``fmt`` (cyclonedx | spdx) as a JSON object."""
    if fmt == "cyclonedx":
        return cyclonedx_bom(facts)
    if fmt == "spdx":
        return spdx_document(facts)
    raise AuditlogError(f"unknown bom format {fmt!r} (choose: {', '.join(FORMATS)})")


# ---------------------------------------------------------------------------- CycloneDX
def cyclonedx_bom(facts: DocumentationFacts) -> dict[str, Any]:
    """A CycloneDX 1.6 ML-BOM of the run at the step, validated against the 1.6 schema."""
    try:
        from cyclonedx.model import HashAlgorithm, HashType, Property
        from cyclonedx.model.bom import Bom
        from cyclonedx.model.component import Component, ComponentType
        from cyclonedx.model.tool import ToolRepository
        from cyclonedx.output.json import JsonV1Dot6
        from cyclonedx.schema import SchemaVersion
        from cyclonedx.validation.json import JsonStrictValidator
    except ImportError:
        raise AuditlogError(MISSING_EXTRA) from None

    f = facts.facts
    model_info = f["model"].value
    ref = f"model-{facts.run_id}"
    weights = f["weights"].value or {}
    tensors = [
        Component(
            type=ComponentType.DATA,
            name=str(t["key"]),
            bom_ref=f"tensor-{i}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=t["sha256"])]
            if t["sha256"]
            else None,
            description="a tensor of the model: its auditlog content hash (SHA-256 of dtype, shape and bytes)",
        )
        for i, t in enumerate(weights.get("tensors") or [])
    ]
    model = Component(
        type=ComponentType.MACHINE_LEARNING_MODEL,
        name=str(model_info.get("name") or facts.run_id[:12]),
        bom_ref=ref,
        version=f"{facts.run_id}@{weights.get('at') or 'end'}",
        description=f"model trained by run {facts.run_id} (recorded by auditlog), at {weights.get('at') or 'the end'}",
        properties=_properties(
            facts,
            (
                "parameters",
                "training_compute",
                "training_time",
                "hardware",
                "energy",
                "hyperparameters",
                "verification",
            ),
        ),
        components=tensors,
    )
    bom = Bom()
    bom.metadata.component = model
    bom.metadata.tools = ToolRepository(
        components=[Component(type=ComponentType.APPLICATION, name="auditlog", version=__version__)]
    )
    datasets = []
    for i, data in enumerate(f["datasets"].value or []):
        sha = data.get("sha256") or data.get("fingerprint")
        component = Component(
            type=ComponentType.DATA,
            name=str(data.get("name") or data.get("class") or f"dataset {i}"),
            bom_ref=f"dataset-{i}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha)] if _is_sha256(sha) else None,
            properties=[
                Property(name=f"auditlog:dataset:{k}", value=_text(v))
                for k, v in sorted(data.items())
                if v is not None
            ],
        )
        datasets.append(component)
        bom.components.add(component)
    code = f["code"].value or {}
    if code.get("commit"):
        bom.components.add(
            Component(
                type=ComponentType.APPLICATION,
                name="training code",
                bom_ref="training-code",
                version=code["commit"],
                properties=[
                    Property(name="auditlog:git:dirty", value=_text(code.get("dirty"))),
                    Property(name="auditlog:argv", value=_text(code.get("argv"))),
                ],
            )
        )
    frameworks = f["frameworks"].value or {}
    if frameworks.get("torch"):
        from packageurl import PackageURL

        bom.components.add(
            Component(
                type=ComponentType.FRAMEWORK,
                name="torch",
                bom_ref="torch",
                version=str(frameworks["torch"]),
                purl=PackageURL(type="pypi", name="torch", version=str(frameworks["torch"])),
            )
        )
    if frameworks.get("python"):
        bom.components.add(
            Component(
                type=ComponentType.PLATFORM,
                name="python",
                bom_ref="python",
                version=str(frameworks["python"]),
            )
        )
    bom.register_dependency(model, list(bom.components))  # what the model was made from
    document: dict[str, Any] = json.loads(JsonV1Dot6(bom).output_as_string())
    document["metadata"]["component"]["modelCard"] = _model_card(
        facts, [c.bom_ref.value for c in datasets]
    )
    text = json.dumps(document)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:  # a defect of ours: never write a document that does not validate
        raise AuditlogError(f"the CycloneDX document does not validate: {error}")
    return document


def _model_card(facts: DocumentationFacts, dataset_refs: list[str | None]) -> dict[str, Any]:
    f = facts.facts
    arch = f["architecture"].value or {}
    layers = ", ".join(f"{n} x{c}" for n, c in list((arch.get("layer_types") or {}).items())[:20])
    card: dict[str, Any] = {
        "modelParameters": {
            "architectureFamily": ", ".join(arch.get("roots") or []) or "unknown",
            "modelArchitecture": f"{arch.get('modules', 0)} modules: {layers}",
        },
    }
    if dataset_refs:
        card["modelParameters"]["datasets"] = [{"ref": r} for r in dataset_refs if r]
    metrics = [
        {"type": str(m["name"]), "value": _text(m["last"]), "slice": f"step {m['at_step']}"}
        for m in f["metrics"].value or []
    ]
    if metrics:
        card["quantitativeAnalysis"] = {"performanceMetrics": metrics}
    considerations: dict[str, Any] = {}
    for name, field in (("intended_purpose", "useCases"), ("limitations", "technicalLimitations")):
        if f[name].value is not None:
            considerations[field] = [_plain(f[name].value)]
    if considerations:
        card["considerations"] = considerations
    card["properties"] = [{"name": "auditlog:run", "value": facts.run_id}]
    return card


def _properties(facts: DocumentationFacts, names: tuple[str, ...]) -> list[Any]:
    from cyclonedx.model import Property

    out = []
    for name in names:
        fact = facts.facts[name]
        out.append(
            Property(
                name=f"auditlog:{name}",
                value=_text(fact.value if fact.value is not None else f"not recorded: {fact.note}"),
            )
        )
        if fact.value is not None and fact.note:  # what the value cannot say (a gap, say)
            out.append(Property(name=f"auditlog:{name}:note", value=_text(fact.note)))
        if fact.evidence:
            out.append(Property(name=f"auditlog:{name}:evidence", value=_text(fact.evidence)))
    return out


# ---------------------------------------------------------------------------- SPDX
def spdx_document(facts: DocumentationFacts) -> dict[str, Any]:
    """An SPDX 3.0.1 JSON-LD document: an AIPackage trainedOn its DatasetPackages."""
    try:
        from spdx_python_model import v3_0_1 as spdx
    except ImportError:
        raise AuditlogError(MISSING_EXTRA) from None
    f = facts.facts
    base = f"urn:auditlog:{facts.run_id}"
    objects = spdx.SHACLObjectSet()
    # createdBy must be an Agent: the login that ran the recorded training (run_started's
    # user@host); the tool that wrote the document is createdUsing.
    who = facts.facts["model"].value
    agent = spdx.Agent(
        _id=f"{base}/agent", name=f"{who.get('user') or 'unknown'}@{who.get('host') or 'unknown'}"
    )
    tool = spdx.Tool(_id=f"{base}/tool", name=f"auditlog {__version__}")
    info = spdx.CreationInfo(
        specVersion="3.0.1", created=datetime.now(UTC), createdBy=[agent], createdUsing=[tool]
    )
    agent.creationInfo = tool.creationInfo = info
    objects.add(agent)
    objects.add(tool)
    model_info = f["model"].value
    weights = f["weights"].value or {}
    package = spdx.ai_AIPackage(
        _id=f"{base}/model",
        creationInfo=info,
        name=str(model_info.get("name") or facts.run_id[:12]),
        software_packageVersion=f"{facts.run_id}@{weights.get('at') or 'end'}",
        software_downloadLocation="NOASSERTION",
        software_primaryPurpose=spdx.software_SoftwarePurpose.model,
        releaseTime=datetime.now(UTC),
        suppliedBy=agent,
        ai_informationAboutTraining=_text(
            {
                k: f[k].value
                for k in (
                    "parameters",
                    "training_compute",
                    "training_time",
                    "hardware",
                    "code",
                    "frameworks",
                )
            }
            # training that ran where no hook saw it (read.gaps), beside the facts it qualifies
            | ({"not_in_the_record": f["model"].note} if f["model"].note else {})
        ),
        ai_typeOfModel=list((f["architecture"].value or {}).get("roots") or []),
        comment="auditlog evidence: " + _text({k: f[k].evidence for k in f}),
    )
    hyper = f["hyperparameters"].value or {}
    for key, value in sorted(hyper.items()):
        package.ai_hyperparameter.append(spdx.DictionaryEntry(key=str(key), value=_text(value)))
    for metric in f["metrics"].value or []:
        package.ai_metric.append(
            spdx.DictionaryEntry(key=str(metric["name"]), value=_text(metric["last"]))
        )
    if f["limitations"].value is not None:
        package.ai_limitation = _plain(f["limitations"].value)
    if f["intended_purpose"].value is not None:
        package.ai_informationAboutApplication = _plain(f["intended_purpose"].value)
    energy = f["energy"].value
    if energy is not None:
        package.ai_energyConsumption = spdx.ai_EnergyConsumption(
            ai_trainingEnergyConsumption=[
                spdx.ai_EnergyConsumptionDescription(
                    ai_energyQuantity=float(energy["kwh"]),
                    ai_energyUnit=spdx.ai_EnergyUnitType.kilowattHour,
                )
            ]
        )
    for i, tensor in enumerate(weights.get("tensors") or []):
        if tensor["sha256"]:
            package.verifiedUsing.append(
                spdx.Hash(
                    algorithm=spdx.HashAlgorithm.sha256,
                    hashValue=tensor["sha256"],
                    comment=f"auditlog content hash of tensor {tensor['key']}",
                )
            )
        if i >= 10_000:  # a bound on the document's size; the record has them all
            break
    objects.add(package)
    elements: list[Any] = [agent, tool, package]
    datasets: list[Any] = []
    for i, data in enumerate(f["datasets"].value or []):
        dataset = spdx.dataset_DatasetPackage(
            _id=f"{base}/dataset/{i}",
            creationInfo=info,
            name=str(data.get("name") or data.get("class") or i),
            software_downloadLocation=str(data.get("url") or "NOASSERTION"),
            releaseTime=info.created,
            suppliedBy=agent,
            builtTime=info.created,
            software_primaryPurpose=spdx.software_SoftwarePurpose.data,
            dataset_datasetType=[spdx.dataset_DatasetType.other],
            comment="auditlog: " + _text(data),
        )
        sha = data.get("sha256") or data.get("fingerprint")
        if _is_sha256(sha):
            dataset.verifiedUsing.append(
                spdx.Hash(algorithm=spdx.HashAlgorithm.sha256, hashValue=sha)
            )
        objects.add(dataset)
        datasets.append(dataset)
        elements.append(dataset)
    # The AI profile asks for exactly one concluded and one declared licence of the package:
    # the user's annotation (``license``), else NOASSERTION (the record cannot know it).
    license_text = _plain(f["license"].value) if f["license"].value is not None else None
    license_ref: Any
    if license_text:
        license_info = spdx.simplelicensing_LicenseExpression(
            _id=f"{base}/license", creationInfo=info, simplelicensing_licenseExpression=license_text
        )
        objects.add(license_info)
        elements.append(license_info)
        license_ref = license_info
    else:
        license_ref = spdx.expandedlicensing_IndividualLicensingInfo.NoAssertionLicense
    for kind in ("hasConcludedLicense", "hasDeclaredLicense"):
        relation = spdx.Relationship(
            _id=f"{base}/{kind}",
            creationInfo=info,
            from_=package,
            relationshipType=getattr(spdx.RelationshipType, kind),
            to=[license_ref],
        )
        objects.add(relation)
        elements.append(relation)
    if datasets:
        relation = spdx.Relationship(
            _id=f"{base}/trainedOn",
            creationInfo=info,
            from_=package,
            relationshipType=spdx.RelationshipType.trainedOn,
            to=datasets,
        )
        objects.add(relation)
        elements.append(relation)
    document = spdx.SpdxDocument(
        _id=f"{base}/document",
        creationInfo=info,
        name=f"auditlog ML-BOM of run {facts.run_id}",
        rootElement=[package],
        element=elements,
        profileConformance=[
            spdx.ProfileIdentifierType.core,
            spdx.ProfileIdentifierType.software,
            spdx.ProfileIdentifierType.ai,
            spdx.ProfileIdentifierType.dataset,
        ],
    )
    objects.add(document)
    serialized: dict[str, Any] = spdx.JSONLDSerializer().serialize_data(objects)
    return serialized


# ---------------------------------------------------------------------------- helpers
def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _plain(value: Any) -> str:
    """A user annotation as text: its one text field (``run.annotate("license", text="MIT")``), else JSON."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        return str(next(iter(value.values())))
    return _text(value)


def _is_sha256(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )
