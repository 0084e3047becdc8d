"""Packed per-parameter vectors (``auditlog.core.packed``) and records written before them."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from forgery_support import CHAINED
from forgery_support import rows as chain_rows
from helpers import invoke, query_session, tamper
from torch import nn

import auditlog
from auditlog.core.chain import canonical_payload, chain_hash, genesis_hash
from auditlog.core.errors import CorruptRecordError
from auditlog.core.packed import (
    is_packed,
    pack_f32,
    pack_ints,
    packed_count,
    unpack_floats,
    unpack_ints,
    unpack_list,
)
from auditlog.store.rows import decode_event


def test_round_trip_keeps_every_bit_and_the_absent_positions() -> None:
    values = np.array([1.5, 0.0, np.nan, np.inf, -np.inf, 1e-45, 3.4e38, 0.1], dtype="<f4")
    packed = pack_f32(values.tobytes(), absent=[1])
    assert is_packed(packed) and packed["absent"] == [1]
    assert json.loads(json.dumps(packed)) == packed  # plain JSON
    floats = unpack_floats(packed)
    assert [struct.pack("<f", v) for v in floats] == [struct.pack("<f", v) for v in values.tolist()]
    shown = unpack_list(packed)
    assert (
        shown[1] is None
        and shown[2] == "NaN"
        and shown[3] == "Infinity"
        and shown[4] == "-Infinity"
    )
    assert shown[5] == float(np.float32(1e-45)) and shown[7] == float(np.float32(0.1))
    assert (
        unpack_list([1.0, None]) == [1.0, None] and unpack_list(None) is None
    )  # the list form passes
    assert pack_f32(b"") == {"f32": ""} and unpack_list({"f32": ""}) == []


def test_a_damaged_vector_is_a_corrupt_record() -> None:
    row = {
        "id": 1,
        "run_id": "r",
        "stream": 0,
        "seq": 1,
        "ts_ns": 1,
        "kind": "optimizer_step",
        "step": 1,
        "module_id": None,
        "tensor_id": None,
        "payload": json.dumps({"grad_norm": {"f32": "abc"}}),
    }
    try:
        decode_event(row)
    except Exception as exc:
        assert "grad_norm" in str(exc)
    else:
        raise AssertionError("a vector that is not base64 of float32 was accepted")


def test_tensor_ids_round_trip_in_the_narrowest_width() -> None:
    ids = list(range(1, 5001))
    packed = pack_ints(ids)
    assert set(packed) == {"i16"} and len(base64.b64decode(packed["i16"])) == 2 * 5000
    assert (
        unpack_ints(packed) == ids and unpack_list(packed) == ids and packed_count(packed) == 5000
    )
    for values, key in (
        ([-(2**15), 2**15 - 1], "i16"),
        ([2**15], "i32"),
        ([-(2**31), 2**31 - 1], "i32"),
        ([0, 2**31], "i64"),
        ([-(2**31) - 1, 2**63 - 1, -(2**63)], "i64"),
    ):
        assert set(pack_ints(values)) == {key} and unpack_list(pack_ints(values)) == values, (
            values,
            key,
        )
        assert packed_count(pack_ints(values)) == len(values)
    assert (
        pack_ints([]) == {"i16": ""}
        and unpack_list({"i32": ""}) == []
        and packed_count([1, 2]) == 2
    )
    assert json.loads(json.dumps(packed)) == packed  # plain JSON


def test_damaged_tensor_ids_are_a_corrupt_record() -> None:
    for payload in (
        {"tensor_ids": {"i32": "AQAA"}},
        {"param_groups": [{"lr": 0.1, "params": {"i64": "!!"}}]},
    ):
        row = {
            "id": 1,
            "run_id": "r",
            "stream": 0,
            "seq": 1,
            "ts_ns": 1,
            "kind": "optimizer_step",
            "step": 1,
            "module_id": None,
            "tensor_id": None,
            "payload": json.dumps(payload),
        }
        with pytest.raises(CorruptRecordError, match=r"tensor_ids|params"):
            decode_event(row)


@pytest.mark.parametrize("old", ["lists", "ids_as_lists"])
def test_records_in_the_list_form_still_fill_the_steps_view(tmp_path: Path, old: str) -> None:
    """A run recorded before packing stored plain lists (everything, or the tensor ids
    only: the round that packed the vectors first): rewritten so here, it reads the same."""
    store = tmp_path / "store"
    with auditlog.record(store, activity=False, flops=False, norms_every=1) as recording:
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    with tamper(store) as conn:
        ((event_id, text),) = conn.execute(
            "select id, payload from events where kind = 'optimizer_step'"
        ).fetchall()
        payload = json.loads(text)
        assert all(is_packed(payload[k]) for k in ("grad_norm", "update_norm", "param_norm"))
        assert set(payload["tensor_ids"]) == {"i16"} and set(
            payload["param_groups"][0]["params"]
        ) == {"i16"}
        vectors = {k: unpack_list(payload[k]) for k in ("grad_norm", "update_norm", "param_norm")}
        if old == "lists":
            payload.update(vectors)
        payload["tensor_ids"] = unpack_list(payload["tensor_ids"])
        payload["param_groups"][0]["params"] = unpack_list(payload["param_groups"][0]["params"])
        conn.execute(
            "update events set payload = ? where id = ?", (canonical_payload(payload), event_id)
        )
        # As an old recorder wrote it: chained with that payload (the read model checks the links).
        prev = genesis_hash(recording.run_id, 0)
        for row in chain_rows(conn, recording.run_id):
            row["hash"] = prev = chain_hash(prev, {c: row[c] for c in CHAINED})
            conn.execute("update events set hash = ? where id = ?", (row["hash"], row["id"]))
    ids = payload["tensor_ids"]
    assert isinstance(ids, list) and len(ids) == 2 and ids == payload["param_groups"][0]["params"]
    want = [
        (
            i,
            ids[i],
            0,
            0.1,
            vectors["grad_norm"][i],
            vectors["update_norm"][i],
            vectors["param_norm"][i],
        )
        for i in range(2)
    ]
    with query_session(
        store
    ) as session:  # the first read model of this store: built from the lists
        rows = list(
            session.execute(
                "select param_index, tensor_id, param_group, lr, grad_norm, update_norm, param_norm "
                "from steps order by 1"
            ).rows
        )
    assert rows == want and all(isinstance(v, float) and v > 0 for r in rows for v in r[4:])
    assert recording.run_id is not None
    shown = invoke(
        "events",
        recording.run_id,
        "--store",
        str(store),
        "--kind",
        "optimizer_step",
        "--format",
        "json",
    )
    assert shown.exit_code == 0, shown.stderr
    (event,) = json.loads(shown.stdout)
    assert (
        event["payload"]["tensor_ids"] == ids
        and event["payload"]["param_groups"][0]["params"] == ids
    )
    assert event["payload"]["grad_norm"] == vectors["grad_norm"]
