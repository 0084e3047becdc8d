"""Crafted payloads get an answer (issue 29, part 4): size and depth limits, ``events``
fast on big payloads and checked against the chain, proof events type-checked.

Stores are real recordings (``auditlog.record``); every crafted payload is made
with plain ``sqlite3`` (``crafted_payload_cases``). Before the limits a payload
nested 200,000 levels deep stopped every command, ``verify`` included, with
``internal error: RecursionError``, and ``events`` took 10.8 s on a 4 MiB payload
(minutes on 200 MiB).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from crafted_payload_cases import PAYLOAD_CASES, READERS, PayloadCase, edit_payload, nested
from forgery_support import train
from helpers import CliResult, assert_one_line_error, invoke
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import auditlog
from auditlog.core.errors import PayloadLimitError
from auditlog.core.payloadlimits import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    NotJSONError,
    _deeper_than,
    limit_problem,
    loads_bounded,
    parse_payload,
)
from auditlog.integrity.keys import generate_key_pair

SECONDS = 10.0  # an answer takes 0.05-2 s here; a reader stopped by a payload took minutes


def record(store: Path, name: str, seed: int, annotate: bool = True) -> str:
    """The forgery trial's small run (``forgery_support.train``), 3 steps."""
    return train(store, name, seed, steps=3, annotate=annotate)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """Two unsigned runs: r1 (annotated, snapshots every 2 steps) is the one every case edits."""
    store = tmp_path_factory.mktemp("pristine") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(store.parent / "config"))  # no signing key
        r1 = record(store, "r1", seed=0)
        r2 = record(store, "r2", seed=1, annotate=False)
    conn = sqlite3.connect(store / "events.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return store, r1, r2


def copy_of(pristine: tuple[Path, str, str], tmp_path: Path) -> Path:
    store = tmp_path / "crafted"
    shutil.copytree(pristine[0], store, ignore=shutil.ignore_patterns("readmodel.duckdb*"))
    return store


def command(reader: str, store: Path, r1: str, r2: str, out: Path) -> tuple[str, ...]:
    return {
        "verify": ("verify", r1),
        "events": ("events", r1, "--format", "json"),
        "runs": ("runs",),
        "tree": ("tree", r1),
        "query": ("query", "--format", "json", "select count(*) as n from events"),
        "restore": ("restore", r1, "-o", str(out / "state.pt")),
        "diff": ("diff", r1, r2),
        "metrics": ("metrics", r1),
        "report": ("report", r1, "-o", str(out / "report.html")),
        "snapshots": ("snapshots", r1),
        "nonfinite": ("nonfinite", r1),
        "plot": ("plot", r1, "loss", "--format", "csv"),
        "export": ("export", r1, "--to", str(out / "archive")),
        "events_table": ("events", r1),
    }[reader] + ("--store", str(store))


def answered(args: tuple[str, ...], code: int, *words: str) -> CliResult:
    """Run one command: the documented exit code, within ``SECONDS``; a failure is one
    ``Error:`` line (no traceback, no internal error) holding ``words``."""
    start = time.perf_counter()
    result = invoke(*args)
    took = time.perf_counter() - start
    assert took < SECONDS, (args[0], took)
    if code == 0:
        assert result.exit_code == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    else:
        assert_one_line_error(result, code, *words)
    return result


# --------------------------------------------------------------------------- the corpus
@pytest.mark.parametrize("case", PAYLOAD_CASES, ids=[c.name for c in PAYLOAD_CASES])
def test_every_reader_answers_a_crafted_payload(
    case: PayloadCase, pristine: tuple[Path, str, str], tmp_path: Path
) -> None:
    store = copy_of(pristine, tmp_path)
    _, r1, r2 = pristine
    case.damage(store, r1)
    for reader in READERS:
        code = case.code(reader)
        words = (case.finding,) if reader == "verify" and case.finding else ()
        result = answered(command(reader, store, r1, r2, tmp_path), code, *words)
        if code == 4 and reader != "verify":  # refused by name: the event, its run, stream and seq
            assert (
                f"run '{r1[:12]}' stream 0 seq " in result.stderr
                or f"run {r1[:12]} stream 0 seq " in result.stderr
            )


def test_every_command_answers_a_payload_nested_200000_deep(
    pristine: tuple[Path, str, str], tmp_path: Path
) -> None:
    """The issue's case: every command refused it with RecursionError. Now each one that
    reads run_started names the event (exit 4); tree and snapshots never read it."""
    store = copy_of(pristine, tmp_path)
    _, r1, r2 = pristine
    next(c for c in PAYLOAD_CASES if c.name == "deep_run_started").damage(store, r1)
    for reader in (
        "verify",
        "events_table",
        "runs",
        "metrics",
        "query",
        "report",
        "diff",
        "restore",
        "export",
        "nonfinite",
        "plot",
    ):
        answered(command(reader, store, r1, r2, tmp_path), 4, "seq 1", "run_started", "64 levels")
    for reader in ("tree", "snapshots"):
        answered(command(reader, store, r1, r2, tmp_path), 0)
    with auditlog.open(store) as opened, pytest.raises(PayloadLimitError, match="seq 1"):
        list(opened.run(r1).events())


def test_events_shows_a_4_mib_payload_in_a_fraction_of_a_second(
    pristine: tuple[Path, str, str], tmp_path: Path
) -> None:
    """10.8 s before (rich folding a 4 MiB table cell); a table cell is now cut, JSON is whole."""
    store = copy_of(pristine, tmp_path)
    _, r1, r2 = pristine

    def shown_field(
        *path: str,
    ) -> Callable[[str], str]:  # a 4 MiB string where the table summary shows it
        def edit(text: str) -> str:
            payload = json.loads(text)
            holder = payload
            for part in path[:-1]:
                holder = holder[part]
            holder[path[-1]] = path[-1][0] * (4 << 20)
            return json.dumps(payload, sort_keys=True, separators=(",", ":"))

        return edit

    edit_payload(store, r1, "module_registered", shown_field("name"), rehash=True)
    edit_payload(store, r1, "annotation", shown_field("fields", "blob"), rehash=True)
    start = time.perf_counter()
    table = answered(command("events_table", store, r1, r2, tmp_path), 0)
    assert time.perf_counter() - start < 3.0  # measured 0.1-0.7 s on a busy 2-core machine
    assert "4,194,3" in table.stdout and "characters in all)" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) < 1000
    shown = answered(command("events", store, r1, r2, tmp_path), 0)
    (annotation,) = [e for e in json.loads(shown.stdout) if e["kind"] == "annotation"]
    assert annotation["payload"]["fields"]["blob"] == "b" * (4 << 20)
    for reader in ("metrics", "report", "tree", "restore"):
        answered(command(reader, store, r1, r2, tmp_path), 0)


