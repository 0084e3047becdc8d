"""The documented DuckDB views that ``auditlog query`` answers from.

This table is the single source of truth for the query surface: ``auditlog
schema`` prints it, the README's view reference is generated from it
(``python -m auditlog.store.readmodel.views``), and a test checks every view's real columns and
types against what is written here. The stored tables behind the views are an
implementation detail (``auditlog.store.readmodel.tables``); the views are the contract.

Each view's SQL names the stored tables as ``{events}``, ``{modules}`` ...;
``view_sql`` substitutes either the table or the table restricted to one run
(``auditlog query --run``), so every view, and every join inside one, is scoped
the same way.

Snapshots: ``snapshots`` lists snapshot events per tensor with the catalog's
facts; ``tensor_values`` reads the Parquet files themselves. Its source,
``{snapshot_values}``, is built per session by ``snapshot_values_sql`` from the
catalog: one ``read_parquet`` over an explicit file list per dtype, because a
single glob over files of mixed value types needs ``union_by_name``, which opens
every file's footer on every query, and breaks on a stray temporary file. With
explicit lists DuckDB prunes files by the ``sha256`` filter before opening them
(``where sha256 = ?`` reads one file). ``snapshot_catalog`` has no ``run_id``:
under ``--run`` it is restricted to the hashes that run snapshotted.
"""

from __future__ import annotations

from auditlog.store.readmodel.columns import (
    _CALL,
    _MODULE,
    _MODULE_ID,
    _RUN,
    _SEQ,
    _STEP,
    _STREAM,
    _TIME,
    Column,
    View,
    _c,
)
from auditlog.store.readmodel.data_views import DATA_VIEWS
from auditlog.store.readmodel.training_views import TRAINING_VIEWS
from auditlog.store.readmodel.viewsql import (  # re-exported: the SQL built from these views
    BASE_TABLES,
    NO_VALUES,
    RUNS_LIVE,
    UNSTREAMED,
    quote_literal,
    scoped_catalog,
    snapshot_values_sql,
    view_sql,
)


def _stats(prefix: str, what: str) -> tuple[Column, ...]:
    return (
        _c("shape", "BIGINT[]", f"shape of the {what}"),
        _c("dtype", "VARCHAR", f"dtype of the {what}"),
        _c("numel", "BIGINT", "number of elements"),
        _c(f"{prefix}norm", "DOUBLE", "L2 norm (NaN/inf when the tensor held them)"),
        _c(f"{prefix}mean", "DOUBLE", "mean"),
        _c(f"{prefix}std", "DOUBLE", "standard deviation"),
        _c(f"{prefix}min", "DOUBLE", "smallest element"),
        _c(f"{prefix}max", "DOUBLE", "largest element"),
        _c(f"{prefix}nan", "BIGINT", "number of NaN elements"),
        _c(f"{prefix}inf", "BIGINT", "number of infinite elements"),
    )


def _source(what: str) -> tuple[Column, ...]:
    return (
        _c("source_file", "VARCHAR", f"file of the user code that constructed the {what}"),
        _c("source_line", "INTEGER", "line in source_file"),
        _c("source_function", "VARCHAR", "function in source_file"),
    )


def _init() -> tuple[Column, ...]:
    return (
        _c("init_sha256", "VARCHAR", "content hash of the initial value (construction_sealed)"),
        _c("init_norm", "DOUBLE", "L2 norm of the initial value"),
        _c("init_mean", "DOUBLE", "mean of the initial value"),
        _c("init_std", "DOUBLE", "standard deviation of the initial value"),
        _c("init_min", "DOUBLE", "smallest initial element"),
        _c("init_max", "DOUBLE", "largest initial element"),
        _c("init_nan", "BIGINT", "NaN elements in the initial value"),
        _c("init_inf", "BIGINT", "infinite elements in the initial value"),
    )


