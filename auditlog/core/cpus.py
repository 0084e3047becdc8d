"""How many CPUs this process may use: what the thread pools that hash and read size themselves by."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def side_by_side(at_least: int) -> int:
    """Threads for work that scales with cores (hashing a snapshot's tensors, reading
    them back): half the usable CPUs, so that the threads feeding them (writes,
    reads) keep a core, at most 4, and no fewer than ``at_least``."""
    return max(at_least, min(4, usable_cpus() // 2))
