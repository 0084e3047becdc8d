"""Shared pieces of the benchmarks: auditlog presets, the reference models, RSS.

``PRESETS`` below is the one place that says what ``minimal``, ``audit`` and
``debug`` mean to the benchmarks. Until ``auditlog.record`` takes ``policy=``,
the presets are approximated with today's options; ``record_options`` tries
``policy=`` first (by constructing a ``Recording``, which starts nothing), so
the benchmarks switch to the real presets by themselves once they exist. To
force today's approximation for a preset, give it a ``"force": True`` entry.

Not a benchmark itself; imported by ``overhead.py``, ``ingest.py`` and
``memory.py`` (run those as ``python benchmarks/NAME.py``).
"""

from __future__ import annotations

import functools
import importlib
import os
import resource
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import auditlog
from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.recorder import Recorder

# ---------------------------------------------------------------------- presets
# Approximations of issue #5's presets with the options record() has today.
# When record() accepts policy="minimal" etc., record_options() uses that instead.
PRESETS: dict[str, dict[str, Any]] = {
    # construction, sealing, run end, every optimizer step; no update norms, no activity
    "minimal": {"activity_every": 10**9, "update_norms": False},
    # the default: every optimizer step with grad norms, update norms every 10th, activity every 100th
    "audit": {"activity_every": 100, "norms_every": 10},
    # full capture: forward and backward statistics of every module on every step
    "debug": {"activity_every": 1, "backward": "grad", "norms_every": 1},
}


@functools.cache
def policy_supported() -> bool:
    """Whether ``auditlog.record`` takes ``policy=`` (tried once, nothing is started)."""
    try:
        auditlog.record(tempfile.gettempdir(), policy="audit")
    except TypeError:
        return False
    return True


def record_options(preset: str) -> dict[str, Any]:
    """Keyword arguments for ``auditlog.record`` that select ``preset``."""
    approximation = {k: v for k, v in PRESETS[preset].items() if k != "force"}
    if policy_supported() and not PRESETS[preset].get("force"):
        return {"policy": preset}
    return approximation


def capture_settings(preset: str) -> Any:
    """The settings object a ``Recorder`` takes for ``preset`` (built by ``Recording``, which starts nothing)."""
    recording = auditlog.record(tempfile.gettempdir(), **record_options(preset))
    settings = getattr(recording, "policy", None)
    return settings if settings is not None else getattr(recording, "options")  # noqa: B009


def undrained_recorder(preset: str) -> tuple[Recorder, RecordBuffer]:
    """A ``Recorder`` with ``preset``'s settings on a buffer nothing drains, so the
    records it emits stay there to be counted, measured or replayed."""
    buffer = RecordBuffer(maxsize=10**9)
    return Recorder(buffer, capture_settings(preset)), buffer


def preset_note() -> str:
    """One line saying whether the real presets or the approximations were used."""
    if policy_supported():
        return "auditlog presets: record(policy=NAME)"
    parts = ", ".join(
        f"{name} = {', '.join(f'{k}={v!r}' for k, v in opts.items())}"
        for name, opts in PRESETS.items()
    )
    return f"auditlog presets approximated with today's options ({parts})"


# ---------------------------------------------------------------------- models
def mlp() -> nn.Module:
    """Issue #5's 98-module MLP: 24 x Sequential(Linear(256), LayerNorm, GELU) + head."""
    blocks = [nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU()) for _ in range(24)]
    return nn.Sequential(*blocks, nn.Linear(256, 10))


def deep_mlp() -> nn.Module:
    """The 98-module MLP's structure, narrow: 24 x Sequential(Linear(16), LayerNorm, GELU) +
    head. The same module calls, hooks and events per step as ``mlp``, with little
    arithmetic: the recorder's per-module Python is what dominates a step, and an
    instruction count of it (``instructions.py``) takes minutes, not hours."""
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU()) for _ in range(24)]
    return nn.Sequential(*blocks, nn.Linear(16, 10))


def fast_mlp() -> nn.Module:
    """Issue 34's fast-step workload: the 4-layer MLP 16-64-64-1 (6 parameter tensors) whose
    AdamW step on a batch of 8 takes 1-2 ms here, where a fixed per-step cost shows most."""
    return nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )


def wide_mlp() -> nn.Module:
    """The 5,000-module model of ``scale.py``: 2,500 x (Linear(8, 8), Tanh) in one Sequential,
    5,000 parameter tensors: the recorder's per-parameter work with almost no arithmetic."""
    layers: list[nn.Module] = []
    for _ in range(2500):
        layers += [nn.Linear(8, 8), nn.Tanh()]
    return nn.Sequential(*layers)


def _wide_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(16, 8), torch.randn(16, 8)


def _fast_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 16), torch.randn(8, 1)


