"""Ranks, streams and segments; the run id a torchrun job shares; run status from all streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import invoke, record_run

from auditlog.core.liveness import run_liveness
from auditlog.core.ranks import STREAM_STRIDE, StreamStatus, run_status, split_stream, stream_number
from auditlog.recording.launch import choose_run_id, derive_run_id, detect_launch
from auditlog.recording.shards import free_stream, sharding
from auditlog.store.eventstore import EventStore
from auditlog.store.location import resolve_store

TORCHRUN = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_MAX_RESTARTS": "3",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}


def test_stream_numbers_round_trip() -> None:
    assert stream_number(3) == 3
    assert stream_number(3, 2) == 2 * STREAM_STRIDE + 3
    assert split_stream(stream_number(7, 5)) == (5, 7)
    with pytest.raises(ValueError):
        stream_number(STREAM_STRIDE)


def test_launch_facts_from_torchrun_environment() -> None:
    launch = detect_launch(TORCHRUN)
    assert (launch.rank, launch.local_rank, launch.world_size, launch.local_world_size) == (
        1,
        1,
        4,
        2,
    )
    assert (launch.restart, launch.max_restarts, launch.launcher, launch.rdzv_id) == (
        2,
        3,
        "torchrun",
        "job-42",
    )
    assert (launch.master_addr, launch.master_port, launch.agent_store) == ("node0", 29500, True)
    assert detect_launch({}).distributed is False
    assert detect_launch({"RANK": "x", "WORLD_SIZE": "2"}).rank == 0  # garbage falls back


def test_every_rank_of_a_launch_derives_the_same_run_id() -> None:
    ranks = [
        detect_launch({**TORCHRUN, "RANK": str(r), "LOCAL_RANK": str(r % 2)}) for r in range(4)
    ]
    ids = {
        choose_run_id(None, launch, env={}, nonce=lambda _launch: "n1").run_id for launch in ranks
    }
    assert len(ids) == 1
    [run_id] = ids
    assert run_id == derive_run_id(ranks[0], "n1") and len(run_id) == 32
    # another launch with the same --rdzv-id and master port: another nonce, another run
    again = choose_run_id(None, ranks[0], env={}, nonce=lambda _launch: "n2").run_id
    assert again != run_id


def test_run_id_sources() -> None:
    launch = detect_launch(TORCHRUN)
    assert choose_run_id("given", launch, env={}).source == "argument"
    assert choose_run_id(None, launch, env={"AUDITLOG_RUN_ID": "abc"}).run_id == "abc"
    no_agent = choose_run_id(None, launch, env={}, nonce=lambda _launch: None)
    assert no_agent.source == "torchrun environment" and no_agent.run_id == derive_run_id(
        launch, ""
    )
    plain = choose_run_id(None, detect_launch({}), env={})
    assert (
        plain.source == "random"
        and plain.run_id != choose_run_id(None, detect_launch({}), env={}).run_id
    )


def _s(
    rank: int, status: str, segment: int = 0, world: int = 2, exception: dict | None = None
) -> StreamStatus:
    return StreamStatus(
        stream_number(rank, segment), rank, segment, world, status, exception=exception
    )


def test_a_run_completes_only_when_every_rank_completed() -> None:
    assert run_status([_s(0, "completed"), _s(1, "completed")]).status == "completed"
    missing = run_status([_s(0, "completed")])
    assert missing.status == "incomplete" and "no stream from rank 1" in (missing.detail or "")
    running = run_status([_s(0, "completed"), _s(1, "running")])
    assert running.status == "running"


def test_a_failure_names_its_rank() -> None:
    crashed = run_status(
        [
            _s(0, "failed", exception={"type": "RuntimeError", "message": "peer reset"}),
            _s(1, "crashed"),
        ]
    )
    assert crashed.status == "crashed" and crashed.ranks == (1,)
    assert "rank 1 crashed" in (
        crashed.detail or ""
    ) and "rank 0 failed: RuntimeError: peer reset" in (crashed.detail or "")
    failed = run_status([_s(0, "interrupted"), _s(1, "failed"), _s(2, "completed", world=3)])
    assert (failed.status, failed.ranks) == ("failed", (1,))
    single = run_status([StreamStatus(0, 0, 0, 1, "failed")])
    assert (
        single.ranks == () and single.detail is None
    )  # a one-process run says nothing about ranks


def test_the_last_segment_decides_and_earlier_ones_are_named() -> None:
    restarted = run_status(
        [
            _s(0, "interrupted"),
            _s(1, "failed"),
            _s(0, "completed", segment=1),
            _s(1, "completed", segment=1),
        ]
    )
    assert restarted.status == "completed" and restarted.segments == 2
    assert restarted.detail == "1 restart before: rank 0 interrupted; rank 1 failed"


def test_liveness_judges_each_stream_by_its_own_process() -> None:
    row = {"host": "elsewhere", "pid": 1, "proc_start": None, "last_seen_ns": 0}
    import socket

    here = socket.gethostname()
    started = {
        0: {
            "rank": 0,
            "world_size": 2,
            "host": here,
            "pid": 2**22 + 12345,
            "proc_start": 1,
        },  # dead pid
        1: {"rank": 1, "world_size": 2, "host": here, "pid": 2**22 + 12346, "proc_start": 1},
    }
    live = run_liveness(row, started, {0: {"status": "completed"}})
    assert (live.status, live.ranks) == ("crashed", (1,))


def test_sharding_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = resolve_store(tmp_path / "s")
    one_node = detect_launch({**TORCHRUN, "LOCAL_WORLD_SIZE": "4"})
    two_nodes = detect_launch(TORCHRUN)
    assert not sharding(None, directory, one_node)
    assert sharding(None, directory, two_nodes)
    assert sharding(True, directory, detect_launch({}))
    monkeypatch.setenv("AUDITLOG_SHARD", "0")
    assert not sharding(None, directory, two_nodes)
    url = resolve_store("postgresql+psycopg://u@h/db", tmp_path)
    assert not sharding(None, url, two_nodes)


def test_a_taken_stream_is_never_continued(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run id used again (AUDITLOG_RUN_ID): a new segment, the old stream untouched."""
    monkeypatch.setenv("AUDITLOG_RUN_ID", "fixed-run")
    record_run(store, steps=1)
    record_run(store, steps=2)
    opened = EventStore.open(store)
    try:
        assert opened.streams("fixed-run") == [0, STREAM_STRIDE]
        assert free_stream(opened, "fixed-run", 0, 0) == 2 * STREAM_STRIDE
        assert free_stream(opened, "fixed-run", 1, 0) == 1
    finally:
        opened.close()
    [run] = json.loads(invoke("runs", "--store", str(store), "--format", "json").stdout)
    assert (run["status"], run["streams"], run["steps"]) == ("completed", 2, 2)
    verified = invoke("verify", "--store", str(store))
    assert verified.exit_code == 0 and "2 stream(s): intact" in verified.stdout


