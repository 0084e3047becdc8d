"""The ``data`` section of ``auditlog diff``: datasets whose identity changed, and sampling.

Datasets are matched by their per-run id, which the recorder hands out in the
order a run first iterates them: two runs of one script match dataset for
dataset. A dataset's identity is compared by class, length, method and
fingerprint; when the fingerprints differ, the files listed in both records
that differ are named (``files``). A loader's configuration is compared at its
first iterator start (the workers' seed, drawn afresh each epoch, left out), and
its sampling by the sample indices of every batch in order: ``sampling`` says at
which batch the runs first drew different samples. A loader over an
``IterableDataset`` has no indices: its batches are compared by their content
hashes (``batch_hashes``: the first batch whose hashes differ; a batch hashed in
one run only is not compared).
"""

from __future__ import annotations

import json
from typing import Any

from auditlog.core.packed import packed_ints_key, unpack_ints
from auditlog.read.diff import Change
from auditlog.store.eventstore import EventStore

FILES_NAMED = 20
"""Changed files named per dataset (the count says how many there were)."""


def _payloads(store: EventStore, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [json.loads(row["payload"]) for row in store.iter_events(run_id, kinds=[kind], stream=0)]


def _ints(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return unpack_ints(value) if packed_ints_key(value) is not None else []


Draw = tuple[int, int, "list[int] | str | None"]
"""(epoch, batch, its indices, or for an iterable dataset its content hash or None)."""


def _draws(store: EventStore, run_id: str) -> dict[int, list[Draw]]:
    """Per loader id: (epoch, batch, indices or hash) of every batch, in order."""
    out: dict[int, list[Draw]] = {}
    for p in _payloads(store, run_id, "batches"):
        first = int(p.get("first") or 0)
        epoch = int(p.get("epoch") or 0)
        into = out.setdefault(int(p.get("loader_id") or 0), [])
        if p.get("iterable"):
            count = int(p.get("count") or 0)
            listed = p.get("hashes")
            hashes: list[Any] = listed if isinstance(listed, list) else [None] * count
            into += [
                (epoch, first + i, h if isinstance(h, str) else None) for i, h in enumerate(hashes)
            ]
            continue
        flat = iter(_ints(p.get("indices")))
        sizes = _ints(p.get("sizes")) or [0] * int(p.get("count") or 0)
        for i, size in enumerate(sizes):
            into.append((epoch, first + i, [next(flat, -1) for _ in range(size)]))
    return out


def _label(seen: dict[str, Any]) -> str:
    return f"dataset {seen.get('dataset_id')} ({str(seen.get('class')).rsplit('.', 1)[-1]})"


def _facts(seen: dict[str, Any]) -> dict[str, Any]:
    identity = seen.get("identity") or {}
    return {
        "class": seen.get("class"),
        "length": seen.get("length"),
        "method": identity.get("method"),
        "fingerprint": identity.get("fingerprint"),
    }


def _changed_files(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    files_a = {f.get("path"): f for f in a.get("files") or () if isinstance(f, dict)}
    files_b = {f.get("path"): f for f in b.get("files") or () if isinstance(f, dict)}
    changed = [p for p in files_a if p in files_b and files_a[p] != files_b[p]]
    changed += [p for p in files_a if p not in files_b] + [p for p in files_b if p not in files_a]
    return [str(p) for p in changed]


def _config(start: dict[str, Any]) -> dict[str, Any]:
    config = dict(start.get("config") or {})
    config.pop("worker_base_seed", None)
    return config


def data_changes(store: EventStore, run_a: str, run_b: str) -> list[Change]:
    """Datasets added, removed or changed, loaders configured differently, sampling that differs."""
    changes: list[Change] = []
    seen_a = {int(p["dataset_id"]): p for p in _payloads(store, run_a, "dataset_seen")}
    seen_b = {int(p["dataset_id"]): p for p in _payloads(store, run_b, "dataset_seen")}
    for key in sorted(seen_a.keys() | seen_b.keys()):
        a, b = seen_a.get(key), seen_b.get(key)
        if a is None or b is None:
            present = a or b or {}
            changes.append(
                Change(
                    "data",
                    _label(present),
                    "removed" if b is None else "added",
                    a=None if a is None else _facts(a),
                    b=None if b is None else _facts(b),
                )
            )
            continue
        facts_a, facts_b = _facts(a), _facts(b)
        fields = {k: (facts_a[k], facts_b[k]) for k in facts_a if facts_a[k] != facts_b[k]}
        if (
            facts_a["fingerprint"] is None
            and facts_b["fingerprint"] is None
            and facts_a["method"] == "unidentified"
        ):
            fields.setdefault(
                "fingerprint", ("unidentified", "unidentified")
            )  # cannot say it is the same
        if "fingerprint" in fields:
            files = _changed_files(a.get("identity") or {}, b.get("identity") or {})
            if files:
                more = len(files) - FILES_NAMED
                fields["files"] = (
                    None,
                    ", ".join(files[:FILES_NAMED]) + (f" and {more} more" if more > 0 else ""),
                )
        if fields:
            changes.append(Change("data", _label(a), "changed", fields, a=facts_a, b=facts_b))
    starts_a: dict[int, dict[str, Any]] = {}
    for p in _payloads(store, run_a, "loader_started"):
        starts_a.setdefault(int(p["loader_id"]), p)
    starts_b: dict[int, dict[str, Any]] = {}
    for p in _payloads(store, run_b, "loader_started"):
        starts_b.setdefault(int(p["loader_id"]), p)
    draws_a, draws_b = _draws(store, run_a), _draws(store, run_b)
    for key in sorted(starts_a.keys() & starts_b.keys()):
        config_a, config_b = _config(starts_a[key]), _config(starts_b[key])
        fields = {
            k: (config_a.get(k), config_b.get(k))
            for k in {**config_a, **config_b}
            if config_a.get(k) != config_b.get(k)
        }
        a_draws, b_draws = draws_a.get(key, []), draws_b.get(key, [])
        iterable = any(isinstance(d[2], str) for d in a_draws + b_draws)
        first = (
            _first_hash_difference(a_draws, b_draws)
            if iterable
            else _first_difference(a_draws, b_draws)
        )
        if first is not None:
            fields["batch_hashes" if iterable else "sampling"] = first
        if fields:
            changes.append(Change("data", f"loader {key}", "changed", fields))
    return changes


def _first_difference(a: list[Draw], b: list[Draw]) -> tuple[Any, Any] | None:
    """Where two loaders first drew different samples, as (run A's, run B's) description."""
    for (epoch, batch, got_a), (_, _, got_b) in zip(a, b, strict=False):
        if got_a != got_b:
            return (f"epoch {epoch} batch {batch}: {(got_a or [])[:8]}", f"{(got_b or [])[:8]}")
    if len(a) != len(b):
        return (f"{len(a)} batches", f"{len(b)} batches")
    return None


def _first_hash_difference(a: list[Draw], b: list[Draw]) -> tuple[Any, Any] | None:
    """Where two loaders over iterable datasets first returned batches of different
    content (both hashed), as (run A's, run B's) description."""
    for (epoch, batch, got_a), (_, _, got_b) in zip(a, b, strict=False):
        if isinstance(got_a, str) and isinstance(got_b, str) and got_a != got_b:
            return (f"epoch {epoch} batch {batch}: hash {got_a[:16]}", f"hash {got_b[:16]}")
    if len(a) != len(b):
        return (f"{len(a)} batches", f"{len(b)} batches")
    return None
