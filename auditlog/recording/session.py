"""``auditlog.record()``: one recording session, as a context manager or decorator.

A recording opens (or creates) the store, registers the run, starts the writer,
installs the global hooks, and on exit removes exactly those hooks, seals what
was never sealed, writes ``run_ended`` with the outcome and flushes. Only one
recording may be active in a process: global hooks are process-wide, so a
second one would double every event; it is refused with ``RecordingActiveError``.
The one exception is a script run by ``auditlog run`` that calls ``record()``
itself (it works under ``python``, so it must work there too): the outer
recording is ``joinable`` and the inner one joins it (see ``Recording._join``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.metrics import metric_value
from auditlog.capture.recorder import Recorder
from auditlog.capture.torch_compat import dynamo_frames_compiled
from auditlog.core.errors import (
    AuditlogError,
    RecordingActiveError,
    RecordingFailedError,
    StoreUnavailableError,
    one_line,
)
from auditlog.core.liveness import process_start_ticks
from auditlog.core.policy import Policy, make_policy
from auditlog.core.ranks import split_stream
from auditlog.integrity.checkpoints import checkpoint_head, checkpoint_run
from auditlog.integrity.findings import StreamTip
from auditlog.integrity.keys import configured_private_key, fingerprint
from auditlog.recording.crashes import close_crashed_runs
from auditlog.recording.energy import energy_counters
from auditlog.recording.execfile import exit_status
from auditlog.recording.launch import Launch, choose_run_id, detect_launch
from auditlog.recording.metadata import RunStartedPayload, seeds, static_metadata
from auditlog.recording.shards import free_stream, shard_location, sharding
from auditlog.recording.writer import Writer
from auditlog.store.eventstore import EventStore
from auditlog.store.location import StoreLocation, resolve_store

_active: Recording | None = None
_active_lock = threading.Lock()


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM so that the run ends as ``interrupted``."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def current() -> Recording | None:
    """The active recording in this process, if any."""
    return _active


class _NullRecorder:
    """Stands in for the recorder when recording was disabled by a store failure: every
    part of it is this stand-in again, every call does nothing, and the step is 0."""

    step = 0

    def __getattr__(self, name: str) -> Any:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class Recording(contextlib.ContextDecorator):
    """A recording session; see ``auditlog.record``."""

    def __init__(
        self,
        store: str | os.PathLike[str] | StoreLocation | None = None,
        name: str | None = None,
        *,
        policy: str | os.PathLike[str] | Policy | None = None,
        code_path: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        handle_sigterm: bool = True,
        argv: list[str] | None = None,
        shard: bool | None = None,
        joinable: bool = False,
        **overrides: Any,
    ) -> None:
        self.store_spec = (
            store if isinstance(store, StoreLocation) or store is None else os.fspath(store)
        )
        self.name = name
        self.policy = make_policy(policy, **overrides)
        self.code_path = Path(code_path) if code_path is not None else None
        self.requested_run_id = run_id
        self.handle_sigterm = handle_sigterm
        self.argv = argv
        self.shard = shard
        self.joinable = joinable
        self.options_given = store is not None or policy is not None or bool(overrides)
        self.joined: Recording | None = None
        self._join_noticed = False
        self.run_id: str | None = None
        self.stream = 0
        self.launch: Launch | None = None
        self.store: EventStore | None = None
        self.disabled: str | None = None
        self.signing_key: str | None = (
            None  # the key's fingerprint when the run is signed as recorded
        )
        self.recorder: Recorder | None = None
        self.writer: Writer | None = None
        self._previous_sigterm: Any = None
        self._ended = False
        self._compiled_before = 0  # frames torch.compile had compiled when recording began

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Recording:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(exc)

    def start(self) -> Recording:
        """Begin recording (what ``with`` does on entry)."""
        global _active
        with _active_lock:
            if _active is not None and _active.joinable and _active.joined is None:
                return self._join(_active)
            if _active is not None:
                raise RecordingActiveError(
                    f"a recording is already active in this process (run {_active.run_id}); "
                    "nested or concurrent record() calls are refused because global hooks "
                    "would record every event twice"
                )
            launch = detect_launch()
            identity = choose_run_id(self.requested_run_id, launch)
            run_id = identity.run_id
            static = static_metadata(self.name, self.code_path, self._policy(), self.argv, launch)
            try:
                location = (
                    resolve_store(self.store_spec)
                    if not isinstance(self.store_spec, StoreLocation)
                    else self.store_spec
                )
                if sharding(self.shard, location, launch):
                    location = shard_location(
                        location, run_id, launch.rank, static["host"], static["pid"]
                    )
                store = EventStore.open(
                    location, create=True, synchronous=SYNCHRONOUS[self.policy.durability]
                )
                closed = close_crashed_runs(store, detected_by=run_id)
                store.create_run(
                    run_id,
                    self.name,
                    static["host"],
                    static["pid"],
                    process_start_ticks(os.getpid()),
                )
                stream = free_stream(store, run_id, launch.rank, launch.restart)
            except StoreUnavailableError as exc:
                if self.policy.on_error == "fail":
                    raise
                # The store is unusable (read-only, disk full, ...): the program runs
                # unrecorded rather than failing because of its recorder.
                self.disabled = str(exc)
                _warn_once(
                    f"auditlog: cannot record: {exc}; running without recording (on_error=continue)"
                )
                return self
            static.update(segment=split_stream(stream)[0], run_id_source=identity.source)
            key = configured_private_key()  # $AUDITLOG_KEY or the keygen default; None: no signing
            sign = None
            if key is not None:
                # Chained in run_started: a stream recorded for signing that later has no
                # signature lost it, and signing commands refuse to launder it (issue 29).
                static["signing_key"] = self.signing_key = fingerprint(key)
                sign = functools.partial(_sign_head, store, key, run_id, stream, launch.world_size)
                _sign_closed(store, key, closed)
            buffer = RecordBuffer()
            writer = Writer(
                store,
                run_id,
                stream,
                buffer,
                on_error=self.policy.on_error,
                sign=sign,
                durable=self.policy.durability == "strict",  # snapshot files fsynced too
            )
            recorder = Recorder(buffer, self.policy)
            if self.policy.durability != "fast":
                # the step's events are committed before training goes on
                recorder.ctx.step_barrier = writer.flush
            recorder.ctx.failure = lambda: writer.failure
            code_path = self.code_path or Path(os.getcwd())
            recorder.ctx.emit(
                "run_started",
                payload=RunStartedPayload(static, code_path.absolute(), store.location.directory),
            )
            writer.start()
            recorder.install()
            self.store, self.writer, self.recorder = store, writer, recorder
            self._compiled_before = dynamo_frames_compiled()
            self.run_id, self.stream, self._ended = run_id, stream, False
            self.launch = launch
            _active = self
        atexit.register(self._at_exit)
        self._install_sigterm()
        return self

    def _join(self, outer: Recording) -> Recording:
        """Join ``outer`` (the recording of ``auditlog run``) instead of starting a second one.

        The run stays one run: this object's ``annotate``/``seal``/``snapshot``/
        ``flush`` go to it, and leaving the block ends nothing. A name given here
        names the run when ``auditlog run`` gave none (the runs index row, and an
        ``auditlog.record`` annotation puts it in the hash chain); store and policy
        options are ignored, since the hooks are already installed. One notice
        per process says so.
        """
        self.joined = outer
        self.disabled = outer.disabled
        self.run_id, self.stream, self.store = outer.run_id, outer.stream, outer.store
        self.recorder, self.writer, self._ended = outer.recorder, outer.writer, False
        notes = []
        if (
            self.name is not None
            and outer.name is None
            and outer.recorder is not None
            and outer.store is not None
        ):
            outer.name = self.name
            with contextlib.suppress(AuditlogError):  # a store failure is the writer's to report
                outer.store.rename_run(outer.run_id or "", self.name)
            outer.recorder.ctx.emit(
                "annotation", payload={"key": "auditlog.record", "fields": {"name": self.name}}
            )
            notes.append(f"named {self.name!r}")
        elif self.name is not None and self.name != outer.name:
            notes.append(f"name {self.name!r} ignored (the run is named {outer.name!r})")
        if self.options_given:
            notes.append("store and policy options of record() ignored")
        if not outer._join_noticed:
            outer._join_noticed = True
            shown = (outer.run_id or "")[:12]
            _warn_once(
                f"auditlog: record() joins the recording of `auditlog run` (run {shown})"
                + (f"; {'; '.join(notes)}" if notes else "")
            )
        return self

    def stop(self, exc: BaseException | None = None) -> None:
        """End recording with the outcome implied by ``exc`` (None: completed)."""
        global _active
        if self.joined is not None:  # the outer recording ends the run
            self._ended = True
            return
        if self._ended or self.recorder is None or self.writer is None:
            return
        self._ended = True
        recorder, writer = self.recorder, self.writer
        try:
            recorder.remove()
            self._restore_sigterm()
            try:
                recorder.finish()
            except Exception as fault:
                recorder.ctx.fault("run_end_seal", fault)
            ending = _outcome(exc)
            ending.update(
                steps=recorder.ctx.step,
                seeds=seeds(),
                dropped=writer.dropped,
                energy=energy_counters(),
            )
            compiled = dynamo_frames_compiled() - self._compiled_before
            if compiled > 0:  # what ran inside compiled code had no hook: the record says so
                ending["compiled_frames"] = compiled
                if not recorder.ctx.step and "untracked_updates" not in recorder.ctx.warned:
                    _warn_once(
                        f"auditlog: torch.compile compiled {compiled} frame(s) during this "
                        "recording and no optimizer step was seen: module calls, backward passes "
                        "and optimizer steps inside compiled code are not recorded "
                        "(run_ended.compiled_frames; docs/hooks.md)"
                    )
            recorder.ctx.emit("run_ended", payload=ending)
            writer.close()
            writer.sign_final()
        finally:
            with contextlib.suppress(Exception):
                atexit.unregister(self._at_exit)
            if self.store is not None:
                self.store.close()
            with _active_lock:
                if _active is self:
                    _active = None
        if self.policy.on_error == "fail" and writer.failure is not None and exc is None:
            # The store failed after the last step (say, while flushing at the end):
            # a compliance run must still not end as if it had been recorded.
            raise RecordingFailedError(
                f"recording failed ({one_line(writer.failure)}); on_error=fail"
            )

    def _at_exit(self) -> None:
        """Interpreter exit with the recording still open: close it with what we know."""
        last = getattr(sys, "last_value", None)
        self.stop(last if isinstance(last, BaseException) else None)

    # ------------------------------------------------------------------ signals
    def _install_sigterm(self) -> None:
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
        except (ValueError, OSError):
            self._previous_sigterm = None

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # ------------------------------------------------------------------ user API
    def annotate(self, key: str, **fields: Any) -> None:
        """Add a user fact (dataset hash, config, decision) to the same hash chain."""
        recorder = self._require()
        if not isinstance(key, str) or not key:
            raise AuditlogError("annotation key must be a non-empty string")
        try:
            json.dumps(fields)
        except (TypeError, ValueError) as exc:
            raise AuditlogError(
                f"annotation {key!r}: fields must be JSON-encodable ({exc})"
            ) from exc
        recorder.ctx.emit("annotation", payload={"key": key, "fields": fields})

    def log(self, step: int | None = None, **metrics: Any) -> None:
        """Record scalar metrics (an evaluation accuracy, a loss computed by a function).

        ``run.log(acc=0.91, val_loss=val)``: numbers or one-element tensors (a
        CUDA tensor is copied without a sync). They enter the hash chain as a
        ``metrics`` event, appear in the ``metrics`` view and ``auditlog
        metrics``. ``step``: your own step number for them (default: the run's
        optimizer step count now).
        """
        recorder = self._require()
        recorder.metrics.log_metrics(_checked_metrics(metrics, step), step)

    def seal(self, model: torch.nn.Module) -> None:
        """Declare ``model`` fully constructed now: record its initial values."""
        self._require().construction.seal(model, "explicit")

    def snapshot(self, model: torch.nn.Module, tag: str | None = None) -> None:
        """Snapshot every parameter and buffer of ``model`` now (values as of this call)."""
        recorder = self._require()
        recorder.structure.check([model], "snapshot")
        recorder.roots.snapshot([model], "explicit", tag=tag)

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Wait until everything recorded so far is in the store."""
        recorder = self._require()
        if self.writer is None:
            return False
        recorder.ctx.settle()  # registrations the hooks deferred (capture/registrations.py)
        recorder.data.flush()  # batches the data watch holds (capture/data.py)
        return self.writer.flush(timeout)

    @property
    def step(self) -> int:
        """Optimizer steps completed so far in this run."""
        return self._require().ctx.step

    def _require(self) -> Recorder:
        if self.disabled is not None:
            return _NullRecorder()  # type: ignore[return-value]
        if self.recorder is None or self._ended or (self.joined is not None and self.joined._ended):
            raise AuditlogError("this recording is not active")
        return self.recorder

    def _policy(self) -> dict[str, Any]:
        return {**self.policy.as_dict(), "source": self.policy.source}


