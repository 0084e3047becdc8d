"""The second half of a long stream checked in a forked process, beside the first.

Reading an event from SQLite and hashing it (link, leaf, node) cost about the
same, so one core caps how fast a long stream is checked (docs/performance.md).
The chain check of ordinary events needs nothing from the events before but
the stored hash, id and seq of the one just before (and the stream's chain
format, which its first event fixes: found before the fork), so the stream splits at
``m`` (its middle): this process checks events ``1..m`` as always, while a forked child
reads ``m..n`` on its own read-only connection and checks the ordinary events
there inline (``StreamCheck.feed`` with ``stop``), stopping at the first event
that is not ordinary, and sends back their leaves as the perfect subtrees of
the stream's Merkle tree they form (``blocks``: widths that divide their
position, cut at every signed size); this process stacks those onto its
frontier (``Frontier.append_subtree``) and takes the heads it needs on the way.

The child's work is taken only when this process's own check ends exactly
where the child began (``m`` events counted, the next seq expected ``m + 1``,
the last hash and id those the child started from, the stream not ended, the
same chain format found from the first event);
otherwise, and after an early stop, the rest is checked here, event by event
as always (the rows the child checked are skipped). Nothing the child says is
believed but hashes it recomputed from the rows: the verdicts are the
sequential check's. Only SQLite files, only where ``fork`` exists, only for a
stream of at least ``MIN_EVENTS``, only while a core is free (``core_free``)
and no other thread runs (a fork copies only the caller);
any failure in the child is a fallback.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from auditlog.core.chain import ChainFormat
from auditlog.core.cpus import usable_cpus
from auditlog.integrity.chaincheck import StreamCheck
from auditlog.integrity.findings import VerifyReport
from auditlog.integrity.merkle import PackedLeaves, subtree_root
from auditlog.store.eventstore import EventStore
from auditlog.store.queries import sqlite_event_tuples, sqlite_tuple_statement

MIN_EVENTS = 200_000


@dataclass
class ChildResult:
    """What the child checked: ``rows`` ordinary events after the one at seq ``m``."""

    start_id: int
    start_hash: str
    rows: int
    expected: int
    prev: str
    last_id: int
    blocks: list[
        tuple[int, bytes]
    ]  # their leaves as perfect subtrees of the stream's tree: (width, head)
    leaves: bytes | None  # the leaf hashes themselves, concatenated, when asked for


def split_point(count: int) -> int | None:
    """Where to split a stream of ``count`` events (the middle), or None: not worth a process."""
    if count < MIN_EVENTS or not core_free():
        return None
    import threading

    if threading.active_count() > 1:
        # fork copies only the calling thread: a lock another thread held (a
        # recording's writer, a user's pool) would stay held in the child forever.
        return None
    import multiprocessing  # only for a long stream: not part of every verify's start-up

    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return count // 2


def core_free() -> bool:
    """Whether a second process would likely get a core of its own: two or more usable,
    and the load (one-minute average, which counts this process too) below one more than
    that. On a saturated machine the two halves took as long as the whole (the split
    then costs a little); with the other core only partly busy it still gained
    (docs/performance.md)."""
    cores = usable_cpus()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cores >= 2 and load < cores + 1


def _child(
    uri: str,
    statement: tuple[str, dict[str, Any]],
    run_id: str,
    stream: int,
    m: int,
    sizes: frozenset[int],
    keep: bool,
    chain: ChainFormat,
) -> ChildResult | None:
    """Check the rows from seq ``m`` on (``statement``), ordinary ones, until one is not."""
    batches: Iterator[list[tuple[Any, ...]]] = sqlite_event_tuples(uri, statement)
    first = next(batches, None)
    if not first:
        return None
    start = first[0]
    if (
        type(start[1]) is not int
        or start[1] != m
        or type(start[0]) is not int
        or type(start[-1]) is not str
    ):
        return None
    leaves: list[bytes] = []
    check = StreamCheck(run_id, stream, VerifyReport(run_id), leaves=leaves, chain=chain)
    check.grow_tree = False
    check.expected, check.prev, check.recomputed, check.last_id, check.count = (
        m + 1,
        start[-1],
        start[-1],
        start[0],
        1,
    )
    rest = [first[1:]]
    for rows in _chain(rest, batches):
        if check.feed(rows, stop=True) is not None:
            break
    return ChildResult(
        start_id=start[0],
        start_hash=start[-1],
        rows=check.count - 1,
        expected=check.expected,
        prev=check.prev,
        last_id=check.last_id,
        blocks=blocks(leaves, m, sizes),
        leaves=b"".join(leaves) if keep else None,
    )


def blocks(leaves: list[bytes], start: int, sizes: frozenset[int]) -> list[tuple[int, bytes]]:
    """``leaves`` (leaf ``start`` on) as the perfect subtrees of the tree they extend: each
    as wide as its position allows (a power of two dividing it), cut at every size in
    ``sizes`` so that the tree's head there can be taken. This process hashes the nodes
    inside them, the parent only a few dozen above."""
    end = start + len(leaves)
    cuts = [*sorted(s for s in sizes if start < s < end), end]
    out: list[tuple[int, bytes]] = []
    position = start
    for cut in cuts:
        while position < cut:
            width = position & -position if position else 1 << (cut - position).bit_length()
            while width > cut - position:
                width >>= 1
            out.append((width, subtree_root(leaves, position - start, position - start + width)))
            position += width
    return out


def _chain(
    head: list[list[tuple[Any, ...]]], tail: Iterator[list[tuple[Any, ...]]]
) -> Iterator[list[tuple[Any, ...]]]:
    yield from head
    yield from tail


def _run_child(conn: Any, *args: Any) -> None:
    try:
        result = _child(*args)
    except BaseException:  # the parent falls back to checking the rest itself
        result = None
    try:
        conn.send(result)
    except OSError:
        pass  # the parent stopped listening (it failed, or was interrupted)
    finally:
        conn.close()


def check_split(
    store: EventStore,
    check: StreamCheck,
    m: int,
    chain: ChainFormat,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Check ``check``'s stream: ``1..m`` here while a child checks the rest (in the
    stream's format ``chain``, found from its first event), then join."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=_run_child,
        daemon=True,
        args=(
            send,
            store.sqlite_read_uri(),
            sqlite_tuple_statement(check.run_id, check.stream, m),
            check.run_id,
            check.stream,
            m,
            check.sizes,
            check.leaves is not None,
            chain,
        ),
    )
    child.start()
    send.close()
    try:
        for rows in store.event_tuples(check.run_id, check.stream, upto=m):
            check.feed(rows, progress)
        try:
            result: ChildResult | None = receive.recv()
        except (EOFError, OSError):
            result = None
    finally:
        receive.close()
        child.join()
    if result is not None and check.chain == chain and _joinable(check, result, m):
        _join(check, result)
        if progress is not None:
            progress(result.rows)
        # The rows after the child's last, in (seq, id) order: all rows of seq > m.
        rest = store.event_tuples(
            check.run_id, check.stream, resume=(result.expected - 1, result.last_id)
        )
    else:
        rest = store.event_tuples(check.run_id, check.stream, after=m)
    for rows in rest:
        check.feed(rows, progress)


def _joinable(check: StreamCheck, result: ChildResult, m: int) -> bool:
    """The child began exactly where this process's check of ``1..m`` ended."""
    return (
        check.count == m
        and check.tree.size == m
        and check.expected == m + 1
        and check.tip.ended_at is None
        and check.prev == check.recomputed == result.start_hash
        and check.last_id == result.start_id
        and check.tip.seq == m
    )


def _join(check: StreamCheck, result: ChildResult) -> None:
    """Take the child's checked rows: their subtrees into the tree (heads at signed sizes
    recorded on the way), their leaves when kept, the chain's state at the last of them."""
    if not result.rows:
        return
    for width, head in result.blocks:
        check.tree.append_subtree(width, head)
        if check.tree.size in check.sizes:
            check.tip.roots[check.tree.size] = check.tree.root().hex()
    if isinstance(check.leaves, PackedLeaves) and result.leaves is not None:
        check.leaves.extend_packed(result.leaves)
    check.count += result.rows
    check.expected, check.prev, check.recomputed, check.last_id = (
        result.expected,
        result.prev,
        result.prev,
        result.last_id,
    )
    check.tip.seq, check.tip.head_hash = result.expected - 1, result.prev
