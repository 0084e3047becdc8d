"""The training views of ``auditlog query``: steps across ranks, metrics, skipped steps.

Part of the documented query surface (``views.VIEWS`` splices them in, in this order).
"""

from __future__ import annotations

from auditlog.core.ranks import STREAM_STRIDE
from auditlog.store.readmodel.columns import _MODULE_ID, _RUN, _SEQ, _STREAM, _TIME, View, _c

TRAINING_VIEWS: tuple[View, ...] = (
    View(
        "rank_steps",
        "One row per optimizer step and stream of a run, beside the same step on the run's other "
        "ranks: a rank whose gradients or parameters drift from the others (a desynchronized "
        "or diverging rank) shows a spread. DDP averages gradients, so its ranks agree exactly; "
        "loss differs per rank (each sees its own batch).",
        (
            _RUN,
            _STREAM,
            _c("rank", "INTEGER", "the rank that recorded the stream (stream % 1000000)"),
            _c(
                "segment",
                "INTEGER",
                "0 for the first launch, then one per elastic restart (stream // 1000000)",
            ),
            _c("step", "BIGINT", "the rank's step count after this step (1-based)"),
            _TIME,
            _c(
                "grad_norm",
                "DOUBLE",
                "total L2 norm of the rank's gradients at this step (all parameters)",
            ),
            _c(
                "param_norm",
                "DOUBLE",
                "total L2 norm of the rank's parameters after the step (steps with "
                "norms, see norms_every)",
            ),
            _c(
                "loss",
                "DOUBLE",
                "the step's training loss: the mean loss of the metrics view for the "
                "iteration this step ended, else annotate('loss', value=...) made at this step count, else "
                "the scalar output of a loss module in the step's sampled activity; null otherwise",
            ),
            _c("ranks", "BIGINT", "ranks of the same segment that recorded this step"),
            _c("grad_norm_min", "DOUBLE", "smallest grad_norm of any rank at this step"),
            _c("grad_norm_max", "DOUBLE", "largest grad_norm of any rank at this step"),
            _c(
                "grad_norm_spread",
                "DOUBLE",
                "(max - min) / max of grad_norm across ranks (0: in sync)",
            ),
            _c(
                "param_norm_spread",
                "DOUBLE",
                "(max - min) / max of param_norm across ranks (0: in sync)",
            ),
            _c("loss_mean", "DOUBLE", "mean loss across ranks at this step"),
            _c("loss_spread", "DOUBLE", "(max - min) / max(|loss|) across ranks"),
        ),
        f"""
        WITH g AS (
            SELECT run_id, stream, step, max(ts_ns) AS ts_ns,
                   sqrt(sum(grad_norm * grad_norm)) AS grad_norm,
                   sqrt(sum(param_norm * param_norm)) AS param_norm
            FROM {{steps}} GROUP BY run_id, stream, step
        ),
        la AS (
            SELECT run_id, stream, step,
                   arg_max(TRY_CAST(payload::JSON ->> '$.fields.value' AS DOUBLE), seq) AS loss
            FROM {{events}}
            WHERE kind = 'annotation' AND payload::JSON ->> 'key' = 'loss'
            GROUP BY run_id, stream, step
        ),
        lm AS (
            SELECT f.run_id, f.stream, f.step + 1 AS step, arg_max(f.mean, f.seq * 1000000 + f.call) AS loss
            FROM {{forward_stats}} f
            JOIN {{modules}} m ON m.run_id = f.run_id AND m.stream = f.stream AND m.module_id = f.module_id
            WHERE m.depth = 0 AND m.class LIKE '%Loss' AND f.output = 0 AND f.numel = 1
            GROUP BY f.run_id, f.stream, f.step
        ),
        mt AS (
            SELECT run_id, stream, step + 1 AS step, avg(value) AS loss
            FROM {{metrics}}
            WHERE name = 'loss' AND user_step IS NULL AND NOT skipped
            GROUP BY run_id, stream, step
        ),
        r AS (
            SELECT g.run_id, g.stream, g.step, g.ts_ns, g.grad_norm, g.param_norm,
                   coalesce(mt.loss, la.loss, lm.loss) AS loss,
                   g.stream // {STREAM_STRIDE} AS segment
            FROM g
            LEFT JOIN mt ON mt.run_id = g.run_id AND mt.stream = g.stream AND mt.step = g.step
            LEFT JOIN la ON la.run_id = g.run_id AND la.stream = g.stream AND la.step = g.step
            LEFT JOIN lm ON lm.run_id = g.run_id AND lm.stream = g.stream AND lm.step = g.step
        )
        SELECT run_id, stream, (stream % {STREAM_STRIDE})::INTEGER AS rank, segment::INTEGER AS segment,
               step, make_timestamp(ts_ns // 1000) AS time, grad_norm, param_norm, loss,
               count(*) OVER w AS ranks,
               min(grad_norm) OVER w AS grad_norm_min,
               max(grad_norm) OVER w AS grad_norm_max,
               (max(grad_norm) OVER w - min(grad_norm) OVER w) / nullif(max(grad_norm) OVER w, 0)
                   AS grad_norm_spread,
               (max(param_norm) OVER w - min(param_norm) OVER w) / nullif(max(param_norm) OVER w, 0)
                   AS param_norm_spread,
               avg(loss) OVER w AS loss_mean,
               (max(loss) OVER w - min(loss) OVER w) / nullif(max(abs(loss)) OVER w, 0) AS loss_spread
        FROM r
        WINDOW w AS (PARTITION BY run_id, segment, step)
        """,
    ),
    View(
        "metrics",
        "One row per recorded metric value: the training loss recorded with no code change "
        "(loss modules, model outputs carrying a loss) and values logged with auditlog.log().",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _c(
                "step",
                "BIGINT",
                "the step the value belongs to: the user's step= when given, else the "
                "optimizer steps completed when it was computed (the first iteration's loss is step 0)",
            ),
            _TIME,
            _c(
                "name",
                "VARCHAR",
                "loss | eval_loss (computed without grad) | backward_loss (the scalar "
                "backward() started from, when it was not the recorded loss itself: divided for "
                "accumulation, a sum of losses) | the name given to auditlog.log",
            ),
            _c("value", "DOUBLE", "the value (NaN/inf when it was not finite)"),
            _c(
                "origin",
                "VARCHAR",
                "loss_module | model_output | backward (the scalar a backward() "
                "started from; unscaled when a GradScaler scaled it) | user",
            ),
            _MODULE_ID,
            _c("module", "VARCHAR", "the module whose output it was (null for user values)"),
            _c("run_step", "BIGINT", "optimizer steps completed when it was recorded"),
            _c("position", "INTEGER", "position in its event (0-based)"),
            _c(
                "skipped",
                "BOOLEAN",
                "the value belongs to an iteration whose optimizer step was skipped "
                "(see skipped_steps): not counted as that step's loss",
            ),
        ),
        """
        SELECT m.run_id, m.stream, m.seq, coalesce(m.user_step, m.step) AS step,
               make_timestamp(m.ts_ns // 1000) AS time, m.name, m.value, m.origin, m.module_id,
               m.module, m.step AS run_step, m.position, m.skipped
        FROM {metrics} m
        """,
    ),
    View(
        "skipped_steps",
        "One row per optimizer step that did not happen: a GradScaler found inf/NaN gradients and "
        "skipped optimizer.step() (or a fused optimizer skipped its update).",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _c(
                "step",
                "BIGINT",
                "the run's step count when it was skipped (the steps completed before)",
            ),
            _TIME,
            _c("optimizer_id", "BIGINT", "per-run id of the optimizer"),
            _c("optimizer_class", "VARCHAR", "qualified optimizer class"),
            _c("reason", "VARCHAR", "why the step was skipped"),
            _c(
                "scale",
                "DOUBLE",
                "the GradScaler's loss scale when it skipped (before its update lowers it)",
            ),
        ),
        """
        SELECT e.run_id, e.stream, e.seq, e.step, make_timestamp(e.ts_ns // 1000) AS time,
               TRY_CAST(e.payload::JSON ->> 'optimizer_id' AS BIGINT) AS optimizer_id,
               e.payload::JSON ->> 'optimizer_class' AS optimizer_class,
               e.payload::JSON ->> 'reason' AS reason,
               TRY_CAST(e.payload::JSON ->> 'scale' AS DOUBLE) AS scale
        FROM {events} e
        WHERE e.kind = 'step_skipped'
        """,
    ),
)
