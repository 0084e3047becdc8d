"""Run a behaviour twice, plain and under one recording, and compare what the user sees.

A behaviour is a function of no arguments that does what a user program does
(register hooks, train, load state dicts, swap parameters) and returns what the
program can observe: hook call orders, tensors, exception messages. It runs once
plain and once inside ``auditlog.record(...)``, each after ``torch.manual_seed(0)``;
the two outcomes must be equal, tensors bitwise. The recorded run must also leave
no recorder fault and leave torch's global hook tables as it found them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import auditlog
from auditlog.capture import loader_compat
from auditlog.capture.torch_compat import GLOBAL_HOOK_TABLES


@dataclass(frozen=True)
class Raised:
    """An exception the behaviour let out, as the user would see it."""

    type: str
    message: str


def outcome_of(behaviour: Callable[[], Any]) -> Any:
    torch.manual_seed(0)
    try:
        return behaviour()
    except Exception as exc:
        return Raised(type(exc).__name__, str(exc))


def table_sizes() -> dict[str, int]:
    return {name: len(table()) for name, table in GLOBAL_HOOK_TABLES.items()}


def assert_same(plain: Any, recorded: Any, where: str = "outcome") -> None:
    """Equal values; tensors equal bitwise, with the same dtype, shape and class."""
    if isinstance(plain, torch.Tensor):
        assert isinstance(recorded, torch.Tensor), (
            f"{where}: {type(recorded).__name__} instead of a tensor"
        )
        assert type(plain) is type(recorded), (
            f"{where}: {type(recorded).__name__} != {type(plain).__name__}"
        )
        assert plain.dtype == recorded.dtype and plain.shape == recorded.shape, where
        assert torch.equal(plain.detach(), recorded.detach()), f"{where}: values differ"
        return
    if isinstance(plain, dict):
        assert isinstance(recorded, dict) and plain.keys() == recorded.keys(), (
            f"{where}: keys differ"
        )
        for key in plain:
            assert_same(plain[key], recorded[key], f"{where}[{key!r}]")
        return
    if isinstance(plain, (list, tuple)):
        assert type(plain) is type(recorded) and len(plain) == len(recorded), (
            f"{where}: {plain!r} != {recorded!r}"
        )
        for i, (a, b) in enumerate(zip(plain, recorded, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
        return
    assert plain == recorded, f"{where}: plain {plain!r} != recorded {recorded!r}"


def loader_methods() -> tuple[Any, ...]:
    """The DataLoader methods the data watch wraps while recording (capture/data.py)."""
    iterator = loader_compat.ITERATOR_CLASS
    names = (loader_compat.DRAW_METHOD, loader_compat.RESET_METHOD, loader_compat.NEXT_METHOD)
    return (torch.utils.data.DataLoader.__iter__, *(iterator.__dict__[name] for name in names))


def run_twice(behaviour: Callable[[], Any], store: Path, policy: str) -> Any:
    """The behaviour's outcome, after checking it is the same with a recording open."""
    flag = nn_module._global_is_full_backward_hook
    backward, scale, scaler_step = (
        torch.autograd.backward,
        torch.amp.GradScaler.scale,
        torch.amp.GradScaler.step,
    )
    loading = loader_methods()
    before = table_sizes()
    plain = outcome_of(behaviour)
    assert table_sizes() == before, "the behaviour left global hooks behind (plain run)"
    module_init = torch.nn.Module.__dict__["__init__"]  # after the plain run: dynamo wraps it once
    with auditlog.record(store, policy=policy) as recording:
        recorded = outcome_of(behaviour)
        recorder = recording.recorder
        assert recorder is not None
        faults = recorder.ctx.faults
    assert table_sizes() == before, "global hook tables differ after the recording"
    assert nn_module._global_is_full_backward_hook is flag
    assert torch.autograd.backward is backward, "torch.autograd.backward was not put back"
    assert torch.nn.Module.__dict__["__init__"] is module_init, (
        "nn.Module.__init__ was not put back"
    )
    assert (torch.amp.GradScaler.scale, torch.amp.GradScaler.step) == (scale, scaler_step)
    assert loader_methods() == loading, "the DataLoader methods were not put back"
    assert optim_module._global_optimizer_pre_hooks is GLOBAL_HOOK_TABLES["optimizer_step_pre"]()
    assert_same(plain, recorded)
    assert faults == 0, "the recorder recorded a fault of its own"
    return plain
