"""Proof documents: one event, or one stream's growth, shown to someone without the store.

Pure functions over JSON objects: building needs the leaf hashes (read by
``auditlog.read.proofs``), checking needs only the document and a public key,
so ``auditlog verify-proof`` works without the store, and so can a third
party's verifier (docs/integrity.md specifies every byte).

``auditlog-inclusion-proof-v1``::

    {"format", "event": {run_id, stream, seq, ts_ns, kind, step, module_id,
     tensor_id, payload}, "leaf_index", "tree_size", "audit_path": [hex],
     "tree_head": {<an auditlog-checkpoint-v2 statement>, "signature"}}

The event has exactly the fields of its stream's chain format's canonical row
(``core.chain``): an event of a stream recorded before chain v2 also has
``snapshot`` (null) before ``payload``, as every proof made before did. The event's
leaf is ``SHA-256(0x00 || canonical_row(event))`` in that format (two formats'
canonical rows are never the same bytes, so the signed tree head decides); the audit path
leads from it to ``tree_head.tree_root`` (RFC 9162 2.1.3.2); the tree head's
Ed25519 signature covers its canonical JSON without ``signature``.

``auditlog-consistency-proof-v1``::

    {"format", "run_id", "stream", "old_head": {<signed statement>},
     "new_head": {<signed statement>}, "old_size", "new_size", "proof": [hex]}

A signed statement is a checkpoint-v2 statement (one stream) or a head-v2
statement (``auditlog export-head``: the stream's entry in ``heads`` is used).
The proof shows the tree of ``old_size`` events (the old head's root) is a
prefix of the tree of ``new_size`` (RFC 9162 2.1.4.2): nothing signed before
was changed or removed, whatever was added after.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from auditlog.core.chain import FORMATS, ChainFormat, canonical_row
from auditlog.core.eventrow import HASHED_COLUMNS, RETIRED
from auditlog.core.payloadlimits import NotJSONError, limit_problem
from auditlog.integrity.chaincheck import EVENT_TYPES, short
from auditlog.integrity.keys import KeyRing, Verdict
from auditlog.integrity.merkle import leaf_hash, verify_consistency, verify_inclusion
from auditlog.integrity.statements import (
    CHECKPOINT_FORMAT,
    HEAD_FORMAT,
    HeadStatement,
    StatementError,
    canonical_statement,
)

INCLUSION_FORMAT = "auditlog-inclusion-proof-v1"
CONSISTENCY_FORMAT = "auditlog-consistency-proof-v1"
EVENT_FIELDS = HASHED_COLUMNS  # the canonical row of the current chain format (core.eventrow)
# Each field's types as stored; a retired column (v1's ``snapshot``) as the table held it.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **EVENT_TYPES,
    **{r.column.name: (r.column.python, type(None)) for r in RETIRED},
}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
_CHECKPOINT_FIELDS = {
    "format",
    "store_id",
    "run_id",
    "stream",
    "seq",
    "head_hash",
    "tree_root",
    "ended",
    "world_size",
    "created_ns",
    "key_fingerprint",
    "signature",
}


@dataclass(frozen=True)
class TreeHead:
    """One stream's signed tree head, taken from a signed statement."""

    run_id: str
    stream: int
    size: int
    root: str
    key_fingerprint: str
    created_ns: int


@dataclass
class ProofCheck:
    """What checking a proof document found: ``problems`` empty means it holds."""

    kind: str
    problems: list[str]
    heads: list[TreeHead]
    event: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def signed_tree_head(
    statement: Any, stream: int, keys: KeyRing, problems: list[str], what: str
) -> TreeHead | None:
    """The tree head of ``stream`` in a signed statement, its signature checked (else a problem)."""
    if not isinstance(statement, dict):
        problems.append(f"{what} is not a JSON object")
        return None
    if statement.get("format") == CHECKPOINT_FORMAT:
        if set(statement) != _CHECKPOINT_FIELDS:
            problems.append(f"{what} is not a well-formed auditlog-checkpoint-v2 statement")
            return None
        fields = {k: v for k, v in statement.items() if k != "signature"}
        wrong = _checkpoint_problem(statement)
        if wrong is not None:
            problems.append(
                f"{what} is not a well-formed auditlog-checkpoint-v2 statement ({wrong})"
            )
            return None
        verdict = keys.check(
            fields["key_fingerprint"], canonical_statement(fields), statement["signature"]
        )
        head = TreeHead(
            str(fields["run_id"]),
            fields["stream"],
            fields["seq"],
            fields["tree_root"],
            fields["key_fingerprint"],
            fields["created_ns"],
        )
    elif statement.get("format") == HEAD_FORMAT:
        try:
            parsed = HeadStatement.from_object(statement, what)
        except StatementError as exc:
            problems.append(str(exc))
            return None
        entry = next((h for h in parsed.heads if h.stream == stream), None)
        if entry is None or entry.tree_root is None:
            problems.append(f"{what} has no tree head of stream {stream}")
            return None
        verdict = keys.check(parsed.key_fingerprint, parsed.message(), parsed.signature)
        head = TreeHead(
            parsed.run_id,
            stream,
            entry.seq,
            entry.tree_root,
            parsed.key_fingerprint,
            parsed.created_ns,
        )
    else:
        problems.append(f"{what} is not a signed tree head (format {statement.get('format')!r})")
        return None
    if verdict is Verdict.UNKNOWN_KEY:
        problems.append(
            f"{what} is signed by key {head.key_fingerprint[:16]}, which is not trusted (pass --key)"
        )
    elif verdict is Verdict.INVALID:
        problems.append(
            f"{what}: signature by key {head.key_fingerprint[:16]} does not verify (edited)"
        )
    if head.stream != stream:
        problems.append(f"{what} is about stream {head.stream}, not stream {stream}")
    return head


