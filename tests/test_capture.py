"""Capture: hooks installed and removed exactly, never perturbing training, events complete."""

from __future__ import annotations

import copy
import gc
import math
import threading
import warnings
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import load_example
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

import auditlog
from auditlog.core.errors import RecordingActiveError

HOOK_DICTS = {
    "forward_pre": nn_module._global_forward_pre_hooks,
    "forward": nn_module._global_forward_hooks,
    "forward_always": nn_module._global_forward_hooks_always_called,
    "backward": nn_module._global_backward_hooks,
    "backward_pre": nn_module._global_backward_pre_hooks,
    "buffer_reg": nn_module._global_buffer_registration_hooks,
    "module_reg": nn_module._global_module_registration_hooks,
    "param_reg": nn_module._global_parameter_registration_hooks,
    "opt_pre": optim_module._global_optimizer_pre_hooks,
    "opt_post": optim_module._global_optimizer_post_hooks,
}


def hook_state() -> dict[str, list[int]]:
    return {name: list(d.keys()) for name, d in HOOK_DICTS.items()}


def train_steps(model: nn.Module, steps: int, seed: int = 0, lr: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        x = (
            torch.randn(8, 1, 16, 16, generator=gen)
            if _is_cnn(model)
            else torch.randn(16, 20, generator=gen)
        )
        out = model(x)
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _is_cnn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def params_bytes(model: nn.Module) -> dict[str, bytes]:
    return {
        k: v.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
        for k, v in model.state_dict().items()
    }


def kinds_of(store: Path) -> Counter[str]:
    with auditlog.open(store) as s:
        return Counter(e["kind"] for e in s.run("latest").events())


def calls_of(store: Path, direction: str | None = None) -> list[dict[str, Any]]:
    """The recorded module calls of the latest run (from its ``activity`` events)."""
    with auditlog.open(store) as s:
        return list(s.run("latest").module_calls(direction))


# ---------------------------------------------------------------------- hooks


@pytest.mark.parametrize("backward", ["grad", "full", "legacy", "none"])
def test_hooks_installed_then_removed_exactly(store: Path, backward: str) -> None:
    before = hook_state()
    with auditlog.record(store, backward=backward):
        during = hook_state()
        added = {k: len(during[k]) - len(before[k]) for k in before}
    assert hook_state() == before
    # the eight module hooks: registration x3, forward pre/post always; backward by mechanism
    assert added["buffer_reg"] == added["module_reg"] == added["param_reg"] == 1
    assert added["forward_pre"] == added["forward"] == added["forward_always"] == 1
    assert added["opt_pre"] == added["opt_post"] == 1
    assert added["backward_pre"] == (1 if backward == "full" else 0)
    assert added["backward"] == (1 if backward in ("full", "legacy") else 0)


def test_every_installed_hook_returns_none(store: Path) -> None:
    """A non-None return would replace the tensor/parameter: call each hook directly."""
    lin = nn.Linear(2, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before = hook_state()
    with auditlog.record(store, backward="full"):
        new = {k: [h for h in v if h not in before[k]] for k, v in hook_state().items()}
        x = torch.randn(1, 2)
        calls: list[Any] = []
        for hid in new["param_reg"]:
            calls.append(
                nn_module._global_parameter_registration_hooks[hid](
                    lin, "w2", nn.Parameter(torch.ones(1))
                )
            )
        for hid in new["buffer_reg"]:
            calls.append(nn_module._global_buffer_registration_hooks[hid](lin, "b2", torch.ones(1)))
        for hid in new["module_reg"]:
            calls.append(nn_module._global_module_registration_hooks[hid](lin, "c", nn.ReLU()))
        for hid in new["forward_pre"]:
            calls.append(nn_module._global_forward_pre_hooks[hid](lin, (x,)))
        for hid in new["forward"]:
            calls.append(nn_module._global_forward_hooks[hid](lin, (x,), lin(x)))
        for hid in new["backward"]:
            calls.append(nn_module._global_backward_hooks[hid](lin, (x,), (x,)))
        for hid in new["backward_pre"]:
            calls.append(nn_module._global_backward_pre_hooks[hid](lin, (x,)))
        for hid in new["opt_pre"]:
            calls.append(optim_module._global_optimizer_pre_hooks[hid](opt, (), {}))
        for hid in new["opt_post"]:
            calls.append(optim_module._global_optimizer_post_hooks[hid](opt, (), {}))
    assert len(calls) == 9
    assert all(c is None for c in calls)


def test_nested_record_is_refused_and_first_keeps_working(store: Path, tmp_path: Path) -> None:
    before = hook_state()
    with auditlog.record(store) as run:
        with pytest.raises(RecordingActiveError, match="already active"):
            with auditlog.record(tmp_path / "other"):
                pass
        assert auditlog.current() is run
        model = nn.Linear(3, 3)
        model(torch.randn(2, 3))
    assert hook_state() == before
    assert auditlog.current() is None
    assert not (tmp_path / "other").exists()
    kinds = kinds_of(store)
    assert kinds["parameter_registered"] == 2 and kinds["activity"] == 1
    assert len(calls_of(store, "forward")) == 1


def test_decorator_records_one_run_per_call(store: Path) -> None:
    @auditlog.record(store, name="decorated")
    def job(n: int) -> int:
        nn.Linear(2, 2)(torch.randn(1, 2))
        return n * 2

    assert job(2) == 4
    assert job(3) == 6
    with auditlog.open(store) as s:
        runs = s.runs()
    assert [r.name for r in runs] == ["decorated", "decorated"]
    assert all(r.status == "completed" for r in runs)


def test_recording_does_not_keep_model_alive(store: Path) -> None:
    with auditlog.record(store):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        train_steps_mlp = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 4)).sum().backward()
        train_steps_mlp.step()
        ref = weakref.ref(model)
        param_ref = weakref.ref(model[0].weight)
        del model, train_steps_mlp
        gc.collect()
        assert ref() is None
        assert param_ref() is None