class TinyTransformer(nn.Module):
    """A small token model: embedding, 4 x TransformerEncoderLayer(d=128), LM head."""

    def __init__(
        self,
        vocab: int = 256,
        seq: int = 32,
        d_model: int = 128,
        layers: int = 4,
        heads: int = 4,
        ff: int = 512,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.encoder(self.embed(tokens) + self.position)
        logits: torch.Tensor = self.head(self.norm(hidden))
        return logits


@dataclass(frozen=True)
class Workload:
    """A model, a fixed batch, a loss and an optimizer: one training step's worth."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    # Steps timed per round by default (``overhead.py``): a window long enough for the
    # writer's batches (one every 0.1 s) to run inside it, so their cost is counted.
    timed_steps: int = 100


def _mlp_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(64, 256), torch.randint(0, 10, (64,))


def _deep_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 16), torch.randint(0, 10, (8,))


def _token_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 256, (8, 32)), torch.randint(0, 256, (8, 32))


def _token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)


def _adamw(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload(
        "mlp",
        "98-module MLP (24 x Linear(256)+LayerNorm+GELU, batch 64, SGD)",
        mlp,
        _mlp_batch,
        nn.functional.cross_entropy,
        _sgd,
    ),
    "deep": Workload(
        "deep",
        "the 98-module MLP's structure at width 16 (24 x Linear(16)+LayerNorm+GELU, batch 8, SGD)",
        deep_mlp,
        _deep_batch,
        nn.functional.cross_entropy,
        _sgd,
    ),
    "fast": Workload(
        "fast",
        "4-layer MLP 16-64-64-1 (ReLU, batch 8, MSELoss, AdamW): a 1-2 ms step",
        fast_mlp,
        _fast_batch,
        nn.functional.mse_loss,
        _adamw,
        # 100 steps of 0.3-1.4 ms end before the writer's first batch: its cost went uncounted
        timed_steps=2000,
    ),
    "wide": Workload(
        "wide",
        "5,000 modules: 2,500 x (Linear(8,8) + Tanh), batch 16, MSELoss, SGD (scale.py's wide model)",
        wide_mlp,
        _wide_batch,
        nn.functional.mse_loss,
        _sgd,
    ),
    "transformer": Workload(
        "transformer",
        "TransformerEncoder 4 x d_model 128 (ff 512, 4 heads), batch 8 x seq 32, vocab 256, AdamW",
        TinyTransformer,
        _token_batch,
        _token_loss,
        _adamw,
    ),
}


# ---------------------------------------------------------------------- memory
def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; else peak RSS)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def code_line() -> str:
    """Which auditlog is measured: its directory, and its git commit when it is a checkout."""
    where = Path(auditlog.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = dirty = ""
    return f"auditlog from {where}" + (
        f" at commit {commit}{'+dirty' if dirty else ''}" if commit else ""
    )


def machine_line() -> str:
    """Torch version, threads, CPUs, load and the code measured: printed above every table."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"{os.cpu_count()} CPUs, load average {load}; {code_line()}"
    )


# ---------------------------------------------------------------------- other load
_TICKS = os.sysconf("SC_CLK_TCK")


def _process_ticks(pid: int | str) -> tuple[int, int]:
    """(utime + stime, ppid) of a process, in clock ticks; (0, 0) if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return int(fields[11]) + int(fields[12]), int(fields[1])


def cpu_sample() -> tuple[float, int, int]:
    """(time, busy ticks of the whole machine, ticks of this process and its children)."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:9]]
    except OSError:
        return time.perf_counter(), 0, 0
    busy = sum(values) - values[3] - values[4]  # minus idle and iowait
    me = os.getpid()
    ours = _process_ticks(me)[0]
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        ticks, parent = _process_ticks(pid)
        if parent == me:  # wandb's service process and the like: part of the configuration
            ours += ticks
    return time.perf_counter(), busy, ours


def foreign_load(before: tuple[float, int, int], after: tuple[float, int, int]) -> float:
    """CPUs' worth of work done by other processes between two samples (0.0 = none)."""
    elapsed = after[0] - before[0]
    if elapsed <= 0 or after[1] == 0:
        return 0.0
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / _TICKS / elapsed)


def wait_for_quiet(threshold: float, limit: float, probe: float = 1.0) -> float:
    """Wait (at most ``limit`` s) until other processes use < ``threshold`` CPUs; return their last load."""
    deadline = time.perf_counter() + limit
    while True:
        before = cpu_sample()
        time.sleep(probe)
        load = foreign_load(before, cpu_sample())
        if load < threshold or time.perf_counter() >= deadline:
            return load


# ---------------------------------------------------------------------- hooks
# The methods torch calls as auditlog's hooks, timed by overhead.py and hookcpu.py.
HOOKS = (
    "_on_forward_pre",
    "_on_forward",
    "_on_output_grad",
    "_on_output_grads",
    "_on_backward_pre",
    "_on_full_backward",
    "_on_legacy_backward",
    "_on_step_pre",
    "_on_step_post",
    "_on_module_registered",
    "_on_parameter_registered",
    "_on_buffer_registered",
    # Called by the backward() wrapper (capture/backward.py): the loss, and the raw gradient
    # norms measured as each outermost backward returns (issue 28).
    "backward_started",
    "backward_finished",
)
# Where they may be defined: the recorder's components (capture/recorder.py builds them),
# or the Recorder itself in a checkout from before the components (issue 30).
HOOK_OWNERS = (
    ("recorder", "Recorder"),
    ("construction", "ConstructionHooks"),
    ("activity", "ActivityHooks"),
    ("optimizer", "OptimizerHooks"),
    ("stepnorms", "StepNorms"),
    ("metrics", "MetricHooks"),
)


def hook_methods() -> list[tuple[Any, str]]:
    """``(class, name)`` of every hook of ``HOOKS`` in this checkout (an older commit lacks
    some): wrapping them there wraps every recorder's bound methods."""
    owners = []
    for module, name in HOOK_OWNERS:
        try:
            owners.append(getattr(importlib.import_module(f"auditlog.capture.{module}"), name))
        except (ImportError, AttributeError):  # not in this checkout
            continue
    found = []
    for hook in HOOKS:
        owner = next((cls for cls in owners if hasattr(cls, hook)), None)
        if owner is not None:
            found.append((owner, hook))
    return found
