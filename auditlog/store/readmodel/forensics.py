"""The questions behind ``auditlog metrics``, ``nonfinite``, ``plot`` and ``report``, in SQL.

Each method answers one question over the documented views of a query session
scoped to one run (``QuerySession(readmodel, run_id)``), so every answer is
about that run only and comes from the same projection ``auditlog query``
reads. Rows come back as dicts; deciding what they mean (which module produced
a NaN, how to aggregate hundreds of modules into a picture) is the read layer's
job (``auditlog.read.forensics``, ``auditlog.read.series``).

Steps: views keep the record's convention (``step`` = optimizer steps completed
when the event happened), except ``steps``, whose ``step`` is the count after
the optimizer step. Methods that pair the two say so.
"""

from __future__ import annotations

from typing import Any

from auditlog.store.readmodel.querysession import QuerySession

# Per-module norms from per-parameter norms: the L2 norm of all a module's parameters.
_MODULE_NORMS = """
    SELECT module, step - 1 AS step,
           sqrt(sum(grad_norm * grad_norm)) AS grad_norm,
           sqrt(sum(param_norm * param_norm)) AS param_norm,
           sqrt(sum(update_norm * update_norm)) AS update_norm
    FROM steps
    WHERE module IS NOT NULL
    GROUP BY module, step
    ORDER BY module, step
"""


