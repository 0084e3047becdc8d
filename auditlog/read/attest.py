"""``auditlog attest`` / ``verify-attestation``: a model file's provenance, signed, from the record.

``attest`` refuses to vouch for what the record does not say: the run must
verify (no proven alteration), every tensor of the model at the step must have
a snapshot, and the model file given must hold exactly those tensors (each
one's content hash equal to the chained hash). The statement carries the run's
signed tree heads, so ``verify-attestation --store`` can check the record still
holds what was attested, and an auditor without the store can check the
envelope and the model file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auditlog.core.cpus import hash_threads
from auditlog.core.errors import AuditlogError, IntegrityError
from auditlog.core.tensors import matches_recorded, tensor_hash
from auditlog.core.values import iso
from auditlog.core.version import __version__
from auditlog.integrity.attest import (
    BUILD_TYPE,
    BUILDER_ID,
    MODEL_ANNOTATION,
    model_subject,
    open_envelope,
    sign_envelope,
    statement,
    tensor_subjects,
)
from auditlog.integrity.checkpoints import Told, checkpoint_run, checkpoints_for, store_id
from auditlog.integrity.keys import KeyRing, fingerprint
from auditlog.integrity.merkle import root
from auditlog.integrity.proofs import signed_tree_head
from auditlog.integrity.statements import Checkpoint
from auditlog.read.proofs import stream_leaves
from auditlog.read.run import Run
from auditlog.store.blobs import file_digest
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import payload_object


def load_state_dict(path: Path) -> Mapping[str, Any]:
    """A model file as a state_dict: ``.safetensors``, or a torch file (loaded with weights_only)."""
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            loaded: Any = load_file(str(path))
        else:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise AuditlogError(
            f"cannot read {str(path)!r} as a state_dict (.safetensors or a torch file): {exc}"
        ) from exc
    if not isinstance(loaded, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise AuditlogError(f"{str(path)!r} is not a state_dict (a mapping of names to tensors)")
    return loaded


def _tensor_hashes(run: Run, step: int | None) -> list[tuple[str, str]]:
    plan = run.restore_plan(step=step)
    missing = [key for key, sha in plan if sha is None]
    if missing or not plan:
        when = f"step {step}" if step is not None else "the end"
        raise AuditlogError(
            f"no snapshot of {', '.join(missing[:5]) or 'any tensor'} at {when}: "
            "only a fully snapshotted state can be attested"
        )
    return [(key, sha) for key, sha in plan if sha is not None]


def _check_model(path: Path, expected: list[tuple[str, str]], when: str) -> None:
    tensors = load_state_dict(path)
    wanted = dict(expected)
    if set(tensors) != set(wanted):
        odd = sorted(set(tensors) ^ set(wanted))
        raise IntegrityError(
            f"model file {str(path)!r} does not hold the recorded state_dict at {when}: "
            f"keys differ ({', '.join(odd[:5])})"
        )
    for key, sha in expected:
        if not matches_recorded(tensors[key], sha, threads=hash_threads()):
            actual = tensor_hash(tensors[key])
            raise IntegrityError(
                f"model file {str(path)!r}: tensor {key} is not the recorded value at {when} "
                f"(hash {actual[:16]}..., the record says {sha[:16]}...)"
            )


def _signed_heads(
    store: EventStore, run_id: str, key: Ed25519PrivateKey, told: Told | None
) -> list[Checkpoint]:
    """The run's newest tree head per stream signed by ``key`` (signing the current heads first)."""
    checkpoint_run(
        store, run_id, key, told
    )  # refuses an altered or stripped record; signs what is not signed yet
    mine = fingerprint(key)
    newest: dict[int, Checkpoint] = {}
    for cp in checkpoints_for(store, run_id):
        if (
            cp.is_tree_head
            and cp.key_fingerprint == mine
            and cp.seq >= getattr(newest.get(cp.stream), "seq", 0)
        ):
            newest[cp.stream] = cp
    return [newest[s] for s in sorted(newest)]


