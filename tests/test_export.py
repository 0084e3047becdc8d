"""``auditlog export``: an archive plain DuckDB reads, that ``verify --archive`` checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_one_line_error, invoke, record_run, tamper
from integrity_support import isolate_keys

import auditlog
from auditlog.integrity.keys import generate_key_pair


@pytest.fixture
def two_rank_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A store holding one run of two streams (as two torchrun ranks record it)."""
    store = tmp_path / "store"
    monkeypatch.setenv("AUDITLOG_RUN_ID", "run2ranks")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        record_run(store, steps=3, snapshot_every=1)
    for name in ("AUDITLOG_RUN_ID", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name)
    return store, "run2ranks"


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    isolate_keys(monkeypatch, tmp_path)
    return generate_key_pair(tmp_path / "team.key").private_path


def _export(store: Path, target: Path, key: Path | None) -> None:
    args = ["export", "--store", str(store), "--to", str(target)]
    result = invoke(*args, *(["--key", str(key)] if key else []))
    assert result.exit_code == 0, result.stderr
    assert "exported run run2ranks" in result.stdout


def _verify(archive: Path, key: Path | None) -> tuple[int, str]:
    result = invoke(
        "verify", "--archive", str(archive), *(["--key", str(key) + ".pub"] if key else [])
    )
    return result.exit_code, result.stdout + result.stderr


def test_plain_duckdb_reads_the_archive(two_rank_store: tuple[Path, str], tmp_path: Path) -> None:
    store, run_id = two_rank_store
    archive = tmp_path / "archive"
    _export(store, archive, None)
    with auditlog.open(store) as opened:
        expected = opened.run(run_id, rank=1).state_dict(step=3)
    weight_hash = None
    for event in json.loads(
        invoke(
            "events",
            "--store",
            str(store),
            "--rank",
            "1",
            "--kind",
            "snapshot_taken",
            "--format",
            "json",
        ).stdout
    ):
        if event["step"] == 3:
            weight_hash = next(t["sha256"] for t in event["payload"]["snapshot"]["tensors"])
    assert weight_hash is not None
    reader = f"""
import sys, json, duckdb
con = duckdb.connect()
root = {str(archive)!r}
events = con.sql(f"select run_id, stream, count(*), max(seq) from read_parquet('{{root}}/events/*/*/*.parquet', hive_partitioning = true, hive_types = {{{{'run_id': VARCHAR, 'stream': INTEGER}}}}) group by all order by stream").fetchall()
kinds = con.sql(f"select distinct kind from read_parquet('{{root}}/events/*/*/*.parquet') order by 1").fetchall()
snaps = con.sql(f"select count(*) from read_parquet('{{root}}/snapshots/*/*/*.parquet', hive_partitioning = true) where trigger = 'step'").fetchall()[0]
values = con.sql(f"select list(value order by file_row_number) from read_parquet('{{root}}/tensors/{weight_hash[:2]}/{weight_hash}.parquet', file_row_number = true)").fetchall()[0]
print(json.dumps({{"events": events, "kinds": [k for (k,) in kinds], "snaps": snaps[0], "values": values[0], "auditlog": "auditlog" in sys.modules}}))
"""
    done = subprocess.run(
        [sys.executable, "-I", "-c", reader],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["auditlog"] is False
    assert [(r[0], r[1]) for r in seen["events"]] == [(run_id, 0), (run_id, 1)]
    assert all(r[2] == r[3] for r in seen["events"])  # every event, seq 1..n
    assert {"run_started", "optimizer_step", "snapshot_taken", "run_ended"} <= set(seen["kinds"])
    assert seen["snaps"] > 0
    first = next(iter(expected.values()))
    assert torch.equal(torch.tensor(seen["values"], dtype=first.dtype), first.reshape(-1))


def test_a_signed_archive_verifies_and_any_flipped_byte_fails(
    two_rank_store: tuple[Path, str], tmp_path: Path, key: Path
) -> None:
    store, _run_id = two_rank_store
    archive = tmp_path / "archive"
    _export(store, archive, key)
    assert (archive / "heads.json").exists() and (archive / "manifest.sig").exists()
    code, out = _verify(archive, key)
    assert code == 0, out
    assert "2 stream(s)" in out and "intact" in out
    other = generate_key_pair(tmp_path / "other.key").private_path
    code, out = _verify(archive, other)
    assert code == 4 and "not trusted" in out

    manifest = json.loads((archive / "manifest.json").read_text())
    for entry in manifest["files"]:
        copy = tmp_path / f"flipped-{entry['path'].replace('/', '_')}"
        shutil.copytree(archive, copy)
        target = copy / entry["path"]
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
        code, out = _verify(copy, key)
        assert code == 4, entry["path"]
        assert entry["path"] in out, out
    copy = tmp_path / "flipped-manifest"
    shutil.copytree(archive, copy)
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(text.replace('"chain"', '"chaim"'))
    assert _verify(copy, key)[0] == 4


def test_an_added_or_removed_stream_fails(two_rank_store: tuple[Path, str], tmp_path: Path) -> None:
    store, run_id = two_rank_store
    archive = tmp_path / "archive"
    _export(store, archive, None)
    forged = archive / "events" / f"run_id={run_id}" / "stream=7"
    shutil.copytree(archive / "events" / f"run_id={run_id}" / "stream=1", forged)
    code, out = _verify(archive, None)
    assert code == 4 and "not listed in the manifest (file added)" in out
    shutil.rmtree(forged)
    shutil.rmtree(archive / "events" / f"run_id={run_id}" / "stream=1")
    code, out = _verify(archive, None)
    assert code == 4 and "missing" in out


def test_an_altered_record_is_not_exported(tmp_path: Path) -> None:
    store = tmp_path / "store"
    record_run(store, steps=2)
    with tamper(store) as conn:
        conn.execute(
            "update events set payload = replace(payload, '0.1', '0.3') where kind = 'optimizer_step'"
        )
    result = invoke("export", "--store", str(store), "--to", str(tmp_path / "archive"))
    assert_one_line_error(result, 4, "refusing to export", "record altered")
    assert not (tmp_path / "archive").exists()


def test_export_needs_a_new_directory(tmp_path: Path) -> None:
    store = tmp_path / "store"
    record_run(store, steps=1)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    assert_one_line_error(
        invoke("export", "--store", str(store), "--to", str(tmp_path / "full")),
        1,
        "not an empty directory",
    )
    assert (tmp_path / "full" / "x").read_text() == "mine"
    assert_one_line_error(
        invoke("verify", "--archive", str(tmp_path / "full")), 4, "no manifest.json"
    )
