"""What differs between two runs: construction, hyperparameters, code and environment.

The question this answers is "what did I change?", typically between two
recordings of one script at two code versions. It is answered from the record
alone, as data (``RunDiff``); the CLI renders it.

- **Construction** is replayed for each run (stream 0) and labelled the way the
  views label it (``auditlog.naming``). Modules, parameters and buffers are
  aligned by qualified name: present on one side only is added/removed; on both
  sides, class, shape, dtype, device, requires_grad/persistent, source location
  and initial values are compared. A module that disappeared under one name and
  appeared under another with the same class, the same subtree (classes, tensor
  names, shapes, dtypes) and the same source file and function is reported as a
  probable **rename**, and its contents are compared under the new name instead
  of being listed as removed and added.
- **Source locations** are compared relative to each run's git root (or working
  directory), so the same code checked out in two places compares equal.
- **Initial values.** Equal content hashes are equal. Different hashes with
  different shapes are already a shape change. Different hashes with the same
  shape are a change only when the statistics say the *distribution* changed
  (standard deviation or mean beyond sampling noise for that many elements, or
  NaN/Inf appearing): a code change that consumes the random generator
  differently redraws every later initializer from the same distribution, and
  listing those as "changed init" would bury the real change. Such tensors are
  reported separately as ``init_values_differ``.
- **Hyperparameters**: each optimizer (in order of its first step) and param
  group at its first step, the parameters in each group (by name), and the
  learning rate at every later step (the first step where schedules diverge).
- **Code and environment**: git commit, branch, dirty flag and diff hash;
  argv, Python/torch/CUDA versions, platform, host, user, working directory,
  world size, capture policy, the torch seed in effect (``manual_seed``, else
  the process's random seed), and the outcome (status, steps).

- **Values** (``first_divergence``, ``auditlog diff --values``): the first
  optimizer step, among the steps both runs snapshotted, and the first tensor in
  ``state_dict`` order at that step, whose stored values differ (bitwise, or
  beyond ``atol``/``rtol``). Content hashes decide equality without reading a
  file; only differing tensors are loaded.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from sqlalchemy import func, select

from auditlog.naming import Labels, attached_ids, label_state, short_class
from auditlog.reader import Run, pick_snapshot
from auditlog.replay import CONSTRUCTION_KINDS, ModelState, replay
from auditlog.runs import iso
from auditlog.snapshots import BlobInfo, SnapshotError, SnapshotStore, blob_from_row
from auditlog.store import schema
from auditlog.store.eventstore import EventStore
from auditlog.tensors import stat_float

Progress = Callable[[int, int], None]

SECTIONS = ("code", "modules", "parameters", "buffers", "hyperparameters", "metadata")

# Run metadata compared (run_started payload keys; dotted for nested).
METADATA_STARTED = (
    "argv",
    "python",
    "torch",
    "cuda",
    "platform",
    "host",
    "user",
    "cwd",
    "world_size",
    "policy",
    "auditlog",
)
METADATA_ENDED = ("status", "steps")
CODE_FIELDS = ("commit", "branch", "dirty", "diff_sha256")

# Sampling noise allowance for initial-value statistics, in standard errors.
NOISE_SIGMAS = 5.0


@dataclass
class Change:
    """One difference. ``fields`` maps an attribute to its value in run A and in run B."""

    section: str
    name: str
    change: str  # added | removed | changed | renamed
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    a: dict[str, Any] | None = None
    b: dict[str, Any] | None = None
    new_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"change": self.change, "name": self.name}
        if self.new_name is not None:
            out["new_name"] = self.new_name
        out["fields"] = {k: {"a": _jsonable(a), "b": _jsonable(b)} for k, (a, b) in self.fields.items()}
        out["a"] = _jsonable(self.a)
        out["b"] = _jsonable(self.b)
        return out


@dataclass
class RunSide:
    """Which run one side of a diff is."""

    run_id: str
    name: str | None
    started: str | None
    git: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        git = self.git or {}
        return {
            "run_id": self.run_id,
            "name": self.name,
            "started": self.started,
            "git_commit": git.get("commit"),
            "git_branch": git.get("branch"),
            "git_dirty": git.get("dirty"),
        }


@dataclass
class RunDiff:
    """Every difference between run A and run B, by section."""

    a: RunSide
    b: RunSide
    changes: list[Change]
    init_values_differ: list[str]

    @property
    def identical(self) -> bool:
        return not self.changes and not self.init_values_differ

    def section(self, name: str) -> list[Change]:
        return [c for c in self.changes if c.section == name]

    def as_dict(self) -> dict[str, Any]:
        """The ``--format json`` document (documented in the README)."""
        out: dict[str, Any] = {"a": self.a.as_dict(), "b": self.b.as_dict(), "identical": self.identical}
        for section in SECTIONS:
            out[section] = [c.as_dict() for c in self.section(section)]
        out["init_values_differ"] = list(self.init_values_differ)
        return out


# --------------------------------------------------------------------------- facts of one run
@dataclass
class _Optimizer:
    cls: str | None
    groups: list[dict[str, Any]]
    params: list[list[str]]
    lrs: list[tuple[Any, ...]]


@dataclass
class _RunFacts:
    side: RunSide
    started: dict[str, Any]
    ended: dict[str, Any]
    state: ModelState
    labels: Labels
    optimizers: list[_Optimizer]


def count_events(store: EventStore, run_id: str, kinds: tuple[str, ...], stream: int = 0) -> int:
    """How many events of these kinds one stream of a run has (uses the (run, kind) index)."""
    ev = schema.events
    with store.guard("counting events"), store.engine.connect() as conn:
        value = conn.execute(
            select(func.count()).where(ev.c.run_id == run_id, ev.c.stream == stream, ev.c.kind.in_(kinds))
        ).scalar()
    return int(value or 0)


def _events(store: EventStore, run_id: str, kinds: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    for row in store.iter_events(run_id, kinds=list(kinds), stream=0):
        row["payload"] = json.loads(row["payload"])
        yield row


def _facts(store: EventStore, run_id: str, tick: Callable[[int], None]) -> _RunFacts:
    started: dict[str, Any] = {}
    ended: dict[str, Any] = {}
    started_ns: int | None = None
    for event in _events(store, run_id, ("run_started", "run_ended")):
        if event["kind"] == "run_started":
            started, started_ns = event["payload"], int(event["ts_ns"])
        else:
            ended = event["payload"]
        tick(1)
    construction = []
    for event in _events(store, run_id, CONSTRUCTION_KINDS):
        construction.append(event)
        tick(1)
    state = replay(construction)
    _relativize_sources(state, started)
    labels = label_state(state, attached_ids(construction))
    optimizers: dict[int, _Optimizer] = {}
    for event in _events(store, run_id, ("optimizer_step",)):
        tick(1)
        payload = event["payload"]
        key = int(payload.get("optimizer_id") or 0)
        groups = payload.get("param_groups") or []
        found = optimizers.get(key)
        if found is None:
            found = optimizers[key] = _Optimizer(
                payload.get("optimizer_class"),
                [{k: v for k, v in g.items() if k != "params"} for g in groups],
                [[_tensor_name(labels, t) for t in g.get("params") or []] for g in groups],
                [],
            )
        found.lrs.append(tuple(g.get("lr") for g in groups))
    side = RunSide(
        run_id,
        started.get("name"),
        iso(started_ns) if started_ns is not None else None,
        started.get("git"),
    )
    return _RunFacts(side, started, ended, state, labels, list(optimizers.values()))


def _tensor_name(labels: Labels, tensor_id: Any) -> str:
    found = labels.tensors.get(int(tensor_id)) if tensor_id is not None else None
    return found.label if found is not None else f"#{tensor_id}"


def _relativize_sources(state: ModelState, started: dict[str, Any]) -> None:
    """Rewrite source files relative to the run's git root (or cwd), in place."""
    bases = [b for b in ((started.get("git") or {}).get("root"), started.get("cwd")) if b]

    def relative(source: dict[str, Any] | None) -> dict[str, Any] | None:
        if not source or not isinstance(source.get("file"), str):
            return source
        path = source["file"]
        for base in bases:
            if os.path.isabs(path) and (path == base or path.startswith(base.rstrip("/") + "/")):
                return {**source, "file": os.path.relpath(path, base)}
        return source

    for node in state.modules.values():
        node.source = relative(node.source)
    for info in state.tensors.values():
        info.source = relative(info.source)


