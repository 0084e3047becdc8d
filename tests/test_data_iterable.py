"""Iterable datasets: a content hash per batch (core/batchhash.py, capture/data.py), and the
questions over them (``auditlog data --batch-hash``, ``diff``), checked against hashes the
training script computed itself with the public ``auditlog.batch_hash``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_one_line_error, invoke
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import auditlog
from auditlog.capture import data as data_watch
from auditlog.capture.torch_compat import tensor_version
from auditlog.core.batchhash import BatchChanged, BatchContent, batch_hash


def events(store: Path, kind: str) -> list[dict[str, Any]]:
    """The payloads of the run's events of ``kind``, in order."""
    with auditlog.open(store) as s:
        return [e["payload"] for e in s.run().events() if e["kind"] == kind]


class Stream(IterableDataset[dict[str, Any]]):
    """Samples as dicts of a tensor, a label and a name; ``repeat``: sample 3 again at the end
    (so one batch content is drawn twice)."""

    def __init__(self, n: int = 24, seed: int = 1, repeat: bool = False) -> None:
        self.n, self.seed, self.repeat = n, seed, repeat

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(self.seed)
        rows = [torch.randn(4, generator=g) for _ in range(self.n)]
        order = list(range(self.n)) + ([0, 1, 2, 3] if self.repeat else [])
        for i in order:
            yield {"x": rows[i], "y": torch.tensor(i % 2), "name": f"s{i}"}


Truth = list[tuple[int, str]]


