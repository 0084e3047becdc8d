"""Structural checks: find the changes no PyTorch hook reports, and record them.

``del model.sub``, ``.to(dtype/device)``, ``.half()``, ``requires_grad_()``,
direct writes into ``_parameters``/``_modules`` and parameter swaps under
``torch.__future__.set_overwrite_module_params_on_conversion`` fire no hook. The
recorder keeps the state its own events describe (the same ``replay.apply`` the
read side uses); a check walks the live module tree and emits an explicit event
for every difference, so replaying the record yields the live structure again.

Checks run after every ``check_every``-th optimizer step (policy; spaced to a
multiple of it while they would take more than ``check_share`` of the training
time: ``Policy.check_interval``), when a root
module is sealed (its first forward), before every snapshot and at run end; a
change is dated by the check that found it.
"""

from __future__ import annotations

from typing import Any

import torch

from auditlog.capture.construction import ConstructionHooks
from auditlog.capture.context import RecordingContext
from auditlog.capture.roots import RootTracking
from auditlog.capture.torch_compat import (
    buffers_of,
    children_of,
    is_uninitialized,
    parameters_of,
)
from auditlog.capture.wrappers import unwrap_model
from auditlog.core.tensors import dtype_name

_MISSING = object()


def _tensor_facts(tensor: torch.Tensor, parameter: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "shape": list(tensor.shape),
        "dtype": dtype_name(tensor.dtype),
        "device": str(tensor.device),
    }
    if parameter:
        facts["requires_grad"] = bool(tensor.requires_grad)
    return facts


class StructureChecks:
    """``check_structure``: the live module tree against the state the record describes.

    What a check finds is recorded as construction records it (``construction``:
    registrations with ``detected_at``, adoption of unknown modules) or as
    ``structure_changed``."""

    def __init__(
        self, ctx: RecordingContext, construction: ConstructionHooks, roots: RootTracking
    ) -> None:
        self.ctx = ctx
        self.construction = construction
        self.roots = roots
        # Per tensor id, the (shape, dtype, device, requires_grad) last found equal to
        # the record.
        self.checked_facts: dict[int, tuple[Any, ...]] = {}

    def check(self, roots: list[torch.nn.Module] | None, where: str) -> None:
        """Run a structural check over ``roots`` (default: every live root)."""
        self.check_structure(
            self.roots.live_roots() if roots is None else [unwrap_model(r) for r in roots], where
        )

    def check_structure(self, roots: list[torch.nn.Module], where: str) -> int:
        """Compare live modules under ``roots`` with the recorded state; return changes emitted."""
        modules, construction = self.ctx.modules, self.construction
        emitted = 0
        seen: set[int] = set()
        for root in roots:
            if modules.lookup(root) is None:
                construction.adopt(root)
            for module in root.modules():
                module_id = modules.lookup(module)
                if module_id is None or module_id in seen:
                    continue
                seen.add(module_id)
                node = self.ctx.state.modules.get(module_id)
                if node is None:
                    continue
                emitted += self._check_children(module, module_id, node.children, where)
                emitted += self._check_tensors(
                    module, module_id, node.parameters, "parameter", where
                )
                emitted += self._check_tensors(module, module_id, node.buffers, "buffer", where)
        return emitted

    def _removed(self, module_id: int, member: str, name: str, old: int | None, where: str) -> None:
        self.ctx.emit(
            "structure_changed",
            module_id,
            old if member != "module" else None,
            {
                "change": "removed",
                "member": member,
                "name": name,
                "old_id": old,
                "detected_at": where,
            },
        )

    def _check_children(
        self,
        module: torch.nn.Module,
        module_id: int,
        known: dict[str, int | None],
        where: str,
    ) -> int:
        modules, construction = self.ctx.modules, self.construction
        emitted = 0
        live = children_of(module)
        for name in [n for n in known if n not in live]:
            self._removed(module_id, "module", name, known[name], where)
            emitted += 1
        for name, child in live.items():
            child_id = None
            if child is not None:
                if modules.lookup(child) is None:
                    construction.adopt(child)
                child_id = modules.lookup(child)
            if known.get(name, _MISSING) != child_id:
                construction.register_child(module, name, child, detected_at=where)
                emitted += 1
        return emitted

    def _check_tensors(
        self,
        module: torch.nn.Module,
        module_id: int,
        known: dict[str, int | None],
        member: str,
        where: str,
    ) -> int:
        ctx = self.ctx
        emitted = 0
        live: dict[str, torch.Tensor | None] = (
            parameters_of(module) if member == "parameter" else buffers_of(module)
        )
        for name in [n for n in known if n not in live]:
            self._removed(module_id, member, name, known[name], where)
            emitted += 1
        for name, tensor in live.items():
            tensor_id = None if tensor is None else ctx.tensors.lookup(tensor)
            if (tensor is not None and tensor_id is None) or known.get(name, _MISSING) != tensor_id:
                self.construction.register_tensor(module, name, tensor, member, detected_at=where)
                emitted += 1
                continue
            if tensor is None or tensor_id is None or is_uninitialized(tensor):
                continue  # a lazy placeholder has no facts until it is materialized
            # The raw facts as last found equal to the record: comparing torch's own
            # objects is cheaper than building the recorded form of each tensor.
            raw = (tensor.shape, tensor.dtype, tensor.device, tensor.requires_grad)
            if self.checked_facts.get(tensor_id) == raw:
                continue
            info = ctx.state.tensors.get(tensor_id)
            if info is None:
                continue
            facts = _tensor_facts(tensor, member == "parameter")
            before = {k: getattr(info, k) for k in facts}
            self.checked_facts[tensor_id] = raw  # true of the record after this check
            if before != facts:
                changed = {k: v for k, v in facts.items() if before[k] != v}
                ctx.emit(
                    "structure_changed",
                    module_id,
                    tensor_id,
                    {
                        "change": "tensor_changed",
                        "member": member,
                        "name": name,
                        "before": {k: before[k] for k in changed},
                        "after": changed,
                        "detected_at": where,
                    },
                )
                emitted += 1
        return emitted
