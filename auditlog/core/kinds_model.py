"""Event kinds of a run's life and of the model's construction: run start and end,
registrations, seals, snapshots, structural changes (``core.kinds`` gathers every kind)."""

from __future__ import annotations

from auditlog.core.eventtypes import (
    BOOL,
    INT,
    NULL,
    NUM,
    OBJ,
    STR,
    F,
    Kind,
    ListOf,
    enum,
    obj,
)
from auditlog.core.kindfields import (
    SEALED,
    SEEDS,
    SOURCE,
    STATS_DOC,
    STORED,
)

MODEL_KINDS: list[Kind] = [
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
            "compiled_frames": F(
                INT,
                "frames torch.compile compiled while the run recorded (only when some were): "
                "what ran inside compiled code, module calls, backward passes and optimizer steps "
                "that dynamo traced, is not in the record (docs/hooks.md)",
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
]
