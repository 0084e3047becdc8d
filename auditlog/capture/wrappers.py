"""Data-parallel wrappers (DDP, DataParallel, FSDP1) around the user's model.

Data-parallel wrappers hold the user's model under one attribute and are not
part of it: their forward calls the model's (whose hooks fire too), their state
dict only adds a prefix. Known by qualified class name, so that checking a module
imports nothing (torch.distributed may be absent); subclasses count (MRO). Kept
apart from ``torch_compat`` (its private torch internals), which is at its size limit.
"""

from __future__ import annotations

import torch

from auditlog.capture.torch_compat import children_of, is_compiled_wrapper, unwrap_compiled

PARALLEL_WRAPPERS: dict[str, str] = {
    "torch.nn.parallel.distributed.DistributedDataParallel": "module",
    "torch.nn.parallel.data_parallel.DataParallel": "module",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel": "_fsdp_wrapped_module",
}
_wrapper_attr: dict[type, str | None] = {}


def parallel_wrapper_attr(module: torch.nn.Module) -> str | None:
    """The attribute holding the wrapped model when ``module`` is a data-parallel wrapper
    (DDP, DataParallel, FSDP1), else None. One dict lookup per call after the first."""
    cls = type(module)
    try:
        return _wrapper_attr[cls]
    except KeyError:
        pass
    found = None
    for base in cls.__mro__:
        found = PARALLEL_WRAPPERS.get(f"{base.__module__}.{base.__qualname__}")
        if found is not None:
            break
    _wrapper_attr[cls] = found
    return found


def unwrap_model(module: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside any torch.compile and data-parallel wrappers."""
    for _ in range(8):  # DDP(compile(model)) and the like; never loops forever
        attr = parallel_wrapper_attr(module)
        inner = children_of(module).get(attr) if attr is not None else None
        if inner is None and is_compiled_wrapper(module):
            inner = unwrap_compiled(module)
        if inner is None:
            return module
        module = inner
    return module
