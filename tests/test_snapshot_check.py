"""One way to check a snapshot file (issue 30), and files proven earlier in the process (issue 33).

``SnapshotStore`` is the entry point every reader asks; its check of a small file
whose exact bytes passed the check earlier in this process is answered from that
check, after the bytes are read and hashed again (``blobcheck.PROVEN``). These
tests make every tamper the full check catches *after* a first verdict, in the
same process (as between two requests of ``auditlog ui``), and require the same
findings as a process that checks everything afresh.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from helpers import invoke, tamper
from torch import nn

import auditlog
from auditlog.store.blobcheck import PROVEN, Proven
from auditlog.store.blobformat import BlobInfo, blob_from_row
from auditlog.store.blobs import SnapshotStore

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from auditlog.ui.app import create_app


def record(store: Path) -> str:
    torch.manual_seed(0)
    with auditlog.record(store, snapshot_every=1) as run:
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
    assert run.run_id is not None
    return run.run_id


def file_of(store: Path, tensor: str) -> tuple[str, Path]:
    """The content hash and file of ``tensor``'s value at the end of the run."""
    with auditlog.open(store) as opened:
        state = opened.run().model_state()
        tensor_id = dict(state.named_parameters(state.main_root()))[tensor]
        sha = state.tensors[tensor_id].snapshot_sha256
    assert sha is not None
    return sha, store / "snapshots" / sha[:2] / f"{sha}.parquet"


def findings(store: Path) -> list[str]:
    """``verify`` of the latest run in this process, as its problems read."""
    with auditlog.open(store) as opened:
        return [p.describe() for p in opened.run().verify().problems]


def afresh(store: Path) -> list[str]:
    """``findings`` with nothing proven in this process: every file checked in full."""
    PROVEN.clear()
    return findings(store)


def flip(path: Path, where: int) -> None:
    data = bytearray(path.read_bytes())
    data[where] ^= 0x01
    path.write_bytes(bytes(data))


def inside_values(store: Path, sha: str, path: Path) -> None:
    values = pq.read_table(path).column("value").to_numpy().tobytes()
    where = path.read_bytes().find(values)  # floats are stored as they are
    assert where > 0
    flip(path, where + len(values) // 2)


def outside_values(store: Path, sha: str, path: Path) -> None:
    where = path.read_bytes().find(b"parquet-cpp-arrow version")  # the writer's name
    assert where > 0
    flip(path, where)


def swapped(store: Path, sha: str, path: Path) -> None:
    _, other = file_of(store, "1.weight")  # another valid snapshot file, of another content
    shutil.copyfile(other, path)


def truncated(store: Path, sha: str, path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-9])


def linked(store: Path, sha: str, path: Path) -> None:
    """A symbolic link to the very bytes that were proven: refused unread all the same."""
    kept = store.parent / "outside.parquet"
    path.rename(kept)
    path.symlink_to(kept)