# --------------------------------------------------------------------------- events checks the chain
def test_events_marks_an_edited_event_and_says_so_in_one_line(
    pristine: tuple[Path, str, str], tmp_path: Path
) -> None:
    """A plain edit of lr (hash column untouched): shown, marked, one stderr line, exit 4."""
    store = copy_of(pristine, tmp_path)
    _, r1, r2 = pristine

    def lr(text: str) -> str:
        payload = json.loads(text)
        payload["param_groups"][0]["lr"] = 0.5
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))

    edit_payload(store, r1, "optimizer_step", lr, rehash=False)
    with auditlog.open(store) as opened:
        steps = list(opened.run(r1).events(kinds=["optimizer_step"], check_chain=True))
    edited = steps[0]["seq"]
    assert [e["chain_ok"] for e in steps] == [False, True, True]
    table = invoke(*command("events_table", store, r1, r2, tmp_path))
    line = assert_one_line_error(
        table, 4, f"stream 0 seq {edited}, optimizer_step", "does not match the hash chain"
    )
    assert line.startswith("Error: 1 event shown does not match")
    assert "CHAIN BROKEN: SGD lr=0.5" in table.stdout and table.stdout.count("CHAIN BROKEN") == 1
    for args in (
        ("--format", "json"),
        ("--kind", "optimizer_step", "--format", "json"),
    ):  # filtered: still checked
        shown = invoke("events", r1, *args, "--store", str(store))
        assert_one_line_error(shown, 4, f"seq {edited}")
        rows = json.loads(shown.stdout)
        assert [r["seq"] for r in rows if not r["chain_ok"]] == [edited]
        assert len(rows) > 1 and all(r["chain_ok"] for r in rows if r["seq"] != edited)
    answered(("events", r2, "--store", str(store)), 0)  # the other run is intact


