"""Every private torch internal auditlog relies on is still there (fails naming the torch version)."""

from __future__ import annotations

import pytest
import torch

from auditlog.capture.torch_compat import GLOBAL_HOOK_TABLES, REQUIRED, global_hook_table


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_required_internal_is_present(name: str) -> None:
    try:
        REQUIRED[name]()
    except Exception as exc:  # pragma: no cover - only on a torch that dropped it
        pytest.fail(f"torch {torch.__version__} lacks {name}: {type(exc).__name__}: {exc}")


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
        "forward_always_called": lambda hook: nn_module.register_module_forward_hook(hook, always_call=True),
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
