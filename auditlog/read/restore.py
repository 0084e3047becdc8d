"""Writing a restored state_dict to a file (``auditlog restore``), memory bounded where the format allows.

**safetensors** is written as a stream, without torch: the header is built
from the snapshot files' facts (dtype, shape), then each distinct content is
read back, its content hash checked (``SnapshotStore.verified_bytes``), and its
bytes written under every key that holds it (tied weights), one tensor in
memory at a time: the peak is one tensor plus a row group, whatever the model's
size. Small files (``blobformat.WHOLE_FILE_BYTES``) are read and checked once,
while the header is planned, and kept for the write up to ``LOADED_BYTES``:
a model of thousands of small tensors pays one open per file. The header
lists keys sorted by name (as ``safetensors.torch.save_file`` does); the
state_dict's own order is kept in the metadata under ``auditlog.key_order``.

**torch** (``.pt``) files are ``torch.save`` of the whole rebuilt state_dict:
its format pickles every tensor in one call, so that restore holds the model
in memory, as ``torch.load`` of the result will. Sharded (DTensor) runs are
reassembled in memory first whichever the format.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import IntegrityError
from auditlog.store.blobformat import SnapshotError, reason
from auditlog.store.blobpaths import where
from auditlog.store.blobs import SnapshotStore

if TYPE_CHECKING:
    from auditlog.read.run import Run

# Small files read (and checked) while the header is planned are kept for the
# write, up to this many bytes of content: each is then opened once, not twice.
LOADED_BYTES = 256 * 1024 * 1024

KEY_ORDER = (
    "auditlog.key_order"  # safetensors metadata: the state_dict's key order (its header sorts keys)
)

# dtype name -> safetensors dtype code (safetensors' format; others go through save_file, which says why not).
SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "complex64": "C64",
}


def write_restored(
    run: Run,
    target: Path,
    kind: str,
    step: int | None,
    seq: int | None,
    root: str | None,
    allow_partial: bool,
) -> int:
    """Write ``run``'s state_dict at a step/seq to ``target`` as ``kind`` (safetensors | torch);
    return how many tensors were written. ``IntegrityError`` for a file that fails its check."""
    plan = run.checked_plan(step, seq, root, allow_partial)
    if kind == "safetensors" and plan is not None:
        files = SnapshotStore(run.store.location.snapshots)
        when = _when(step, seq)
        facts: dict[str, Any] = {}
        loaded: dict[str, Any] = {}
        budget = LOADED_BYTES
        for key, sha in plan:
            if sha in facts:
                continue
            got = (
                files.verified_bytes(sha, f"{key} at {when}", whole_only=True)
                if budget > 0
                else None
            )
            if got is None:
                facts[sha] = _facts(files, sha, key, when)
            else:
                facts[sha], loaded[sha] = got
                budget -= facts[sha].nbytes
        if all(info.dtype in SAFETENSORS_DTYPES for info in facts.values()):
            _stream_safetensors(
                files, plan, facts, loaded, target, {"auditlog.run": run.run_id}, when
            )
            return len(plan)
    # A wrapper subclass as its first inner tensor: the class is not imported here
    # (``read.wrappers``), and safetensors holds plain tensors only; the CLI says so.
    state = run.state_dict(
        step=step, seq=seq, root=root, allow_partial=allow_partial, wrappers="first"
    )
    if kind == "safetensors":
        from safetensors.torch import save_file

        # safetensors refuses aliased tensors (tied weights): give each key its own copy.
        seen: set[int] = set()
        unique = {}
        for key, tensor in state.items():
            unique[key] = tensor.clone() if id(tensor) in seen else tensor
            seen.add(id(tensor))
        metadata = {"auditlog.run": run.run_id, KEY_ORDER: json.dumps(list(unique))}
        save_file({k: v.contiguous() for k, v in unique.items()}, str(target), metadata=metadata)
    else:
        import torch

        torch.save(state, target)
    return len(state)


def _facts(files: SnapshotStore, sha: str, key: str, when: str) -> Any:
    """A file's dtype and shape for the header; a missing or malformed file is a damaged
    record (``IntegrityError`` naming the tensor and the file), as for ``read_verified``."""
    try:
        return files.describe(sha)
    except SnapshotError as exc:
        raise IntegrityError(
            f"snapshot of {key} at {when} ({where(sha)}) cannot be used: {reason(exc)}"
        ) from exc


def _when(step: int | None, seq: int | None) -> str:
    return f"step {step}" if step is not None else (f"seq {seq}" if seq is not None else "the end")


def _stream_safetensors(
    files: SnapshotStore,
    plan: list[tuple[str, str]],
    facts: dict[str, Any],
    loaded: dict[str, Any],
    target: Path,
    metadata: dict[str, str],
    when: str,
) -> None:
    """The safetensors file of ``plan``, torch-free: contents already read and checked
    (``loaded``) are written as they are; each other one is read, checked and written
    in turn, one in memory at a time."""
    keys_of: dict[str, list[str]] = {}
    for key, sha in plan:
        keys_of.setdefault(sha, []).append(key)
    header: dict[str, Any] = {
        "__metadata__": {**metadata, KEY_ORDER: json.dumps([key for key, _ in plan])}
    }
    offset = 0
    for (
        sha,
        keys,
    ) in keys_of.items():  # each content's keys side by side: read once, written per key
        info = facts[sha]
        for key in keys:
            header[key] = {
                "dtype": SAFETENSORS_DTYPES[info.dtype],
                "shape": info.shape,
                "data_offsets": [offset, offset + info.nbytes],
            }
            offset += info.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with target.open("wb") as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
        for sha, keys in keys_of.items():
            data = loaded.pop(sha, None)
            if data is None:
                got = files.verified_bytes(sha, f"{keys[0]} at {when}")
                assert got is not None
                info, data = got
                if info.shape != facts[sha].shape or info.dtype != facts[sha].dtype:
                    raise IntegrityError(
                        f"snapshot of {keys[0]} at {when} ({where(sha)}) changed while it was restored"
                    )
            for _ in keys:
                handle.write(data)
            del data
