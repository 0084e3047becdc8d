"""``auditlog run``: record an unmodified script or module."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any

import click
from auditlog.cli.inert import release as release_streams
from auditlog.cli.options import store_option

from auditlog.core.errors import CommandInterrupted, RecordingFailedError
from auditlog.core.policy import BACKWARD_MECHANISMS, DURABILITY, ON_ERROR


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@store_option
@click.option("-m", "as_module", is_flag=True, help="Run a module (like python -m).")
@click.option("--name", default=None, help="A label for the run.")
@click.option(
    "--policy",
    default=None,
    metavar="audit|debug|minimal|PATH",
    help="Capture policy preset or TOML file [default: ./auditlog.toml, pyproject "
    "[tool.auditlog], else audit].",
)
@click.option(
    "--backward",
    type=click.Choice(BACKWARD_MECHANISMS),
    default=None,
    help="Backward capture: grad hooks on module outputs (safe with in-place ops; "
    "default), full/legacy module backward hooks, or none.",
)
@click.option(
    "--activity-every",
    type=click.IntRange(min=1),
    default=None,
    help="Record forward/backward activity every N optimizer steps.",
)
@click.option(
    "--norms-every",
    type=click.IntRange(min=1),
    default=None,
    help="Exact update and parameter norms every N optimizer steps (gradient norms are "
    "recorded every step).",
)
@click.option(
    "--snapshot-every",
    type=click.IntRange(min=0),
    default=None,
    help="Store every parameter and buffer every N optimizer steps (0: only initial and final).",
)
@click.option(
    "--durability",
    type=click.Choice(DURABILITY),
    default=None,
    help="fast: batched commits (a crash loses the last ~0.1 s); step: every optimizer step "
    "is committed before training continues; strict: step + fsync per commit [default: fast].",
)
@click.option(
    "--on-error",
    type=click.Choice(ON_ERROR),
    default=None,
    help="If the store fails: continue training unrecorded, or fail (stop with exit 5) "
    "[default: continue].",
)
@click.option(
    "--shard/--no-shard",
    default=None,
    help="Write this process's stream into a shard store of its own under STORE/shards/, "
    "to merge later with `auditlog combine` [default: AUDITLOG_SHARD, else only when a torchrun "
    "job spans several nodes and the store is a directory].",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    envvar="AUDITLOG_QUIET",
    help="No auditlog notices on stderr (the recording line, the unsigned-run note) [env AUDITLOG_QUIET].",
)
@click.argument("target", metavar="SCRIPT|MODULE")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    store: str | None,
    as_module: bool,
    name: str | None,
    policy: str | None,
    backward: str | None,
    activity_every: int | None,
    norms_every: int | None,
    snapshot_every: int | None,
    durability: str | None,
    on_error: str | None,
    shard: bool | None,
    quiet: bool,
    target: str,
    args: tuple[str, ...],
) -> None:
    """Record SCRIPT (or, with -m, MODULE) run with ARGS, exactly as python would run it.

    The script's exit code is auditlog's exit code; its traceback is printed as
    Python would print it. Ctrl-C before the script starts: exit 130, one line.
    """
    held = _HeldInterrupts()
    try:
        from auditlog.core.policy import make_policy
        from auditlog.recording.execfile import exit_status, run_target, script_path, user_traceback
        from auditlog.recording.session import Recording, Terminated

        chosen = make_policy(
            policy,
            backward=backward,
            activity_every=activity_every,
            norms_every=norms_every,
            snapshot_every=snapshot_every,
            durability=durability,
            on_error=on_error,
        )  # a bad policy is refused before anything else happens
        code_path = script_path(target, as_module)
        held.check()  # Ctrl-C so far: no run is recorded
        recording = Recording(
            store,
            name,
            policy=chosen,
            code_path=code_path,
            argv=[target, *args],
            joinable=True,
            shard=shard,
        )
        recording.start()
    except BaseException:
        held.release(reraise=False)
        raise
    if held.pending:
        recording.stop(KeyboardInterrupt())
        held.release(reraise=False)
        shown_id = (
            f" (run {recording.run_id[:12]} recorded as interrupted)" if recording.run_id else ""
        )
        raise CommandInterrupted(f"interrupted before {target} started{shown_id}")
    if recording.disabled is None:
        shown = recording.store.location.display() if recording.store else store
        launch = recording.launch
        rank = (
            f" rank {launch.rank}/{launch.world_size}, stream {recording.stream},"
            if launch and launch.distributed
            else ""
        )
        if not quiet:
            click.echo(f"auditlog: recording run {recording.run_id}{rank} into {shown}", err=True)
            if recording.signing_key is None:
                click.echo(UNSIGNED_NOTE, err=True)
    exit_code = 0
    release_streams()  # the script's output is its own: not escaped (cli.inert)
    try:
        held.release()  # from here Ctrl-C interrupts the script, as under python
        script_globals = run_target(target, list(args), as_module)  # kept alive until the run ends
    except RecordingFailedError as exc:
        recording.stop(exc)
        raise
    except Terminated as exc:
        recording.stop(exc)
        _die_by_sigterm()
        exit_code = 143
    except SystemExit as exc:
        recording.stop(exc)
        exit_code = exit_status(exc)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # what the interpreter prints for sys.exit("message")
    except KeyboardInterrupt as exc:
        recording.stop(user_traceback(exc))
        traceback.print_exception(exc)
        exit_code = 130
    except BaseException as exc:
        recording.stop(user_traceback(exc))
        traceback.print_exception(exc)
        exit_code = 1
    else:
        recording.stop(None)
        del script_globals
    ctx.exit(exit_code)


# Said once per `auditlog run` without a key (issue 29): an unsigned chain proves less than it seems.
UNSIGNED_NOTE = (
    "auditlog: this run is unsigned: its chain detects accidental damage and naive edits, not a rewrite by "
    "someone with write access; `auditlog keygen` makes a key and later runs are signed (--quiet hides this)"
)


class _HeldInterrupts:
    """Ctrl-C held back while the recording starts (imports, store, hooks).

    An interrupt there would otherwise surface as a traceback from inside torch
    or SQLAlchemy, or leave a half-registered run. Held, it is acted on at a
    point where the outcome is clear: before the run exists (no run), or right
    after (the run ends as interrupted).
    """

    def __init__(self) -> None:
        self.pending = False
        self._held = False
        self._previous: Any = None
        try:
            previous = signal.getsignal(signal.SIGINT)
            if (
                previous is signal.SIG_IGN
            ):  # started with Ctrl-C ignored (nohup, background job): keep it so
                return
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._held = True
        except ValueError:  # not the main thread (tests driving the CLI in a thread)
            pass

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True

    def check(self) -> None:
        if self.pending:
            raise KeyboardInterrupt

    def release(self, reraise: bool = True) -> None:
        """Give Ctrl-C back; one that came in between is raised now (``reraise``)."""
        if self._held:
            signal.signal(
                signal.SIGINT,
                self._previous if self._previous is not None else signal.default_int_handler,
            )
            self._held = False
        if reraise:
            self.check()


def _die_by_sigterm() -> None:
    """After recording the interruption, die of SIGTERM as the unrecorded program would."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
