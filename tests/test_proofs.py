"""``auditlog prove`` / ``auditlog verify-proof``: one event shown without the store, and a log's growth.

The proof is checked after the store is deleted: the document and the public
key are all an auditor holds. Changing any byte of the event, the audit path or
the signed tree head fails it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from forgery_support import train
from helpers import invoke, tamper
from integrity_support import rewrite_chain
from torch import nn

import auditlog
from auditlog.integrity.checkpoints import checkpoint_head
from auditlog.integrity.keys import KeyPair, generate_key_pair, load_private_key


@pytest.fixture
def signed(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str, KeyPair]:
    key = generate_key_pair(tmp_path / "keys" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    return store, train(store, "r1", seed=0), key


def annotation_seq(store: Path, run_id: str) -> int:
    with auditlog.open(store) as opened:
        (event,) = opened.run(run_id).events(kinds=["annotation"])
    return int(event["seq"])


def verify_proof(path: Path, key: KeyPair) -> Any:
    return invoke("verify-proof", "--key", str(key.public_path), str(path))


def test_an_inclusion_proof_verifies_without_the_store(
    signed: tuple[Path, str, KeyPair], tmp_path: Path
) -> None:
    store, run_id, key = signed
    seq = annotation_seq(store, run_id)
    proof = tmp_path / "proof.json"
    made = invoke("prove", "--store", str(store), run_id, "--seq", str(seq), "-o", str(proof))
    assert made.exit_code == 0, made.stderr
    document = json.loads(proof.read_text())
    assert document["format"] == "auditlog-inclusion-proof-v1"
    assert document["leaf_index"] == seq - 1 and document["event"]["kind"] == "annotation"
    assert "snapshot" not in document["event"]  # chain v2
    assert (
        document["tree_head"]["format"] == "auditlog-checkpoint-v2"
        and document["tree_head"]["ended"] is True
    )
    assert len(document["audit_path"]) >= 4  # about log2 of the run's events
    shutil.rmtree(store)
    result = verify_proof(proof, key)
    assert result.exit_code == 0, result.stderr
    assert (
        f"event seq {seq} is leaf {seq - 1} of the tree of {document['tree_size']} events"
        in result.stdout
    )
    assert '"clean-data"' in result.stdout  # the event itself is shown
    # an existing proof is never overwritten
    again = invoke("prove", "--store", str(store), run_id, "--seq", "1", "-o", str(proof))
    assert again.exit_code != 0


def _edits(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        copy = json.loads(json.dumps(document))
        target = copy
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value(target[path[-1]])
        return copy

    flip = lambda h: ("0" if h[0] != "0" else "1") + h[1:]  # noqa: E731
    return [
        (
            "event payload",
            changed(("event", "payload"), lambda p: p.replace("clean-data", "FORGED-data")),
        ),
        ("event step", changed(("event", "step"), lambda s: s + 1)),
        ("event seq", changed(("event", "seq"), lambda s: s + 1)),
        ("event kind", changed(("event", "kind"), lambda k: "recorder_error")),
        ("leaf index", changed(("leaf_index",), lambda i: i + 1)),
        ("tree size", changed(("tree_size",), lambda n: n + 1)),
        ("audit path hash", changed(("audit_path", 0), flip)),
        ("audit path cut", changed(("audit_path",), lambda p: p[:-1])),
        ("tree root", changed(("tree_head", "tree_root"), flip)),
        ("tree head seq", changed(("tree_head", "seq"), lambda s: s + 1)),
        ("tree head signature", changed(("tree_head", "signature"), flip)),
        ("tree head run", changed(("tree_head", "run_id"), lambda r: "f" * 32)),
        # a chain-v2 event given v1's field (a v1 canonical row is other bytes, whatever it holds)
        ("event read as v1", {**document, "event": {**document["event"], "snapshot": None}}),
        (
            "event with a snapshot",
            {**document, "event": {**document["event"], "snapshot": "a" * 64}},
        ),
    ]


def test_changing_any_part_of_an_inclusion_proof_fails_it(
    signed: tuple[Path, str, KeyPair], tmp_path: Path
) -> None:
    store, run_id, key = signed
    proof = tmp_path / "proof.json"
    assert (
        invoke(
            "prove",
            "--store",
            str(store),
            run_id,
            "--seq",
            str(annotation_seq(store, run_id)),
            "-o",
            str(proof),
        ).exit_code
        == 0
    )
    for name, edited in _edits(json.loads(proof.read_text())):
        target = tmp_path / f"{name.replace(' ', '_')}.json"
        target.write_text(json.dumps(edited))
        result = verify_proof(target, key)
        assert result.exit_code == 4, (name, result.stdout, result.stderr)
        assert result.stderr.startswith(f"Error: proof {str(target)!r} does not hold: "), (
            result.stderr
        )
    other = generate_key_pair(tmp_path / "other")
    untrusted = verify_proof(proof, other)
    assert untrusted.exit_code == 4 and "not trusted" in untrusted.stderr


def test_an_unsigned_run_cannot_be_proven(store: Path, tmp_path: Path) -> None:
    run_id = train(store, "unsigned", seed=0)
    result = invoke(
        "prove", "--store", str(store), run_id, "--seq", "2", "-o", str(tmp_path / "p.json")
    )
    assert (
        result.exit_code == 1
        and "no signed tree head" in result.stderr
        and "auditlog checkpoint" in result.stderr
    )


def test_a_proof_is_not_made_for_an_altered_record(
    signed: tuple[Path, str, KeyPair], tmp_path: Path
) -> None:
    store, run_id, _key = signed
    rewrite_chain(store, run_id, 3)
    result = invoke(
        "prove", "--store", str(store), run_id, "--seq", "2", "-o", str(tmp_path / "p.json")
    )
    assert result.exit_code == 4 and "no longer matches its signed tree head" in result.stderr


def test_a_consistency_proof_from_a_mid_run_head(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = generate_key_pair(tmp_path / "keys" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    mid = tmp_path / "mid.json"
    with auditlog.record(store=store) as run:
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
            if step == 1:
                run.flush()
                with auditlog.open(store) as opened:
                    mid.write_text(
                        opened.run(str(run.run_id))
                        .export_head(load_private_key(key.private_path))
                        .to_json()
                    )
    proof = tmp_path / "consistency.json"
    made = invoke("prove", "--store", str(store), "--consistency-from", str(mid), "-o", str(proof))
    assert made.exit_code == 0, made.stderr
    document = json.loads(proof.read_text())
    assert (
        document["old_size"]
        == json.loads(mid.read_text())["heads"][0]["seq"]
        < document["new_size"]
    )
    shutil.rmtree(store)
    result = verify_proof(proof, key)
    assert result.exit_code == 0, result.stderr
    assert f"extends the tree of {document['old_size']} events" in result.stdout
    for part in ("proof", "old_size"):
        edited = json.loads(proof.read_text())
        edited[part] = edited[part][1:] if part == "proof" else edited[part] - 1
        bad = tmp_path / f"bad_{part}.json"
        bad.write_text(json.dumps(edited))
        assert verify_proof(bad, key).exit_code == 4, part


def test_no_consistency_proof_for_a_rewritten_record(
    signed: tuple[Path, str, KeyPair], tmp_path: Path
) -> None:
    store, run_id, key = signed
    head = tmp_path / "head.json"
    assert (
        invoke(
            "export-head", "--store", str(store), "--key", str(key.private_path), "-o", str(head)
        ).exit_code
        == 0
    )
    with tamper(store) as conn:
        conn.execute("delete from checkpoints")
    rewrite_chain(store, run_id, 4)
    # the rewritten chain is internally consistent, but the run was recorded for signing and
    # has lost its signatures: `checkpoint` refuses to launder it (issue 29)
    refused = invoke("checkpoint", "--store", str(store), "--key", str(key.private_path))
    assert refused.exit_code == 4 and "recorded for signing" in refused.stderr, refused.stderr
    # signed anyway (the recorder's own signing path does not judge): no consistency proof
    with auditlog.open(store) as opened:
        checkpoint_head(opened.event_store, load_private_key(key.private_path), run_id, 0)
    result = invoke(
        "prove",
        "--store",
        str(store),
        "--consistency-from",
        str(head),
        "-o",
        str(tmp_path / "c.json"),
    )
    assert result.exit_code == 4, result.stderr
    assert "no longer matches the old signed tree head" in result.stderr
