"""Who launched this process: the rank facts and the one run id all ranks of a job share.

Under ``torchrun`` every worker gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``GROUP_RANK`` (the node), ``TORCHELASTIC_RUN_ID`` (the rendezvous id),
``TORCHELASTIC_RESTART_COUNT`` and ``MASTER_ADDR``/``MASTER_PORT`` (the agent's
TCP store). The run id of the job is derived from them, so every rank computes
the same id without waiting for anyone:

    run id = sha256("auditlog-torchrun-v1" NUL rdzv id NUL master addr NUL master port NUL nonce)[:32]

``nonce`` makes two launches with the same ``--rdzv-id`` and a fixed master
port (the static rendezvous, or a reused job id) two runs: the first worker to
ask stores a random nonce under ``auditlog/launch`` in the agent's TCP store
(``compare_set``: set only when absent), and every worker of the launch reads
that value. The agent keeps its store across elastic restarts, so the restarted
workers get the same run id and append new streams (segment = restart count).
When the agent store is not used (``TORCHELASTIC_USE_AGENT_STORE`` is not
``True``) or cannot be reached within ``AGENT_TIMEOUT_S``, the id comes from
the environment alone; a fixed ``--rdzv-id`` with a fixed master port then gives
every launch the same id, and the recording falls back to a new segment (never
to an existing stream, see ``free_segment``).

``AUDITLOG_RUN_ID`` (or ``record(run_id=...)``) overrides all of this, e.g. for
launchers other than torchrun (``srun``, ``mpirun``): set it to one value per
job for every rank. Outside a launcher, a run id is random.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RUN_ID_FORMAT = "auditlog-torchrun-v1"
NONCE_KEY = "auditlog/launch"
AGENT_TIMEOUT_S = 10.0


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Launch:
    """The distributed facts of this process, as its launcher set them."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    restart: int = 0
    max_restarts: int = 0
    launcher: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    agent_store: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.launcher is not None

    def as_payload(self) -> dict[str, Any]:
        """The facts ``run_started`` records (beside ``rank`` and ``world_size``)."""
        return {
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "restart": self.restart,
            "max_restarts": self.max_restarts,
            "launcher": self.launcher,
            "rdzv_id": self.rdzv_id,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
        }


def detect_launch(env: Mapping[str, str] | None = None) -> Launch:
    """The launch facts from the environment (all defaults outside a launcher)."""
    env = os.environ if env is None else env
    torchrun = "TORCHELASTIC_RUN_ID" in env
    port = env.get("MASTER_PORT")
    return Launch(
        rank=max(0, _int(env, "RANK", 0)),
        local_rank=max(0, _int(env, "LOCAL_RANK", 0)),
        world_size=max(1, _int(env, "WORLD_SIZE", 1)),
        local_world_size=max(1, _int(env, "LOCAL_WORLD_SIZE", 1)),
        node_rank=max(0, _int(env, "GROUP_RANK", 0)),
        restart=max(0, _int(env, "TORCHELASTIC_RESTART_COUNT", 0)),
        max_restarts=max(0, _int(env, "TORCHELASTIC_MAX_RESTARTS", 0)),
        launcher="torchrun"
        if torchrun
        else ("env" if "RANK" in env and "WORLD_SIZE" in env else None),
        rdzv_id=env.get("TORCHELASTIC_RUN_ID"),
        master_addr=env.get("MASTER_ADDR"),
        master_port=int(port) if port and port.isdigit() else None,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def derive_run_id(launch: Launch, nonce: str) -> str:
    """The run id every worker of one torchrun launch computes (module docstring)."""
    parts = [
        RUN_ID_FORMAT,
        launch.rdzv_id or "",
        launch.master_addr or "",
        str(launch.master_port or ""),
        nonce,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def agent_nonce(launch: Launch, timeout: float = AGENT_TIMEOUT_S) -> str | None:
    """The launch nonce from the torchrun agent's TCP store; None when it cannot be had.

    A client connection to the store the agent already serves for the workers
    (``init_process_group`` connects the same way); one key under ``auditlog/``,
    written once per launch. Never raises: the caller falls back.
    """
    if not launch.agent_store or not launch.master_addr or launch.master_port is None:
        return None
    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]

        store = TCPStore(
            launch.master_addr,
            launch.master_port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
        value = store.compare_set(NONCE_KEY, "", uuid.uuid4().hex)
    except Exception:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text or None


@dataclass(frozen=True)
class RunIdentity:
    """The run id this process records into, and how it was chosen (``run_started.run_id_source``)."""

    run_id: str
    source: str


def choose_run_id(
    requested: str | None,
    launch: Launch,
    env: Mapping[str, str] | None = None,
    nonce: Callable[[Launch], str | None] = agent_nonce,
) -> RunIdentity:
    """``requested``, else ``AUDITLOG_RUN_ID``, else the torchrun-derived id, else random."""
    env = os.environ if env is None else env
    if requested:
        return RunIdentity(requested, "argument")
    if env.get("AUDITLOG_RUN_ID"):
        return RunIdentity(env["AUDITLOG_RUN_ID"], "AUDITLOG_RUN_ID")
    if launch.launcher == "torchrun":
        agreed = nonce(launch)
        if agreed is not None:
            return RunIdentity(derive_run_id(launch, agreed), "torchrun agent store")
        return RunIdentity(derive_run_id(launch, ""), "torchrun environment")
    return RunIdentity(uuid.uuid4().hex, "random")
