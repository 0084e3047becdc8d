"""``auditlog.integrity.statements``: what exactly is signed, and that changing any of it breaks the signature.

The signed bytes are documented (README, module docstring) so that a third
party can check a statement without auditlog; the first tests pin them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auditlog.integrity.keys import KeyRing, Verdict, fingerprint
from auditlog.integrity.statements import (
    Checkpoint,
    HeadStatement,
    StatementError,
    StreamHead,
    canonical_statement,
    sign_heads,
)
from auditlog.integrity.statements import sign_head as _sign_head

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
RING = KeyRing([KEY.public_key()])
H1, H2, R1 = "a" * 64, "b" * 64, "c" * 64


def sign_head(
    key: Ed25519PrivateKey,
    store: str,
    run: str,
    stream: int,
    seq: int,
    head: str,
    created_ns: int | None = None,
) -> Checkpoint:
    return _sign_head(
        key, store, run, stream, seq, head, created_ns, tree_root=R1, ended=False, world_size=2
    )


def test_checkpoint_statement_bytes_are_the_documented_canonical_json() -> None:
    cp = _sign_head(
        KEY, "store1", "run1", 0, 42, H1, created_ns=123, tree_root=R1, ended=True, world_size=1
    )
    expected = (
        '{"created_ns":123,"ended":true,"format":"auditlog-checkpoint-v2","head_hash":"' + H1 + '",'
        '"key_fingerprint":"' + fingerprint(KEY) + '","run_id":"run1","seq":42,'
        '"store_id":"store1","stream":0,"tree_root":"' + R1 + '","world_size":1}'
    ).encode()
    assert cp.statement("store1") == expected
    # a third party checks it with nothing but the public key and those bytes
    KEY.public_key().verify(bytes.fromhex(cp.signature), expected)
    assert cp.key_fingerprint == fingerprint(KEY)
    assert len(cp.signature) == 128


def test_canonical_statement_is_sorted_compact_ascii() -> None:
    assert (
        canonical_statement({"b": 1, "a": "é", "c": [1, 2]}) == b'{"a":"\\u00e9","b":1,"c":[1,2]}'
    )


def test_checkpoint_signature_verifies_with_the_right_key_and_store() -> None:
    cp = sign_head(KEY, "store1", "run1", 3, 42, H1)
    assert RING.check(cp.key_fingerprint, cp.statement("store1"), cp.signature) is Verdict.VALID
    # the same row in another store (a different store_id) does not verify
    assert RING.check(cp.key_fingerprint, cp.statement("store2"), cp.signature) is Verdict.INVALID
    # a key nobody trusts is reported as such, not as valid
    assert (
        KeyRing([OTHER.public_key()]).check(
            cp.key_fingerprint, cp.statement("store1"), cp.signature
        )
        is Verdict.UNKNOWN_KEY
    )
    assert (
        KeyRing().check(cp.key_fingerprint, cp.statement("store1"), cp.signature)
        is Verdict.UNKNOWN_KEY
    )


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "run2"},
        {"stream": 4},
        {"seq": 43},
        {"head_hash": H2},
        {"created_ns": 1},
        {"tree_root": H2},
        {"ended": True},
        {"world_size": 3},
        {"signature": "00" * 64},
        {"signature": "zz"},
        {"signature": ""},
    ],
    ids=lambda c: next(iter(c)) + "=" + str(next(iter(c.values())))[:8],
)
def test_changing_any_checkpoint_field_breaks_the_signature(change: dict[str, Any]) -> None:
    cp = replace(sign_head(KEY, "s", "run1", 3, 42, H1), **change)
    assert RING.check(cp.key_fingerprint, cp.statement("s"), cp.signature) is Verdict.INVALID


def test_claiming_another_key_fingerprint_is_caught() -> None:
    cp = sign_head(OTHER, "s", "run1", 0, 42, H1)
    forged = replace(cp, key_fingerprint=fingerprint(KEY))  # pretend the trusted key signed it
    assert (
        RING.check(forged.key_fingerprint, forged.statement("s"), forged.signature)
        is Verdict.INVALID
    )


def test_checkpoint_from_row_rejects_garbled_values() -> None:
    good = {**sign_head(KEY, "s", "r", 0, 1, H1).as_row(), "id": 7}
    cp = Checkpoint.from_row(good)
    assert cp.id == 7 and cp.seq == 1
    for column, value in [
        ("seq", "abc"),
        ("stream", 1.5),
        ("created_ns", None),
        ("head_hash", b"\x00"),
        ("tree_root", "xyz"),
        ("ended", 2),
        ("world_size", 0),
        ("format", "v9"),
    ]:
        with pytest.raises(ValueError, match=column):
            Checkpoint.from_row({**good, column: value})


def test_v1_checkpoint_rows_of_older_stores_still_verify() -> None:
    """A row written before signed tree heads (format NULL) is an auditlog-checkpoint-v1 statement."""
    unsigned = Checkpoint(
        "run1", 0, 42, H1, 123, fingerprint(KEY), "", format="auditlog-checkpoint-v1"
    )
    expected = (
        '{"created_ns":123,"format":"auditlog-checkpoint-v1","head_hash":"' + H1 + '",'
        '"key_fingerprint":"' + fingerprint(KEY) + '","run_id":"run1","seq":42,'
        '"store_id":"store1","stream":0}'
    ).encode()
    assert unsigned.statement("store1") == expected
    row = {**unsigned.as_row(), "signature": KEY.sign(expected).hex(), "format": None}
    assert "tree_root" not in unsigned.as_row()
    cp = Checkpoint.from_row(row)
    assert not cp.is_tree_head
    assert RING.check(cp.key_fingerprint, cp.statement("store1"), cp.signature) is Verdict.VALID


# --------------------------------------------------------------------------- head statements
def statement() -> HeadStatement:
    return sign_heads(
        KEY,
        "store1",
        "run1",
        [StreamHead(1, 9, H2, R1, True), StreamHead(0, 42, H1, R1, False)],
        created_ns=5,
        world_size=2,
    )


def test_head_statement_round_trips_and_verifies() -> None:
    st = statement()
    assert [h.stream for h in st.heads] == [0, 1]  # sorted by stream
    text = st.to_json()
    data = json.loads(text)
    assert data["format"] == "auditlog-head-v2"
    assert data["world_size"] == 2
    assert data["heads"] == [
        {"stream": 0, "seq": 42, "head_hash": H1, "tree_root": R1, "ended": False},
        {"stream": 1, "seq": 9, "head_hash": H2, "tree_root": R1, "ended": True},
    ]
    assert not st.complete  # stream 0 had not ended
    parsed = HeadStatement.parse(text, "f.json")
    assert parsed == st
    assert RING.check(parsed.key_fingerprint, parsed.message(), parsed.signature) is Verdict.VALID
    # documented: the signature covers the canonical JSON of the object without "signature"
    unsigned = {k: v for k, v in data.items() if k != "signature"}
    KEY.public_key().verify(bytes.fromhex(data["signature"]), canonical_statement(unsigned))


def test_v1_head_statements_still_parse_and_verify() -> None:
    unsigned = {
        "format": "auditlog-head-v1",
        "store_id": "s",
        "run_id": "r",
        "created_ns": 1,
        "heads": [{"stream": 0, "seq": 3, "head_hash": H1}],
        "key_fingerprint": fingerprint(KEY),
    }
    text = json.dumps({**unsigned, "signature": KEY.sign(canonical_statement(unsigned)).hex()})
    parsed = HeadStatement.parse(text, "old.json")
    assert not parsed.is_tree_head and not parsed.complete
    assert RING.check(parsed.key_fingerprint, parsed.message(), parsed.signature) is Verdict.VALID


@pytest.mark.parametrize(
    "path, value",
    [
        (("run_id",), "run2"),
        (("store_id",), "store2"),
        (("created_ns",), 6),
        (("heads", 0, "seq"), 41),
        (("heads", 0, "head_hash"), H2),
        (("heads", 1, "stream"), 2),
        (("heads", 0, "tree_root"), H2),
        (("heads", 0, "ended"), True),
        (("world_size",), 3),
    ],
    ids=lambda v: str(v),
)
def test_editing_any_field_of_a_statement_breaks_its_signature(
    path: tuple[Any, ...], value: Any
) -> None:
    data = json.loads(statement().to_json())
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    edited = HeadStatement.parse(json.dumps(data), "f.json")
    assert RING.check(edited.key_fingerprint, edited.message(), edited.signature) is Verdict.INVALID


def test_dropping_a_stream_from_a_statement_breaks_its_signature() -> None:
    data = json.loads(statement().to_json())
    data["heads"] = data["heads"][:1]
    edited = HeadStatement.parse(json.dumps(data), "f.json")
    assert RING.check(edited.key_fingerprint, edited.message(), edited.signature) is Verdict.INVALID


HEAD = {"stream": 0, "seq": 1, "head_hash": H1, "tree_root": R1, "ended": False}


def _mutations() -> list[tuple[str, str, str]]:
    good = json.loads(statement().to_json())

    def edit(**changes: Any) -> str:
        return json.dumps({**good, **changes})

    return [
        ("not json", "{nope", "not JSON"),
        ("a list", "[1, 2]", "not a JSON object"),
        ("other format", edit(format="auditlog-head-v9"), "format 'auditlog-head-v9'"),
        ("extra field", edit(comment="hi"), "comment"),
        (
            "missing field",
            json.dumps({k: v for k, v in good.items() if k != "store_id"}),
            "store_id",
        ),
        ("run_id number", edit(run_id=5), "run_id"),
        ("created_ns text", edit(created_ns="5"), "created_ns"),
        ("created_ns bool", edit(created_ns=True), "created_ns"),
        ("short signature", edit(signature="ab"), "signature"),
        ("upper fingerprint", edit(key_fingerprint="A" * 64), "key_fingerprint"),
        ("no heads", edit(heads=[]), "heads"),
        ("head not object", edit(heads=[1]), "each head"),
        ("negative stream", edit(heads=[{**HEAD, "stream": -1}]), "stream"),
        ("seq zero", edit(heads=[{**HEAD, "seq": 0}]), "seq"),
        ("bad head hash", edit(heads=[{**HEAD, "head_hash": "xyz"}]), "head_hash"),
        ("bad tree root", edit(heads=[{**HEAD, "tree_root": "xyz"}]), "tree_root"),
        ("ended text", edit(heads=[{**HEAD, "ended": "yes"}]), "ended"),
        ("no tree root", edit(heads=[{"stream": 0, "seq": 1, "head_hash": H1}]), "each head"),
        ("world size zero", edit(world_size=0), "world_size"),
        ("duplicate stream", edit(heads=[HEAD, {**HEAD, "seq": 2}]), "twice"),
    ]


@pytest.mark.parametrize("name, text, words", _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_statements_are_refused_with_a_reason(name: str, text: str, words: str) -> None:
    with pytest.raises(StatementError) as info:
        HeadStatement.parse(text, "head.json")
    message = str(info.value)
    assert "'head.json'" in message and words in message
    assert "\n" not in message
