"""What data trained the model (capture/data.py, capture/datasets.py): the record of
every DataLoader iteration equals what the script itself saw.

Ground truth comes from inside the training loop: each dataset returns its own
sample index beside the sample, so the script knows exactly which indices every
batch held (whatever sampler, workers or accumulation drew them) and which
optimizer step consumed them.
"""

from __future__ import annotations

import warnings
from array import array
from pathlib import Path
from typing import Any

import pytest
import torch
from data_support import Folder, Truth, events, indexed_tensors, train, write_folder
from torch import nn
from torch.utils.data import DataLoader, Dataset

import auditlog
from auditlog.capture import loader_compat
from auditlog.capture.data import pack_int_array
from auditlog.core.packed import pack_ints, unpack_ints


def recorded(store: Path) -> Truth:
    """(consuming step, indices) per recorded batch, decoded from the batches events."""
    out: Truth = []
    for p in events(store, "batches"):
        flat = iter(p["indices"])
        for step, size in zip(p["steps"], p["sizes"], strict=True):
            out.append((step + 1, [next(flat) for _ in range(size)]))
    return out


def test_plain_loop_records_the_indices_of_every_batch_and_the_step_they_trained(
    store: Path,
) -> None:
    loader = DataLoader(
        indexed_tensors(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7)
    )
    with auditlog.record(store) as run:
        truth = train(loader, run, epochs=2)
    assert recorded(store) == truth and len(truth) == 10
    started = events(store, "loader_started")
    assert [s["epoch"] for s in started] == [0, 1]
    config = started[0]["config"]
    assert config["batch_size"] == 8 and config["shuffle"] is True and config["generator_seed"] == 7
    assert (
        config["sampler"].endswith("RandomSampler")
        and config["num_workers"] == 0
        and config["batches"] == 5
    )
    (seen,) = events(store, "dataset_seen")
    assert (
        seen["class"].endswith("TensorDataset") and seen["length"] == 40 and seen["kind"] == "map"
    )
    identity = seen["identity"]
    assert identity["method"] == "tensors" and len(identity["fingerprint"]) == 64
    assert identity["tensors"][1] == {
        "shape": [40],
        "dtype": "int64",
        "device": "cpu",
        "sha256": auditlog.tensor_hash(torch.arange(40)),
    }


def test_accumulated_batches_are_tied_to_the_step_that_consumed_them(store: Path) -> None:
    loader = DataLoader(
        indexed_tensors(48), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    with auditlog.record(store) as run:
        truth = train(loader, run, accumulate=3)
    assert recorded(store) == truth
    assert [step for step, _ in truth] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]


def test_batches_of_a_loop_left_early_are_kept(store: Path) -> None:
    # A loop that breaks drops its iterator before the end: its batches are still recorded.
    loader = DataLoader(
        indexed_tensors(40), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(9)
    )
    truth: Truth = []
    with auditlog.record(store) as run:
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for limit in (3, 4):
            for i, (x, index) in enumerate(loader):
                model(x).sum().backward()
                opt.step()
                truth.append((run.step, index.tolist()))
                if i + 1 == limit:
                    break
    assert recorded(store) == truth and len(truth) == 7


@pytest.mark.parametrize(
    "values", [[], [0, 1, -1], [32767, -32768], [40000, 1], [2**31, -5], [-(2**63), 2**63 - 1]]
)
def test_the_writers_packing_of_indices_is_pack_ints(values: list[int]) -> None:
    packed = pack_int_array(array("q", values))
    assert packed == pack_ints(values) and unpack_ints(packed) == values


def test_worker_processes_do_not_change_which_indices_are_recorded(store: Path) -> None:
    # Two workers prefetch four batches ahead; the indices still come from the main
    # process and pair with the batches in order. persistent_workers: the second
    # epoch resets the same iterator after the first was left early.
    loader = DataLoader(
        indexed_tensors(64),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(5),
    )
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    truth: Truth = []
    with auditlog.record(store) as run:
        for epoch in range(2):
            for i, (x, index) in enumerate(loader):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                truth.append((run.step, index.tolist()))
                if epoch == 0 and i == 4:
                    break  # the indices prefetched for the rest of this epoch never left the loader
    assert recorded(store) == truth and len(truth) == 5 + 16
    config = events(store, "loader_started")[1]["config"]
    assert config["num_workers"] == 2 and config["persistent_workers"] is True


def test_recording_changes_no_batch_and_no_random_state(tmp_path: Path) -> None:
    def behaviour() -> Any:
        generator = torch.Generator().manual_seed(11)
        loader = DataLoader(
            indexed_tensors(30), batch_size=4, shuffle=True, generator=generator, drop_last=True
        )
        unseeded = DataLoader(
            indexed_tensors(30), batch_size=5, shuffle=True
        )  # draws from the global RNG
        seen = [index for _, index in loader] + [index for _, index in unseeded]
        seen += [index for _, index in loader]
        return seen, generator.get_state(), torch.get_rng_state()

    from behaviour_support import run_twice

    plain = run_twice(behaviour, tmp_path / "store", "audit")
    assert len(plain[0]) == 7 + 6 + 7