def _where(source: dict[str, Any] | None) -> str | None:
    if not source:
        return None
    return f"{source.get('file')}:{source.get('line')}"


# --------------------------------------------------------------------------- items
def _module_items(facts: _RunFacts) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for module_id, label in facts.labels.modules.items():
        node = facts.state.modules[module_id]
        out[label.label] = {
            "class": node.cls,
            "source": _where(node.source),
            "source_function": (node.source or {}).get("function"),
            "parameters": sum(1 for t in node.parameters.values() if t is not None),
            "buffers": sum(1 for t in node.buffers.values() if t is not None),
        }
    return out


def _tensor_items(facts: _RunFacts, role: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for label in facts.labels.tensors.values():
        if label.role != role:
            continue
        info = label.info
        item: dict[str, Any] = {
            "shape": list(info.shape) if info.shape is not None else None,
            "dtype": info.dtype,
            "device": info.device,
        }
        if role == "parameter":
            item["requires_grad"] = info.requires_grad
        else:
            item["persistent"] = info.persistent
        item["source"] = _where(info.source)
        item["init"] = _init_summary(info.initial_sha256, info.initial_stats)
        item["module"] = facts.labels.module_label(label.module_id)
        out[label.label] = item
    return out


def _init_summary(sha256: str | None, stats: dict[str, Any] | None) -> dict[str, Any] | None:
    if sha256 is None and not stats:
        return None
    stats = stats or {}
    return {
        "sha256": sha256,
        **{k: stats.get(k) for k in ("numel", "mean", "std", "min", "max", "norm", "nan", "inf")},
    }



def distribution_changed(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two initial values come from different distributions, judging by their statistics.

    The allowance is ``NOISE_SIGMAS`` standard errors for the element count: the
    standard error of a sample mean is ``std / sqrt(n)``, of a sample standard
    deviation about ``std / sqrt(2n)``.
    """
    for key in ("nan", "inf"):
        if bool(stat_float(a.get(key)) or 0) != bool(stat_float(b.get(key)) or 0):
            return True
    n = stat_float(a.get("numel")) or stat_float(b.get("numel")) or 0.0
    mean_a, mean_b = stat_float(a.get("mean")), stat_float(b.get("mean"))
    std_a, std_b = stat_float(a.get("std")), stat_float(b.get("std"))
    if None in (mean_a, mean_b, std_a, std_b) or n < 1:
        return False
    assert mean_a is not None and mean_b is not None and std_a is not None and std_b is not None
    if not all(math.isfinite(v) for v in (mean_a, mean_b, std_a, std_b)):
        return False
    scale = max(abs(mean_a), abs(mean_b), 1e-30)
    if std_a == 0.0 or std_b == 0.0:
        if std_a != std_b:
            return True
        return abs(mean_a - mean_b) > 1e-6 * scale
    if abs(std_a - std_b) / max(std_a, std_b) > max(0.05, NOISE_SIGMAS / math.sqrt(2.0 * n)):
        return True
    return abs(mean_a - mean_b) > NOISE_SIGMAS * math.sqrt((std_a**2 + std_b**2) / n) + 1e-9 * scale


# --------------------------------------------------------------------------- renames
def _subtree_signature(facts: _RunFacts, modules: dict[str, dict[str, Any]], label: str) -> tuple[Any, ...]:
    """Class, source file/function and the contents (relative names, classes, shapes) of a module."""
    prefix = label + "."
    own = modules[label]
    inner = tuple(
        sorted((name[len(prefix):], item["class"]) for name, item in modules.items() if name.startswith(prefix))
    )
    tensors = tuple(
        sorted(
            (t.label[len(prefix):], t.role, tuple(t.info.shape or ()), t.info.dtype)
            for t in facts.labels.tensors.values()
            if t.label.startswith(prefix)
        )
    )
    source = own["source"].rsplit(":", 1)[0] if own["source"] else None
    return (own["class"], source, own["source_function"], inner, tensors)


def _topmost(names: list[str]) -> list[str]:
    """Names none of whose ancestors is in ``names``."""
    chosen = set(names)
    return [n for n in names if not any(n.startswith(other + ".") for other in chosen if other != n)]


def _find_renames(
    a: _RunFacts,
    b: _RunFacts,
    modules_a: dict[str, dict[str, Any]],
    modules_b: dict[str, dict[str, Any]],
) -> dict[str, str]:
    """Probable renames: top-most removed module -> top-most added module with the same signature."""
    removed = _topmost([n for n in modules_a if n not in modules_b])
    added = _topmost([n for n in modules_b if n not in modules_a])
    candidates = {name: _subtree_signature(b, modules_b, name) for name in added}
    renames: dict[str, str] = {}
    claimed: set[str] = set()
    for old in removed:
        signature = _subtree_signature(a, modules_a, old)
        matches = [n for n, s in candidates.items() if s == signature and n not in claimed]
        if len(matches) > 1:
            matches = [n for n in matches if modules_b[n]["source"] == modules_a[old]["source"]]
        if len(matches) == 1:
            renames[old] = matches[0]
            claimed.add(matches[0])
    return renames


def _renamed(name: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if name == old:
            return new
        if name.startswith(old + "."):
            return new + name[len(old):]
    return name


# --------------------------------------------------------------------------- compare
def _compare_items(
    section: str,
    items_a: dict[str, dict[str, Any]],
    items_b: dict[str, dict[str, Any]],
    renames: dict[str, str],
    compared: tuple[str, ...],
    init_values_differ: list[str] | None = None,
) -> list[Change]:
    changes: list[Change] = []
    mapped = {_renamed(name, renames): name for name in items_a}
    for new_name, old_name in mapped.items():
        item_a = items_a[old_name]
        item_b = items_b.get(new_name)
        if item_b is None:
            changes.append(Change(section, old_name, "removed", a=item_a))
            continue
        fields: dict[str, tuple[Any, Any]] = {}
        for key in compared:
            if item_a.get(key) != item_b.get(key):
                fields[key] = (item_a.get(key), item_b.get(key))
        if init_values_differ is not None:
            _compare_init(new_name, item_a, item_b, fields, init_values_differ)
        if old_name != new_name and section == "modules" and old_name in renames:
            changes.append(Change(section, old_name, "renamed", fields, item_a, item_b, new_name=new_name))
        elif fields:
            changes.append(Change(section, new_name, "changed", fields, item_a, item_b))
    for name, item_b in items_b.items():
        if name not in mapped:
            changes.append(Change(section, name, "added", b=item_b))
    return changes


def _compare_init(
    name: str,
    item_a: dict[str, Any],
    item_b: dict[str, Any],
    fields: dict[str, tuple[Any, Any]],
    init_values_differ: list[str],
) -> None:
    init_a, init_b = item_a.get("init"), item_b.get("init")
    if not init_a or not init_b or "shape" in fields or "dtype" in fields:
        return
    if init_a.get("sha256") == init_b.get("sha256"):
        return
    if distribution_changed(init_a, init_b):
        fields["init"] = (init_a, init_b)
    else:
        init_values_differ.append(name)


def _compare_hyperparameters(a: _RunFacts, b: _RunFacts) -> list[Change]:
    changes: list[Change] = []
    for index in range(max(len(a.optimizers), len(b.optimizers))):
        opt_a = a.optimizers[index] if index < len(a.optimizers) else None
        opt_b = b.optimizers[index] if index < len(b.optimizers) else None
        present = opt_b or opt_a
        assert present is not None
        label = f"optimizer {index} ({short_class(present.cls)})"
        if opt_a is None or opt_b is None:
            summary = {"class": present.cls, "groups": present.groups}
            if opt_a is None:
                changes.append(Change("hyperparameters", label, "added", b=summary))
            else:
                changes.append(Change("hyperparameters", label, "removed", a=summary))
            continue
        fields: dict[str, tuple[Any, Any]] = {}
        if opt_a.cls != opt_b.cls:
            fields["class"] = (opt_a.cls, opt_b.cls)
        if len(opt_a.groups) != len(opt_b.groups):
            fields["param_groups"] = (len(opt_a.groups), len(opt_b.groups))
        for g, (group_a, group_b) in enumerate(zip(opt_a.groups, opt_b.groups, strict=False)):
            for key in sorted(set(group_a) | set(group_b)):
                if group_a.get(key) != group_b.get(key):
                    fields[f"group {g} {key}"] = (group_a.get(key), group_b.get(key))
            params_a, params_b = opt_a.params[g], opt_b.params[g]
            if params_a != params_b:
                fields[f"group {g} params"] = (params_a, params_b)
        first_lr_equal = opt_a.lrs[:1] == opt_b.lrs[:1]
        if first_lr_equal:
            for step, (lr_a, lr_b) in enumerate(zip(opt_a.lrs, opt_b.lrs, strict=False), start=1):
                if lr_a != lr_b:
                    fields["lr schedule"] = (
                        {"optimizer_step": step, "lr": list(lr_a)},
                        {"optimizer_step": step, "lr": list(lr_b)},
                    )
                    break
        if fields:
            changes.append(Change("hyperparameters", label, "changed", fields))
    return changes


def _dotted(payload: dict[str, Any], key: str) -> Any:
    value: Any = payload
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _seed(facts: _RunFacts) -> Any:
    """The torch seed that decided the run's randomness.

    ``torch.initial_seed()`` at the end reflects the script's ``manual_seed``
    calls, and equals the start seed (random per process) when it made none; the
    start seed is only the answer for a run that never ended.
    """
    ended = _dotted(facts.ended, "seeds.torch_initial_seed")
    return ended if ended is not None else _dotted(facts.started, "seeds.torch_initial_seed")


def _compare_metadata(a: _RunFacts, b: _RunFacts) -> list[Change]:
    changes: list[Change] = []
    for key in METADATA_STARTED:
        value_a, value_b = _dotted(a.started, key), _dotted(b.started, key)
        if value_a != value_b:
            changes.append(Change("metadata", key, "changed", {key: (value_a, value_b)}))
    for key in METADATA_ENDED:
        value_a, value_b = _dotted(a.ended, key), _dotted(b.ended, key)
        if value_a != value_b:
            changes.append(Change("metadata", key, "changed", {key: (value_a, value_b)}))
    seed_a, seed_b = _seed(a), _seed(b)
    if seed_a != seed_b:
        changes.append(Change("metadata", "seed", "changed", {"seed": (seed_a, seed_b)}))
    git_a, git_b = a.started.get("git") or {}, b.started.get("git") or {}
    code: dict[str, tuple[Any, Any]] = {}
    for key in CODE_FIELDS:
        if git_a.get(key) != git_b.get(key):
            code[key] = (git_a.get(key), git_b.get(key))
    if code:
        changes.insert(0, Change("code", "git", "changed", code, dict(git_a) or None, dict(git_b) or None))
    return changes


def diff_runs(store: EventStore, run_a: str, run_b: str, progress: Progress | None = None) -> RunDiff:
    """Compare two runs (ids already resolved) of one store."""
    kinds = ("run_started", "run_ended", "optimizer_step", *CONSTRUCTION_KINDS)
    total = count_events(store, run_a, kinds) + count_events(store, run_b, kinds)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None and (done % 1000 == 0 or done == total):
            progress(done, total)

    a = _facts(store, run_a, tick)
    b = _facts(store, run_b, tick)
    if progress is not None:
        progress(total, total)
    modules_a, modules_b = _module_items(a), _module_items(b)
    renames = _find_renames(a, b, modules_a, modules_b)
    init_values_differ: list[str] = []
    changes = _compare_metadata(a, b)
    code = [c for c in changes if c.section == "code"]
    metadata = [c for c in changes if c.section == "metadata"]
    changes = [
        *code,
        *_compare_items("modules", modules_a, modules_b, renames, ("class", "source")),
        *_compare_items(
            "parameters",
            _tensor_items(a, "parameter"),
            _tensor_items(b, "parameter"),
            renames,
            ("shape", "dtype", "device", "requires_grad", "source"),
            init_values_differ,
        ),
        *_compare_items(
            "buffers",
            _tensor_items(a, "buffer"),
            _tensor_items(b, "buffer"),
            renames,
            ("shape", "dtype", "device", "persistent", "source"),
            init_values_differ,
        ),
        *_compare_hyperparameters(a, b),
        *metadata,
    ]
    return RunDiff(a.side, b.side, changes, init_values_differ)


def _jsonable(value: Any) -> Any:
    """Values as the store writes them: non-finite floats become 'NaN'/'Infinity'/'-Infinity'."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# --------------------------------------------------------------------------- values
@dataclass
class TensorSide:
    """One side of a differing tensor: what it was and its statistics."""

    name: str
    sha256: str
    dtype: str
    shape: list[int]
    norm: float | None
    mean: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "dtype": self.dtype,
            "shape": self.shape,
            "norm": _jsonable(self.norm),
            "mean": _jsonable(self.mean),
        }


@dataclass
class Divergence:
    """The first tensor (at the first compared step) whose values differ."""

    step: int
    tensor: str
    a: TensorSide
    b: TensorSide
    max_abs_diff: float | None
    reason: str  # values | shape | dtype

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tensor": self.tensor,
            "reason": self.reason,
            "max_abs_diff": _jsonable(self.max_abs_diff),
            "a": self.a.as_dict(),
            "b": self.b.as_dict(),
        }


