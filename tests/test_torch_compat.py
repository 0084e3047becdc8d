"""Every private torch internal auditlog relies on still exists in the installed torch.

A torch upgrade that drops or renames one fails here, naming the attribute and
the torch version, instead of silently recording less.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from auditlog.capture import loader_compat, torch_compat
from auditlog.capture.torch_compat import GLOBAL_HOOK_TABLES, global_hook_table


@pytest.mark.parametrize("name", sorted(torch_compat.REQUIRED))
def test_private_torch_attribute_exists(name: str) -> None:
    try:
        torch_compat.REQUIRED[name]()
    except (AttributeError, ValueError, TypeError) as exc:
        pytest.fail(
            f"torch {torch.__version__} no longer has {name} ({exc}); update auditlog/capture/torch_compat.py"
        )


@pytest.mark.parametrize("name", sorted(loader_compat.REQUIRED))
def test_private_dataloader_attribute_exists(name: str) -> None:
    try:
        loader_compat.REQUIRED[name]()
    except (AttributeError, ValueError, TypeError) as exc:
        pytest.fail(
            f"torch {torch.__version__} no longer has {name} ({exc}); update auditlog/capture/loader_compat.py"
        )


def test_accessors_read_what_torch_holds() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model[1].register_buffer("scratch", torch.zeros(1), persistent=False)
    assert list(torch_compat.children_of(model)) == ["0", "1"]
    assert list(torch_compat.parameters_of(model[0])) == ["weight", "bias"]
    assert "running_mean" in torch_compat.buffers_of(model[1])
    assert torch_compat.is_persistent_buffer(model[1], "running_mean")
    assert not torch_compat.is_persistent_buffer(model[1], "scratch")
    weight = model[0].weight
    before = torch_compat.tensor_version(weight)
    with torch.no_grad():
        weight.add_(1)
    assert torch_compat.tensor_version(weight) == before + 1
    norms = torch_compat.foreach_norm([torch.ones(4), torch.zeros(3)])
    assert [float(n) for n in norms] == [2.0, 0.0]


def test_registering_persistent_reads_register_buffer() -> None:
    seen: list[bool | None] = []

    def hook(module: nn.Module, name: str, buffer: torch.Tensor | None) -> None:
        seen.append(torch_compat.registering_persistent())

    handle = nn.modules.module.register_module_buffer_registration_hook(hook)
    try:
        module = nn.Module()
        module.register_buffer("a", torch.zeros(1))
        module.register_buffer("b", torch.zeros(1), persistent=False)
    finally:
        handle.remove()
    assert seen == [True, False]


def test_compiled_wrapper_is_unwrapped() -> None:
    model = nn.Linear(2, 2)
    compiled = torch.compile(model)
    assert torch_compat.is_compiled_wrapper(compiled)
    assert torch_compat.unwrap_compiled(compiled) is model
    assert torch_compat.unwrap_compiled(model) is model


def test_full_backward_flag_is_restored_exactly() -> None:
    from torch.nn.modules import module as nn_module

    flag = torch_compat.FullBackwardFlag()
    found = nn_module._global_is_full_backward_hook
    flag.save_and_clear()
    flag.restore()
    assert nn_module._global_is_full_backward_hook is found


@pytest.mark.parametrize("table", sorted(GLOBAL_HOOK_TABLES))
def test_global_hook_tables_are_the_ones_torch_registers_into(table: str) -> None:
    """The accessor returns the dict a public register_* call writes to (so a
    check of it is a check of what torch will call)."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim_module

    register = {
        "module_registration": nn_module.register_module_module_registration_hook,
        "parameter_registration": nn_module.register_module_parameter_registration_hook,
        "buffer_registration": nn_module.register_module_buffer_registration_hook,
        "forward_pre": nn_module.register_module_forward_pre_hook,
        "forward": nn_module.register_module_forward_hook,
        "forward_always_called": lambda hook: nn_module.register_module_forward_hook(
            hook, always_call=True
        ),
        "backward_pre": nn_module.register_module_full_backward_pre_hook,
        "backward": nn_module.register_module_full_backward_hook,
        "optimizer_step_pre": optim_module.register_optimizer_step_pre_hook,
        "optimizer_step_post": optim_module.register_optimizer_step_post_hook,
    }[table]
    flag = nn_module._global_is_full_backward_hook

    def hook(*args: object) -> None:
        return None

    handle = register(hook)
    try:
        assert handle.id in global_hook_table(table)
    finally:
        handle.remove()
        nn_module._global_is_full_backward_hook = flag
    assert handle.id not in global_hook_table(table)


def test_flop_counting_mode_matches_torch_with_repeated_layers() -> None:
    """Answers remembered per (operator, shapes, plain arguments) are the formulas' own:
    equal layers repeated, convolutions with list arguments, differing shapes."""
    from torch.utils.flop_counter import FlopCounterMode

    from auditlog.capture.torch_compat import flop_counting_mode

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Conv2d(3, 3, 3, padding=1) for _ in range(3)],
        torch.nn.Conv2d(3, 4, 3, stride=2),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(5),
        *[torch.nn.Linear(5, 5) for _ in range(4)],
    )
    x = torch.randn(2, 3, 9, 9)
    model(x)  # materialize the lazy layer
    for inputs in (x, torch.randn(4, 3, 9, 9), x):
        ours = flop_counting_mode()
        with ours:
            model(inputs).sum().backward()
        theirs = FlopCounterMode(display=False)
        with theirs:
            model(inputs).sum().backward()
        expected = {str(op): n for op, n in theirs.get_flop_counts()["Global"].items()}
        assert {str(op): n for op, n in ours.counts.items()} == expected
