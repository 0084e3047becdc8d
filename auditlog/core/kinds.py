"""Every event kind, defined once: what it records, each payload field's type and meaning,
and the line ``auditlog events`` shows for it.

This table is the single source of truth for what an event payload holds. Derived
from it: the event reference (``docs/events.md``, ``make docs``: ``cli/reference.py``), which fields
readers decode from their packed form (``store/rows.py``, the read model's
vectors), the summaries of ``auditlog events`` (``cli/summaries.py``), and the
test that checks every payload a real recording emits against it, types included
(``tests/test_kinds.py``). Adding a field is one entry here (and what emits it);
the types are those of ``core.eventtypes``, as the payload is stored (packed
vectors as ``F32`` / ``INTS``). The columns of the event row are ``core.eventrow``.
"""

from __future__ import annotations

from auditlog.core.eventtypes import (
    ANY,
    BOOL,
    F32,
    INT,
    INTS,
    NULL,
    NUM,
    OBJ,
    STR,
    Kind,
    ListOf,
    MapOf,
    enum,
    obj,
)
from auditlog.core.eventtypes import F as F

STATS_DOC = (
    "tensor statistics: {shape, dtype, numel, norm, mean, std, min, max, nan, inf}; "
    "non-finite floats are the strings 'NaN', 'Infinity', '-Infinity'"
)

# Types shared by several kinds.
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