def attest(
    store: EventStore,
    run_id: str,
    step: int | None,
    model: Path,
    key: Ed25519PrivateKey,
    told: Told | None = None,
    also: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A signed DSSE envelope attesting that ``model`` came out of the recorded run at ``step``
    (``told``: the line saying what the signature trusts, ``integrity.checkpoints.trust_line``;
    ``also``: more subjects, e.g. the OpenSSF signature bundle of the file, ``read.modelsign``)."""
    run = Run(store, run_id)
    heads = _signed_heads(store, run_id, key, told)
    when = f"step {step}" if step is not None else "the end of the run"
    hashes = _tensor_hashes(run, step)
    _check_model(model, hashes, when)
    info = run.info()
    started_event = store.run_started_event(run_id) or {}
    started = payload_object(started_event.get("payload"), started_event)
    git = started.get("git") if isinstance(started.get("git"), dict) else None
    subjects: list[dict[str, Any]] = [
        {
            "name": model.name,
            "digest": {"sha256": file_digest(model)},
            "annotations": {"kind": MODEL_ANNOTATION},
        },
        *(
            {
                "name": f"tensor:{k}",
                "digest": {"sha256": sha},
                "annotations": {
                    "kind": "tensor content hash (auditlog.tensor_hash: SHA-256 over dtype, shape, bytes; "
                    "over 4 MiB, over the SHA-256 of each 4 MiB leaf)"
                },
            }
            for k, sha in hashes
        ),
        *(also or []),
    ]
    sid = store_id(store)
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "script": (started.get("argv") or [None])[0],
                "argv": started.get("argv"),
                "step": step,
                "policy": started.get("policy"),
            },
            "internalParameters": {
                k: started.get(k) for k in ("python", "torch", "cuda", "platform", "seeds")
            },
            "resolvedDependencies": []
            if not git
            else [
                {
                    "uri": f"git+file://{git.get('root')}",
                    "digest": {"gitCommit": git.get("commit")},
                    "annotations": {
                        "branch": git.get("branch"),
                        "dirty": git.get("dirty"),
                        "diff_sha256": git.get("diff_sha256"),
                    },
                }
            ],
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID, "version": {"auditlog": __version__}},
            "metadata": {
                "invocationId": run_id,
                "startedOn": iso(info.started_ns),
                "finishedOn": iso(info.ended_ns) if info.ended_ns else None,
            },
            "byproducts": [
                {
                    "name": f"auditlog:store/{sid}/run/{run_id}/stream/{cp.stream}",
                    "digest": {"sha256": cp.head_hash},
                    "annotations": {
                        "signed_tree_head": {**cp.fields(sid), "signature": cp.signature},
                        "host": started.get("host"),
                        "user": started.get("user"),
                        "status": info.status,
                    },
                }
                for cp in heads
            ],
        },
    }
    return sign_envelope(statement(subjects, predicate), key)


@dataclass
class AttestationCheck:
    """What ``verify_attestation`` found: ``problems`` empty means it holds."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    run_id: str | None = None
    model: str | None = None


def verify_attestation(
    envelope: Any,
    keys: KeyRing,
    model: Path | None = None,
    store: EventStore | None = None,
    model_signature: tuple[Path, Path] | None = None,
) -> AttestationCheck:
    """Check the envelope's signature and, when given, the model file, the record, and
    (``model_signature``: bundle and ECDSA public key) the file's OpenSSF model signature."""
    out = AttestationCheck()
    opened = open_envelope(envelope, keys)
    out.problems.extend(opened.problems)
    document = opened.statement
    if document is None:
        return out
    out.checked.append(f"signature by key {opened.signed_by[0][:16]}")
    subject = model_subject(document) or {}
    out.model = subject.get("name")
    out.run_id = (
        ((document.get("predicate") or {}).get("runDetails") or {})
        .get("metadata", {})
        .get("invocationId")
    )
    if model is not None:
        digest = hashlib.sha256(model.read_bytes()).hexdigest() if model.is_file() else None
        if digest is None or digest != (subject.get("digest") or {}).get("sha256"):
            out.problems.append(
                f"model file {str(model)!r} is not the attested model (its SHA-256 differs)"
            )
        else:
            out.checked.append(f"model file {model.name} (sha256 {digest[:16]}...)")
    if model_signature is not None:
        _model_signature(document, model, model_signature, out)
    if store is not None:
        _against_store(document, keys, store, out)
    return out


def _model_signature(
    document: dict[str, Any], model: Path | None, given: tuple[Path, Path], out: AttestationCheck
) -> None:
    """The OpenSSF bundle verifies for the model file, covers the file the statement names,
    and is the bundle the statement names (its SHA-256)."""
    from auditlog.read.modelsign import attested_signature, check_model_signature

    bundle, public_key = given
    if model is None:
        out.problems.append(
            "an OpenSSF model signature is checked against the model file: give --model"
        )
        return
    try:
        covered = check_model_signature(model, bundle, public_key)
    except IntegrityError as exc:
        out.problems.append(str(exc))
        return
    out.checked.append(f"OpenSSF model signature {bundle.name} verifies for {model.name}")
    if covered != ((model_subject(document) or {}).get("digest") or {}).get("sha256"):
        out.problems.append(
            "the OpenSSF model signature covers another file than the attestation names"
        )
    named = attested_signature(document)
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    if named is None or (named.get("digest") or {}).get("sha256") != digest:
        out.problems.append(
            f"the attestation does not name the OpenSSF signature {bundle.name} (its SHA-256 differs "
            "or it names none): the signature is not tied to the record"
        )
    else:
        out.checked.append(
            f"the attestation names the OpenSSF signature {bundle.name} (sha256 {digest[:16]}...)"
        )


def _against_store(
    document: dict[str, Any], keys: KeyRing, store: EventStore, out: AttestationCheck
) -> None:
    """The record still holds the attested signed tree heads and tensors."""
    run_id = out.run_id
    if not isinstance(run_id, str):
        out.problems.append("the statement names no run")
        return
    predicate = document.get("predicate") or {}
    for product in (predicate.get("runDetails") or {}).get("byproducts") or []:
        signed = (
            (product.get("annotations") or {}).get("signed_tree_head")
            if isinstance(product, dict)
            else None
        )
        stream = signed.get("stream") if isinstance(signed, dict) else None
        head = signed_tree_head(
            signed,
            stream if isinstance(stream, int) else -1,
            keys,
            out.problems,
            "attested tree head",
        )
        if head is None:
            continue
        leaves, _, _ = stream_leaves(store, run_id, head.stream)
        if head.size > len(leaves) or root(leaves, head.size).hex() != head.root:
            out.problems.append(
                f"the record no longer holds the attested tree head of stream {head.stream} "
                f"(size {head.size}): events were changed or cut off"
            )
        else:
            out.checked.append(
                f"record: stream {head.stream} holds the attested tree head of {head.size} events"
            )
    step = ((predicate.get("buildDefinition") or {}).get("externalParameters") or {}).get("step")
    try:
        recorded = dict(_tensor_hashes(Run(store, run_id), step if isinstance(step, int) else None))
    except AuditlogError as exc:
        out.problems.append(f"the record cannot give the attested tensors: {exc}")
        return
    if recorded != tensor_subjects(document):
        out.problems.append(
            "the attested tensors are not the record's state_dict at the attested step"
        )
    else:
        out.checked.append(f"record: {len(recorded)} tensors match the attested content hashes")
