"""The content hash of a tensor, without torch: what a verifier needs to recompute it.

``auditlog.tensor_hash`` is SHA-256 over ``HASH_PREFIX``, the JSON header
``[dtype name, shape]`` (compact separators) and a NUL byte, then the tensor's
bytes in C order. ``content_hasher`` starts that hash from a dtype name and a
shape alone, so that the read side (``auditlog verify``, the read model's
snapshot checks) can feed it the bytes it decoded from a Parquet file with
pyarrow and numpy, and never import torch; ``tensor_hash`` feeds it a tensor's
bytes. One definition, two callers: they cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

HASH_PREFIX = b"auditlog-tensor-v1\0"


def content_hasher(dtype: str, shape: Sequence[int]) -> hashlib._Hash:
    """A SHA-256 object that has seen the prefix and header of a ``dtype`` tensor of ``shape``;
    ``update`` it with the tensor's C-order bytes and take ``hexdigest()``."""
    digest = hashlib.sha256(HASH_PREFIX)
    header = json.dumps([dtype, [int(d) for d in shape]], separators=(",", ":"))
    digest.update(header.encode() + b"\0")
    return digest