def _hex(value: Any, pattern: re.Pattern[str] = _HEX64) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def _checkpoint_problem(statement: dict[str, Any]) -> str | None:
    """What is wrongly typed in a checkpoint-v2 statement (its fields are all there), or None.

    The signature covers the canonical JSON of the fields, and a number written
    ``0.75`` or ``true`` has its own canonical text, so a wrong type cannot carry a
    valid signature; it is refused by name all the same, before any is checked.
    """
    for name in ("stream", "seq", "created_ns", "world_size"):
        if not _int(statement[name]):
            return f"{name} must be an integer"
    for name in ("store_id", "run_id"):
        if not isinstance(statement[name], str):
            return f"{name} must be a string"
    for name in ("head_hash", "tree_root", "key_fingerprint"):
        if not _hex(statement[name]):
            return f"{name} must be 64 lowercase hex digits"
    if not isinstance(statement["ended"], bool):
        return "ended must be true or false"
    if not _hex(statement["signature"], _HEX128):
        return "signature must be 128 lowercase hex digits"
    return None


_WANTED = {
    (str,): "a string",
    (int,): "an integer",
    (int, type(None)): "an integer or null",
    (str, type(None)): "a string or null",
}


def event_format(event: Any) -> ChainFormat | None:
    """The chain format whose canonical row has exactly the event's fields, or None."""
    if not isinstance(event, dict):
        return None
    return next((f for f in FORMATS if set(event) == set(f.columns)), None)


def event_problem(event: dict[str, Any]) -> str | None:
    """What is wrong with a proof's event (its fields are all there), or None.

    Every column has the exact type the store holds (a bool is not an
    integer: ``step`` 0.75 or ``false`` would otherwise hash like ``0`` and be
    shown as given), the stream and seq are in range, and the payload is the
    JSON text of an object within the payload limits (``core.payloadlimits``).
    """
    for name in event:
        types = _FIELD_TYPES[name]
        if type(event[name]) not in types:  # exact types, as verify checks stored columns
            return f"event.{name} must be {_WANTED[types]}, not {short(event[name])}"
    if event["stream"] < 0 or event["seq"] < 1:
        return "event.stream must be >= 0 and event.seq >= 1"
    try:
        past = limit_problem(event["payload"])
    except NotJSONError:
        past = None
    if past is not None:
        return f"event.payload {past}, past the limits the recorder writes"
    try:
        payload = json.loads(event["payload"])
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return "event.payload must be the JSON text of an object"
    return None


def _path(values: Any, problems: list[str], what: str) -> list[bytes]:
    if not isinstance(values, list) or not all(
        isinstance(v, str) and _HEX64.fullmatch(v) for v in values
    ):
        problems.append(f"{what} must be a list of 64-digit lowercase hex hashes")
        return []
    return [bytes.fromhex(v) for v in values]


# --------------------------------------------------------------------------- inclusion
def inclusion_document(
    event: dict[str, Any],
    leaf_index: int,
    tree_size: int,
    path: list[bytes],
    tree_head: dict[str, Any],
    chain: ChainFormat,
) -> dict[str, Any]:
    """The inclusion proof of ``event`` (its stored columns, in its stream's chain format
    ``chain``: a v1 event's ``snapshot`` NULL) under a signed tree head."""
    held = {**dict.fromkeys(chain.retired), **event}
    return {
        "format": INCLUSION_FORMAT,
        "event": {k: held[k] for k in chain.columns},
        "leaf_index": leaf_index,
        "tree_size": tree_size,
        "audit_path": [p.hex() for p in path],
        "tree_head": tree_head,
    }