def test_events_marks_the_event_after_a_deleted_one(
    pristine: tuple[Path, str, str], tmp_path: Path
) -> None:
    store = copy_of(pristine, tmp_path)
    r1 = pristine[1]
    conn = sqlite3.connect(store / "events.db")
    conn.execute("delete from events where run_id = ? and seq = 5", (r1,))
    conn.commit()
    conn.close()
    shown = invoke("events", r1, "--format", "json", "--store", str(store))
    assert_one_line_error(shown, 4, "seq 6")
    assert [r["seq"] for r in json.loads(shown.stdout) if not r["chain_ok"]] == [6]


def test_events_of_an_intact_run_are_all_chained(pristine: tuple[Path, str, str]) -> None:
    store, r1, _ = pristine
    shown = answered(("events", r1, "--format", "csv", "--store", str(store)), 0)
    lines = shown.stdout.splitlines()
    at = lines[0].split(",").index("chain_ok")
    assert at == 11 and all(line.split(",")[at] == "True" for line in lines[1:])
    assert shown.stderr == ""


# --------------------------------------------------------------------------- recording refuses
def test_recording_refuses_a_payload_past_the_limits_as_a_recorder_fault(store: Path) -> None:
    """The annotation is not written; a recorder_error says why; training goes on."""
    deep: Any = "leaf"
    for _ in range(
        MAX_PAYLOAD_DEPTH
    ):  # {"fields": {"deep": ...}} puts it two levels down: 66 levels
        deep = [deep]
    fits: Any = "leaf"
    for _ in range(MAX_PAYLOAD_DEPTH - 2):  # exactly 64 levels: recorded
        fits = [fits]
    with auditlog.record(store=store, name="limits") as run:
        model = nn.Linear(2, 2)
        run.annotate("too_deep", deep=deep)
        run.annotate("too_big", blob="x" * MAX_PAYLOAD_BYTES)
        run.annotate("fits", deep=fits)
        model(torch.ones(1, 2)).sum().backward()
    assert run.run_id is not None
    with auditlog.open(store) as opened:
        recorded = opened.run(run.run_id)
        events = list(recorded.events(kinds=["annotation", "recorder_error"]))
        assert recorded.verify().ok
        assert recorded.info().status == "completed"
    assert [e["payload"]["key"] for e in events if e["kind"] == "annotation"] == ["fits"]
    faults = [e["payload"] for e in events if e["kind"] == "recorder_error"]
    assert [f["type"] for f in faults] == ["PayloadLimitError", "PayloadLimitError"]
    assert "annotation payload is nested more than 64 levels deep" in faults[0]["message"]
    assert "over the limit of 67,108,864 bytes" in faults[1]["message"]


# --------------------------------------------------------------------------- the limits
def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TEXT = st.text(alphabet='[]{}"\\ab\n\u00e9\U0001f600', max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.integers(min_value=0, max_value=8))
def test_the_depth_scan_agrees_with_the_parsed_value(value: Any, limit: int) -> None:
    """Strings full of brackets, quotes and backslashes are text: only structure counts."""
    text = json.dumps(value, ensure_ascii=False)
    assert _deeper_than(text.encode(), limit) == (_depth(value) > limit)
    padded = json.dumps([value, " " * 70_000])  # past 64 KiB of text: measured with numpy
    assert _deeper_than(padded.encode(), limit) == (_depth(value) + 1 > limit)


def test_the_limits_are_exact() -> None:
    inside = '{"a":' + nested(MAX_PAYLOAD_DEPTH - 1) + "}"
    assert limit_problem(inside) is None
    assert (
        limit_problem('{"a":' + nested(MAX_PAYLOAD_DEPTH) + "}")
        == "is nested more than 64 levels deep"
    )
    wide = (
        '{"a":[' + ",".join([nested(MAX_PAYLOAD_DEPTH - 2)] * 2000) + "]}"
    )  # many at the limit, none past
    assert limit_problem(wide) is None
    full = '{"a":"' + "x" * (MAX_PAYLOAD_BYTES - 8) + '"}'
    assert len(full) == MAX_PAYLOAD_BYTES and limit_problem(full) is None
    assert (
        limit_problem(full[:-2] + 'x"}')
        == "is 67,108,865 characters long, over the limit of 67,108,864 bytes"
    )
    accents = '{"a":"' + "\u00e9" * (MAX_PAYLOAD_BYTES // 2) + '"}'  # counted in UTF-8 bytes
    assert limit_problem(accents) == "is 67,108,872 bytes long, over the limit of 67,108,864 bytes"


@pytest.mark.parametrize(
    "text",
    [
        '{"a":' + "[" * 70 + "}",
        '{"a":' + "]" * 70 + "[" * 70 + "}",
        '{"a":"' + "[" * 70,
        '{"a":' + "[" * 200_000 + "}",
    ],
)
def test_unpaired_brackets_are_no_json_and_never_parsed(text: str) -> None:
    with pytest.raises(NotJSONError):
        limit_problem(text)
    with pytest.raises(ValueError):
        parse_payload(text)


def test_parse_payload_names_the_event_and_documents_stay_bounded() -> None:
    row = {"id": 7, "run_id": "a" * 32, "stream": 0, "seq": 3, "kind": "metrics"}
    with pytest.raises(
        PayloadLimitError, match=r"event id 7 .*run 'aaaaaaaaaaaa' stream 0 seq 3, kind 'metrics'"
    ) as caught:
        parse_payload('{"a":' + nested(100_000) + "}", row, "/x")
    assert caught.value.exit_code == 4 and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="nested more than 64 levels deep"):
        loads_bounded(nested(100_000))
    assert loads_bounded(b'{"a": [1, {"b": "[[["}]}') == {"a": [1, {"b": "[[["}]}


