"""Crafted stores (issue 29, part 4): a corpus of damaged copies of one real store, and
every read command run against each, which must answer.

Three lists, each meant to grow:

- ``CASES``: each ``Case`` damages a copy of the pristine store using only
  the documented format and plain tools (``os``, ``sqlite3``, ``pyarrow``; event
  hashes recomputed with the published chain function, as
  ``forgery_support`` does), so that what it tests is what an attacker with
  write access to the store can do. ``kind`` says what it damages
  (``file``: a snapshot file; ``hash``: the content hash an event names);
  ``hangs`` marks a case whose damage stops a reader that opens it (a FIFO):
  its commands run in a subprocess with a timeout, never in the test process.
  Payload cases (a deep or huge payload) add a kind of their own with
  ``add_case`` and give each command its code for it in ``Command.codes``.
- ``COMMANDS``: every read command with arguments, and the exit code it
  documents for each kind of damage (``pristine`` for the untouched copy).
- ``answer`` / ``answers``: run a command in-process (Click's runner, the
  Python API called directly), or every command of several cases in one
  subprocess (``python crafted_support.py``), under timeouts; ``check_answer``
  asserts: the documented exit code, one ``Error:`` line when it fails, no
  traceback, no "internal error", no C++ text.

Reads outside the store are caught by what lies outside it (``Layout``):
the targets a crafted hash or link would reach are FIFOs, which block any
reader that opens them (the command then times out), and a link points at an
exact copy of the file it replaces, which a reader that followed it would
accept (the command would then exit 0 where it must exit 4).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from auditlog.core.eventrow import HASHED_COLUMNS

TESTS = Path(__file__).resolve().parent
CHAINED = HASHED_COLUMNS  # the canonical row of the current chain format
COMMAND_SECONDS = 30  # a command still running after this long has hung (a real answer takes 1-5 s)


# --------------------------------------------------------------------------- the pristine store
@dataclass(frozen=True)
class Pristine:
    """The recorded store every case copies, and what the commands need to name."""

    store: Path
    r1: str
    r2: str
    public_key: Path
    private_key: Path


@dataclass(frozen=True)
class Layout:
    """One case's directory: ``area/store`` (the copy), ``outside/`` (what no reader may
    open), ``out/`` (where commands write)."""

    root: Path

    @property
    def store(self) -> Path:
        return self.root / "area" / "store"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def out(self) -> Path:
        return self.root / "out"


def record_pristine(root: Path) -> Pristine:
    """Two small real training runs (4 optimizer steps, ``snapshot_every=2``, different
    seeds), both checkpointed with a key made here (``prove`` needs a signed head, and
    ``verify --key`` a signature on every stream)."""
    import torch
    from helpers import invoke
    from torch import nn

    import auditlog
    from auditlog.integrity.keys import generate_key_pair

    store = root / "store"
    ids = []
    for seed in (0, 1):
        with auditlog.record(store=store, name=f"r{seed + 1}", snapshot_every=2) as run:
            torch.manual_seed(seed)
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(4):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        assert run.run_id is not None
        ids.append(run.run_id)
    key = generate_key_pair(root / "keys" / "signing_key")
    signed = invoke("checkpoint", "all", "--key", str(key.private_path), "--store", str(store))
    assert signed.exit_code == 0, signed.stderr
    fold_wal(store)
    return Pristine(store, ids[0], ids[1], key.public_path, key.private_path)


def fold_wal(store: Path) -> None:
    """Fold SQLite's write-ahead log back into ``events.db`` so that a copy is whole."""
    conn = sqlite3.connect(store / "events.db")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def copy_store(pristine: Pristine, root: Path) -> Layout:
    """A fresh copy of the pristine store in a new ``Layout`` (no read model: each case builds its own)."""
    layout = Layout(root)
    layout.store.parent.mkdir(parents=True)
    layout.outside.mkdir()
    layout.out.mkdir()
    shutil.copytree(
        pristine.store, layout.store, ignore=shutil.ignore_patterns("readmodel.duckdb*")
    )
    return layout


