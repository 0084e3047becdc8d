"""What differs between two runs: construction, hyperparameters, code and environment.

The question this answers is "what did I change?", typically between two
recordings of one script at two code versions. It is answered from the record
alone, as data (``RunDiff``); the CLI renders it.

- **Construction** is replayed for each run (stream 0) and labelled the way the
  views label it (``auditlog.core.naming``). Modules, parameters and buffers are
  aligned by qualified name: present on one side only is added/removed; on both
  sides, class, shape, dtype, device, requires_grad/persistent, source location
  and initial values are compared; a difference in the source line alone (same
  file) is a ``moved`` change, reported apart from real changes. A module that disappeared under one name and
  appeared under another with the same class, the same subtree (classes, tensor
  names, shapes, dtypes) and the same source file and function is reported as a
  probable **rename**, and its contents are compared under the new name instead
  of being listed as removed and added.
- **Source locations** are compared relative to each run's git root (or working directory).
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
- **Data**: datasets whose identity changed, loaders configured or sampling differently (``diff_data.py``);
- **Code and environment**: git commit, branch, dirty flag, diff hash and the files that differ;
  argv, Python/torch/CUDA versions, platform, host, user, working directory,
  world size, capture policy, the torch seed in effect (``manual_seed``, else
  the process's random seed), and the outcome (status, steps).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from auditlog.core.hashing import content_hash_version
from auditlog.core.naming import Labels, attached_ids, label_state, short_class
from auditlog.core.packed import unpack_list
from auditlog.core.replay import CONSTRUCTION_KINDS, ModelState, attached_mark, replay
from auditlog.core.values import iso, stat_float
from auditlog.read.codefiles import code_changes
from auditlog.read.diff_renames import find_renames, renamed_label
from auditlog.store.blobs import SnapshotStore
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import decode_event

SameContent = Callable[[str, str], bool]  # two hashes, one content? (runs of two hash versions)

Progress = Callable[[int, int], None]

SECTIONS = ("code", "modules", "parameters", "buffers", "hyperparameters", "data", "metadata")

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
    change: str  # added | removed | changed | renamed | moved (only the source line differs)
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    a: dict[str, Any] | None = None
    b: dict[str, Any] | None = None
    new_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"change": self.change, "name": self.name}
        if self.new_name is not None:
            out["new_name"] = self.new_name
        out["fields"] = {
            k: {"a": jsonable(a), "b": jsonable(b)} for k, (a, b) in self.fields.items()
        }
        out["a"] = jsonable(self.a)
        out["b"] = jsonable(self.b)
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
        out: dict[str, Any] = {
            "a": self.a.as_dict(),
            "b": self.b.as_dict(),
            "identical": self.identical,
        }
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
class RunFacts:
    side: RunSide
    started: dict[str, Any]
    ended: dict[str, Any]
    state: ModelState
    labels: Labels
    optimizers: list[_Optimizer]


def _events(store: EventStore, run_id: str, kinds: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    shown = store.location.display()
    for row in store.iter_events(run_id, kinds=list(kinds), stream=0):
        yield decode_event(row, shown)  # a malformed or oversized payload: refused by name


def run_facts(store: EventStore, run_id: str, tick: Callable[[int], None]) -> RunFacts:
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
                [[_tensor_name(labels, t) for t in _group_ids(g)] for g in groups],
                [],
            )
        found.lrs.append(tuple(g.get("lr") for g in groups))
    side = RunSide(
        run_id,
        started.get("name"),
        iso(started_ns) if started_ns is not None else None,
        started.get("git"),
    )
    return RunFacts(side, started, ended, state, labels, list(optimizers.values()))


def _group_ids(group: dict[str, Any]) -> list[Any]:
    """A param group's tensor ids, packed (``core.packed``) or a list (older records)."""
    try:
        return unpack_list(group.get("params")) or []
    except ValueError:  # damaged: ``verify`` says what was altered
        return []


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
    """``file:line``, marked `` (attached)`` where a module's line is not its constructing
    line: a module whose line moved, or became only known as attached, differs."""
    if not source:
        return None
    return f"{source.get('file')}:{source.get('line')}{attached_mark(source.get('kind'))}"


# --------------------------------------------------------------------------- items
def module_items(facts: RunFacts) -> dict[str, dict[str, Any]]:
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


def _tensor_items(facts: RunFacts, role: str) -> dict[str, dict[str, Any]]:
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


# --------------------------------------------------------------------------- compare
def _compare_items(
    section: str,
    items_a: dict[str, dict[str, Any]],
    items_b: dict[str, dict[str, Any]],
    renames: dict[str, str],
    compared: tuple[str, ...],
    init_values_differ: list[str] | None = None,
    same_content: SameContent | None = None,
) -> list[Change]:
    changes: list[Change] = []
    mapped = {renamed_label(name, renames): name for name in items_a}
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
            _compare_init(new_name, item_a, item_b, fields, init_values_differ, same_content)
        if old_name != new_name and section == "modules" and old_name in renames:
            changes.append(
                Change(section, old_name, "renamed", fields, item_a, item_b, new_name=new_name)
            )
        elif fields:
            kind = "moved" if _only_moved(fields) else "changed"
            changes.append(Change(section, new_name, kind, fields, item_a, item_b))
    for name, item_b in items_b.items():
        if name not in mapped:
            changes.append(Change(section, name, "added", b=item_b))
    return changes


