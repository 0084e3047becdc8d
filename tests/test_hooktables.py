"""Hooks that other code takes out of torch's global tables are noticed, put back and recorded."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import invoke
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import auditlog

MODULE_TABLES = [
    "_global_buffer_registration_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
]
OPTIMIZER_TABLES = ["_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"]
# What PyTorch's TestModuleGlobalHooks.tearDown replaces.
TEARDOWN_TABLES = ["_global_backward_hooks", "_global_forward_hooks", "_global_forward_pre_hooks"]


@pytest.fixture
def torch_tables() -> Iterator[None]:
    """Put torch's own table objects (and its backward-hook flag) back after the test."""
    saved_module = {name: getattr(nn_module, name) for name in MODULE_TABLES}
    saved_optim = {name: getattr(optim_module, name) for name in OPTIMIZER_TABLES}
    saved_flag = nn_module._global_is_full_backward_hook
    sizes = {name: len(table) for name, table in {**saved_module, **saved_optim}.items()}
    try:
        yield
    finally:
        for name, table in saved_module.items():
            setattr(nn_module, name, table)
        for name, table in saved_optim.items():
            setattr(optim_module, name, table)
        nn_module._global_is_full_backward_hook = saved_flag
        assert sizes == {name: len(t) for name, t in {**saved_module, **saved_optim}.items()}


def replace_tables(*names: str) -> None:
    for name in names:
        owner = optim_module if name in OPTIMIZER_TABLES else nn_module
        setattr(owner, name, OrderedDict())


def events_of(store: Path) -> list[dict[str, Any]]:
    with auditlog.open(store) as s:
        return list(s.run().events())


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_teardown_style_replacement_is_recorded_and_repaired(
    store: Path, torch_tables: None
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with auditlog.record(store, policy="debug"):
            model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            step(model, opt)  # step 1
            replace_tables(*TEARDOWN_TABLES)
            model.add_module("head", nn.Identity())  # the registration hooks are intact
            step(model, opt)  # step 2: its module calls are not seen
            step(model, opt)  # step 3: seen again
            replace_tables(*TEARDOWN_TABLES)
            step(model, opt)  # step 4
            step(model, opt)  # step 5
    mine = [w for w in caught if "auditlog" in str(w.message) and "hooks" in str(w.message)]
    assert len(mine) == 1 and issubclass(mine[0].category, RuntimeWarning)
    events = events_of(store)
    removed = [e for e in events if e["kind"] == "hooks_removed"]
    assert [(e["step"], e["payload"]["since_step"]) for e in removed] == [(2, 1), (4, 3)]
    for event in removed:
        assert sorted(event["payload"]["hooks"]) == ["forward", "forward_pre"]
        assert sorted(event["payload"]["reinstalled"]) == ["forward", "forward_pre"]
        assert (
            event["payload"]["stopped"] == {}
            and event["payload"]["detected_at"] == "optimizer_step"
        )
    activity_steps = sorted(e["step"] for e in events if e["kind"] == "activity")
    assert activity_steps == [0, 2, 4]  # steps 1 and 3 (0-based: the 2nd and 4th) had no hooks
    assert any(e["kind"] == "module_registered" and e["payload"]["name"] == "head" for e in events)
    # the run's report says its record has a gap
    page = store.parent / "report.html"
    assert invoke("report", "--store", str(store), "latest", "-o", str(page)).exit_code == 0
    assert "other code removed auditlog&#x27;s hooks" in page.read_text()
    assert "recorder_error" not in {e["kind"] for e in events}


def test_every_table_replaced_is_found_at_run_end(store: Path, torch_tables: None) -> None:
    """Acceptance: with every table gone, modules added afterwards are still in the
    record (the run-end structural check) and an event says the hooks were removed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with auditlog.record(store, policy="debug"):
            model = nn.Sequential(nn.Linear(3, 3))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            step(model, opt)
            step(model, opt)
            replace_tables(*MODULE_TABLES, *OPTIMIZER_TABLES)
            model.append(nn.Linear(3, 3))  # no hook sees this
            step(model, opt)
    events = events_of(store)
    removed = [e for e in events if e["kind"] == "hooks_removed"]
    assert len(removed) == 1
    payload = removed[0]["payload"]
    assert payload["detected_at"] == "run_end" and payload["since_step"] == 2
    assert payload["reinstalled"] == [] and payload["stopped"] == {}
    assert set(payload["hooks"]) == {
        "module_registration", "parameter_registration", "buffer_registration",
        "optimizer_step_pre", "optimizer_step_post", "forward_pre", "forward",
    }  # fmt: skip
    added = [e for e in events if e["kind"] == "module_registered" and e["payload"]["name"] == "1"]
    assert len(added) == 1 and added[0]["payload"]["detected_at"] == "run_end"
    ended = events[-1]
    assert ended["kind"] == "run_ended" and ended["payload"]["status"] == "completed"


def test_a_table_put_back_is_not_reported_and_hooks_fire_once(
    store: Path, torch_tables: None
) -> None:
    with auditlog.record(store, policy="debug"):
        model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step(model, opt)
        saved = nn_module._global_forward_hooks
        nn_module._global_forward_hooks = OrderedDict(saved)  # a copy holding our entry
        step(model, opt)
        nn_module._global_forward_hooks = OrderedDict()
        nn_module._global_forward_hooks = saved  # put back before anyone looked
        step(model, opt)
        copy = OrderedDict(saved)
        nn_module._global_forward_hooks = copy
    # recording over: nothing of ours is left, in the copy torch uses now either
    assert len(copy) == 0
    events = events_of(store)
    assert "hooks_removed" not in {e["kind"] for e in events}
    with auditlog.open(store) as s:
        forward = list(s.run().module_calls("forward"))
    assert len(forward) == 3 * 3  # each call recorded once, never twice


def test_a_kind_torch_refuses_to_take_back_is_stopped_and_said(
    store: Path, torch_tables: None
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # every other step sampled: the per-call hooks leave and come back, and the
        # refused kind stays out when they come back
        with auditlog.record(store, policy="debug", backward="full", activity_every=2):
            model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            step(model, opt)
            step(model, opt)
            replace_tables("_global_backward_hooks", "_global_backward_pre_hooks")
            nn_module._global_is_full_backward_hook = None
            legacy_calls: list[str] = []
            nn_module.register_module_backward_hook(
                lambda m, gi, go: legacy_calls.append(type(m).__name__)
            )
            step(model, opt)  # found here: full backward cannot coexist with the legacy hook
            for _ in range(4):
                step(model, opt)
    events = events_of(store)
    removed = [e for e in events if e["kind"] == "hooks_removed"]
    assert [e["step"] for e in removed] == [3]
    payload = removed[0]["payload"]
    assert payload["reinstalled"] == ["full_backward_pre"]
    assert list(payload["stopped"]) == ["full_backward"]
    assert (
        "Cannot use both regular backward hooks and full backward hooks"
        in payload["stopped"]["full_backward"]
    )
    assert legacy_calls  # the user's hook kept working
    assert sum("put back ['full_backward_pre']" in str(w.message) for w in caught) == 1
    assert "recorder_error" not in {e["kind"] for e in events}
