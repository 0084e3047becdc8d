"""Where each preset's overhead comes from, and what candidate fixes would save.

Not one of issue #5's tables: an engineering aid. Each row is a preset with one
part switched off or replaced by a candidate fix, patched in from outside (no
library change), timed side by side with bare exactly like ``overhead.py``
(interleaved shuffled rounds, medians). The patches touch auditlog internals of
the version this was written against (commit 9d373f3); a row whose patch target
no longer exists prints "n/a" instead of a number. Two of its candidate fixes
have since landed in the library (the writer runs no ATen op: statistics are
read on the training thread or copied to pinned memory; update-norm copies go
into buffers kept per optimizer), so those rows now print "n/a"; for where the
time goes today see ``overhead.py``'s CPU-time attribution and ``--profile``.

Rows:
- ``hooks only``: the preset's ``Recorder`` with a buffer that discards every
  record (no writer thread): the cost of the hooks themselves.
- ``writer without ATen``: the writer computes sealing statistics with numpy
  instead of torch. A torch reduction on a tensor above ATen's grain size (32k
  elements) on the writer thread makes libgomp create a second OpenMP team for
  that thread; with more OpenMP threads than CPUs libgomp then throttles its
  spin-waiting, so the training thread's OpenMP worker sleeps between parallel
  regions and every small op pays a wake-up.
- ``persistent update buffers``: the optimizer pre hook copies parameters into
  buffers kept across steps (``torch._foreach_copy_``) instead of allocating a
  ``clone()`` of every parameter every step.
- ``stats="norm"`` (debug): the policy's one-reduction statistics.

    python benchmarks/ablation.py                   # MLP, ~4 minutes on 2 cores
    python benchmarks/ablation.py --models mlp,transformer --rounds 3
"""

from __future__ import annotations
import __future__

import argparse
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead
from benchlib import WORKLOADS, capture_settings, machine_line, preset_note

from auditlog.capture.buffer import RecordBuffer
from auditlog.capture.recorder import Recorder


# ---------------------------------------------------------------------- patches
def numpy_host_stats(tensor: torch.Tensor) -> dict[str, Any]:
    """``host_stats`` with numpy (float64 accumulation): no ATen op on the writer thread."""
    from auditlog.core.tensors import dtype_name
    from auditlog.core.values import finite_or_text

    out: dict[str, Any] = {
        "shape": list(tensor.shape),
        "dtype": dtype_name(tensor.dtype),
        "numel": tensor.numel(),
    }
    if (
        tensor.numel() == 0
        or tensor.is_complex()
        or tensor.dtype not in (torch.float32, torch.float64)
    ):
        # keep the library's path for the rare dtypes; sealing is what matters here
        from auditlog.core.tensors import host_stats

        return host_stats(tensor)
    values = tensor.detach().numpy().reshape(-1)
    finite = np.isfinite(values)
    with np.errstate(all="ignore"):
        out.update(
            norm=finite_or_text(float(np.linalg.norm(values.astype(np.float64)))),
            mean=finite_or_text(float(values.mean(dtype=np.float64))),
            std=finite_or_text(float(values.std(dtype=np.float64))),
            min=finite_or_text(float(values.min())),
            max=finite_or_text(float(values.max())),
            nan=int(np.isnan(values).sum()),
            inf=int((~finite).sum() - np.isnan(values).sum()),
        )
    return out


@contextmanager
def writer_without_aten() -> Iterator[None]:
    import auditlog.capture.payloads as lazy

    if not hasattr(lazy, "host_stats"):
        raise LookupError("auditlog.capture.payloads.host_stats")
    original = lazy.host_stats
    lazy.host_stats = numpy_host_stats
    try:
        yield
    finally:
        lazy.host_stats = original


CLONE_LINE = "before = [p.detach().clone() for p in params]"


