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


def hash_threads() -> int:
    """Threads hashing the leaves of one large tensor (content hash v2,
    ``auditlog.core.hashing``): every usable CPU, at most 8. The work is the same
    whatever the count (a snapshot's hashing takes the same CPU time from training
    on one thread or on several); more threads only finish it sooner, and a
    restore or verify waits for nothing else."""
    return max(1, min(8, usable_cpus()))