# ---------------------------------------------------------------------- numerics


@pytest.mark.parametrize(
    "backward,every", [("grad", 1), ("grad", 2), ("none", 1), ("full", 1), ("legacy", 1)]
)
def test_recorded_training_is_bitwise_identical(store: Path, backward: str, every: int) -> None:
    mlp = load_example("train_mlp")

    def run() -> nn.Module:
        torch.manual_seed(0)
        model = mlp.build_model()
        mlp.train(model, epochs=1, quiet=True)
        return model

    plain = params_bytes(run())
    rng_after_plain = torch.get_rng_state()
    with auditlog.record(store, backward=backward, activity_every=every):
        recorded = params_bytes(run())
        rng_after_recorded = torch.get_rng_state()
    assert plain == recorded
    assert torch.equal(rng_after_plain, rng_after_recorded)


def test_cnn_with_inplace_relu_trains_under_recording(store: Path) -> None:
    cnn = load_example("train_cnn")
    torch.manual_seed(0)
    plain_model = cnn.build_model()
    train_steps(plain_model, 4)
    torch.manual_seed(0)
    with auditlog.record(store, backward="grad"):
        model = cnn.build_model()
        assert any(isinstance(m, nn.ReLU) and m.inplace for m in model.modules())
        train_steps(model, 4)
    assert params_bytes(model) == params_bytes(plain_model)
    kinds = kinds_of(store)
    assert kinds["optimizer_step"] == 4
    backward = calls_of(store, "backward")
    assert len(backward) > 0
    assert all(e["payload"]["mechanism"] == "grad" for e in backward)
    assert all(e["payload"]["grad_outputs"][0]["nan"] == 0 for e in backward)


# ---------------------------------------------------------------------- events


