"""Records of chain format v1, written by the auditlog before v2, after ``auditlog db upgrade``.

The fixture (``tests/fixtures/chain_v1``, README there) was made by that older code:
a store at revision 0004 holding a signed run with snapshots and a crashed run, the
signed run's export (``auditlog-archive-v1``, with the ``snapshot`` column) and an
inclusion proof. Each test works on a copy. After the upgrade every old event must
verify, read and restore exactly as it did, edits must still be caught, and whatever
new code appends to an old stream must continue it in v1; the edges of "a stream's
format is fixed by its first event" are here too (docs/integrity.md, the hash chain).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error, file_digest, invoke, record_run, tamper
from safetensors.torch import load_file

import auditlog
from auditlog.archive.write import manifest_digest
from auditlog.core.chain import CHAIN_V1, CHAIN_V2, canonical_payload, chain_hash, chained_row
from auditlog.integrity.chaincheck import stream_format
from auditlog.integrity.keys import generate_key_pair
from auditlog.store import schema
from auditlog.store.eventstore import EventStore

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "chain_v1"
SIGNED, CRASHED = "v1-signed", "v1-crashed"
COLUMNS = ("id", "run_id", "stream", "seq", "ts_ns", "kind", "step", "module_id", "tensor_id")


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A copy of the fixture (store at revision 0004, archive, proof, public key)."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "old"))


@pytest.fixture
def upgraded(old: Path) -> Path:
    result = invoke("db", "upgrade", "--store", str(old / "store"))
    assert result.exit_code == 0, result.stderr
    return old


def _rows(store: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(store / "events.db") as conn:
        rows = conn.execute(
            f"select {', '.join(COLUMNS)}, payload, hash from events order by id"
        ).fetchall()
    conn.close()
    return rows


def _run_id(store: Path, name: str) -> str:
    with auditlog.open(store) as opened:
        return opened.run(name).run_id


def _sha(tensor: Any) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()


def _key(old: Path) -> str:
    return str(old / "key" / "signing_key.pub")


def _trust(old: Path) -> None:
    """Make the fixture's public key the default one (``verify`` without ``--key`` trusts it)."""
    default = old.parent / ".config" / "auditlog" / "signing_key.pub"
    default.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_key(old), default)


# --------------------------------------------------------------------------- the upgrade
def test_an_old_store_is_refused_until_upgraded_then_verifies_as_before(old: Path) -> None:
    store = old / "store"
    before, digest = _rows(store), file_digest(store / "events.db")
    line = assert_one_line_error(invoke("runs", "--store", str(store)), 3, "0004", "0005")
    assert f"auditlog db upgrade --store {store}" in line
    assert file_digest(store / "events.db") == digest  # refused untouched

    result = invoke("db", "upgrade", "--store", str(store))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "upgraded store from revision 0004 to 0005"
    with sqlite3.connect(store / "events.db") as conn:
        columns = [r[1] for r in conn.execute("pragma table_info(events)")]
    conn.close()
    assert tuple(columns) == tuple(c.name for c in schema.events.columns)
    assert "snapshot" not in columns
    assert _rows(store) == before  # every id, value, payload and hash as it was

    signed = invoke("verify", SIGNED, "--store", str(store), "--key", _key(old))
    assert signed.exit_code == 0, signed.stdout + signed.stderr
    assert "1 signed checkpoint(s)" in signed.stdout and "intact, signed" in signed.stdout
    _trust(old)
    everything = invoke("verify", "all", "--store", str(store), "--format", "json")
    assert everything.exit_code == 0, everything.stdout + everything.stderr
    assert [r["verdict"] for r in json.loads(everything.stdout)] == ["signed", "unsigned"]
    opened = EventStore.open(store)
    try:
        for name in (SIGNED, CRASHED):
            assert stream_format(opened, _run_id(store, name), 0) is CHAIN_V1
    finally:
        opened.close()


