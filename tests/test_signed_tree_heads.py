"""Signed tree heads in real recordings, and stores signed before them (revision 0003, v1 checkpoints).

The recorder keeps each stream's Merkle frontier and signs ``auditlog-checkpoint-v2``
statements as it writes; an older store's ``auditlog-checkpoint-v1`` rows still
verify after ``auditlog db upgrade``. The docs' vectors are the code's.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from forgery_support import train
from helpers import REPO, invoke, tamper

import auditlog
from auditlog.core.chain import (
    FORMATS,
    ChainFormat,
    canonical_row,
    chain_hash,
    first_event_format,
    genesis_hash,
)
from auditlog.integrity.keys import fingerprint, generate_key_pair, load_private_key
from auditlog.integrity.merkle import leaf_hash, node_hash
from auditlog.integrity.statements import Checkpoint
from auditlog.integrity.verify import verify_run
from auditlog.store.eventstore import EventStore


def test_a_signed_recording_signs_tree_heads_with_its_end_and_world_size(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = generate_key_pair(tmp_path / "k" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    run_id = train(store, "r", seed=0)
    event_store = EventStore.open(str(store))
    try:
        rows = event_store.checkpoint_rows(run_id)
        report = verify_run(event_store, run_id, require_signed=True)
    finally:
        event_store.close()
    final = rows[-1]
    assert (final["format"], final["ended"], final["world_size"]) == (
        "auditlog-checkpoint-v2",
        1,
        1,
    )
    assert final["seq"] == report.tips[0].seq and final["tree_root"] == report.tips[0].tree_root
    assert report.ok and report.covered == {0: final["seq"]}


def test_a_store_signed_before_tree_heads_upgrades_and_still_verifies(
    store: Path, tmp_path: Path
) -> None:
    run_id = train(store, "old", seed=0)
    key = generate_key_pair(tmp_path / "k" / "signing_key")
    private = load_private_key(key.private_path)
    with tamper(store) as conn:
        (store_id,) = conn.execute(
            "select value from auditlog_meta where key='store_id'"
        ).fetchone()
        seq, head = conn.execute(
            "select seq, hash from events where run_id=? order by seq desc limit 1", (run_id,)
        ).fetchone()
        for column in ("world_size", "ended", "tree_root", "format"):
            conn.execute(f"alter table checkpoints drop column {column}")
        unsigned = Checkpoint(
            run_id, 0, seq, head, 123, fingerprint(private), "", format="auditlog-checkpoint-v1"
        )
        signature = private.sign(unsigned.statement(store_id)).hex()
        conn.execute(
            "insert into checkpoints (run_id, stream, seq, head_hash, created_ns, key_fingerprint, signature) "
            "values (?, 0, ?, ?, 123, ?, ?)",
            (run_id, seq, head, fingerprint(private), signature),
        )
        conn.execute("alter table events add column snapshot varchar(64)")  # dropped by 0005
        conn.execute("update alembic_version set version_num='0003'")
    refused = invoke("verify", "--store", str(store))
    assert refused.exit_code == 3 and "auditlog db upgrade" in refused.stderr
    upgraded = invoke("db", "upgrade", "--store", str(store))
    assert upgraded.exit_code == 0 and "from revision 0003 to 0005" in upgraded.stdout
    result = invoke("verify", "--store", str(store), "--key", str(key.public_path))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "1 signed checkpoint(s): intact" in result.stdout
    # a v1 checkpoint proves its chain head: a rewrite is still caught
    with tamper(store) as conn:
        conn.execute(
            "update events set payload = payload || ' ' where run_id=? and seq=3", (run_id,)
        )
    assert invoke("verify", "--store", str(store), "--key", str(key.public_path)).exit_code == 4
    with sqlite3.connect(store / "events.db") as conn:
        columns = {r[1] for r in conn.execute("pragma table_info(checkpoints)")}
    assert {"format", "tree_root", "ended", "world_size"} <= columns


@pytest.mark.parametrize("chain", FORMATS)
def test_the_documented_vectors_are_the_codes(chain: ChainFormat) -> None:
    doc = (REPO / "docs" / "integrity.md").read_text()
    run_id = "0123456789abcdef0123456789abcdef"
    first = {
        "run_id": run_id,
        "stream": 0,
        "seq": 1,
        "ts_ns": 1700000000000000000,
        "kind": "annotation",
        "step": 0,
        "module_id": None,
        "tensor_id": None,
        "payload": '{"fields":{"name":"clean-data"},"key":"dataset"}',
    }
    second = {**first, "seq": 2, "payload": '{"fields":{},"key":"second"}'}
    genesis = genesis_hash(run_id, 0, chain)
    leaves = [leaf_hash(canonical_row(r, chain=chain)) for r in (first, second)]
    for value in (
        canonical_row(first, chain=chain).decode(),
        genesis,
        chain_hash(genesis, first, chain=chain),
        leaves[0].hex(),
        leaves[1].hex(),
        node_hash(*leaves).hex(),
    ):
        assert value in doc, value
    assert first_event_format({**first, "hash": chain_hash(genesis, first, chain=chain)}) is chain


def test_verify_names_the_consistency_proof_it_checked(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = generate_key_pair(tmp_path / "k" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    run_id = train(store, "r", seed=0)
    with auditlog.open(store) as opened:
        statement = opened.run(run_id).export_head(load_private_key(key.private_path))
    head = tmp_path / "head.json"
    head.write_text(statement.to_json())
    result = invoke(
        "verify",
        "--store",
        str(store),
        "--key",
        str(key.public_path),
        "--against",
        str(head),
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    (report,) = json.loads(result.stdout)
    (line,) = report["consistency"]
    size = statement.heads[0].seq
    assert f"consistency proof from tree size {size} to {size}, 0 hashes" in line
