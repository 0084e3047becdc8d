"""Construction: module, parameter and buffer registration, adoption, and sealing.

A parameter registration hook sees the tensor before its initializer runs
(``nn.Linear`` registers ``torch.empty`` then calls ``reset_parameters``), so
registration records shape, dtype and device only; the initial values are
recorded when construction is complete (``seal``: the root's first forward, the
first optimizer step, an explicit ``run.seal(model)``, or run end).

This component owns what construction leaves to settle: the tensors not sealed
yet, the lazy placeholders not materialized yet, and the structure version (a
count of registrations) that other components compare to know whether the
model changed. Sealing a root remembers it (``roots.py``) and first registers
what changed without a hook (``structure.py``).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from auditlog.capture.context import RecordingContext
from auditlog.capture.payloads import HostCopy, SealItems
from auditlog.capture.registrations import ABSENT, class_name, qualified
from auditlog.capture.source import Site, construction_location, user_site
from auditlog.capture.torch_compat import (
    buffers_of,
    children_of,
    compile_guard,
    is_compiled_wrapper,
    is_persistent_buffer,
    is_uninitialized,
    parameters_of,
    registering_persistent,
)
from auditlog.capture.wrappers import parallel_wrapper_attr, unwrap_model
from auditlog.core.chain import Clean
from auditlog.core.tensors import batch_records

if TYPE_CHECKING:
    from auditlog.capture.roots import RootTracking
    from auditlog.capture.structure import StructureChecks


class InPlaceCheck(Protocol):
    """backward=full's look for in-place modules (``Recorder.check_in_place``): it swaps
    the recorder's hooks, so the Recorder does it; construction and activity call it."""

    def __call__(self, module: torch.nn.Module, subtree: bool) -> None: ...