@dataclass
class ValuesDiff:
    """``diff --values``: which steps were compared and the first divergence, if any."""

    mode: str  # bitwise | tolerance
    atol: float
    rtol: float
    steps_compared: list[int]
    steps_only_a: list[int]
    steps_only_b: list[int]
    tensors_only_a: list[str]
    tensors_only_b: list[str]
    compared: int
    equal_hashes: int
    first: Divergence | None

    @property
    def identical(self) -> bool:
        return self.first is None

    def as_dict(self) -> dict[str, Any]:
        """The ``values`` key of ``diff --values --format json`` (documented in the README)."""
        return {
            "mode": self.mode,
            "atol": self.atol,
            "rtol": self.rtol,
            "steps_compared": self.steps_compared,
            "steps_only_in_a": self.steps_only_a,
            "steps_only_in_b": self.steps_only_b,
            "tensors_only_in_a": self.tensors_only_a,
            "tensors_only_in_b": self.tensors_only_b,
            "tensors_compared": self.compared,
            "equal_by_hash": self.equal_hashes,
            "identical": self.identical,
            "first_divergence": self.first.as_dict() if self.first is not None else None,
        }


@dataclass
class _Values:
    """One run's snapshotted values: for each recorded step, tensor label -> content hash."""

    order: list[str]  # labels in the main root's state_dict order (tied tensors once)
    by_step: dict[int, dict[str, str]]


