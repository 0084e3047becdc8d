"""A snapshot file's shape, checked against what the file can hold before anything is allocated.

A reader allocates a tensor of the file's shape and dtype (``auditlog restore``,
``state_dict``) before it decodes a byte, and both come from the file's
metadata, which anyone with write access can rewrite. A shape of ``[2**32] * 3``
made ``torch.empty`` fail with a C++ message and stack; a shape in the
terabytes would ask the allocator for them. So the shape must be a list of
non-negative integers (no floats, booleans, strings or nested lists), each and
their product times the element size below 2^63, and the element count must be
what the file's footer says it holds and what its bytes can decode to:

- a ``value`` (native) file has one row per element: its row count must be the
  element count;
- the decoded bytes of a column chunk without a dictionary are at most its
  uncompressed size (plain encoding stores every value; booleans bit-packed,
  eight to a byte), and the uncompressed size of a chunk is at most
  ``MAX_EXPANSION`` times its compressed size, which must lie inside the file;
  a chunk with a dictionary decodes to at most ``MAX_EXPANSION`` times its
  compressed size.

So a file can make a reader allocate at most its own size for plain
uncompressed values (every floating-point snapshot the writer makes), and at
most ``MAX_EXPANSION`` times its size otherwise; anything else is a one-line
``SnapshotError`` (exit 4). Only sizes and offsets are read from the footer:
pyarrow aborts the process on an out-of-range codec or encoding number when
they are read (``blobformat.value_spans``).
"""

from __future__ import annotations

import math
from typing import Any

from auditlog.store.blobpaths import SnapshotError

# Bytes a compressed (or dictionary-encoded) byte may decode to, at most. zstd's
# densest block is 4 bytes for 128 KiB (32768x); booleans are bit-packed (8x);
# a dictionary page with run-length indices adds more. The writer's densest real
# file (int64 zeros, zstd level 1) stays far below the limit.
MAX_EXPANSION = 1 << 20
_LIMIT = 1 << 63  # torch and numpy sizes are signed 64-bit


def parse_shape(value: Any, relpath: str) -> list[int]:
    """The shape a file's metadata gives (decoded JSON), or ``SnapshotError``."""
    if not isinstance(value, list) or not all(type(d) is int and 0 <= d < _LIMIT for d in value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:56] + "...]"
        raise SnapshotError(
            f"snapshot file {relpath!r} is unreadable: its shape {shown} is not a list of "
            "non-negative 64-bit integers"
        )
    return value


def check_extent(
    metadata: Any, size: int, layout: str, dtype: str, width: int, numel: int, relpath: str
) -> None:
    """``SnapshotError`` unless ``numel`` elements of ``dtype`` (``width`` bytes each) can
    be what a file of ``size`` bytes with this footer holds (module docstring)."""
    nbytes = numel * width
    if nbytes >= _LIMIT:
        raise SnapshotError(
            f"snapshot file {relpath!r} is unreadable: its shape claims {numel} elements ({nbytes} bytes), "
            "more than any tensor can hold"
        )
    rows = int(metadata.num_rows)
    if layout == "native" and rows != numel:  # as ``blobformat.check_size`` says it after a decode
        raise SnapshotError(f"snapshot file {relpath!r} holds {rows * width} of {nbytes} bytes")
    bound = 0
    for index in range(int(metadata.num_row_groups)):
        column = metadata.row_group(index).column(0)
        compressed, uncompressed = (
            int(column.total_compressed_size),
            int(column.total_uncompressed_size),
        )
        start = int(column.data_page_offset)
        if column.has_dictionary_page and column.dictionary_page_offset is not None:
            start = min(start, int(column.dictionary_page_offset))
        if compressed < 0 or uncompressed < 0 or start < 0 or start + compressed > size:
            raise SnapshotError(
                f"snapshot file {relpath!r} is unreadable: row group {index} lies outside the file's "
                f"{size} bytes"
            )
        if uncompressed > max(compressed, 1) * MAX_EXPANSION:
            raise SnapshotError(
                f"snapshot file {relpath!r} is unreadable: row group {index} claims {uncompressed} bytes "
                f"from {compressed}"
            )
        if column.has_dictionary_page:
            bound += max(compressed, 1) * MAX_EXPANSION
        else:
            bound += uncompressed * (8 if dtype == "bool" else 1)
    if nbytes > bound:
        raise SnapshotError(
            f"snapshot file {relpath!r} is unreadable: its shape needs {nbytes} bytes and it can hold at "
            f"most {bound}"
        )


def element_count(shape: list[int]) -> int:
    """The product of a checked shape (``parse_shape``): exact, never overflowing."""
    return math.prod(shape)
