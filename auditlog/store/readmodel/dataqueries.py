"""The data questions over one run's views (``auditlog data``; answers in ``read/data.py``).

SQL lives in the store; the read side asks by method, as with ``forensics.py``.
"""

from __future__ import annotations

from typing import Any

from auditlog.core.ranks import STREAM_STRIDE
from auditlog.store.readmodel.forensics import ForensicQueries


class DataQueries(ForensicQueries):
    """The datasets a run iterated, its loaders' iterations, and where a sample went."""

    def datasets(self) -> list[dict[str, Any]]:
        """One row per dataset and stream (the ``datasets`` view), identity as JSON text."""
        return self.rows(
            "SELECT * EXCLUDE (identity, time), identity::VARCHAR AS identity FROM datasets "
            "ORDER BY stream, dataset_id"
        )

    def loader_starts(self) -> list[dict[str, Any]]:
        """Every iterator start (``loader_started``) in order, configuration as JSON text."""
        return self.rows(
            f"""
            SELECT stream, (stream % {STREAM_STRIDE})::INTEGER AS rank, seq, step,
                   TRY_CAST(payload::JSON ->> 'loader_id' AS BIGINT) AS loader_id,
                   TRY_CAST(payload::JSON ->> 'dataset_id' AS BIGINT) AS dataset_id,
                   TRY_CAST(payload::JSON ->> 'epoch' AS BIGINT) AS epoch,
                   payload::JSON ->> 'loader_class' AS loader_class,
                   (payload::JSON -> 'config')::VARCHAR AS config
            FROM events WHERE kind = 'loader_started' ORDER BY stream, seq
            """
        )

    def batch_hash(self, prefix: str) -> list[dict[str, Any]]:
        """Every batch whose content hash starts with ``prefix`` (lowercase hex), in stream
        and draw order."""
        return self.rows(
            "SELECT stream, rank, dataset_id, loader_id, epoch, batch, step, after_step, no_grad, hash "
            "FROM batches WHERE starts_with(hash, ?) ORDER BY stream, seq, batch",
            [prefix],
        )

    def hash_counts(self) -> tuple[int, int]:
        """(batches with a content hash, streams that recorded batches) of the run."""
        row = self.rows(
            "SELECT count(hash) AS hashed, count(DISTINCT stream) AS streams FROM batches"
        )[0]
        return int(row["hashed"]), int(row["streams"])

    def sample(self, index: int, dataset_ids: list[tuple[int, int]] | None) -> list[dict[str, Any]]:
        """Every batch that held sample ``index`` (``times``: how often within it), in
        ``(stream, dataset_id)`` pairs when given, in stream and draw order."""
        where = ""
        params: list[Any] = [index, index]
        if dataset_ids is not None:
            if not dataset_ids:
                return []
            where = (
                " AND (" + " OR ".join("(stream = ? AND dataset_id = ?)" for _ in dataset_ids) + ")"
            )
            params += [v for pair in dataset_ids for v in pair]
        return self.rows(
            "SELECT stream, rank, dataset_id, loader_id, epoch, batch, step, after_step, no_grad, "
            "len(list_filter(indices, lambda x: x = ?)) AS times "
            f"FROM batches WHERE list_contains(indices, ?){where} ORDER BY stream, seq, batch",
            params,
        )
