"""The recorder's work per training step in Python bytecodes, per function.

Wall and CPU time of a sub-millisecond step are noisy here, and
``instructions.py`` (callgrind) takes minutes a configuration and shows C
functions, not which Python function of ours ran them. This counts the Python
bytecodes each function executes, with ``sys.settrace`` and opcode events, over
``--steps`` training steps of a ``benchlib.WORKLOADS`` workload: bare, then
under each preset. The count is exact and the same on every machine (a bytecode
is not a fixed cost: a call into C counts one), so it says where the recorder's
Python work is and whether a change removed some, in seconds. Tracing slows the
run ~100x: the steps are few; the writer thread is not traced (its work is in
``instructions.py`` and ``hookcpu.py``).

Printed: bytecodes per step in auditlog's functions (the training thread's
share of the recorder), in other code beyond the bare step's (torch code the
recorder calls, named tuples' constructors), and the top functions.

    python benchmarks/bytecodes.py --models fast --presets minimal,audit
    PYTHONPATH=/path/to/other/checkout python benchmarks/bytecodes.py ...  # another commit
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import WORKLOADS, machine_line, record_options

import auditlog

WARMUP = 30
_PACKAGE = str(Path(auditlog.__file__).resolve().parent)


def _where(frame: FrameType) -> str:
    code = frame.f_code
    filename = code.co_filename
    if filename.startswith(_PACKAGE):
        filename = "auditlog" + filename[len(_PACKAGE) :]
    elif "site-packages/" in filename:
        filename = filename.split("site-packages/", 1)[1]
    return f"{filename}:{code.co_name}"


def count(preset: str, workload: str, steps: int) -> collections.Counter[str]:
    """Bytecodes per function over ``steps`` training steps (after ``WARMUP``)."""
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[_where(frame)] += 1
        return tracer

    work = WORKLOADS[workload]
    torch.manual_seed(0)
    x, y = work.batch()
    with tempfile.TemporaryDirectory(prefix="auditlog-bytecodes-") as scratch:
        recording = (
            auditlog.record(Path(scratch) / "store", **record_options(preset))
            if preset != "bare"
            else None
        )
        if recording is not None:
            recording.__enter__()
        try:
            model = work.build()
            optimizer = work.optimizer(model.parameters())
            for i in range(WARMUP + steps):
                if i == WARMUP:
                    sys.settrace(tracer)
                loss = work.loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
            sys.settrace(None)
        finally:
            sys.settrace(None)
            if recording is not None:
                recording.__exit__(None, None, None)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="fast")
    parser.add_argument("--presets", default="minimal,audit")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=15, help="functions listed per preset")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(machine_line())
    print(
        "command: python benchmarks/bytecodes.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    for workload in args.models.split(","):
        steps = args.steps
        bare = count("bare", workload, steps)
        bare_total = sum(bare.values()) / steps
        print(
            f"\n{workload}: Python bytecodes per step, {steps} steps; bare step {bare_total:,.0f}\n"
        )
        print("| preset | auditlog's functions | other code beyond bare | total vs bare |")
        print("|---|---:|---:|---:|")
        tops: dict[str, list[tuple[str, float]]] = {}
        for preset in args.presets.split(","):
            counts = count(preset, workload, steps)
            ours = sum(v for k, v in counts.items() if k.startswith("auditlog/")) / steps
            total = sum(counts.values()) / steps
            print(
                f"| {preset} | {ours:,.0f} | {total - ours - bare_total:,.0f} | "
                f"{total / bare_total:.3f}x |"
            )
            tops[preset] = [
                (name, value / steps)
                for name, value in counts.most_common()
                if name.startswith("auditlog/")
            ][: args.top]
        for preset, top in tops.items():
            print(
                f"\n{workload}, {preset}: auditlog's functions with the most bytecodes per step\n"
            )
            print("| function | bytecodes/step |")
            print("|---|---:|")
            for name, value in top:
                print(f"| `{name}` | {value:,.1f} |")


if __name__ == "__main__":
    main()
