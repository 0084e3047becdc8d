"""The adversarial trial of issue 12 as fixtures: a signed record, and forgeries made from the docs.

Every forgery here uses only the documented format: plain ``sqlite3`` on
``events.db``, hashes recomputed with ``auditlog.core.chain`` (the published
chain function), Parquet files written with pyarrow. No key is used: that is
what the forger does not hold.

Setup (as in the issue): two runs recorded with a signing key
(``AUDITLOG_KEY``), ``snapshot_every=2``, and ``auditlog export-head r1 -o
head.json`` kept outside the store.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CliResult, invoke, tamper
from torch import nn

import auditlog
from auditlog.core.chain import canonical_payload, chain_hash, genesis_hash
from auditlog.core.eventrow import HASHED_COLUMNS
from auditlog.integrity.keys import generate_key_pair

CHAINED = HASHED_COLUMNS  # the canonical row of the current chain format


@dataclass(frozen=True)
class Trial:
    """A copy of the signed two-run store, ready to be forged."""

    store: Path
    r1: str
    r2: str
    public_key: Path
    head: Path  # exported after r1 ended, kept outside the store

    def cli(self, *args: str) -> CliResult:
        return invoke(*args, "--store", str(self.store))

    def verify(self, *args: str) -> CliResult:
        """``verify --key PUB --against head.json`` (plus ``args``): what an auditor runs."""
        return self.cli("verify", "--key", str(self.public_key), "--against", str(self.head), *args)


def train(
    store: Path, name: str, seed: int, steps: int = 4, annotate: bool = True, **options: Any
) -> str:
    """A small real training run, recorded (with a dataset annotation unless not ``annotate``)."""
    with auditlog.record(store=store, name=name, snapshot_every=2, **options) as run:
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if annotate:
            run.annotate("dataset", name="clean-data", sha256="0" * 64)
        for _ in range(steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    root = tmp_path_factory.mktemp("trial")
    key = generate_key_pair(root / "keys" / "signing_key")
    store = root / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("AUDITLOG_KEY", str(key.private_path))
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        r1 = train(store, "r1", seed=0)
        r2 = train(store, "r2", seed=1)
        head = root / "head.json"
        done = invoke(
            "export-head",
            r1,
            "--key",
            str(key.private_path),
            "-o",
            str(head),
            "--store",
            str(store),
        )
        assert done.exit_code == 0, done.stderr
    with tamper(store):  # fold the WAL back so copies are self-contained
        pass
    return Trial(store, r1, r2, key.public_path, head)


@pytest.fixture
def trial(pristine: Trial, tmp_path: Path) -> Trial:
    """A fresh copy of the signed store for one forgery (the head file stays outside it)."""
    store = tmp_path / "forged"
    shutil.copytree(pristine.store, store, ignore=shutil.ignore_patterns("readmodel.duckdb*"))
    return Trial(store, pristine.r1, pristine.r2, pristine.public_key, pristine.head)


# --------------------------------------------------------------------------- forging events
def rows(conn: sqlite3.Connection, run_id: str, stream: int = 0) -> list[dict[str, Any]]:
    conn.row_factory = sqlite3.Row
    found = conn.execute(
        "select * from events where run_id=? and stream=? order by seq", (run_id, stream)
    )
    return [dict(r) for r in found]


def append_event(
    conn: sqlite3.Connection,
    run_id: str,
    stream: int,
    kind: str,
    payload: Any,
    ts_ns: int = 1_700_000_000_000_000_000,
) -> dict[str, Any]:
    """Append one event to a stream, chained correctly from the stream's last hash."""
    existing = rows(conn, run_id, stream)
    prev = existing[-1]["hash"] if existing else genesis_hash(run_id, stream)
    row = {
        "run_id": run_id,
        "stream": stream,
        "seq": len(existing) + 1,
        "ts_ns": ts_ns,
        "kind": kind,
        "step": existing[-1]["step"] if existing else 0,
        "module_id": None,
        "tensor_id": None,
        "payload": canonical_payload(payload),
    }
    row["hash"] = chain_hash(prev, row)
    conn.execute(
        f"insert into events ({', '.join([*CHAINED, 'hash'])}) values ({', '.join('?' * (len(CHAINED) + 1))})",
        [row[c] for c in (*CHAINED, "hash")],
    )
    return row


def run_started_payload(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    first = rows(conn, run_id)[0]
    assert first["kind"] == "run_started"
    return dict(json.loads(first["payload"]))


# --------------------------------------------------------------------------- snapshots
def snapshot_hashes(store: Path, run_id: str, step: int) -> dict[str, str]:
    """``state_dict key -> content hash`` of the run's snapshot at ``step`` (from the record)."""
    with auditlog.open(store) as opened:
        plan = opened.run(run_id).restore_plan(step=step)
    return {key: sha for key, sha in plan if sha is not None}


def snapshot_path(store: Path, sha: str) -> Path:
    return store / "snapshots" / sha[:2] / f"{sha}.parquet"


def values_shown(store: Path, sha: str, *extra: str) -> tuple[CliResult, list[float]]:
    """What ``query`` answers from ``tensor_values`` for one content hash."""
    result = invoke(
        "query",
        "--store",
        str(store),
        "--format",
        "json",
        *extra,
        f"select value from tensor_values where sha256 = '{sha}' order by \"index\"",
    )
    assert result.exit_code == 0, result.stderr
    return result, [r["value"] for r in json.loads(result.stdout)]


def grad_norm_shown(store: Path, run_id: str) -> Iterator[float]:
    result = invoke(
        "query",
        "--store",
        str(store),
        "--run",
        run_id,
        "--format",
        "json",
        "select grad_norm from steps where step = 1 order by parameter limit 1",
    )
    assert result.exit_code == 0, result.stderr
    for row in json.loads(result.stdout):
        yield float(row["grad_norm"])


def fails(result: CliResult, *words: str, verdict: str = "record altered") -> str:
    """Exit 4 with one ``Error: <verdict>: ...`` line naming ``words``; returns stdout + the line."""
    assert result.exit_code == 4, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {verdict}: "), result.stderr
    text = result.stdout + lines[0]
    for word in words:
        assert word in text, text
    return text