# --------------------------------------------------------------------------- crafting
def _payloads(store: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(store / "events.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("select * from events order by run_id, stream, seq")]
    finally:
        conn.close()


def target(store: Path, run_id: str) -> tuple[int, str]:
    """The event id and content hash every case damages: the first tensor of ``run_id``'s
    construction seal (``0.weight`` at step 0, which ``restore --step 0`` and
    ``diff --values`` read)."""
    for row in _payloads(store):
        if row["run_id"] == run_id and row["kind"] == "construction_sealed":
            return int(row["id"]), str(json.loads(row["payload"])["tensors"][0]["sha256"])
    raise AssertionError("the pristine run has no construction seal")


def snapshot_file(store: Path, sha: str) -> Path:
    return store / "snapshots" / sha[:2] / f"{sha}.parquet"


def rewrite_events(store: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``edit`` to every event row, recompute every stream's chain from genesis with
    the published chain function, and delete the checkpoints of the runs whose chain
    changed: what a forger without the key does (such a run then reads as unsigned)."""
    from auditlog.core.chain import chain_hash, genesis_hash

    conn = sqlite3.connect(store / "events.db")
    try:
        key, prev = None, ""
        changed = set()
        for row in _payloads(store):
            if (row["run_id"], row["stream"]) != key:
                key = (row["run_id"], row["stream"])
                prev = genesis_hash(*key)
            before = row["hash"]
            edit(row)
            row["hash"] = prev = chain_hash(prev, {c: row[c] for c in CHAINED})
            if row["hash"] != before:
                changed.add(row["run_id"])
                conn.execute(
                    "update events set payload = ?, hash = ? where id = ?",
                    (row["payload"], row["hash"], row["id"]),
                )
        conn.executemany(
            "delete from checkpoints where run_id = ?", [(run_id,) for run_id in changed]
        )
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def set_target_hash(layout: Layout, pristine: Pristine, value: Any) -> None:
    """Make the target event name ``value`` as its first tensor's content hash."""
    from auditlog.core.chain import canonical_payload

    event_id, _ = target(layout.store, pristine.r1)

    def edit(row: dict[str, Any]) -> None:
        if row["id"] == event_id:
            payload = json.loads(row["payload"])
            payload["tensors"][0]["sha256"] = value
            row["payload"] = canonical_payload(payload)

    rewrite_events(layout.store, edit)


def rewrite_footer_shape(path: Path, shape: Any) -> None:
    """Rewrite a snapshot file with the same values and ``shape`` in its schema metadata."""
    table = pq.read_table(path)
    metadata = dict(table.schema.metadata or {})
    metadata[b"auditlog.shape"] = json.dumps(shape).encode()
    pq.write_table(table.replace_schema_metadata(metadata), path)


@dataclass(frozen=True)
class Case:
    """One crafted store: ``craft(layout, pristine)`` damages the copy in ``layout``."""

    name: str
    kind: str
    craft: Callable[[Layout, Pristine], None]
    hangs: bool = False
    finding: str = ""  # words the one-line error of ``verify`` must contain


def _target_file(layout: Layout, pristine: Pristine) -> Path:
    return snapshot_file(layout.store, target(layout.store, pristine.r1)[1])


def _fifo(layout: Layout, pristine: Pristine) -> None:
    path = _target_file(layout, pristine)
    path.unlink()
    os.mkfifo(path)


def _link_to_copy(layout: Layout, pristine: Pristine) -> None:
    """The file moved outside the store and a link left in its place: a reader that
    followed it would find exactly the right bytes."""
    path = _target_file(layout, pristine)
    moved = layout.outside / path.name
    shutil.move(path, moved)
    path.symlink_to(moved)


def _link_to_fifo(layout: Layout, pristine: Pristine) -> None:
    path = _target_file(layout, pristine)
    path.unlink()
    os.mkfifo(layout.outside / "trap.parquet")
    path.symlink_to(layout.outside / "trap.parquet")


def _directory(layout: Layout, pristine: Pristine) -> None:
    path = _target_file(layout, pristine)
    path.unlink()
    path.mkdir()


def _zero_length(layout: Layout, pristine: Pristine) -> None:
    _target_file(layout, pristine).write_bytes(b"")


def _truncated(layout: Layout, pristine: Pristine) -> None:
    path = _target_file(layout, pristine)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _shape(shape: Any) -> Callable[[Layout, Pristine], None]:
    return lambda layout, pristine: rewrite_footer_shape(_target_file(layout, pristine), shape)


def _hash(value: Any) -> Callable[[Layout, Pristine], None]:
    return lambda layout, pristine: set_target_hash(layout, pristine, value)


def _dotdot(layout: Layout, pristine: Pristine) -> None:
    """``../../outside/x``: as a path under ``snapshots/`` (``<h[:2]>/<h>.parquet``) it
    names ``outside/x.parquet``, a FIFO."""
    os.mkfifo(layout.outside / "x.parquet")
    set_target_hash(layout, pristine, "../../outside/x")


def _absolute(layout: Layout, pristine: Pristine) -> None:
    """``//<root>/outside/y``: as a path it is the absolute ``<root>/outside/y.parquet``, a FIFO."""
    os.mkfifo(layout.outside / "y.parquet")
    set_target_hash(layout, pristine, "/" + str(layout.outside / "y"))


def _upper(layout: Layout, pristine: Pristine) -> None:
    """The right hash in upper case, with a FIFO at the path it would name."""
    sha = target(layout.store, pristine.r1)[1].upper()
    trap = snapshot_file(layout.store, sha)
    trap.parent.mkdir(exist_ok=True)
    os.mkfifo(trap)
    set_target_hash(layout, pristine, sha)


def _newline(layout: Layout, pristine: Pristine) -> None:
    set_target_hash(layout, pristine, target(layout.store, pristine.r1)[1] + "\n")


CASES: list[Case] = [
    Case("pristine", "pristine", lambda layout, pristine: None),
    Case("fifo_for_a_file", "file", _fifo, hangs=True, finding="not a regular file (a FIFO)"),
    Case(
        "symlink_to_a_copy_outside",
        "file",
        _link_to_copy,
        finding="not a regular file (a symbolic link)",
    ),
    Case(
        "symlink_to_a_fifo_outside",
        "file",
        _link_to_fifo,
        hangs=True,
        finding="not a regular file (a symbolic link)",
    ),
    Case("directory_for_a_file", "file", _directory, finding="not a regular file (a directory)"),
    Case("zero_length_file", "file", _zero_length, finding="unreadable"),
    Case("truncated_file", "file", _truncated, finding="unreadable"),
    Case(
        "shape_of_2_to_the_96", "file", _shape([2**32] * 3), finding="more than any tensor can hold"
    ),
    Case(
        "shape_of_a_terabyte",
        "file",
        _shape([2**20, 2**20]),
        finding="holds 128 of 4398046511104 bytes",
    ),
    Case(
        "negative_dimension",
        "file",
        _shape([-8, -4]),
        finding="not a list of non-negative 64-bit integers",
    ),
    Case(
        "shape_of_floats_and_text",
        "file",
        _shape([8.5, "4"]),
        finding="not a list of non-negative 64-bit integers",
    ),
    Case("hash_with_a_nul", "hash", _hash("ab\x00" + "c" * 61), finding="'ab\\x00ccc"),
    Case(
        "hash_as_an_object",
        "hash",
        _hash({"path": "/etc/passwd"}),
        finding='\'<dict {"path":"/etc/passwd"}>\'',
    ),
    Case("hash_as_a_list", "hash", _hash(["a", "b"]), finding='\'<list ["a","b"]>\''),
    Case("hash_as_a_number", "hash", _hash(2**70), finding="'<int 1180591620717411303424>'"),
    Case("hash_climbing_out", "hash", _dotdot, hangs=True, finding="'../../outside/x'"),
    Case("hash_as_an_absolute_path", "hash", _absolute, hangs=True, finding="/outside/y'"),
    Case("hash_in_upper_case", "hash", _upper, hangs=True, finding="not a content hash"),
    Case("hash_with_a_trailing_newline", "hash", _newline, finding="\\n'"),
]


def add_case(case: Case) -> None:
    """Register another crafted store (another helper's payload cases): every command runs on it."""
    assert case.name not in {c.name for c in CASES}, case.name
    CASES.append(case)


# --------------------------------------------------------------------------- commands
@dataclass(frozen=True)
class Command:
    """A read command: CLI arguments (``{store}``, ``{out}``, ``{r1}``, ``{r2}``, ``{pub}``
    filled in), or ``api``, a call of the Python API; ``codes``: the documented exit code
    for each kind of case."""

    name: str
    argv: tuple[str, ...] = ()
    codes: dict[str, int] = field(default_factory=dict)
    api: Callable[[Pristine, Layout], str] | None = None
    then: tuple[
        str, ...
    ] = ()  # a second command run when the first exits 0 (verify-proof of prove's proof)


def _api_state_dict(pristine: Pristine, layout: Layout) -> str:
    import auditlog

    with auditlog.open(layout.store) as opened:
        state = opened.run(pristine.r1).state_dict(step=0)
    return f"{len(state)} tensors"


def _api_snapshots_and_verify(pristine: Pristine, layout: Layout) -> str:
    import auditlog

    with auditlog.open(layout.store) as opened:
        run = opened.run(pristine.r1)
        rows, stored = run.snapshots()
        report = run.verify()
    return f"{len(rows)} snapshots, {stored} bytes, intact={report.ok}"


_SNAPSHOT_READER = {
    "pristine": 0,
    "file": 4,
    "hash": 4,
}  # reads the damaged content: a damaged record
_RECORD_READER = {
    "pristine": 0,
    "file": 0,
    "hash": 0,
}  # reads events or the read model: answers, warns

COMMANDS: list[Command] = [
    Command("verify", ("verify", "{r1}", "--key", "{pub}"), _SNAPSHOT_READER),
    Command("verify_all", ("verify", "all", "--key", "{pub}"), _SNAPSHOT_READER),
    Command(
        "restore_torch",
        ("restore", "{r1}", "--step", "0", "-o", "{out}/state.pt"),
        _SNAPSHOT_READER,
    ),
    Command(
        "restore_safetensors",
        ("restore", "{r1}", "--step", "0", "-o", "{out}/state.safetensors"),
        _SNAPSHOT_READER,
    ),
    Command(
        "query_values",
        ("query", "--format", "json", "select count(*) as n, sum(value) as s from tensor_values"),
        _RECORD_READER,
    ),
    Command(
        "query_rebuilt",
        ("query", "--rebuild", "--run", "{r1}", "select count(*) from snapshots"),
        _RECORD_READER,
    ),
    Command("metrics", ("metrics", "{r1}"), _RECORD_READER),
    Command("report", ("report", "{r1}", "-o", "{out}/report.html"), _RECORD_READER),
    Command(
        "events",
        ("events", "{r1}", "--kind", "construction_sealed", "--format", "json"),
        _RECORD_READER,
    ),
    Command("tree", ("tree", "{r1}"), _RECORD_READER),
    Command("runs", ("runs",), _RECORD_READER),
    Command("snapshots", ("snapshots", "{r1}"), _RECORD_READER),
    Command("diff", ("diff", "{r1}", "{r2}"), _RECORD_READER),
    Command("diff_values", ("diff", "{r1}", "{r2}", "--values"), _SNAPSHOT_READER),
    Command("nonfinite", ("nonfinite", "{r1}"), _RECORD_READER),
    Command("data", ("data", "{r1}"), _RECORD_READER),
    Command("plot", ("plot", "{r1}", "param-norm", "--format", "csv"), _RECORD_READER),
    Command("export", ("export", "{r1}", "--to", "{out}/archive"), _SNAPSHOT_READER),
    Command(
        "bom_json",
        ("bom", "{r1}", "--step", "0", "--format", "json", "-o", "{out}/bom.json"),
        _RECORD_READER,
    ),
    Command(
        "bom_cyclonedx", ("bom", "{r1}", "--step", "0", "-o", "{out}/bom.cdx.json"), _RECORD_READER
    ),
    # a hash case rewrote the chain and lost the checkpoint: no signed head to prove from (exit 1)
    Command(
        "prove",
        ("prove", "{r1}", "--seq", "3", "-o", "{out}/proof.json"),
        {"pristine": 0, "file": 0, "hash": 1},
        then=("verify-proof", "{out}/proof.json", "--key", "{pub}"),
    ),
    Command("api_state_dict", codes=_SNAPSHOT_READER, api=_api_state_dict),
    Command("api_snapshots_and_verify", codes=_RECORD_READER, api=_api_snapshots_and_verify),
]


# --------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Answer:
    """What a command did: exit code (an API call: its error's code, 0 when it returned),
    stdout, stderr, seconds."""

    command: str
    code: int
    stdout: str
    stderr: str
    seconds: float


class Hung(BaseException):
    """A command ran past ``COMMAND_SECONDS`` (a BaseException: no ``except Exception`` hides it)."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupt the main thread with ``Hung`` after ``seconds`` (where Python code runs again)."""

    def fire(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _filled(argv: tuple[str, ...], pristine: Pristine, layout: Layout) -> list[str]:
    names = {
        "store": str(layout.store),
        "out": str(layout.out),
        "r1": pristine.r1,
        "r2": pristine.r2,
        "pub": str(pristine.public_key),
    }
    return [a.format(**names) for a in argv]


def _cli(argv: list[str], layout: Layout) -> tuple[int, str, str]:
    from helpers import invoke

    result = (
        invoke(*argv, "--store", str(layout.store)) if argv[0] != "verify-proof" else invoke(*argv)
    )
    return result.exit_code, result.stdout, result.stderr


def answer(command: Command, pristine: Pristine, layout: Layout) -> Answer:
    """Run ``command`` on the store in ``layout``, in this process, under ``deadline``."""
    from auditlog.core.errors import AuditlogError

    started = time.monotonic()
    with deadline(COMMAND_SECONDS):
        if command.api is not None:
            try:
                code, stdout, stderr = 0, command.api(pristine, layout), ""
            except AuditlogError as exc:
                code, stdout, stderr = exc.exit_code, "", f"Error: {exc}\n"
            except (
                Exception
            ) as exc:  # what the test reports: an API call must raise only AuditlogError
                code, stdout, stderr = -1, "", f"Traceback: {type(exc).__name__}: {exc}\n"
        else:
            code, stdout, stderr = _cli(_filled(command.argv, pristine, layout), layout)
            if code == 0 and command.then:
                code, more, stderr = _cli(_filled(command.then, pristine, layout), layout)
                stdout += more
    return Answer(command.name, code, stdout, stderr, time.monotonic() - started)


def answers(
    cases: dict[str, Layout], pristine: Pristine, timeout: float = 240
) -> dict[str, dict[str, Answer]]:
    """Every command of ``COMMANDS`` on each case's store (``case name -> layout``), all
    in one subprocess (``main``: one start, one import of torch), for the cases that
    would hang a reader. A command that never answers is killed with the process; it
    and every command after it are missing from the result, and their ``Answer`` says
    they hung."""
    first = next(iter(cases.values()))
    spec = first.root.parent / f"{first.root.name}.answers.json"
    results = spec.with_suffix(".jsonl")
    spec.write_text(
        json.dumps(
            {
                "pristine": {k: str(v) for k, v in vars(pristine).items()},
                "cases": {name: str(layout.root) for name, layout in cases.items()},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "AUDITLOG_STORE"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    try:
        subprocess.run(
            [sys.executable, str(Path(__file__)), str(spec), str(results)],
            env=env,
            cwd=first.root,
            timeout=timeout,
            capture_output=True,
            text=True,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pass
    found: dict[str, dict[str, Answer]] = {name: {} for name in cases}
    for line in results.read_text().splitlines() if results.exists() else []:
        data = json.loads(line)
        name = data.pop("case")
        found[name][data["command"]] = Answer(**data)
    for name in cases:
        for command in COMMANDS:
            if command.name not in found[name]:
                found[name][command.name] = Answer(
                    command.name, -2, "", f"hung: no answer within {timeout} s\n", timeout
                )
    return found


def main() -> None:
    """The subprocess of ``answers``: each case's commands in turn, each ``Answer``
    appended as one JSON line as soon as it is known."""
    spec, results = Path(sys.argv[1]), Path(sys.argv[2])
    data = json.loads(spec.read_text())
    raw = data["pristine"]
    pristine = Pristine(
        Path(raw["store"]), raw["r1"], raw["r2"], Path(raw["public_key"]), Path(raw["private_key"])
    )
    with results.open("a") as sink:
        for name, root in data["cases"].items():
            layout = Layout(Path(root))
            os.environ["XDG_CONFIG_HOME"] = str(layout.root / ".config")
            os.chdir(layout.root)
            for command in COMMANDS:
                try:
                    got = answer(command, pristine, layout)
                except Hung as exc:
                    got = Answer(command.name, -2, "", f"hung: {exc}\n", COMMAND_SECONDS)
                sink.write(json.dumps({"case": name, **vars(got)}) + "\n")
                sink.flush()


CPP_TEXT = ("frame #", "Exception raised from", "libc10", "c10::")


def check_answer(got: Answer, expected: int) -> None:
    """The command answered as documented: ``expected`` exit code; when it failed, exactly
    one ``Error: ...`` line on stderr; never a traceback, "internal error" or C++ text."""
    shown = f"{got.command}: exit {got.code} in {got.seconds:.1f} s\nstdout: {got.stdout[-2000:]}\nstderr: {got.stderr}"
    everything = got.stdout + got.stderr
    assert got.code != -2, f"hung\n{shown}"
    assert "Traceback" not in everything, shown
    assert "internal error" not in everything, shown
    assert not any(text in everything for text in CPP_TEXT), shown
    assert got.code == expected, f"expected exit {expected}\n{shown}"
    if expected != 0:
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), shown


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    main()