_KINDS = [
    Kind(
        "run_started",
        "First event of every stream: who ran what, where, with which code and libraries.",
        {
            "name": F(STR | NULL, "user-given run name or null"),
            "argv": F(
                ListOf(STR), "command line of the recorded program (script and its arguments)"
            ),
            "launcher_argv": F(
                ListOf(STR) | NULL,
                "how the process was started (e.g. the auditlog run command), or null",
            ),
            "code_path": F(
                STR | NULL, "file or directory whose git repository identifies the code"
            ),
            "cwd": F(STR, "working directory"),
            "host": F(STR, "host name"),
            "user": F(STR | NULL, "login name"),
            "pid": F(INT, "process id"),
            "proc_start": F(
                INT | NULL,
                "process start time in clock ticks since boot (tells a reused pid apart)",
            ),
            "rank": F(
                INT,
                "distributed rank (env RANK, default 0); the stream is rank + 1000000 * segment",
            ),
            "world_size": F(
                INT,
                "distributed world size (env WORLD_SIZE, default 1): the streams a segment "
                "should have",
            ),
            "local_rank": F(INT, "rank within the node (env LOCAL_RANK)"),
            "local_world_size": F(INT, "ranks on this node (env LOCAL_WORLD_SIZE)"),
            "node_rank": F(INT, "the node's rank (torchrun's GROUP_RANK)"),
            "restart": F(
                INT, "torchrun restart count (TORCHELASTIC_RESTART_COUNT; 0: first launch)"
            ),
            "max_restarts": F(INT, "restarts torchrun allows (TORCHELASTIC_MAX_RESTARTS)"),
            "segment": F(
                INT,
                "segment of the stream: the restart count, or higher when that stream was taken",
            ),
            "launcher": F(
                enum("torchrun", "env") | NULL,
                "torchrun | env (RANK/WORLD_SIZE set by another launcher) | null",
            ),
            "rdzv_id": F(STR | NULL, "torchrun's rendezvous id (TORCHELASTIC_RUN_ID), or null"),
            "master_addr": F(STR | NULL, "MASTER_ADDR, or null"),
            "master_port": F(STR | NULL, "MASTER_PORT, or null"),
            "signing_key": F(
                STR,
                "fingerprint (SHA-256 of the raw public key) of the key the recording signs "
                "its chain heads with, or absent when no key was configured: a stream that names one and has "
                "lost its signatures is refused by checkpoint, export-head, attest and restore",
                optional=True,
            ),
            "run_id_source": F(
                STR,
                "how the run id was chosen: argument | AUDITLOG_RUN_ID | torchrun agent "
                "store | torchrun environment | random",
            ),
            "energy": F(
                OBJ | NULL,
                "host energy counters at the start: {source: rapl, ts_ns, zones: {zone: "
                "{name, energy_uj, max_energy_range_uj}}} (Linux powercap; every process on the host counts), "
                "or null where none is readable",
            ),
            "python": F(STR, "Python version"),
            "torch": F(STR, "torch version"),
            "cuda": F(STR | NULL, "CUDA version torch was built with, or null"),
            "platform": F(STR, "platform string"),
            "git": F(
                OBJ | NULL,
                "{commit, branch, dirty, diff_sha256, root, modified, untracked, files, "
                "files_total, hashing} of the code being run, or null. files: the changed paths (at most 100; "
                "modified first, then untracked) as {path, state, method, identity, from?, executable?}, state"
                " modified | added | deleted | renamed | copied | unmerged | untracked, method sha256 "
                "(identity: of the content) | size_mtime (identity: size:mtime_ns; files over 16 MiB or past "
                "the start's read budget) | symlink | special | deleted | unreadable; hashing: {methods: count"
                " per method, file_limit, total_limit, seconds_limit, seconds}. Runs recorded before have only"
                " the first five and untracked (a count); their diff_sha256 hashed the diff and untracked "
                "contents",
            ),
            "seeds": F(
                SEEDS,
                "{torch_initial_seed} at start, an unsigned 64-bit integer (0 .. 2^64 - 1; a "
                "JSON integer, exact)",
            ),
            "policy": F(OBJ, "capture settings in force (backward mechanism, ...)"),
            "auditlog": F(STR, "auditlog version"),
            "content_hash": F(
                INT,
                "how the run's tensor content hashes are made: 2 (a tree of SHA-256 leaves "
                "for tensors over 4 MiB; docs/integrity.md); absent in runs recorded before, whose hashes are "
                "version 1",
            ),
        },
        summary=((None, "{argv:words}"),),
    ),
    Kind(
        "run_ended",
        "Last event of a stream. A stream with no run_ended is reported as crashed or incomplete.",
        {
            "status": F(
                enum("completed", "failed", "interrupted", "crashed"),
                "completed | failed | interrupted | crashed",
            ),
            "exit_code": F(INT | NULL, "process exit code when known"),
            "exception": F(
                obj(type=STR, message=STR | NULL, traceback=STR | NULL) | NULL,
                "{type, message, "
                "traceback} for failed runs and Ctrl-C (KeyboardInterrupt), the traceback as python prints it;"
                " else null",
            ),
            "signal": F(
                STR | NULL, "signal name for interrupted runs (SIGINT, SIGTERM), else null"
            ),
            "steps": F(INT, "optimizer steps completed"),
            "seeds": F(
                SEEDS,
                "{torch_initial_seed} at end (reflects torch.manual_seed calls)",
                optional=True,
            ),
            "dropped": F(
                INT, "records the recorder had to drop (0 unless the store failed)", optional=True
            ),
            "energy": F(
                OBJ | NULL,
                "host energy counters at the end, as in run_started, or null",
                optional=True,
            ),
            "detected_by": F(
                STR, "for status crashed: the run id that noticed the dead process", optional=True
            ),
            "last_seen": F(
                STR | NULL,
                "for status crashed: the dead process's last heartbeat (UTC)",
                optional=True,
            ),
        },
        summary=(
            (
                None,
                "{status}[ exit={exit_code}| (exit code unknown)]"
                "[, detected by run {detected_by:id12}][ {exception.type}][: {exception.message}]",
            ),
        ),
    ),
    Kind(
        "module_registered",
        "A child module was attached to a parent (add_module / setattr / register_module). child_id"
        " null means register_module(name, None). module_id is the parent. A module's site is the "
        "line of user code that called its constructor (kind constructed), wherever it was "
        "attached; where its constructor was not seen, the line attaching it (kind attached).",
        {
            "name": F(STR, "attribute name in the parent"),
            "child_id": F(INT | NULL, "module id of the child, or null"),
            "child_class": F(STR | NULL, "qualified class name of the child, or null"),
            "parent_class": F(STR, "qualified class name of the parent"),
            "source": F(
                SOURCE | NULL,
                "{file, line, function, kind} of the child: kind constructed (the user "
                "code that called its constructor) or attached (its constructor was not seen: built before "
                "recording, a deepcopy, C++; the line that attached it); null when adopted",
            ),
            "parent_source": F(
                SOURCE | NULL,
                "the parent's {file, line, function, kind} (as source); present "
                "on the parent's first appearance",
                optional=True,
            ),
            "detected_at": F(
                STR,
                "set when no hook reported it and a structural check found it "
                "(optimizer_step | snapshot | run_end)",
                optional=True,
            ),
            "adopted": F(
                BOOL,
                "true when the module existed before recording and was discovered later",
                optional=True,
            ),
        },
        summary=((None, "{name} = {child_class:class}"),),
    ),
    Kind(
        "module_wrapped",
        "The model (module_id) was put inside a data-parallel wrapper (DistributedDataParallel, "
        "DataParallel, FullyShardedDataParallel). The wrapper is not part of the model: it gets no "
        "module id, its forward calls are not recorded (the model's are), and names carry no "
        "'module.' prefix.",
        {
            "wrapper_class": F(STR, "qualified class name of the wrapper"),
            "attr": F(
                STR, "the wrapper's attribute holding the model (module, _fsdp_wrapped_module)"
            ),
            "source": F(
                SOURCE | NULL, "{file, line, function} of the user code that built the wrapper"
            ),
        },
    ),
    Kind(
        "parameter_registered",
        "A parameter was registered on a module (module_id) under a name; tensor_id is the "
        "Parameter's identity (tied weights: one tensor_id, several registrations). Values at "
        "registration are uninitialized memory, so none are recorded here (see "
        "construction_sealed).",
        {
            "name": F(STR, "attribute name in the module"),
            "module_class": F(STR, "qualified class name of the module"),
            "shape": F(
                ListOf(INT) | NULL, "list of ints, or null when the parameter is None or lazy"
            ),
            "dtype": F(STR | NULL, "torch dtype, e.g. float32"),
            "device": F(STR | NULL, "device string"),
            "requires_grad": F(BOOL | NULL, "bool"),
            "source": F(SOURCE | NULL, "{file, line, function} of the user code"),
            "module_source": F(
                SOURCE | NULL,
                "the module's {file, line, function, kind} (as "
                "module_registered's source); present on its first appearance",
                optional=True,
            ),
            "detected_at": F(
                STR, "set when found by a structural check rather than a hook", optional=True
            ),
            "adopted": F(BOOL, "true when discovered after the fact", optional=True),
            "lazy": F(
                BOOL,
                "true for a lazy module's UninitializedParameter: its shape is recorded by the "
                "structure_changed that finds it materialized, and it is sealed after that",
                optional=True,
            ),
        },
        summary=((None, "{name} {shape} {dtype}"),),
    ),
    Kind(
        "buffer_registered",
        "A buffer was registered on a module (module_id); tensor_id is the buffer's identity.",
        {
            "name": F(STR, "attribute name in the module"),
            "module_class": F(STR, "qualified class name of the module"),
            "shape": F(ListOf(INT) | NULL, "list of ints, or null when the buffer is None or lazy"),
            "dtype": F(STR | NULL, "torch dtype"),
            "device": F(STR | NULL, "device string"),
            "persistent": F(
                BOOL | NULL, "whether it is part of state_dict (null if it could not be read)"
            ),
            "source": F(SOURCE | NULL, "{file, line, function} of the user code"),
            "module_source": F(
                SOURCE | NULL,
                "the module's {file, line, function, kind} (as "
                "module_registered's source); present on its first appearance",
                optional=True,
            ),
            "detected_at": F(
                STR, "set when found by a structural check rather than a hook", optional=True
            ),
            "adopted": F(BOOL, "true when discovered after the fact", optional=True),
            "lazy": F(
                BOOL,
                "true for a lazy module's UninitializedBuffer (see parameter_registered)",
                optional=True,
            ),
        },
        summary=((None, "{name} {shape} {dtype}"),),
    ),
    Kind(
        "construction_sealed",
        "Construction finished for the tensors listed: their initial values. Emitted at the first "
        "forward of a root module (module_id), at the first optimizer step, at run.seal(model), or "
        "at run end, for every parameter/buffer not sealed before.",
        {
            "trigger": F(
                enum("first_forward", "optimizer_step", "explicit", "run_end"),
                "first_forward | optimizer_step | explicit | run_end",
            ),
            "stored": F(BOOL, "true when the values were also stored as snapshots (the default)"),
            "tensors": F(
                ListOf(SEALED),
                "list of {tensor_id, sha256, stats, shard, subclass}: sha256 is the "
                "content hash (see auditlog.tensor_hash) of the value at sealing; "
                + STATS_DOC
                + "; shard (sharded DTensor parameters, FSDP2): {placements, mesh_shape, coordinate, "
                "global_shape, local_shape, offset} of this rank's shard, whose values and hash the item "
                "holds; subclass: a wrapper tensor subclass, as in snapshot_taken",
            ),
        },
        summary=((None, "{tensors:count} tensors sealed ({trigger})"),),
    ),
    Kind(
        "snapshot_taken",
        "The values of every parameter and buffer under a root module (module_id). Contents are "
        "stored once per distinct hash in snapshots/ (Parquet) and listed in the snapshot_blobs "
        "catalog, so the hash chain covers them.",
        {
            "trigger": F(
                enum("step", "explicit", "run_end", "released", "last_finite"),
                "step (every N "
                "optimizer steps) | explicit (run.snapshot) | run_end | released (the last values of a model "
                "garbage-collected before the run ended, e.g. a local of main(): its run-end snapshot) | "
                "last_finite (the values before the first non-finite gradients were applied, or, "
                "keep_finite_state, the parameters before the step that made them non-finite; module_id null "
                "then)",
            ),
            "tag": F(STR | NULL, "user label for explicit snapshots, else null"),
            "snapshot": F(
                obj(tensors=ListOf(STORED), new_bytes=INT, copied_bytes=INT, write_s=NUM),
                "{tensors: "
                "[{tensor_id, sha256, shard, subclass}], new_bytes: bytes newly stored, copied_bytes: bytes "
                "copied and hashed (every tensor, every time: unchanged content costs no disk, but is still "
                "copied and hashed), write_s: seconds the writer took to hash and store it}; subclass (a "
                "wrapper tensor subclass only, e.g. TwoTensor): {type: its class, inner: {attribute: sha256} "
                "of the inner tensors of __tensor_flatten__, ctx: repr of the flatten context or null, shape "
                "and stride: the wrapper's own (null where its code would have to compute them)}, and sha256 "
                "is then the first inner tensor's",
            ),
            "overrun": F(
                obj(behind=INT, behind_bytes=INT, waited_s=NUM),
                "only when this snapshot was due "
                "before earlier ones were stored (the writer cannot keep up with the snapshot rate): {behind: "
                "snapshots taken and not yet stored then, behind_bytes: their host copies' bytes, waited_s: "
                "seconds the training thread waited for the oldest to be stored (0 unless more than one was "
                "behind: the bound on host copies, docs/snapshots.md)}. Nothing is skipped either way",
                optional=True,
            ),
        },
        summary=(
            (
                None,
                "{trigger}"
                "[ {tag:repr}]: {snapshot.tensors:count} tensors, {snapshot.new_bytes} new bytes",
            ),
        ),
    ),
    Kind(
        "structure_changed",
        "A change no PyTorch hook reports, found by a structural check: a member removed (del "
        "model.sub) or a tensor's dtype/device/shape/requires_grad changed (.half(), .to(), "
        "requires_grad_). module_id is the owning module; tensor_id the tensor for tensor changes.",
        {
            "change": F(enum("removed", "tensor_changed"), "removed | tensor_changed"),
            "member": F(enum("module", "parameter", "buffer"), "module | parameter | buffer"),
            "name": F(STR, "the member's name in its module"),
            "old_id": F(INT | NULL, "for removed: the id that was there", optional=True),
            "before": F(
                OBJ, "for tensor_changed: the old values of the changed fields", optional=True
            ),
            "after": F(OBJ, "for tensor_changed: the new values", optional=True),
            "detected_at": F(STR, "first_forward | optimizer_step | snapshot | run_end"),
        },
        summary=(
            ("change=removed", "{member} {name:repr} removed (found at {detected_at})"),
            (None, "{member} {name:repr}: {before} -> {after}"),
        ),
    ),
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
    Kind(
        "annotation",
        "A fact the user added with run.annotate(key, **fields).",
        {
            "key": F(STR, "the annotation key"),
            "fields": F(OBJ, "the user's fields (JSON-encodable)"),
        },
        summary=((None, "{key}: {fields}"),),
    ),
    Kind(
        "recorder_error",
        "The recorder itself failed somewhere; training went on. Part of the record.",
        {
            "where": F(STR, "hook or component that failed"),
            "type": F(STR, "exception type"),
            "message": F(STR, "exception message"),
        },
        summary=((None, "{where}: {type}: {message}"),),
    ),
]

KINDS: dict[str, Kind] = {k.name: k for k in _KINDS}
