"""The metrics' table of watched loss modules and roots: found again, and forgotten."""

from __future__ import annotations

import gc

import torch

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.context import RecordingContext
from auditlog.capture.flops import FlopCounting
from auditlog.capture.metrics import MetricHooks


def _metrics() -> MetricHooks:
    ctx = RecordingContext(RecordBuffer(maxsize=10**6))
    return MetricHooks(ctx, FlopCounting(ctx))


def test_a_loss_module_is_hooked_once_and_forgotten_when_it_dies() -> None:
    metrics = _metrics()
    loss = torch.nn.MSELoss()
    metrics.watch_call(loss, False)
    metrics.watch_call(loss, False)
    assert len(metrics._metric_handles) == 1  # seen again: not hooked twice
    assert len(metrics._watched) == 1
    del loss
    gc.collect()
    assert not metrics._watched  # a loss built in every step leaves no entry behind


def test_an_inner_module_becomes_a_root_when_called_as_one() -> None:
    metrics = _metrics()
    layer = torch.nn.Linear(2, 2)
    metrics.watch_call(layer, False)
    assert not metrics._watched
    metrics.watch_call(layer, True)
    assert len(metrics._watched) == 1 and not metrics._metric_handles
