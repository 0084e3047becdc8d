"""Say what an unsigned record proves (issue 29, part 5).

A run recorded without a key, rewritten entirely with recomputed hashes (the
documented chain function, ``integrity_support.rewrite_chain``), verifies
exactly as before: so ``verify``, ``report`` and the Python API must not call
it more than "chain intact, unsigned", and ``auditlog run`` says once that a
run is unsigned. Signed records, and signed records checked against an
exported head, say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forgery_support
import pytest
from auditlog.cli.run_cmd import UNSIGNED_NOTE
from forgery_support import Trial, train
from helpers import invoke
from integrity_support import rewrite_chain

import auditlog
from auditlog.integrity.findings import VERDICTS
from auditlog.present.report import run_report

pristine = forgery_support.pristine  # fixtures
trial = forgery_support.trial

UNSIGNED = VERDICTS["unsigned"]


def test_a_rewritten_unsigned_run_is_called_unsigned_before_and_after(store: Path) -> None:
    run_id = train(store, "unsigned", seed=0)  # the test environment has no key
    before = invoke("verify", "--store", str(store))
    rewrite_chain(store, run_id, 5)
    after = invoke("verify", "--store", str(store))
    assert before.exit_code == after.exit_code == 0, after.stderr
    assert before.stdout == after.stdout  # a bare chain cannot tell: so it must not claim to
    assert (
        before.stdout.splitlines()[0] == f"run {run_id[:12]}: 24 events in 1 stream(s): {UNSIGNED}"
    )
    assert UNSIGNED.startswith(
        "intact, unsigned: the chain detects accidental damage and naive edits, "
        "not a rewrite by someone with write access"
    )
    machine = json.loads(invoke("verify", "--store", str(store), "--format", "json").stdout)
    assert [r["verdict"] for r in machine] == ["unsigned"]
    with auditlog.open(store) as opened:
        report = opened.run(run_id).verify()
        assert (report.ok, report.signed, report.assurance) == (True, False, "unsigned")
        page = run_report(opened.run(run_id))
    assert '<span class="badge warn">chain intact, unsigned</span>' in page
    assert "record intact" not in page and "proves that no event was changed" not in page
    assert "anyone with write access to the store can rewrite the whole chain" in page


def test_signed_and_checked_against_a_head_are_said_apart(
    trial: Trial, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed = trial.cli("verify", trial.r1, "--key", str(trial.public_key))
    assert signed.exit_code == 0, signed.stderr
    assert signed.stdout.splitlines()[0] == (
        f"run {trial.r1[:12]}: 24 events in 1 stream(s), 1 signed checkpoint(s): {VERDICTS['signed']}"
    )
    against = trial.verify()
    assert against.exit_code == 0, against.stderr
    assert against.stdout.splitlines()[0].endswith(
        ": intact, signed and checked against an exported head: every event is covered by a signature by a "
        "trusted key, and the record extends the head kept elsewhere"
    )
    machine = json.loads(trial.verify("--format", "json").stdout)
    assert [r["verdict"] for r in machine] == ["signed-against-head"]
    monkeypatch.setenv(
        "AUDITLOG_KEY", str(trial.public_key.with_suffix(""))
    )  # the page trusts the default key
    with auditlog.open(trial.store) as opened:
        page = run_report(opened.run(trial.r1))
    assert (
        '<span class="badge ok">record intact, signed</span>' in page and "Not signed" not in page
    )


def _auditlog_run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the script')\n")
    environment = {
        k: v for k, v in os.environ.items() if k not in ("AUDITLOG_STORE", "AUDITLOG_QUIET")
    }
    environment.update(env)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "auditlog.cli.main",
            "run",
            "--store",
            str(tmp_path / "s"),
            *args,
            str(script),
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
def test_auditlog_run_says_once_that_the_run_is_unsigned_unless_quiet_or_keyed(
    tmp_path: Path, pristine: Trial
) -> None:
    plain = _auditlog_run(tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "hello from the script\n"
    lines = plain.stderr.splitlines()
    assert (
        len(lines) == 2
        and lines[0].startswith("auditlog: recording run ")
        and lines[1] == UNSIGNED_NOTE
    )
    for quiet in (_auditlog_run(tmp_path, "--quiet"), _auditlog_run(tmp_path, AUDITLOG_QUIET="1")):
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    keyed = _auditlog_run(tmp_path, AUDITLOG_KEY=str(pristine.public_key.with_suffix("")))
    assert keyed.returncode == 0, keyed.stderr
    assert (
        keyed.stderr.startswith("auditlog: recording run ") and len(keyed.stderr.splitlines()) == 1
    )