def train(loader: DataLoader[Any], run: Any, accumulate: int = 1) -> tuple[Truth, nn.Module]:
    """(the step that trained on it, its hash as the script computes it) per batch."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    truth: Truth = []
    window: list[str] = []
    for i, batch in enumerate(loader):
        window.append(auditlog.batch_hash(batch))
        (model(batch["x"]).squeeze(1) - batch["y"].float()).pow(2).mean().backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
            step = run.step if run is not None else 0
            truth += [(step, h) for h in window]
            window = []
    return truth, model


def recorded(store: Path) -> Truth:
    out: Truth = []
    for p in events(store, "batches"):
        assert p["iterable"] is True and "indices" not in p
        out += [(step + 1, h) for step, h in zip(p["steps"], p["hashes"], strict=True)]
    return out


def test_the_record_holds_the_hash_the_script_computed_for_every_batch_and_its_step(
    store: Path,
) -> None:
    loader = DataLoader(Stream(), batch_size=4)
    with auditlog.record(store) as run:
        truth, _ = train(loader, run, accumulate=2)
    assert len(truth) == 6 and len({h for _, h in truth}) == 6
    assert recorded(store) == truth
    with auditlog.open(store) as s:
        rows = s.query("select step, batch, hash from batches order by seq, batch")
        (dataset,) = s.query("select kind, batches, hashed_batches, distinct_hashes from datasets")
    assert [(r["step"], r["hash"]) for r in rows] == truth
    assert dataset == {"kind": "iterable", "batches": 6, "hashed_batches": 6, "distinct_hashes": 6}
    page = store.parent / "report.html"
    assert invoke("report", "--store", str(store), "-o", str(page)).exit_code == 0
    html = page.read_text()
    section = html[html.index("batches hashed") :]
    assert "distinct hashes" in section and section.index("</table>") > section.index(
        '<td class="num">6</td><td class="num">6</td></tr>'
    )


def test_worker_processes_yield_the_same_hashes(store: Path) -> None:
    loader = DataLoader(
        Stream(), batch_size=6, num_workers=2
    )  # each worker yields the whole stream
    with auditlog.record(store) as run:
        truth, _ = train(loader, run)
    assert len(truth) == 8 and recorded(store) == truth


def test_batch_hash_answers_which_steps_trained_on_a_batch_seen_twice_once_and_never(
    store: Path,
) -> None:
    loader = DataLoader(
        Stream(n=8, repeat=True), batch_size=4
    )  # batch 0's content again as batch 2
    with auditlog.record(store) as run:
        truth, _ = train(loader, run)
    assert truth[0][1] == truth[2][1] != truth[1][1]
    twice = json.loads(
        invoke(
            "data", "--store", str(store), "--batch-hash", truth[0][1], "--format", "json"
        ).stdout
    )
    assert [s["step"] for s in twice["trained_steps"]] == [1, 3] and twice["drawn"] == 2
    once = invoke(
        "data", "--store", str(store), "--batch-hash", truth[1][1][:12]
    )  # a prefix will do
    assert once.exit_code == 0 and once.stdout.rstrip().endswith(
        f"batch {truth[1][1][:16]} was drawn 1 time; trained at step 2"
    )
    never = batch_hash({"x": torch.zeros(4, 4)})
    text = invoke("data", "--store", str(store), "--batch-hash", never).stdout.strip()
    assert text == f"batch {never[:16]} was never drawn (3 batches hashed in this run)"
    assert_one_line_error(
        invoke("data", "--store", str(store), "--batch-hash", "xyz"), 2, "8 to 64 hex digits"
    )


def test_sample_on_an_iterable_dataset_is_refused(store: Path) -> None:
    with auditlog.record(store) as run:
        train(DataLoader(Stream(n=8), batch_size=4), run)
    for args in (
        ("--sample", "3"),
        ("--sample", "3", "--dataset", "Stream"),
        ("--sample", "0", "--dataset", "1"),
    ):
        assert_one_line_error(
            invoke("data", "--store", str(store), *args), 2, "is an IterableDataset", "--batch-hash"
        )


def test_a_recorded_run_trains_bitwise_like_an_unrecorded_one(store: Path) -> None:
    def final(recording: bool) -> tuple[list[torch.Tensor], Truth, torch.Tensor]:
        loader = DataLoader(Stream(), batch_size=4)
        if recording:
            with auditlog.record(store, policy="debug") as run:
                truth, model = train(loader, run)
        else:
            truth, model = train(loader, None)
        return (
            [p.detach().clone() for p in model.parameters()],
            [h for _, h in truth],
            torch.get_rng_state(),
        )

    plain, recorded_run = final(False), final(True)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], recorded_run[0], strict=True))
    assert plain[1] == recorded_run[1] and torch.equal(plain[2], recorded_run[2])


def test_the_minimal_policy_records_no_hashes(store: Path) -> None:
    with auditlog.record(store, policy="minimal") as run:
        train(DataLoader(Stream(n=8), batch_size=4), run)
    (payload,) = events(store, "batches")
    assert payload["count"] == 2 and "hashes" not in payload
    answer = invoke("data", "--store", str(store), "--batch-hash", "0" * 64).stdout
    assert "no batch of this run has a content hash" in answer


def test_every_nth_batch_and_a_batch_changed_in_place_before_it_was_hashed(store: Path) -> None:
    big = data_watch.COPY_BYTES // 4 + 1024  # float32 values: more than is copied (referenced)

    class Large(IterableDataset[torch.Tensor]):
        def __iter__(self) -> Any:
            for i in range(4):
                yield torch.full((big,), float(i))

    with auditlog.record(store, batch_hash_every=2) as run:
        assert run.recorder is not None
        seen = []
        for i, batch in enumerate(DataLoader(Large(), batch_size=None)):
            seen.append(batch_hash(batch))
            if i == 2:
                batch.add_(1)  # changed in place before the writer hashed it
    (payload,) = events(store, "batches")
    assert payload["hashes"] == [seen[0], None, None, None]
    assert payload["hash_errors"] == [
        {
            "position": 2,
            "reason": "a tensor of the batch was modified in place before it was hashed",
        }
    ]


def test_a_batch_of_too_many_python_values_is_recorded_unhashed_with_the_reason(
    store: Path,
) -> None:
    class Tokens(IterableDataset[list[int]]):
        def __iter__(self) -> Any:
            yield list(range(data_watch.ITEMS_WALKED))  # one item more with its list
            yield list(range(8))

    with auditlog.record(store):
        batches = list(DataLoader(Tokens(), batch_size=None, collate_fn=lambda b: b))
    (payload,) = events(store, "batches")
    assert payload["hashes"] == [None, batch_hash(batches[1])]
    assert (
        payload["hash_errors"][0]["position"] == 0
        and "more items" in payload["hash_errors"][0]["reason"]
    )


def test_diff_says_where_two_runs_batches_first_differ(store: Path) -> None:
    for name, seed in (
        ("run-a", 1),
        ("same", 1),
        ("run-b", 2),
    ):  # no hex: an id prefix wins over a name
        with auditlog.record(store, name=name) as run:
            train(DataLoader(Stream(seed=seed), batch_size=4), run)
    same = json.loads(
        invoke("diff", "--store", str(store), "run-a", "same", "--format", "json").stdout
    )["data"]
    assert [c["fields"].keys() for c in same if c["name"] == "loader 1"] == []
    changes = json.loads(
        invoke("diff", "--store", str(store), "run-a", "run-b", "--format", "json").stdout
    )["data"]
    (loader,) = [c for c in changes if c["name"] == "loader 1"]
    assert loader["fields"]["batch_hashes"]["a"].startswith("epoch 0 batch 0: hash ")


def test_the_hash_definition() -> None:
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    # Order of dict keys, strides and device are not part of it; values, dtype, shape and nesting are.
    assert batch_hash({"a": x, "b": [1, "t"]}) == batch_hash(
        {"b": (1, "t"), "a": x.t().contiguous().t()}
    )
    assert batch_hash(x) != batch_hash(x.double()) != batch_hash(x.reshape(3, 2))
    assert batch_hash([x, x]) != batch_hash([x]) and batch_hash({"a": 1}) != batch_hash({"a": True})
    import hashlib
    import struct

    def lp(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    by_hand = hashlib.sha256(
        b"auditlog.batch.v1\n"
        + b"L"
        + struct.pack("<Q", 2)
        + b"T"
        + lp(b"float32")
        + struct.pack("<QQQ", 2, 2, 3)
        + struct.pack("<Q", 24)
        + x.numpy().tobytes()
        + b"S"
        + lp(b"t")
    ).hexdigest()
    assert batch_hash((x, "t")) == by_hand
    y = x.clone()
    content = BatchContent([y], copy_bytes=0, version=tensor_version)  # referenced, not copied
    y.mul_(2)
    with pytest.raises(BatchChanged):
        content.hexdigest()
    z = x.clone()
    copied = BatchContent(
        [z], copy_bytes=1 << 20, version=tensor_version
    )  # copied when taken: a later change is not seen
    z.add_(1)
    assert copied.copied == copied.nbytes == 24 and copied.hexdigest() == batch_hash([x])
