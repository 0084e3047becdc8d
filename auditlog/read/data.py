"""Answers about the data a run trained on (``auditlog data``): which datasets, how they
were drawn, which steps trained on one sample, and which on one batch of an iterable
dataset (by its content hash).

Built from the ``datasets`` and ``batches`` views (``store/readmodel/data_views.py``)
through ``DataQueries``; docs/data.md shows the questions and their answers.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import UsageError
from auditlog.store.readmodel.dataqueries import DataQueries

if TYPE_CHECKING:
    from auditlog.read.run import Run


def data_questions(run: Run) -> contextlib.AbstractContextManager[DataQueries]:
    """The data questions over ``run`` (the read model is refreshed first); they are the
    forensic questions too (``DataQueries`` extends them), so one session answers a page."""
    from auditlog.read.forensics import asking

    return asking(run, DataQueries)


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


@dataclass
class DataSummary:
    """The datasets a run iterated (one per stream and dataset object) and its loaders."""

    datasets: list[dict[str, Any]]
    loaders: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"datasets": self.datasets, "loaders": self.loaders}

    def dataset_rows(self) -> list[dict[str, Any]]:
        """The datasets as ``auditlog data`` and the UI show them (``DATASET_COLUMNS``)."""
        return [dataset_row(d) for d in self.datasets]

    def loader_rows(self) -> list[dict[str, Any]]:
        """The loaders as ``auditlog data`` and the UI show them (``LOADER_COLUMNS``)."""
        return [loader_row(e) for e in self.loaders]


# What a reader is shown of each dataset and loader: one presentation for the CLI's
# table and the UI's run page.
DATASET_COLUMNS = (
    "rank",
    "dataset",
    "class",
    "length",
    "method",
    "fingerprint",
    "epochs",
    "batches",
    "samples",
    "distinct",
    "coverage",
    "hashed",
)
LOADER_COLUMNS = (
    "rank",
    "loader",
    "dataset",
    "epochs",
    "first_step",
    "batch_size",
    "shuffle",
    "workers",
    "sampler",
    "seed",
)


def _short(name: Any) -> Any:
    return str(name).rsplit(".", 1)[-1] if name is not None else None


def dataset_row(d: dict[str, Any]) -> dict[str, Any]:
    """One dataset as shown: class without its module, the method (or why it is
    unidentified), the fingerprint's first 16 hex digits, coverage in percent, and the
    batches hashed (iterable datasets)."""
    fingerprint = d.get("fingerprint")
    return {
        "rank": d["rank"],
        "dataset": d["dataset_id"],
        "class": _short(d["class"]),
        "length": d["length"],
        "method": d["method"]
        if d["method"] != "unidentified"
        else f"unidentified: {d.get('reason')}",
        "fingerprint": fingerprint[:16] if isinstance(fingerprint, str) else None,
        "epochs": d["epochs"],
        "batches": d["batches"],
        "samples": d["samples_drawn"],
        "distinct": d["distinct_samples"],
        "coverage": None if d["coverage"] is None else f"{100 * float(d['coverage']):.1f}%",
        "hashed": d.get("hashed_batches") or None,
    }


def loader_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One loader as shown, with the seed its sampler drew from (or "global RNG")."""
    config = entry.get("config") or {}
    seed = config.get("sampler_seed")
    if seed is None:
        seed = config.get("generator_seed")
    state = config.get("sampler_state") or {}
    if seed is None and "seed" in state:
        seed = state["seed"]
    return {
        "rank": entry["rank"],
        "loader": entry["loader_id"],
        "dataset": entry["dataset_id"],
        "epochs": entry["epochs"],
        "first_step": entry["first_step"],
        "batch_size": config.get("batch_size"),
        "shuffle": config.get("shuffle"),
        "workers": config.get("num_workers"),
        "sampler": _short(config.get("sampler")),
        # a shuffling sampler without a generator seeds itself from torch's global RNG
        "seed": "global RNG" if seed is None and config.get("shuffle") else seed,
    }


def data_summary(q: DataQueries) -> DataSummary:
    """Every dataset with its identity and what was drawn of it; every loader with its
    iterations and the configuration of its last one (``loader_started``)."""
    datasets = []
    for row in q.datasets():
        row["identity"] = _json(row["identity"])
        datasets.append(row)
    loaders: dict[tuple[int, int], dict[str, Any]] = {}
    for start in q.loader_starts():
        key = (int(start["stream"]), int(start["loader_id"]))
        config = _json(start["config"]) or {}
        entry = loaders.setdefault(
            key,
            {
                "stream": start["stream"],
                "rank": start["rank"],
                "loader_id": start["loader_id"],
                "dataset_id": start["dataset_id"],
                "loader_class": start["loader_class"],
                "epochs": 0,
                "first_step": start["step"],
                "configs": [],
            },
        )
        entry["epochs"] += 1
        if not entry["configs"] or _without_epoch(entry["configs"][-1]) != _without_epoch(config):
            entry["configs"].append(
                config
            )  # a configuration change (a DistributedSampler's epoch aside)
        entry["config"] = config
    return DataSummary(datasets, list(loaders.values()))


def _without_epoch(config: dict[str, Any]) -> dict[str, Any]:
    state = dict(config.get("sampler_state") or {})
    state.pop("epoch", None)
    return {**config, "sampler_state": state, "worker_base_seed": None}


