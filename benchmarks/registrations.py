"""Folding a model's registrations into the recorder's state: the replay's ``apply`` over
the parsed records (what the recorder does) against a fold straight from the flat values
(the second implementation it replaced), side by side in one run.

The model is 2,500 x (Linear(8, 8), Tanh) in one Sequential (5,000 modules, 10,000
events). ``parse`` is paid once per batch, by whichever of the writer and the recorder
asks first, so "apply, records parsed already" is the recorder's cost when the writer
got there first.

    python benchmarks/registrations.py [--layers 2500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

from torch import nn

import auditlog
from auditlog.capture import registrations as R
from auditlog.core.replay import ModelState, TensorInfo, apply
from auditlog.core.tensors import dtype_name


def _flat_fold(state: ModelState, flat: list[Any]) -> None:
    """The fold the recorder had before (git history: capture/registrations.py ``fold``)."""
    node = state.node
    for fields, shape in R._walk(flat):
        kind = fields[0]
        if kind == "module_registered":
            (
                _,
                _,
                _,
                parent_id,
                _,
                name,
                child_id,
                child_cls,
                parent_cls,
                code,
                line,
                attached,
                parent_code,
                parent_line,
                parent_attached,
                adopted,
                _,
            ) = fields
            parent = node(parent_id, parent_cls)
            if parent.source is None and parent_code is not R.ABSENT and parent_code is not None:
                parent.source = R._site(parent_code, parent_line, parent_attached)
            if name not in parent.children:
                parent.drop_name(name)
            parent.children[name] = child_id
            if child_id is not None:
                child = node(child_id, child_cls)
                if child.source is None and not adopted:
                    child.source = R._site(code, line, attached)
            continue
        (
            _,
            _,
            _,
            module_id,
            tensor_id,
            name,
            module_cls,
            dtype,
            device,
            _lazy,
            flag,
            code,
            line,
            module_code,
            module_line,
            module_attached,
            _,
            _,
            _,
        ) = fields
        module = node(module_id, module_cls)
        if module.source is None and module_code is not R.ABSENT and module_code is not None:
            module.source = R._site(module_code, module_line, module_attached)
        parameter = kind == "parameter_registered"
        members = module.parameters if parameter else module.buffers
        if name not in members:
            module.drop_name(name)
        members[name] = tensor_id
        if tensor_id is None:
            continue
        dtype_text = None if dtype is None else dtype_name(dtype)
        device_text = None if device is None else R._device(device)
        info = state.tensors.get(tensor_id)
        if info is None:
            info = state.tensors[tensor_id] = TensorInfo(
                tensor_id, "parameter" if parameter else "buffer", shape, dtype_text, device_text
            )
            info.source = R._site(code, line)
        info.shape, info.dtype, info.device = shape, dtype_text, device_text
        if parameter:
            info.requires_grad = flag
        else:
            info.persistent = flag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    batches: list[list[Any]] = []
    original = R.Registrations.__init__

    def keep(self: R.Registrations, flat: list[Any], count: int) -> None:
        original(self, flat, count)
        batches.append(list(flat))

    R.Registrations.__init__ = keep  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp, auditlog.record(tmp + "/store"):
        nn.Sequential(*[m for _ in range(args.layers) for m in (nn.Linear(8, 8), nn.Tanh())])
    R.Registrations.__init__ = original  # type: ignore[method-assign]
    parsed = [R.parse(b) for b in batches]

    def applied(records: list[list[tuple[Any, ...]]]) -> None:
        state = ModelState()
        for batch in records:
            for kind, _, _, module_id, tensor_id, payload in batch:
                apply(
                    state,
                    {
                        "kind": kind,
                        "module_id": module_id,
                        "tensor_id": tensor_id,
                        "payload": payload,
                    },
                )

    rows: dict[str, Callable[[], None]] = {
        "flat fold (before)": lambda: [_flat_fold(ModelState(), b) for b in batches] and None,
        "parse + apply (recorder first)": lambda: applied([R.parse(b) for b in batches]),
        "apply, records parsed already": lambda: applied(parsed),
    }
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, run in rows.items():  # interleaved: the machine's drift hits every row
            start = time.perf_counter()
            run()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    events = sum(len(p) for p in parsed)
    base = best["flat fold (before)"]
    print(f"{events:,} registration events, best of {args.repeat}")
    for name, seconds in best.items():
        print(f"{name:34} {seconds * 1000:7.1f} ms  {seconds / base:4.2f}x")


if __name__ == "__main__":
    main()
