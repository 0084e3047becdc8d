"""Property-based tests: the CLI on malformed arguments and malformed store files.

Whatever it is given, the CLI must answer with a documented exit code and at
most an ``Error:`` line: never a traceback, never the "internal error" line the
group prints for an exception nobody anticipated. Bad input must exit non-zero,
reading commands must leave the store byte-for-byte as they found it, and
``verify`` may only pass a store whose events are exactly the recorded ones.

Bounded (max_examples ~50 per property, no deadline) so the file runs in well
under 30 s; failures print a ``@reproduce_failure`` blob.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from auditlog.cli.options import FORMATS
from helpers import CliResult, invoke, tree_digest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from integrity_support import isolate_keys, record_run

from auditlog.core.kinds import KINDS
from auditlog.integrity.checkpoints import checkpoint_head
from auditlog.integrity.keys import generate_key_pair, load_private_key
from auditlog.store.eventstore import EventStore

FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
EXIT_CODES = {0, 1, 2, 3, 4}
READING = (("runs",), ("events",), ("verify",), ("verify", "all"), ("db", "current"))


# --------------------------------------------------------------------------- fixtures and oracles
@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A real recorded store with a signed checkpoint of its head, WAL folded back.

    The checkpoint is what lets ``verify`` see the newest events deleted, so the
    property "verify fails exactly when the events changed" holds for every edit.
    """
    root = tmp_path_factory.mktemp("pristine")
    path = root / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        run_id = record_run(path, steps=2, name="fuzzed")
    key = generate_key_pair(root / "team.key").private_path
    event_store = EventStore.open(str(path))
    try:
        checkpoint_head(event_store, load_private_key(key), run_id, 0)
    finally:
        event_store.close()
    conn = sqlite3.connect(path / "events.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path, run_id


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pristine: tuple[Path, str]) -> None:
    """The team key is the default key: ``verify`` trusts the pristine store's checkpoint."""
    isolate_keys(monkeypatch, tmp_path)
    monkeypatch.setenv("AUDITLOG_KEY", str(pristine[0].parent / "team.key"))


@contextmanager
def copy_of(pristine: Path) -> Iterator[Path]:
    """A private copy of the pristine store, removed afterwards (one per example)."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        shutil.copytree(pristine, root / "store")
        yield root / "store"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def assert_clean(result: CliResult, args: tuple[str, ...]) -> None:
    """A documented exit code and no crash, whatever the input."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, (args, output)
    assert "internal error" not in result.stderr, (args, result.stderr)
    assert result.exit_code in EXIT_CODES, (args, result.exit_code, output)
    if result.exit_code != 0:
        assert any(line.startswith("Error: ") for line in result.stderr.split("\n")), (
            args,
            result.stderr,
        )


def run(store: Path, *args: str) -> CliResult:
    result = invoke(*args, "--store", str(store))
    assert_clean(result, args)
    return result