class ForensicQueries:
    """Named read questions over one run's views (see the module docstring)."""

    def __init__(self, session: QuerySession) -> None:
        if session.run_id is None:
            raise ValueError("forensic questions need a session scoped to one run")
        self.session = session

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of one of the questions below, as dicts."""
        cursor = self.session.con.execute(sql, params or [])
        columns = [str(d[0]) for d in cursor.description or []]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]

    # ------------------------------------------------------------------ run
    def run_row(self) -> dict[str, Any] | None:
        found = self.rows("SELECT * EXCLUDE (metadata), metadata::VARCHAR AS metadata FROM runs")
        return found[0] if found else None

    def annotations(self) -> list[dict[str, Any]]:
        return self.rows(
            'SELECT step, time, "key", fields::VARCHAR AS fields FROM annotations ORDER BY seq'
        )

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """Payloads (JSON text) of every event of one kind, in order."""
        return self.rows(
            "SELECT seq, step, time, module, payload::VARCHAR AS payload FROM events WHERE kind = ? "
            "ORDER BY stream, seq",
            [kind],
        )

    def kind_counts(self) -> dict[str, int]:
        return {
            str(r["kind"]): int(r["n"])
            for r in self.rows("SELECT kind, count(*) AS n FROM events GROUP BY kind")
        }

    # ------------------------------------------------------------------ structure
    def modules(self) -> list[dict[str, Any]]:
        """Every module with its own and total parameter counts (tied weights once)."""
        return self.rows(
            """
            WITH own AS (
                SELECT module_id, sum(numel) AS numel,
                       sum(CASE WHEN requires_grad THEN numel ELSE 0 END) AS trainable
                FROM parameters GROUP BY module_id)
            SELECT m.module_id, m.module, m.path, m.root, m.class, m.class_name, m.parent_id,
                   m.depth, m.ordinal, m.attr, m.source_file, m.source_line, m.source_function, m.source_kind,
                   coalesce(o.numel, 0)::BIGINT AS own_parameters,
                   coalesce(o.trainable, 0)::BIGINT AS own_trainable
            FROM modules m LEFT JOIN own o ON o.module_id = m.module_id
            WHERE m.stream = 0
            ORDER BY m.ordinal
            """
        )

    def module_order(self) -> dict[str, int]:
        """Module name -> its position in the model's order (``modules.ordinal``, stream 0),
        the order of heatmap rows; every name a module has (its aliases too)."""
        order: dict[str, int] = {}
        for row in self.rows(
            "SELECT module, aliases, ordinal FROM modules WHERE stream = 0 ORDER BY ordinal"
        ):
            for name in [row["module"], *(row["aliases"] or [])]:
                order.setdefault(str(name), int(row["ordinal"]))
        return order

    def parameter_totals(self) -> dict[str, int]:
        found = self.rows(
            "SELECT coalesce(sum(numel), 0)::BIGINT AS total, "
            "coalesce(sum(CASE WHEN requires_grad THEN numel ELSE 0 END), 0)::BIGINT AS trainable, "
            "count(*) AS tensors FROM parameters WHERE stream = 0"
        )
        return {k: int(v) for k, v in found[0].items()}

    def stream_spans(self) -> list[dict[str, Any]]:
        """Per stream (rank and segment): its first and last event time, seconds between them."""
        return self.rows(
            "SELECT stream, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns, "
            "(max(ts_ns) - min(ts_ns)) / 1e9 AS wall_s FROM events GROUP BY stream ORDER BY stream"
        )

    def datasets(self) -> list[dict[str, Any]]:
        """The datasets view of the run (stream 0): identity and how much of each was drawn."""
        return self.rows(
            "SELECT dataset_id, class, kind, length, method, fingerprint, reason, files, bytes, epochs, "
            "batches, samples_drawn, distinct_samples, hashed_batches, distinct_hashes FROM datasets WHERE stream = 0 "
            "ORDER BY dataset_id"
        )

    def parameter_devices(self) -> list[dict[str, Any]]:
        """Per stream (rank) and device: how many parameters lie there (the documentation's hardware)."""
        return self.rows(
            "SELECT stream, device, count(*) AS tensors FROM parameters GROUP BY stream, device "
            "ORDER BY stream, device"
        )

    # ------------------------------------------------------------------ curves
    def metric_summary(self) -> list[dict[str, Any]]:
        """Per metric name: its last finite value (and step), min, max and count."""
        return self.rows(
            "SELECT name, arg_max(value, step) AS last, min(value) AS min, max(value) AS max, max(step) AS step, "
            "count(*) AS n FROM metrics WHERE isfinite(value) GROUP BY name ORDER BY name"
        )

    def metrics(self) -> list[dict[str, Any]]:
        """Every metric value in record order."""
        return self.rows(
            "SELECT step, name, value, origin, module, run_step, time FROM metrics "
            "ORDER BY step, stream, seq, position"
        )

    def optimizer_steps(self) -> list[dict[str, Any]]:
        """Per optimizer step: the iteration it ended (``step`` - 1), the learning rate of the
        first param group, the global gradient norm the update used and the raw one (as the
        last backward left it; null where any parameter's is unknown), non-finite gradients."""
        return self.rows(
            """
            SELECT step - 1 AS iteration, step,
                   arg_min(lr, param_group) AS lr,
                   sqrt(sum(grad_norm * grad_norm)) AS grad_norm,
                   CASE WHEN count(raw_grad_norm) = count(grad_norm)
                        THEN sqrt(sum(raw_grad_norm * raw_grad_norm)) END AS raw_grad_norm,
                   max(nonfinite_grads) AS nonfinite_grads
            FROM steps WHERE stream = 0
            GROUP BY step ORDER BY step
            """
        )

    def has_loss(self) -> bool:
        """Was any training loss recorded (metrics named loss)?"""
        return bool(self.rows("SELECT 1 AS x FROM metrics WHERE name = 'loss' LIMIT 1"))

    def skipped_steps(self) -> list[dict[str, Any]]:
        """Optimizer steps that did not happen (a GradScaler skipped them), in order."""
        return self.rows(
            "SELECT step, optimizer_id, reason, scale FROM skipped_steps WHERE stream = 0 ORDER BY seq"
        )

    def learning_rates(self) -> list[dict[str, Any]]:
        """Per optimizer step and param group: the learning rate."""
        return self.rows(
            "SELECT DISTINCT step - 1 AS step, optimizer_id, param_group, lr FROM steps "
            "WHERE stream = 0 AND lr IS NOT NULL ORDER BY optimizer_id, param_group, step"
        )

    def module_norms(self) -> list[dict[str, Any]]:
        """Per module and iteration: the L2 norms of its parameters' gradients, values and updates."""
        return self.rows(_MODULE_NORMS)

    def activations(self) -> list[dict[str, Any]]:
        """Per module and sampled step: mean and std of its first output, and dead units."""
        return self.rows(
            """
            SELECT module, step, avg(mean) AS mean, avg(std) AS std,
                   sum(dead_units)::DOUBLE / nullif(sum(units), 0) AS dead_fraction,
                   sum(zeros)::DOUBLE / nullif(sum(numel), 0) AS zero_fraction
            FROM forward_stats
            WHERE output = 0 AND stream = 0 AND module IS NOT NULL
            GROUP BY module, step ORDER BY module, step
            """
        )

    # ------------------------------------------------------------------ non-finite
    def first_nonfinite(self) -> dict[str, Any]:
        """The first step with each kind of non-finite evidence (record convention: steps
        completed when it happened; optimizer-step evidence is moved to the iteration it ended)."""
        return self.rows(
            """
            SELECT
              (SELECT min(step) FROM forward_stats WHERE nan + inf > 0) AS forward,
              (SELECT min(step) FROM forward_stats WHERE input_nonfinite > 0) AS forward_input,
              (SELECT min(step) FROM backward_stats WHERE grad_nan + grad_inf > 0) AS backward,
              (SELECT min(run_step) FROM metrics WHERE name = 'loss' AND NOT isfinite(value)) AS loss,
              (SELECT min(run_step) FROM metrics WHERE NOT isfinite(value)) AS metric,
              (SELECT min(step) - 1 FROM steps WHERE NOT isfinite(grad_norm)) AS gradients,
              (SELECT min(step) - 1 FROM steps WHERE NOT isfinite(update_norm)) AS updates,
              (SELECT min(step) - 1 FROM steps WHERE NOT isfinite(param_norm)) AS parameters,
              (SELECT min(step) FROM events WHERE kind = 'nonfinite_found') AS caught
            """
        )[0]

    def activity_steps(self) -> dict[str, list[int]]:
        """Steps whose forward and backward module activity was recorded."""
        forward = [
            int(r["step"])
            for r in self.rows("SELECT DISTINCT step FROM forward_stats ORDER BY step")
        ]
        backward = [
            int(r["step"])
            for r in self.rows("SELECT DISTINCT step FROM backward_stats ORDER BY step")
        ]
        return {"forward": forward, "backward": backward}

    def last_step(self) -> int:
        found = self.rows("SELECT max(step) AS s FROM events")
        return int(found[0]["s"] or 0)

    def forward_calls(self, step: int) -> list[dict[str, Any]]:
        """Every forward call of one step in call order, its outputs' NaN/Inf summed."""
        return self.rows(
            """
            SELECT f.call, f.module_id, f.module, any_value(m.class) AS class,
                   any_value(m.source_file) AS source_file, any_value(m.source_line) AS source_line,
                   any_value(m.source_kind) AS source_kind,
                   sum(f.nan)::BIGINT AS nan, sum(f.inf)::BIGINT AS inf,
                   any_value(f.input_nonfinite) AS input_nonfinite
            FROM forward_stats f LEFT JOIN modules m ON m.module_id = f.module_id AND m.stream = f.stream
            WHERE f.step = ? AND f.stream = 0
            GROUP BY f.seq, f.call, f.module_id, f.module ORDER BY f.seq, f.call
            """,
            [step],
        )

    def backward_calls(self, step: int) -> list[dict[str, Any]]:
        """Every backward call of one step in the order autograd ran them."""
        return self.rows(
            """
            SELECT b.call, b.module_id, b.module, any_value(b.mechanism) AS mechanism,
                   any_value(m.class) AS class, any_value(m.source_file) AS source_file,
                   any_value(m.source_line) AS source_line, any_value(m.source_kind) AS source_kind,
                   coalesce(sum(b.grad_nan + b.grad_inf) FILTER (WHERE direction = 'output'), 0)::BIGINT
                       AS output_nonfinite,
                   sum(b.grad_nan + b.grad_inf) FILTER (WHERE direction = 'input')::BIGINT AS input_nonfinite
            FROM backward_stats b LEFT JOIN modules m ON m.module_id = b.module_id AND m.stream = b.stream
            WHERE b.step = ? AND b.stream = 0
            GROUP BY b.seq, b.call, b.module_id, b.module ORDER BY b.seq, b.call
            """,
            [step],
        )

    def nonfinite_parameters(self, optimizer_step: int) -> list[dict[str, Any]]:
        """Parameters whose gradient norm was not finite at one optimizer step (1-based)."""
        return self.rows(
            """
            SELECT s.parameter, s.module, s.grad_norm, m.source_file, m.source_line, m.source_kind
            FROM steps s LEFT JOIN modules m ON m.module = s.module AND m.stream = s.stream
            WHERE s.step = ? AND s.stream = 0 AND NOT isfinite(s.grad_norm)
            ORDER BY s.param_index
            """,
            [optimizer_step],
        )

    def caught(self) -> list[dict[str, Any]]:
        """``nonfinite_found`` events (policy nonfinite_check / keep_finite_state), in order."""
        return self.events_of("nonfinite_found")

    def parameter_names(self) -> dict[int, str]:
        """Parameter names by tensor id."""
        return {
            int(r["tensor_id"]): str(r["parameter"])
            for r in self.rows("SELECT tensor_id, parameter FROM parameters WHERE stream = 0")
        }

    def metrics_at(self, step: int) -> list[dict[str, Any]]:
        return self.rows(
            "SELECT name, value, origin, module FROM metrics WHERE run_step = ? ORDER BY seq, position",
            [step],
        )
