"""The step record of a model of 5,000 parameter tensors (issue 16).

Per-parameter vectors are stored packed (``auditlog.core.packed``: float32,
base64). This records a 2,500-layer model (5,000 parameter tensors, one more
that never gets a gradient), makes two gradients non-finite on the last step,
and checks that every parameter's norms are present and that the stored bytes
come back bit for bit through the ``steps`` view, ``auditlog events --format
json`` and the Python API, and that ``verify`` accepts the run.
"""

from __future__ import annotations

import base64
import json
import math
import sqlite3
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import invoke, query_session
from torch import nn

import auditlog

LAYERS = 2500
STEPS = 3


class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[nn.Linear(8, 8) for _ in range(LAYERS)])
        self.unused = nn.Linear(8, 8, bias=False)  # in the optimizer, never gets a gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.body:  # residual: gradients reach every layer (no vanishing)
            x = x + 0.1 * torch.tanh(layer(x))
        return x


def bits(value: Any) -> Any:
    """A float's exact bits (NaN with any payload as "NaN"); anything else as it is."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else struct.pack("<d", value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return "NaN" if value == "NaN" else struct.pack("<d", float(value))
    return value


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[list[float | None]]]:
    store = tmp_path_factory.mktemp("wide") / "store"
    torch.manual_seed(0)
    expected: list[list[float | None]] = []
    with auditlog.record(
        store,
        activity=False,
        flops=False,
        snapshot_initial=False,
        snapshot_final=False,
        norms_every=1,
    ) as recording:
        model = Wide()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        params = list(model.parameters())
        for step in range(STEPS):
            optimizer.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            if step == STEPS - 1:
                with torch.no_grad():
                    model.body[0].weight.grad[0, 0] = float("nan")  # type: ignore[index]
                    model.body[7].bias.grad[1] = float("inf")  # type: ignore[index]
            expected.append([None if p.grad is None else float(p.grad.norm()) for p in params])
            optimizer.step()
    assert recording.run_id is not None
    return store, recording.run_id, expected


def stored_vectors(store: Path, run_id: str) -> list[dict[str, Any]]:
    """The optimizer_step payloads as stored, vectors decoded here with numpy (not core.packed)."""
    conn = sqlite3.connect(f"file:{store / 'events.db'}?mode=ro", uri=True)
    try:
        texts = [
            r[0]
            for r in conn.execute(
                "select payload from events where run_id = ? and kind = 'optimizer_step' order by seq",
                (run_id,),
            )
        ]
    finally:
        conn.close()
    out = []
    for text in texts:
        payload = json.loads(text)
        # tensor ids packed as int16 (core.packed: they fit), the same for the one param group
        assert (
            set(payload["tensor_ids"]) == {"i16"}
            and payload["param_groups"][0]["params"] == payload["tensor_ids"]
        )
        ids = np.frombuffer(base64.b64decode(payload["tensor_ids"]["i16"]), dtype="<i2").tolist()
        payload["tensor_ids"] = ids
        payload["param_groups"][0]["params"] = ids
        for key in ("grad_norm", "update_norm", "param_norm"):
            packed = payload[key]
            assert set(packed) <= {"f32", "absent"}, packed  # packed, not a list
            values: list[Any] = (
                np.frombuffer(base64.b64decode(packed["f32"]), dtype="<f4").astype(float).tolist()
            )
            for i in packed.get("absent", []):
                values[i] = None
            payload[key] = values
        out.append(payload)
    return out


def test_every_parameter_has_its_norms(wide: tuple[Path, str, list[list[float | None]]]) -> None:
    store, run_id, expected = wide
    stored = stored_vectors(store, run_id)
    assert len(stored) == STEPS
    for payload, want in zip(stored, expected, strict=True):
        assert len(payload["tensor_ids"]) == 2 * LAYERS + 1
        for key in ("grad_norm", "update_norm", "param_norm"):
            assert len(payload[key]) == 2 * LAYERS + 1
        got = payload["grad_norm"]
        assert got[-1] is None and want[-1] is None  # the unused layer: no gradient
        for g, w in zip(got[:-1], want[:-1], strict=True):
            assert g is not None and w is not None
            assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, rel=1e-5, abs=1e-30)
        assert all(v is not None and (v > 0 or math.isnan(v)) for v in payload["param_norm"])
        assert all(w is None or w > 0 or math.isnan(w) for w in want)
        assert payload["update_norm"][-1] == 0.0  # no gradient, no update
    last = stored[-1]
    assert last["nonfinite_grads"] == 2
    assert math.isnan(last["grad_norm"][0]) and math.isinf(last["grad_norm"][2 * 7 + 1])
    assert [p["nonfinite_grads"] for p in stored[:-1]] == [0] * (STEPS - 1)


def test_views_and_events_give_back_the_stored_bits(
    wide: tuple[Path, str, list[list[float | None]]],
) -> None:
    store, run_id, _ = wide
    stored = stored_vectors(store, run_id)
    want = [
        (
            step + 1,
            i,
            p["tensor_ids"][i],
            0,
            0.01,
            bits(p["grad_norm"][i]),
            bits(p["update_norm"][i]),
            bits(p["param_norm"][i]),
        )
        for step, p in enumerate(stored)
        for i in range(len(p["tensor_ids"]))
    ]
    assert len({w[2] for w in want}) == 2 * LAYERS + 1  # distinct ids, one per parameter
    with query_session(store) as session:
        rows = session.execute(
            "select step, param_index, tensor_id, param_group, lr, grad_norm, update_norm, param_norm from steps "
            f"where run_id = '{run_id}' order by step, param_index"
        ).rows
        got = [(*r[:5], bits(r[5]), bits(r[6]), bits(r[7])) for r in rows]
    assert got == want

    shown = invoke(
        "events", run_id, "--store", str(store), "--kind", "optimizer_step", "--format", "json"
    )
    assert shown.exit_code == 0, shown.stderr
    events = json.loads(shown.stdout)
    assert len(events) == STEPS
    for event, payload in zip(events, stored, strict=True):
        for key in ("grad_norm", "update_norm", "param_norm"):
            assert [bits(v) for v in event["payload"][key]] == [bits(v) for v in payload[key]], key
        assert event["payload"]["tensor_ids"] == payload["tensor_ids"]
        assert event["payload"]["param_groups"][0]["params"] == payload["tensor_ids"]

    with auditlog.open(store) as opened:
        api = [e["payload"] for e in opened.run(run_id).events(kinds=["optimizer_step"])]
    assert [[bits(v) for v in p["grad_norm"]] for p in api] == [
        [bits(v) for v in p["grad_norm"]] for p in stored
    ]
    assert [p["tensor_ids"] for p in api] == [p["tensor_ids"] for p in stored]
    assert [p["param_groups"][0]["params"] for p in api] == [p["tensor_ids"] for p in stored]

    verified = invoke("verify", run_id, "--store", str(store))
    assert verified.exit_code == 0, verified.stdout + verified.stderr
