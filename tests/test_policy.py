"""Capture policy: presets record what they promise; sampling, globs and policy files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_one_line_error, invoke, run_auditlog, tree_digest
from torch import nn
from torch.nn.modules import module as nn_module

import auditlog
from auditlog.core.errors import UsageError
from auditlog.core.policy import Policy, make_policy


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))


MODULE_CALLS = 4  # the Sequential and its three children


def train(
    steps: int,
    hooks_seen: dict[int, int] | None = None,
    poison_at: int | None = None,
    flush: bool = False,
) -> nn.Module:
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if hooks_seen is not None:
            hooks_seen[step] = len(nn_module._global_forward_hooks)
        x = torch.randn(4, 6)
        if poison_at is not None and step == poison_at:
            x[0, 0] = float("nan")
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if flush:  # let the writer catch up, as it does on any real step time
            recording = auditlog.current()
            assert recording is not None
            recording.flush()
    return model


def per_step(store: Path) -> tuple[dict[int, Counter[str]], list[dict]]:
    """Per step: events by kind, and module calls by direction ("forward", "backward")."""
    with auditlog.open(store) as s:
        run = s.run()
        events = list(run.events())
        calls = list(run.module_calls())
    counts: dict[int, Counter[str]] = {}
    for e in events:
        counts.setdefault(e["step"], Counter())[e["kind"]] += 1
    for c in calls:
        counts.setdefault(c["step"], Counter())[c["kind"]] += 1
    return counts, events


def test_debug_records_every_module_every_step(store: Path) -> None:
    with auditlog.record(store, policy="debug"):
        train(5)
    counts, events = per_step(store)
    for step in range(5):
        # one activity event per step, holding every module call of the step
        assert counts[step]["activity"] == 1
        assert counts[step]["forward"] == MODULE_CALLS
        assert counts[step]["backward"] == MODULE_CALLS
    steps = [e for e in events if e["kind"] == "optimizer_step"]
    assert len(steps) == 5 and all(e["payload"]["update_norm"] for e in steps)
    assert all(
        isinstance(v, float)
        for e in steps
        for v in e["payload"]["update_norm"] + e["payload"]["param_norm"]
    )


def test_audit_samples_activity_and_records_every_step(store: Path, tmp_path: Path) -> None:
    hooks: dict[int, int] = {}
    before = len(nn_module._global_forward_hooks)
    with auditlog.record(store):  # the default preset
        train(201, hooks_seen=hooks)
    counts, events = per_step(store)
    sampled = {0, 100, 200}  # activity_every=100 (step 0 always)
    for step in range(201):
        expected = MODULE_CALLS if step in sampled else 0
        assert counts[step]["activity"] == (1 if step in sampled else 0), step
        assert counts[step]["forward"] == expected, step
        assert counts[step]["backward"] == expected, step
        # per-call hooks are absent on unsampled steps: PyTorch's fast path
        assert hooks[step] - before == (1 if step in sampled else 0), step
    steps = [e for e in events if e["kind"] == "optimizer_step"]
    assert len(steps) == 201
    assert all(len(e["payload"]["grad_norm"]) == 4 for e in steps)
    # update and parameter norms every norms_every=10 steps: step indexes 0, 10, 20, ...
    # i.e. the optimizer_step events with step 1, 11, 21, ...; None on the others
    normed = set(range(1, 202, 10))
    for e in steps:
        p = e["payload"]
        if e["step"] in normed:
            assert len(p["update_norm"]) == 4 and len(p["param_norm"]) == 4, e["step"]
        else:
            assert p["update_norm"] is None and p["param_norm"] is None, e["step"]
    assert all(e["payload"]["param_groups"][0]["lr"] == 0.01 for e in steps)
    # norms_every=1: update and parameter norms on every step
    every = tmp_path / "every"
    with auditlog.record(every, norms_every=1):
        train(3)
    _counts, every_events = per_step(every)
    every_steps = [e["payload"] for e in every_events if e["kind"] == "optimizer_step"]
    assert len(every_steps) == 3
    assert all(len(p["update_norm"]) == 4 and len(p["param_norm"]) == 4 for p in every_steps)


@pytest.mark.parametrize("check_every", [1, 5])
def test_structural_checks_run_every_check_every_steps(store: Path, check_every: int) -> None:
    """A change no hook reports (del) is recorded by the first check after it."""
    torch.manual_seed(0)
    with auditlog.record(store, policy="minimal", check_every=check_every, check_share=0):
        model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
        model.add_module("extra", nn.Linear(1, 1))
        opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
        for step in range(1, 8):
            model[:3](torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == 2:
                del model.extra  # no PyTorch hook reports this
    with auditlog.open(store) as s:
        removed = [
            e
            for e in s.run().events(kinds=["structure_changed"])
            if e["payload"]["change"] == "removed"
        ]
    assert [(e["step"], e["payload"]["name"], e["payload"]["detected_at"]) for e in removed] == [
        (3 if check_every == 1 else 5, "extra", "optimizer_step")
    ]


def test_check_interval_grows_in_whole_multiples_while_checks_cost_more_than_their_share() -> None:
    policy = Policy(check_every=10, check_share=0.01)
    assert (
        policy.check_interval(0.001, 0.013) == 10
    )  # 1 ms checks on 13 ms steps: 0.8% every 10 steps
    assert (
        policy.check_interval(0.040, 0.140) == 30
    )  # 40 ms on 140 ms steps: every 29 steps keeps 1%
    assert policy.check_interval(0.040, 0.0) == 10  # no step time measured yet
    assert Policy(check_every=10, check_share=0).check_interval(1.0, 0.001) == 10


def test_expensive_checks_are_spaced_and_a_change_is_still_found_by_the_last_one(
    store: Path,
) -> None:
    """With a share no check can fit in, the first periodic check spaces the next far
    out; the change no hook reports is then found by the check at run end."""
    torch.manual_seed(0)
    with auditlog.record(store, policy="minimal", check_every=2, check_share=1e-9):
        model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
        model.add_module("extra", nn.Linear(1, 1))
        opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
        for step in range(1, 13):
            model[:3](torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == 3:
                del model.extra
    with auditlog.open(store) as s:
        removed = [
            e
            for e in s.run().events(kinds=["structure_changed"])
            if e["payload"]["change"] == "removed"
        ]
    assert len(removed) == 1 and removed[0]["payload"]["name"] == "extra"
    assert (
        removed[0]["payload"]["detected_at"] != "optimizer_step"
    )  # not by a periodic check (steps 4..12)


@pytest.mark.parametrize("value", [-0.1, 1.5, "much", True])
def test_check_share_must_be_a_fraction(value: object) -> None:
    with pytest.raises(UsageError, match="check_share"):
        Policy(check_share=value)  # type: ignore[arg-type]


def test_norms_every_selects_the_steps_with_update_and_parameter_norms(store: Path) -> None:
    """norms_every=3 over 7 steps: update/parameter norms on step indexes 0, 3, 6 (the
    optimizer_step events with step 1, 4, 7) and exact; gradient norms on every step."""
    updates: dict[int, list[float]] = {}
    params_after: dict[int, list[float]] = {}
    with auditlog.record(store, norms_every=3):
        torch.manual_seed(0)
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(7):
            model(torch.randn(4, 6)).pow(2).sum().backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            after = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            updates[step + 1] = [float((a - b).norm()) for a, b in zip(after, before, strict=True)]
            params_after[step + 1] = [float(a.norm()) for a in after]
    with auditlog.open(store) as s:
        steps = [e for e in s.run().events(kinds=["optimizer_step"])]
    assert [e["step"] for e in steps] == list(range(1, 8))
    for e in steps:
        p = e["payload"]
        assert len(p["grad_norm"]) == 4 and all(
            isinstance(v, float) and v > 0 for v in p["grad_norm"]
        )
        if e["step"] in (1, 4, 7):
            assert p["update_norm"] == pytest.approx(updates[e["step"]], rel=1e-5), e["step"]
            assert p["param_norm"] == pytest.approx(params_after[e["step"]], rel=1e-5), e["step"]
            assert all(v > 0 for v in p["update_norm"])
        else:
            assert p["update_norm"] is None and p["param_norm"] is None, e["step"]


def test_minimal_records_construction_and_steps_only(store: Path) -> None:
    with auditlog.record(store, policy="minimal"):
        model = train(3)
    counts, events = per_step(store)
    kinds = Counter(e["kind"] for e in events)
    assert kinds["activity"] == 0 and not any(
        c["forward"] or c["backward"] for c in counts.values()
    )
    assert kinds["optimizer_step"] == 3 and kinds["parameter_registered"] == 4
    step = next(e["payload"] for e in events if e["kind"] == "optimizer_step")
    assert (
        step["update_norm"] is None and step["param_norm"] is None and len(step["grad_norm"]) == 4
    )
    sealed = next(e["payload"] for e in events if e["kind"] == "construction_sealed")
    assert sealed["trigger"] == "first_forward" and len(sealed["tensors"]) == 4
    assert model is not None


def test_nonfinite_gradients_switch_sampling_on(store: Path) -> None:
    with auditlog.record(store, activity_every=1000):
        train(8, poison_at=2, flush=True)
    counts, events = per_step(store)
    assert counts[1]["forward"] == 0
    nonfinite = [
        e["step"]
        for e in events
        if e["kind"] == "optimizer_step" and e["payload"]["nonfinite_grads"]
    ]
    assert (
        nonfinite and nonfinite[0] == 3
    )  # the poisoned batch was step index 2 -> optimizer step 3
    # sampled from the step after the writer saw the non-finite gradient norms
    assert all(counts[step]["forward"] == MODULE_CALLS for step in range(4, 8))


def test_include_and_exclude_globs(store: Path, tmp_path: Path) -> None:
    with auditlog.record(store, policy="debug", include=["0", "2"]):
        train(2)
    with auditlog.open(store) as s:
        run = s.run()
        names = run.model_state().module_names()
        fwd = [names[c["module_id"]][0] for c in run.module_calls("forward")]
    assert sorted(set(fwd)) == ["0", "2"]
    other = tmp_path / "other"
    with auditlog.record(other, policy="debug", exclude=["ReLU", "Sequential"]):
        train(2)
    with auditlog.open(other) as s:
        run = s.run()
        state = run.model_state()
        classes = {state.modules[c["module_id"]].cls for c in run.module_calls()}
    assert classes == {"torch.nn.modules.linear.Linear"}


def test_norm_only_statistics(store: Path) -> None:
    with auditlog.record(store, policy="debug", stats="norm"):
        train(1)
    with auditlog.open(store) as s:
        out = next(s.run().module_calls("forward"))["payload"]["outputs"][0]
    assert set(out) == {"shape", "dtype", "numel", "norm", "nan", "inf"}


def test_policy_files_and_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert make_policy().preset == "audit"
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.auditlog]\npreset = "debug"\nsnapshot_every = 5\n'
    )
    found = make_policy()
    assert (found.preset, found.activity_every, found.snapshot_every) == ("debug", 1, 5)
    assert "pyproject.toml" in found.source
    (tmp_path / "auditlog.toml").write_text('preset = "minimal"\ninclude = ["encoder.*"]\n')
    own = make_policy()
    assert own.preset == "minimal" and own.activity is False and own.include == ("encoder.*",)
    assert make_policy(activity_every=3).activity_every == 3  # keyword overrides the file
    assert make_policy("debug").activity_every == 1  # an explicit preset ignores files
    assert isinstance(make_policy(Policy(activity_every=7)), Policy)


@pytest.mark.parametrize(
    "text,message",
    [
        ("activty_every = 3\n", "unknown policy key 'activty_every'"),
        ("activity_every = 0\n", "'activity_every'"),
        ("activity_every = 'often'\n", "'activity_every'"),
        ("norms_every = 0\n", "'norms_every'"),
        ("check_every = 'sometimes'\n", "'check_every'"),
        ("check_share = 2\n", "'check_share'"),
        ('backward = "sideways"\n', "'backward'"),
        ('preset = "paranoid"\n', "unknown policy preset 'paranoid'"),
        ("include = [1, 2]\n", "'include'"),
        ("snapshot_final = 'yes'\n", "'snapshot_final'"),
        ("this is not toml\n", "not valid TOML"),
    ],
)
def test_bad_policy_files_are_refused_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        make_policy(path)
    store = tmp_path / "store"
    result = invoke(
        "run", "--store", str(store), "--policy", str(path), str(tmp_path / "nothing.py")
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and len(result.stderr.strip().splitlines()) == 1
    assert message.strip("'") in result.stderr or message in result.stderr
    assert not store.exists()


def test_unknown_keyword_and_preset_are_refused(store: Path) -> None:
    with pytest.raises(UsageError, match="unknown policy key 'activity_evry'"):
        auditlog.record(store, activity_evry=2)
    with pytest.raises(UsageError, match="neither a preset"):
        auditlog.record(store, policy="debgu")
    assert not store.exists()


def three_step_script(where: Path) -> Path:
    """A script that trains nn.Linear(3, 1) for three SGD steps."""
    script = where / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\nm = nn.Linear(3, 1)\no = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    m(torch.randn(2, 3)).sum().backward(); o.step()\n"
    )
    return script


def run_three_steps(
    tmp_path: Path, store: Path, *flags: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``auditlog run FLAGS`` on the three-step script: the recorded policy and events."""
    script = three_step_script(tmp_path)
    done = run_auditlog("run", "--store", str(store), *flags, str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with auditlog.open(store) as s:
        events = list(s.run().events())
    started = next(e for e in events if e["kind"] == "run_started")["payload"]
    return started["policy"], events


@pytest.mark.slow
def test_run_with_policy_flag(tmp_path: Path, store: Path) -> None:
    policy, events = run_three_steps(tmp_path, store, "--policy", "minimal")
    kinds = Counter(e["kind"] for e in events)
    assert policy["preset"] == "minimal" and kinds["activity"] == 0 and kinds["optimizer_step"] == 3


def test_run_norms_every_flag_gives_update_norms_on_every_step(tmp_path: Path, store: Path) -> None:
    policy, events = run_three_steps(tmp_path, store, "--norms-every", "1")
    steps = [e["payload"] for e in events if e["kind"] == "optimizer_step"]
    assert policy["norms_every"] == 1 and policy["preset"] == "audit"
    assert len(steps) == 3 and all(
        len(p["update_norm"]) == 2 and len(p["param_norm"]) == 2 for p in steps
    )
    script = three_step_script(tmp_path)
    before = tree_digest(store)
    assert_one_line_error(
        invoke("run", "--store", str(store), "--norms-every", "0", str(script)), 2, "--norms-every"
    )
    assert tree_digest(store) == before  # refused before anything was opened
