"""The read model's stored tables, and the SQL that derives them from new events.

The projection is a DuckDB file holding a copy of the events plus tables derived
from them, flattened so that questions about training are plain, fast SQL:
payload JSON is parsed once, when an event is copied, not by every query. Every
derivation reads only the staging table ``new_events`` (the events copied by
this refresh), so a refresh costs what arrived since the last one, not the whole
history.

Flattening rules (the views in ``auditlog.store.readmodel.views`` document them to users):

- tensor statistics become typed columns: norm/mean/std/min/max ``DOUBLE`` and
  the NaN/Inf element counts ``BIGINT``. Non-finite floats, stored as the JSON
  strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, become the DOUBLE values
  NaN and +/-inf (``from_json`` casts those strings);
- ``forward``: one row per (event, output index); ``backward``: one row per
  (event, direction, index) for ``grad_outputs`` and ``grad_inputs``;
- ``optimizer_step``: one row per (event, parameter) with its grad/update/param
  norms and the hyperparameters of the param group holding it.

Names: ``modules`` and ``tensors`` are written by the read model from Python
replay (``auditlog.core.naming``) *before* a chunk's derivations run, and the
derivations copy the labels into every row (``module``, ``tensor``,
``parameter`` columns), so the views need no joins: a join DuckDB cannot drop
made ``select kind, count(*) from events`` many times slower on a large store
(docs/performance.md). When a
later chunk changes a label (a module attached later, a second model root), the
read model rewrites the rows of that one label (``RELABEL``).

``FORMAT`` is the projection's format version; a file of another version is
rebuilt from the store, never migrated (it is a cache of the record, never part
of it).

Snapshots: ``snapshots`` holds one row per (event, tensor) of every
``snapshot_taken`` event and of every ``construction_sealed`` event whose values
were stored (``stored: true``; trigger ``'sealed'``), so "which content did this
tensor have at step N" is one indexed lookup. ``snapshot_catalog`` is *not* a
copy of the event store's ``snapshot_blobs`` table (a cache anyone can edit):
each content hash the snapshot rows name is verified from its file
(``trust.check_blobs``: location from the hash, exact schema, content hash)
and its facts recorded with the file's digest and identity; a file that fails
goes to ``rejected_blobs`` with the reason (``ReadModel._verify_blobs``).
"""

from __future__ import annotations

from auditlog.core.eventrow import COLUMNS, RowColumn
from auditlog.core.replay import CONSTRUCTION_KINDS

# 6: modules.source_kind, the datasets and batches views; 7: payloads past the size or depth limit
# are refused when copied (issue 29): a cache made before may hold some, and is rebuilt;
# 8: batches.hash (the content hash of a batch of an iterable dataset); 9: events without
# ``snapshot`` (store revision 0005, chain v2), each stream's link checked in its chain format.
FORMAT = "9"

SCHEMA = "projection"

STATS_TYPE = (
    '{"shape":["BIGINT"],"dtype":"VARCHAR","numel":"BIGINT","norm":"DOUBLE","mean":"DOUBLE",'
    '"std":"DOUBLE","min":"DOUBLE","max":"DOUBLE","nan":"BIGINT","inf":"BIGINT"}'
)


def _duckdb_column(column: RowColumn) -> str:
    """A column of the event row (``core.eventrow``) in the projection's ``events`` table;
    ``id`` is 64-bit (SQLite's rowid, PostgreSQL's sequence)."""
    kind = "VARCHAR" if column.arrow == "string" else column.sql
    kind = "BIGINT" if column.name == "id" else kind
    return f"{column.name} {kind}{'' if column.nullable else ' NOT NULL'}"


EVENT_COLUMNS_SQL = ", ".join(_duckdb_column(c) for c in COLUMNS)
"""The copied columns of ``events``, as the event store defines them (then its names)."""

# Forward outputs also carry zeros / units / dead_units (policy stats=full).
FORWARD_STATS_TYPE = STATS_TYPE[:-1] + ',"zeros":"BIGINT","units":"BIGINT","dead_units":"BIGINT"}'

