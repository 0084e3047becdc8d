"""Construction: module, parameter and buffer registration, adoption, and sealing.

A parameter registration hook sees the tensor before its initializer runs
(``nn.Linear`` registers ``torch.empty`` then calls ``reset_parameters``), so
registration records shape, dtype and device only; the initial values are
recorded when construction is complete (``seal``: the root's first forward, the
first optimizer step, an explicit ``run.seal(model)``, or run end).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from auditlog.capture.base import RecorderBase, class_name, module_tensors
from auditlog.capture.payloads import HostCopy, SealItems
from auditlog.capture.registrations import ABSENT, qualified
from auditlog.capture.source import Site, construction_location, user_site
from auditlog.capture.torch_compat import (
    buffers_of,
    children_of,
    compile_guard,
    is_compiled_wrapper,
    is_persistent_buffer,
    is_uninitialized,
    parallel_wrapper_attr,
    parameters_of,
    registering_persistent,
    unwrap_model,
)
from auditlog.core.chain import Clean
from auditlog.core.tensors import batch_records


class ConstructionHooks(RecorderBase):
    """The three registration hooks, adoption of modules built before recording, sealing."""

    # ------------------------------------------------------------------ hooks
    @compile_guard
    def _on_module_registered(
        self, parent: torch.nn.Module, name: str, child: torch.nn.Module | None
    ) -> None:
        try:
            if is_compiled_wrapper(parent):
                return None  # torch.compile's wrapper is not part of the model's structure
            if parallel_wrapper_attr(parent) is not None:
                self.wrapped(
                    parent, name, child
                )  # DDP/FSDP: a fact about the model, not a part of it
                return None
            if (
                child is not None
                and self.modules.lookup(child) is None
                and (children_of(child) or parameters_of(child) or buffers_of(child))
            ):
                # A module whose members never passed through our hooks: built
                # before recording, or a deepcopy (TransformerEncoder clones its
                # layer that way). Record its subtree as adopted first.
                self.adopt(child)
                if child is not None:
                    self.check_in_place(child, subtree=True)
            elif child is not None:
                self.check_in_place(child, subtree=False)
            self.register_child(parent, name, child)
        except Exception as exc:
            self.fault("module_registration_hook", exc)
        return None

    @compile_guard
    def _on_parameter_registered(
        self, module: torch.nn.Module, name: str, param: torch.Tensor | None
    ) -> None:
        try:
            self.register_tensor(module, name, param, "parameter", source=user_site(2))
        except Exception as exc:
            self.fault("parameter_registration_hook", exc)
        return None

    @compile_guard
    def _on_buffer_registered(
        self, module: torch.nn.Module, name: str, buffer: torch.Tensor | None
    ) -> None:
        try:
            self.register_tensor(
                module,
                name,
                buffer,
                "buffer",
                source=user_site(2),
                persistent=registering_persistent(),
            )
        except Exception as exc:
            self.fault("buffer_registration_hook", exc)
        return None

    # ------------------------------------------------------------------ events
    def register_child(
        self,
        parent: torch.nn.Module,
        name: str,
        child: torch.nn.Module | None,
        adopted: bool = False,
        detected_at: str | None = None,
    ) -> None:
        """Emit ``module_registered`` (from the hook, adoption or a structural check).

        Deferred (registrations.py): the facts now, the payload on the writer."""
        self._registrations += 1
        parent_ref, parent_new = self.module_ref(parent)
        code = line = None
        attached = False
        if child is None:
            child_id = child_cls = None
        else:
            ref = self.module_ref(child)[0]
            child_id = ref.number
            child_cls = qualified(type(child))
            if not adopted:
                code, line, attached = ref.code, ref.line, ref.attached
        parent_id = parent_ref.number
        parent_code: Any = ABSENT
        parent_line = None
        parent_attached = False
        if parent_new and not adopted:
            parent_code, parent_line, parent_attached = (
                parent_ref.code,
                parent_ref.line,
                parent_ref.attached,
            )
        self.defer(
            (
                "module_registered",
                time.time_ns(),
                self.step,
                parent_id,
                None,
                name,
                child_id,
                child_cls,
                qualified(type(parent)),
                code,
                line,
                attached,
                parent_code,
                parent_line,
                parent_attached,
                adopted,
                detected_at,
            )
        )

    def wrapped(self, wrapper: torch.nn.Module, name: str, child: torch.nn.Module | None) -> None:
        """Emit ``module_wrapped``: the model was put inside a data-parallel wrapper.

        The wrapper gets no module id and is not part of the tree: the model stays
        the root, and its names carry no ``module.`` prefix.
        """
        if child is None or name != parallel_wrapper_attr(wrapper):
            return
        child = unwrap_model(child)
        if self.modules.lookup(child) is None and (
            children_of(child) or parameters_of(child) or buffers_of(child)
        ):
            self.adopt(child)
        self.emit(
            "module_wrapped",
            self.module_id(child),
            None,
            Clean(
                {
                    "wrapper_class": class_name(wrapper),
                    "attr": name,
                    "source": construction_location(wrapper),
                }
            ),
        )

    def register_tensor(
        self,
        module: torch.nn.Module,
        name: str,
        tensor: torch.Tensor | None,
        member: str,
        source: Site | None = None,
        persistent: bool | None = None,
        adopted: bool = False,
        detected_at: str | None = None,
    ) -> None:
        """Emit ``parameter_registered`` / ``buffer_registered`` for one member (deferred:
        registrations.py)."""
        self._registrations += 1
        module_ref, new = self.module_ref(module)
        module_id = module_ref.number
        tensor_id = dtype = device = None
        lazy = False
        shape: Any = ()
        if tensor is not None:
            # The place is remembered with the id (ids.py): no reference to the tensor.
            tensor_id, _ = self.tensors.get(tensor, module, member, name)
            self._unsealed.add(tensor_id)
            dtype, device = tensor.dtype, tensor.device
            if is_uninitialized(tensor):
                # A lazy module's placeholder: its shape comes with materialization,
                # recorded then as a structure change (and sealed after it).
                self._lazy.add(tensor_id)
                lazy = True
            else:
                shape = tensor.shape
        flag: bool | None
        if member == "parameter":
            flag = None if tensor is None else bool(tensor.requires_grad)
        else:
            if persistent is None and (adopted or detected_at is not None):
                persistent = is_persistent_buffer(module, name)
            flag = persistent
        module_code: Any = ABSENT
        module_line = None
        module_attached = False
        if new and not adopted:
            module_code, module_line, module_attached = (
                module_ref.code,
                module_ref.line,
                module_ref.attached,
            )
        code, line = (None, None) if source is None else source
        self.defer(
            (
                f"{member}_registered",
                time.time_ns(),
                self.step,
                module_id,
                tensor_id,
                name,
                qualified(type(module)),
                dtype,
                device,
                lazy,
                flag,
                code,
                line,
                module_code,
                module_line,
                module_attached,
                adopted,
                detected_at,
                None if tensor is None or lazy else len(shape),
                *shape,
            )
        )

    def adopt(self, root: torch.nn.Module) -> None:
        """Emit registration events for modules/tensors that existed before recording."""
        unknown = [m for m in root.modules() if self.modules.lookup(m) is None]
        for module in unknown:
            self.module_id(module)
            for name, child in children_of(module).items():
                self.register_child(module, name, child, adopted=True)
            for name, param in parameters_of(module).items():
                self.register_tensor(module, name, param, "parameter", adopted=True)
            for name, buf in buffers_of(module).items():
                self.register_tensor(module, name, buf, "buffer", adopted=True)

    def materialized(self, trigger: str) -> None:
        """Record lazy placeholders that were materialized since (their real shape, a
        structure change no hook reports), so that the seal after this names real tensors."""
        live = [self.tensors.object(t) for t in self._lazy]
        if any(t is not None and not is_uninitialized(t) for t in live):
            self.check_structure(self.live_roots(), trigger)

    # ------------------------------------------------------------------ sealing
    def seal(self, root: torch.nn.Module | None, trigger: str, tensors: Any = None) -> None:
        """Emit ``construction_sealed`` for every not-yet-sealed tensor reachable here."""
        items: list[tuple[int, HostCopy]] = []
        candidates: Iterator[torch.Tensor]
        if root is not None:
            root = unwrap_model(root)
            if self.modules.lookup(root) is None:
                self.adopt(root)
            else:
                # Tensors swapped in without a hook (``.to()`` replaces buffers) are
                # registered first, so they are sealed with the rest.
                self.check_structure([root], trigger)
            candidates = module_tensors(root)
        elif tensors is not None:
            candidates = iter(tensors)
        else:
            candidates = (
                t for t in map(self.tensors.object, list(self._unsealed)) if t is not None
            )
        seen: set[int] = set()
        for tensor in candidates:
            tensor_id = self.tensors.lookup(tensor)
            if tensor_id is None or tensor_id in seen or tensor_id not in self._unsealed:
                continue
            if is_uninitialized(tensor):
                continue  # no values yet: sealed once materialized
            seen.add(tensor_id)
            self._unsealed.discard(tensor_id)
            self._lazy.discard(tensor_id)
            with torch.no_grad():
                items.append((tensor_id, HostCopy(tensor, with_stats=True)))
        if root is not None:
            self._scanned[root] = self._registrations
            self.track_root(root)
        if items:
            # Device statistics of the seal go to the host together (no GIL-held sync on the writer).
            batch_records([copy.stats for _, copy in items if copy.stats is not None])
            module_id = None if root is None else self.modules.lookup(root)
            store = self.policy.snapshot_initial
            self.emit(
                "construction_sealed",
                module_id,
                None,
                {"trigger": trigger, "stored": store, "tensors": SealItems(items, store)},
            )
