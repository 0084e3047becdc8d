"""Every payload a real recording stores matches its kind's definition in auditlog.core.kinds
(fields, types, packing; docs/events.md), under every policy preset and the options that
add events (snapshots, non-finite checks, data loaders); the row columns are defined once
(auditlog.core.eventrow) and every list of them agrees."""

from __future__ import annotations

import json
import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from auditlog.cli.events_cmd import JSON_COLUMNS
from auditlog.cli.summaries import FORMATS, render
from torch import nn
from torch.nn.modules import module as nn_module

import auditlog
from auditlog.archive.write import EVENTS_SCHEMA
from auditlog.core import eventrow
from auditlog.core.chain import CURRENT, chained_row, genesis_hash
from auditlog.core.eventtypes import F32, INT, INTS, NULL, NUM, STR, ListOf, enum, obj
from auditlog.core.kinds import KINDS
from auditlog.integrity.chaincheck import EVENT_TYPES
from auditlog.store import schema
from auditlog.store.eventstore import EventStore
from auditlog.store.queries import TUPLE_COLUMNS
from auditlog.store.readmodel.arrowcopy import EVENT_SCHEMA
from auditlog.store.readmodel.tables import EVENT_COLUMNS_SQL


class _Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(3))


def _train(store: Path, **policy: Any) -> None:
    """Everything the recorder emits on CPU, in one short run (recorder_error aside)."""
    registration_hooks = nn_module._global_module_registration_hooks
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the hooks_removed warning
            with auditlog.record(store, **policy) as run:
                model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
                model.add_module("spare", nn.Linear(2, 2))
                lazy = nn.LazyLinear(
                    2
                )  # parameter_registered lazy, structure_changed when materialized
                lazy_norm = nn.LazyBatchNorm1d()  # buffer_registered lazy
                loss_fn = nn.MSELoss()  # metrics: the loss of every step
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                # module_wrapped (CPU: DataParallel calls the model)
                loss_fn(nn.DataParallel(model)(torch.randn(3, 2)), torch.zeros(3, 2)).backward()
                opt.step()
                model[1].weight.requires_grad_(False)  # no hook: found by the structural check
                del model.spare  # structure_changed removed
                lazy(torch.randn(3, 2))
                lazy_norm(torch.randn(3, 2))
                nn_module._global_module_registration_hooks = (
                    OrderedDict()
                )  # other code drops our hook
                model(torch.randn(3, 2)).sum().backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # raw_grad_norm
                opt.step()
                run.annotate("note", text="hello")
                run.snapshot(model, tag="mid")
                # dataset_seen, loader_started, batches (one under no_grad, one of an iterable dataset)
                data = torch.utils.data.TensorDataset(torch.randn(4, 2), torch.zeros(4, 2))
                with torch.no_grad():
                    for x, _ in torch.utils.data.DataLoader(data, batch_size=2, shuffle=True):
                        model(x)
                list(torch.utils.data.DataLoader(_Stream(), batch_size=2))
                run.log(acc=0.5)
                run.log(val=float("inf"), step=1)
                (model(torch.randn(3, 2)).sum() * float("nan")).backward()  # nonfinite_found
                opt.step()
                scaler = torch.amp.GradScaler("cpu")  # step_skipped: the NaN gradients again
                scaler.scale(model(torch.randn(3, 2)).sum() * float("nan")).backward()
                scaler.step(opt)
                scaler.update()
                # untracked_updates: a model no optimizer holds, updated by hand between backwards
                extra = nn.Linear(2, 2)
                extra(torch.randn(3, 2)).sum().backward()
                with torch.no_grad():
                    extra.weight.sub_(0.1)
                extra(torch.randn(3, 2)).sum().backward()
    finally:
        nn_module._global_module_registration_hooks = registration_hooks


def _stored_payloads(store: Path) -> list[tuple[str, Any]]:
    """``(kind, payload)`` of every stored event, the payload parsed from its stored text
    (packed vectors as stored: the definitions describe the record, not the readers' view)."""
    events = EventStore.open(str(store))
    try:
        return [
            (row["kind"], json.loads(row["payload"]))
            for run_id in events.recorded_run_ids()
            for row in events.iter_events(run_id)
        ]
    finally:
        events.engine.dispose()