TABLES: tuple[str, ...] = (
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"""CREATE TABLE {SCHEMA}.meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)""",
    f"""CREATE TABLE {SCHEMA}.events ({EVENT_COLUMNS_SQL}, module VARCHAR, tensor VARCHAR)""",
    f"""CREATE TABLE {SCHEMA}.stream_stats (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, events BIGINT NOT NULL,
        max_step BIGINT, first_ns BIGINT, last_ns BIGINT, PRIMARY KEY (run_id, stream))""",
    f"""CREATE TABLE {SCHEMA}.run_started (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL,
        ts_ns BIGINT NOT NULL, payload JSON NOT NULL)""",
    f"""CREATE TABLE {SCHEMA}.run_ended (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL,
        ts_ns BIGINT NOT NULL, payload JSON NOT NULL)""",
    f"""CREATE TABLE {SCHEMA}.forward_stats (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL, step BIGINT,
        ts_ns BIGINT NOT NULL, call INTEGER NOT NULL, module_id BIGINT, output INTEGER NOT NULL, n_outputs BIGINT,
        shape BIGINT[], dtype VARCHAR, numel BIGINT, norm DOUBLE, mean DOUBLE, std DOUBLE,
        min DOUBLE, max DOUBLE, nan BIGINT, inf BIGINT, zeros BIGINT, units BIGINT, dead_units BIGINT,
        input_nonfinite BIGINT, module VARCHAR)""",
    f"""CREATE TABLE {SCHEMA}.metrics (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL, step BIGINT,
        ts_ns BIGINT NOT NULL, position INTEGER NOT NULL, name VARCHAR, value DOUBLE, origin VARCHAR,
        module_id BIGINT, user_step BIGINT, module VARCHAR, skipped BOOLEAN)""",
    f"""CREATE TABLE {SCHEMA}.backward_stats (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL, step BIGINT,
        ts_ns BIGINT NOT NULL, call INTEGER NOT NULL, module_id BIGINT, mechanism VARCHAR, direction VARCHAR NOT NULL,
        "index" INTEGER NOT NULL, shape BIGINT[], dtype VARCHAR, numel BIGINT,
        grad_norm DOUBLE, grad_mean DOUBLE, grad_std DOUBLE, grad_min DOUBLE, grad_max DOUBLE,
        grad_nan BIGINT, grad_inf BIGINT, module VARCHAR)""",
    f"""CREATE TABLE {SCHEMA}.steps (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL, step BIGINT,
        ts_ns BIGINT NOT NULL, optimizer_id BIGINT, optimizer_class VARCHAR,
        optimizer_step BIGINT, param_index INTEGER NOT NULL, tensor_id BIGINT,
        param_group INTEGER, grad_norm DOUBLE, update_norm DOUBLE, param_norm DOUBLE,
        lr DOUBLE, weight_decay DOUBLE, momentum DOUBLE, hyperparameters JSON,
        nonfinite_grads BIGINT, parameter VARCHAR, module VARCHAR, raw_grad_norm DOUBLE,
        grads_modified BOOLEAN)""",
    f"""CREATE TABLE {SCHEMA}.modules (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, module_id BIGINT NOT NULL,
        module VARCHAR NOT NULL, path VARCHAR NOT NULL, root VARCHAR NOT NULL, class VARCHAR,
        parent_id BIGINT, attr VARCHAR, depth INTEGER NOT NULL, aliases VARCHAR[] NOT NULL,
        n_children INTEGER NOT NULL, n_parameters INTEGER NOT NULL, n_buffers INTEGER NOT NULL,
        source_file VARCHAR, source_line INTEGER, source_function VARCHAR, source_kind VARCHAR,
        ordinal INTEGER NOT NULL,
        PRIMARY KEY (run_id, stream, module_id))""",
    f"""CREATE TABLE {SCHEMA}.tensors (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, tensor_id BIGINT NOT NULL,
        role VARCHAR NOT NULL, name VARCHAR NOT NULL, aliases VARCHAR[] NOT NULL,
        module_id BIGINT NOT NULL, module VARCHAR, attr VARCHAR NOT NULL, shape BIGINT[], numel BIGINT,
        dtype VARCHAR, device VARCHAR, requires_grad BOOLEAN, persistent BOOLEAN,
        source_file VARCHAR, source_line INTEGER, source_function VARCHAR,
        init_sha256 VARCHAR, init_norm DOUBLE, init_mean DOUBLE, init_std DOUBLE,
        init_min DOUBLE, init_max DOUBLE, init_nan BIGINT, init_inf BIGINT,
        PRIMARY KEY (run_id, stream, tensor_id))""",
    f"""CREATE TABLE {SCHEMA}.snapshots (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL, step BIGINT,
        ts_ns BIGINT NOT NULL, trigger VARCHAR, tag VARCHAR, position INTEGER NOT NULL,
        tensor_id BIGINT, sha256 VARCHAR, tensor VARCHAR)""",
    f"""CREATE TABLE {SCHEMA}.snapshot_catalog (
        sha256 VARCHAR PRIMARY KEY, file VARCHAR NOT NULL, dtype VARCHAR NOT NULL,
        shape BIGINT[] NOT NULL, numel BIGINT NOT NULL, nbytes BIGINT NOT NULL,
        layout VARCHAR NOT NULL, row_groups INTEGER NOT NULL, file_sha256 VARCHAR NOT NULL,
        created_ns BIGINT NOT NULL, identity BIGINT[] NOT NULL)""",
    f"""CREATE TABLE {SCHEMA}.batches (
        run_id VARCHAR NOT NULL, stream INTEGER NOT NULL, seq BIGINT NOT NULL, step BIGINT,
        ts_ns BIGINT NOT NULL, loader_id BIGINT, dataset_id BIGINT, epoch BIGINT, position BIGINT,
        after_step BIGINT, size BIGINT, indices BIGINT[], no_grad BOOLEAN, hash VARCHAR)""",
    f"""CREATE TABLE {SCHEMA}.rejected_blobs (sha256 VARCHAR PRIMARY KEY, problem VARCHAR NOT NULL)""",
)