def events_dump(db: Path) -> list[tuple[Any, ...]] | None:
    """Every stored event, read without touching the file; None when SQLite cannot read it."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
        try:
            return conn.execute("select * from events order by id").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return None


def read_everything(
    store: Path, commands: tuple[tuple[str, ...], ...] = READING
) -> dict[tuple[str, ...], CliResult]:
    """Run reading commands; each must leave every file of the store as it was."""
    before = tree_digest(store)
    results = {}
    for command in commands:
        results[command] = run(store, *command)
        assert tree_digest(store) == before, f"`{' '.join(command)}` changed the store"
    return results


# --------------------------------------------------------------------------- malformed arguments
@FUZZ
@given(selector=st.text(max_size=40).filter(lambda s: not s.startswith("-")))
def test_random_run_selectors(pristine: tuple[Path, str], selector: str) -> None:
    store, run_id = pristine
    known = selector in ("latest", "latest~0", "fuzzed") or (
        selector != "" and run_id.startswith(selector.lower())
    )
    before = tree_digest(store)
    for command in ("events", "verify"):
        result = run(store, command, selector)
        assert (result.exit_code == 0) == known, (command, selector, result.stderr)
        if not known:
            assert result.exit_code == 1, (command, selector, result.stderr)
    assert tree_digest(store) == before


_DIGITS = st.integers(min_value=0, max_value=10**6).map(str)
_VALID_STEPS = st.one_of(
    _DIGITS,
    st.tuples(st.integers(0, 50), st.integers(0, 50)).map(lambda t: f"{min(t)}:{max(t)}"),
    _DIGITS.map(lambda d: f"{d}:"),
    _DIGITS.map(lambda d: f":{d}"),
    st.just(":"),
)
_INVALID_STEPS = st.one_of(
    st.just(""),
    st.integers(min_value=1, max_value=10**6).map(lambda n: f"-{n}"),
    st.tuples(st.integers(1, 50), st.integers(0, 49))
    .filter(lambda t: t[0] > t[1])
    .map(lambda t: f"{t[0]}:{t[1]}"),
    st.tuples(_DIGITS, _DIGITS, _DIGITS).map(":".join),
    st.text(alphabet="abcxyz.,;/_+e", min_size=1, max_size=8).map(lambda t: "1" + t),
)


@FUZZ
@given(step=_VALID_STEPS)
def test_valid_step_ranges_are_accepted(pristine: tuple[Path, str], step: str) -> None:
    """A well-formed range is answered, unless it starts after the run's last step
    (2 here): then it is an error naming that step, the rule of every command."""
    result = run(pristine[0], "events", "--step", step, "--format", "json")
    low = step.split(":")[0]
    if low and int(low) > 2:
        assert result.exit_code == 2, (step, result.stderr)
        assert (
            result.stderr
            == f"Error: run {pristine[1][:12]} has no step {int(low)} (it recorded steps 0..2)\n"
        )
    else:
        assert result.exit_code == 0, (step, result.stderr)


@FUZZ
@given(step=_INVALID_STEPS)
def test_malformed_step_ranges_are_usage_errors(pristine: tuple[Path, str], step: str) -> None:
    result = run(pristine[0], "events", "--step", step)
    assert result.exit_code == 2, (step, result.stdout, result.stderr)
    assert "bad step range" in result.stderr


@FUZZ
@given(step=st.text(max_size=12).filter(lambda s: not s.startswith("-")))
def test_arbitrary_step_text_never_crashes(pristine: tuple[Path, str], step: str) -> None:
    result = run(pristine[0], "events", "--step", step)
    assert result.exit_code in (0, 2), (step, result.stderr)


@FUZZ
@given(
    kind=st.one_of(st.sampled_from(sorted(KINDS)), st.text(max_size=30)),
    fmt=st.one_of(st.sampled_from(FORMATS), st.text(max_size=8)),
)
def test_kinds_and_formats(pristine: tuple[Path, str], kind: str, fmt: str) -> None:
    assume(not kind.startswith("-") and not fmt.startswith("-"))
    result = run(pristine[0], "events", "--kind", kind, "--format", fmt, "--limit", "3")
    good = kind in KINDS and fmt in FORMATS
    assert (result.exit_code == 0) == good, (kind, fmt, result.stderr)
    if not good:
        assert result.exit_code == 2, (kind, fmt, result.stderr)
    verify = run(pristine[0], "verify", "--format", fmt)
    assert (verify.exit_code == 0) == (fmt in FORMATS), (fmt, verify.stderr)


VOCABULARY = [
    "--kind",
    "--step",
    "--limit",
    "--format",
    "--module",
    "--key",
    "--against",
    "-o",
    "--bogus",
    "--",
    "all",
    "latest",
    "latest~1",
    "latest~x",
    "json",
    "csv",
    "table",
    "yaml",
    "0",
    "-1",
    "1:0",
    "::",
    "forward",
    "run_started",
    "*",
    "body.*",
    "[",
    "nope",
    "",
]


@FUZZ
@given(
    command=st.sampled_from(
        [("runs",), ("events",), ("verify",), ("db", "current"), ("export-head",), ("checkpoint",)]
    ),
    soup=st.lists(st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=10)), max_size=7),
)
def test_option_soup(pristine: tuple[Path, str], command: tuple[str, ...], soup: list[str]) -> None:
    """Random option/value sequences: documented exit codes, one error line, store untouched.

    No key is configured here, so the signing commands fail before they could
    write anything.
    """
    assume("--store" not in soup)
    os.environ.pop("AUDITLOG_KEY", None)  # restored by the fixture's monkeypatch
    store = pristine[0]
    before = tree_digest(store)
    result = invoke(*command, "--store", str(store), *soup)
    assert_clean(result, (*command, *soup))
    if "--bogus" in soup:
        at = soup.index("--bogus")
        consumed = at > 0 and soup[at - 1] in ("--module",)
        if not consumed:
            assert result.exit_code != 0, (command, soup, result.stdout)
    if command[0] in ("export-head", "checkpoint") and "-h" not in soup and "--help" not in soup:
        assert result.exit_code != 0
    assert tree_digest(store) == before
    assert not [p for p in Path.cwd().iterdir() if p.name not in ("config",)], "a file was written"


# --------------------------------------------------------------------------- malformed store files
# Every store property runs twice: once for the integrity commands plus
# `db current`, once for `runs` and `events`.
STRICT = (("verify",), ("verify", "all"), ("db", "current"))
OTHERS = (("runs",), ("events",), ("events", "--format", "json"))
NO_SHRINK = settings(FUZZ, max_examples=25, phases=[Phase.explicit, Phase.generate])


def groups(test: Any) -> Any:
    """Parametrize a store property over the two command groups."""
    return pytest.mark.parametrize(
        "commands",
        [
            pytest.param(STRICT, id="verify-db"),
            pytest.param(OTHERS, id="runs-events"),
        ],
    )(test)


def settings_for(commands: tuple[tuple[str, ...], ...]) -> settings:
    return FUZZ if commands is STRICT else NO_SHRINK


@FUZZ
@given(
    data=st.one_of(
        st.binary(max_size=3000), st.binary(max_size=3000).map(lambda b: b"SQLite format 3\x00" + b)
    )
)
def test_random_bytes_as_events_db(tmp_path: Path, data: bytes) -> None:
    """Not a database at all (or only its header): every reading command refuses it (exit 3)."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        store = root / "store"
        store.mkdir()
        (store / "events.db").write_bytes(data)
        for command, result in read_everything(store, STRICT + OTHERS).items():
            assert result.exit_code == 3, (command, data[:40], result.stderr)
    finally:
        shutil.rmtree(root)


