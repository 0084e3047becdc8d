"""Host buffers kept between periodic snapshots (capture/hostbuffers.py): reused only once
the writer is done with them, at most one snapshot's worth, and every snapshot still exact."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

import auditlog
from auditlog.capture.hostbuffers import HostBuffers, poolable


def test_a_kept_buffer_is_reused_for_the_same_shape_and_dtype_only() -> None:
    buffers = HostBuffers()
    source = torch.arange(12.0).reshape(3, 4)
    first = buffers.copy_of(source)
    assert torch.equal(first, source) and first.data_ptr() != source.data_ptr()
    assert buffers.held_bytes == 0  # nothing is kept before the writer gives it back
    buffers.give([first])
    assert buffers.held_bytes == 12 * 4
    changed = source * 2
    second = buffers.copy_of(changed)
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, changed)
    assert buffers.held_bytes == 0  # handed out: no longer kept
    buffers.give([second])
    other = buffers.copy_of(torch.ones(4, 3))  # another shape: a fresh copy
    assert other.data_ptr() != second.data_ptr() and torch.equal(other, torch.ones(4, 3))
    other_dtype = buffers.copy_of(torch.ones(3, 4, dtype=torch.float64))
    assert other_dtype.data_ptr() != second.data_ptr() and other_dtype.dtype == torch.float64


def test_a_non_contiguous_source_is_copied_in_c_order() -> None:
    buffers = HostBuffers()
    kept = torch.empty(4, 3)
    buffers.give([kept])
    source = torch.arange(12.0).reshape(3, 4).t()  # strides (1, 4)
    copy = buffers.copy_of(source)
    assert copy.data_ptr() == kept.data_ptr() and copy.is_contiguous() and torch.equal(copy, source)
    fresh = buffers.copy_of(source)  # nothing kept any more: a clone, also C-contiguous
    assert fresh.is_contiguous() and torch.equal(fresh, source)


def test_give_replaces_what_is_kept_and_close_keeps_nothing() -> None:
    buffers = HostBuffers()
    buffers.give([torch.empty(100), torch.empty(100)])
    assert buffers.held_bytes == 800
    buffers.give(
        [torch.empty(10)]
    )  # the last snapshot's copies only: never more than one snapshot's worth
    assert buffers.held_bytes == 40
    buffers.drop_unused()  # the next snapshot took what fitted: the rest goes
    assert buffers.held_bytes == 0
    buffers.give([torch.empty(10)])
    buffers.close()
    assert buffers.held_bytes == 0
    buffers.give([torch.empty(10)])  # a snapshot finishing after the recording ended
    assert buffers.held_bytes == 0


def test_only_plain_dense_cpu_tensors_are_kept() -> None:
    assert poolable(torch.zeros(3)) and poolable(nn.Parameter(torch.zeros(3)))
    assert not poolable(torch.zeros(3).to_sparse())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated, still made
        quantized = torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.quint8)
    assert not poolable(quantized)

    class Marked(torch.Tensor):
        pass

    assert not poolable(torch.zeros(3).as_subclass(Marked))


def test_periodic_snapshots_reuse_buffers_and_restore_bitwise(tmp_path: Path) -> None:
    """Every step's snapshot is the state of that step although the host copies of one
    snapshot are the buffers of the next; one snapshot's worth is kept during the run,
    nothing after it."""
    store = tmp_path / "store.db"
    torch.manual_seed(0)
    live: dict[int, dict[str, torch.Tensor]] = {}
    held: list[int] = []
    with auditlog.record(store, snapshot_every=1) as recording:
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        model.register_buffer("count", torch.zeros((), dtype=torch.int64))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        recorder = recording.recorder
        assert recorder is not None
        for step in range(1, 7):
            model(torch.randn(16, 64)).pow(2).mean().backward()
            model.count += 1  # a buffer changes too (the snapshot is taken in the step's post hook)
            opt.step()
            opt.zero_grad()
            live[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            recording.flush()
            held.append(recorder.roots.host_buffers.held_bytes)
    state_bytes = sum(t.numel() * t.element_size() for t in live[1].values())
    assert held[0] == state_bytes and all(
        h == state_bytes for h in held
    )  # one snapshot's copies, kept
    assert recorder.roots.host_buffers.held_bytes == 0  # let go when the recording ended
    with auditlog.open(store) as opened:
        run = opened.run()
        for step, expected in live.items():
            restored = run.state_dict(step=step)
            assert restored.keys() == expected.keys()
            for key, value in expected.items():
                assert restored[key].dtype == value.dtype and torch.equal(restored[key], value), (
                    step,
                    key,
                )
        assert run.verify().ok


def test_buffers_of_tensors_that_are_gone_are_let_go_by_the_next_snapshot(tmp_path: Path) -> None:
    """A model replaced between snapshots: the old model's kept copies fit nothing and are
    dropped when the next snapshot is taken, not kept beside its copies."""
    with auditlog.record(tmp_path / "store.db", snapshot_every=1) as recording:
        recorder = recording.recorder
        assert recorder is not None
        model = nn.Linear(32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 32)).sum().backward()
        opt.step()
        recording.flush()
        assert recorder.roots.host_buffers.held_bytes == (32 * 32 + 32) * 4
        model = nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        recording.flush()
        held = recorder.roots.host_buffers.held_bytes
    assert held == (16 * 16 + 16) * 4  # the new model's copies only


def test_without_periodic_snapshots_nothing_is_kept(tmp_path: Path) -> None:
    with auditlog.record(tmp_path / "store.db") as recording:
        model = nn.Linear(8, 8)
        recording.snapshot(model, tag="manual")
        recording.flush()
        assert (
            recording.recorder is not None and recording.recorder.roots.host_buffers.held_bytes == 0
        )