def test_training_events_per_step(store: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, activity_every=1):
        model = nn.Sequential(nn.Linear(20, 8), nn.Tanh(), nn.Linear(8, 2))
        train_steps(model, 3)
    with auditlog.open(store) as s:
        run = s.run()
        events = list(run.events())
        calls = list(run.module_calls())
        state = run.model_state()
    steps = [e for e in events if e["kind"] == "optimizer_step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    payload = steps[0]["payload"]
    assert payload["optimizer_class"] == "torch.optim.sgd.SGD"
    assert payload["optimizer_step"] == 1
    group = payload["param_groups"][0]
    assert group["lr"] == 0.05 and group["momentum"] == 0.9 and group["weight_decay"] == 0
    root = state.root_by_class("Sequential")
    names = dict(state.named_parameters(root))
    assert [names[n] for n in ("0.weight", "0.bias", "2.weight", "2.bias")] == payload["tensor_ids"]
    assert all(isinstance(v, float) and v > 0 for v in payload["grad_norm"])
    assert all(isinstance(v, float) and v > 0 for v in payload["update_norm"])
    assert payload["nonfinite_grads"] == 0
    # default norms_every=10: update norms on the first step only, gradient norms on all
    assert [e["payload"]["update_norm"] is None for e in steps] == [False, True, True]
    assert all(len(e["payload"]["grad_norm"]) == 4 for e in steps)
    # every step: one activity event holding one forward per module call (Sequential
    # + 3 children) and one backward per module
    for step in (0, 1, 2):
        activity = [e for e in events if e["kind"] == "activity" and e["step"] == step]
        assert len(activity) == 1 and activity[0]["module_id"] is None
        fwd = [c for c in calls if c["kind"] == "forward" and c["step"] == step]
        bwd = [c for c in calls if c["kind"] == "backward" and c["step"] == step]
        assert len(fwd) == 4
        assert len(bwd) == 4
    out = [c for c in calls if c["kind"] == "forward" and c["module_id"] == root][0]["payload"][
        "outputs"
    ][0]
    assert out["shape"] == [16, 2] and out["dtype"] == "float32"
    assert set(out) >= {"norm", "mean", "std", "min", "max", "nan", "inf"}


def test_update_norm_matches_parameter_change(store: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store):
        model = nn.Linear(5, 3)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.randn(4, 5)).pow(2).sum().backward()
        before = [p.detach().clone() for p in model.parameters()]
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        after = [p.detach().clone() for p in model.parameters()]
    with auditlog.open(store) as s:
        payload = next(s.run().events(kinds=["optimizer_step"]))["payload"]
    for i in range(2):
        assert payload["update_norm"][i] == pytest.approx(
            float((after[i] - before[i]).norm()), rel=1e-5
        )
        assert payload["grad_norm"][i] == pytest.approx(float(grads[i].norm()), rel=1e-5)
        assert payload["param_norm"][i] == pytest.approx(float(after[i].norm()), rel=1e-5)
    assert payload["param_groups"][0]["betas"] == [0.9, 0.999]


def test_nan_is_counted_in_activity_and_gradients(store: Path) -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt(x)  # sqrt of negatives -> NaN, and NaN gradients

    torch.manual_seed(0)
    with auditlog.record(store):
        model = nn.Sequential(nn.Linear(3, 3), Bad())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    with auditlog.open(store) as s:
        run = s.run()
        state = run.model_state()
        bad_id = dict(state.named_modules(state.root_by_class("Sequential")))["1"]
        fwd = [c for c in run.module_calls("forward") if c["module_id"] == bad_id][0]
        step = next(run.events(kinds=["optimizer_step"]))["payload"]
    stats = fwd["payload"]["outputs"][0]
    assert stats["nan"] > 0 and stats["norm"] == "NaN"
    assert step["nonfinite_grads"] >= 1
    assert "NaN" in step["grad_norm"]


class Fixed(nn.Module):
    """Returns a fixed tensor, whatever the input: the recorded statistics are known."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value


class Outputs(nn.Module):
    def __init__(self, *values: torch.Tensor) -> None:
        super().__init__()
        self.parts = nn.ModuleList(Fixed(v) for v in values)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(part(x) for part in self.parts)


def assert_stat(recorded: Any, exact: float, rel: float = 1e-5) -> None:
    """A recorded statistic against torch's value (non-finite ones are stored as text)."""
    if math.isnan(exact):
        assert recorded == "NaN"
    elif math.isinf(exact):
        assert recorded == ("Infinity" if exact > 0 else "-Infinity")
    else:
        assert isinstance(recorded, float) and recorded == pytest.approx(exact, rel=rel)