# SQL run once per chunk over ``new_events`` (the chunk's Arrow table), in order.
def _vector(name: str) -> str:
    """A per-parameter vector of an ``optimizer_step`` as ``DOUBLE[]``: decoded from
    ``new_vectors`` when packed, else the payload's JSON list (NULL when absent)."""
    return (
        f"coalesce(v.{name}, CASE WHEN json_type(p.{name}) = 'ARRAY' "
        f"THEN from_json(p.{name}, '[\"DOUBLE\"]') END) AS {name}s"
    )


def _ids(packed: str, listed: str) -> str:
    """Tensor ids as ``BIGINT[]``: ``packed`` (decoded from ``new_vectors``) when there,
    else the JSON list ``listed`` (older records; NULL when not a list)."""
    return f"coalesce({packed}, CASE WHEN json_type({listed}) = 'ARRAY' THEN from_json({listed}, '[\"BIGINT\"]') END)"


DERIVATIONS: tuple[str, ...] = (
    f"""INSERT INTO {SCHEMA}.events
        SELECT n.*, m.module, t.name
        FROM new_events n
        LEFT JOIN {SCHEMA}.modules m
            ON m.run_id = n.run_id AND m.stream = n.stream AND m.module_id = n.module_id
        LEFT JOIN {SCHEMA}.tensors t
            ON t.run_id = n.run_id AND t.stream = n.stream AND t.tensor_id = n.tensor_id""",
    f"""INSERT INTO {SCHEMA}.stream_stats
        SELECT run_id, stream, count(*), max(step), min(ts_ns), max(ts_ns)
        FROM new_events GROUP BY run_id, stream
        ON CONFLICT (run_id, stream) DO UPDATE SET
            events = events + excluded.events,
            max_step = greatest(max_step, excluded.max_step),
            first_ns = least(first_ns, excluded.first_ns),
            last_ns = greatest(last_ns, excluded.last_ns)""",
    f"""INSERT INTO {SCHEMA}.run_started
        SELECT run_id, stream, seq, ts_ns, payload::JSON FROM new_events WHERE kind = 'run_started'""",
    f"""INSERT INTO {SCHEMA}.run_ended
        SELECT run_id, stream, seq, ts_ns, payload::JSON FROM new_events WHERE kind = 'run_ended'""",
    # Lists are expanded with unnest() next to generate_subscripts() (they zip):
    # on DuckDB that is far faster than UNNEST ... WITH ORDINALITY (docs/performance.md). An
    # ``activity`` event holds one step's module calls (call order), each with
    # its tensors' statistics: two levels of lists.
    f"""INSERT INTO {SCHEMA}.forward_stats
        WITH calls AS MATERIALIZED (
            SELECT run_id, stream, seq, step, ts_ns, unnest(p.forward) AS c,
                   generate_subscripts(p.forward, 1) AS call
            FROM (SELECT *, from_json(payload, '{{"forward":[{{"module_id":"BIGINT","n_outputs":"BIGINT",
                                                  "input_nonfinite":"BIGINT",
                                                  "outputs":[{FORWARD_STATS_TYPE}]}}]}}') AS p
                  FROM new_events WHERE kind = 'activity')),
        x AS (
            SELECT run_id, stream, seq, step, ts_ns, call, c.module_id AS module_id,
                   c.n_outputs AS n_outputs, c.input_nonfinite AS input_nonfinite,
                   unnest(c.outputs) AS s, generate_subscripts(c.outputs, 1) AS i
            FROM calls)
        SELECT x.run_id, x.stream, seq, step, ts_ns, call - 1, x.module_id, i - 1, n_outputs, s.shape,
               s.dtype, s.numel, s.norm, s.mean, s.std, s.min, s.max, s.nan, s.inf, s.zeros, s.units,
               s.dead_units, input_nonfinite, m.module
        FROM x
        LEFT JOIN {SCHEMA}.modules m
            ON m.run_id = x.run_id AND m.stream = x.stream AND m.module_id = x.module_id
        WHERE s IS NOT NULL""",
    f"""INSERT INTO {SCHEMA}.backward_stats
        WITH b AS MATERIALIZED (
            SELECT run_id, stream, seq, step, ts_ns, unnest(p.backward) AS c,
                   generate_subscripts(p.backward, 1) AS call
            FROM (SELECT *, from_json(payload, '{{"backward":[{{"module_id":"BIGINT","mechanism":"VARCHAR",
                                                  "grad_outputs":[{STATS_TYPE}],
                                                  "grad_inputs":[{STATS_TYPE}]}}]}}') AS p
                  FROM new_events WHERE kind = 'activity')),
        g AS (
            SELECT run_id, stream, seq, step, ts_ns, call, c.module_id AS module_id,
                   c.mechanism AS mechanism, 'output' AS direction, unnest(c.grad_outputs) AS s,
                   generate_subscripts(c.grad_outputs, 1) AS i
            FROM b
            UNION ALL
            SELECT run_id, stream, seq, step, ts_ns, call, c.module_id, c.mechanism, 'input',
                   unnest(c.grad_inputs), generate_subscripts(c.grad_inputs, 1)
            FROM b)
        SELECT g.run_id, g.stream, seq, step, ts_ns, call - 1, g.module_id, mechanism, direction, i - 1,
               s.shape, s.dtype, s.numel, s.norm, s.mean, s.std, s.min, s.max, s.nan, s.inf,
               m.module
        FROM g
        LEFT JOIN {SCHEMA}.modules m
            ON m.run_id = g.run_id AND m.stream = g.stream AND m.module_id = g.module_id
        WHERE s IS NOT NULL""",
    # Per-parameter lists are unnested side by side (they zip); the param
    # groups' JSON is read once per group, not once per parameter. Packed
    # vectors and tensor ids (``core.packed``) come decoded in ``new_vectors``
    # (``vectors.py``); list-form ones (older records) are read from the payload.
    f"""INSERT INTO {SCHEMA}.steps
        WITH e AS MATERIALIZED (
            SELECT id, run_id, stream, seq, step, ts_ns,
                   from_json(payload, '{{"optimizer_id":"BIGINT","optimizer_class":"VARCHAR",
                       "optimizer_step":"BIGINT","tensor_ids":"JSON","grad_norm":"JSON",
                       "update_norm":"JSON","param_norm":"JSON","nonfinite_grads":"BIGINT",
                       "raw_grad_norm":"JSON","grads_modified":"BOOLEAN",
                       "param_groups":["JSON"]}}') AS p
            FROM new_events WHERE kind = 'optimizer_step'),
        s AS MATERIALIZED (
            SELECT e.*, {_vector("grad_norm")}, {_vector("update_norm")}, {_vector("param_norm")},
                   {_vector("raw_grad_norm")},
                   {_ids("v.tensor_ids", "p.tensor_ids")} AS tensor_ids, v.group_params
            FROM e LEFT JOIN new_vectors v ON v.id = e.id),
        params AS (
            SELECT id, run_id, stream, seq, step, ts_ns, p.optimizer_id AS optimizer_id,
                   p.optimizer_class AS optimizer_class, p.optimizer_step AS optimizer_step,
                   p.nonfinite_grads AS nonfinite_grads, p.grads_modified AS grads_modified,
                   unnest(tensor_ids) AS tid, generate_subscripts(tensor_ids, 1) AS pos,
                   unnest(grad_norms) AS grad_norm, unnest(update_norms) AS update_norm,
                   unnest(param_norms) AS param_norm, unnest(raw_grad_norms) AS raw_grad_norm
            FROM s),
        group_specs AS (
            SELECT id, grp, TRY_CAST(spec ->> 'lr' AS DOUBLE) AS lr,
                   TRY_CAST(spec ->> 'weight_decay' AS DOUBLE) AS weight_decay,
                   TRY_CAST(spec ->> 'momentum' AS DOUBLE) AS momentum,
                   json_merge_patch(spec, '{{"params":null}}')::JSON AS hyperparameters,
                   {_ids("group_params[grp + 1]", "spec -> 'params'")} AS members
            FROM (SELECT id, group_params, unnest(p.param_groups) AS spec,
                         generate_subscripts(p.param_groups, 1) - 1 AS grp
                  FROM s)),
        groups AS (
            SELECT id, grp, lr, weight_decay, momentum, hyperparameters, unnest(members) AS tid
            FROM group_specs)
        SELECT p.run_id, p.stream, p.seq, p.step, p.ts_ns, p.optimizer_id, p.optimizer_class,
               p.optimizer_step, p.pos - 1, p.tid, g.grp, p.grad_norm, p.update_norm,
               p.param_norm, g.lr, g.weight_decay, g.momentum, g.hyperparameters,
               p.nonfinite_grads, t.name, t.module,
               CASE WHEN p.grads_modified THEN p.raw_grad_norm
                    WHEN p.grads_modified = false THEN p.grad_norm END,
               p.grads_modified
        FROM params p
        LEFT JOIN groups g ON g.id = p.id AND g.tid = p.tid
        LEFT JOIN {SCHEMA}.tensors t
            ON t.run_id = p.run_id AND t.stream = p.stream AND t.tensor_id = p.tid
        WHERE p.tid IS NOT NULL""",
    # One row per (event, tensor) of snapshot_taken and of stored construction_sealed
    # events; ``position`` keeps the payload's order (the order the recorder listed).
    f"""INSERT INTO {SCHEMA}.snapshots
        WITH e AS MATERIALIZED (
            SELECT run_id, stream, seq, step, ts_ns, 'sealed' AS trigger, NULL::VARCHAR AS tag,
                   from_json(payload, '{{"tensors":[{{"tensor_id":"BIGINT","sha256":"VARCHAR"}}]}}').tensors
                       AS items
            FROM new_events
            WHERE kind = 'construction_sealed' AND TRY_CAST(payload::JSON ->> 'stored' AS BOOLEAN)
            UNION ALL
            SELECT run_id, stream, seq, step, ts_ns, p.trigger, p.tag, p.snapshot.tensors
            FROM (SELECT *, from_json(payload, '{{"trigger":"VARCHAR","tag":"VARCHAR",
                      "snapshot":{{"tensors":[{{"tensor_id":"BIGINT","sha256":"VARCHAR"}}]}}}}') AS p
                  FROM new_events WHERE kind = 'snapshot_taken')),
        x AS (
            SELECT run_id, stream, seq, step, ts_ns, trigger, tag, unnest(items) AS item,
                   generate_subscripts(items, 1) AS i
            FROM e)
        SELECT x.run_id, x.stream, x.seq, x.step, x.ts_ns, x.trigger, x.tag, x.i - 1,
               x.item.tensor_id, x.item.sha256, t.name
        FROM x
        LEFT JOIN {SCHEMA}.tensors t
            ON t.run_id = x.run_id AND t.stream = x.stream AND t.tensor_id = x.item.tensor_id
        WHERE x.item IS NOT NULL""",
)

