"""``auditlog.record()``: one recording session, as a context manager or decorator.

A recording opens (or creates) the store, registers the run, starts the writer,
installs the global hooks, and on exit removes exactly those hooks, seals what
was never sealed, writes ``run_ended`` with the outcome and flushes. Only one
recording may be active in a process: global hooks are process-wide, so a
second one would double every event; it is refused with ``RecordingActiveError``.
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
import uuid
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.metrics import metric_value
from auditlog.capture.recorder import Recorder
from auditlog.core.errors import (
    AuditlogError,
    RecordingActiveError,
    RecordingFailedError,
    StoreUnavailableError,
    one_line,
)
from auditlog.core.liveness import process_start_ticks
from auditlog.core.policy import Policy, make_policy
from auditlog.integrity.heads import checkpoint_head
from auditlog.integrity.keys import configured_private_key
from auditlog.recording.crashes import close_crashed_runs
from auditlog.recording.metadata import (
    RunStartedPayload,
    rank_and_world,
    seeds,
    static_metadata,
)
from auditlog.recording.writer import Writer
from auditlog.store.eventstore import EventStore
from auditlog.store.location import StoreLocation

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
    """Stands in for the recorder when recording was disabled by a store failure."""

    step = 0

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


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
        **overrides: Any,
    ) -> None:
        self.store_spec = store if isinstance(store, StoreLocation) or store is None else os.fspath(store)
        self.name = name
        self.policy = make_policy(policy, **overrides)
        self.code_path = Path(code_path) if code_path is not None else None
        self.requested_run_id = run_id
        self.handle_sigterm = handle_sigterm
        self.argv = argv
        self.run_id: str | None = None
        self.stream = 0
        self.store: EventStore | None = None
        self.disabled: str | None = None
        self.recorder: Recorder | None = None
        self.writer: Writer | None = None
        self._previous_sigterm: Any = None
        self._ended = False

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
            if _active is not None:
                raise RecordingActiveError(
                    f"a recording is already active in this process (run {_active.run_id}); "
                    "nested or concurrent record() calls are refused because global hooks "
                    "would record every event twice"
                )
            rank, _world = rank_and_world()
            run_id = self.requested_run_id or os.environ.get("AUDITLOG_RUN_ID") or uuid.uuid4().hex
            static = static_metadata(self.name, self.code_path, self._policy(), self.argv)
            try:
                store = EventStore.open(
                    self.store_spec, create=True, synchronous=SYNCHRONOUS[self.policy.durability]
                )
                close_crashed_runs(store, detected_by=run_id)
                store.create_run(
                    run_id, self.name, static["host"], static["pid"], process_start_ticks(os.getpid())
                )
            except StoreUnavailableError as exc:
                if self.policy.on_error == "fail":
                    raise
                # The store is unusable (read-only, disk full, ...): the program runs
                # unrecorded rather than failing because of its recorder.
                self.disabled = str(exc)
                _warn_once(f"auditlog: cannot record: {exc}; running without recording (on_error=continue)")
                return self
            key = configured_private_key()  # $AUDITLOG_KEY or the keygen default; None: no signing
            sign = None
            if key is not None:
                sign = functools.partial(_sign_head, store, key, run_id, rank)
            buffer = RecordBuffer()
            writer = Writer(store, run_id, rank, buffer, on_error=self.policy.on_error, sign=sign)
            recorder = Recorder(buffer, self.policy)
            if self.policy.durability != "fast":
                recorder.step_barrier = writer.flush  # the step's events are committed before training goes on
            recorder.failure = lambda: writer.failure
            code_path = self.code_path or Path(os.getcwd())
            recorder.emit(
                "run_started",
                payload=RunStartedPayload(static, code_path.absolute(), store.location.directory),
            )
            writer.start()
            recorder.install()
            self.store, self.writer, self.recorder = store, writer, recorder
            self.run_id, self.stream, self._ended = run_id, rank, False
            _active = self
        atexit.register(self._at_exit)
        self._install_sigterm()
        return self

    def stop(self, exc: BaseException | None = None) -> None:
        """End recording with the outcome implied by ``exc`` (None: completed)."""
        global _active
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
                recorder.fault("run_end_seal", fault)
            ending = _outcome(exc)
            ending.update(steps=recorder.step, seeds=seeds(), dropped=writer.dropped)
            recorder.emit("run_ended", payload=ending)
            writer.close()
            writer.sign_final()
            if writer.dropped:
                ending["dropped"] = writer.dropped
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
            raise RecordingFailedError(f"recording failed ({one_line(writer.failure)}); on_error=fail")

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
            raise AuditlogError(f"annotation {key!r}: fields must be JSON-encodable ({exc})") from exc
        recorder.emit("annotation", payload={"key": key, "fields": fields})

    def log(self, step: int | None = None, **metrics: Any) -> None:
        """Record scalar metrics (an evaluation accuracy, a loss computed by a function).

        ``run.log(acc=0.91, val_loss=val)``: numbers or one-element tensors (a
        CUDA tensor is copied without a sync). They enter the hash chain as a
        ``metrics`` event, appear in the ``metrics`` view and ``auditlog
        metrics``. ``step``: your own step number for them (default: the run's
        optimizer step count now).
        """
        recorder = self._require()
        recorder.log_metrics(_checked_metrics(metrics, step), step)

    def seal(self, model: torch.nn.Module) -> None:
        """Declare ``model`` fully constructed now: record its initial values."""
        self._require().seal(model, "explicit")

    def snapshot(self, model: torch.nn.Module, tag: str | None = None) -> None:
        """Snapshot every parameter and buffer of ``model`` now (values as of this call)."""
        recorder = self._require()
        recorder.check([model], "snapshot")
        recorder.snapshot([model], "explicit", tag=tag)

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Wait until everything recorded so far is in the store."""
        self._require()
        if self.writer is None:
            return False
        return self.writer.flush(timeout)

    @property
    def step(self) -> int:
        """Optimizer steps completed so far in this run."""
        return self._require().step

    def _require(self) -> Recorder:
        if self.disabled is not None:
            return _NullRecorder()  # type: ignore[return-value]
        if self.recorder is None or self._ended:
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
        active._require().log_metrics(checked, step)


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


def _sign_head(store: EventStore, key: Any, run_id: str, stream: int, seq: int, head: str) -> None:
    checkpoint_head(store, key, run_id, stream, head=(seq, head))


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
        return {"status": "interrupted", "exit_code": exc.code, "exception": None, "signal": "SIGTERM"}
    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "exit_code": 130, "exception": None, "signal": "SIGINT"}
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code == 0:
            return {"status": "completed", "exit_code": 0, "exception": None, "signal": None}
        return {
            "status": "failed",
            "exit_code": code if isinstance(code, int) else 1,
            "exception": {"type": "SystemExit", "message": str(code), "traceback": None},
            "signal": None,
        }
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "status": "failed",
        "exit_code": 1,
        "exception": {"type": type(exc).__name__, "message": str(exc), "traceback": text[-20000:]},
        "signal": None,
    }


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
    Also ``run_id=`` and ``code_path=``.
    """
    return Recording(store, name, policy=policy, **options)