# --------------------------------------------------------------------------- proofs
@pytest.fixture(scope="module")
def proof(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """An inclusion proof of r1's annotation (signed while recording), and the public key."""
    root = tmp_path_factory.mktemp("proof")
    key = generate_key_pair(root / "keys" / "signing_key")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUDITLOG_KEY", str(key.private_path))
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        store = root / "store"
        run_id = record(store, "r1", seed=0)
        with auditlog.open(store) as opened:
            (event,) = opened.run(run_id).events(kinds=["annotation"])
        path = root / "proof.json"
        made = invoke(
            "prove", run_id, "--seq", str(event["seq"]), "-o", str(path), "--store", str(store)
        )
        assert made.exit_code == 0, made.stderr
    return json.loads(path.read_text()), key.public_path


def _check(document: Any, public: Path, tmp_path: Path) -> CliResult:
    path = tmp_path / "edited.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return invoke("verify-proof", "--key", str(public), str(path))


@pytest.mark.parametrize(
    ("where", "value", "words"),
    [
        (("event", "step"), 0.75, "event.step must be an integer or null, not 0.75"),
        (("event", "step"), False, "event.step must be an integer or null, not False"),
        (("event", "seq"), True, "event.seq must be an integer, not True"),
        (("event", "stream"), "0", "event.stream must be an integer, not '0'"),
        (("event", "ts_ns"), 1.7e18, "event.ts_ns must be an integer"),
        (("event", "kind"), ["annotation"], "event.kind must be a string"),
        (("event", "snapshot"), 0, "event.snapshot must be a string or null"),
        (("event", "payload"), {"key": "dataset"}, "event.payload must be a string"),
        (("event", "payload"), "[1, 2]", "event.payload must be the JSON text of an object"),
        (
            ("event", "payload"),
            '{"a":' + nested(1000) + "}",
            "event.payload is nested more than 64 levels deep",
        ),
        (("leaf_index",), True, "leaf_index and tree_size must be integers"),
        (("tree_size",), 30.0, "leaf_index and tree_size must be integers"),
        (
            ("tree_head", "seq"),
            True,
            "tree_head is not a well-formed auditlog-checkpoint-v2 statement (seq",
        ),
        (("tree_head", "head_hash"), "A" * 64, "(head_hash must be 64 lowercase hex digits)"),
        (("tree_head", "ended"), 1, "(ended must be true or false)"),
        (
            ("audit_path",),
            ["0" * 63 + "g"],
            "audit_path must be a list of 64-digit lowercase hex hashes",
        ),
    ],
    ids=lambda v: str(v)[:24],
)
def test_a_proof_with_a_wrongly_typed_field_fails_in_one_line(
    proof: tuple[dict[str, Any], Path],
    tmp_path: Path,
    where: tuple[str, ...],
    value: Any,
    words: str,
) -> None:
    document, public = proof
    assert _check(document, public, tmp_path).exit_code == 0  # as made, it holds
    edited = json.loads(json.dumps(document))
    target = edited
    for part in where[:-1]:
        target = target[part]
    target[where[-1]] = value
    assert_one_line_error(_check(edited, public, tmp_path), 4, "does not hold", words)


def test_a_proof_nested_too_deep_is_not_a_proof(
    proof: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    _, public = proof
    assert_one_line_error(
        _check(nested(200_000), public, tmp_path), 1, "is not an auditlog proof (not JSON)"
    )