class ConstructionHooks:
    """The three registration hooks, adoption of modules built before recording, sealing."""

    structure: StructureChecks  # set by ``connect``: the two need each other
    roots: RootTracking

    def __init__(self, ctx: RecordingContext, check_in_place: InPlaceCheck) -> None:
        self.ctx = ctx
        self.check_in_place = check_in_place
        # Tensors registered and not sealed yet; tensor ids registered uninitialized
        # (lazy modules) and not sealed yet: the optimizer's pre hook looks for their
        # materialization (a hookless shape change).
        self.unsealed: set[int] = set()
        self.lazy: set[int] = set()
        # How many registrations so far (a structure version), and the version each
        # root was last scanned at (sealed or checked).
        self.registrations = 0
        self.scanned: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()

    def connect(self, structure: StructureChecks, roots: RootTracking) -> None:
        """The components sealing uses, which use this one in turn (set by the Recorder)."""
        self.structure = structure
        self.roots = roots

    def on_constructed(self, module: torch.nn.Module, site: Site | None) -> None:
        """``constructors`` listener: ``module`` was just constructed at ``site``."""
        try:
            if site is not None:
                self.ctx.modules.note(module, site)
        except Exception as exc:
            self.ctx.fault("construction_site", exc)

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
                and self.ctx.modules.lookup(child) is None
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
            self.ctx.fault("module_registration_hook", exc)
        return None

    @compile_guard
    def _on_parameter_registered(
        self, module: torch.nn.Module, name: str, param: torch.Tensor | None
    ) -> None:
        try:
            self.register_tensor(module, name, param, "parameter", source=user_site(2))
        except Exception as exc:
            self.ctx.fault("parameter_registration_hook", exc)
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
            self.ctx.fault("buffer_registration_hook", exc)
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
        ctx = self.ctx
        self.registrations += 1
        parent_ref, parent_new = ctx.module_ref(parent)
        code = line = None
        attached = False
        if child is None:
            child_id = child_cls = None
        else:
            ref = ctx.module_ref(child)[0]
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
        ctx.defer(
            (
                "module_registered",
                time.time_ns(),
                ctx.step,
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
        if self.ctx.modules.lookup(child) is None and (
            children_of(child) or parameters_of(child) or buffers_of(child)
        ):
            self.adopt(child)
        self.ctx.emit(
            "module_wrapped",
            self.ctx.module_id(child),
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
        ctx = self.ctx
        self.registrations += 1
        module_ref, new = ctx.module_ref(module)
        module_id = module_ref.number
        tensor_id = dtype = device = None
        lazy = False
        shape: Any = ()
        if tensor is not None:
            # The place is remembered with the id (ids.py): no reference to the tensor.
            tensor_id, _ = ctx.tensors.get(tensor, module, member, name)
            self.unsealed.add(tensor_id)
            dtype, device = tensor.dtype, tensor.device
            if is_uninitialized(tensor):
                # A lazy module's placeholder: its shape comes with materialization,
                # recorded then as a structure change (and sealed after it).
                self.lazy.add(tensor_id)
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
        ctx.defer(
            (
                f"{member}_registered",
                time.time_ns(),
                ctx.step,
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
        unknown = [m for m in root.modules() if self.ctx.modules.lookup(m) is None]
        for module in unknown:
            self.ctx.module_id(module)
            for name, child in children_of(module).items():
                self.register_child(module, name, child, adopted=True)
            for name, param in parameters_of(module).items():
                self.register_tensor(module, name, param, "parameter", adopted=True)
            for name, buf in buffers_of(module).items():
                self.register_tensor(module, name, buf, "buffer", adopted=True)

    def materialized(self, trigger: str) -> None:
        """Record lazy placeholders that were materialized since (their real shape, a
        structure change no hook reports), so that the seal after this names real tensors."""
        live = [self.ctx.tensors.object(t) for t in self.lazy]
        if any(t is not None and not is_uninitialized(t) for t in live):
            self.structure.check_structure(self.roots.live_roots(), trigger)

    # ------------------------------------------------------------------ sealing
    def seal(self, root: torch.nn.Module | None, trigger: str, tensors: Any = None) -> None:
        """Emit ``construction_sealed`` for every not-yet-sealed tensor reachable here."""
        items: list[tuple[int, HostCopy]] = []
        candidates: Iterator[torch.Tensor]
        if root is not None:
            root = unwrap_model(root)
            if self.ctx.modules.lookup(root) is None:
                self.adopt(root)
            else:
                # Tensors swapped in without a hook (``.to()`` replaces buffers) are
                # registered first, so they are sealed with the rest.
                self.structure.check_structure([root], trigger)
            candidates = module_tensors(root)
        elif tensors is not None:
            candidates = iter(tensors)
        else:
            candidates = (
                t for t in map(self.ctx.tensors.object, list(self.unsealed)) if t is not None
            )
        seen: set[int] = set()
        for tensor in candidates:
            tensor_id = self.ctx.tensors.lookup(tensor)
            if tensor_id is None or tensor_id in seen or tensor_id not in self.unsealed:
                continue
            if is_uninitialized(tensor):
                continue  # no values yet: sealed once materialized
            seen.add(tensor_id)
            self.unsealed.discard(tensor_id)
            self.lazy.discard(tensor_id)
            with torch.no_grad():
                items.append((tensor_id, HostCopy(tensor, with_stats=True)))
        if root is not None:
            self.scanned[root] = self.registrations
            self.roots.track_root(root)
        if items:
            # Device statistics of the seal go to the host together (no GIL-held sync on the writer).
            batch_records([copy.stats for _, copy in items if copy.stats is not None])
            module_id = None if root is None else self.ctx.modules.lookup(root)
            store = self.ctx.policy.snapshot_initial
            self.ctx.emit(
                "construction_sealed",
                module_id,
                None,
                {"trigger": trigger, "stored": store, "tensors": SealItems(items, store)},
            )


def module_tensors(root: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Every parameter and buffer under ``root`` (shared ones once per owner)."""
    for module in root.modules():
        for param in parameters_of(module).values():
            if param is not None:
                yield param
        for buf in buffers_of(module).values():
            if buf is not None:
                yield buf
