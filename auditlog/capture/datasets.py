"""What identifies a dataset and how a DataLoader draws from it (``dataset_seen``,
``loader_started``).

On the training thread only attributes are read (class, length, the objects
that hold the data: a ``TensorDataset``'s tensors, a file list, a Hugging Face
dataset's fingerprint and cache files); the payload is lazy
(``DatasetIdentity.resolve``), so hashing tensors and reading files happens on
the writer thread, bounded (``core/datafiles.py``; tensors: ``TENSOR_LIMIT``).

What is recognised, in order:

- ``torch.utils.data.Subset``: the inner dataset's identity and the SHA-256 of
  the subset's indices (sample ``i`` of the subset is sample ``indices[i]`` of
  the inner one); ``ConcatDataset``: each part's identity;
- ``TensorDataset`` (anything with a ``tensors`` tuple of tensors): each
  tensor's content hash (``auditlog.tensor_hash``, the snapshots' hash);
- a Hugging Face ``datasets.Dataset``: its ``_fingerprint`` (the library's own
  hash of the data and every transform applied), rows and columns, and its
  Arrow ``cache_files`` identified like any file;
- a file list: ``samples`` or ``imgs`` (torchvision's ``ImageFolder`` and
  ``DatasetFolder``: ``(path, class)`` pairs), ``files`` or ``paths`` (paths);
- anything else, and every ``IterableDataset``: ``method: unidentified`` with
  the reason. ``run.annotate`` stays the place for what code cannot see
  (licence, consent, source URL).

The ``fingerprint`` is SHA-256 over the identity's content (never over its
timings), so two runs over the same data agree and a changed byte of a hashed
file, or a changed tensor element, changes it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import data as tud

from auditlog.capture.loader_compat import is_iterable_dataset, worker_base_seed
from auditlog.capture.registrations import class_name
from auditlog.core.datafiles import identify_files
from auditlog.core.tensors import dtype_name, tensor_hash

TENSOR_LIMIT = 1 << 30
"""Bytes of a TensorDataset's tensors hashed, all together; larger ones are described by
shape and dtype only (``hashed: false``)."""
DEPTH_LIMIT = 4
"""Nesting of Subset/ConcatDataset followed."""


def _length(obj: Any) -> int | None:
    try:
        return len(obj) if hasattr(type(obj), "__len__") else None
    except Exception:  # a __len__ that raises (an IterableDataset, say): no length
        return None


def _path_of(item: Any) -> str | None:
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        return path if isinstance(path, str) else None
    return None


class DatasetIdentity:
    """A dataset's identity, taken on the training thread, resolved on the writer's."""

    __slots__ = ("_source", "length", "name")

    def __init__(self, dataset: Any, depth: int = 0) -> None:
        self.name = class_name(dataset)
        self.length = _length(dataset)
        self._source = _source(dataset, depth)

    def resolve(self) -> dict[str, Any]:
        """The identity as clean data (run by the writer, once), with its fingerprint."""
        source, self._source = self._source, ("unidentified", "resolved twice")
        try:
            identity = _identify(source)
        except Exception as exc:  # whatever the dataset holds, the record says why not
            identity = {"method": "unidentified", "reason": f"{type(exc).__name__}: {exc}"[:500]}
        identity["fingerprint"] = fingerprint(identity)
        return identity


def _source(dataset: Any, depth: int) -> tuple[Any, ...]:
    """What identifies ``dataset``, as references to read later (no copies, no hashing)."""
    if isinstance(dataset, tud.IterableDataset):
        return ("unidentified", "an IterableDataset: its samples exist only as it yields them")
    if depth < DEPTH_LIMIT and isinstance(dataset, tud.Subset):
        return ("subset", DatasetIdentity(dataset.dataset, depth + 1), dataset.indices)
    if depth < DEPTH_LIMIT and isinstance(dataset, tud.ConcatDataset):
        return ("concat", [DatasetIdentity(part, depth + 1) for part in dataset.datasets])
    tensors = getattr(dataset, "tensors", None)
    if (
        isinstance(tensors, (tuple, list))
        and tensors
        and all(isinstance(t, torch.Tensor) for t in tensors)
    ):
        return ("tensors", tuple(tensors))
    if type(dataset).__module__.split(".")[0] == "datasets" and hasattr(dataset, "_fingerprint"):
        files = [
            f.get("filename")
            for f in getattr(dataset, "cache_files", None) or ()
            if isinstance(f, dict)
        ]
        return (
            "hf_datasets",
            str(getattr(dataset, "_fingerprint", None)),
            [f for f in files if isinstance(f, str)],
            _length(dataset),
            list(getattr(dataset, "column_names", None) or ()),
        )
    for attr in ("samples", "imgs", "files", "paths"):
        items = getattr(dataset, attr, None)
        if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or not items:
            continue
        if _path_of(items[0]) is not None:
            root = getattr(dataset, "root", None)
            return (
                "files",
                attr,
                items,
                os.fspath(root) if isinstance(root, (str, os.PathLike)) else None,
            )
    return (
        "unidentified",
        f"no tensors, file list or fingerprint the recorder knows ({class_name(dataset)})",
    )


def _identify(source: tuple[Any, ...]) -> dict[str, Any]:
    method = source[0]
    if method == "tensors":
        return _tensors(source[1])
    if method == "files":
        _, attr, items, root = source
        paths = [p for p in (_path_of(item) for item in list(items)) if p is not None]
        return {"method": "files", "attribute": attr, "root": root, **identify_files(paths)}
    if method == "hf_datasets":
        _, hf_fingerprint, files, rows, columns = source
        out: dict[str, Any] = {
            "method": "hf_datasets",
            "hf_fingerprint": hf_fingerprint,
            "rows": rows,
            "columns": columns,
        }
        if files:
            out.update(identify_files(files))
        return out
    if method == "subset":
        _, inner, indices = source
        ints = [int(i) for i in indices]
        digest = hashlib.sha256(",".join(map(str, ints)).encode()).hexdigest()
        return {
            "method": "subset",
            "indices": len(ints),
            "indices_sha256": digest,
            "of": _part(inner),
        }
    if method == "concat":
        return {"method": "concat", "parts": [_part(p) for p in source[1]]}
    return {"method": "unidentified", "reason": source[1]}


def _part(inner: DatasetIdentity) -> dict[str, Any]:
    return {"class": inner.name, "length": inner.length, **inner.resolve()}


def _tensors(tensors: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    total = sum(t.numel() * t.element_size() for t in tensors)
    hashed = total <= TENSOR_LIMIT
    items = []
    for t in tensors:
        item: dict[str, Any] = {
            "shape": list(t.shape),
            "dtype": dtype_name(t.dtype),
            "device": str(t.device),
        }
        if hashed:
            item["sha256"] = tensor_hash(t)
        items.append(item)
    out: dict[str, Any] = {
        "method": "tensors",
        "tensors": items,
        "bytes_total": total,
        "hashed": hashed,
    }
    if not hashed:
        out["reason"] = (
            f"{total} bytes, over the {TENSOR_LIMIT}-byte bound: described by shape and dtype only"
        )
    return out


def fingerprint(identity: dict[str, Any]) -> str | None:
    """SHA-256 over what identifies the data (timings and listings left out: the
    file list's own hash covers every file); None for an unidentified dataset."""
    if identity.get("method") == "unidentified":
        return None
    if identity.get("method") == "tensors" and not identity.get("hashed"):
        return None
    core = {
        k: v for k, v in identity.items() if k not in ("hashing", "files", "fingerprint", "reason")
    }
    text = json.dumps(core, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------- loaders
def _seed(generator: Any) -> int | None:
    return int(generator.initial_seed()) if isinstance(generator, torch.Generator) else None


def loader_config(loader: tud.DataLoader[Any], iterator: Any) -> dict[str, Any]:
    """How the loader draws, read at an iterator start (plain attribute reads: nothing
    here calls the sampler or touches a generator's state)."""
    batch_sampler = loader.batch_sampler
    sampler = loader.sampler
    inner = getattr(batch_sampler, "sampler", None)
    if inner is not None and inner is not sampler and isinstance(inner, tud.Sampler):
        # A loader built with batch_sampler= (Accelerate, the HF Trainer) keeps a default
        # SequentialSampler it never uses: describe the one its batch sampler draws from.
        sampler = inner
    config: dict[str, Any] = {
        "batch_size": loader.batch_size
        if loader.batch_size is not None
        else getattr(batch_sampler, "batch_size", None),
        "drop_last": bool(loader.drop_last),
        "shuffle": _shuffles(sampler),
        "num_workers": int(loader.num_workers),
        "persistent_workers": bool(loader.persistent_workers),
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor,
        "in_order": bool(getattr(loader, "in_order", True)),
        "sampler": class_name(sampler),
        "batch_sampler": None if batch_sampler is None else class_name(batch_sampler),
        "generator_seed": _seed(loader.generator),
        "sampler_seed": _seed(getattr(sampler, "generator", None)),
        "worker_base_seed": worker_base_seed(iterator),
        "collate_fn": getattr(loader.collate_fn, "__qualname__", None)
        or class_name(loader.collate_fn),
        "batches": None if is_iterable_dataset(loader) else _length(loader),
    }
    if isinstance(sampler, tud.RandomSampler):
        config["sampler_state"] = {
            "replacement": bool(sampler.replacement),
            "num_samples": sampler.num_samples,
        }
    elif isinstance(sampler, tud.DistributedSampler):
        config["sampler_state"] = {
            "num_replicas": sampler.num_replicas,
            "rank": sampler.rank,
            "epoch": sampler.epoch,
            "seed": sampler.seed,
            "shuffle": sampler.shuffle,
            "drop_last": sampler.drop_last,
        }
    return config


def _shuffles(sampler: Any) -> bool | None:
    if isinstance(sampler, tud.RandomSampler):
        return True
    if isinstance(sampler, tud.SequentialSampler):
        return False
    if isinstance(sampler, tud.DistributedSampler):
        return bool(sampler.shuffle)
    return None  # a custom sampler: its class is recorded