def test_an_upgraded_run_reads_and_restores_bitwise(upgraded: Path) -> None:
    store = upgraded / "store"
    expected = json.loads((upgraded / "expected.json").read_text())
    events = invoke("events", SIGNED, "--store", str(store), "--format", "json")
    assert events.exit_code == 0, events.stderr
    shown = json.loads(events.stdout)
    assert len(shown) == 34 and all(e["chain_ok"] for e in shown)
    assert all("snapshot" not in e for e in shown)
    tree = invoke("tree", SIGNED, "--store", str(store), "--format", "json")
    assert tree.exit_code == 0, tree.stderr
    with auditlog.open(store) as opened:
        run = opened.run(SIGNED)
        for step in (0, 2, 4, 6):
            state = run.state_dict(step=step)
            assert {
                k: [str(v.dtype).removeprefix("torch."), list(v.shape), _sha(v)]
                for k, v in state.items()
            } == expected[str(step)]
    out = upgraded / "step4.safetensors"
    restored = invoke("restore", SIGNED, "--store", str(store), "--step", "4", "-o", str(out))
    assert restored.exit_code == 0, restored.stderr
    assert {k: _sha(v) for k, v in load_file(out).items()} == {
        k: v[2] for k, v in expected["4"].items()
    }
    query = invoke(
        "query",
        "--store",
        str(store),
        "--format",
        "json",
        "select run_id, count(*) as n from events group by 1 order by 2",
    )
    assert query.exit_code == 0, query.stderr  # every copied v1 row checked in v1
    assert [r["n"] for r in json.loads(query.stdout)] == [24, 34]


def test_an_edited_old_event_is_still_caught(upgraded: Path) -> None:
    store = upgraded / "store"
    with tamper(store) as conn:
        conn.execute(
            "update events set payload = replace(payload, '\"bias\"', '\"bias2\"') "
            "where seq = 5 and run_id = (select run_id from events where payload like '%v1-signed%')"
        )
    result = invoke("verify", SIGNED, "--store", str(store))
    assert result.exit_code == 4
    assert "stream 0 seq 5" in result.stdout and "does not match its recorded hash" in result.stdout
    events = invoke("events", SIGNED, "--store", str(store), "--format", "json")
    assert events.exit_code == 4
    assert [e["seq"] for e in json.loads(events.stdout) if not e["chain_ok"]] == [5]
    assert_one_line_error(
        invoke("query", "--store", str(store), "select count(*) from events"), 4, "seq 5"
    )


def test_an_old_store_holding_a_snapshot_value_is_refused_unchanged(old: Path) -> None:
    """Crafted or foreign: the recorder never wrote one, and its hash covers it."""
    store = old / "store"
    for value in ("ab" * 32, 7):
        with tamper(store) as conn:
            conn.execute("update events set snapshot = ? where id = 9", (value,))
        digest = file_digest(store / "events.db")
        line = assert_one_line_error(
            invoke("db", "upgrade", "--store", str(store)), 3, "event id 9", "left unchanged"
        )
        assert f"cannot upgrade store {str(store)!r}" in line and "snapshot" in line
        assert file_digest(store / "events.db") == digest
        assert (
            not (store / "events.db-wal").exists() or (store / "events.db-wal").stat().st_size == 0
        )


def test_a_refused_upgrade_of_several_revisions_changes_nothing(old: Path) -> None:
    """0003 -> 0004 -> 0005 in one upgrade: 0005 refuses, and 0004's columns are not left behind."""
    store = old / "store"
    with tamper(store) as conn:
        for column in ("world_size", "ended", "tree_root", "format"):
            conn.execute(f"alter table checkpoints drop column {column}")
        conn.execute("update alembic_version set version_num = '0003'")
        conn.execute("update events set snapshot = 'x' where id = 3")
    digest = file_digest(store / "events.db")
    assert_one_line_error(invoke("db", "upgrade", "--store", str(store)), 3, "event id 3")
    assert file_digest(store / "events.db") == digest
    with sqlite3.connect(store / "events.db") as conn:
        assert conn.execute("select version_num from alembic_version").fetchone() == ("0003",)
        assert "format" not in {r[1] for r in conn.execute("pragma table_info(checkpoints)")}
    conn.close()


