"""Event kinds of the data a run trained on: datasets, loader iterations, batches
(``core.kinds`` gathers every kind; docs/data.md)."""

from __future__ import annotations

from auditlog.core.eventtypes import (
    ANY,
    BOOL,
    INT,
    INTS,
    NULL,
    OBJ,
    STR,
    F,
    Kind,
    ListOf,
    enum,
    obj,
)

DATA_KINDS: list[Kind] = [
    Kind(
        "dataset_seen",
        "A dataset a DataLoader iterated, the first time the run saw it (each dataset object once "
        "per stream), with what identifies its data; the identity is resolved off the training "
        "thread (docs/data.md). Annotations stay the place for what code cannot see (licence, "
        "consent, source URL).",
        {
            "dataset_id": F(
                INT, "per-run id of the dataset object (loader_started and batches name it)"
            ),
            "class": F(STR, "qualified class name of the dataset"),
            "kind": F(
                enum("map", "iterable"),
                "map (indexed by a sampler) | iterable (an IterableDataset)",
            ),
            "length": F(INT | NULL, "len(dataset), or null when it has none"),
            "identity": F(
                obj(method=STR, fingerprint=STR | NULL, more=ANY),
                "{method, fingerprint, ...}: "
                "method tensors (a TensorDataset: tensors [{shape, dtype, device, sha256}] by "
                "auditlog.tensor_hash, bytes_total, hashed: false with reason over 1 GiB) | files "
                "(samples/imgs/files/paths: attribute, root, files_total, bytes_total, files: the first 1000 "
                "as {path, size, method sha256 | size_mtime | missing | unreadable | special | path, "
                "identity}, files_sha256 over every file, hashing: {methods, file_limit, total_limit, "
                "seconds_limit, stat_limit, bytes_read, seconds, truncated?}) | hf_datasets (hf_fingerprint, "
                "rows, columns, and the cache files as for files) | subset (indices, indices_sha256, of: the "
                "inner identity with its class and length) | concat (parts) | unidentified (reason); "
                "fingerprint: SHA-256 over the identity without timings (null when unidentified): equal data, "
                "equal fingerprint",
            ),
        },
    ),
    Kind(
        "loader_started",
        "A DataLoader iterator started (iter(loader): an epoch). Its configuration as it is then; "
        "reading it calls no sampler and touches no generator.",
        {
            "loader_id": F(INT, "per-run id of the DataLoader object"),
            "dataset_id": F(INT, "the dataset it draws from (dataset_seen)"),
            "epoch": F(
                INT, "iterations of this loader started before this one in the run (0-based)"
            ),
            "loader_class": F(STR, "qualified class name of the loader"),
            "config": F(
                OBJ,
                "{batch_size, drop_last, shuffle (true/false for "
                "Random/Sequential/DistributedSampler, null for a custom sampler), num_workers, "
                "persistent_workers, pin_memory, prefetch_factor, in_order (false: batches may pair with the "
                "wrong indices among those in flight), sampler, batch_sampler (class names), generator_seed "
                "(the loader generator's initial seed, null without one), sampler_seed (the sampler "
                "generator's; null: seeded from torch's global RNG), worker_base_seed, collate_fn, batches "
                "(len(loader); null for iterable datasets), sampler_state (RandomSampler: replacement, "
                "num_samples; DistributedSampler: num_replicas, rank, epoch, seed, shuffle, drop_last)}",
            ),
        },
    ),
    Kind(
        "batches",
        "Batches a DataLoader iterator returned, in order, with the sample indices each was drawn "
        "from (the sampler's, in the main process, whatever num_workers), or for an IterableDataset "
        "their content hashes. Emitted every 256 batches of an iterator (sooner when the batches held"
        " for hashing reach 16 MiB), at its end, at its next epoch and at run end.",
        {
            "loader_id": F(INT, "the loader (loader_started)"),
            "dataset_id": F(INT, "its dataset (dataset_seen)"),
            "epoch": F(INT, "the loader iteration they belong to"),
            "first": F(INT, "position in the epoch of the first batch here (0-based)"),
            "count": F(INT, "number of batches"),
            "steps": F(
                INTS,
                "per batch, the optimizer steps completed when it left the loader: it trained the"
                " next step to complete (steps + 1); packed like tensor_ids (readers decode it to the list)",
            ),
            "sizes": F(
                INTS,
                "per batch, the number of indices, packed like tensor_ids (absent for iterable "
                "datasets)",
                optional=True,
            ),
            "indices": F(
                INTS,
                "every batch's indices, concatenated in order, packed like tensor_ids (absent "
                "for iterable datasets)",
                optional=True,
            ),
            "no_grad": F(
                ListOf(INT),
                "positions of batches that left the loader with gradients disabled "
                "(evaluation), only when some",
                optional=True,
            ),
            "opaque": F(
                ListOf(INT),
                "positions of batches whose indices were not integers (size 0), only when some",
                optional=True,
            ),
            "iterable": F(
                BOOL, "true for an IterableDataset: batches counted, no indices", optional=True
            ),
            "hashes": F(
                ListOf(STR | NULL),
                "iterable datasets, policy batch_hash_every > 0: per batch, its "
                "content hash (auditlog.batch_hash: SHA-256 over the batch's tensors, nesting and values, lowercase"
                " hex; docs/data.md), null for batches the policy did not sample or that could not be hashed",
                optional=True,
            ),
            "hash_errors": F(
                ListOf(obj(position=INT, reason=STR)),
                "list of {position, reason}: batches taken "
                "for hashing that have no hash (a tensor changed in place before the writer hashed it, more than "
                "4096 items to walk on the training thread, a value that cannot be encoded), only when some",
                optional=True,
            ),
        },
    ),
]
