"""``auditlog data``, the ``datasets`` and ``batches`` views, and the data section of
``auditlog diff``: answers checked against what the training script itself saw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from data_support import Folder, indexed_tensors, train, write_folder
from helpers import assert_one_line_error, invoke
from torch import nn
from torch.utils.data import DataLoader

import auditlog


def _fixed_order_run(store: Path) -> list[tuple[int, list[int]]]:
    """Sample 3 drawn twice (steps 1 and 2), 5 once (step 1), 7 never; then an evaluation
    pass under no_grad that draws 7 (no step trains on it)."""
    data = indexed_tensors(10)
    loader = DataLoader(data, batch_size=2, sampler=[3, 5, 3, 1, 0, 2])
    with auditlog.record(store, name="fixed") as run:
        truth = train(loader, run)
        with torch.no_grad():
            for x, _ in DataLoader(data, batch_size=2, sampler=[7, 8]):
                nn.Linear(4, 1)(x)
    return truth


def test_data_sample_answers_twice_once_and_never(store: Path) -> None:
    truth = _fixed_order_run(store)
    assert truth == [(1, [3, 5]), (2, [3, 1]), (3, [0, 2])]
    for sample, steps in ((3, [1, 2]), (5, [1]), (9, [])):
        expected = sorted({step for step, indices in truth if sample in indices})
        assert expected == steps  # the script's own answer
        result = invoke(
            "data", "--store", str(store), "latest", "--sample", str(sample), "--format", "json"
        )
        assert result.exit_code == 0, result.stderr
        answer = json.loads(result.stdout)
        assert [s["step"] for s in answer["trained_steps"]] == steps
        assert answer["drawn"] == len(steps)
    text = invoke("data", "--store", str(store), "--sample", "3", "--dataset", "1").stdout
    assert text.rstrip().endswith("sample 3 was drawn 2 times; trained at step 1, step 2")
    assert (
        invoke("data", "--store", str(store), "--sample", "9").stdout.strip()
        == "sample 9 was never drawn"
    )
    # Sample 7 of the evaluation pass: drawn, under no_grad, trained at no step.
    seven = json.loads(
        invoke("data", "--store", str(store), "--sample", "7", "--format", "json").stdout
    )
    assert (
        seven["drawn"] == 1
        and seven["trained_steps"] == []
        and seven["batches"][0]["no_grad"] is True
    )
    beyond = invoke(
        "data", "--store", str(store), "--sample", "99", "--dataset", "TensorDataset"
    ).stdout
    assert "never drawn (beyond every dataset's length: 10)" in beyond


def test_data_lists_datasets_loaders_and_coverage(store: Path) -> None:
    _fixed_order_run(store)
    result = invoke("data", "--store", str(store), "--format", "json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    (dataset,) = summary["datasets"]  # one dataset object, iterated by two loaders
    assert dataset["class"].endswith("TensorDataset") and dataset["method"] == "tensors"
    assert (
        dataset["epochs"],
        dataset["batches"],
        dataset["samples_drawn"],
        dataset["distinct_samples"],
    ) == (2, 4, 8, 7)
    assert dataset["coverage"] == 0.7
    assert [
        (lo["loader_id"], lo["epochs"], lo["config"]["batch_size"]) for lo in summary["loaders"]
    ] == [(1, 1, 2), (2, 1, 2)]
    table = invoke("data", "--store", str(store)).stdout
    assert "TensorDataset" in table and "70.0%" in table and "loaders" in table


def test_the_batches_view_holds_every_batch_with_its_step(store: Path) -> None:
    _fixed_order_run(store)
    with auditlog.open(store) as s:
        rows = s.query(
            "select step, after_step, batch, indices, no_grad from batches order by seq, batch"
        )
    assert [tuple(r.values()) for r in rows] == [
        (1, 0, 0, [3, 5], False),
        (2, 1, 1, [3, 1], False),
        (3, 2, 2, [0, 2], False),
        (None, 3, 0, [7, 8], True),
    ]
    schema = json.loads(invoke("schema", "--format", "json").stdout)
    assert {"datasets", "batches"} <= {v["view"] for v in schema}


def test_data_refuses_an_unknown_dataset_and_dataset_without_sample(store: Path) -> None:
    _fixed_order_run(store)
    result = invoke("data", "--store", str(store), "--sample", "1", "--dataset", "Nope")
    assert_one_line_error(result, 2, "no dataset 'Nope'", "1 (TensorDataset)")
    assert_one_line_error(
        invoke("data", "--store", str(store), "--dataset", "1"), 2, "--dataset needs --sample"
    )


def _folder_run(store: Path, root: Path, name: str) -> Any:
    loader = DataLoader(
        Folder(root), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(2)
    )
    with auditlog.record(store, name=name) as run:
        train(loader, run)


def test_diff_names_the_dataset_whose_file_changed(store: Path, tmp_path: Path) -> None:
    root = write_folder(tmp_path / "data")
    _folder_run(store, root, "before")
    _folder_run(store, root, "same")
    target = root / "0" / "2.bin"
    target.write_bytes(b"\xff" + target.read_bytes()[1:])  # one byte of one file
    _folder_run(store, root, "after")
    same = json.loads(
        invoke("diff", "--store", str(store), "before", "same", "--format", "json").stdout
    )
    assert same["data"] == []
    result = invoke("diff", "--store", str(store), "before", "after", "--format", "json")
    (change,) = json.loads(result.stdout)["data"]
    assert change["name"] == "dataset 1 (Folder)" and change["change"] == "changed"
    assert set(change["fields"]) == {"fingerprint", "files"} and change["fields"]["files"][
        "b"
    ] == str(target)
    text = invoke("diff", "--store", str(store), "before", "after").stdout
    assert "Data" in text and "dataset 1 (Folder)" in text and "2.bin" in text


def test_diff_says_where_sampling_diverged(store: Path) -> None:
    # Names that are no hex: a run id prefix wins over a name ("a" would select a run whose id starts so).
    for name, seed in (("run-a", 1), ("run-b", 2)):
        loader = DataLoader(
            indexed_tensors(12),
            batch_size=3,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
        )
        with auditlog.record(store, name=name) as run:
            train(loader, run)
    (change,) = json.loads(
        invoke("diff", "--store", str(store), "run-a", "run-b", "--format", "json").stdout
    )["data"]
    assert change["name"] == "loader 1"
    assert change["fields"]["generator_seed"] == {"a": 1, "b": 2}
    assert change["fields"]["sampling"]["a"].startswith("epoch 0 batch 0: ")