def test_the_originals_are_back_after_the_recording(store: Path) -> None:
    iterator_class = loader_compat.ITERATOR_CLASS
    before = (
        DataLoader.__iter__,
        iterator_class.__next__,
        iterator_class._next_index,
        iterator_class._reset,
    )
    with auditlog.record(store):
        assert DataLoader.__iter__ is not before[0]
    assert (
        DataLoader.__iter__,
        iterator_class.__next__,
        iterator_class._next_index,
        iterator_class._reset,
    ) == before


def _fingerprint(store: Path) -> dict[str, Any]:
    (seen,) = events(store, "dataset_seen")
    identity: dict[str, Any] = seen["identity"]
    return identity


def test_a_folder_dataset_is_identified_by_its_files_and_one_changed_byte_changes_it(
    tmp_path: Path,
) -> None:
    root = write_folder(tmp_path / "data")
    fingerprints = []
    for attempt in range(3):
        if attempt == 2:
            target = root / "1" / "3.bin"
            data = bytearray(target.read_bytes())
            data[10] ^= 1
            target.write_bytes(bytes(data))
        store = tmp_path / f"store{attempt}"
        loader = DataLoader(
            Folder(root), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(2)
        )
        with auditlog.record(store) as run:
            truth = train(loader, run)
        assert recorded(store) == truth
        fingerprints.append(_fingerprint(store))
    first, same, changed = fingerprints
    assert (
        first["method"] == "files"
        and first["attribute"] == "samples"
        and first["root"] == str(root)
    )
    assert first["files_total"] == 12 and first["bytes_total"] == 12 * 64
    assert first["hashing"]["methods"] == {"sha256": 12}
    assert first["fingerprint"] == same["fingerprint"]
    assert changed["fingerprint"] != first["fingerprint"]
    differ = [a["path"] for a, b in zip(first["files"], changed["files"], strict=True) if a != b]
    assert differ == [str(root / "1" / "3.bin")]


def test_what_cannot_be_identified_is_recorded_as_such_with_the_reason(store: Path) -> None:
    class Squares(Dataset[int]):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, index: int) -> int:
            return index * index

    class Stream(torch.utils.data.IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(5))

    with auditlog.record(store):
        assert [int(b.sum()) for b in DataLoader(Squares(), batch_size=3)] == [5, 50]
        assert [b.tolist() for b in DataLoader(Stream(), batch_size=2)] == [[0, 1], [2, 3], [4]]
    seen = events(store, "dataset_seen")
    assert [s["identity"]["method"] for s in seen] == ["unidentified", "unidentified"]
    assert "IterableDataset" in seen[1]["identity"]["reason"] and seen[1]["kind"] == "iterable"
    assert seen[0]["identity"]["fingerprint"] is None
    iterable = events(store, "batches")[1]
    assert iterable["iterable"] is True and iterable["count"] == 3 and "indices" not in iterable


def test_a_subset_names_its_dataset_and_batches_under_no_grad_are_marked(store: Path) -> None:
    data = indexed_tensors(20)
    subset = torch.utils.data.Subset(data, list(range(10, 20)))
    with auditlog.record(store):
        with torch.no_grad():
            got = [index.tolist() for _, index in DataLoader(subset, batch_size=5)]
    assert got == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
    identity = _fingerprint(store)
    assert identity["method"] == "subset" and identity["indices"] == 10
    assert identity["of"]["method"] == "tensors" and identity["of"]["length"] == 20
    (batches,) = events(store, "batches")
    assert batches["indices"] == list(range(10)) and batches["no_grad"] == [0, 1]


def test_a_failing_part_of_the_watch_is_a_recorder_error_and_training_goes_on(store: Path) -> None:
    class Planted(torch.utils.data.Sampler[int]):
        """A sampler the loader uses as usual, with an attribute the watch reads that fails."""

        def __len__(self) -> int:
            return 8

        def __iter__(self) -> Any:
            return iter(range(8))

        @property
        def generator(self) -> Any:
            raise RuntimeError("planted")

    loader = DataLoader(indexed_tensors(8), batch_size=4, sampler=Planted())
    with warnings.catch_warnings(record=True), auditlog.record(store):
        got = [index.tolist() for _, index in loader]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [e["where"] for e in events(store, "recorder_error")] == ["dataloader_iter"]
    assert [b["indices"] for b in events(store, "batches")] == [list(range(8))]
