"""Real ``torchrun --nproc_per_node=2`` DDP training (gloo, CPU) recorded into one run.

Each test launches torchrun (``python -m torch.distributed.run``) on
``examples/train_ddp.py`` and then reads the record with the CLI: one run, a
stream per rank, a status that names the rank that failed, the user's model as
the tree, and the same answers from a PostgreSQL store as from combined shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLES, REPO, invoke
from launch_support import torchrun

from auditlog.core.ranks import STREAM_STRIDE

pytestmark = pytest.mark.slow

SCRIPT = str(EXAMPLES / "train_ddp.py")


def cli_json(*args: str) -> Any:
    result = invoke(*args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("module", [False, True], ids=["no-python", "m-auditlog"])
def test_ddp_job_is_one_run_with_a_stream_per_rank(tmp_path: Path, module: bool) -> None:
    store = str(tmp_path / "store")
    torchrun(tmp_path, "run", "--store", store, SCRIPT, "--steps", "4", module=module)

    [run] = cli_json("runs", "--store", store)
    assert (run["status"], run["world_size"], run["streams"], run["steps"]) == (
        "completed",
        2,
        2,
        4,
    )
    assert run["argv"][0].endswith("train_ddp.py") and run["duration_s"] > 0
    assert [(r["rank"], r["status"]) for r in run["ranks"]] == [(0, "completed"), (1, "completed")]

    verified = invoke("verify", "--store", store)
    assert verified.exit_code == 0, verified.stdout
    assert "2 stream(s): intact" in verified.stdout

    started = cli_json("events", "--store", store, "--kind", "run_started")
    assert [(e["stream"], e["payload"]["rank"], e["payload"]["world_size"]) for e in started] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    assert {e["payload"]["launcher"] for e in started} == {"torchrun"}
    assert {e["payload"]["run_id_source"] for e in started} == {"torchrun agent store"}

    steps = cli_json(
        "query",
        "--store",
        store,
        "select rank, count(*) as n, max(grad_norm_spread) as spread "
        "from rank_steps group by rank order by rank",
    )
    assert [(s["rank"], s["n"]) for s in steps] == [(0, 4), (1, 4)]  # per-rank step counts equal
    assert all(s["spread"] < 1e-6 for s in steps)  # DDP averaged the gradients
    losses = cli_json(
        "query", "--store", store, "select rank, loss from rank_steps where step = 1 order by rank"
    )
    assert all(row["loss"] is not None for row in losses) and losses[0]["loss"] != losses[1]["loss"]

    for rank in ("0", "1"):
        [tree] = cli_json("tree", "--store", store, "--rank", rank)
        assert tree["class"] == "torch.nn.modules.container.Sequential"
        assert tree["wrapped_by"] == ["torch.nn.parallel.distributed.DistributedDataParallel"]
        assert [c["name"] for c in tree["children"]] == ["0", "1", "2"]
    names = cli_json(
        "query",
        "--store",
        store,
        "select distinct module from forward_stats union "
        "select distinct module from backward_stats order by 1",
    )
    assert [n["module"] for n in names] == [
        "(Sequential)",
        "0",
        "1",
        "2",
    ]  # no DDP wrapper, no "module."
    parameters = cli_json(
        "query", "--store", store, "--rank", "1", "select parameter from parameters order by 1"
    )
    assert [p["parameter"] for p in parameters] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    rank1 = cli_json("events", "--store", store, "--rank", "1", "--kind", "optimizer_step")
    assert {e["stream"] for e in rank1} == {1} and len(rank1) == 4


def test_a_killed_rank_is_named_in_the_run_status(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    done = torchrun(tmp_path, "run", "--store", store, SCRIPT, "--kill-rank", "1", check=False)
    assert done.returncode != 0
    [run] = cli_json("runs", "--store", store)
    assert run["status"] == "crashed" and run["streams"] == 2
    assert "rank 1 crashed" in run["status_detail"]
    by_rank = {r["rank"]: r["status"] for r in run["ranks"]}
    assert by_rank[1] == "crashed" and by_rank[0] in ("failed", "interrupted", "crashed")
    table = invoke("runs", "--store", store)
    assert "crashed (rank 1)" in table.stdout or (
        by_rank[0] == "crashed" and "crashed (ranks 0, 1)" in table.stdout
    )
    verified = invoke("verify", "--store", store)
    assert verified.exit_code == 0, verified.stdout  # what was written is intact


def test_elastic_restart_appends_a_new_segment(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    torchrun(
        tmp_path,
        "run",
        "--store",
        store,
        SCRIPT,
        "--fail-rank",
        "1",
        "--fail-restart",
        "0",
        torchrun_args=("--max-restarts=1",),
    )
    [run] = cli_json("runs", "--store", store)
    assert run["status"] == "completed"
    assert sorted(r["stream"] for r in run["ranks"]) == [0, 1, STREAM_STRIDE, STREAM_STRIDE + 1]
    assert "1 restart before" in run["status_detail"] and "rank 1 failed" in run["status_detail"]
    started = cli_json("events", "--store", store, "--kind", "run_started")
    assert {(e["stream"], e["payload"]["restart"], e["payload"]["segment"]) for e in started} == {
        (0, 0, 0),
        (1, 0, 0),
        (STREAM_STRIDE, 1, 1),
        (STREAM_STRIDE + 1, 1, 1),
    }
    verified = invoke("verify", "--store", store)
    assert verified.exit_code == 0 and "4 stream(s): intact" in verified.stdout


def test_record_api_inside_a_torchrun_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, runpy\nimport auditlog\n"
        f"with auditlog.record({str(tmp_path / 'store')!r}, name='api'):\n"
        f"    sys.argv = [{SCRIPT!r}, '--steps', '2']\n"
        f"    runpy.run_path({SCRIPT!r}, run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUDITLOG_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = cli_json("runs", "--store", str(tmp_path / "store"))
    assert (run["name"], run["status"], run["streams"], run["steps"]) == ("api", "completed", 2, 2)


def _answers(store: str) -> dict[str, Any]:
    """What runs, verify, tree and a query say about the store's one run, less ids and times."""
    [run] = cli_json("runs", "--store", store)
    verified = invoke("verify", "--store", store)
    tree = cli_json("tree", "--store", store)
    for node in tree:
        _drop_ids(node)
    rows = cli_json(
        "query",
        "--store",
        store,
        "select rank, step, round(grad_norm, 9) as g, round(loss, 6) as loss from rank_steps order by rank, step",
    )
    return {
        "run": {k: run[k] for k in ("status", "world_size", "streams", "steps", "events", "argv")},
        "ranks": [(r["stream"], r["rank"], r["status"]) for r in run["ranks"]],
        "verify": (verified.exit_code, verified.stdout.split(": ", 1)[1]),
        "tree": tree,
        "query": rows,
    }


def _drop_ids(node: dict[str, Any]) -> None:
    for child in node["children"]:
        _drop_ids(child)
    node.pop("source", None)
    for tensor in node["parameters"] + node["buffers"]:
        tensor.pop("source", None)


def test_postgres_and_combined_shards_give_the_same_answers(tmp_path: Path, pg_url: str) -> None:
    snaps = str(tmp_path / "pg-snapshots")
    torchrun(tmp_path, "run", "--store", pg_url, "--snapshots", snaps, SCRIPT, "--steps", "3")
    shards = str(tmp_path / "sharded")
    torchrun(tmp_path, "run", "--store", shards, "--shard", SCRIPT, "--steps", "3")
    assert len(list((tmp_path / "sharded" / "shards").iterdir())) == 2
    combined = invoke("combine", "--into", shards)
    assert combined.exit_code == 0, combined.stdout + combined.stderr

    from_pg, from_shards = _answers(pg_url), _answers(shards)
    assert from_pg == from_shards
    assert from_pg["run"]["status"] == "completed" and from_pg["verify"][0] == 0
    assert len(from_pg["query"]) == 6
