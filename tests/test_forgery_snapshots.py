"""Forgeries of snapshot files and the catalog, and lazily built models (issue 12, gaps 4, 5, 7).

The catalog (``snapshot_blobs``) is a cache: a reader finds a file from its
content hash alone, checks its schema and recomputes its content hash before
using a value. Each forgery here is made with pyarrow and ``sqlite3`` only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import forgery_support
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from forgery_support import (
    Trial,
    fails,
    snapshot_hashes,
    snapshot_path,
    values_shown,
)
from helpers import file_digest, invoke, tamper
from torch import nn

import auditlog
from auditlog.core.errors import IntegrityError

pristine = forgery_support.pristine  # fixtures
trial = forgery_support.trial


# --------------------------------------------------------------------------- 4. the catalog
def test_catalog_pointing_at_a_forged_file_is_caught_and_never_read(trial: Trial) -> None:
    sha = snapshot_hashes(trial.store, trial.r1, 4)["0.weight"]
    true_values = values_shown(trial.store, sha)[1]
    forged = trial.store / "snapshots" / "zz" / f"{sha}.parquet"
    forged.parent.mkdir()
    original = pq.read_table(snapshot_path(trial.store, sha))
    pq.write_table(
        original.set_column(0, "value", pa.array([999.0] * original.num_rows, pa.float32())), forged
    )
    with tamper(trial.store) as conn:
        conn.execute(
            "update snapshot_blobs set file = ?, file_sha256 = ? where sha256 = ?",
            (f"zz/{sha}.parquet", file_digest(forged), sha),
        )
    fails(
        trial.verify(), "0.weight", f"file is 'zz/{sha}.parquet' in the catalog", "catalog edited"
    )
    assert values_shown(trial.store, sha, "--rebuild")[1] == true_values  # the hash names the file


def test_a_second_value_column_of_fakes_is_caught_and_never_read(trial: Trial) -> None:
    sha = snapshot_hashes(trial.store, trial.r1, 4)["0.weight"]
    path = snapshot_path(trial.store, sha)
    true_values = values_shown(trial.store, sha)[1]  # the read model verified the file
    table = pq.read_table(path)
    fakes = pa.array([999.0] * table.num_rows, pa.float32())
    rewritten = pa.table({"true_values": table.column(0), "value": fakes}).replace_schema_metadata(
        table.schema.metadata
    )
    pq.write_table(rewritten, path)
    with tamper(trial.store) as conn:
        conn.execute(
            "update snapshot_blobs set file_sha256 = ? where sha256 = ?", (file_digest(path), sha)
        )
    fails(
        trial.verify(),
        "0.weight",
        "has columns [true_values: float, value: float]",
        "has exactly [value: float]",
    )
    # the read model verified the old file: the changed one is left out, with a warning
    result, shown = values_shown(trial.store, sha)
    assert 999.0 not in shown and shown == []
    assert (
        "left out of tensor_values" in result.stderr
        and "changed since it was verified" in result.stderr
    )
    # rebuilt from scratch, the file fails verification and is never read either
    result, shown = values_shown(trial.store, sha, "--rebuild")
    assert shown == [] and "has columns" in result.stderr
    assert true_values  # it did answer before the forgery


# --------------------------------------------------------------------------- 5. restore trusts file names
def test_a_file_copied_over_another_is_refused_by_restore_and_state_dict(
    trial: Trial, tmp_path: Path
) -> None:
    step2, step4 = (
        snapshot_hashes(trial.store, trial.r1, 2),
        snapshot_hashes(trial.store, trial.r1, 4),
    )
    assert step2["0.weight"] != step4["0.weight"]
    shutil.copyfile(
        snapshot_path(trial.store, step2["0.weight"]), snapshot_path(trial.store, step4["0.weight"])
    )
    fails(trial.verify(), "0.weight", "does not match its name")
    out = tmp_path / "restored.pt"
    result = trial.cli("restore", trial.r1, "--step", "4", "-o", str(out))
    assert result.exit_code == 4, result.stderr
    line = result.stderr.strip()
    assert line.startswith("Error: snapshot of 0.weight at step 4 (snapshots/")
    assert f"{step4['0.weight']}.parquet" in line and "does not hold the recorded content" in line
    assert not out.exists()
    with (
        auditlog.open(trial.store) as opened,
        pytest.raises(IntegrityError, match=r"0\.weight at step 4"),
    ):
        opened.run(trial.r1).state_dict(step=4)
    # the other steps still restore
    assert trial.cli("restore", trial.r1, "--step", "2", "-o", str(out)).exit_code == 0


def test_diff_values_refuses_a_substituted_file(trial: Trial) -> None:
    """The first divergence of the two runs (different seeds) is their initial 0.weight."""
    first_a = snapshot_hashes(trial.store, trial.r1, 0)["0.weight"]
    first_b = snapshot_hashes(trial.store, trial.r2, 0)["0.weight"]
    assert first_a != first_b
    honest = trial.cli("diff", trial.r1, trial.r2, "--values", "--format", "json")
    assert honest.exit_code in (0, 1), honest.stderr
    shutil.copyfile(snapshot_path(trial.store, first_b), snapshot_path(trial.store, first_a))
    result = trial.cli("diff", trial.r1, trial.r2, "--values")
    assert result.exit_code == 4, result.stdout + result.stderr
    assert "0.weight at step 0 of run A" in result.stderr and f"{first_a}.parquet" in result.stderr


# --------------------------------------------------------------------------- 7. lazy modules
def test_lazy_modules_with_the_optimizer_built_first_restore_bitwise(
    store: Path, tmp_path: Path
) -> None:
    with auditlog.record(store=store, snapshot_every=1) as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(2), nn.LazyBatchNorm1d())
        opt = torch.optim.SGD(
            model.parameters(), lr=0.1
        )  # before the first forward: torch allows it
        for _ in range(3):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        live = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert invoke("verify", "--store", str(store)).exit_code == 0
    out = tmp_path / "lazy.pt"
    result = invoke("restore", "--store", str(store), "--step", "3", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    restored = torch.load(out)
    assert list(restored) == list(live)  # keys in order
    for key, value in live.items():
        assert restored[key].dtype == value.dtype and torch.equal(restored[key], value), key
    with auditlog.open(store) as opened:
        events = list(opened.run(str(run.run_id)).events())
    lazy = [e for e in events if e["kind"] == "parameter_registered" and e["payload"].get("lazy")]
    assert {e["payload"]["name"] for e in lazy} == {"weight", "bias"} and len(
        lazy
    ) == 6  # BatchNorm's too
    assert any(e["kind"] == "buffer_registered" and e["payload"].get("lazy") for e in events)
    changed = [e["payload"] for e in events if e["kind"] == "structure_changed"]
    assert {"before": {"shape": None}, "after": {"shape": [8, 4]}}.items() <= changed[0].items()
    (sealed,) = [
        e
        for e in events
        if e["kind"] == "construction_sealed"
        and e["payload"]["tensors"]
        and e["payload"]["trigger"] == "optimizer_step"
    ]
    assert len(sealed["payload"]["tensors"]) >= 4
    assert not [e for e in events if e["kind"] == "recorder_error"]


def test_a_partial_restore_of_nothing_is_an_error(store: Path, tmp_path: Path) -> None:
    with auditlog.record(store=store, snapshot_initial=False, snapshot_final=False):
        model = nn.Linear(2, 2)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    out = tmp_path / "none.pt"
    result = invoke("restore", "--store", str(store), "--allow-partial", "-o", str(out))
    assert result.exit_code == 1, result.stderr
    assert "was snapshotted" in result.stderr and "nothing to restore" in result.stderr
    assert not out.exists()


def test_catalog_rows_are_checked_field_by_field(trial: Trial) -> None:
    sha = snapshot_hashes(trial.store, trial.r1, 2)["0.bias"]
    with tamper(trial.store) as conn:
        conn.execute(
            "update snapshot_blobs set dtype = 'float64', shape = '[4]' where sha256 = ?", (sha,)
        )
    report = json.loads(trial.cli("verify", trial.r1, "--format", "json").stdout)[0]
    whats = [p["what"] for p in report["problems"]]
    expected = "catalog row disagrees with the file: dtype is 'float64' in the catalog, 'float32' by the file"
    assert any(expected in w and "0.bias" in w for w in whats), whats
    assert any("shape is [4] in the catalog, [8] by the file" in w for w in whats)
