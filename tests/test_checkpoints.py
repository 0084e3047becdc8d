"""Signed checkpoints and exported heads against real attacks on a real store.

A bare hash chain cannot see its newest events cut off, nor the whole chain
rewritten with recomputed hashes. These tests record a real run, sign its head
(stored checkpoints, ``auditlog checkpoint``; exported statements,
``auditlog export-head``), attack ``events.db`` with plain ``sqlite3`` and check
what ``auditlog verify`` (with and without ``--against``) says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from auditlog.cli.main import cli as app
from click.testing import CliRunner
from helpers import CliResult, file_digest, invoke
from integrity_support import isolate_keys, last_seq, record_run, rewrite_chain, tamper, truncate

from auditlog.core.chain import canonical_payload, chain_hash
from auditlog.integrity.checkpoints import checkpoint_head, checkpoints_for
from auditlog.integrity.findings import StreamTip
from auditlog.integrity.keys import (
    KeyRing,
    Verdict,
    fingerprint,
    generate_key_pair,
    load_private_key,
    load_public_key,
)
from auditlog.integrity.verify import verify_run
from auditlog.store.eventstore import EventStore


@pytest.fixture(autouse=True)
def config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    return isolate_keys(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One recorded run, made once per module; tests work on copies."""
    path = tmp_path_factory.mktemp("pristine") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path.parent)
        run_id = record_run(path)
    with tamper(path):  # fold the WAL back so copies are self-contained
        pass
    return path, run_id


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two key pairs: ours (the team's) and someone else's."""
    root = tmp_path_factory.mktemp("keys")
    return generate_key_pair(root / "ours").private_path, generate_key_pair(
        root / "theirs"
    ).private_path


@pytest.fixture
def ours(keys: tuple[Path, Path]) -> Path:
    return keys[0]


@pytest.fixture
def theirs(keys: tuple[Path, Path]) -> Path:
    return keys[1]


def pub(private: Path) -> str:
    return str(private) + ".pub"


@pytest.fixture
def run_id(pristine: tuple[Path, str], store: Path) -> str:
    shutil.copytree(pristine[0], store)
    return pristine[1]


def cli(*args: str, store: Path) -> CliResult:
    return invoke(*args, "--store", str(store))


def assert_verify_fails(result: CliResult, verdict: str, *words: str) -> str:
    """Exit 4 with one ``Error:`` line starting with ``verdict`` and naming ``words``."""
    assert result.exit_code == 4, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {verdict}: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert "FAILED" in result.stdout or result.stdout.startswith("[")
    return lines[0]


def export(store: Path, key: Path, out: Path, run: str = "latest") -> Path:
    result = cli("export-head", run, "--key", str(key), "-o", str(out), store=store)
    assert result.exit_code == 0, result.stderr
    assert out.is_file()
    return out


# --------------------------------------------------------------------------- the library API
def test_checkpoint_head_signs_and_stores_the_current_head(
    store: Path, run_id: str, ours: Path
) -> None:
    key = load_private_key(ours)
    event_store = EventStore.open(str(store))
    try:
        head = event_store.chain_head(run_id, 0)
        assert head is not None
        tips = verify_run(event_store, run_id).tips
        made = checkpoint_head(event_store, key, run_id, 0, tips[0], 1)
        assert made.id is not None
        assert (made.run_id, made.stream, made.seq, made.head_hash) == (run_id, 0, head[0], head[1])
        assert made.is_tree_head and made.ended and made.world_size == 1
        assert made.tree_root == tips[0].tree_root
        assert made.key_fingerprint == fingerprint(key)
        assert checkpoints_for(event_store, run_id) == [made]
        assert event_store.checkpointed_run_ids() == [run_id]
        store_id = event_store.meta()["store_id"]
        ring = KeyRing([load_public_key(Path(pub(ours)))])
        assert (
            ring.check(made.key_fingerprint, made.statement(store_id), made.signature)
            is Verdict.VALID
        )

        # an earlier head (what the writer passes: the batch it just committed), with its tree head
        earlier_root = merkle_root_at(event_store, run_id, 3)
        earlier = checkpoint_head(
            event_store,
            key,
            run_id,
            0,
            StreamTip(0, 3, _hash_at(store, run_id, 3), earlier_root),
            1,
        )
        assert earlier.seq == 3 and not earlier.ended

        report = verify_run(event_store, run_id, keys=ring)
        assert report.ok, [p.describe() for p in report.problems]
        assert report.checkpoints == 2 and report.covered == {0: head[0]}

        # a tree head that is not the stream's is caught even with the right chain head
        checkpoint_head(
            event_store, key, run_id, 0, StreamTip(0, 3, _hash_at(store, run_id, 3), "0" * 64), 1
        )
        report = verify_run(event_store, run_id, keys=ring)
        assert [p.what for p in report.problems] == [
            "signed head's Merkle tree head at size 3 does not match the stream's tree (events up to it were changed)"
        ]
    finally:
        event_store.close()


def merkle_root_at(event_store: EventStore, run_id: str, size: int) -> str:
    from auditlog.core.chain import canonical_row
    from auditlog.integrity.merkle import leaf_hash, root

    leaves = [leaf_hash(canonical_row(r)) for r in event_store.iter_events(run_id, stream=0)]
    return root(leaves, size).hex()


def _hash_at(store: Path, run_id: str, seq: int) -> str:
    with tamper(store) as conn:
        (value,) = conn.execute(
            "select hash from events where run_id=? and stream=0 and seq=?", (run_id, seq)
        ).fetchone()
    return str(value)


def test_checkpoint_rows_are_plain_columns(store: Path, run_id: str, ours: Path) -> None:
    event_store = EventStore.open(str(store))
    try:
        checkpoint_head(
            event_store,
            load_private_key(ours),
            run_id,
            0,
            verify_run(event_store, run_id).tips[0],
            1,
        )
        (row,) = event_store.checkpoint_rows(run_id)
    finally:
        event_store.close()
    assert set(row) == {
        "id",
        "run_id",
        "stream",
        "seq",
        "head_hash",
        "created_ns",
        "key_fingerprint",
        "signature",
        "format",
        "tree_root",
        "ended",
        "world_size",
    }
    assert row["seq"] == last_seq(store, run_id)
    assert (row["format"], row["ended"], row["world_size"]) == ("auditlog-checkpoint-v2", 1, 1)


# --------------------------------------------------------------------------- auditlog checkpoint
def test_checkpoint_command_signs_each_head_once(store: Path, run_id: str, ours: Path) -> None:
    n = last_seq(store, run_id)
    result = cli("checkpoint", "--key", str(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert f"run {run_id[:12]} stream 0: signed seq {n}" in result.stdout
    again = cli("checkpoint", "--key", str(ours), store=store)
    assert again.exit_code == 0, again.stderr
    assert f"seq {n} already signed by this key" in again.stdout
    with tamper(store) as conn:
        assert conn.execute("select count(*) from checkpoints").fetchone() == (1,)

    result = cli("verify", "--key", pub(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert (
        f"run {run_id[:12]}: {n} events in 1 stream(s), 1 signed checkpoint(s): intact"
        in result.stdout
    )


def test_default_key_location_is_used_for_signing_and_verifying(store: Path, run_id: str) -> None:
    assert invoke("keygen").exit_code == 0
    assert cli("checkpoint", store=store).exit_code == 0
    result = cli("verify", store=store)
    assert result.exit_code == 0, result.stderr
    assert "1 signed checkpoint(s): intact" in result.stdout


def test_checkpoint_all_signs_every_run(store: Path, run_id: str, ours: Path) -> None:
    second = record_run(store)
    result = cli("checkpoint", "all", "--key", str(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert f"run {run_id[:12]} stream 0: signed" in result.stdout
    assert f"run {second[:12]} stream 0: signed" in result.stdout
    result = cli("verify", "all", "--key", pub(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("1 signed checkpoint(s): intact") == 2


def test_signing_an_altered_record_is_refused(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    with tamper(store) as conn:
        conn.execute("update events set payload=payload || ' ' where run_id=? and seq=4", (run_id,))
    before = file_digest(store / "events.db")
    for command in (("checkpoint",), ("export-head", "-o", str(tmp_path / "h.json"))):
        result = cli(*command, "--key", str(ours), store=store)
        assert result.exit_code == 4, result.stderr
        assert result.stderr.startswith(
            f"Error: refusing to sign run {run_id[:12]}: record altered:"
        )
        assert "seq 4" in result.stderr
    assert not (tmp_path / "h.json").exists()
    with tamper(store) as conn:
        assert conn.execute("select count(*) from checkpoints").fetchone() == (0,)
    assert file_digest(store / "events.db") == before


# --------------------------------------------------------------------------- verify: stored checkpoints
def test_stored_checkpoint_catches_truncation(store: Path, run_id: str, ours: Path) -> None:
    n = last_seq(store, run_id)
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    truncate(store, run_id, 3)
    line = assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store),
        "record altered",
        f"seq {n}",
        "(checkpoint 1)",
        f"stream ends at seq {n - 3}",
        "cut off",
    )
    assert run_id[:12] in line


def test_stored_checkpoint_catches_a_rewritten_chain(store: Path, run_id: str, ours: Path) -> None:
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    rewrite_chain(store, run_id, 5)
    assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store),
        "record altered",
        "(checkpoint 1)",
        "rewritten",
    )


def test_checkpoint_signed_by_an_unknown_key_is_reported(
    store: Path, run_id: str, ours: Path, theirs: Path
) -> None:
    assert cli("checkpoint", "--key", str(theirs), store=store).exit_code == 0
    # verifying with only our key: their checkpoint is not silently accepted
    line = assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store),
        "record not verified",
        fingerprint(load_private_key(theirs))[:16],
        "not trusted",
        "--key",
    )
    assert "(checkpoint 1)" in line
    # with no key at all (none given, none at the default location) the same, with a hint
    assert_verify_fails(cli("verify", store=store), "record not verified", "no public key given")
    # trusting both keys: intact
    result = cli("verify", "--key", pub(ours), "--key", pub(theirs), store=store)
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    "edit",
    [
        "update checkpoints set seq = seq - 1",
        "update checkpoints set head_hash = (select hash from events where seq = 2)",
        "update checkpoints set created_ns = created_ns + 1",
        # the last hex digit changed for certain (a fixed '0' left 1 signature in 16 as it was)
        "update checkpoints set signature = substr(signature, 1, 127)"
        " || (case substr(signature, 128, 1) when '0' then '1' else '0' end)",
        "update auditlog_meta set value = 'another-store' where key = 'store_id'",
    ],
    ids=["seq", "head_hash", "created_ns", "signature", "store_id"],
)
def test_edited_checkpoint_fails_its_signature(
    store: Path, run_id: str, ours: Path, edit: str
) -> None:
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    state = (
        "select c.signature, c.seq, c.head_hash, c.created_ns, m.value from checkpoints c, auditlog_meta m"
        " where m.key = 'store_id'"
    )
    with tamper(store) as conn:
        before = conn.execute(state).fetchone()
        conn.execute(edit)
        after = conn.execute(state).fetchone()
    assert (
        before is not None and after is not None and after != before
    )  # the edit changed something
    assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store),
        "record altered",
        "(checkpoint 1)",
        "does not verify",
    )


def test_garbled_checkpoint_row_is_reported_not_crashed_on(
    store: Path, run_id: str, ours: Path
) -> None:
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    with tamper(store) as conn:
        conn.execute("update checkpoints set seq = 'abc', signature = x'00ff'")
    assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store), "record altered", "garbled", "seq"
    )


def test_deleting_the_checkpoints_hides_a_rewrite_from_the_store_alone(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    """Why exported heads exist: whoever can rewrite events can delete checkpoint rows too."""
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    head = export(store, ours, tmp_path / "head.json")
    rewrite_chain(store, run_id, 5)
    with tamper(store) as conn:
        conn.execute("delete from checkpoints")
    # without a signature nothing proves the rewrite; with --key, nothing proves the record either
    bare = cli("verify", store=store)
    assert (
        bare.exit_code == 0
        and "note: stream 0: no signature by a trusted key covers" in bare.stdout
    )
    assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store), "record not verified", "no signature"
    )
    assert_verify_fails(
        cli("verify", "--key", pub(ours), "--against", str(head), store=store),
        "record altered",
        "rewritten",
    )


# --------------------------------------------------------------------------- export-head / verify --against
def test_export_head_writes_a_signed_statement(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    result = cli("export-head", "--key", str(ours), store=store)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    n = last_seq(store, run_id)
    assert data["format"] == "auditlog-head-v2"
    assert data["run_id"] == run_id and data["world_size"] == 1
    (head,) = data["heads"]
    assert {k: head[k] for k in ("stream", "seq", "head_hash", "ended")} == {
        "stream": 0,
        "seq": n,
        "head_hash": _hash_at(store, run_id, n),
        "ended": True,
    }
    assert len(head["tree_root"]) == 64
    assert data["key_fingerprint"] == fingerprint(load_private_key(ours))
    with tamper(store) as conn:
        (store_id,) = conn.execute(
            "select value from auditlog_meta where key='store_id'"
        ).fetchone()
        assert conn.execute("select count(*) from checkpoints").fetchone() == (0,)  # nothing stored
    assert data["store_id"] == store_id

    out = export(store, ours, tmp_path / "head.json")
    assert json.loads(out.read_text())["heads"] == data["heads"]
    # an existing statement is never overwritten
    before = file_digest(out)
    again = cli("export-head", "--key", str(ours), "-o", str(out), store=store)
    assert again.exit_code == 1 and "already exists" in again.stderr
    assert file_digest(out) == before


def test_intact_record_verifies_against_its_exported_head(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    head = export(store, ours, tmp_path / "head.json")
    result = cli("verify", "--against", str(head), "--key", pub(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert f"run {run_id[:12]}: " in result.stdout and "1 exported head(s): intact" in result.stdout
    # explicitly naming the run works too; and the statement can come from stdin
    assert (
        cli("verify", run_id[:8], "--against", str(head), "--key", pub(ours), store=store).exit_code
        == 0
    )
    piped = CliRunner().invoke(
        app,
        ["verify", "--store", str(store), "--against", "-", "--key", pub(ours)],
        input=head.read_text(),
    )
    assert piped.exit_code == 0, piped.stderr


def test_an_event_appended_after_the_exported_end_is_caught(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    """The statement was made after the run ended: the record may not grow past it (a stream
    ends at its run_ended). Growing records are proven with a head exported mid-run
    (tests/test_forgery.py)."""
    head = export(store, ours, tmp_path / "head.json")
    n = last_seq(store, run_id)
    # append one correctly chained event, as a later legitimate writer would
    with tamper(store) as conn:
        prev = _hash_at(store, run_id, n)
        row = {
            "run_id": run_id,
            "stream": 0,
            "seq": n + 1,
            "ts_ns": 1,
            "kind": "annotation",
            "step": 0,
            "module_id": None,
            "tensor_id": None,
            "payload": canonical_payload({"key": "late", "fields": {}}),
        }
        row["hash"] = chain_hash(prev, row)
        conn.execute(
            "insert into events(run_id, stream, seq, ts_ns, kind, step, module_id, tensor_id, payload, hash) "
            "values (:run_id, :stream, :seq, :ts_ns, :kind, :step, :module_id, :tensor_id, :payload, :hash)",
            row,
        )
    assert_verify_fails(
        cli("verify", "--against", str(head), "--key", pub(ours), store=store),
        "record altered",
        f"signs the stream's end at seq {n}",
        "appended after the run ended",
    )
    problems = json.loads(
        cli(
            "verify", "--against", str(head), "--format", "json", "--key", pub(ours), store=store
        ).stdout
    )[0]["problems"]
    assert any(f"after the stream's run_ended at seq {n}" in p["what"] for p in problems)


@pytest.mark.parametrize("k", [1, 3])
def test_truncation_is_detected_only_against_an_exported_head(
    store: Path, run_id: str, ours: Path, tmp_path: Path, k: int
) -> None:
    n = last_seq(store, run_id)
    head = export(store, ours, tmp_path / "head.json")
    truncate(store, run_id, k)
    # the bare chain is a valid prefix: it cannot see that its end is gone, and says so
    bare = cli("verify", store=store)
    assert bare.exit_code == 0, bare.stderr
    assert (
        f"{n - k} events" in bare.stdout
        and "cannot show that newer events were not cut off" in bare.stdout
    )
    # with --key every event must be signed: nothing is, so nothing is proven
    assert_verify_fails(
        cli("verify", "--key", pub(ours), store=store), "record not verified", "no signature"
    )
    assert_verify_fails(
        cli("verify", "--against", str(head), "--key", pub(ours), store=store),
        "record altered",
        str(head),
        f"seq {n}",
        f"stream ends at seq {n - k}",
        "cut off",
    )


def test_full_chain_rewrite_verifies_alone_but_not_against_an_exported_head(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    head = export(store, ours, tmp_path / "head.json")
    original = _hash_at(store, run_id, last_seq(store, run_id))
    rewrite_chain(store, run_id, 5)
    with tamper(store) as conn:
        (payload,) = conn.execute(
            "select payload from events where run_id=? and seq=5", (run_id,)
        ).fetchone()
    assert '"forged":true' in payload
    assert _hash_at(store, run_id, last_seq(store, run_id)) != original
    # the rewritten chain is internally consistent: that is the point of exporting heads
    bare = cli("verify", store=store)
    assert bare.exit_code == 0, bare.stderr
    assert "intact" in bare.stdout
    line = assert_verify_fails(
        cli("verify", "--against", str(head), "--key", pub(ours), store=store),
        "record altered",
        "rewritten",
        original[:16],
    )
    assert str(head) in line


def test_deleting_the_whole_run_is_detected_against_an_exported_head(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    head = export(store, ours, tmp_path / "head.json")
    with tamper(store) as conn:
        conn.execute("delete from events where run_id=?", (run_id,))
        conn.execute("delete from runs where run_id=?", (run_id,))
    assert_verify_fails(
        cli("verify", "--against", str(head), "--key", pub(ours), store=store),
        "record altered",
        "no events in this store",
    )


def test_statement_signed_by_another_key_fails(
    store: Path, run_id: str, ours: Path, theirs: Path, tmp_path: Path
) -> None:
    head = export(store, theirs, tmp_path / "head.json")
    assert_verify_fails(
        cli("verify", "--against", str(head), "--key", pub(ours), store=store),
        "record not verified",
        str(head),
        fingerprint(load_private_key(theirs))[:16],
        "not trusted",
    )


def test_forged_statement_fails(
    store: Path, run_id: str, ours: Path, theirs: Path, tmp_path: Path
) -> None:
    """After a truncation, an attacker edits the statement to match, or re-signs it with their key."""
    head = export(store, ours, tmp_path / "head.json")
    truncate(store, run_id, 2)
    data = json.loads(head.read_text())
    data["heads"][0]["seq"] -= 2
    data["heads"][0]["head_hash"] = _hash_at(store, run_id, data["heads"][0]["seq"])
    head.write_text(json.dumps(data))
    assert_verify_fails(
        cli("verify", "--against", str(head), "--key", pub(ours), store=store),
        "record not verified",
        "does not verify",
        "statement was edited",
    )
    # claiming our fingerprint on a statement their key signed does not help either
    forged = export(store, theirs, tmp_path / "forged.json")
    data = json.loads(forged.read_text())
    data["key_fingerprint"] = fingerprint(load_private_key(ours))
    forged.write_text(json.dumps(data))
    assert_verify_fails(
        cli("verify", "--against", str(forged), "--key", pub(ours), store=store),
        "record not verified",
        "does not verify",
    )


def test_against_a_statement_about_another_run_is_a_usage_error(
    store: Path, run_id: str, ours: Path, tmp_path: Path
) -> None:
    head = export(store, ours, tmp_path / "head.json")
    second = record_run(store)
    assert cli("checkpoint", second, "--key", str(ours), store=store).exit_code == 0
    result = cli("verify", second, "--against", str(head), "--key", pub(ours), store=store)
    assert result.exit_code == 2, result.stderr
    assert f"is about run {run_id[:12]}, not run {second[:12]}" in result.stderr
    # without RUN, the statement's run is verified (not "latest")
    result = cli("verify", "--against", str(head), "--key", pub(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert run_id[:12] in result.stdout and second[:12] not in result.stdout
    # with 'all', every run and the statement
    result = cli("verify", "all", "--against", str(head), "--key", pub(ours), store=store)
    assert result.exit_code == 0, result.stderr
    assert run_id[:12] in result.stdout and second[:12] in result.stdout


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "not JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        (b'{"format": "something-else"}', "not an auditlog head statement"),
        (b"[]", "not a JSON object"),
    ],
    ids=["empty", "binary", "foreign-json", "list"],
)
def test_unreadable_statement_is_one_line(
    store: Path, run_id: str, tmp_path: Path, content: bytes, words: str
) -> None:
    path = tmp_path / "head.json"
    path.write_bytes(content)
    result = cli("verify", "--against", str(path), store=store)
    assert result.exit_code == 1, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert words in result.stderr and str(path) in result.stderr
    missing = cli("verify", "--against", str(tmp_path / "nope.json"), store=store)
    assert missing.exit_code == 1 and "no head statement at" in missing.stderr
    directory = cli("verify", "--against", str(tmp_path), store=store)
    assert directory.exit_code == 1 and "is a directory" in directory.stderr


def test_verify_all_finds_runs_missing_from_the_index(store: Path, run_id: str) -> None:
    with tamper(store) as conn:
        conn.execute("delete from runs where run_id=?", (run_id,))
    assert_verify_fails(
        cli("verify", "all", store=store), "record altered", "runs index was deleted"
    )


def test_json_output_names_the_checkpoint(store: Path, run_id: str, ours: Path) -> None:
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    truncate(store, run_id, 1)
    result = cli("verify", "--key", pub(ours), "--format", "json", store=store)
    assert result.exit_code == 4
    (report,) = json.loads(result.stdout)
    assert report["ok"] is False and report["checkpoints"] == 1 and report["exported_heads"] == 0
    problem, uncovered = report["problems"]
    assert problem["checkpoint_id"] == 1 and problem["altered"] is True
    assert "cut off" in problem["what"]
    assert uncovered["altered"] is False and "no signature" in uncovered["what"]


def test_a_broken_default_key_matters_only_when_a_signature_needs_it(
    store: Path, run_id: str, ours: Path, config: Path
) -> None:
    default_pub = config / "auditlog" / "signing_key.pub"
    default_pub.parent.mkdir(parents=True)
    default_pub.write_text("garbage\n")
    # no checkpoints, no statements: the default key is never read
    result = cli("verify", store=store)
    assert result.exit_code == 0, result.stderr
    # with a checkpoint to check, the broken default key is a one-line error naming it
    assert cli("checkpoint", "--key", str(ours), store=store).exit_code == 0
    result = cli("verify", store=store)
    assert result.exit_code == 1, result.stderr
    assert result.stderr.startswith("Error: ") and str(default_pub) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    # an explicit --key is always read, and wins over the default
    assert cli("verify", "--key", pub(ours), store=store).exit_code == 0
