"""The fast encoders agree with their definitions."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from auditlog.core.chain import (
    FORMATS,
    ChainFormat,
    Clean,
    canonical_row,
    canonical_row_reference,
    encode_clean,
    row_prefix,
)
from auditlog.recording.writer import materialize

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
ints = st.integers(min_value=0, max_value=2**62)


@given(
    run_id=text,
    stream=st.integers(0, 5),
    seq=ints,
    ts=ints,
    kind=text,
    step=st.none() | ints,
    module=st.none() | ints,
    tensor=st.none() | ints,
    snapshot=st.none() | text,
    payload=text,
    chain=st.sampled_from(FORMATS),
    archived=st.booleans(),
)
def test_canonical_row_is_byte_for_byte_the_json_definition(
    run_id: str,
    stream: int,
    seq: int,
    ts: int,
    kind: str,
    step: int | None,
    module: int | None,
    tensor: int | None,
    snapshot: str | None,
    payload: str,
    chain: ChainFormat,
    archived: bool,
) -> None:
    """In every chain format; a row with ``snapshot`` is a v1 archive's (written before
    revision 0005 dropped the column), one without it a stored row."""
    row = {
        "run_id": run_id,
        "stream": stream,
        "seq": seq,
        "ts_ns": ts,
        "kind": kind,
        "step": step,
        "module_id": module,
        "tensor_id": tensor,
        "payload": payload,
    }
    if archived:
        row["snapshot"] = snapshot
    expected = canonical_row_reference(row, chain)
    assert canonical_row(row, chain=chain) == expected
    assert canonical_row(row, row_prefix(run_id, stream), chain) == expected
    held = row.get("snapshot")
    assert json.loads(expected)[-2 if chain.retired else -1 :] == (
        [held, payload] if chain.retired else [payload]
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_materialized_payloads_encode_to_json_that_keeps_every_value(value: object) -> None:
    """NaN/Infinity survive as text (orjson alone would write null), keys come out sorted."""
    encoded = encode_clean(materialize({"v": value}))
    decoded = json.loads(encoded)["v"]

    def same(a: object, b: object) -> bool:
        if isinstance(a, float):
            if math.isnan(a):
                return b == "NaN"
            if math.isinf(a):
                return b == ("Infinity" if a > 0 else "-Infinity")
            return isinstance(b, float | int) and float(b) == a
        if isinstance(a, list):
            return (
                isinstance(b, list)
                and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b, strict=True))
            )
        if isinstance(a, dict):
            return (
                isinstance(b, dict)
                and list(b) == sorted(b)
                and set(a) == set(b)
                and all(same(a[k], b[k]) for k in a)
            )
        return a == b

    assert same(value, decoded)


def test_clean_dicts_are_encoded_as_they_are() -> None:
    payload = Clean(b=1, a=[1.5, "NaN"])
    assert materialize(payload) is payload
    assert encode_clean(payload) == '{"a":[1.5,"NaN"],"b":1}'


def test_optimizer_step_hyperparameters_are_stored_as_json_values() -> None:
    """Real ``optimizer_step`` payloads through the writer's path: tuples become
    lists, tensors their value, non-finite floats their text, and a user's object
    in a parameter group does not break the event."""
    import torch

    from auditlog.capture.buffer import RecordBuffer
    from auditlog.capture.recorder import Recorder

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizers = [
        torch.optim.Adam(model.parameters(), lr=0.01),
        torch.optim.SGD(model.parameters(), lr=torch.tensor(0.5)),
        torch.optim.SGD([{"params": list(model.parameters()), "tag": object()}], lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=float("nan")),
    ]
    buffer = RecordBuffer(maxsize=10**6)
    recorder = Recorder(buffer)
    recorder.install()
    try:
        for optimizer in optimizers:
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
    finally:
        recorder.remove()
    groups = [
        json.loads(encode_clean(materialize(r[5])))["param_groups"][0]
        for r in buffer.drain(10**9)
        if type(r) is tuple and r[0] == "optimizer_step"
    ]
    assert len(groups) == 4
    assert groups[0]["betas"] == [0.9, 0.999] and groups[0]["lr"] == 0.01
    assert groups[1]["lr"] == 0.5
    assert isinstance(groups[2]["tag"], str) and groups[2]["lr"] == 0.1
    assert groups[3]["weight_decay"] == "NaN"