def test_activity_statistics_on_cpu_equal_torch(store: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    finite = torch.randn(64, 33, generator=gen) * 3 + 0.5
    nonfinite = torch.randn(40, generator=gen)
    nonfinite[[3, 17]] = float("nan")
    nonfinite[[0, 8, 39]] = float("inf")
    infinite = torch.randn(5, 6, generator=gen)  # +inf without NaN: the norm alone is not enough
    infinite[0, [1, 2, 3]] = float("inf")
    offset = 1000 + 1e-3 * torch.randn(4096, generator=gen)  # large mean, tiny spread
    values = (finite, nonfinite, infinite, offset)
    with auditlog.record(store):
        model = Outputs(*values)
        model(torch.zeros(1))
    with auditlog.open(store) as s:
        run = s.run()
        state = run.model_state()
        calls = list(run.module_calls("forward"))
    modules = dict(state.named_modules(state.root_by_class("Outputs")))
    by_module = {c["module_id"]: c["payload"] for c in calls}
    assert len(calls) == 5  # four parts, then the root
    assert by_module[modules[""]]["n_outputs"] == 4
    recorded = [by_module[modules[f"parts.{i}"]]["outputs"][0] for i in range(4)]
    for stats, value in zip(recorded, values, strict=True):
        exact = value.double()
        assert stats["shape"] == list(value.shape) and stats["dtype"] == "float32"
        assert stats["numel"] == value.numel()
        assert_stat(stats["norm"], float(torch.linalg.vector_norm(exact)))
        assert_stat(stats["mean"], float(exact.mean()))
        assert_stat(stats["min"], float(exact.min()), rel=0)
        assert_stat(stats["max"], float(exact.max()), rel=0)
    # population std (correction=0); the offset tensor within 1e-3 of the exact value
    for stats, value, rel in zip(recorded, values, (1e-5, 1e-5, 1e-5, 1e-3), strict=True):
        assert_stat(stats["std"], float(value.double().std(correction=0)), rel=rel)
    assert [(st["nan"], st["inf"]) for st in recorded] == [(0, 0), (2, 3), (0, 3), (0, 0)]
    assert recorded[0]["std"] != pytest.approx(
        float(finite.double().std()), rel=1e-5
    )  # not Bessel's


def test_multiple_outputs_and_no_grad_forward(store: Path) -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> dict[str, Any]:
            y = self.a(x)
            return {"y": y, "z": (y * 2, y.sum())}

    with auditlog.record(store):
        model = Two()
        out = model(torch.randn(2, 3))
        (out["y"].sum() + out["z"][1]).backward()
        with torch.no_grad():
            model(torch.randn(2, 3))
    with auditlog.open(store) as s:
        events = list(s.run().module_calls())
    root_fwd = [e for e in events if e["kind"] == "forward" and e["payload"]["n_outputs"] == 3]
    assert len(root_fwd) == 2
    back = [e for e in events if e["kind"] == "backward"]
    # Two's outputs (3 tensors, one unused) and its child's output: one backward each
    assert len(back) == 2
    multi = [e for e in back if len(e["payload"]["grad_outputs"]) == 3][0]["payload"][
        "grad_outputs"
    ]
    assert multi[1] is None or multi[1]["numel"] == 6


def test_forward_that_raises_is_recorded_and_depth_recovers(store: Path) -> None:
    class Boom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("bad input")

    with auditlog.record(store):
        model = nn.Sequential(nn.Linear(2, 2), Boom())
        with pytest.raises(ValueError, match="bad input"):
            model(torch.randn(1, 2))
        later = nn.Linear(2, 2)
        later(torch.randn(1, 2))  # a new root after the failure is still sealed
    with auditlog.open(store) as s:
        events = list(s.run().events())
        calls = list(s.run().module_calls("forward"))
    errors = [c for c in calls if c["payload"].get("error")]
    assert len(errors) == 2  # Boom and the Sequential around it
    sealed = [e for e in events if e["kind"] == "construction_sealed"]
    assert len(sealed) == 2


def test_recorder_fault_becomes_event_and_warning_once(store: Path) -> None:
    """A wrapper subclass that will not say what it holds (its ``__tensor_flatten__``
    raises, and the recorder reads subclasses only through it): the hook fails,
    training does not."""

    class Grumpy(torch.Tensor):
        @staticmethod
        def __new__(cls, elem: torch.Tensor) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

        def __init__(self, elem: torch.Tensor) -> None:
            self.elem = elem

        def __tensor_flatten__(self) -> Any:
            raise RuntimeError("no statistics for you")

        @staticmethod
        def __tensor_unflatten__(inner: Any, ctx: Any, size: Any, stride: Any) -> Any:
            return Grumpy(inner["elem"])

        @classmethod
        def __torch_dispatch__(
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            unwrap = lambda t: t.elem if isinstance(t, Grumpy) else t  # noqa: E731
            return func(*[unwrap(a) for a in args], **(kwargs or {}))

    class Wrap(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Grumpy(x)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with auditlog.record(store):
            model = Wrap()
            outs = [model(torch.randn(2)) for _ in range(3)]
    assert all(isinstance(o, Grumpy) for o in outs)
    ours = [w for w in caught if "auditlog: recorder fault" in str(w.message)]
    assert len(ours) == 1
    with auditlog.open(store) as s:
        faults = [e["payload"] for e in s.run().events(kinds=["recorder_error"])]
    assert len(faults) == 3
    assert faults[0]["where"] == "forward_hook" and "no statistics" in faults[0]["message"]


def test_threads_record_concurrently(store: Path) -> None:
    with auditlog.record(store):
        models = [nn.Linear(4, 4) for _ in range(4)]

        def work(m: nn.Module) -> None:
            for _ in range(50):
                m(torch.randn(2, 4))

        threads = [threading.Thread(target=work, args=(m,)) for m in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with auditlog.open(store) as s:
        run = s.run()
        events = list(run.events())
        forwards = list(run.module_calls("forward"))
        assert run.verify().ok
    assert len(forwards) == 200
    assert sorted(Counter(c["module_id"] for c in forwards).values()) == [50] * 4
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def test_annotation_enters_the_chain_and_bad_fields_are_refused(store: Path) -> None:
    with auditlog.record(store, name="exp-7") as run:
        run.annotate("dataset", name="cifar10-train", sha256="ab" * 32, size=50000)
        with pytest.raises(auditlog.AuditlogError, match="JSON-encodable"):
            run.annotate("bad", obj=object())
    with pytest.raises(auditlog.AuditlogError, match="not active"):
        run.annotate("late", x=1)
    with auditlog.open(store) as s:
        r = s.run("exp-7")
        notes = [e["payload"] for e in r.events(kinds=["annotation"])]
        assert r.verify().ok
    assert notes == [
        {"key": "dataset", "fields": {"name": "cifar10-train", "sha256": "ab" * 32, "size": 50000}}
    ]


def test_exception_in_block_records_failed_and_propagates(store: Path) -> None:
    with pytest.raises(KeyError), auditlog.record(store):
        nn.Linear(2, 2)
        raise KeyError("missing")
    with auditlog.open(store) as s:
        info = s.run().info()
    assert info.status == "failed"
    assert info.exception is not None and info.exception["type"] == "KeyError"
    assert "missing" in info.exception["message"]


def test_keyboard_interrupt_records_interrupted(store: Path) -> None:
    with pytest.raises(KeyboardInterrupt), auditlog.record(store):
        raise KeyboardInterrupt
    with auditlog.open(store) as s:
        assert s.run().info().status == "interrupted"


def test_models_built_before_recording_are_adopted(store: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with auditlog.record(store):
        model(torch.randn(5, 3))
    with auditlog.open(store) as s:
        state = s.run().model_state()
    root = state.root_by_class("Sequential")
    assert [n for n, _ in state.named_modules(root)] == [n for n, _ in model.named_modules()]
    assert [n for n, _ in state.named_buffers(root)] == [n for n, _ in model.named_buffers()]
    hashes = {n: state.tensors[t].initial_sha256 for n, t in state.named_parameters(root)}
    assert hashes == {n: auditlog.tensor_hash(p) for n, p in model.named_parameters()}


def test_buffers_replaced_by_to_before_the_first_forward_are_sealed(store: Path) -> None:
    """``.to(float64)`` replaces the buffers without a registration hook: the initial
    snapshot must still hold exactly the values the first forward saw."""
    torch.manual_seed(0)
    with auditlog.record(store):
        model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).to(torch.float64)
        with torch.no_grad():
            model[1].running_mean.uniform_(-1, 1)  # not the default values
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(4, 3, dtype=torch.float64)).pow(
            2
        ).sum().backward()  # updates running stats
        opt.step()
    with auditlog.open(store) as s:
        restored = s.run().state_dict(step=0)
    assert list(restored) == list(initial)
    for key, value in initial.items():
        got = restored[key]
        assert got.dtype == value.dtype and got.shape == value.shape, key
        assert torch.equal(
            got.contiguous().reshape(-1).view(torch.uint8),
            value.contiguous().reshape(-1).view(torch.uint8),
        ), key
    assert initial["1.running_mean"].dtype == torch.float64
    assert not torch.equal(
        model[1].running_mean, initial["1.running_mean"]
    )  # the forward changed it


def test_deepcopied_modules_are_recorded(store: Path) -> None:
    with auditlog.record(store):
        block = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        model = nn.ModuleList([copy.deepcopy(block) for _ in range(2)])
    with auditlog.open(store) as s:
        state = s.run().model_state()
    root = state.root_by_class("ModuleList")
    assert [n for n, _ in state.named_parameters(root)] == [n for n, _ in model.named_parameters()]


def test_torch_compile_is_recorded_once_and_trains_identically(store: Path) -> None:
    def run() -> tuple[nn.Module, list[float]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        compiled = torch.compile(model, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            loss = compiled(torch.randn(2, 4)).sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return model, losses

    plain, plain_losses = run()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # torch's own note about global hooks + compile
        with auditlog.record(store, activity_every=1):
            recorded, losses = run()
    torch._dynamo.reset()
    assert losses == plain_losses
    assert params_bytes(recorded) == params_bytes(plain)
    with auditlog.open(store) as s:
        run_view = s.run()
        state = run_view.model_state()
        events = list(run_view.events(kinds=["optimizer_step", "recorder_error"]))
        forwards = list(run_view.module_calls("forward"))
    root = state.root_by_class("Sequential")
    assert state.roots() == [root]  # the OptimizedModule wrapper is not part of the structure
    assert [n for n, _ in state.named_parameters(root)] == [
        n for n, _ in recorded.named_parameters()
    ]
    assert len(forwards) == 3 and all(e["module_id"] == root for e in forwards)
    assert not [e for e in events if e["kind"] == "recorder_error"]


class AddOneInPlace(nn.Module):
    """Returns its input after changing it in place: same tensor object, new version."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1.0)


def test_a_container_returning_its_childs_output_shares_its_statistics(store: Path) -> None:
    torch.manual_seed(0)
    with auditlog.record(store, policy="debug"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        tail = AddOneInPlace()
        out = tail(model(torch.randn(3, 4)))  # tail returns the Sequential's output tensor, changed
        out.sum().backward()
    calls = calls_of(store)
    forward = [c for c in calls if c["kind"] == "forward"]
    backward = [c for c in calls if c["kind"] == "backward"]
    # Linear, Linear, Sequential, AddOneInPlace
    assert [c["payload"]["n_outputs"] for c in forward] == [1, 1, 1, 1]
    first, second, sequential, added = (c["payload"]["outputs"][0] for c in forward)
    assert first != second
    assert sequential == second  # the same tensor, unchanged: the same statistics
    assert (
        added != second and abs(added["mean"] - (second["mean"] + 1.0)) < 1e-5
    )  # changed in place: measured again
    # the second Linear and the Sequential returned one tensor at one version: one hook, an
    # entry for each; the tail's output was changed in place since: hooked on its own
    assert len(backward) == 4
    modules = [c["module_id"] for c in backward]
    assert len(set(modules)) == 4
    grads = [c["payload"]["grad_outputs"][0] for c in backward]
    shared = [g for g in grads if g["mean"] == 1.0 and g["std"] == 0.0]
    assert len(shared) == 3 and shared[0] == shared[1] == shared[2]