# Metrics: one row per entry of a ``metrics`` event (payload order kept in ``position``).
METRICS_DERIVATION = f"""INSERT INTO {SCHEMA}.metrics
    WITH e AS MATERIALIZED (
        SELECT run_id, stream, seq, step, ts_ns,
               from_json(payload, '{{"metrics":[{{"name":"VARCHAR","value":"DOUBLE","origin":"VARCHAR",
                                                  "module_id":"BIGINT","step":"BIGINT",
                                                  "skipped":"BOOLEAN"}}]}}').metrics AS items
        FROM new_events WHERE kind = 'metrics'),
    x AS (
        SELECT run_id, stream, seq, step, ts_ns, unnest(items) AS item, generate_subscripts(items, 1) AS i
        FROM e)
    SELECT x.run_id, x.stream, x.seq, x.step, x.ts_ns, x.i - 1, x.item.name, x.item.value, x.item.origin,
           x.item.module_id, x.item.step, m.module, coalesce(x.item.skipped, false)
    FROM x
    LEFT JOIN {SCHEMA}.modules m
        ON m.run_id = x.run_id AND m.stream = x.stream AND m.module_id = x.item.module_id
    WHERE x.item IS NOT NULL"""

# Batches: one row per batch of a ``batches`` event, its packed lists decoded in
# ``new_batches`` (``batches.py``); ``position`` is the batch's place in its epoch.
BATCHES_DERIVATION = f"""INSERT INTO {SCHEMA}.batches
    WITH e AS MATERIALIZED (
        SELECT id, run_id, stream, seq, step, ts_ns,
               from_json(payload, '{{"loader_id":"BIGINT","dataset_id":"BIGINT","epoch":"BIGINT",
                                     "first":"BIGINT"}}') AS p
        FROM new_events WHERE kind = 'batches')
    SELECT e.run_id, e.stream, e.seq, e.step, e.ts_ns, e.p.loader_id, e.p.dataset_id, e.p.epoch,
           coalesce(e.p.first, 0) + b.position, b.after_step, b.size, b.indices, b.no_grad,
           b.hash
    FROM new_batches b JOIN e ON e.id = b.id"""

