"""Signed model attestations: an in-toto Statement v1 with a SLSA provenance v1 predicate, in DSSE.

Pure: building and checking envelopes needs no store (``auditlog.read.attest``
gathers what goes in, and checks an attestation against a store).

- **Statement** (in-toto Attestation Framework v1): ``_type``
  ``https://in-toto.io/Statement/v1``; ``subject``: the model file (name, its
  SHA-256) and each tensor of the model's ``state_dict`` (``tensor:<key>``, its
  auditlog content hash: SHA-256 over dtype, shape and bytes, the hash the
  record chains); ``predicateType`` ``https://slsa.dev/provenance/v1``.
- **Predicate** (SLSA provenance v1): ``buildDefinition`` (``buildType``,
  ``externalParameters``: script, argv, step, policy; ``internalParameters``:
  Python, torch, CUDA, platform, seeds; ``resolvedDependencies``: the code's
  git commit with branch, dirty flag and diff hash) and ``runDetails``
  (``builder``, ``metadata``: run id as ``invocationId``, start and end;
  ``byproducts``: one per stream, the signed tree head of the record).
- **Envelope** (DSSE v1): ``{"payloadType": "application/vnd.in-toto+json",
  "payload": base64(statement JSON), "signatures": [{"keyid", "sig":
  base64}]}``; the Ed25519 signature covers ``PAE(payloadType, payload)`` =
  ``"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`` (lengths in ASCII
  decimal). ``keyid`` is the key's fingerprint (SHA-256 of the raw public key).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auditlog.core.payloadlimits import loads_bounded
from auditlog.integrity.keys import KeyRing, Verdict, fingerprint

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:auditlog:buildtype:pytorch-training-run:v1"
BUILDER_ID = "urn:auditlog:recorder"
MODEL_ANNOTATION = "model file"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement(subjects: list[dict[str, Any]], predicate: dict[str, Any]) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def sign_envelope(document: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """A DSSE envelope of ``document`` signed with ``key``."""
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    signature = key.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": fingerprint(key), "sig": base64.b64encode(signature).decode()}],
    }


@dataclass
class OpenedEnvelope:
    """An envelope's statement and what checking its signatures found."""

    statement: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)
    signed_by: list[str] = field(default_factory=list)


def open_envelope(envelope: Any, keys: KeyRing) -> OpenedEnvelope:
    """The statement inside a DSSE envelope, with at least one valid signature by a trusted key."""
    out = OpenedEnvelope(None)
    if not isinstance(envelope, dict) or not isinstance(envelope.get("signatures"), list):
        out.problems.append("not a DSSE envelope (payloadType, payload, signatures)")
        return out
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        out.problems.append(f"payloadType is {envelope.get('payloadType')!r}, not {PAYLOAD_TYPE!r}")
        return out
    try:
        payload = base64.b64decode(str(envelope.get("payload")), validate=True)
    except (binascii.Error, ValueError):
        out.problems.append("payload is not base64")
        return out
    message = pae(PAYLOAD_TYPE, payload)
    untrusted: list[str] = []
    for entry in envelope["signatures"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("keyid"), str):
            continue
        try:
            signature = base64.b64decode(str(entry.get("sig")), validate=True).hex()
        except (binascii.Error, ValueError):
            continue
        verdict = keys.check(entry["keyid"], message, signature)
        if verdict is Verdict.VALID:
            out.signed_by.append(entry["keyid"])
        elif verdict is Verdict.UNKNOWN_KEY:
            untrusted.append(entry["keyid"])
    if not out.signed_by:
        if untrusted:
            out.problems.append(
                f"signed by key {untrusted[0][:16]}, which is not trusted (pass --key)"
            )
        else:
            out.problems.append("no signature by a trusted key verifies (the envelope was edited)")
        return out
    try:
        document = loads_bounded(payload)
    except ValueError:
        out.problems.append("payload is not JSON")
        return out
    if not isinstance(document, dict) or document.get("_type") != STATEMENT_TYPE:
        out.problems.append(f"payload is not an in-toto Statement v1 ({STATEMENT_TYPE})")
        return out
    if document.get("predicateType") != PREDICATE_TYPE:
        out.problems.append(f"predicate is not SLSA provenance v1 ({PREDICATE_TYPE})")
        return out
    out.statement = document
    return out


def model_subject(document: dict[str, Any]) -> dict[str, Any] | None:
    """The statement's model file subject."""
    for subject in document.get("subject") or []:
        if (
            isinstance(subject, dict)
            and (subject.get("annotations") or {}).get("kind") == MODEL_ANNOTATION
        ):
            return subject
    return None


def tensor_subjects(document: dict[str, Any]) -> dict[str, str]:
    """``state_dict key -> content hash`` of the statement's tensor subjects."""
    out: dict[str, str] = {}
    for subject in document.get("subject") or []:
        name = subject.get("name") if isinstance(subject, dict) else None
        if isinstance(name, str) and name.startswith("tensor:"):
            out[name[len("tensor:") :]] = str((subject.get("digest") or {}).get("sha256"))
    return out
