"""The module tree of a run at a point in it, as data: what ``auditlog tree --format json``
prints and the web UI's tree shows (one builder, so both say the same)."""

from __future__ import annotations

import os
from typing import Any

from auditlog.core.replay import ModelState


def source_text(source: dict[str, Any] | None) -> str | None:
    """``file:line`` of where something was built (an absolute file relative to the cwd)."""
    if not source:
        return None
    return f"{os.path.relpath(source['file']) if os.path.isabs(source['file']) else source['file']}:{source['line']}"


def tree_json(state: ModelState, module_id: int, name: str) -> dict[str, Any]:
    """One module and its subtree as JSON (stable field names, documented in the README)."""
    node = state.modules[module_id]

    def tensors(members: dict[str, int | None]) -> list[dict[str, Any]]:
        out = []
        for member, tensor_id in members.items():
            if tensor_id is None:
                continue
            info = state.tensors[tensor_id]
            out.append(
                {
                    "name": member,
                    "tensor_id": tensor_id,
                    "shape": info.shape,
                    "dtype": info.dtype,
                    "device": info.device,
                    "requires_grad": info.requires_grad,
                    "persistent": info.persistent,
                    "source": source_text(info.source),
                    "initial_sha256": info.initial_sha256,
                    "sha256": info.snapshot_sha256,
                    "snapshot_step": info.snapshot_step,
                }
            )
        return out

    return {
        "name": name,
        "module_id": module_id,
        "class": node.cls,
        "wrapped_by": list(node.wrappers),
        "source": source_text(node.source),
        # constructed | attached (the line attaching it: its constructor was not seen) | null
        "source_kind": (node.source or {}).get("kind"),
        "parameters": tensors(node.parameters),
        "buffers": tensors(node.buffers),
        "children": [
            tree_json(state, child, child_name)
            for child_name, child in node.children.items()
            if child is not None
        ],
    }
