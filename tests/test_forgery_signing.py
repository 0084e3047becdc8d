"""Signing never launders (issue 29, part 2): the key holder cannot be led to sign a forgery.

The forgery of the issue, from the documented format only (``forgery_support``):
point the finished, signed run r1's snapshot hashes at run r2's files, recompute
r1's chain from its genesis hash, and delete r1's checkpoint rows. Before, the
key holder's ``attest`` signed it and ``restore`` returned r2's weights. A run
recorded with a key names the key's fingerprint in ``run_started``; the signing
commands and ``restore`` refuse such a stream once its signatures are gone, and
every signing command says what it trusts.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import forgery_support
import pytest
from forgery_support import CHAINED, Trial, rows, snapshot_hashes
from helpers import assert_one_line_error, tamper

import auditlog
from auditlog.core.chain import canonical_payload, chain_hash, genesis_hash
from auditlog.core.errors import IntegrityError
from auditlog.integrity.keys import fingerprint, load_public_key

pristine = forgery_support.pristine  # fixtures
trial = forgery_support.trial

LOST = "stream 0 was recorded for signing by key {fp} and its recording signed its end, but no signature"


@pytest.fixture
def keyed(trial: Trial, monkeypatch: pytest.MonkeyPatch) -> Trial:
    """The key holder's environment: the trial's key is the configured signing key."""
    monkeypatch.setenv("AUDITLOG_KEY", str(trial.public_key.with_suffix("")))
    return trial


def recompute(
    conn: sqlite3.Connection, run_id: str, edit: dict[str, str], strip_key: bool = False
) -> None:
    """Replace text in every payload of the run's stream 0 and chain it again from genesis."""
    prev = genesis_hash(run_id, 0)
    for row in rows(conn, run_id):
        payload = row["payload"]
        for old, new in edit.items():
            payload = payload.replace(old, new)
        if strip_key and row["kind"] == "run_started":
            started = json.loads(payload)
            del started["signing_key"]
            payload = canonical_payload(started)
        row["payload"] = payload
        row["hash"] = prev = chain_hash(prev, {c: row[c] for c in CHAINED})
        conn.execute(
            "update events set payload=?, hash=? where id=?", (payload, row["hash"], row["id"])
        )


def launder(trial: Trial, strip_key: bool = False) -> None:
    """r1's snapshot hashes pointed at r2's files, r1's chain recomputed, its checkpoints deleted."""
    swap: dict[str, str] = {}
    for step in (2, 4):
        ours, theirs = (
            snapshot_hashes(trial.store, trial.r1, step),
            snapshot_hashes(trial.store, trial.r2, step),
        )
        swap.update({ours[k]: theirs[k] for k in ours})
    with tamper(trial.store) as conn:
        recompute(conn, trial.r1, swap, strip_key)
        conn.execute("delete from checkpoints where run_id=?", (trial.r1,))


def model_of_r2(trial: Trial, tmp_path: Path) -> Path:
    target = tmp_path / "r2.safetensors"
    done = trial.cli("restore", trial.r2, "-o", str(target))
    assert done.exit_code == 0, done.stderr
    return target


def test_a_run_recorded_with_a_key_names_its_fingerprint_in_run_started(keyed: Trial) -> None:
    with sqlite3.connect(keyed.store / "events.db") as conn:
        started = json.loads(rows(conn, keyed.r1)[0]["payload"])
    assert started["signing_key"] == fingerprint(load_public_key(keyed.public_key))


def test_the_key_holder_cannot_be_led_to_sign_a_laundered_run(keyed: Trial, tmp_path: Path) -> None:
    model = model_of_r2(keyed, tmp_path)
    launder(keyed)
    lost = LOST.format(fp=fingerprint(load_public_key(keyed.public_key))[:16])
    refused = keyed.cli("attest", keyed.r1, "--model", str(model), "-o", str(tmp_path / "a.json"))
    line = assert_one_line_error(
        refused, 4, f"refusing to sign run {keyed.r1[:12]}: ", lost, "covers it"
    )
    assert "verify --against HEAD" in line
    assert not (tmp_path / "a.json").exists()
    for command in (("checkpoint", keyed.r1), ("export-head", keyed.r1)):
        result = keyed.cli(*command)
        assert_one_line_error(result, 4, lost)
    assert (
        keyed.cli("checkpoint", keyed.r1).stdout
        == f"run {keyed.r1[:12]}: not signed, its signatures were lost\n"
    )
    with auditlog.open(keyed.store) as opened:
        assert opened.event_store.checkpoint_rows(keyed.r1) == []  # nothing was signed


def test_restore_and_state_dict_check_the_chain_they_restore_from(
    keyed: Trial, tmp_path: Path
) -> None:
    launder(keyed)
    refused = keyed.cli("restore", keyed.r1, "-o", str(tmp_path / "r1.safetensors"))
    assert_one_line_error(
        refused, 4, f"refusing to restore from run {keyed.r1[:12]}: ", "recorded for signing"
    )
    assert not (tmp_path / "r1.safetensors").exists()
    with (
        auditlog.open(keyed.store) as opened,
        pytest.raises(IntegrityError, match="recorded for signing"),
    ):
        opened.run(keyed.r1).state_dict()


def test_restore_refuses_an_edited_chain_even_without_a_key(trial: Trial, tmp_path: Path) -> None:
    """Snapshot hashes pointed elsewhere with the hash column untouched: the files match, the chain does not."""
    ours, theirs = (
        snapshot_hashes(trial.store, trial.r1, 4),
        snapshot_hashes(trial.store, trial.r2, 4),
    )
    with tamper(trial.store) as conn:
        for key, sha in ours.items():
            conn.execute(
                "update events set payload = replace(payload, ?, ?) where run_id=?",
                (sha, theirs[key], trial.r1),
            )
    refused = trial.cli("restore", trial.r1, "--step", "4", "-o", str(tmp_path / "r1.safetensors"))
    assert_one_line_error(
        refused,
        4,
        "refusing to restore from run",
        "record altered: ",
        "content does not match its recorded hash",
    )


def test_a_forger_who_strips_the_fingerprint_is_signed_only_on_first_signature_and_said(
    keyed: Trial, tmp_path: Path
) -> None:
    """The capable forger also removes ``signing_key``: the run then looks unsigned. The key holder is
    told, in one line, that the signature trusts the whole stream on first signature; the head exported
    before the forgery still catches it."""
    model = model_of_r2(keyed, tmp_path)
    launder(keyed, strip_key=True)
    signed = keyed.cli("attest", keyed.r1, "--model", str(model), "-o", str(tmp_path / "a.json"))
    assert signed.exit_code == 0, signed.stderr
    lines = signed.stderr.splitlines()
    assert lines[0] == (
        f"auditlog: signing run {keyed.r1[:12]} trusts on first signature stream 0 seq 1..24: no earlier "
        "signature by a trusted key covers them, so this signature vouches for them as they are now (a rewrite "
        "by someone with write access before now would be signed too; `verify --against` an older exported "
        "head shows one)"
    ), signed.stderr
    caught = keyed.verify()
    assert caught.exit_code == 4 and "rewritten" in caught.stderr, caught.stderr


def test_signing_an_intact_signed_run_says_it_only_extends_earlier_signatures(keyed: Trial) -> None:
    result = keyed.cli("checkpoint", keyed.r1)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == (
        f"auditlog: signing run {keyed.r1[:12]}: every event is already covered by a "
        "signature by a trusted key; this signature extends them\n"
    )
    assert result.stdout == f"run {keyed.r1[:12]} stream 0: seq 24 already signed by this key\n"