def check_inclusion(document: Any, keys: KeyRing) -> ProofCheck:
    """Does the document prove its event is in the signed tree? (No store needed.)"""
    problems: list[str] = []
    check = ProofCheck("inclusion", problems, [])
    if not isinstance(document, dict) or document.get("format") != INCLUSION_FORMAT:
        problems.append(f"not an {INCLUSION_FORMAT} document")
        return check
    event = document.get("event")
    chain = event_format(event)
    if chain is None or not isinstance(event, dict):
        problems.append(
            "event must be an object with exactly "
            + ", ".join(EVENT_FIELDS)
            + " (recorded before chain v2: with snapshot before payload)"
        )
        return check
    wrong = event_problem(event)
    if wrong is not None:
        problems.append(wrong)
        return check
    check.event = event
    leaf = leaf_hash(canonical_row(event, chain=chain))
    index, size = document.get("leaf_index"), document.get("tree_size")
    if not _int(index) or not _int(size):
        problems.append("leaf_index and tree_size must be integers")
        return check
    if index != event["seq"] - 1:
        problems.append(
            f"leaf_index {index} is not the event's position (seq {event['seq']} is leaf {event['seq'] - 1})"
        )
    path = _path(document.get("audit_path"), problems, "audit_path")
    head = signed_tree_head(
        document.get("tree_head"), event.get("stream", -1), keys, problems, "tree_head"
    )
    if head is None:
        return check
    check.heads.append(head)
    if head.run_id != event.get("run_id"):
        problems.append(
            f"tree_head is about run {head.run_id[:12]}, the event is of run {str(event.get('run_id'))[:12]}"
        )
    if head.size != size:
        problems.append(f"tree_size {size} is not the signed tree head's size {head.size}")
    if not verify_inclusion(index, size, leaf, path, bytes.fromhex(head.root)):
        problems.append(
            "the audit path does not lead from the event to the signed tree head "
            "(the event, its position or the path was changed)"
        )
    return check


# --------------------------------------------------------------------------- consistency
def consistency_document(
    run_id: str,
    stream: int,
    old_head: dict[str, Any],
    new_head: dict[str, Any],
    old_size: int,
    new_size: int,
    proof: list[bytes],
) -> dict[str, Any]:
    return {
        "format": CONSISTENCY_FORMAT,
        "run_id": run_id,
        "stream": stream,
        "old_head": old_head,
        "new_head": new_head,
        "old_size": old_size,
        "new_size": new_size,
        "proof": [p.hex() for p in proof],
    }


def check_consistency(document: Any, keys: KeyRing) -> ProofCheck:
    """Does the document prove the new signed tree extends the old one? (No store needed.)"""
    problems: list[str] = []
    check = ProofCheck("consistency", problems, [])
    if not isinstance(document, dict) or document.get("format") != CONSISTENCY_FORMAT:
        problems.append(f"not an {CONSISTENCY_FORMAT} document")
        return check
    stream, old_size, new_size = (
        document.get("stream"),
        document.get("old_size"),
        document.get("new_size"),
    )
    if not (_int(stream) and _int(old_size) and _int(new_size)) or not isinstance(
        document.get("run_id"), str
    ):
        problems.append("stream, old_size and new_size must be integers and run_id a string")
        return check
    proof = _path(document.get("proof"), problems, "proof")
    old = signed_tree_head(document.get("old_head"), stream, keys, problems, "old_head")
    new = signed_tree_head(document.get("new_head"), stream, keys, problems, "new_head")
    if old is None or new is None:
        return check
    check.heads = [old, new]
    for head, size, what in ((old, old_size, "old"), (new, new_size, "new")):
        if head.size != size:
            problems.append(
                f"{what}_size {size} is not the {what} signed tree head's size {head.size}"
            )
        if head.run_id != document.get("run_id"):
            problems.append(f"{what}_head is about run {head.run_id[:12]}, not the document's run")
    if not verify_consistency(
        old_size, new_size, bytes.fromhex(old.root), bytes.fromhex(new.root), proof
    ):
        problems.append(
            f"the proof does not show the tree of {old_size} events is a prefix of the tree of "
            f"{new_size} (the record was rewritten, or the proof was changed)"
        )
    return check


def check_document(document: Any, keys: KeyRing) -> ProofCheck:
    """Either kind of proof, by its format."""
    if isinstance(document, dict) and document.get("format") == CONSISTENCY_FORMAT:
        return check_consistency(document, keys)
    return check_inclusion(document, keys)