POLICIES = {
    "audit": {"policy": "audit"},
    "debug": {"policy": "debug"},
    "minimal": {"policy": "minimal"},
    # snapshots every step (with overruns), the finite state kept, full backward hooks, norm stats
    "snapshots": {
        "snapshot_every": 1,
        "keep_finite_state": True,
        "nonfinite_check": True,
        "backward": "full",
        "stats": "norm",
        "norms_every": 1,
    },
}


# What each policy does not record in this run (recorder_error: the recorder did not fail).
ABSENT = {
    "audit": {"nonfinite_found"},
    "debug": set(),
    # untracked_updates: the hand-updated model is first called after step 0, when minimal has no
    # module hooks to find it by (a loop that never steps keeps step 0's: test_untracked_updates)
    "minimal": {"activity", "nonfinite_found", "untracked_updates"},
    "snapshots": set(),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_stored_payload_matches_its_kind(store: Path, name: str) -> None:
    _train(store, **POLICIES[name])
    payloads = _stored_payloads(store)
    seen = {kind for kind, _ in payloads}
    assert seen <= set(KINDS)
    assert seen >= set(KINDS) - {"recorder_error"} - ABSENT[name]
    problems = [p for kind, payload in payloads for p in KINDS[kind].problems(payload)]
    assert not problems, problems[:10]


def test_a_payload_off_its_definition_is_reported() -> None:
    """The check is not vacuous: a missing field, an unknown one, a wrong type, a list
    where a packed vector belongs and a value outside an enumeration are each found."""
    good = {
        "optimizer_id": 1,
        "optimizer_class": "torch.optim.SGD",
        "optimizer_step": 1,
        "param_groups": [{"lr": 0.1, "params": {"i16": "AQA="}}],
        "tensor_ids": {"i16": "AQA="},
        "grad_norm": {"f32": "AACAPw=="},
        "update_norm": None,
        "param_norm": None,
        "raw_grad_norm": None,
        "grads_modified": False,
        "nonfinite_grads": 0,
    }
    step = KINDS["optimizer_step"]
    assert step.problems(good) == []
    assert step.problems({k: v for k, v in good.items() if k != "nonfinite_grads"}) == [
        "optimizer_step: no 'nonfinite_grads'"
    ]
    assert step.problems({**good, "planted": 1}) == ["optimizer_step: unexpected 'planted'"]
    assert step.problems({**good, "optimizer_id": "1"}) == [
        "optimizer_step.optimizer_id: '1' is not int"
    ]
    assert step.problems({**good, "grad_norm": [1.0]}) == [
        "optimizer_step.grad_norm: [1.0] is not a packed f32 vector"
    ]
    assert step.problems({**good, "param_groups": [{"lr": 0.1, "params": [1]}]}) == [
        "optimizer_step.param_groups[0].params: [1] is not a packed ints vector"
    ]
    ended = {"status": "done", "exit_code": 0, "exception": None, "signal": None, "steps": 1}
    assert KINDS["run_ended"].problems(ended) == [
        "run_ended.status: 'done' is not 'completed' | 'crashed' | 'failed' | 'interrupted'"
    ]


def test_the_type_language() -> None:
    assert list(NUM.problems("NaN", "x")) == [] and list(NUM.problems("nan", "x")) == [
        "x: 'nan' is not number"
    ]
    assert list(INT.problems(True, "x")) == ["x: True is not int"]  # a bool is no int in a payload
    assert list((STR | NULL).problems(None, "x")) == []
    assert list(ListOf(INT).problems([1, "2"], "x")) == ["x[1]: '2' is not int"]
    nested = obj(a=obj(b=INT)) | NULL
    assert list(nested.problems({"a": {"b": "no"}}, "x")) == ["x.a.b: 'no' is not int"]
    assert list(enum("a", "b").problems("c", "x")) == ["x: 'c' is not 'a' | 'b'"]
    assert list(F32.problems({"f32": "AACAPw==", "absent": [0]}, "x")) == []
    assert list(INTS.problems({"i32": "AQAAAA=="}, "x")) == [] and list(
        INTS.problems({"i8": ""}, "x")
    )
    assert (F32 | NULL).packing() == "f32" and INT.packing() is None


def test_packed_fields_come_from_the_definitions() -> None:
    from auditlog.core.packed import NORM_VECTORS
    from auditlog.store.rows import BATCH_LISTS

    assert NORM_VECTORS == ("grad_norm", "update_norm", "param_norm", "raw_grad_norm")
    assert BATCH_LISTS == ("steps", "sizes", "indices")


def test_every_summary_names_fields_of_its_kind() -> None:
    for kind in KINDS.values():
        for when, template in kind.summary:
            places = re.findall(r"\{([^{}:]*)(?::([a-z0-9]+))?\}", template)
            names = [path.split(".")[0] for path, _ in places if path] + (
                [when.split("=")[0]] if when else []
            )
            assert set(names) <= set(kind.fields), (kind.name, template)
            assert {fmt for _, fmt in places if fmt} <= set(FORMATS), (kind.name, template)


def test_a_summary_shows_a_value_never_as_a_template() -> None:
    assert (
        render("{trigger}[ {tag:repr}]", {"trigger": "explicit", "tag": "{trigger}"})
        == "explicit '{trigger}'"
    )
    assert (
        render("{status}[ exit={exit_code}| (exit code unknown)]", {"status": "ok", "exit_code": 0})
        == "ok exit=0"
    )
    assert (
        render("{status}[ exit={exit_code}| (exit code unknown)]", {"status": "x"})
        == "x (exit code unknown)"
    )
    assert render("{a.0.b:num}", {"a": "not a list"}) == "None"


# --------------------------------------------------------------------------- the row, once
def test_every_list_of_event_columns_is_the_definition() -> None:
    assert tuple(c.name for c in schema.events.columns) == eventrow.ALL_COLUMNS
    for column in schema.events.columns:
        assert column.nullable == eventrow.BY_NAME[column.name].nullable
    assert tuple(EVENT_SCHEMA.names) == eventrow.ALL_COLUMNS
    assert tuple(EVENTS_SCHEMA.names) == eventrow.ARCHIVE_COLUMNS
    assert TUPLE_COLUMNS == eventrow.STREAM_COLUMNS
    assert tuple(EVENT_TYPES) == eventrow.STORED_COLUMNS
    row, _ = chained_row(
        genesis_hash("r" * 32, 0), "r" * 32, 0, 1, 1, "annotation", None, None, None, "{}"
    )
    assert tuple(row) == eventrow.STORED_COLUMNS
    assert "snapshot" not in row  # retired with chain v2 (revision 0005)
    assert eventrow.hashed_columns(2) == eventrow.HASHED_COLUMNS == CURRENT.columns
    assert eventrow.hashed_columns(1) == (*eventrow.HASHED_COLUMNS[:-1], "snapshot", "payload")
    assert tuple(c.split()[0] for c in EVENT_COLUMNS_SQL.split(", ")) == eventrow.ALL_COLUMNS
    assert JSON_COLUMNS == (
        "run_id",
        "stream",
        "seq",
        "time",
        "kind",
        "step",
        "module_id",
        "module",
        "tensor_id",
        "tensor",
        "hash",
        "chain_ok",
        "payload",
    )


# Fields these runs cannot reach on one CPU process, and where a test records them.
UNEXERCISED = {
    "run_started": {"signing_key"},  # a signing key configured: tests/test_signed_recording.py
    # a crashed run closed by another: tests/test_cli_interrupts.py; compiled_frames, a compiled
    # training step: tests/test_untracked_updates.py
    "run_ended": {"detected_by", "last_seen", "compiled_frames"},
    "module_registered": {
        "adopted",
        "detected_at",
    },  # modules built before recording: tests/test_construction.py
    "parameter_registered": {"adopted", "detected_at"},
    "buffer_registered": {"adopted", "detected_at"},
    "flops": {"compiled", "skipped"},  # a compiled model: tests/test_behaviour_compiled.py
    # a sampler of non-integer indices (capture/data.py); a batch changed in place before it was
    # hashed: tests/test_data_iterable.py
    "batches": {"opaque", "hash_errors"},
    "recorder_error": {"where", "type", "message"},  # the recorder failing: tests/test_capture.py
}


def test_the_runs_above_exercise_every_field_but_a_known_few(tmp_path: Path) -> None:
    """A field defined and never emitted (renamed, or dropped from the recorder) is found here."""
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for name in ("debug", "snapshots"):
        _train(tmp_path / name, **POLICIES[name])
        for kind, payload in _stored_payloads(tmp_path / name):
            used[kind] |= set(payload)
    unused = {kind: set(KINDS[kind].fields) - used[kind] for kind in KINDS}
    assert {kind: names for kind, names in unused.items() if names} == UNEXERCISED