def _step_seqs(store: EventStore, run_id: str) -> dict[int, int]:
    """step -> seq of its ``optimizer_step`` event (stream 0)."""
    ev = schema.events
    with store.guard("finding steps"), store.engine.connect() as conn:
        rows = conn.execute(
            select(ev.c.step, ev.c.seq).where(
                ev.c.run_id == run_id, ev.c.stream == 0, ev.c.kind == "optimizer_step"
            )
        ).all()
    return {int(step): int(seq) for step, seq in rows if step is not None}


def _values(store: EventStore, run_id: str, facts: _RunFacts) -> _Values:
    """Which content each tensor of the main model had at every step the run snapshotted.

    A step counts as recorded when every tensor of the model's state_dict has a
    snapshot for it, picked by the same rule as ``auditlog restore --step``
    (``reader.pick_snapshot``), so "step N" means the same here as there.
    """
    state = facts.state
    try:
        root = state.main_root()
    except KeyError:
        return _Values([], {})
    order: list[tuple[str, int]] = []
    seen: set[int] = set()
    for _key, tensor_id in state.state_dict_keys(root):
        if tensor_id in seen or tensor_id not in facts.labels.tensors:
            continue
        seen.add(tensor_id)
        order.append((facts.labels.tensors[tensor_id].label, tensor_id))
    steps = _step_seqs(store, run_id)
    boundary_zero = Run(store, run_id).boundary(step=0)
    candidates = sorted({h[0] for _, tid in order for h in state.tensors[tid].history})
    by_step: dict[int, dict[str, str]] = {}
    for step in candidates:
        end = boundary_zero if step == 0 else steps.get(step)
        if end is None:  # a snapshot dated to a step with no optimizer_step event (run end)
            end = state.last_seq
        picked: dict[str, str] = {}
        for label, tensor_id in order:
            sha = pick_snapshot(state.tensors[tensor_id].history, step, end, steps.get(step + 1))
            if sha is None:
                break
            picked[label] = sha
        else:
            by_step[step] = picked
    return _Values([label for label, _ in order], by_step)


