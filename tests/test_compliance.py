"""Compliance evidence: the documentation facts, the CycloneDX ML-BOM and the SPDX 3 document.

A two-layer model whose numbers the test computes itself (parameters, FLOPs,
the content hashes of its weights at a step) is recorded for real; the
documents are checked with the formats' own libraries: the CycloneDX JSON
schema validator of ``cyclonedx-python-lib`` and the SPDX 3.0.1 bindings'
deserializer. No test reaches the network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke
from torch import nn

import auditlog

BATCH, IN, HIDDEN, OUT, STEPS = 8, 4, 8, 2, 4
PARAMETERS = IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT
FORWARD_FLOPS = (
    2 * BATCH * IN * HIDDEN + 2 * BATCH * HIDDEN * OUT
)  # two matmuls, a multiply-add counts 2


def _powercap(root: Path, energy_uj: int) -> None:
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("compliance")
    store = root / "store"
    powercap = root / "powercap"
    _powercap(powercap, 1_000_000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUDITLOG_POWERCAP", str(powercap))
        with auditlog.record(store=store, name="two-layer", snapshot_every=2) as run:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            run.annotate(
                "dataset", name="toy-regression", sha256="ab" * 32, url="https://example.org/toy"
            )
            run.annotate("intended_purpose", text="a demonstration regressor")
            run.annotate("license", text="MIT")
            at_step_2: dict[str, str] = {}
            data = torch.utils.data.TensorDataset(torch.randn(BATCH * STEPS, IN))
            loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
            for step, (inputs,) in enumerate(loader, start=1):
                loss = nn.functional.mse_loss(model(inputs), torch.zeros(BATCH, OUT))
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step == 2:
                    at_step_2 = {k: auditlog.tensor_hash(v) for k, v in model.state_dict().items()}
            _powercap(powercap, 4_500_000)  # 3.5 J used while training
    assert run.run_id is not None
    return {"root": root, "store": store, "run_id": run.run_id, "hashes": at_step_2}


def _bom(recorded: dict[str, Any], fmt: str, *extra: str) -> dict[str, Any]:
    out = recorded["root"] / f"bom-{fmt}-{'-'.join(extra) or 'end'}.json"
    result = invoke(
        "bom", "--store", str(recorded["store"]), "--format", fmt, "-o", str(out), *extra
    )
    assert result.exit_code == 0, result.stderr
    return dict(json.loads(out.read_text()))


def test_the_facts_are_the_numbers_the_test_computes_and_name_their_events(
    recorded: dict[str, Any],
) -> None:
    facts = _bom(recorded, "json", "--step", "2")["facts"]
    assert facts["parameters"]["value"]["total"] == PARAMETERS == 58
    assert facts["parameters"]["value"]["total_2sf"] == "58"
    compute = facts["training_compute"]["value"]
    assert compute["forward_flops"] == FORWARD_FLOPS
    assert compute["total_flops"] == FORWARD_FLOPS * 3 * STEPS and compute["steps"] == STEPS
    assert "2 x the forward" in compute["method"]
    assert facts["training_compute"]["evidence"][0]["kind"] == "flops"
    weights = {t["key"]: t["sha256"] for t in facts["weights"]["value"]["tensors"]}
    assert weights == recorded["hashes"]  # the hashes of the live weights after step 2
    assert facts["energy"]["value"]["joules"] == pytest.approx(3.5)
    (stream,) = facts["training_time"]["value"]["per_stream"]
    assert stream["rank"] == 0 and stream["status"] == "completed"
    assert 0 < stream["wall_s"] <= facts["training_time"]["value"]["wall_s"] + 1
    assert facts["architecture"]["value"]["layer_types"] == {
        "Linear": 2,
        "ReLU": 1,
        "Sequential": 1,
    }
    recorded_data, annotated = facts["datasets"]["value"]
    assert recorded_data["source"] == "recorded" and recorded_data["method"] == "tensors"
    assert recorded_data["length"] == BATCH * STEPS and len(recorded_data["fingerprint"]) == 64
    assert facts["datasets"]["evidence"][0]["kind"] == "dataset_seen"
    assert annotated["name"] == "toy-regression"
    assert facts["intended_purpose"]["value"] == {"text": "a demonstration regressor"}
    assert facts["verification"]["value"]["assurance"] == "unsigned"
    # A fact the record cannot hold is present, empty, and says how to supply it.
    assert facts["evaluation"]["value"] is None
    assert "run.annotate('evaluation'" in facts["evaluation"]["note"]
    assert facts["model"]["evidence"][0]["kind"] == "run_started"


def test_the_cyclonedx_ml_bom_validates_and_carries_the_record(recorded: dict[str, Any]) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    document = _bom(recorded, "cyclonedx", "--step", "2")
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document)) is None
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.6"
    model = document["metadata"]["component"]
    assert model["type"] == "machine-learning-model"
    props = {p["name"]: p["value"] for p in model["properties"]}
    assert json.loads(props["auditlog:parameters"])["total"] == PARAMETERS
    assert (
        json.loads(props["auditlog:training_compute"])["total_flops"] == FORWARD_FLOPS * 3 * STEPS
    )
    tensors = {c["name"]: c["hashes"][0]["content"] for c in model["components"]}
    assert tensors == recorded["hashes"]
    card = model["modelCard"]
    assert card["modelParameters"]["datasets"] == [{"ref": "dataset-0"}, {"ref": "dataset-1"}]
    assert card["considerations"]["useCases"] == ["a demonstration regressor"]
    assert [m["type"] for m in card["quantitativeAnalysis"]["performanceMetrics"]] == ["loss"]
    recorded_data, dataset = [c for c in document["components"] if c["type"] == "data"]
    assert recorded_data["name"] == "torch.utils.data.dataset.TensorDataset"
    assert (
        recorded_data["hashes"][0]["content"]
        == _bom(recorded, "json")["facts"]["datasets"]["value"][0]["fingerprint"]
    )
    assert dataset["name"] == "toy-regression" and dataset["hashes"][0]["content"] == "ab" * 32
    assert {c["name"] for c in document["components"]} >= {"torch", "python"}


def test_the_spdx_document_reads_back_with_the_spdx_bindings(recorded: dict[str, Any]) -> None:
    from spdx_python_model import v3_0_1 as spdx

    out = recorded["root"] / "bom.spdx.json"
    result = invoke(
        "bom", "--store", str(recorded["store"]), "--format", "spdx", "--step", "2", "-o", str(out)
    )
    assert result.exit_code == 0, result.stderr
    objects = spdx.SHACLObjectSet()
    with out.open("rb") as f:
        spdx.JSONLDDeserializer().read(f, objects)
    assert not objects.link()  # every reference resolves inside the document
    (package,) = list(objects.foreach_type(spdx.ai_AIPackage))
    recorded_data, dataset = sorted(
        objects.foreach_type(spdx.dataset_DatasetPackage), key=lambda d: d.spdxId
    )
    assert (
        recorded_data.name == "torch.utils.data.dataset.TensorDataset"
        and recorded_data.verifiedUsing
    )
    assert (
        dataset.name == "toy-regression"
        and dataset.software_downloadLocation == "https://example.org/toy"
    )
    hyper = {e.key: e.value for e in package.ai_hyperparameter}
    assert json.loads(hyper["lr"]) == 0.05
    assert package.ai_informationAboutApplication == "a demonstration regressor"
    training = json.loads(package.ai_informationAboutTraining)
    assert training["training_compute"]["forward_flops"] == FORWARD_FLOPS
    assert training["parameters"]["total"] == PARAMETERS
    kwh = package.ai_energyConsumption.ai_trainingEnergyConsumption[0].ai_energyQuantity
    assert kwh == pytest.approx(3.5 / 3.6e6)
    assert {h.hashValue for h in package.verifiedUsing} == set(recorded["hashes"].values())
    relations = {
        r.relationshipType.rsplit("/", 1)[-1]: r for r in objects.foreach_type(spdx.Relationship)
    }
    assert relations["trainedOn"].to == [recorded_data, dataset]
    assert {"hasConcludedLicense", "hasDeclaredLicense"} <= set(relations)
    (licence,) = list(objects.foreach_type(spdx.simplelicensing_LicenseExpression))
    assert licence.simplelicensing_licenseExpression == "MIT"


def test_the_report_lays_the_facts_out_by_annex_and_marks_what_is_missing(
    recorded: dict[str, Any],
) -> None:
    out = recorded["root"] / "report.html"
    result = invoke("report", "--store", str(recorded["store"]), "-o", str(out))
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    techdoc = page[page.index('id="techdoc"') :]
    assert "Annex IV, point 2" in techdoc and "Annex XI, section 1" in techdoc
    assert (
        f"{PARAMETERS:,} parameters" in techdoc
        and f"{FORWARD_FLOPS * 3 * STEPS:,} FLOPs" in techdoc
    )
    assert "a demonstration regressor" in techdoc and "3.5 J" in techdoc
    assert "1 missing" in techdoc  # the evaluation: nobody annotated it
    assert 'href="#compute"' in techdoc and "flops seq" in techdoc
    data = page[page.index('id="data"') : page.index('id="training"')]
    assert (
        "TensorDataset" in data and "tensors" in data
    )  # the recorded dataset, identified by its tensors
    assert ">32<" in data and "toy-regression" in data  # its length; the annotation below it


def test_energy_is_not_measured_where_no_counter_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUDITLOG_POWERCAP", str(tmp_path / "absent"))
    with auditlog.record(store=tmp_path / "store") as run:
        model = nn.Linear(2, 1)
        model(torch.randn(3, 2)).sum().backward()
    with auditlog.open(tmp_path / "store") as s:
        from auditlog.read.docfacts import documentation_facts

        facts = documentation_facts(s.run(run.run_id))
    assert facts.value("energy") is None and "not measured" in str(facts.facts["energy"].note)
    assert facts.value("datasets") == [] and "annotate('dataset'" in str(
        facts.facts["datasets"].note
    )


def test_a_counter_that_wrapped_during_the_run_is_counted_once(tmp_path: Path) -> None:
    from auditlog.read.docfacts import _energy

    start = {
        "source": "rapl",
        "zones": {
            "intel-rapl:0": {"name": "package-0", "energy_uj": 900, "max_energy_range_uj": 1000}
        },
    }
    end = {
        "source": "rapl",
        "zones": {
            "intel-rapl:0": {"name": "package-0", "energy_uj": 100, "max_energy_range_uj": 1000}
        },
    }
    fact = _energy(
        {"energy": start}, [{"payload": json.dumps({"energy": end}), "seq": 9, "step": 1}], []
    )
    assert fact.value["zones"][0]["joules"] == pytest.approx(200 / 1e6)


def test_bom_of_a_step_the_run_never_reached_is_a_usage_error(recorded: dict[str, Any]) -> None:
    result = invoke("bom", "--store", str(recorded["store"]), "--step", "99")
    assert result.exit_code == 2 and "no step 99" in result.stderr


def test_a_restored_model_signed_in_the_openssf_format_verifies_upstream_and_against_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``restore --sign``: the upstream ``model_signing verify`` accepts the file, our check ties the
    signature to the record; one changed byte fails both."""
    import subprocess
    import sys

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("AUDITLOG_KEY", raising=False)
    monkeypatch.delenv("AUDITLOG_MODEL_SIGNING_KEY", raising=False)
    assert invoke("keygen").exit_code == 0
    made = invoke("keygen", "--model-signing")
    assert made.exit_code == 0, made.stderr
    keys = tmp_path / "config" / "auditlog"
    store = tmp_path / "store"
    with auditlog.record(store=store, snapshot_every=1) as run:
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(BATCH, IN)).pow(2).mean().backward()
            opt.step()
    target = tmp_path / "model.safetensors"
    result = invoke("restore", "--store", str(store), "--step", "2", "-o", str(target), "--sign")
    assert result.exit_code == 0, result.stderr
    signature, attestation = Path(f"{target}.sig"), Path(f"{target}.intoto.json")
    assert signature.is_file() and attestation.is_file()

    def upstream(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "model_signing",
                "verify",
                "key",
                str(path),
                "--signature",
                str(signature),
                "--public_key",
                str(keys / "model_signing_key.pub"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ours(path: Path) -> Any:
        return invoke(
            "verify-attestation",
            "--key",
            str(keys / "signing_key.pub"),
            "--model",
            str(path),
            "--model-signature",
            str(signature),
            "--model-signing-key",
            str(keys / "model_signing_key.pub"),
            "--store",
            str(store),
            str(attestation),
        )

    assert upstream(target).returncode == 0
    checked = ours(target)
    assert checked.exit_code == 0, checked.stderr
    assert "OpenSSF model signature model.safetensors.sig verifies" in checked.stdout
    assert "the attestation names the OpenSSF signature" in checked.stdout
    assert "tensors match the attested content hashes" in checked.stdout
    document = json.loads(
        __import__("base64").b64decode(json.loads(attestation.read_text())["payload"])
    )
    assert document["predicate"]["buildDefinition"]["externalParameters"]["step"] == 2
    assert document["predicate"]["runDetails"]["metadata"]["invocationId"] == run.run_id

    changed = tmp_path / "changed" / target.name
    changed.parent.mkdir()
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    changed.write_bytes(bytes(data))
    assert upstream(changed).returncode != 0
    refused = ours(changed)
    assert refused.exit_code == 4 and "is not the attested model" in refused.stderr
    from auditlog.core.errors import IntegrityError
    from auditlog.read.modelsign import check_model_signature

    with pytest.raises(IntegrityError, match="does not verify"):
        check_model_signature(changed, signature, keys / "model_signing_key.pub")

    # Another key's valid signature of the same file is not the one the record's attestation names.
    other = tmp_path / "other_key"
    assert invoke("keygen", "--model-signing", "-o", str(other)).exit_code == 0
    from auditlog.read.modelsign import sign_file

    sign_file(target, signature, other)
    foreign = invoke(
        "verify-attestation",
        "--key",
        str(keys / "signing_key.pub"),
        "--model",
        str(target),
        "--model-signature",
        str(signature),
        "--model-signing-key",
        str(tmp_path / "other_key.pub"),
        str(attestation),
    )
    assert foreign.exit_code == 4 and "does not name the OpenSSF signature" in foreign.stderr
