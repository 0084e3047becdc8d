"""Forgeries of the chain, the runs index and the read model, each caught by name (issue 12).

Each test performs one forgery of the adversarial trial with only the
documented format (``forgery_support``), then checks that ``verify --key PUB
--against HEAD`` (or ``query``) catches it with a message naming what was
forged. The untouched record verifies; a keyless ``verify`` reports what a bare
chain can see and says what it cannot.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import forgery_support
import pytest
from forgery_support import (
    Trial,
    append_event,
    fails,
    grad_norm_shown,
    rows,
    run_started_payload,
    train,
)
from helpers import invoke, tamper
from integrity_support import rewrite_chain

import auditlog
from auditlog.integrity.keys import generate_key_pair, load_private_key

pristine = forgery_support.pristine  # fixtures
trial = forgery_support.trial


# --------------------------------------------------------------------------- the untouched record
def test_the_untouched_record_verifies_with_key_and_exported_head(trial: Trial) -> None:
    result = trial.verify()
    assert result.exit_code == 0, result.stdout + result.stderr
    assert f"run {trial.r1[:12]}: " in result.stdout and "intact" in result.stdout
    assert "proven: stream 0: the record extends exported head" in result.stdout
    assert "note:" not in result.stdout  # every event is covered by a signature
    every = trial.cli("verify", "all", "--key", str(trial.public_key))
    assert every.exit_code == 0, every.stdout + every.stderr


def test_keyless_verify_says_what_a_bare_chain_cannot_see(store: Path) -> None:
    train(store, "unsigned", seed=0)  # no key anywhere (the test environment has none)
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 0, result.stderr
    assert "intact" in result.stdout
    assert "note: stream 0: no signature by a trusted key covers this stream" in result.stdout
    assert "cannot show that newer events were not cut off" in result.stdout
    # with a key given, nothing unsigned passes
    key = generate_key_pair(store.parent / "k")
    fails(
        invoke("verify", "--store", str(store), "--key", str(key.public_path)),
        "no signature",
        verdict="record not verified",
    )


# --------------------------------------------------------------------------- 1. events after run_ended
def test_event_appended_after_run_ended_is_caught(trial: Trial) -> None:
    with tamper(trial.store) as conn:
        forged = append_event(
            conn,
            trial.r1,
            0,
            "annotation",
            {"key": "dataset", "fields": {"name": "FORGED-clean-data"}},
        )
    text = fails(
        trial.verify(),
        f"seq {forged['seq']}",
        "after the stream's run_ended",
        "events were appended to a finished stream",
    )
    assert "signs the stream's end" in text  # the signed end says so too
    # a bare chain sees it as well: a stream ends at its run_ended
    fails(
        trial.cli("verify", trial.r1, "--key", str(trial.public_key)),
        "after the stream's run_ended",
    )


def test_run_ended_moved_past_a_forged_event_is_caught(trial: Trial) -> None:
    """The forger deletes run_ended, appends the annotation, re-appends run_ended: a valid-looking chain."""
    with tamper(trial.store) as conn:
        last = rows(conn, trial.r1)[-1]
        conn.execute("delete from events where id=?", (last["id"],))
        append_event(
            conn, trial.r1, 0, "annotation", {"key": "dataset", "fields": {"name": "FORGED"}}
        )
        append_event(
            conn, trial.r1, 0, "run_ended", json.loads(last["payload"]), ts_ns=last["ts_ns"]
        )
    text = fails(trial.verify(), f"seq {last['seq']}", "does not match the chain")
    assert "(checkpoint" in text  # the stored signed end caught it, not only the exported head


# --------------------------------------------------------------------------- 2. a whole new stream
@pytest.mark.parametrize("declared", [1, 2], ids=["world_size_1", "world_size_2"])
def test_a_new_stream_added_to_a_finished_run_is_caught(trial: Trial, declared: int) -> None:
    with tamper(trial.store) as conn:
        started = {**run_started_payload(conn, trial.r1), "rank": 1, "world_size": declared}
        append_event(conn, trial.r1, 1, "run_started", started)
        append_event(
            conn, trial.r1, 1, "annotation", {"key": "dataset", "fields": {"name": "FORGED"}}
        )
        append_event(conn, trial.r1, 1, "run_ended", {"status": "completed", "exit_code": 0})
    text = fails(trial.verify(), "stream 1")
    assert "which lists every stream of the ended run" in text
    if declared == 1:
        assert "stream 1 is not a stream of this run" in text
    else:
        assert "run_started says world_size 2, stream 0's says 1" in text
    # the stored signatures alone (no exported head): stream 1 is covered by none of them
    alone = trial.cli("verify", trial.r1, "--key", str(trial.public_key), "--format", "json")
    (report,) = json.loads(alone.stdout)
    assert any(
        p["stream"] == 1 and "no signature by a trusted key covers" in p["what"]
        for p in report["problems"]
    )


# --------------------------------------------------------------------------- 3. the runs table
def test_runs_index_edits_are_caught_and_never_shown(trial: Trial) -> None:
    year = 365 * 24 * 3600 * 10**9
    with tamper(trial.store) as conn:
        conn.execute("update runs set name = case name when 'r1' then 'r2' else 'r1' end")
        conn.execute(
            "update runs set started_ns = started_ns - ?, host = 'elsewhere', pid = 4242 where run_id = ?",
            (year, trial.r1),
        )
    text = fails(trial.verify())
    for field, index, chained in [
        ("name", "'r2'", "'r1'"),
        ("host", "'elsewhere'", None),
        ("pid", "4242", None),
    ]:
        assert f"{field} is {index} in the index" in text or field in text
        if chained:
            assert f"{field} is {index} in the index, {chained} in the record" in text
    report = json.loads(trial.cli("verify", trial.r1, "--format", "json").stdout)[0]
    whats = " ".join(p["what"] for p in report["problems"])
    for field in ("name", "host", "pid", "started_ns"):
        assert f"{field} is " in whats, whats
    # what `runs` shows and what selectors resolve come from the chain, not from the index
    runs = json.loads(trial.cli("runs", "--format", "json").stdout)
    shown = {r["run_id"]: r for r in runs}
    assert shown[trial.r1]["name"] == "r1" and shown[trial.r2]["name"] == "r2"
    assert shown[trial.r1]["host"] != "elsewhere" and shown[trial.r1]["pid"] != 4242
    assert [r["run_id"] for r in runs] == [trial.r1, trial.r2]  # start times from the chain
    with auditlog.open(trial.store) as opened:
        assert opened.select("latest") == trial.r2
        assert opened.select("r1") == trial.r1 and opened.select("r2") == trial.r2
    queried = json.loads(
        trial.cli("query", "--format", "json", "select run_id, name, host from runs").stdout
    )
    assert {r["run_id"]: r["name"] for r in queried} == {trial.r1: "r1", trial.r2: "r2"}
    assert all(r["host"] != "elsewhere" for r in queried)


# --------------------------------------------------------------------------- 6. the query cache
def test_an_edited_read_model_is_rebuilt_not_believed(trial: Trial) -> None:
    (true_norm,) = grad_norm_shown(trial.store, trial.r1)
    projection = trial.store / "readmodel.duckdb"
    con = duckdb.connect(str(projection))
    con.execute("update projection.steps set grad_norm = 123")
    con.close()
    assert list(grad_norm_shown(trial.store, trial.r1)) == [true_norm]  # rebuilt from the store
    # a forger who also rewrites the seal does not know the secret it is made with
    seal = projection.with_name(projection.name + ".seal")
    data = json.loads(seal.read_text())
    con = duckdb.connect(str(projection))
    con.execute("update projection.steps set grad_norm = 123")
    con.close()
    stat = projection.stat()
    data["file"] = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
    seal.write_text(json.dumps(data))
    assert list(grad_norm_shown(trial.store, trial.r1)) == [true_norm]


def test_a_rewritten_chain_rebuilds_the_read_model_and_query_rebuild_forces_it(
    trial: Trial,
) -> None:
    grad_norm_shown(trial.store, trial.r1).__next__()  # build it
    rewrite_chain(trial.store, trial.r1, 5)
    result = trial.cli(
        "query",
        "--run",
        trial.r1,
        "--format",
        "json",
        "select count(*) as n from events where payload like '%forged%'",
    )
    assert json.loads(result.stdout) == [{"n": 1}]  # the cache follows the store; verify judges it
    fails(trial.verify(), "rewritten")
    forced = trial.cli("query", "--rebuild", "select count(*) from runs")
    assert forced.exit_code == 0, forced.stderr


# --------------------------------------------------------------------------- consistency proofs
def test_a_head_exported_mid_run_is_extended_by_the_final_record(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from torch import nn

    key = generate_key_pair(tmp_path / "k" / "signing_key")
    monkeypatch.setenv("AUDITLOG_KEY", str(key.private_path))
    mid = tmp_path / "mid.json"
    with auditlog.record(store=store) as run:
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
            if step == 2:
                run.flush()
                with auditlog.open(store) as opened:
                    statement = opened.run(str(run.run_id)).export_head(
                        load_private_key(key.private_path)
                    )
                mid.write_text(statement.to_json())
    assert json.loads(mid.read_text())["heads"][0]["ended"] is False
    result = invoke(
        "verify", "--store", str(store), "--key", str(key.public_path), "--against", str(mid)
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    size = json.loads(mid.read_text())["heads"][0]["seq"]
    assert f"consistency proof from tree size {size} to" in result.stdout
    # one against a rewritten record fails
    rewrite_chain(store, str(run.run_id), 3)
    fails(
        invoke(
            "verify", "--store", str(store), "--key", str(key.public_path), "--against", str(mid)
        ),
        "rewritten",
    )
