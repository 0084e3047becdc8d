"""OpenSSF Model Signing of restored model files, tied to the record.

Model hubs and deployment tools check models signed in the OpenSSF Model
Signing format (a Sigstore bundle over an in-toto statement whose predicate
lists each file's SHA-256). ``sign_model`` signs a restored model file with the
upstream ``model-signing`` library, so ``model_signing verify key`` accepts it,
then ties that signature to the record with auditlog's own attestation
(``read.attest``: run, step, the tensors' content hashes, the signed tree
heads, under the store's Ed25519 key), which names the signature bundle's
SHA-256 as a subject. ``check_model_signature`` verifies the bundle with the
library and checks that it covers the same file the attestation names: the
two together say "this file, signed in the standard format, is the model run
R had at step S, and the record of R is intact".

Two keys, because the format accepts ECDSA keys on NIST curves only (P-256,
P-384, P-521: sigstore/model-transparency#385) and the record is signed with
Ed25519: ``auditlog keygen --model-signing`` makes the P-256 pair. Key-based
signing only: nothing reaches the network. Sigstore's keyless signing
(``model_signing sign sigstore``) works on the same files where an OIDC
identity and the public-good instance are reachable; not done here.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from auditlog.core.errors import AuditlogError, IntegrityError

MISSING_EXTRA = "OpenSSF model signing needs the optional extra: pip install 'auditlog[compliance]'"
SIGNATURE_ANNOTATION = (
    "OpenSSF Model Signing bundle (Sigstore bundle, in-toto statement) of the model file"
)


def _library() -> Any:
    try:
        import model_signing
    except ImportError:
        raise AuditlogError(MISSING_EXTRA) from None
    return model_signing


def sign_file(model: Path, signature: Path, private_key: Path) -> None:
    """Sign ``model`` (a file) in the OpenSSF format with an ECDSA private key (PEM)."""
    library = _library()
    try:
        library.signing.Config().use_elliptic_key_signer(private_key=private_key).sign(
            model, signature
        )
    except ValueError as exc:  # the library's word for an unsupported or unreadable key
        raise AuditlogError(
            f"cannot sign with {str(private_key)!r}: {exc} (make a pair with "
            "`auditlog keygen --model-signing`)"
        ) from None


def check_model_signature(model: Path, signature: Path, public_key: Path) -> str:
    """Verify the bundle over ``model`` with the library; return the file's SHA-256 it covers.
    ``IntegrityError`` when it does not verify (a changed byte, another key)."""
    library = _library()
    try:
        library.verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(
            model, signature
        )
    except Exception as exc:  # the library raises ValueError and its own errors alike
        raise IntegrityError(
            f"the OpenSSF model signature {signature.name} does not verify for {model.name}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    digest = _covered_digest(signature)
    actual = hashlib.sha256(model.read_bytes()).hexdigest()
    if digest != actual:  # the library checked it too; this names the digest the tie compares
        raise IntegrityError(
            f"the OpenSSF model signature covers sha256 {digest}, not {model.name}'s {actual}"
        )
    return actual


def signature_subject(signature: Path) -> dict[str, Any]:
    """The attestation subject naming the bundle (its file's SHA-256)."""
    return {
        "name": f"openssf-model-signature:{signature.name}",
        "digest": {"sha256": hashlib.sha256(signature.read_bytes()).hexdigest()},
        "annotations": {"kind": SIGNATURE_ANNOTATION},
    }


def attested_signature(document: dict[str, Any]) -> dict[str, Any] | None:
    """The bundle subject of an attestation's statement, if it has one."""
    for subject in document.get("subject") or []:
        if (
            isinstance(subject, dict)
            and (subject.get("annotations") or {}).get("kind") == SIGNATURE_ANNOTATION
        ):
            return subject
    return None


def _covered_digest(signature: Path) -> str | None:
    """The one resource digest in the bundle's statement (a single-file model: its SHA-256)."""
    try:
        bundle = json.loads(signature.read_text())
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        resources = statement["predicate"]["resources"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(resources, list) or len(resources) != 1 or not isinstance(resources[0], dict):
        return None
    digest = resources[0].get("digest")
    return digest if isinstance(digest, str) else None
