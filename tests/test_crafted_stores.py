"""Any store, however crafted, gets an answer (issue 29, part 4): every read command on
every crafted store of ``crafted_support.CASES``.

Each command answers with its documented exit code and, when it fails, one
``Error:`` line, within ``COMMAND_SECONDS``: never a hang, a traceback, an
"internal error", C++ text, or a file outside the store opened (the targets
outside are FIFOs that would hang the reader, or an exact copy that a reader
following a link would accept). Cases that would hang a reader run their
commands in one subprocess (for all of them); the others in this process, on
one crafted copy per case.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from crafted_support import (
    CASES,
    COMMAND_SECONDS,
    COMMANDS,
    Answer,
    Case,
    Command,
    Layout,
    Pristine,
    answer,
    answers,
    check_answer,
    copy_store,
    record_pristine,
    target,
)
from helpers import invoke, run_auditlog


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    root = tmp_path_factory.mktemp("pristine")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("XDG_CONFIG_HOME", str(root / "config"))
        mp.delenv("AUDITLOG_KEY", raising=False)
        mp.delenv("AUDITLOG_STORE", raising=False)
        return record_pristine(root)


@pytest.fixture(scope="module")
def crafted(
    pristine: Pristine, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Case], Layout]:
    """One crafted copy per case, made on first use and shared by its commands."""
    made: dict[str, Layout] = {}

    def get(case: Case) -> Layout:
        if case.name not in made:
            layout = copy_store(pristine, tmp_path_factory.mktemp(case.name))
            case.craft(layout, pristine)
            made[case.name] = layout
        return made[case.name]

    return get


@pytest.fixture(scope="module")
def in_subprocess(
    pristine: Pristine, crafted: Callable[[Case], Layout]
) -> Callable[[Case], dict[str, Answer]]:
    """Every command's answer on each case that would hang a reader, from one subprocess
    for all of them (asked for on first use)."""
    found: dict[str, dict[str, Answer]] = {}

    def get(case: Case) -> dict[str, Answer]:
        if not found:
            found.update(answers({c.name: crafted(c) for c in HANGING}, pristine))
        return found[case.name]

    return get


def _by_name(item: Case | Command) -> str:
    return item.name


IN_PROCESS = [c for c in CASES if not c.hangs]
HANGING = [c for c in CASES if c.hangs]


@pytest.mark.parametrize("command", COMMANDS, ids=_by_name)
@pytest.mark.parametrize("case", IN_PROCESS, ids=_by_name)
def test_a_read_command_answers_a_crafted_store(
    case: Case, command: Command, pristine: Pristine, crafted: Callable[[Case], Layout]
) -> None:
    check_answer(answer(command, pristine, crafted(case)), command.codes[case.kind])


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=_by_name)
@pytest.mark.parametrize("case", HANGING, ids=_by_name)
def test_a_read_command_answers_a_store_that_would_hang_a_reader(
    case: Case, command: Command, in_subprocess: Callable[[Case], dict[str, Answer]]
) -> None:
    check_answer(in_subprocess(case)[command.name], command.codes[case.kind])


@pytest.mark.parametrize("case", [c for c in CASES if c.kind != "pristine"], ids=_by_name)
def test_verify_names_the_event_and_what_is_wrong(
    case: Case,
    pristine: Pristine,
    crafted: Callable[[Case], Layout],
    in_subprocess: Callable[[Case], dict[str, Answer]],
) -> None:
    verify = next(c for c in COMMANDS if c.name == "verify")
    layout = crafted(case)
    got = in_subprocess(case)["verify"] if case.hangs else answer(verify, pristine, layout)
    check_answer(got, 4)
    event_id, sha = target(Path(pristine.store), pristine.r1)
    line = got.stderr.strip()
    assert (
        line.startswith("Error: record altered: ") and f"(event id {event_id}, snapshot)" in line
    ), line
    assert "snapshot of 0.weight" in line and case.finding in line, line
    if case.kind == "file":
        assert f"snapshots/{sha[:2]}/{sha}.parquet" in line, line
    else:  # no file is named for a value that is not a content hash
        assert ".parquet" not in line and "not a content hash" in line, line


def test_the_traps_outside_the_store_were_never_opened(
    pristine: Pristine,
    crafted: Callable[[Case], Layout],
    in_subprocess: Callable[[Case], dict[str, Answer]],
) -> None:
    """Every command answered on the cases whose damage leads to a FIFO (an open of it
    would have hung the command), and the FIFOs are still there, unreplaced."""
    traps = 0
    for case in HANGING:
        layout = crafted(case)
        got = in_subprocess(case)
        assert all(a.code != -2 for a in got.values()), case.name
        for trap in [
            *layout.outside.iterdir(),
            *layout.store.joinpath("snapshots").rglob("*.parquet"),
        ]:
            traps += stat.S_ISFIFO(trap.lstat().st_mode)
    assert traps == len(HANGING)  # one FIFO per case, none opened and replaced


# --------------------------------------------------------------------------- after the cache verified a file
def test_a_verified_file_swapped_for_a_link_to_its_copy_is_left_out_of_tensor_values(
    pristine: Pristine, tmp_path: Path
) -> None:
    """The query cache trusts a verified file while its identity holds; the identity is
    the path's own (``lstat``), so a link in its place, even to the very same bytes
    moved elsewhere, is a change, and the link is never followed."""
    layout = copy_store(pristine, tmp_path / "swapped")
    query = next(c for c in COMMANDS if c.name == "query_values")
    before = answer(query, pristine, layout)
    check_answer(before, 0)
    _, sha = target(layout.store, pristine.r1)
    path = layout.store / "snapshots" / sha[:2] / f"{sha}.parquet"
    moved = layout.outside / path.name
    path.rename(moved)
    path.symlink_to(moved)
    after = answer(query, pristine, layout)
    check_answer(after, 0)
    assert (
        json.loads(after.stdout)[0]["n"] == json.loads(before.stdout)[0]["n"] - 32
    )  # 0.weight: 8 x 4
    assert f"warning: snapshot {sha[:16]}... left out of tensor_values" in after.stderr, (
        after.stderr
    )
    assert "changed since it was verified" in after.stderr, after.stderr


# --------------------------------------------------------------------------- archives
@pytest.fixture(scope="module")
def archive(pristine: Pristine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("archive") / "r1"
    done = invoke("export", pristine.r1, "--to", str(directory), "--store", str(pristine.store))
    assert done.exit_code == 0, done.stderr
    return directory


def _archive_copy(archive: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "area" / "archive"
    shutil.copytree(archive, copy)
    (tmp_path / "outside").mkdir()
    return copy


def _verify_archive(directory: Path) -> Answer:
    """``verify --archive`` in a subprocess: a reader stopped by a FIFO times out there."""
    started = time.monotonic()
    try:
        done = run_auditlog("verify", "--archive", str(directory), timeout=COMMAND_SECONDS)
    except subprocess.TimeoutExpired:
        return Answer("verify --archive", -2, "", "hung", COMMAND_SECONDS)
    return Answer(
        "verify --archive", done.returncode, done.stdout, done.stderr, time.monotonic() - started
    )


def test_an_archive_with_a_fifo_for_a_tensor_file_is_refused_without_hanging(
    archive: Path, tmp_path: Path
) -> None:
    copy = _archive_copy(archive, tmp_path)
    tensor = next((copy / "tensors").rglob("*.parquet"))
    tensor.unlink()
    os.mkfifo(tensor)
    got = _verify_archive(copy)
    check_answer(got, 4)
    assert "not a regular file (a FIFO)" in got.stdout + got.stderr


def test_an_archive_whose_manifest_lists_a_path_outside_it_is_refused_unread(
    archive: Path, tmp_path: Path
) -> None:
    """The manifest's own digest is recomputed (the published function), so only the
    path check stands between the reader and ``outside/x.parquet``, a FIFO."""
    from auditlog.archive.write import manifest_digest

    copy = _archive_copy(archive, tmp_path)
    os.mkfifo(tmp_path / "outside" / "x.parquet")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"].append({"path": "../../outside/x.parquet", "sha256": "0" * 64, "bytes": 0})
    manifest["digest"] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "manifest.sig").unlink(missing_ok=True)
    got = _verify_archive(copy)
    check_answer(got, 4)
    assert "'../../outside/x.parquet': not a path inside the archive" in got.stdout + got.stderr


# --------------------------------------------------------------------------- the two checks, directly
@pytest.mark.parametrize(
    "value",
    [
        "ab\x00" + "c" * 61,
        {"a": 1},
        ["a"],
        7,
        None,
        "../../x",
        "/etc/passwd",
        "A" * 64,
        "a" * 63,
        "a" * 64 + "\n",
        "g" * 64,
        "a" * 65,
    ],
)
def test_only_64_lowercase_hex_characters_name_a_snapshot_file(value: object) -> None:
    from auditlog.store.blobpaths import SnapshotError, relpath

    with pytest.raises(
        SnapshotError, match=r"is not a content hash \(64 lowercase hex characters\)"
    ):
        relpath(value)
    assert relpath("0123456789abcdef" * 4) == f"01/{'0123456789abcdef' * 4}.parquet"


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.int8])
def test_the_densest_files_the_writer_makes_are_within_the_expansion_bound(
    dtype: torch.dtype, tmp_path: Path
) -> None:
    """All-zero integer and boolean tensors compress the most (zstd): they must still
    read back, bitwise, under ``blobshape.MAX_EXPANSION`` (measured: ~3,000x)."""
    from auditlog.store.blobs import SnapshotStore
    from auditlog.store.blobshape import MAX_EXPANSION

    files = SnapshotStore(tmp_path / "snapshots")
    zeros = torch.zeros(8 * 1024 * 1024, dtype=dtype)
    info = files.put(zeros)
    size = files.path(info.sha256).stat().st_size
    assert (
        info.nbytes > 100 * size and info.nbytes < size * MAX_EXPANSION / 100
    )  # dense, and far from the bound
    assert torch.equal(files.read_verified(info.sha256, "zeros"), zeros)


def test_the_bill_of_materials_never_presents_a_crafted_value_as_a_content_hash(
    pristine: Pristine, crafted: Callable[[Case], Layout]
) -> None:
    case = next(c for c in CASES if c.name == "hash_with_a_nul")
    layout = crafted(case)
    bom = next(c for c in COMMANDS if c.name == "bom_json")
    check_answer(answer(bom, pristine, layout), 0)
    facts = json.loads((layout.out / "bom.json").read_text())
    text = json.dumps(facts)
    assert "ab\\u0000ccc" not in text and "\\u0000" not in text
    assert "not a content hash (record edited): 0.weight" in text
