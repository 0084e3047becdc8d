"""Energy counters read at run start and end (RAPL through Linux powercap).

The EU AI Act's GPAI documentation asks for the energy used in training where
it is known. Intel and AMD CPUs expose cumulative energy counters per package
and DRAM zone under ``/sys/class/powercap/intel-rapl:*`` (``energy_uj``, which
wraps at ``max_energy_range_uj``). Reading them twice costs microseconds and
needs no library; the difference is the host's energy over the run, every
process on it included (documented as such: the counters cannot tell
processes apart). Where no counter is readable (a VM, a container without
the sysfs files, non-root on recent kernels) the record says "not measured".
GPU counters (NVML) are not read: documented in docs/compliance.md.

``AUDITLOG_POWERCAP`` names another root than ``/sys/class/powercap`` (a
copy of the sysfs tree, e.g. for tests on machines without RAPL).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")
MAX_ZONES = 64  # a bound on what a crafted or unusual sysfs tree can make us read


def energy_counters() -> dict[str, Any] | None:
    """``{source, ts_ns, zones: {zone: {name, energy_uj, max_energy_range_uj}}}``, or None
    when no counter could be read. Never raises."""
    root = Path(os.environ.get("AUDITLOG_POWERCAP") or POWERCAP)
    zones: dict[str, dict[str, Any]] = {}
    try:
        candidates = sorted(p for p in root.glob("intel-rapl:*") if p.is_dir())[:MAX_ZONES]
    except OSError:
        return None
    for zone in candidates:
        try:
            energy = int((zone / "energy_uj").read_text().strip())
            top = zone / "max_energy_range_uj"
            max_range = int(top.read_text().strip()) if top.exists() else None
            name = (zone / "name").read_text().strip()[:64] if (zone / "name").exists() else None
        except (OSError, ValueError):
            continue
        zones[zone.name] = {"name": name, "energy_uj": energy, "max_energy_range_uj": max_range}
    if not zones:
        return None
    return {"source": "rapl", "ts_ns": time.time_ns(), "zones": zones}