_TENSOR_SQL = """
    SELECT t.run_id, t.stream, t.tensor_id, t.name AS {label}, t.aliases, t.module_id, t.module,
           t.attr, t.shape, t.numel, t.dtype, t.device, {flag}, t.source_file, t.source_line,
           t.source_function, t.init_sha256, t.init_norm, t.init_mean, t.init_std, t.init_min,
           t.init_max, t.init_nan, t.init_inf
    FROM {{tensors}} t
    WHERE t.role = '{role}'
"""

VIEWS: tuple[View, ...] = (
    View(
        "runs",
        "One row per run: status, duration, size and the code and environment it ran with "
        "(the same facts as `auditlog runs`).",
        (
            _RUN,
            _c("name", "VARCHAR", "user-given run name"),
            _c(
                "status",
                "VARCHAR",
                "completed | failed | interrupted | crashed | running | incomplete "
                "(several ranks: every stream of the last segment counts, see docs/distributed.md)",
            ),
            _c(
                "status_detail",
                "VARCHAR",
                "for multi-rank runs: the ranks that did not complete, and "
                "earlier segments (elastic restarts); null otherwise",
            ),
            _c("started", "TIMESTAMP", "start time (UTC)"),
            _c(
                "ended",
                "TIMESTAMP",
                "end time (UTC; the last stream's end), null while running or after a crash",
            ),
            _c("duration_s", "DOUBLE", "seconds from start to end (or to the last heartbeat)"),
            _c(
                "exit_code",
                "INTEGER",
                "process exit code when known (of the lowest rank with the run's status)",
            ),
            _c("steps", "BIGINT", "optimizer steps completed"),
            _c("events", "BIGINT", "events recorded, all streams"),
            _c("streams", "BIGINT", "streams (ranks) recorded"),
            _c("argv", "VARCHAR[]", "command line of the recorded program"),
            _c("git_commit", "VARCHAR", "git commit of the code being run"),
            _c("git_branch", "VARCHAR", "git branch"),
            _c("git_dirty", "BOOLEAN", "whether the work tree differed from the commit"),
            _c("git_diff_sha256", "VARCHAR", "hash of the uncommitted changes (dirty runs)"),
            _c("host", "VARCHAR", "host name"),
            _c("user", "VARCHAR", "login name"),
            _c("pid", "INTEGER", "process id"),
            _c("python", "VARCHAR", "Python version"),
            _c("torch", "VARCHAR", "torch version"),
            _c("cuda", "VARCHAR", "CUDA version torch was built with"),
            _c("world_size", "INTEGER", "distributed world size"),
            _c(
                "seed",
                "UBIGINT",
                "torch.initial_seed() when the run started (unsigned 64-bit: torch seeds "
                "reach 2^64 - 1)",
            ),
            _c("exception_type", "VARCHAR", "exception type of a failed run"),
            _c("exception_message", "VARCHAR", "exception message of a failed run"),
            _c("metadata", "JSON", "the whole run_started payload of stream 0"),
        ),
        """
        SELECT r.run_id, r.name, r.status, r.status_detail,
               make_timestamp(r.started_ns // 1000) AS started,
               make_timestamp(CASE WHEN r.status <> 'running' THEN x.last_ns END // 1000) AS ended,
               (coalesce(CASE WHEN r.status <> 'running' THEN x.last_ns END, r.last_seen_ns)
                - r.started_ns) / 1e9 AS duration_s,
               TRY_CAST(e.payload ->> 'exit_code' AS INTEGER) AS exit_code,
               coalesce(nullif(TRY_CAST(e.payload ->> 'steps' AS BIGINT), 0), c.max_step, 0) AS steps,
               coalesce(c.events, 0)::BIGINT AS events,
               coalesce(c.streams, 0)::BIGINT AS streams,
               from_json(s.payload -> 'argv', '["VARCHAR"]') AS argv,
               s.payload ->> '$.git.commit' AS git_commit,
               s.payload ->> '$.git.branch' AS git_branch,
               TRY_CAST(s.payload ->> '$.git.dirty' AS BOOLEAN) AS git_dirty,
               s.payload ->> '$.git.diff_sha256' AS git_diff_sha256,
               r.host,
               s.payload ->> 'user' AS "user",
               r.pid,
               s.payload ->> 'python' AS python,
               s.payload ->> 'torch' AS torch,
               s.payload ->> 'cuda' AS cuda,
               TRY_CAST(s.payload ->> 'world_size' AS INTEGER) AS world_size,
               TRY_CAST(s.payload ->> '$.seeds.torch_initial_seed' AS UBIGINT) AS seed,
               e.payload ->> '$.exception.type' AS exception_type,
               e.payload ->> '$.exception.message' AS exception_message,
               s.payload AS metadata
        FROM {runs_live} r
        LEFT JOIN {run_started} s ON s.run_id = r.run_id AND s.stream = 0
        LEFT JOIN (SELECT run_id, payload ->> 'status' AS status, arg_min(payload, stream) AS payload
                   FROM {run_ended} GROUP BY 1, 2) e ON e.run_id = r.run_id AND e.status = r.status
        LEFT JOIN (SELECT run_id, sum(events) AS events, max(max_step) AS max_step,
                          count(*) AS streams
                   FROM {stream_stats} GROUP BY run_id) c ON c.run_id = r.run_id
        LEFT JOIN (SELECT run_id, max(ts_ns) AS last_ns FROM {run_ended} GROUP BY run_id) x
            ON x.run_id = r.run_id
        ORDER BY r.started_ns
        """,
    ),
    View(
        "events",
        "Every event as stored, with the module and tensor names from replay.",
        (
            _c("id", "BIGINT", "insertion order in the event store"),
            _RUN,
            _STREAM,
            _SEQ,
            _c("ts_ns", "BIGINT", "wall-clock time in nanoseconds since the epoch"),
            _TIME,
            _c("kind", "VARCHAR", "event kind (see the event reference)"),
            _STEP,
            _MODULE_ID,
            _MODULE,
            _c("tensor_id", "BIGINT", "tensor identity within the run's stream"),
            _c("tensor", "VARCHAR", "qualified parameter or buffer name from replay"),
            _c("payload", "JSON", "kind-specific fields (payload ->> 'field')"),
            _c("hash", "VARCHAR", "chain hash of the event"),
        ),
        """
        SELECT e.id, e.run_id, e.stream, e.seq, e.ts_ns, make_timestamp(e.ts_ns // 1000) AS time,
               e.kind, e.step, e.module_id, e.module, e.tensor_id, e.tensor,
               e.payload::JSON AS payload, e.hash
        FROM {events} e
        """,
    ),
    View(
        "modules",
        "One row per module of each run: the module tree as replay leaves it at the end of the "
        "recorded events (registrations, and removals found by structural checks).",
        (
            _RUN,
            _STREAM,
            _MODULE_ID,
            _MODULE,
            _c(
                "path",
                "VARCHAR",
                "name as named_modules() gives it within its root ('' for a root)",
            ),
            _c("root", "VARCHAR", "label of the root module, (Class)"),
            _c("class", "VARCHAR", "qualified class name"),
            _c("class_name", "VARCHAR", "class name without its module"),
            _c("parent_id", "BIGINT", "module_id of the parent (null for roots)"),
            _c("parent", "VARCHAR", "qualified name of the parent"),
            _c("attr", "VARCHAR", "attribute name in the parent"),
            _c("depth", "INTEGER", "0 for roots, 1 for their children, ..."),
            _c(
                "ordinal",
                "INTEGER",
                "position in the model's order within the stream (0-based): roots in "
                "order of first appearance, each depth-first with children in registration order, as "
                "named_modules() and `auditlog tree` list them (ORDER BY ordinal)",
            ),
            _c("aliases", "VARCHAR[]", "other names of a module shared under several names"),
            _c("n_children", "INTEGER", "direct child modules"),
            _c("n_parameters", "INTEGER", "parameters registered directly on the module"),
            _c("n_buffers", "INTEGER", "buffers registered directly on the module"),
            *_source("module"),
            _c(
                "source_kind",
                "VARCHAR",
                "constructed: source_line called the module's constructor; "
                "attached: its constructor was not seen (built before recording, a deepcopy, C++), "
                "source_line attached it to its parent; null: recorded before sites had a kind",
            ),
        ),
        """
        SELECT m.run_id, m.stream, m.module_id, m.module, m.path, m.root, m.class,
               regexp_extract(m.class, '([^.]+)$', 1) AS class_name, m.parent_id,
               p.module AS parent, m.attr, m.depth, m.ordinal, m.aliases, m.n_children, m.n_parameters,
               m.n_buffers, m.source_file, m.source_line, m.source_function, m.source_kind
        FROM {modules} m
        LEFT JOIN {modules} p
            ON p.run_id = m.run_id AND p.stream = m.stream AND p.module_id = m.parent_id
        """,
    ),
    View(
        "parameters",
        "One row per parameter (tied weights once, under their first name) with its "
        "registration facts and initial-value statistics.",
        (
            _RUN,
            _STREAM,
            _c("tensor_id", "BIGINT", "parameter identity within the run's stream"),
            _c("parameter", "VARCHAR", "qualified name, as named_parameters() gives it"),
            _c("aliases", "VARCHAR[]", "other names of a tied parameter"),
            _c("module_id", "BIGINT", "module the parameter is registered on"),
            _MODULE,
            _c("attr", "VARCHAR", "attribute name in the module"),
            _c("shape", "BIGINT[]", "shape"),
            _c("numel", "BIGINT", "number of elements"),
            _c(
                "dtype", "VARCHAR", "dtype (as registered, or as a later structural check found it)"
            ),
            _c("device", "VARCHAR", "device (as registered or last found)"),
            _c("requires_grad", "BOOLEAN", "requires_grad (as registered or last found)"),
            *_source("module"),
            *_init(),
        ),
        _TENSOR_SQL.format(label="parameter", flag="t.requires_grad", role="parameter"),
    ),
    View(
        "buffers",
        "One row per buffer with its registration facts and initial-value statistics.",
        (
            _RUN,
            _STREAM,
            _c("tensor_id", "BIGINT", "buffer identity within the run's stream"),
            _c("buffer", "VARCHAR", "qualified name, as named_buffers() gives it"),
            _c("aliases", "VARCHAR[]", "other names of a shared buffer"),
            _c("module_id", "BIGINT", "module the buffer is registered on"),
            _MODULE,
            _c("attr", "VARCHAR", "attribute name in the module"),
            _c("shape", "BIGINT[]", "shape"),
            _c("numel", "BIGINT", "number of elements"),
            _c(
                "dtype", "VARCHAR", "dtype (as registered, or as a later structural check found it)"
            ),
            _c("device", "VARCHAR", "device (as registered or last found)"),
            _c("persistent", "BOOLEAN", "whether it is part of state_dict"),
            *_source("module"),
            *_init(),
        ),
        _TENSOR_SQL.format(label="buffer", flag="t.persistent", role="buffer"),
    ),
    View(
        "steps",
        "One row per optimizer step and parameter: its gradient, update and value norms and "
        "the hyperparameters of its param group at that step.",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _c("step", "BIGINT", "the run's step count after this step (1-based)"),
            _TIME,
            _c("optimizer_id", "BIGINT", "per-run id of the optimizer"),
            _c("optimizer_class", "VARCHAR", "qualified optimizer class"),
            _c("optimizer_step", "BIGINT", "this optimizer's own step count"),
            _c("param_group", "INTEGER", "index of the param group holding the parameter"),
            _c("param_index", "INTEGER", "position of the parameter in the step's tensor list"),
            _c("tensor_id", "BIGINT", "parameter identity"),
            _c("parameter", "VARCHAR", "qualified parameter name"),
            _c("module", "VARCHAR", "qualified name of the module holding the parameter"),
            _c(
                "grad_norm",
                "DOUBLE",
                "L2 norm of the gradient the update consumed (after any clipping or "
                "unscaling; null if it had none)",
            ),
            _c(
                "raw_grad_norm",
                "DOUBLE",
                "L2 norm of the gradient as the last backward() left it, before any "
                "clipping or unscaling (equal to grad_norm when nothing changed it; null when no backward was "
                "seen since the previous step, and in records made before this was measured)",
            ),
            _c(
                "grads_modified",
                "BOOLEAN",
                "whether the step's gradients were changed between the last "
                "backward() and the update (clipped, unscaled, replaced): true, false, or null when unknown",
            ),
            _c("update_norm", "DOUBLE", "L2 norm of the change this step made"),
            _c("param_norm", "DOUBLE", "L2 norm of the parameter after the step"),
            _c("lr", "DOUBLE", "learning rate of the param group"),
            _c("weight_decay", "DOUBLE", "weight decay of the param group"),
            _c(
                "momentum", "DOUBLE", "momentum of the param group (null if the optimizer has none)"
            ),
            _c("hyperparameters", "JSON", "every hyperparameter of the param group"),
            _c(
                "nonfinite_grads", "BIGINT", "parameters of this step whose gradient was not finite"
            ),
        ),
        """
        SELECT s.run_id, s.stream, s.seq, s.step, make_timestamp(s.ts_ns // 1000) AS time,
               s.optimizer_id, s.optimizer_class, s.optimizer_step, s.param_group, s.param_index,
               s.tensor_id, s.parameter, s.module, s.grad_norm, s.raw_grad_norm, s.grads_modified,
               s.update_norm, s.param_norm, s.lr, s.weight_decay, s.momentum, s.hyperparameters,
               s.nonfinite_grads
        FROM {steps} s
        """,
    ),
    View(
        "forward_stats",
        "One row per recorded forward call and output tensor (the first 4 outputs of each call), "
        "from the step's `activity` event.",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _STEP,
            _TIME,
            _CALL,
            _MODULE_ID,
            _MODULE,
            _c("output", "INTEGER", "index of the output tensor (0-based)"),
            _c("n_outputs", "BIGINT", "number of tensors the call returned"),
            *_stats("", "output"),
            _c("zeros", "BIGINT", "elements exactly 0 (policy stats=full)"),
            _c(
                "units",
                "BIGINT",
                "features of the output: its last dimension (2-D, 3-D) or dimension 1 (4-D on)",
            ),
            _c(
                "dead_units",
                "BIGINT",
                "units that were exactly 0 throughout the batch (a ReLU that never fired)",
            ),
            _c(
                "input_nonfinite",
                "BIGINT",
                "NaN/Inf elements in the call's first 4 positional input "
                "tensors (the same for every output row of the call; null when it had none)",
            ),
        ),
        """
        SELECT f.run_id, f.stream, f.seq, f.step, make_timestamp(f.ts_ns // 1000) AS time,
               f.call, f.module_id, f.module, f.output, f.n_outputs, f.shape, f.dtype, f.numel, f.norm,
               f.mean, f.std, f.min, f.max, f.nan, f.inf, f.zeros, f.units, f.dead_units,
               f.input_nonfinite
        FROM {forward_stats} f
        """,
    ),
    View(
        "backward_stats",
        "One row per recorded backward call and gradient tensor: gradients w.r.t. the module's "
        "outputs (and inputs, for the full/legacy mechanisms), from the step's `activity` event.",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _STEP,
            _TIME,
            _CALL,
            _MODULE_ID,
            _MODULE,
            _c("mechanism", "VARCHAR", "grad | full | legacy (see `auditlog run --backward`)"),
            _c("direction", "VARCHAR", "output (grad_outputs) | input (grad_inputs)"),
            _c("index", "INTEGER", "index of the gradient in its list (0-based)"),
            *_stats("grad_", "gradient"),
        ),
        """
        SELECT b.run_id, b.stream, b.seq, b.step, make_timestamp(b.ts_ns // 1000) AS time,
               b.call, b.module_id, b.module, b.mechanism, b.direction, b."index", b.shape, b.dtype,
               b.numel, b.grad_norm, b.grad_mean, b.grad_std, b.grad_min, b.grad_max,
               b.grad_nan, b.grad_inf
        FROM {backward_stats} b
        """,
    ),
    *TRAINING_VIEWS,
    *DATA_VIEWS,
    View(
        "annotations",
        "One row per run.annotate(key, **fields) call.",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _STEP,
            _TIME,
            _c("key", "VARCHAR", "the annotation key"),
            _c("fields", "JSON", "the user's fields"),
        ),
        """
        SELECT e.run_id, e.stream, e.seq, e.step, make_timestamp(e.ts_ns // 1000) AS time,
               e.payload::JSON ->> 'key' AS "key", e.payload::JSON -> 'fields' AS fields
        FROM {events} e WHERE e.kind = 'annotation'
        """,
    ),
    View(
        "snapshots",
        "One row per stored tensor value: every tensor of each snapshot_taken event, and the "
        "initial values of construction_sealed events that stored them (trigger 'sealed').",
        (
            _RUN,
            _STREAM,
            _SEQ,
            _STEP,
            _TIME,
            _c(
                "trigger",
                "VARCHAR",
                "sealed | step (every N steps) | explicit (run.snapshot) | run_end | released "
                "(a model garbage-collected before the run ended: its last values)",
            ),
            _c("tag", "VARCHAR", "user label of an explicit snapshot"),
            _c("tensor_id", "BIGINT", "tensor identity within the run's stream"),
            _c("tensor", "VARCHAR", "qualified parameter or buffer name from replay"),
            _c("sha256", "VARCHAR", "content hash (auditlog.tensor_hash); key of tensor_values"),
            _c("dtype", "VARCHAR", "dtype of the stored value"),
            _c("shape", "BIGINT[]", "shape of the stored value"),
            _c("numel", "BIGINT", "number of elements"),
            _c("nbytes", "BIGINT", "size of the tensor's data in bytes"),
            _c("file", "VARCHAR", "Parquet file, relative to the store's snapshots/ directory"),
        ),
        """
        SELECT s.run_id, s.stream, s.seq, s.step, make_timestamp(s.ts_ns // 1000) AS time,
               s.trigger, s.tag, s.tensor_id, s.tensor, s.sha256, c.dtype, c.shape, c.numel,
               c.nbytes, c.file
        FROM {snapshots} s
        LEFT JOIN {snapshot_catalog} c ON c.sha256 = s.sha256
        """,
    ),
    View(
        "tensor_values",
        "One row per element of a stored tensor, read from its Parquet file "
        "(filter on sha256: only that file is opened).",
        (
            _c("sha256", "VARCHAR", "content hash, as in snapshots.sha256"),
            _c("index", "BIGINT", "element index in C (row-major) order"),
            _c(
                "value",
                "DOUBLE",
                "the element as DOUBLE (bool as 0/1); null for dtypes stored as "
                "raw bytes (bfloat16, float8, complex)",
            ),
        ),
        """
        SELECT v.sha256, v."index", v.value FROM {snapshot_values} v
        UNION ALL
        SELECT c.sha256, r.i AS "index", NULL::DOUBLE AS value
        FROM {snapshot_catalog} c, LATERAL generate_series(0, c.numel - 1) r(i)
        WHERE c.layout = 'raw'
        """,
    ),
)

VIEWS_BY_NAME: dict[str, View] = {v.name: v for v in VIEWS}

__all__ = [
    "BASE_TABLES",
    "NO_VALUES",
    "RUNS_LIVE",
    "UNSTREAMED",
    "VIEWS",
    "VIEWS_BY_NAME",
    "Column",
    "View",
    "quote_literal",
    "scoped_catalog",
    "snapshot_values_sql",
    "view_sql",
    "views_markdown",
]


def views_markdown() -> str:
    """The view reference as Markdown, for the README."""
    out: list[str] = []
    for view in VIEWS:
        out.append(f"#### `{view.name}`\n\n{view.doc}\n")
        out.append("| column | type | meaning |\n|---|---|---|")
        for column in view.columns:
            meaning = column.doc.replace("|", "\\|")  # a literal | would end the table cell
            out.append(f"| `{column.name}` | {column.type} | {meaning} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(views_markdown())
