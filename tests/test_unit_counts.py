"""Zeros and dead units of an activation: the CPU path and the device path agree."""

from __future__ import annotations

import torch

from auditlog.core.tensors import activity_stats, device_stats


def _activation() -> torch.Tensor:
    x = torch.randn(6, 5)
    x[:, 1] = 0.0  # a dead unit (column: the unit dimension of a 2-D output)
    x[2, 3] = -0.0  # a zero that is not a dead unit
    x[4, 0] = float("nan")  # not zero
    return x


def test_cpu_counts_zeros_units_and_dead_units() -> None:
    stats = activity_stats(_activation(), units=True)
    assert isinstance(stats, dict)
    assert stats["zeros"] == 7 and stats["units"] == 5 and stats["dead_units"] == 1


def test_no_zero_means_no_dead_unit_and_4d_counts_channels() -> None:
    stats = activity_stats(torch.ones(2, 3), units=True)
    assert isinstance(stats, dict) and stats["zeros"] == 0 and stats["dead_units"] == 0
    conv = torch.randn(2, 4, 3, 3)
    conv[:, 2] = 0.0  # channel 2 is dead in every sample
    stats = activity_stats(conv, units=True)
    assert isinstance(stats, dict)
    assert stats["zeros"] == 18 and stats["units"] == 4 and stats["dead_units"] == 1


def test_device_path_agrees() -> None:
    x = _activation()
    cpu = activity_stats(x, units=True)
    assert isinstance(cpu, dict)
    device = device_stats(x, True, True).resolve()  # the stacked path CUDA uses, read here
    for key in ("zeros", "units", "dead_units", "nan"):
        assert device[key] == cpu[key], key


def test_cpu_statistics_keys_come_sorted() -> None:
    """The writer's encoder sorts keys: statistics are built in that order already."""
    cases = [_activation(), torch.ones(2, 3), torch.randn(7), torch.tensor(2.0), torch.zeros(0, 4)]
    cases.append(torch.tensor([1.0, float("inf")]))
    for tensor in cases:
        for full in (True, False):
            for units in (True, False):
                stats = activity_stats(tensor, full, units)
                assert isinstance(stats, dict)
                assert list(stats) == sorted(stats), (tuple(tensor.shape), full, units)