@groups
def test_truncated_events_db(
    pristine: tuple[Path, str], commands: tuple[tuple[str, ...], ...]
) -> None:
    @settings_for(commands)
    @given(fraction=st.floats(min_value=0.0, max_value=0.999))
    def check(fraction: float) -> None:
        with copy_of(pristine[0]) as store:
            db = store / "events.db"
            data = db.read_bytes()
            db.write_bytes(data[: int(len(data) * fraction)])
            for command, result in read_everything(store, commands).items():
                # `db current` reads only the schema revision, which may survive the cut
                if command != ("db", "current"):
                    assert result.exit_code != 0, (command, fraction, result.stdout)

    check()


@groups
def test_garbled_bytes_in_events_db(
    pristine: tuple[Path, str], commands: tuple[tuple[str, ...], ...]
) -> None:
    """Overwrite random bytes of a real store. ``verify`` may pass only if every event is as recorded."""
    original = events_dump(pristine[0] / "events.db")
    assert original

    @settings_for(commands)
    @given(
        edits=st.lists(
            st.tuples(
                st.floats(min_value=0.0, max_value=0.9999), st.integers(min_value=0, max_value=255)
            ),
            min_size=1,
            max_size=8,
        )
    )
    def check(edits: list[tuple[float, int]]) -> None:
        with copy_of(pristine[0]) as store:
            db = store / "events.db"
            data = bytearray(db.read_bytes())
            # Page 1 (the header and sqlite_master) is left alone here; it has its own
            # test (test_garbled_schema_page_is_refused).
            page = int.from_bytes(data[16:18], "big")
            for where, value in edits:
                data[page + int(where * (len(data) - page))] = value
            db.write_bytes(bytes(data))
            results = read_everything(store, commands)
            for command in (("verify",), ("verify", "all")):
                if command in results and results[command].exit_code == 0:
                    assert events_dump(db) == original, (
                        f"`{' '.join(command)}` passed a changed record"
                    )

    check()


def test_verify_never_passes_a_store_whose_table_and_index_disagree(
    pristine: tuple[Path, str],
) -> None:
    """Garble the run id inside stored rows and index entries, one copy of the id at a time.

    Found by the property above: a byte changed in a table row (not in the index)
    left a chain that verified through the index while a table scan saw another
    run id. SQLite's integrity check in ``verify`` refuses such a file (exit 3).
    """
    store_path, run_id = pristine
    original = events_dump(store_path / "events.db")
    data = (store_path / "events.db").read_bytes()
    needle = run_id.encode()
    places = [i for i in range(len(data)) if data.startswith(needle, i)]
    assert len(places) > 10  # in the runs table, the events table and the unique index
    refused = 0
    for at in places[:: max(1, len(places) // 20)]:
        with copy_of(store_path) as store:
            db = store / "events.db"
            garbled = bytearray(data)
            garbled[at + 3] = 0
            db.write_bytes(bytes(garbled))
            result = run(store, "verify")
            if result.exit_code == 0:
                assert events_dump(db) == original, (
                    f"verify passed a changed record (byte {at + 3})"
                )
            refused += result.exit_code == 3
    assert refused > 0  # some of these really are table/index disagreements


_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_COLUMNS = [
    "run_id",
    "stream",
    "seq",
    "ts_ns",
    "kind",
    "step",
    "module_id",
    "tensor_id",
    "payload",
    "hash",
]
_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("delete"), st.integers(min_value=1, max_value=40)),
        st.tuples(
            st.just("garble"),
            st.integers(min_value=1, max_value=40),
            st.sampled_from(_COLUMNS),
            _VALUES,
        ),
    ),
    min_size=1,
    max_size=4,
)


