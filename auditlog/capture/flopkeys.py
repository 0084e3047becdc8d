"""The key of one FLOP formula's answer: the operator, its arguments' shapes and plain values.

A model of many equal layers asks torch's FLOP formulas the same question thousands
of times, and each formula reads its arguments through a slow pytree walk; the
counting mode (``torch_compat.flop_counting_mode``) keeps each answer under this
key. Pure: shapes and plain values only, no torch internals.
"""

from __future__ import annotations

from typing import Any

import torch

_PLAIN = (
    int,
    float,
    bool,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _flop_key_part(value: Any) -> Any:
    """A hashable stand-in for one argument of a FLOP formula, or a ``KeyError``
    for one the formula might read more of than we can key on."""
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(map(_flop_key_part, value)))
    raise KeyError(type(value))


def flop_key(func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> Any:
    """What a FLOP formula's answer depends on: the operator overload, the
    arguments' shapes and plain values, the output's shape; None when unsure."""
    try:
        return (
            func,
            _flop_key_part(tuple(args)),
            tuple(sorted((name, _flop_key_part(value)) for name, value in kwargs.items())),
            _flop_key_part(out),
        )
    except (KeyError, TypeError):
        return None