SYNCHRONOUS = {"fast": "NORMAL", "step": "NORMAL", "strict": "FULL"}


def log(step: int | None = None, **metrics: Any) -> None:
    """``auditlog.log(acc=0.91)``: record metrics into the active recording (see ``Recording.log``).

    Works in a script run by ``auditlog run`` (the recording is ``current()``)
    and inside ``auditlog.record()``. With no recording active it checks its
    arguments and does nothing, so a script may call it unconditionally.
    """
    checked = _checked_metrics(metrics, step)
    active = current()
    if active is not None and not active._ended:
        active._require().metrics.log_metrics(checked, step)


def _checked_metrics(metrics: dict[str, Any], step: int | None) -> dict[str, Any]:
    """The metrics as the recorder takes them; a bad name or value is an ``AuditlogError``."""
    if not metrics:
        raise AuditlogError("log() needs at least one metric, e.g. log(acc=0.9)")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise AuditlogError(f"log(step=...) must be an integer >= 0, not {step!r}")
    checked = {}
    for name, value in metrics.items():
        try:
            checked[name] = metric_value(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise AuditlogError(f"log({name}=...): {exc}") from exc
    return checked


def _sign_head(
    store: EventStore, key: Any, run_id: str, stream: int, world: int, tip: StreamTip
) -> None:
    checkpoint_head(store, key, run_id, stream, tip, world)


def _sign_closed(store: EventStore, key: Any, run_ids: list[str]) -> None:
    """Sign the ends this recording wrote for crashed runs (their process could not)."""
    for run_id in dict.fromkeys(run_ids):
        try:
            checkpoint_run(store, run_id, key)
        except AuditlogError as exc:  # an altered record is not signed; say so, record anyway
            _warn_once(f"auditlog: crashed run {run_id[:12]} not signed: {exc}")


def _warn_once(message: str) -> None:
    try:
        print(message, file=sys.stderr)
    except Exception:
        pass


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def _outcome(exc: BaseException | None) -> dict[str, Any]:
    """Status, exit code and exception details for the ``run_ended`` event."""
    if exc is None:
        return {"status": "completed", "exit_code": 0, "exception": None, "signal": None}
    if isinstance(exc, Terminated):
        return {
            "status": "interrupted",
            "exit_code": exc.code,
            "exception": None,
            "signal": "SIGTERM",
        }
    if isinstance(exc, KeyboardInterrupt):  # the traceback python prints for Ctrl-C, kept too
        return {
            "status": "interrupted",
            "exit_code": 130,
            "exception": _described(exc),
            "signal": "SIGINT",
        }
    if isinstance(exc, SystemExit):
        status = exit_status(exc)
        if status == 0:
            return {"status": "completed", "exit_code": 0, "exception": None, "signal": None}
        return {
            "status": "failed",
            "exit_code": status,
            "exception": {"type": "SystemExit", "message": str(exc.code), "traceback": None},
            "signal": None,
        }
    return {"status": "failed", "exit_code": 1, "exception": _described(exc), "signal": None}


def _described(exc: BaseException) -> dict[str, Any]:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text[-20000:]}


def record(
    store: str | os.PathLike[str] | StoreLocation | None = None,
    name: str | None = None,
    *,
    policy: str | os.PathLike[str] | Policy | None = None,
    **options: Any,
) -> Recording:
    """Record everything PyTorch does inside the block (or decorated function).

    ``store``: a directory or database URL (default ``AUDITLOG_STORE`` or
    ``./.auditlog``). ``name``: a label for the run. ``policy``: a preset
    (``audit``, the default; ``debug``; ``minimal``), a policy file, or a
    ``Policy``; keyword options override single policy keys (``activity_every=1``,
    ``backward="none"``, ``snapshot_every=100``, ...; see ``auditlog.core.policy``).
    Also ``run_id=`` and ``code_path=``; ``shard=True`` writes this process's
    stream into a shard store of its own (``<store>/shards/...``, combined later
    with ``auditlog combine``; default: ``AUDITLOG_SHARD``, else only for a
    directory store under a launcher whose job spans several nodes). Under
    ``torchrun`` all ranks of a job record one run (see ``docs/distributed.md``).
    """
    return Recording(store, name, policy=policy, **options)