def fifo(store: Path, sha: str, path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def catalog_digest(store: Path, sha: str, path: Path) -> None:
    with tamper(store) as conn:
        conn.execute("update snapshot_blobs set file_sha256 = ? where sha256 = ?", ("0" * 64, sha))


def catalog_shape(store: Path, sha: str, path: Path) -> None:
    with tamper(store) as conn:
        conn.execute("update snapshot_blobs set shape = '[2, 6]' where sha256 = ?", (sha,))


TAMPERS: dict[str, tuple[Callable[[Path, str, Path], None], str]] = {
    "a byte inside the values": (inside_values, "does not match its name"),
    "a byte outside the values": (outside_values, "the file's bytes hash to"),
    "another valid snapshot file in its place": (swapped, "does not match its name"),
    "truncated": (truncated, "unreadable"),
    "a symbolic link to the same bytes": (linked, "not a regular file (a symbolic link)"),
    "a FIFO": (fifo, "not a regular file (a FIFO)"),
    "the catalog's digest edited": (catalog_digest, "the catalog recorded 00000000"),
    "the catalog's shape edited": (catalog_shape, "shape is [2, 6] in the catalog"),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_a_tamper_after_a_verdict_is_caught_as_a_fresh_check_catches_it(
    store: Path, name: str
) -> None:
    make, words = TAMPERS[name]
    record(store)
    sha, path = file_of(store, "0.weight")
    assert findings(store) == []  # every file checked in full, and proven
    misses = PROVEN.misses
    assert findings(store) == [] and PROVEN.hits > 0 and PROVEN.misses == misses  # recalled
    make(store, sha, path)
    warm = findings(store)  # in the same process, the proven files still remembered
    assert len(warm) == 1 and "0.weight" in warm[0] and words in warm[0], warm
    assert afresh(store) == warm  # word for word what a fresh check says
    result = invoke("verify", "--store", str(store))
    assert result.exit_code == 4 and words in result.stderr


def test_the_same_bytes_put_back_are_intact_again(store: Path) -> None:
    record(store)
    sha, path = file_of(store, "0.weight")
    original = path.read_bytes()
    assert findings(store) == []
    outside_values(store, sha, path)
    assert findings(store) != []
    path.write_bytes(original)
    hits = PROVEN.hits
    assert findings(store) == [] and PROVEN.hits > hits


def test_every_small_file_is_read_and_hashed_again_each_time(store: Path) -> None:
    """The second verdict opens every file: a file deleted after the first is missing."""
    record(store)
    _, path = file_of(store, "0.bias")
    assert findings(store) == []
    path.unlink()
    (found,) = findings(store)
    assert "0.bias" in found and "missing" in found


def test_a_large_file_is_checked_in_full_every_time(tmp_path: Path) -> None:
    """Over ``WHOLE_FILE_BYTES`` the check costs its bytes, not its overhead: nothing
    is remembered, and a changed value is found by the content hash each time."""
    files = SnapshotStore(tmp_path)
    info = files.put(torch.randn(1_200_000))  # 4.8 MB of float32
    path = files.path(info.sha256)
    assert files.check(info.sha256, info.as_row()) == []
    assert files.check(info.sha256, info.as_row()) == [] and len(PROVEN) == 0
    assert PROVEN.hits == 0
    values = pq.read_table(path).column("value").to_numpy()[1000:1100].tobytes()
    flip(path, path.read_bytes().find(values) + 3)
    (problem,) = files.check(info.sha256, info.as_row())
    assert "does not match its name" in problem


def test_a_file_proven_under_one_name_is_not_proven_under_another(tmp_path: Path) -> None:
    files = SnapshotStore(tmp_path)
    first, second = files.put(torch.zeros(4)), files.put(torch.ones(4))
    assert files.verify(first.sha256).file_sha256 == first.file_sha256
    shutil.copyfile(files.path(first.sha256), files.path(second.sha256))
    (problem,) = files.check(second.sha256, second.as_row())
    assert "does not match its name" in problem


def test_the_read_models_check_proves_the_files_the_verdict_then_recalls(store: Path) -> None:
    """The web UI's order: its first answer brings the read model up to date (every new
    snapshot file checked through the entry point), the verdict comes after."""
    record(store)
    assert (
        invoke("query", "--store", str(store), "select count(*) from tensor_values").exit_code == 0
    )
    proven, misses = len(PROVEN), PROVEN.misses
    assert proven > 0
    assert findings(store) == [] and PROVEN.misses == misses and PROVEN.hits >= proven


def test_the_web_uis_verdict_sees_an_edit_made_between_two_requests(store: Path) -> None:
    run_id = record(store)
    sha, path = file_of(store, "0.weight")
    original = path.read_bytes()
    with auditlog.open(store) as opened:
        client = TestClient(create_app(opened), base_url="http://127.0.0.1")
        first = client.get(f"/api/runs/{run_id}/verify").json()
        assert first["ok"] and first["assurance"] == "unsigned"
        swapped(store, sha, path)
        second = client.get(f"/api/runs/{run_id}/verify").json()
        command = invoke("verify", "--store", str(store), run_id)  # what the command says
        path.write_bytes(original)
        third = client.get(f"/api/runs/{run_id}/verify").json()
    assert not second["ok"] and second["assurance"] == "failed"
    (problem,) = second["problems"]
    assert "0.weight" in problem and "does not match its name" in problem
    assert command.exit_code == 4 and problem in command.stdout
    assert second["text"].endswith(": FAILED") and second["text"] in command.stdout
    assert third == first  # the same bytes back: intact again


def test_the_catalog_is_compared_as_before_whatever_its_values_look_like(tmp_path: Path) -> None:
    """A row equal value for value to the writer's is accepted without parsing; any other
    is compared field by field, with the findings of before."""
    files = SnapshotStore(tmp_path)
    info = files.put(torch.randn(3, 4))
    row = info.as_row()
    variants: list[tuple[dict[str, object], bool]] = [
        (row, True),
        ({**row, "shape": "[3,4]"}, True),  # another spelling of the same shape
        ({**row, "numel": 12.0}, True),
        ({**row, "numel": "12"}, True),
        ({**row, "numel": 13}, False),
        ({**row, "shape": "[4, 3]"}, False),
        ({**row, "file_sha256": None}, False),
        ({**row, "dtype": "float64"}, False),
        ({**row, "layout": "raw"}, False),
        ({**row, "row_groups": 2}, False),
        ({**row, "file": "zz/" + info.sha256 + ".parquet"}, False),
    ]
    for variant, fine in variants:
        problems = files.check(info.sha256, variant)
        assert (problems == []) is fine, (variant, problems)
        expected = _field_by_field(blob_from_row(variant), files.verify(info.sha256))
        assert len(problems) == expected, (variant, problems)


def _field_by_field(listed: BlobInfo, found: BlobInfo) -> int:
    fields = ("file", "dtype", "shape", "numel", "nbytes", "layout", "row_groups", "file_sha256")
    return sum(getattr(listed, f) != getattr(found, f) for f in fields)


def test_what_is_remembered_is_bounded_oldest_first(tmp_path: Path) -> None:
    files = SnapshotStore(tmp_path)
    infos = [files.put(torch.full((2,), float(i))) for i in range(3)]
    kept = Proven(limit=2)
    for info in infos:
        kept.remember(info.sha256, bytes(32), info)
    assert len(kept) == 2 and kept.recall(infos[0].sha256, bytes(32)) is None
    again = kept.recall(infos[2].sha256, bytes(32))
    assert again == infos[2] and again is not infos[2]  # a copy: changing it changes nothing kept
