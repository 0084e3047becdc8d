"""Run metadata: who ran what, where, with which code and libraries.

Collected on the writer thread (git runs subprocesses) so that starting a
recording does not delay the user's program.
"""

from __future__ import annotations

import getpass
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import torch

from auditlog.core.hashing import CONTENT_HASH_VERSION
from auditlog.core.liveness import process_start_ticks
from auditlog.core.version import __version__
from auditlog.recording.codestate import code_state, git
from auditlog.recording.energy import energy_counters
from auditlog.recording.launch import Launch, detect_launch


def git_state(path: Path, exclude: Path | None = None) -> dict[str, Any] | None:
    """Commit, branch, dirty flag, a hash of uncommitted changes and the changed files
    of the repository holding ``path`` (``auditlog.recording.codestate``: bounded in
    time and memory, large files identified by size and mtime)."""
    start = path if path.is_dir() else path.parent
    top = git(start, "rev-parse", "--show-toplevel")
    if top is None:
        return None
    root = Path(top.decode().strip())
    commit = git(root, "rev-parse", "HEAD")
    branch = git(root, "rev-parse", "--abbrev-ref", "HEAD")
    # The store often lives inside the repository (./.auditlog): its own files
    # must not make the code look dirty.
    spec = ["--", "."]
    if exclude is not None:
        try:
            spec.append(f":(exclude){exclude.resolve().relative_to(root.resolve())}")
        except ValueError:
            pass
    return {
        "root": str(root),
        "commit": commit.decode().strip() if commit else None,
        "branch": branch.decode().strip() if branch else None,
        **code_state(root, spec),
    }


def seeds() -> dict[str, Any]:
    """RNG seeds that can be read without consuming randomness or initializing CUDA."""
    out: dict[str, Any] = {"torch_initial_seed": torch.initial_seed()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        out["cuda_initial_seed"] = torch.cuda.initial_seed()
    return out


def static_metadata(
    name: str | None,
    code_path: Path | None,
    policy: dict[str, Any],
    argv: list[str] | None = None,
    launch: Launch | None = None,
) -> dict[str, Any]:
    """Everything cheap and known at start; the writer adds ``git`` (RunStartedPayload).

    ``argv`` is the recorded program's command line (``auditlog run`` passes the
    script and its arguments); ``launcher_argv`` is how the process was started.
    ``launch``: the rank facts (``auditlog.recording.launch``); the session adds
    ``segment`` and ``run_id_source`` once the stream is chosen.
    """
    launch = launch if launch is not None else detect_launch()
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = None
    return {
        "name": name,
        "argv": list(argv) if argv is not None else list(sys.argv),
        "launcher_argv": list(sys.argv) if argv is not None else None,
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "user": user,
        "pid": os.getpid(),
        # Start time of the process (clock ticks since boot): tells this process
        # from a later one with the same pid when deciding whether a stream crashed.
        "proc_start": process_start_ticks(os.getpid()),
        "rank": launch.rank,
        "world_size": launch.world_size,
        **launch.as_payload(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "seeds": seeds(),
        "policy": policy,
        "auditlog": __version__,
        # How this run's tensor content hashes are made (auditlog.core.hashing).
        "content_hash": CONTENT_HASH_VERSION,
        "code_path": str(code_path) if code_path else None,
        # Host energy counters (RAPL) at start; run_ended has them at the end (recording.energy).
        "energy": energy_counters(),
    }


class RunStartedPayload:
    """Lazy payload of ``run_started``: the writer thread adds the git state."""

    def __init__(self, static: dict[str, Any], code_path: Path, store_dir: Path | None) -> None:
        self.static = static
        self.code_path = code_path
        self.store_dir = store_dir

    def resolve(self) -> dict[str, Any]:
        return {**self.static, "git": git_state(self.code_path, exclude=self.store_dir)}