@dataclass
class SampleHistory:
    """Where one sample went: every batch that held it, and the steps that trained on it."""

    sample: int
    datasets: list[dict[str, Any]]
    batches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trained_steps(self) -> list[tuple[int, int]]:
        """(rank, step) of every step that trained on it (batches drawn under no_grad and
        batches no step followed left out), in order, a step once."""
        return _trained_steps(self.batches)

    @property
    def answer(self) -> str:
        times = sum(int(b["times"]) for b in self.batches)
        steps = self.trained_steps
        if not times:
            lengths = [d["length"] for d in self.datasets]
            beyond = bool(lengths) and all(n is not None and self.sample >= n for n in lengths)
            return f"sample {self.sample} was never drawn" + (
                f" (beyond every dataset's length: {', '.join(map(str, lengths))})"
                if beyond
                else ""
            )
        ranked = len({d["rank"] for d in self.datasets}) > 1
        return (
            f"sample {self.sample} was drawn {times} time{'s' if times != 1 else ''}; trained at "
            + _where(steps, ranked)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "sample": self.sample,
            "datasets": self.datasets,
            "drawn": sum(int(b["times"]) for b in self.batches),
            "trained_steps": [{"rank": r, "step": s} for r, s in self.trained_steps],
            "batches": self.batches,
            "answer": self.answer,
        }


def _trained_steps(batches: list[dict[str, Any]]) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    for b in batches:
        if b["step"] is not None and not b["no_grad"] and (b["rank"], b["step"]) not in seen:
            seen.append((int(b["rank"]), int(b["step"])))
    return seen


def _where(steps: list[tuple[int, int]], ranked: bool) -> str:
    # Several ranks: every step names its rank (rank 0 too), so the line says who trained on it.
    ranked = ranked or any(r for r, _ in steps)
    return (
        ", ".join(f"step {s}" + (f" (rank {r})" if ranked else "") for r, s in steps) or "no step"
    )


@dataclass
class BatchHistory:
    """Where one batch of an iterable dataset went, found by its content hash."""

    digest: str
    hashed: int  # batches of the run that have a content hash
    ranks: int  # streams (ranks) that recorded batches
    batches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trained_steps(self) -> list[tuple[int, int]]:
        """(rank, step) of every step that trained on it, as for a sample."""
        return _trained_steps(self.batches)

    @property
    def answer(self) -> str:
        shown = self.digest[:16]
        if not self.batches:
            if not self.hashed:
                return (
                    f"batch {shown} was never drawn: no batch of this run has a content hash (an "
                    "IterableDataset's batches are hashed under policy batch_hash_every > 0)"
                )
            return f"batch {shown} was never drawn ({self.hashed} batches hashed in this run)"
        times = len(self.batches)
        where = _where(self.trained_steps, self.ranks > 1)
        return (
            f"batch {shown} was drawn {times} time{'s' if times != 1 else ''}; trained at {where}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "hash": self.digest,
            "hashed_batches": self.hashed,
            "drawn": len(self.batches),
            "trained_steps": [{"rank": r, "step": s} for r, s in self.trained_steps],
            "batches": self.batches,
            "answer": self.answer,
        }


_HEX = re.compile("[0-9a-f]{8,64}")


def batch_history(q: DataQueries, digest: str) -> BatchHistory:
    """Every batch whose content hash is ``digest`` (or starts with it: at least 8 hex
    digits). Raises ``UsageError`` for text that is no hash, or a prefix of several."""
    text = digest.strip().lower()
    if not _HEX.fullmatch(text):
        raise UsageError(f"batch hash {digest!r} must be 8 to 64 hex digits (auditlog.batch_hash)")
    rows = q.batch_hash(text)
    found = {r["hash"] for r in rows}
    if len(found) > 1:
        raise UsageError(
            f"batch hash prefix {digest!r} matches {len(found)} hashes; give more digits"
        )
    hashed, ranks = q.hash_counts()
    return BatchHistory(found.pop() if found else text, hashed, ranks, rows)


def select_datasets(rows: list[dict[str, Any]], wanted: str | None) -> list[dict[str, Any]]:
    """The datasets ``--dataset`` names: an id, or a class name (the short name, or any
    part of the qualified one); None: every map-style dataset. Raises ``UsageError``
    when nothing matches, naming what there is."""
    maps = [r for r in rows if r.get("kind") == "map"]
    if wanted is None:
        return maps
    text = wanted.strip()
    if text.isdigit():
        found = [r for r in rows if r["dataset_id"] == int(text)]
    else:
        found = [
            r for r in rows if str(r["class"]).rsplit(".", 1)[-1] == text or text in str(r["class"])
        ]
    if not found:
        have = (
            ", ".join(f"{r['dataset_id']} ({str(r['class']).rsplit('.', 1)[-1]})" for r in rows)
            or "none"
        )
        raise UsageError(f"no dataset {wanted!r} in this run; its datasets: {have}")
    return found


def sample_history(q: DataQueries, index: int, dataset: str | None = None) -> SampleHistory:
    """Every batch that held sample ``index`` of the selected datasets (``select_datasets``)."""
    if index < 0:
        raise UsageError(f"sample index {index} is negative")
    rows = q.datasets()
    chosen = select_datasets(rows, dataset)
    iterable = [r for r in (chosen if dataset is not None else rows) if r.get("kind") == "iterable"]
    if iterable and (dataset is not None or not chosen):
        name = str(iterable[0]["class"]).rsplit(".", 1)[-1]
        raise UsageError(
            f"dataset {iterable[0]['dataset_id']} ({name}) is an IterableDataset: its samples have "
            "no index; ask which steps trained on one of its batches with --batch-hash H"
        )
    keys = [(int(r["stream"]), int(r["dataset_id"])) for r in chosen]
    shown = [
        {
            "rank": r["rank"],
            "dataset_id": r["dataset_id"],
            "class": r["class"],
            "length": r["length"],
            "fingerprint": r["fingerprint"],
        }
        for r in chosen
    ]
    return SampleHistory(index, shown, q.sample(index, keys))
