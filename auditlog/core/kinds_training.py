"""Event kinds of training: module activity, optimizer steps, skipped steps, metrics,
FLOPs and the first non-finite value (``core.kinds`` gathers every kind)."""

from __future__ import annotations

from auditlog.core.eventtypes import (
    ANY,
    BOOL,
    F32,
    INT,
    INTS,
    NULL,
    NUM,
    STR,
    F,
    Kind,
    ListOf,
    MapOf,
    enum,
    obj,
)
from auditlog.core.kindfields import (
    BACKWARD_CALL,
    FORWARD_CALL,
    METRIC,
    STATS,
    STATS_DOC,
)

TRAINING_KINDS: list[Kind] = [
    Kind(
        "activity",
        "Module activity of one sampled step: every recorded forward and backward call, in call "
        "order, with statistics of its tensors (views forward_stats, backward_stats). Emitted when "
        "the step's optimizer step returns, before its optimizer_step event (or at run end, or "
        "every 4096 calls when no optimizer steps). step is the step the calls belong to. A "
        "tensor's statistics: shape, dtype, numel, norm, mean, std (population), min, max, nan and "
        'inf counts; NaN/Infinity values are stored as the strings "NaN"/"Infinity"/"-Infinity".',
        {
            "forward": F(
                ListOf(FORWARD_CALL),
                "list of {module_id, n_outputs, outputs: statistics of the "
                "first 4 output tensors (with policy stats=full also zeros: elements exactly 0, units and "
                "dead_units: features (last dimension; channels from 4-D on) that were 0 throughout the "
                "batch), input_nonfinite: NaN/Inf elements in the first 4 positional input tensors (null when "
                "the call had none), error: true when forward raised (always_call hook)}",
            ),
            "backward": F(
                ListOf(BACKWARD_CALL),
                "list of {module_id, mechanism: grad (tensor hooks on "
                "outputs, default) | full | legacy, grad_outputs: statistics of gradients w.r.t. the outputs, "
                "grad_inputs: w.r.t. the inputs (full/legacy only)}",
            ),
        },
        summary=(
            (
                None,
                "{forward:count} forward, {backward:count} backward calls"
                "[; {:nonfinite} tensors with NaN/Inf]",
            ),
        ),
    ),
    Kind(
        "optimizer_step",
        "optimizer.step() returned. step is the run's step count after it (1-based).",
        {
            "optimizer_id": F(INT, "per-run id of the optimizer object"),
            "optimizer_class": F(STR, "qualified class name"),
            "optimizer_step": F(INT, "this optimizer's own step count"),
            "param_groups": F(
                ListOf(obj(params=INTS, more=ANY)),
                "list of {hyperparameters..., params: the "
                "group's tensor ids, packed like tensor_ids}",
            ),
            "tensor_ids": F(
                INTS,
                "ids of the parameters, aligned with the norms below (a sharded DTensor "
                "parameter: the norms of this rank's shard), packed: {i16: base64 of the ids as little-endian "
                "int16}, or {i32: ...} / {i64: ...}, the narrowest integer width that holds every id (older "
                "records: a list); readers (the steps view, events, the Python API) decode it to the list",
            ),
            "grad_norm": F(
                F32,
                "L2 norm of each parameter's gradient as the update consumed it (after any "
                "clipping or unscaling; with step(closure): after the closure's last evaluation; a fused "
                "optimizer given a GradScaler's scale: divided by it), packed: {f32: base64 of little-endian "
                "float32, one per tensor_ids entry, NaN/inf as their bits; absent: [positions of parameters "
                "without a gradient], only when some are} (older records: a list, null where absent); readers "
                "(the steps view, events, the Python API) decode it to the list",
            ),
            "update_norm": F(
                F32 | NULL,
                "L2 norm of each parameter's change made by this step, packed like "
                "grad_norm (null on steps the policy's norms_every skips)",
            ),
            "param_norm": F(
                F32 | NULL,
                "L2 norm of each parameter after the step, packed like grad_norm (null"
                " on skipped steps)",
            ),
            "raw_grad_norm": F(
                F32 | NULL,
                "L2 norm of each gradient as the last backward() before the step "
                "left it, packed like grad_norm; present only when grads_modified is true (otherwise it equals"
                " grad_norm)",
            ),
            "grads_modified": F(
                BOOL | NULL,
                "true when a gradient was replaced or changed in place between "
                "the last backward() and the update (clip_grad_norm_, GradScaler.unscale_, ...), false when "
                "not, null when no backward() was seen since the previous step (absent in older records)",
            ),
            "nonfinite_grads": F(INT, "number of parameters whose gradient norm was not finite"),
        },
        summary=(
            (None, "{optimizer_class:class} lr={param_groups.0.lr:num} grad_norm={grad_norm:l2}"),
        ),
    ),
    Kind(
        "hooks_removed",
        "Other code took some of the recorder's hooks out of torch's global hook tables (a handle "
        "removed, or a table replaced wholesale, as PyTorch's TestModuleGlobalHooks.tearDown does)."
        " Found at an optimizer step or at run end; whatever those hooks would have recorded "
        "between since_step and this event's step is missing from the record. The recorder puts the"
        " hooks back when it can (docs/hooks.md).",
        {
            "hooks": F(
                ListOf(STR),
                "the hook kinds found missing: module_registration | "
                "parameter_registration | buffer_registration | optimizer_step_pre | optimizer_step_post | "
                "forward_pre | forward | full_backward_pre | full_backward | backward (legacy) | "
                "root_watch_pre | root_watch",
            ),
            "reinstalled": F(
                ListOf(STR), "the kinds put back (from this event's step on they record again)"
            ),
            "stopped": F(
                MapOf(STR),
                "{kind: reason} for kinds torch refused to take back: capture of that "
                "kind ends for the rest of the run",
            ),
            "since_step": F(INT | NULL, "the last step at which every hook was found in place"),
            "detected_at": F(
                enum("optimizer_step", "run_end"),
                "optimizer_step | run_end (at run end nothing is put back)",
            ),
        },
    ),
    Kind(
        "untracked_updates",
        "Parameters changed in place between two backward() passes with no optimizer step that the "
        "recorder saw in between: an optimizer step run inside torch.compile (dynamo traces "
        "Optimizer.step's hooks away), a hand-written update (p -= lr * p.grad under no_grad), an "
        "optimizer that does not go through torch.optim.Optimizer.step, or another in-place write "
        "such as load_state_dict. Those updates have no optimizer_step events: the run's step "
        "count does not count them, and their gradient norms and learning rates are not in the "
        "record (snapshots still hold the values). Looked for among trainable parameters that no "
        "optimizer seen stepping holds. Emitted when first found (detected_at backward) and, if "
        "found again later, once more at run end with the totals (docs/hooks.md).",
        {
            "tensor_ids": F(
                INTS,
                "tensor ids of the parameters found changed (at the first finding; at run end, "
                "at the last one)",
            ),
            "backwards": F(
                INT, "backward() passes so far after which parameters were found changed"
            ),
            "first_step": F(INT, "the run's step count when it was first found"),
            "detected_at": F(enum("backward", "run_end"), "backward | run_end"),
        },
        summary=((None, "{backwards} backward passes with parameter updates no step hook saw"),),
    ),
    Kind(
        "step_skipped",
        "An optimizer step that updated nothing: a GradScaler found inf/NaN in the gradients and "
        "did not call optimizer.step(), or a fused optimizer handed the scaler's found_inf skipped "
        "its update. Not a step: the run's step count does not move (step is the steps completed "
        "before). The iteration's metrics and activity precede it, marked skipped.",
        {
            "optimizer_id": F(INT, "per-run id of the optimizer"),
            "optimizer_class": F(STR, "qualified class name"),
            "reason": F(STR, "why the step was skipped"),
            "scale": F(
                NUM | NULL,
                "the GradScaler's loss scale at the skip (before update() lowers it); null "
                "if unknown",
            ),
        },
    ),
    Kind(
        "metrics",
        "Scalar metrics: the training loss recorded with no code change (the output of every loss "
        "module call, and a root module's output that carries a loss, e.g. Hugging Face "
        "ModelOutput.loss), emitted once per step before its activity and optimizer_step events; "
        "and values logged with auditlog.log(...), emitted at once. step is the optimizer steps "
        "completed when the value was computed (the loss of the first iteration is step 0).",
        {
            "metrics": F(
                ListOf(METRIC),
                "list of {name: loss | eval_loss (a loss that required no grad) | "
                "backward_loss (the scalar a backward() started from, when it is not the loss recorded for "
                "that backward) | the user's name, value: number (NaN/Infinity as text), origin: loss_module |"
                " model_output | backward (the scalar a backward() started from) | user, module_id: the module"
                " that returned it (null for user values and backward), step: the step the user gave to "
                "auditlog.log (absent when not given), scaled: true when a GradScaler scaled the backward's "
                "scalar (the value is the loss before scaling), skipped: true when the iteration's optimizer "
                "step was skipped (step_skipped)}",
            ),
        },
    ),
    Kind(
        "flops",
        "Training FLOPs per step: the first root forward with gradients enabled on a sampled step, "
        "counted with torch.utils.flop_counter.FlopCounterMode (the mode is open only while that "
        "forward runs); the backward estimated as 2 x the forward. step is the step measured.",
        {
            "flops": F(
                INT,
                "training FLOPs per step: forward_flops x 3 (a multiply-add counts 2)",
                optional=True,
            ),
            "forward_flops": F(
                INT,
                "FLOPs counted in the measured forward (the loss too when the model computes it)",
                optional=True,
            ),
            "backward": F(
                STR, "how the backward was accounted: 'estimated as 2 x forward'", optional=True
            ),
            "by_operator": F(
                MapOf(INT), "{aten operator: FLOPs} of the measured forward", optional=True
            ),
            "forwards": F(INT, "root forward calls counted (1)", optional=True),
            "closed_by": F(
                enum("forward", "run_end"),
                "forward (the forward returned or raised) | run_end",
                optional=True,
            ),
            "skipped": F(
                STR,
                "present instead of the counts when nothing was counted: why (the model holds "
                "compiled code, which a counting mode would stop dynamo from compiling)",
                optional=True,
            ),
            "compiled": F(
                ListOf(STR),
                "with skipped: the compiled modules by qualified name ('(root)': the root)",
                optional=True,
            ),
        },
    ),
    Kind(
        "nonfinite_found",
        "The first non-finite gradient, loss or parameter, caught by the policy options "
        "nonfinite_check (in the optimizer's pre hook, before the update) or keep_finite_state "
        "(after the update). Followed by a snapshot_taken with trigger last_finite.",
        {
            "where": F(enum("gradients", "loss", "parameters"), "gradients | loss | parameters"),
            "loss": F(NUM | NULL, "the step's last training loss recorded, when known"),
            "gradients": F(
                ListOf(obj(tensor_id=INT, stats=STATS)),
                "list of {tensor_id, stats}: full "
                "statistics of every parameter's gradient at that step (empty for where=parameters); "
                + STATS_DOC,
            ),
            "parameters": F(
                ListOf(INT), "for where=parameters: ids of the parameters the step left non-finite"
            ),
            "snapshot": F(BOOL, "true when a last_finite snapshot follows"),
        },
    ),
]