DERIVATIONS = (*DERIVATIONS, METRICS_DERIVATION, BATCHES_DERIVATION)

# After a replay: rewrite stored labels that changed. ``changed_modules`` and
# ``changed_tensors`` (temporary) hold the new labels of ids whose label moved.
RELABEL: tuple[str, ...] = (
    f"""UPDATE {SCHEMA}.events e SET module = c.module FROM changed_modules c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.module_id = c.module_id""",
    f"""UPDATE {SCHEMA}.forward_stats e SET module = c.module FROM changed_modules c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.module_id = c.module_id""",
    f"""UPDATE {SCHEMA}.backward_stats e SET module = c.module FROM changed_modules c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.module_id = c.module_id""",
    f"""UPDATE {SCHEMA}.metrics e SET module = c.module FROM changed_modules c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.module_id = c.module_id""",
    f"""UPDATE {SCHEMA}.events e SET tensor = c.name FROM changed_tensors c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.tensor_id = c.tensor_id""",
    f"""UPDATE {SCHEMA}.steps e SET parameter = c.name, module = c.module FROM changed_tensors c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.tensor_id = c.tensor_id""",
    f"""UPDATE {SCHEMA}.snapshots e SET tensor = c.name FROM changed_tensors c
        WHERE e.run_id = c.run_id AND e.stream = c.stream AND e.tensor_id = c.tensor_id""",
)

