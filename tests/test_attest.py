"""``auditlog attest`` / ``verify-attestation``: in-toto + SLSA provenance of a model file, in DSSE.

The envelope is also checked by an independent DSSE implementation
(securesystemslib), so it is DSSE as others read it, not only as we do.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from forgery_support import train
from helpers import invoke
from integrity_support import rewrite_chain

from auditlog.integrity.attest import pae
from auditlog.integrity.keys import KeyPair, fingerprint, generate_key_pair, load_public_key


@pytest.fixture
def attested(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str, KeyPair, Path, Path]:
    key = generate_key_pair(tmp_path / "keys" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    run_id = train(store, "r1", seed=0)
    model = tmp_path / "model.safetensors"
    assert (
        invoke("restore", "--store", str(store), run_id, "--step", "4", "-o", str(model)).exit_code
        == 0
    )
    envelope = tmp_path / "model.intoto.json"
    made = invoke(
        "attest",
        "--store",
        str(store),
        run_id,
        "--step",
        "4",
        "--model",
        str(model),
        "-o",
        str(envelope),
    )
    assert made.exit_code == 0, made.stderr
    return store, run_id, key, model, envelope


def check(envelope: Path, key: KeyPair, *args: str) -> tuple[int, str]:
    result = invoke("verify-attestation", "--key", str(key.public_path), *args, str(envelope))
    return result.exit_code, result.stdout + result.stderr


def test_attest_and_verify_round_trip(attested: tuple[Path, str, KeyPair, Path, Path]) -> None:
    store, run_id, key, model, envelope = attested
    code, text = check(envelope, key, "--model", str(model), "--store", str(store))
    assert code == 0, text
    assert f"attestation holds: model.safetensors from run {run_id[:12]}" in text
    assert "checked: model file model.safetensors" in text
    assert "record: stream 0 holds the attested tree head" in text and "tensors match" in text
    data = json.loads(envelope.read_text())
    statement = json.loads(base64.b64decode(data["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    names = [s["name"] for s in statement["subject"]]
    assert names[0] == "model.safetensors" and {"tensor:0.weight", "tensor:2.bias"} <= set(names)
    predicate = statement["predicate"]
    assert predicate["buildDefinition"]["externalParameters"]["step"] == 4
    assert predicate["runDetails"]["metadata"]["invocationId"] == run_id
    (product,) = predicate["runDetails"]["byproducts"]
    head = product["annotations"]["signed_tree_head"]
    assert head["format"] == "auditlog-checkpoint-v2" and head["ended"] is True
    # no store at hand: the envelope and the model file still check
    assert check(envelope, key, "--model", str(model))[0] == 0


def test_an_independent_dsse_verifier_accepts_the_envelope(
    attested: tuple[Path, str, KeyPair, Path, Path],
) -> None:
    dsse = pytest.importorskip("securesystemslib.dsse")
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    _store, _run, key, _model, envelope = attested
    public = load_public_key(key.public_path)
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    theirs = SSlibKey(fingerprint(public), "ed25519", "ed25519", {"public": raw.hex()})
    data = json.loads(envelope.read_text())
    parsed = dsse.Envelope.from_dict(
        json.loads(envelope.read_text())
    )  # from_dict edits its argument
    assert parsed.payload_type == "application/vnd.in-toto+json"
    assert parsed.pae() == pae(data["payloadType"], base64.b64decode(data["payload"]))
    assert set(parsed.verify([theirs], 1)) == {fingerprint(public)}
    tampered = dict(
        data, payload=base64.b64encode(base64.b64decode(data["payload"]) + b" ").decode()
    )
    with pytest.raises(VerificationError):
        dsse.Envelope.from_dict(tampered).verify([theirs], 1)


def test_a_model_file_changed_by_one_byte_fails(
    attested: tuple[Path, str, KeyPair, Path, Path], tmp_path: Path
) -> None:
    _store, _run, key, model, envelope = attested
    data = bytearray(model.read_bytes())
    data[-1] ^= 0x01
    changed = tmp_path / "changed.safetensors"
    changed.write_bytes(bytes(data))
    code, text = check(envelope, key, "--model", str(changed))
    assert code == 4 and "is not the attested model" in text


def test_edited_or_untrusted_envelopes_fail(
    attested: tuple[Path, str, KeyPair, Path, Path], tmp_path: Path
) -> None:
    _store, _run, key, _model, envelope = attested
    data = json.loads(envelope.read_text())
    statement = json.loads(base64.b64decode(data["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "0" * 64  # claim another model file
    forged = tmp_path / "forged.json"
    forged.write_text(
        json.dumps(dict(data, payload=base64.b64encode(json.dumps(statement).encode()).decode()))
    )
    code, text = check(forged, key)
    assert code == 4 and "no signature by a trusted key verifies" in text
    other = generate_key_pair(tmp_path / "other")
    result = invoke("verify-attestation", "--key", str(other.public_path), str(envelope))
    assert result.exit_code == 4 and "not trusted" in result.stderr


def test_attest_refuses_a_model_that_is_not_the_recorded_state(
    attested: tuple[Path, str, KeyPair, Path, Path], tmp_path: Path
) -> None:
    store, run_id, _key, _model, _envelope = attested
    early = tmp_path / "step2.safetensors"
    assert (
        invoke("restore", "--store", str(store), run_id, "--step", "2", "-o", str(early)).exit_code
        == 0
    )
    result = invoke(
        "attest",
        "--store",
        str(store),
        run_id,
        "--step",
        "4",
        "--model",
        str(early),
        "-o",
        str(tmp_path / "wrong.intoto.json"),
    )
    assert result.exit_code == 4 and "is not the recorded value at step 4" in result.stderr
    assert not (tmp_path / "wrong.intoto.json").exists()


def test_verify_attestation_against_a_rewritten_record_fails(
    attested: tuple[Path, str, KeyPair, Path, Path],
) -> None:
    store, run_id, key, _model, envelope = attested
    rewrite_chain(store, run_id, 4)
    code, text = check(envelope, key, "--store", str(store))
    assert code == 4 and "no longer holds the attested tree head" in text
