"""One recorded run, as the Python API and every read command see it.

``Run`` answers from the event store through its query methods: the events
(filtered by kind, step, stream and module name), the module tree at any step
or event, the ``state_dict`` rebuilt from snapshots, and verification. Names
come from replay (``auditlog.core.replay``), since events carry identities only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import AuditlogError, CorruptRecordError, UsageError
from auditlog.core.naming import Labels, attached_ids, label_state
from auditlog.core.ranks import split_stream
from auditlog.core.replay import CONSTRUCTION_KINDS, ModelState, replay
from auditlog.read.runs import RunInfo, list_runs
from auditlog.store.eventstore import EventStore
from auditlog.store.rows import decode_event

if TYPE_CHECKING:
    import torch
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from auditlog.integrity.checkpoints import SignedHead
    from auditlog.integrity.keys import KeyRing
    from auditlog.integrity.statements import HeadStatement
    from auditlog.integrity.verify import SourcedStatement, VerifyReport
    from auditlog.read.data import BatchHistory, DataSummary, SampleHistory
    from auditlog.read.forensics import Finding
    from auditlog.read.series import Panel


class Run:
    """One recorded run of a store (``auditlog.open(...).run("latest")``).

    Example::

        with auditlog.open(".auditlog") as store:
            run = store.run("latest")
            for event in run.events(kinds=["optimizer_step"], step_range=(1, 5)):
                print(event["step"], event["payload"]["grad_norm"])
            tree = run.state_at(step=3)            # the module tree after step 3
            weights = run.state_dict(step=3)       # needs snapshots at step 3
            assert run.verify().ok
    """

    def __init__(
        self, store: EventStore, run_id: str, rank: int | None = None, stream: int | None = None
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.rank = rank
        self._pinned = stream  # one given stream (a rank in one segment), else chosen below
        self._streams: list[int] | None = None
        self._chain_checked = False  # require_intact_chain ran (once per Run)
        # The last restore pick (a replay of the construction events): state_dict asks twice.
        self._last_pick: tuple[tuple[int | None, int | None, str | None], list[Any]] | None = None

    # ------------------------------------------------------------------ ranks
    def streams(self) -> list[int]:
        """The run's stream numbers (one per rank and segment, see ``auditlog.core.ranks``)."""
        if self._streams is None:
            self._streams = self.store.streams(self.run_id)
        return self._streams

    def ranks(self) -> list[int]:
        """The ranks that recorded a stream of this run."""
        return sorted({split_stream(s)[1] for s in self.streams()})

    def rank_streams(self, rank: int | None = None) -> list[int]:
        """The streams of one rank (all its segments, oldest first); every stream when
        ``rank`` is None and this view has no rank. ``UsageError`` for an unknown rank."""
        rank = self.rank if rank is None else rank
        if rank is None:
            return self.streams()
        found = [s for s in self.streams() if split_stream(s)[1] == rank]
        if not found:
            known = ", ".join(str(r) for r in self.ranks()) or "none"
            raise UsageError(f"run {self.run_id[:12]} has no rank {rank} (ranks: {known})")
        return found

    @property
    def stream(self) -> int:
        """The stream whose structure and values this view shows: the rank's last segment
        (the view's rank, else rank 0, else the lowest stream recorded)."""
        if self._pinned is not None:
            return self._pinned
        streams = self.streams()
        if not streams:
            return 0
        if self.rank is not None:
            return self.rank_streams()[-1]
        zero = [s for s in streams if split_stream(s)[1] == 0]
        return zero[-1] if zero else streams[0]

    # ------------------------------------------------------------------ events
    def events(
        self,
        kinds: Sequence[str] | None = None,
        step_range: tuple[int | None, int | None] | None = None,
        stream: int | None = None,
        module: str | None = None,
        check_chain: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Events in (stream, seq) order with the payload decoded.

        ``module``: a glob over qualified module names (``body.*``); an event is
        kept when its module matches, when it registers a matching child, or
        (``activity``) when one of its module calls does. A malformed event is a
        ``CorruptRecordError`` naming it, a payload past the limits a
        ``PayloadLimitError``. ``check_chain``: each event has ``chain_ok``,
        whether its stored content is the link its hash says, chained from the
        event before it (``integrity.chaincheck.links_to``): False for an event
        edited after it was recorded. That is one event's share of ``verify``,
        not a verdict on the run.
        """
        if step_range is not None:
            self.check_steps(step_range, self.stream if stream is None else stream)
        shown = self.store.location.display()
        streams: list[int | None]
        if stream is not None:
            streams = [stream]
        elif self.rank is not None or module is not None:
            # Module ids are per stream (each rank's process numbered its own objects):
            # a module filter is resolved in each stream.
            streams = list(self.rank_streams())
        else:
            streams = [None]  # one query, every stream in (stream, seq) order
        if module is not None and not any(
            self.modules_matching(module, s) for s in streams if s is not None
        ):
            raise AuditlogError(f"no module of run {self.run_id[:12]} matches {module!r}")
        if check_chain:
            from auditlog.integrity.chaincheck import RowLinks

            links = RowLinks(self.store, self.run_id)  # each stream's format, found once
        for one in streams:
            wanted = None if module is None or one is None else self.modules_matching(module, one)
            # (not bound to a name: a local would keep the cursor open in the traceback of an error)
            for row in self.store.iter_events(
                self.run_id, kinds=kinds, step_range=step_range, stream=one, prev_hash=check_chain
            ):
                prev = row.pop("prev_hash", None)
                event = decode_event(row, shown)
                if check_chain:
                    event["chain_ok"] = links.check(row, prev)
                if wanted is None or _mentions(event, wanted):
                    yield event

    def modules_matching(self, pattern: str, stream: int | None = None) -> set[int]:
        """Ids of the modules whose qualified name (any of them) matches the glob ``pattern``."""
        names = self.model_state(stream=stream).module_names()
        return {
            m for m, found in names.items() if any(fnmatch.fnmatchcase(n, pattern) for n in found)
        }

    def module_calls(
        self,
        direction: str | None = None,
        step_range: tuple[int | None, int | None] | None = None,
        stream: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Recorded module calls, one dict per call, from the ``activity`` events.

        Each: ``kind`` ("forward" | "backward"), ``seq`` and ``stream`` of the
        activity event, ``step``, ``call`` (position in the event), ``module_id``
        and ``payload`` (the call's entry: outputs / grad_outputs / ... ).
        ``direction`` keeps one of the two.
        """
        for event in self.events(kinds=["activity"], step_range=step_range, stream=stream):
            payload = event["payload"]
            for kind in ("forward", "backward"):
                if direction is not None and kind != direction:
                    continue
                for call, entry in enumerate(payload.get(kind) or []):
                    yield {
                        "kind": kind,
                        "seq": event["seq"],
                        "stream": event["stream"],
                        "step": event["step"],
                        "call": call,
                        "module_id": entry.get("module_id"),
                        "payload": {k: v for k, v in entry.items() if k != "module_id"},
                    }

    # ------------------------------------------------------------------ structure
    def labels(self, stream: int | None = None) -> Labels:
        """Every module's and tensor's name at the end of the run, by the one rule that
        the views, ``diff`` and ``events`` share (``auditlog.core.naming``)."""
        construction = list(
            self.events(kinds=CONSTRUCTION_KINDS, stream=self.stream if stream is None else stream)
        )
        return label_state(self._replay(iter(construction), None), attached_ids(construction))

    def model_state(self, upto_seq: int | None = None, stream: int | None = None) -> ModelState:
        """The module forest as of ``upto_seq`` (default: the end of the run) in one
        stream (default: ``self.stream``)."""
        return self._replay(
            self.events(kinds=CONSTRUCTION_KINDS, stream=self.stream if stream is None else stream),
            upto_seq,
        )

    def _replay(self, events: Iterator[dict[str, Any]], upto_seq: int | None) -> ModelState:
        try:
            return replay(events, upto_seq=upto_seq)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecordError(
                f"store {self.store.location.display()!r}: run {self.run_id[:12]} has a construction "
                f"event that cannot be replayed ({type(exc).__name__}: {exc}); run `auditlog verify`"
            ) from exc
        finally:
            # Close the half-read cursor now: an open one keeps its connection checked
            # out, and SQLite then leaves -wal/-shm files beside a store we only read.
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def boundary(
        self, step: int | None = None, seq: int | None = None, stream: int | None = None
    ) -> int | None:
        """The last seq of "the state right after the N-th optimizer.step() returned".

        Step 0 is the sealed initial state: every event before the first one of
        step 1. ``seq`` is taken as given. Neither: None (the end of the run).
        """
        if seq is not None and step is not None:
            raise UsageError("a step and a seq name the point in the run twice; give one of them")
        stream = self.stream if stream is None else stream
        if seq is not None:
            if seq < 1:
                raise UsageError(f"bad seq {seq}: sequence numbers start at 1")
            last_seq = self.store.last_seq(self.run_id, stream) or 0
            if seq > last_seq:
                raise UsageError(
                    f"run {self.run_id[:12]} has no seq {seq} (its events are seq 1..{last_seq})"
                )
            return seq
        if step is None:
            return None
        if step < 0:
            raise UsageError(f"bad step {step}: steps are >= 0")
        if step == 0:
            first = self.store.first_seq_from_step(self.run_id, stream, 1)
            return first - 1 if first is not None else self.store.last_seq(self.run_id, stream)
        found = self.store.step_seq(self.run_id, stream, step)
        if found is None:
            self.check_steps((step, step), stream)
            last = self.store.max_step(self.run_id, stream) or 0
            raise UsageError(
                f"run {self.run_id[:12]} has no step {step} (it recorded steps 0..{last})"
            )
        return found

    def check_steps(self, step_range: tuple[int | None, int | None], stream: int = 0) -> None:
        """A step range that starts after the run's last step is an error naming that step.

        The one rule for every command: a step or seq beyond the run is not an
        empty answer but a mistake (a range may end beyond the run).
        """
        low = step_range[0]
        if low is None:
            return
        last = self.store.max_step(self.run_id, stream) or 0
        if low > last:
            raise UsageError(
                f"run {self.run_id[:12]} has no step {low} (it recorded steps 0..{last})"
            )

    def state_at(self, step: int | None = None, seq: int | None = None) -> ModelState:
        """The module forest as of a step or a seq (see ``boundary``)."""
        return self.model_state(upto_seq=self.boundary(step, seq))

    # ------------------------------------------------------------------ values
    def state_dict(
        self,
        step: int | None = None,
        seq: int | None = None,
        root: str | None = None,
        allow_partial: bool = False,
        wrappers: str = "rebuild",
    ) -> dict[str, torch.Tensor]:
        """A ``state_dict`` rebuilt from snapshots, bitwise equal to the live one then.

        Values for step N come from snapshots recorded at step N (taken in that
        step's post hook, or later before step N+1: explicit and run-end
        snapshots). A tensor with no such snapshot is an error naming it, unless
        ``allow_partial`` (then it is left out; nothing at all is still an error).
        Each value's content hash is checked against the chained hash
        (``IntegrityError`` naming the tensor and the file). Needs torch.

        A wrapper tensor subclass (TwoTensor, Float8-like) is rebuilt from every
        inner tensor stored (``wrappers="rebuild"``, ``read.wrappers``): its class
        must already be imported (a name in the store never makes auditlog import
        code); otherwise an error says so. ``wrappers="first"`` gives its first
        inner tensor instead, as a plain tensor (what ``auditlog restore`` writes).
        """
        if wrappers not in ("rebuild", "first"):
            raise UsageError(f"wrappers must be 'rebuild' or 'first', not {wrappers!r}")
        from auditlog.store.blobs import SnapshotStore

        plan = self.checked_plan(step, seq, root, allow_partial)
        if plan is None:
            from auditlog.read.reassemble import sharded_state_dict

            return sharded_state_dict(self, step, seq, root, allow_partial)
        when = _when(step, seq)
        # Every value is read back and its content hash compared with the hash the
        # chain recorded: a file replaced under a hash is an IntegrityError naming it.
        snapshots = SnapshotStore(self.store.location.snapshots)
        wanted: dict[str, str] = {}
        for key, sha in plan:
            wanted.setdefault(sha, f"{key} at {when}")  # a shared content is named by its first key
        loaded = snapshots.read_many(list(wanted.items()))
        out = {key: loaded[sha] for key, sha in plan}
        if wrappers == "rebuild":
            from auditlog.read.wrappers import rebuild_wrappers

            rebuild_wrappers(out, self.wrappers_at(step, seq, root), snapshots, when)
        return out

    def checked_plan(
        self, step: int | None, seq: int | None, root: str | None, allow_partial: bool
    ) -> list[tuple[str, str]] | None:
        """``(state_dict key, snapshot hash)`` of what ``state_dict`` restores, in key order,
        or None for a sharded (DTensor) run, whose pieces are reassembled instead.

        A tensor with no snapshot then is an error naming it, unless
        ``allow_partial`` (then it is left out); nothing at all is an error.
        The run's chain is checked first (``require_intact_chain``): the plan
        comes from its events, and a file that matches a hash proves nothing
        when the hash itself was forged.
        """
        self.require_intact_chain()
        items = self.restore_items(step, seq, root)
        if any(facts is not None for _, _, facts in items):
            return None
        missing = [key for key, sha, _ in items if sha is None]
        when = _when(step, seq)
        if missing and not allow_partial:
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            raise AuditlogError(
                f"no snapshot of {shown} at {when} (record with snapshot_every, or allow a partial state_dict)"
            )
        if len(missing) == len(items):
            what = (
                f"no tensor of run {self.run_id[:12]} was snapshotted"
                if items
                else "the model has no parameters or buffers"
            )
            raise AuditlogError(f"{what} at {when}; nothing to restore")
        return [(key, sha) for key, sha, _ in items if sha is not None]

    def require_intact_chain(self) -> None:
        """Refuse (``IntegrityError``) to restore from a run whose events do not verify:
        every link and seq of every stream, its checkpoints by the configured keys, and,
        where a key is configured, a stream recorded for signing that has lost its
        signatures (``integrity.checkpoints.lost_signatures``). Snapshot files are left to the
        restore, which checks each one it reads. Issue 29: a restore checked only the
        files, so a chain rewritten to name another run's files restored those."""
        if self._chain_checked:
            return
        from auditlog.core.errors import IntegrityError
        from auditlog.integrity.checkpoints import default_keys, lost_signatures
        from auditlog.integrity.keys import KeyRing
        from auditlog.integrity.verify import verify_run

        keys = KeyRing(default_keys())
        report = verify_run(
            self.store, self.run_id, keys=keys, require_signed=False, snapshot_files=False
        )
        altered = next((p for p in report.problems if p.altered), None)
        if altered is not None:
            raise IntegrityError(
                f"refusing to restore from run {self.run_id[:12]}: record altered: "
                f"{altered.describe()}"
            )
        lost = lost_signatures(report, keys) if keys else None
        if lost is not None:
            raise IntegrityError(f"refusing to restore from run {self.run_id[:12]}: {lost}")
        self._chain_checked = True

    def restore_plan(
        self, step: int | None = None, seq: int | None = None, root: str | None = None
    ) -> list[tuple[str, str | None]]:
        """``(state_dict key, snapshot hash or None)`` for the chosen root at a step/seq."""
        return [(key, sha) for key, sha, _ in self.restore_items(step, seq, root)]

    def restore_items(
        self, step: int | None = None, seq: int | None = None, root: str | None = None
    ) -> list[tuple[str, str | None, dict[str, Any] | None]]:
        """``(state_dict key, snapshot hash or None, shard facts or None)`` in this view's
        stream: the facts say where a sharded (DTensor) value's stored piece lies."""
        return [(key, sha, shard) for key, sha, shard, _ in self._picked(step, seq, root)]

    def wrappers_at(
        self, step: int | None = None, seq: int | None = None, root: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """The state_dict keys whose value was a wrapper tensor subclass (TwoTensor,
        Float8-like) at a step/seq, with its stored representation (``subclass`` of the
        snapshot entry: type, inner attribute -> sha256, ctx, shape, stride)."""
        return {
            key: wrapper
            for key, _, _, wrapper in self._picked(step, seq, root)
            if wrapper is not None
        }

    def _picked(
        self, step: int | None, seq: int | None, root: str | None
    ) -> list[tuple[str, str | None, dict[str, Any] | None, dict[str, Any] | None]]:
        if self._last_pick is not None and self._last_pick[0] == (step, seq, root):
            return self._last_pick[1]
        upto = self.boundary(step, seq)
        full = self.model_state()
        state = full if upto is None else self.model_state(upto_seq=upto)  # the end: one replay
        try:
            root_id = state.root_by_class(root) if root else state.main_root()
        except KeyError:
            raise UsageError(f"no root module {root!r} in run {self.run_id[:12]}") from None
        end = upto if upto is not None else full.last_seq
        limit = (
            self.store.step_seq(self.run_id, self.stream, step + 1) if step is not None else None
        )
        plan: list[tuple[str, str | None, dict[str, Any] | None, dict[str, Any] | None]] = []
        for key, tensor_id in state.state_dict_keys(root_id):
            info = full.tensors.get(tensor_id)
            picked = pick_entry(info.history if info is not None else [], step, end, limit)
            if picked is None or info is None:
                plan.append((key, None, None, None))
            else:
                plan.append(
                    (key, picked[1], info.shards.get(picked[0]), info.wrappers.get(picked[0]))
                )
        self._last_pick = ((step, seq, root), plan)
        return plan

    def snapshots(self) -> tuple[list[dict[str, Any]], int]:
        """Every snapshot of the run (stored seals included) and the distinct bytes stored.

        Rows: ``seq, step, trigger, tag, module, tensors, logical_bytes,
        new_bytes, write_s, behind``. ``logical_bytes`` counts every tensor's
        size; the total distinct content stored tells the deduplication.
        ``write_s``: the writer's seconds to store it (None for seals and
        records before it was kept); ``behind``: snapshots not yet stored when
        this one was due (its ``overrun``; 0 when the writer kept up).
        """
        from auditlog.read.snapshot_list import snapshot_rows

        return snapshot_rows(self)

    # ------------------------------------------------------------------ integrity
    def verify(
        self,
        keys: KeyRing | None = None,
        statements: Sequence[SourcedStatement] = (),
        progress: Any = None,
    ) -> VerifyReport:
        """Check this run's hash chains, checkpoints, snapshot files and the given exported heads.

        ``keys``: trusted public keys (default: the user's default public key,
        read only when there is a signature to check). The report's ``ok`` is
        False when anything was altered or could not be verified.
        """
        from auditlog.integrity.verify import verify_run

        return verify_run(self.store, self.run_id, progress, keys=keys, statements=statements)

    def checkpoint(
        self, key: Ed25519PrivateKey, told: Callable[[str], None] | None = None
    ) -> list[SignedHead]:
        """Sign every stream's current head with ``key`` and store the checkpoints.

        Refuses (``IntegrityError``) a record proven altered, or recorded for
        signing and stripped of its signatures; heads this key signed already
        are reported and left alone. ``told`` gets one line saying what the
        signature trusts (``integrity.checkpoints.trust_line``).
        """
        from auditlog.integrity.checkpoints import checkpoint_run

        return checkpoint_run(self.store, self.run_id, key, told)

    def export_head(
        self, key: Ed25519PrivateKey, told: Callable[[str], None] | None = None
    ) -> HeadStatement:
        """A signed statement of every stream's current head, to keep outside the store
        (refused as ``checkpoint`` is; ``told`` as there)."""
        from auditlog.integrity.checkpoints import export_intact_heads

        return export_intact_heads(self.store, self.run_id, key, told)

    def prove(self, seq: int, stream: int = 0) -> dict[str, Any]:
        """An inclusion proof of event ``seq`` under the stream's newest signed tree head
        (``auditlog-inclusion-proof-v1``: checkable without the store)."""
        from auditlog.read.proofs import prove_inclusion

        return prove_inclusion(self.store, self.run_id, seq, stream)

    def prove_consistency(self, old_head: dict[str, Any], stream: int = 0) -> dict[str, Any]:
        """A consistency proof from an older signed tree head (an exported head) to the newest stored one."""
        from auditlog.read.proofs import prove_consistency

        return prove_consistency(self.store, self.run_id, old_head, stream)

    # ------------------------------------------------------------------ forensics
    def metrics(self) -> tuple[list[str], list[dict[str, Any]]]:
        """Columns and one row per step: losses and logged metrics, learning rate, gradient norm
        (``auditlog metrics``; see ``auditlog.read.forensics.metrics_table``)."""
        from auditlog.read.forensics import metrics_table, questions

        with questions(self) as q:
            return metrics_table(q)

    def nonfinite(self) -> Finding:
        """Where the first NaN/Inf came from, or what to record to find out (``auditlog nonfinite``)."""
        from auditlog.read.forensics import find_nonfinite, questions

        with questions(self) as q:
            return find_nonfinite(q)

    def data(self) -> DataSummary:
        """The datasets the run iterated and its loaders (``auditlog data``; ``auditlog.read.data``)."""
        from auditlog.read.data import data_questions, data_summary

        with data_questions(self) as q:
            return data_summary(q)

    def sample(self, index: int, dataset: str | None = None) -> SampleHistory:
        """Every batch that held sample ``index`` and the steps that trained on it
        (``auditlog data --sample``); ``dataset``: an id or a class name."""
        from auditlog.read.data import data_questions, sample_history

        with data_questions(self) as q:
            return sample_history(q, index, dataset)

    def batch(self, digest: str) -> BatchHistory:
        """The batches hashed ``digest`` (or a prefix) and their steps (``data --batch-hash``)."""
        from auditlog.read.data import batch_history, data_questions

        with data_questions(self) as q:
            return batch_history(q, digest)

    def plot_panels(self, what: str, max_rows: int = 40) -> list[Panel]:
        """The data of one picture (``auditlog plot``; see ``auditlog.read.series``)."""
        from auditlog.read.forensics import questions
        from auditlog.read.series import panels

        with questions(self) as q:
            return panels(q, what, max_rows)

    def info(self) -> RunInfo:
        """The run's summary: status, start and end, command line, code version, counts."""
        for info in list_runs(self.store):
            if info.run_id == self.run_id:
                return info
        raise KeyError(self.run_id)


def _when(step: int | None, seq: int | None) -> str:
    return f"step {step}" if step is not None else (f"seq {seq}" if seq is not None else "the end")


def pick_snapshot(
    history: list[tuple[int, int, str]], step: int | None, end: int, limit: int | None
) -> str | None:
    """The snapshot hash that holds a tensor's value at the boundary ``end``."""
    picked = pick_entry(history, step, end, limit)
    return None if picked is None else picked[1]


def pick_entry(
    history: list[tuple[int, int, str]], step: int | None, end: int, limit: int | None
) -> tuple[int, str] | None:
    """``(seq, hash)`` of the snapshot that holds a tensor's value at the boundary ``end``."""
    if step is None:  # by seq or at the end: the latest snapshot at or before it
        before = [h for h in history if h[1] <= end]
        return (before[-1][1], before[-1][2]) if before else None
    same = [h for h in history if h[0] == step and (limit is None or h[1] < limit)]
    at_or_before = [h for h in same if h[1] <= end]
    if at_or_before:
        return at_or_before[-1][1], at_or_before[-1][2]
    return (same[0][1], same[0][2]) if same else None


def _mentions(event: dict[str, Any], wanted: set[int]) -> bool:
    """An event is about a module if it is the event's module, the child it
    registers, or (``activity``) one of the module calls it holds."""
    if event["module_id"] in wanted:
        return True
    kind, payload = event["kind"], event["payload"]
    if kind == "activity":
        return any(
            call.get("module_id") in wanted
            for direction in ("forward", "backward")
            for call in payload.get(direction) or []
        )
    return kind == "module_registered" and payload.get("child_id") in wanted