# Verified catalog rows (``trust.check_blobs``), staged as ``new_blobs``.
COPY_CATALOG = f"""INSERT INTO {SCHEMA}.snapshot_catalog
    SELECT sha256, file, dtype, shape, numel, nbytes, layout, row_groups, file_sha256, created_ns, identity
    FROM new_blobs
    ON CONFLICT (sha256) DO NOTHING"""

# Content hashes the snapshot rows name that are neither verified nor rejected yet.
UNCHECKED_BLOBS = f"""SELECT DISTINCT s.sha256 FROM {SCHEMA}.snapshots s
    WHERE s.sha256 IS NOT NULL
      AND s.sha256 NOT IN (SELECT sha256 FROM {SCHEMA}.snapshot_catalog)
      AND s.sha256 NOT IN (SELECT sha256 FROM {SCHEMA}.rejected_blobs)
    ORDER BY 1"""

# The chain head of every stream copied: what the read model's seal names.
STREAM_HEADS = f"""SELECT run_id, stream, max(seq), arg_max(hash, seq) FROM {SCHEMA}.events
    GROUP BY run_id, stream ORDER BY run_id, stream"""
# Each stream's first event (its chain format is the one it links under: ``links.held_heads``).
STREAM_FIRSTS = (
    f"""SELECT {", ".join(c.name for c in COLUMNS)} FROM {SCHEMA}.events WHERE seq = 1"""
)

# Streams whose construction changed in this refresh, to be replayed for names.
CONSTRUCTION_TOUCHED = (
    "SELECT DISTINCT run_id, stream FROM new_events WHERE kind IN ("
    + ", ".join(f"'{kind}'" for kind in CONSTRUCTION_KINDS)
    + ")"
)
