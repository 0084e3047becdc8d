"""A full ``state_dict`` from the shards the ranks of a sharded run (FSDP2) each snapshotted.

With ``fully_shard`` every parameter is a DTensor and each rank holds, and
records, only its own piece; the snapshot item of a sharded tensor says where
that piece lies (``shard``: placements, mesh shape and coordinate, global and
local shape, offset; see ``auditlog.capture.torch_compat.shard_facts``).
Restoring step N gathers, for every key, the pieces that the ranks of the same
segment stored at step N and places each at its offset in a tensor of the
global shape. Replicated pieces must agree bitwise. When the pieces cannot make
the whole tensor (a rank recorded no snapshot then, a placement that is not a
piece of the value such as ``Partial``, an uneven layout) the error says which
tensor, which ranks and why; nothing is guessed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from auditlog.core.errors import AuditlogError, UsageError
from auditlog.core.ranks import split_stream
from auditlog.store.blobs import SnapshotError, SnapshotStore

if TYPE_CHECKING:
    from auditlog.read.run import Run

Piece = tuple[int, str | None, dict[str, Any] | None]  # (rank, snapshot hash, shard facts)


def sharded_state_dict(
    run: Run, step: int | None, seq: int | None, root: str | None, allow_partial: bool
) -> dict[str, torch.Tensor]:
    """The full ``state_dict`` at ``step`` (or the end) assembled from every rank's pieces."""
    from auditlog.read.run import Run

    if seq is not None:
        raise UsageError(
            "a sharded state_dict is restored at a step (or the end): a seq names one rank's event"
        )
    segment = split_stream(run.stream)[0]
    streams = [s for s in run.streams() if split_stream(s)[0] == segment]
    pieces: dict[str, list[Piece]] = {}
    order: list[str] = []
    for stream in streams:
        rank = split_stream(stream)[1]
        view = Run(run.store, run.run_id, rank=rank, stream=stream)
        try:
            items = view.restore_items(step, None, root)
        except UsageError as exc:  # e.g. this rank never reached the step
            raise AuditlogError(f"cannot reassemble the state_dict: rank {rank}: {exc}") from exc
        for key, sha, facts in items:
            if key not in pieces:
                order.append(key)
            pieces.setdefault(key, []).append((rank, sha, facts))
    when = f"step {step}" if step is not None else "the end"
    store = SnapshotStore(run.store.location.snapshots)
    wanted = sorted({sha for found in pieces.values() for _, sha, _ in found if sha is not None})
    rows = run.store.blob_rows(wanted)
    out: dict[str, torch.Tensor] = {}
    for key in order:
        found = pieces[key]
        if all(sha is None for _, sha, _ in found):
            if allow_partial:
                continue
            raise AuditlogError(
                f"no snapshot of {key} at {when} on any rank (record with snapshot_every)"
            )
        out[key] = _assemble(key, when, found, rows, store)
    return out


def _load(
    sha: str, key: str, rows: dict[str, dict[str, Any]], store: SnapshotStore
) -> torch.Tensor:
    if sha not in rows:
        raise SnapshotError(f"snapshot {sha[:16]}... of {key} is not in the catalog")
    return store.read_verified(sha, key)  # its content hash checked: a changed file is refused


def _assemble(
    key: str, when: str, found: list[Piece], rows: dict[str, dict[str, Any]], store: SnapshotStore
) -> torch.Tensor:
    """One global tensor from the ranks' pieces (module docstring)."""
    sharded = [(rank, sha, facts) for rank, sha, facts in found if facts is not None]
    if not sharded:  # a plain tensor (a buffer FSDP leaves alone): every rank holds all of it
        rank, sha, _ = next(p for p in found if p[1] is not None)
        return _load(str(sha), key, rows, store)
    absent = [rank for rank, sha, _ in found if sha is None]
    if absent:
        raise AuditlogError(
            f"cannot reassemble {key} at {when}: rank{'s' if len(absent) > 1 else ''} "
            f"{', '.join(map(str, absent))} recorded no snapshot of its shard then"
        )
    first = sharded[0][2]
    assert first is not None
    for rank, _sha, facts in sharded:
        assert facts is not None
        if facts.get("offset") is None:
            raise AuditlogError(
                f"cannot reassemble {key}: rank {rank}'s shard ({', '.join(facts.get('placements') or [])}) is not "
                "a piece of the value at a known offset (Partial placement or uneven sharding)"
            )
    global_shape = [int(n) for n in first["global_shape"]]
    dtype = None
    out: torch.Tensor | None = None
    covered = torch.zeros(global_shape, dtype=torch.bool)
    for rank, sha, facts in sharded:
        assert facts is not None and sha is not None
        local = _load(sha, key, rows, store).reshape([int(n) for n in facts["local_shape"]])
        if out is None:
            dtype = local.dtype
            out = torch.empty(global_shape, dtype=local.dtype)
        elif local.dtype != dtype:
            raise AuditlogError(
                f"cannot reassemble {key}: rank {rank}'s shard is {local.dtype}, not {dtype}"
            )
        region = tuple(
            slice(o, o + n) for o, n in zip(facts["offset"], facts["local_shape"], strict=True)
        )
        seen = covered[region]
        if bool(seen.any()) and not _same_bits(out[region][seen], local[seen]):
            raise AuditlogError(
                f"cannot reassemble {key} at {when}: replicas of its values differ on rank {rank}"
            )
        out[region] = local
        covered[region] = True
    assert out is not None
    if not bool(covered.all()):
        ranks = ", ".join(str(rank) for rank, _, _ in sharded)
        raise AuditlogError(
            f"cannot reassemble {key} at {when}: the shards of ranks {ranks} cover {int(covered.sum())} of "
            f"{covered.numel()} elements (a rank's stream is missing from this store?)"
        )
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), for replicated pieces."""
    a, b = a.contiguous(), b.contiguous()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8))) if a.numel() else True