def _as_float64(tensor: torch.Tensor) -> torch.Tensor:
    """A float64 copy for statistics and tolerances (complex as its real/imag pairs)."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.to(torch.float64)


def _side_stats(name: str, blob: BlobInfo, tensor: torch.Tensor | None) -> TensorSide:
    norm = mean = None
    if tensor is not None and tensor.numel():
        values = _as_float64(tensor)
        norm, mean = float(values.norm()), float(values.mean())
    return TensorSide(name, blob.sha256, blob.dtype, list(blob.shape), norm, mean)


def first_divergence(
    store: EventStore,
    run_a: str,
    run_b: str,
    atol: float | None = None,
    rtol: float | None = None,
    progress: Progress | None = None,
) -> ValuesDiff:
    """The first step, and the first tensor in state_dict order, where the values of two runs differ.

    Only steps both runs snapshotted are compared. Tensors are matched by label
    after the renames the construction diff finds. Equal content hashes are
    equal values and are never read. Without tolerances a differing hash is a
    difference (bitwise); with ``atol``/``rtol`` both values are loaded and
    compared as ``torch.allclose`` does (``|a - b| <= atol + rtol * |b|``).
    """
    tolerant = atol is not None or rtol is not None
    atol_f, rtol_f = float(atol or 0.0), float(rtol or 0.0)
    facts_a = _facts(store, run_a, lambda _n: None)
    facts_b = _facts(store, run_b, lambda _n: None)
    renames = _find_renames(facts_a, facts_b, _module_items(facts_a), _module_items(facts_b))
    values_a, values_b = _values(store, run_a, facts_a), _values(store, run_b, facts_b)
    common = sorted(set(values_a.by_step) & set(values_b.by_step))
    matched = [(label, _renamed(label, renames)) for label in values_a.order]
    names_b = set(values_b.order)
    pairs = [(a, b) for a, b in matched if b in names_b]
    paired_b = {b for _, b in pairs}
    result = ValuesDiff(
        mode="tolerance" if tolerant else "bitwise",
        atol=atol_f,
        rtol=rtol_f,
        steps_compared=common,
        steps_only_a=sorted(set(values_a.by_step) - set(values_b.by_step)),
        steps_only_b=sorted(set(values_b.by_step) - set(values_a.by_step)),
        tensors_only_a=[a for a, b in matched if b not in names_b],
        tensors_only_b=[b for b in values_b.order if b not in paired_b],
        compared=0,
        equal_hashes=0,
        first=None,
    )
    snapshots = SnapshotStore(store.location.snapshots)
    total, done = len(common) * len(pairs), 0
    for step in common:
        hashes_a, hashes_b = values_a.by_step[step], values_b.by_step[step]
        for name_a, name_b in pairs:
            done += 1
            if progress is not None:
                progress(done, total)
            result.compared += 1
            sha_a, sha_b = hashes_a[name_a], hashes_b[name_b]
            if sha_a == sha_b:
                result.equal_hashes += 1
                continue
            found = _compare(snapshots, store, step, name_a, name_b, sha_a, sha_b, tolerant, atol_f, rtol_f)
            if found is not None:
                result.first = found
                if progress is not None:
                    progress(total, total)
                return result
    return result


def _compare(
    snapshots: SnapshotStore,
    store: EventStore,
    step: int,
    name_a: str,
    name_b: str,
    sha_a: str,
    sha_b: str,
    tolerant: bool,
    atol: float,
    rtol: float,
) -> Divergence | None:
    """Two different contents of one tensor: a ``Divergence``, or None when within tolerance."""
    rows = store.blob_rows([sha_a, sha_b])
    for sha, name in ((sha_a, name_a), (sha_b, name_b)):
        if sha not in rows:
            raise SnapshotError(f"snapshot {sha[:16]}... of {name} at step {step} is not in the catalog")
    blob_a, blob_b = blob_from_row(rows[sha_a]), blob_from_row(rows[sha_b])
    tensor_a, tensor_b = snapshots.get(blob_a), snapshots.get(blob_b)
    reason = "values"
    if blob_a.shape != blob_b.shape:
        reason = "shape"
    elif blob_a.dtype != blob_b.dtype:
        reason = "dtype"
    max_abs: float | None = None
    if reason == "values":
        wide_a, wide_b = _as_float64(tensor_a), _as_float64(tensor_b)
        if tolerant and torch.allclose(wide_a, wide_b, rtol=rtol, atol=atol):
            return None
        max_abs = float((wide_a - wide_b).abs().max()) if wide_a.numel() else 0.0
    return Divergence(
        step=step,
        tensor=name_b,
        a=_side_stats(name_a, blob_a, tensor_a),
        b=_side_stats(name_b, blob_b, tensor_b),
        max_abs_diff=max_abs,
        reason=reason,
    )
