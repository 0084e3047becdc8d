"""Payload field types shared by several event kinds (``core.kinds``)."""

from __future__ import annotations

from auditlog.core.eventtypes import (
    BOOL,
    INT,
    NULL,
    NUM,
    OBJ,
    STR,
    ListOf,
    enum,
    obj,
)

STATS_DOC = (
    "tensor statistics: {shape, dtype, numel, norm, mean, std, min, max, nan, inf}; "
    "non-finite floats are the strings 'NaN', 'Infinity', '-Infinity'"
)

SOURCE = obj(
    file=STR, line=INT, function=STR, kind=enum("constructed", "attached"), optional=("kind",)
)
SEEDS = obj(torch_initial_seed=INT)
_FLOATS = ("norm", "mean", "std", "min", "max")
_COUNTS = ("nan", "inf", "zeros", "units", "dead_units")
STATS = obj(
    optional=_FLOATS + _COUNTS,
    shape=ListOf(INT),
    dtype=STR,
    numel=INT,
    **dict.fromkeys(_FLOATS, NUM),
    **dict.fromkeys(_COUNTS, INT),
)
SEALED = obj(
    tensor_id=INT, sha256=STR, stats=STATS, shard=OBJ, subclass=OBJ, optional=("shard", "subclass")
)
STORED = obj(tensor_id=INT, sha256=STR, shard=OBJ, subclass=OBJ, optional=("shard", "subclass"))
FORWARD_CALL = obj(
    module_id=INT,
    n_outputs=INT,
    outputs=ListOf(STATS | NULL),
    input_nonfinite=INT | NULL,
    error=BOOL,
    optional=("error", "input_nonfinite"),
)
BACKWARD_CALL = obj(
    module_id=INT,
    mechanism=enum("grad", "full", "legacy"),
    grad_outputs=ListOf(STATS | NULL),
    grad_inputs=ListOf(STATS | NULL),
    optional=("grad_inputs",),
)
METRIC = obj(
    name=STR,
    value=NUM | NULL,
    origin=enum("loss_module", "model_output", "backward", "user"),
    module_id=INT | NULL,
    step=INT,
    scaled=BOOL,
    skipped=BOOL,
    optional=("step", "scaled", "skipped"),
)