@contextmanager
def edited_copy(
    pristine: tuple[Path, str], operations: list[tuple[Any, ...]]
) -> Iterator[tuple[Path, bool]]:
    """A copy of the store with ``operations`` applied; yields it and whether any event changed."""
    store_path, run_id = pristine
    original = events_dump(store_path / "events.db")
    with copy_of(store_path) as store:
        db = store / "events.db"
        conn = sqlite3.connect(db)
        for op in operations:
            try:
                if op[0] == "delete":
                    conn.execute("delete from events where run_id=? and seq=?", (run_id, op[1]))
                else:
                    _, seq, column, value = op
                    conn.execute(
                        f"update events set {column}=? where run_id=? and seq=?",
                        (value, run_id, seq),
                    )
            except sqlite3.IntegrityError:
                pass  # NOT NULL / UNIQUE refused the edit: nothing changed
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        yield store, events_dump(db) != original


@groups
def test_deleted_and_garbled_rows(
    pristine: tuple[Path, str], commands: tuple[tuple[str, ...], ...]
) -> None:
    """Rows deleted or columns set to any SQLite value: verify fails (4) exactly when events changed."""

    @settings_for(commands)
    @given(operations=_OPERATIONS)
    def check(operations: list[tuple[Any, ...]]) -> None:
        with edited_copy(pristine, operations) as (store, changed):
            results = read_everything(store, commands)
        for command, result in results.items():
            if command[0] != "verify":
                continue
            if changed:
                assert result.exit_code == 4, (command, operations, result.stdout, result.stderr)
                assert result.stderr.startswith("Error: record altered: run "), result.stderr
            else:
                assert result.exit_code == 0, (command, operations, result.stderr)

    check()


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_garbled_schema_page_is_refused(
    pristine: tuple[Path, str], command: tuple[str, ...]
) -> None:
    """A byte of a table name in sqlite_master made invalid UTF-8: refused as corrupt (3), no crash."""
    with copy_of(pristine[0]) as store:
        db = store / "events.db"
        data = bytearray(db.read_bytes())
        page = int.from_bytes(data[16:18], "big")
        at = data.find(b"auditlog_meta", 100, page)
        assert at > 0
        data[at + 3] = 0x80
        db.write_bytes(bytes(data))
        result = run(store, *command)
        assert result.exit_code == 3, result.stderr


# Rows the properties above once found crashing `runs`/`events` (now refused or
# tolerated with a one-line error); kept as fixed regression cases.
GARBLED_CRASHES = [
    ("runs", "run_started", "payload", "[]"),  # runs.list_runs: meta.get on a non-object payload
    ("runs", "run_started", "payload", "abc"),  # runs.list_runs: json.loads on non-JSON payload
    ("runs", "optimizer_step", "step", "abc"),  # EventStore.run_event_counts: int(max(step))
    ("events", "run_started", "payload", "abc"),  # reader.Run.events: json.loads
    ("events", "parameter_registered", "payload", "{}"),  # replay: KeyError 'name'
    ("events", "module_registered", "module_id", "abc"),  # replay: int() of a text id
    ("events --format json", "run_started", "ts_ns", "abc"),  # runs.iso: str / float
    # The only run_started garbled: no run is left in the chain, and verify (latest)
    # once answered "no runs yet" with exit 1 instead of naming the event (found by
    # test_deleted_and_garbled_rows).
    ("runs", "run_started", "ts_ns", 1.5),
    ("runs", "run_started", "ts_ns", b"\x00"),
]


@pytest.mark.parametrize("command, kind, column, value", GARBLED_CRASHES, ids=lambda v: str(v))
def test_reading_commands_survive_a_garbled_row(
    pristine: tuple[Path, str], command: str, kind: str, column: str, value: object
) -> None:
    store_path, run_id = pristine
    with copy_of(store_path) as store:
        conn = sqlite3.connect(store / "events.db")
        (seq,) = conn.execute(
            "select min(seq) from events where run_id=? and kind=?", (run_id, kind)
        ).fetchone()
        assert seq is not None
        conn.execute(f"update events set {column}=? where run_id=? and seq=?", (value, run_id, seq))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        # verify (this task's) names the garbled event whatever the other commands do
        result = run(store, "verify")
        assert result.exit_code == 4 and f"seq {seq}" in result.stderr
        run(store, *command.split())


def test_the_fuzzed_store_itself_reads_cleanly(pristine: tuple[Path, str]) -> None:
    """Control: the unaltered store passes every reading command (so failures above mean something)."""
    with copy_of(pristine[0]) as store:
        results = read_everything(store)
    assert all(r.exit_code == 0 for r in results.values()), {
        c: r.stderr for c, r in results.items()
    }
    assert "1 signed checkpoint(s): intact" in results[("verify",)].stdout
