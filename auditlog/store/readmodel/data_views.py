"""The data views of ``auditlog query``: the datasets a run iterated and every batch it drew.

Part of the documented query surface (``views.VIEWS`` splices them in). The
events are ``dataset_seen``, ``loader_started`` and ``batches``
(``capture/data.py``, docs/data.md).
"""

from __future__ import annotations

from auditlog.core.ranks import STREAM_STRIDE
from auditlog.store.readmodel.columns import _RUN, _SEQ, _STREAM, _TIME, View, _c

DATA_VIEWS: tuple[View, ...] = (
    View(
        "datasets",
        "One row per dataset a DataLoader iterated, per stream (dataset_seen), with its "
        "identity, how often it was iterated and how many of its samples were drawn.",
        (
            _RUN,
            _STREAM,
            _c("rank", "INTEGER", "the rank that recorded the stream"),
            _SEQ,
            _TIME,
            _c("dataset_id", "BIGINT", "per-run id of the dataset object in its stream"),
            _c("class", "VARCHAR", "qualified class name"),
            _c("kind", "VARCHAR", "map | iterable"),
            _c("length", "BIGINT", "len(dataset), null when it has none"),
            _c(
                "method",
                "VARCHAR",
                "how it is identified: tensors | files | hf_datasets | subset | concat | "
                "unidentified",
            ),
            _c(
                "fingerprint",
                "VARCHAR",
                "SHA-256 over its identity (null when unidentified): equal data, equal fingerprint",
            ),
            _c("reason", "VARCHAR", "why it is unidentified (or not hashed)"),
            _c("files", "BIGINT", "files it lists (files, hf_datasets)"),
            _c("bytes", "BIGINT", "bytes of its files or tensors"),
            _c("identity", "JSON", "the whole identity (dataset_seen.identity)"),
            _c("epochs", "BIGINT", "iterator starts of loaders over it (loader_started)"),
            _c("batches", "BIGINT", "batches drawn from it"),
            _c("samples_drawn", "BIGINT", "indices drawn, repeats counted"),
            _c("distinct_samples", "BIGINT", "distinct indices drawn"),
            _c("coverage", "DOUBLE", "distinct_samples / length (null without a length)"),
            _c(
                "hashed_batches",
                "BIGINT",
                "batches with a content hash (iterable datasets: policy batch_hash_every)",
            ),
            _c("distinct_hashes", "BIGINT", "distinct batch content hashes"),
        ),
        f"""
        WITH d AS (
            SELECT run_id, stream, seq, ts_ns,
                   TRY_CAST(payload::JSON ->> 'dataset_id' AS BIGINT) AS dataset_id,
                   payload::JSON ->> 'class' AS class, payload::JSON ->> 'kind' AS kind,
                   TRY_CAST(payload::JSON ->> 'length' AS BIGINT) AS length,
                   payload::JSON -> 'identity' AS identity
            FROM {{events}} WHERE kind = 'dataset_seen'),
        starts AS (
            SELECT run_id, stream, TRY_CAST(payload::JSON ->> 'dataset_id' AS BIGINT) AS dataset_id,
                   count(*) AS epochs
            FROM {{events}} WHERE kind = 'loader_started' GROUP BY ALL),
        drawn AS (
            SELECT run_id, stream, dataset_id, count(*) AS batches, sum(len(indices))::BIGINT AS samples_drawn,
                   count(hash) AS hashed_batches, count(DISTINCT hash) AS distinct_hashes
            FROM {{batches}} GROUP BY ALL),
        distinct_drawn AS (
            SELECT run_id, stream, dataset_id, count(DISTINCT i) AS distinct_samples
            FROM (SELECT run_id, stream, dataset_id, unnest(indices) AS i FROM {{batches}})
            GROUP BY ALL)
        SELECT d.run_id, d.stream, (d.stream % {STREAM_STRIDE})::INTEGER AS rank, d.seq,
               make_timestamp(d.ts_ns // 1000) AS time, d.dataset_id AS dataset_id, d.class AS class,
               d.kind AS kind, d.length AS length, d.identity ->> 'method' AS method,
               d.identity ->> 'fingerprint' AS fingerprint, d.identity ->> 'reason' AS reason,
               TRY_CAST(d.identity ->> 'files_total' AS BIGINT) AS files,
               TRY_CAST(d.identity ->> 'bytes_total' AS BIGINT) AS bytes,
               d.identity AS identity, coalesce(s.epochs, 0) AS epochs, coalesce(b.batches, 0) AS batches,
               coalesce(b.samples_drawn, 0) AS samples_drawn, coalesce(x.distinct_samples, 0) AS distinct_samples,
               x.distinct_samples / nullif(d.length, 0) AS coverage,
               coalesce(b.hashed_batches, 0) AS hashed_batches, coalesce(b.distinct_hashes, 0) AS distinct_hashes
        FROM d
        LEFT JOIN starts s ON s.run_id = d.run_id AND s.stream = d.stream AND s.dataset_id = d.dataset_id
        LEFT JOIN drawn b ON b.run_id = d.run_id AND b.stream = d.stream AND b.dataset_id = d.dataset_id
        LEFT JOIN distinct_drawn x
            ON x.run_id = d.run_id AND x.stream = d.stream AND x.dataset_id = d.dataset_id
        """,
    ),
    View(
        "batches",
        "One row per batch a DataLoader returned, with the sample indices its sampler yielded "
        "for it and the optimizer step that trained on it. Which steps trained on sample 7: "
        "select step, rank from batches where list_contains(indices, 7).",
        (
            _RUN,
            _STREAM,
            _c(
                "rank",
                "INTEGER",
                "the rank that recorded the stream (DistributedSampler: its shard)",
            ),
            _c("seq", "BIGINT", "sequence number of the batches event holding it"),
            _c(
                "step",
                "BIGINT",
                "the optimizer step that trained on it: the first to complete after it left "
                "the loader (after_step + 1); null when no step completed after it",
            ),
            _c("after_step", "BIGINT", "optimizer steps completed when it left the loader"),
            _TIME,
            _c("loader_id", "BIGINT", "per-run id of the DataLoader"),
            _c("dataset_id", "BIGINT", "the dataset it was drawn from (datasets.dataset_id)"),
            _c("epoch", "BIGINT", "the loader's iteration (0-based, per loader)"),
            _c("batch", "BIGINT", "position of the batch in its epoch (0-based)"),
            _c("size", "BIGINT", "number of indices (null for iterable datasets)"),
            _c(
                "indices",
                "BIGINT[]",
                "the sample indices, in the order the sampler yielded them (null for "
                "iterable datasets and indices that were not integers)",
            ),
            _c(
                "no_grad",
                "BOOLEAN",
                "it left the loader with gradients disabled (an evaluation loop)",
            ),
            _c(
                "hash",
                "VARCHAR",
                "an iterable dataset's batch: its content hash (auditlog.batch_hash, SHA-256 "
                "hex; null when the policy did not sample it or it could not be hashed)",
            ),
        ),
        f"""
        WITH last AS (
            SELECT run_id, stream, max(step) AS steps FROM {{events}} WHERE kind = 'optimizer_step'
            GROUP BY ALL)
        SELECT b.run_id, b.stream, (b.stream % {STREAM_STRIDE})::INTEGER AS rank, b.seq,
               CASE WHEN b.after_step < l.steps THEN b.after_step + 1 END AS step, b.after_step,
               make_timestamp(b.ts_ns // 1000) AS time, b.loader_id, b.dataset_id, b.epoch,
               b.position AS batch, b.size, b.indices, b.no_grad, b.hash
        FROM {{batches}} b
        LEFT JOIN last l ON l.run_id = b.run_id AND l.stream = b.stream
        """,
    ),
)
