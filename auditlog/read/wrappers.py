"""Rebuilding wrapper tensor subclasses (TwoTensor, Float8-like) from their stored parts.

A snapshot stores a wrapper subclass through its public representation: every
inner tensor of ``__tensor_flatten__`` as a plain content-addressed tensor, with
the class's qualified name, the flatten context's repr and the wrapper's own
shape and stride (``snapshot_taken`` entries, ``subclass``). Rebuilding calls
the class's ``__tensor_unflatten__`` with the inner tensors read back (each
checked against its chained hash), which gives the wrapper bitwise as it was.

The class is looked up among modules already imported, never imported by the
name the store gives: a crafted store must not make a reader run code it
names. The user who restores a model has imported its code anyway. A context
that was not ``None`` is stored as its repr only, which cannot be turned back
into the object: such a wrapper is refused with the reason, and
``wrappers="first"`` gives its first inner tensor as a plain one.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from auditlog.core.errors import AuditlogError
from auditlog.core.hashing import hash_text

if TYPE_CHECKING:
    import torch

    from auditlog.store.blobs import SnapshotStore


def rebuild_wrappers(
    state: dict[str, torch.Tensor],
    wrappers: dict[str, dict[str, Any]],
    files: SnapshotStore,
    when: str,
) -> None:
    """Replace each wrapper key's first inner tensor in ``state`` by the rebuilt wrapper."""
    for key, facts in wrappers.items():
        if key not in state:
            continue
        cls = wrapper_class(key, facts)
        inner_shas = {
            name: str(hash_text(sha)) for name, sha in facts["inner"].items()
        }  # never a dict as a key
        wanted = [(sha, f"{key}.{name} at {when}") for name, sha in inner_shas.items()]
        loaded = files.read_many(wanted)
        inner = {name: loaded[sha] for name, sha in inner_shas.items()}
        if any("." in name for name in inner):
            raise AuditlogError(
                f"cannot rebuild {key} at {when}: {facts['type']} nests wrappers ({', '.join(inner)}); "
                "restore with wrappers='first' and rebuild it from Run.wrappers_at()"
            )
        first = state[key]
        shape = facts.get("shape") or list(first.shape)
        stride = facts.get("stride") or list(first.stride())
        try:
            state[key] = cls.__tensor_unflatten__(inner, None, tuple(shape), tuple(stride))
        except Exception as exc:
            raise AuditlogError(
                f"cannot rebuild {key} at {when}: {facts['type']}.__tensor_unflatten__ "
                f"failed ({type(exc).__name__}: {exc})"
            ) from None


def wrapper_class(key: str, facts: dict[str, Any]) -> Any:
    """The imported class named by ``facts["type"]``, or an error saying why not."""
    import torch

    name = facts.get("type")
    if not isinstance(name, str) or not isinstance(facts.get("inner"), dict) or not facts["inner"]:
        raise AuditlogError(
            f"cannot rebuild {key}: its snapshot entry names no wrapper class and inner tensors"
        )
    if facts.get("ctx") is not None:
        raise AuditlogError(
            f"cannot rebuild {key}: {name}'s flatten context was stored as text only ({str(facts['ctx'])[:80]}); "
            "restore with wrappers='first' for its first inner tensor, or rebuild it from Run.wrappers_at()"
        )
    found = _imported(name)
    if not (
        isinstance(found, type)
        and issubclass(found, torch.Tensor)
        and hasattr(found, "__tensor_unflatten__")
    ):
        raise AuditlogError(
            f"cannot rebuild {key}: {name} is no tensor subclass imported in this process (auditlog never "
            "imports code a store names); import it first, or restore with wrappers='first' for its first inner tensor"
        )
    return found


def _imported(qualified: str) -> Any:
    """``module.Class`` (or ``module.Outer.Inner``) among the modules already imported."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        found: Any = module
        for attr in parts[cut:]:
            found = getattr(found, attr, None)
            if found is None:
                return None
        return found
    return None