# --------------------------------------------------------------------------- new code, old streams
def test_new_code_closes_a_crashed_v1_stream_in_v1_and_signs_it(
    upgraded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = upgraded / "store"
    crashed = _run_id(store, CRASHED)
    with auditlog.open(store) as opened:
        host = opened.run(CRASHED).events(kinds=["run_started"]).__next__()["payload"]["host"]
    from auditlog.recording import crashes

    monkeypatch.setattr(crashes.socket, "gethostname", lambda: host)  # the fixture's machine
    monkeypatch.setattr(crashes, "process_alive", lambda pid, start: False)
    key = generate_key_pair(tmp_path / "k" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    new = record_run(store, steps=2)

    opened = EventStore.open(store)
    try:
        rows = list(opened.iter_events(crashed, stream=0))
        assert stream_format(opened, crashed, 0) is CHAIN_V1
        assert stream_format(opened, new, 0) is CHAIN_V2
    finally:
        opened.close()
    end = rows[-1]
    assert end["kind"] == "run_ended" and json.loads(end["payload"])["status"] == "crashed"
    assert chain_hash(rows[-2]["hash"], end, chain=CHAIN_V1) == end["hash"]
    result = invoke("verify", CRASHED, "--store", str(store), "--key", str(key.public_path))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "intact, signed" in result.stdout  # the closing recording signed the v1 end
    every = invoke(
        "verify",
        "all",
        "--store",
        str(store),
        "--key",
        _key(upgraded),
        "--key",
        str(key.public_path),
    )
    assert every.exit_code == 0, every.stdout
    assert every.stdout.count("intact, signed") == 3


def test_a_v2_event_appended_to_a_v1_stream_fails_naming_it(upgraded: Path) -> None:
    """Formats never mix in a stream: an event linked correctly, but in v2, is an edit."""
    store = upgraded / "store"
    crashed = _run_id(store, CRASHED)
    opened = EventStore.open(store)
    try:
        seq, head = opened.chain_head(crashed, 0) or (0, "")
        payload = canonical_payload({"key": "late", "fields": {}})
        row, _ = chained_row(head, crashed, 0, seq + 1, 1, "annotation", 3, None, None, payload)
        opened.add_events([row])
    finally:
        opened.close()
    result = invoke("verify", CRASHED, "--store", str(store))
    assert result.exit_code == 4
    assert f"stream 0 seq {seq + 1} (event id" in result.stdout
    assert (
        "event is hashed in chain format auditlog-chain-v2, but its stream is in "
        "auditlog-chain-v1, fixed by its first event"
    ) in result.stdout
    events = invoke("events", CRASHED, "--store", str(store), "--format", "json")
    assert [e["seq"] for e in json.loads(events.stdout) if not e["chain_ok"]] == [seq + 1]
    assert_one_line_error(
        invoke("query", "--store", str(store), "select count(*) from events"), 4, f"seq {seq + 1}"
    )


def test_a_resumed_v1_run_gets_v2_streams_beside_its_v1_ones(upgraded: Path) -> None:
    """A new segment of an old run is a new stream: v2, each stream in its own format, in
    the store and in the export."""
    store = upgraded / "store"
    run_id = _run_id(store, SIGNED)
    _trust(upgraded)
    assert record_run(store, steps=2, run_id=run_id) == run_id
    result = invoke("verify", run_id, "--store", str(store), "--format", "json")
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)[0]["events"] > 34
    opened = EventStore.open(store)
    try:
        assert {s: stream_format(opened, run_id, s) for s in opened.streams(run_id)} == {
            0: CHAIN_V1,
            1000000: CHAIN_V2,
        }
    finally:
        opened.close()
    archive = upgraded / "mixed"
    exported = invoke("export", run_id, "--store", str(store), "--to", str(archive))
    assert exported.exit_code == 0, exported.stderr
    manifest = json.loads((archive / "manifest.json").read_text())
    assert manifest["format"] == "auditlog-archive-v2"
    assert {s["stream"]: s["chain"] for s in manifest["streams"]} == {
        0: "auditlog-chain-v1",
        1000000: "auditlog-chain-v2",
    }
    checked = invoke("verify", "--archive", str(archive), "--key", _key(upgraded))
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert "intact" in checked.stdout


def test_v1_streams_combine_as_they_are(upgraded: Path, tmp_path: Path) -> None:
    """An old store (upgraded) as a shard: its v1 streams are copied with their hashes and
    verify in the target; the crashed stream, closed later in v1, adds its one event."""
    from auditlog.recording.combine import combine
    from auditlog.recording.crashes import close_crashed_runs

    _trust(upgraded)
    shard, target = upgraded / "store", tmp_path / "target"
    first = combine(str(target), [shard])
    assert first.ok and first.events_added == 58, first.shards[0]
    crashed = _run_id(shard, CRASHED)
    opened = EventStore.open(shard)
    try:
        from auditlog.recording import crashes

        host = json.loads((opened.first_event(crashed, 0) or {})["payload"])["host"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(crashes.socket, "gethostname", lambda: host)
            patch.setattr(crashes, "process_alive", lambda pid, start: False)
            assert close_crashed_runs(opened, "later") == [crashed]
    finally:
        opened.close()
    again = combine(str(target), [shard])
    assert again.ok and again.events_added == 1
    # the signed run's checkpoint stays behind (its signature names the shard's store id)
    result = invoke("verify", "all", "--store", str(target))
    assert result.exit_code == 0, result.stdout
    assert result.stdout.count("intact, unsigned") == 2
    opened = EventStore.open(target)
    try:
        assert stream_format(opened, crashed, 0) is CHAIN_V1
    finally:
        opened.close()


def test_an_old_exported_head_and_a_new_attestation_hold(upgraded: Path, tmp_path: Path) -> None:
    """The head the older code exported (the archive's heads.json) still proves the upgraded
    record (RFC 9162 consistency over v1 leaves); a v1 run can be attested and checked."""
    store = upgraded / "store"
    against = invoke(
        "verify",
        SIGNED,
        "--store",
        str(store),
        "--key",
        _key(upgraded),
        "--against",
        str(upgraded / "archive" / "heads.json"),
        "--format",
        "json",
    )
    assert against.exit_code == 0, against.stdout + against.stderr
    assert json.loads(against.stdout)[0]["verdict"] == "signed-against-head"
    key = generate_key_pair(tmp_path / "k" / "signing_key")
    model = tmp_path / "model.safetensors"
    restored = invoke("restore", CRASHED, "--store", str(store), "--step", "2", "-o", str(model))
    assert restored.exit_code == 0, restored.stderr
    envelope = tmp_path / "model.intoto.json"
    attested = invoke(
        "attest",
        CRASHED,
        "--store",
        str(store),
        "--step",
        "2",
        "--model",
        str(model),
        "--key",
        str(key.private_path),
        "-o",
        str(envelope),
    )
    assert attested.exit_code == 0, attested.stderr
    checked = invoke(
        "verify-attestation",
        str(envelope),
        "--key",
        str(key.public_path),
        "--model",
        str(model),
        "--store",
        str(store),
    )
    assert checked.exit_code == 0, checked.stdout + checked.stderr


# --------------------------------------------------------------------------- archives and proofs
def test_the_v1_archive_still_verifies(old: Path) -> None:
    archive = old / "archive"
    assert json.loads((archive / "manifest.json").read_text())["format"] == "auditlog-archive-v1"
    result = invoke("verify", "--archive", str(archive), "--key", _key(old))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "3 signature(s): intact" in result.stdout  # manifest, heads and the v2 checkpoint


def _rewrite_manifest(archive: Path, edit: Any) -> None:
    """What a forger without the key can do: edit the manifest, recompute its digest, drop
    its signature (then the run reads as unsigned)."""
    manifest = json.loads((archive / "manifest.json").read_text())
    edit(manifest)
    manifest["digest"] = manifest_digest(manifest)
    (archive / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (archive / "manifest.sig").unlink(missing_ok=True)


def test_an_archive_cannot_be_read_in_another_format(old: Path, upgraded: Path) -> None:
    """A v1 archive's stream declared v2, and a v2 archive's events given a ``snapshot``
    column with a value: both refused, whatever the manifest and digests say."""
    archive = old / "archive"

    def declare_v2(manifest: dict[str, Any]) -> None:
        manifest["chain"] = "auditlog-chain-v2"

    _rewrite_manifest(archive, declare_v2)
    result = invoke("verify", "--archive", str(archive))
    assert result.exit_code == 4 and "is not one the archive format has" in result.stdout

    store = upgraded / "store"
    fresh = upgraded / "v2"
    assert invoke("export", SIGNED, "--store", str(store), "--to", str(fresh)).exit_code == 0
    part = next((fresh / "events").rglob("*.parquet"))
    table = pq.read_table(part)
    forged = table.add_column(
        table.schema.get_field_index("payload"),
        "snapshot",
        pa.array(["ab" * 32] * table.num_rows, pa.string()),
    )
    pq.write_table(forged, part)

    def relist(manifest: dict[str, Any]) -> None:
        for entry in manifest["files"]:
            if fresh / entry["path"] == part:
                entry["sha256"], entry["bytes"] = file_digest(part), part.stat().st_size

    _rewrite_manifest(fresh, relist)
    result = invoke("verify", "--archive", str(fresh))
    assert result.exit_code == 4
    assert "are not the archive format's (file crafted)" in result.stdout


def test_a_proof_made_before_chain_v2_still_holds(upgraded: Path) -> None:
    proof = upgraded / "proof.json"
    document = json.loads(proof.read_text())
    assert document["event"]["snapshot"] is None  # made by the older code
    result = invoke("verify-proof", str(proof), "--key", _key(upgraded))
    assert result.exit_code == 0, result.stdout + result.stderr
    # the same proof made now, from the upgraded store: the same document but its time
    made = upgraded / "again.json"
    again = invoke(
        "prove", SIGNED, "--store", str(upgraded / "store"), "--seq", "5", "-o", str(made)
    )
    assert again.exit_code == 0, again.stderr
    assert json.loads(made.read_text())["event"] == document["event"]
    assert json.loads(made.read_text())["audit_path"] == document["audit_path"]
    # the event read in the other format (snapshot dropped, or given a value) does not hold
    for event in (
        {k: v for k, v in document["event"].items() if k != "snapshot"},
        {**document["event"], "snapshot": "ab" * 32},
    ):
        forged = upgraded / "forged.json"
        forged.write_text(json.dumps({**document, "event": event}))
        result = invoke("verify-proof", str(forged), "--key", _key(upgraded))
        assert result.exit_code == 4, result.stdout
        assert (
            "does not lead from the event to the signed tree head" in result.stdout + result.stderr
        )


# --------------------------------------------------------------------------- forgeries
def test_a_v1_run_rewritten_in_v2_fails_against_its_signature(upgraded: Path) -> None:
    """A forger without the key may rechain a whole stream in the other format: that is a
    rewrite (every hash, the genesis too), and the signed checkpoint no longer holds."""
    store = upgraded / "store"
    run_id = _run_id(store, SIGNED)
    with tamper(store) as conn:
        rows = conn.execute(
            f"select id, {', '.join(COLUMNS[1:])}, payload from events where run_id = ? "
            "order by seq",
            (run_id,),
        ).fetchall()
        prev = CHAIN_V2.genesis(run_id, 0)
        for row in rows:
            fields = dict(zip((*COLUMNS, "payload"), row, strict=True))
            prev = chain_hash(prev, fields, chain=CHAIN_V2)
            conn.execute("update events set hash = ? where id = ?", (prev, fields["id"]))
    opened = EventStore.open(store)
    try:
        assert stream_format(opened, run_id, 0) is CHAIN_V2  # what its first event now says
    finally:
        opened.close()
    result = invoke("verify", SIGNED, "--store", str(store), "--key", _key(upgraded))
    assert result.exit_code == 4
    assert "stream 0 seq 34 (checkpoint 1): signed head does not match the chain" in result.stdout


def test_a_column_added_to_the_table_is_no_part_of_the_record(upgraded: Path) -> None:
    """``snapshot`` put back into an upgraded table with values: no reader selects it, so it
    changes no verdict and shows nowhere (the hashed rows are the record)."""
    store = upgraded / "store"
    with tamper(store) as conn:
        conn.execute("alter table events add column snapshot varchar(64)")
        conn.execute("update events set snapshot = 'forged'")
    result = invoke("verify", SIGNED, "--store", str(store), "--key", _key(upgraded))
    assert result.exit_code == 0, result.stdout
    events = invoke("events", SIGNED, "--store", str(store), "--format", "json")
    assert events.exit_code == 0 and "forged" not in events.stdout
    query = invoke("query", "--store", str(store), "--format", "json", "select * from events")
    assert query.exit_code == 0 and "forged" not in query.stdout