def _only_moved(fields: dict[str, tuple[Any, Any]]) -> bool:
    """Only the line of the source changed (same file): code moved, the model did not."""
    if set(fields) != {"source"}:
        return False
    a, b = fields["source"]
    return isinstance(a, str) and isinstance(b, str) and a.rsplit(":", 1)[0] == b.rsplit(":", 1)[0]


def _compare_init(
    name: str,
    item_a: dict[str, Any],
    item_b: dict[str, Any],
    fields: dict[str, tuple[Any, Any]],
    init_values_differ: list[str],
    same_content: SameContent | None = None,
) -> None:
    init_a, init_b = item_a.get("init"), item_b.get("init")
    if not init_a or not init_b or "shape" in fields or "dtype" in fields:
        return
    sha_a, sha_b = init_a.get("sha256"), init_b.get("sha256")
    if sha_a == sha_b or (
        same_content
        and isinstance(sha_a, str)
        and isinstance(sha_b, str)
        and same_content(sha_a, sha_b)
    ):
        return
    if distribution_changed(init_a, init_b):
        fields["init"] = (init_a, init_b)
    else:
        init_values_differ.append(name)


def _compare_hyperparameters(a: RunFacts, b: RunFacts) -> list[Change]:
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


def _seed(facts: RunFacts) -> Any:
    """The torch seed that decided the run's randomness.

    ``torch.initial_seed()`` at the end reflects the script's ``manual_seed``
    calls, and equals the start seed (random per process) when it made none; the
    start seed is only the answer for a run that never ended.
    """
    ended = _dotted(facts.ended, "seeds.torch_initial_seed")
    return ended if ended is not None else _dotted(facts.started, "seeds.torch_initial_seed")


def _compare_metadata(a: RunFacts, b: RunFacts) -> list[Change]:
    changes: list[Change] = []
    for key in METADATA_STARTED:
        value_a, value_b = _dotted(a.started, key), _dotted(b.started, key)
        if value_a == value_b:
            continue
        if isinstance(value_a, dict) and isinstance(
            value_b, dict
        ):  # the policy: only the keys that differ
            keys = [k for k in {**value_a, **value_b} if value_a.get(k) != value_b.get(k)]
            fields = {k: (value_a.get(k), value_b.get(k)) for k in keys}
        else:
            fields = {key: (value_a, value_b)}
        changes.append(
            Change("metadata", key, "changed", fields, a={key: value_a}, b={key: value_b})
        )
    for key in METADATA_ENDED:
        value_a, value_b = _dotted(a.ended, key), _dotted(b.ended, key)
        if value_a != value_b:
            changes.append(Change("metadata", key, "changed", {key: (value_a, value_b)}))
    seed_a, seed_b = _seed(a), _seed(b)
    if seed_a != seed_b:
        changes.append(Change("metadata", "seed", "changed", {"seed": (seed_a, seed_b)}))
    git_a, git_b = a.started.get("git") or {}, b.started.get("git") or {}
    code = code_changes(git_a, git_b, CODE_FIELDS)  # and which files differ (codefiles.py)
    if code:
        changes.insert(
            0, Change("code", "git", "changed", code, dict(git_a) or None, dict(git_b) or None)
        )
    return changes


def diff_runs(
    store: EventStore, run_a: str, run_b: str, progress: Progress | None = None
) -> RunDiff:
    """Compare two runs (ids already resolved) of one store."""
    from auditlog.read.diff_data import data_changes  # it builds this module's Change

    kinds = ("run_started", "run_ended", "optimizer_step", *CONSTRUCTION_KINDS)
    total = store.count_events(run_a, kinds) + store.count_events(run_b, kinds)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None and (done % 1000 == 0 or done == total):
            progress(done, total)

    a = run_facts(store, run_a, tick)
    b = run_facts(store, run_b, tick)
    if progress is not None:
        progress(total, total)
    modules_a, modules_b = module_items(a), module_items(b)
    renames = find_renames(a, b, modules_a, modules_b)
    init_values_differ: list[str] = []
    # Runs of two content hash versions (one recorded before v2): a differing hash of a
    # large tensor may still be one content, told by the stored values.
    versions = {content_hash_version(a.started), content_hash_version(b.started)}
    same_content = (
        SnapshotStore(store.location.snapshots).same_content if len(versions) > 1 else None
    )
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
            same_content,
        ),
        *_compare_items(
            "buffers",
            _tensor_items(a, "buffer"),
            _tensor_items(b, "buffer"),
            renames,
            ("shape", "dtype", "device", "persistent", "source"),
            init_values_differ,
            same_content,
        ),
        *_compare_hyperparameters(a, b),
        *data_changes(store, run_a, run_b),  # datasets and sampling (diff_data.py)
        *metadata,
    ]
    return RunDiff(a.side, b.side, changes, init_values_differ)


def jsonable(value: Any) -> Any:
    """Values as the store writes them: non-finite floats become 'NaN'/'Infinity'/'-Infinity'."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