def test_rank_options_pick_one_rank(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks recorded into one store (RANK/WORLD_SIZE set, one run id): --rank shows one."""
    monkeypatch.setenv("AUDITLOG_RUN_ID", "tworanks")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        record_run(store, steps=2 + rank)
    [run] = json.loads(invoke("runs", "--store", str(store), "--format", "json").stdout)
    assert (run["status"], run["world_size"], run["streams"], run["steps"]) == (
        "completed",
        2,
        2,
        3,
    )
    one = json.loads(
        invoke("events", "--store", str(store), "--rank", "1", "--format", "json").stdout
    )
    assert {e["stream"] for e in one} == {1}
    assert [e["payload"]["rank"] for e in one if e["kind"] == "run_started"] == [1]
    table = invoke("events", "--store", str(store), "--kind", "run_started")
    assert table.stdout.splitlines()[1].split()[1] == "stream"  # several streams: a stream column
    query = invoke(
        "query",
        "--store",
        str(store),
        "--rank",
        "1",
        "--format",
        "json",
        "select distinct stream, rank from rank_steps",
    )
    assert json.loads(query.stdout) == [{"stream": 1, "rank": 1}]
    [tree] = json.loads(
        invoke("tree", "--store", str(store), "--rank", "1", "--format", "json").stdout
    )
    assert [c["name"] for c in tree["children"]] == ["0", "1", "2"]
    result = invoke("events", "--store", str(store), "--rank", "3")
    assert result.exit_code == 2 and "has no rank 3 (ranks: 0, 1)" in result.stderr
