"""How many CPUs this process may use: what the thread pools that hash and read size themselves by."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