@contextmanager
def persistent_update_buffers() -> Iterator[None]:
    """The optimizer pre hook (``OptimizerHooks._on_step_pre``) with its per-step clones
    replaced by reused buffers.

    The method is recompiled from its own source with that one line replaced, so
    the rest of it stays whatever the library's version is.
    """
    from auditlog.capture import optimizer as optimizer_module

    owner = optimizer_module.OptimizerHooks
    original = owner._on_step_pre
    try:
        source = textwrap.dedent(inspect.getsource(original))
    except (OSError, TypeError) as exc:
        raise LookupError("the source of OptimizerHooks._on_step_pre") from exc
    if CLONE_LINE not in source:
        raise LookupError(f"{CLONE_LINE!r} in OptimizerHooks._on_step_pre")
    kept: dict[tuple[int, int], list[torch.Tensor]] = {}

    def reuse(recorder: Any, optimizer: Any, params: list[torch.Tensor]) -> list[torch.Tensor]:
        key = (id(recorder), id(optimizer))
        detached = [p.detach() for p in params]
        buffers = kept.get(key)
        if buffers is None or [b.shape for b in buffers] != [p.shape for p in detached]:
            buffers = kept[key] = [p.clone() for p in detached]
        else:
            torch._foreach_copy_(buffers, detached)
        return buffers

    namespace = dict(vars(optimizer_module))
    namespace["_bench_reuse"] = reuse
    patched = source.replace(CLONE_LINE, "before = _bench_reuse(self, optimizer, params)")
    flags = __future__.annotations.compiler_flag
    exec(
        compile(patched, "<ablation: _on_step_pre>", "exec", flags=flags, dont_inherit=True),
        namespace,
    )
    owner._on_step_pre = namespace[original.__name__]  # type: ignore[method-assign]
    try:
        yield
    finally:
        owner._on_step_pre = original  # type: ignore[method-assign]
        kept.clear()


# ---------------------------------------------------------------------- configurations
class Variant(overhead.Auditlog):
    """An auditlog preset with patches applied while it records."""

    def __init__(
        self,
        preset: str,
        label: str,
        patches: list[Callable[[], Any]],
        overrides: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(preset, None, overrides)
        self.name = f"{preset}: {label}"
        self.patches = patches

    def unavailable(self) -> str | None:
        try:
            for patch in self.patches:
                with patch():
                    pass
        except LookupError as exc:
            return f"n/a ({exc} not found)"
        return None

    def begin(self, scratch: Path) -> None:
        self.active = [patch() for patch in self.patches]
        for patch in self.active:
            patch.__enter__()
        super().begin(scratch)

    def end(self) -> dict[str, Any]:
        try:
            return super().end()
        finally:
            for patch in reversed(self.active):
                patch.__exit__(None, None, None)


class Discarding(RecordBuffer):
    def put(self, record: Any) -> None:
        return None


class HooksOnly(overhead.Config):
    """The preset's hooks with every record discarded: no writer thread."""

    def __init__(self, preset: str) -> None:
        self.preset = preset
        self.name = f"{preset}: hooks only (records discarded, no writer)"

    def begin(self, scratch: Path) -> None:
        self.recorder = Recorder(Discarding(), capture_settings(self.preset))
        self.recorder.install()

    def end(self) -> dict[str, Any]:
        self.recorder.remove()
        return {}


def variants(presets: list[str]) -> list[overhead.Config]:
    both = [writer_without_aten, persistent_update_buffers]
    rows: list[overhead.Config] = [overhead.Config()]
    for preset in presets:
        rows += [
            overhead.Auditlog(preset),
            HooksOnly(preset),
            Variant(preset, "writer without ATen", [writer_without_aten]),
        ]
        if preset != "minimal":  # minimal records no update norms
            rows.append(Variant(preset, "writer without ATen + persistent update buffers", both))
        if preset == "debug":
            rows.append(Variant(preset, 'stats="norm" + both fixes above', both, {"stats": "norm"}))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--presets", default="minimal,audit,debug")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    overhead.add_noise_options(parser)
    args = parser.parse_args(argv)
    if args.steps <= 0 or args.steps % overhead.BLOCK:
        parser.error(f"--steps must be a positive multiple of {overhead.BLOCK}")
    torch.set_num_threads(args.threads)
    print(machine_line())
    print(preset_note())
    print(
        "command: python benchmarks/ablation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    configs = variants(args.presets.split(","))
    skipped = {c.name: why for c in configs if (why := c.unavailable()) is not None}
    runnable = [c for c in configs if c.name not in skipped]
    for name in args.models.split(","):
        workload = WORKLOADS[name]
        overhead.report(
            workload, configs, skipped, overhead.measure(workload, runnable, args), args
        )


if __name__ == "__main__":
    main()
