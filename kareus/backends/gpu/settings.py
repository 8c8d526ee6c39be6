"""A snapshot of a card's settings (what a run must leave as it found), and its difference.

:func:`snapshot` reads, through the NVML bindings, everything a careless run could change: the
power limit (current, enforced, default), persistence, compute, MIG and ECC mode (current and
pending), application clocks, and the highest SM and memory clocks. A value the driver refuses is
recorded as ``"unavailable: <reason>"`` (the same refusal before and after is no difference).
Units: W and MHz.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _read(fn: Callable[[], Any]) -> Any:
    try:
        v = fn()
    except Exception as e:  # noqa: BLE001 - NVMLError (NOT_SUPPORTED in a VM) and friends
        return f"unavailable: {type(e).__name__}: {e}"
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return v


def snapshot(nvml: Any, index: int = 0) -> dict[str, Any]:
    """The settings of GPU ``index`` (NVML's numbering) as a flat JSON-able dict."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    return {
        "power_limit_w": _read(lambda: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1e3),
        "enforced_power_limit_w": _read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3),
        "default_power_limit_w": _read(
            lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1e3),
        "persistence_mode": _read(lambda: nvml.nvmlDeviceGetPersistenceMode(h)),
        "compute_mode": _read(lambda: nvml.nvmlDeviceGetComputeMode(h)),
        "mig_mode": _read(lambda: nvml.nvmlDeviceGetMigMode(h)),
        "ecc_mode": _read(lambda: nvml.nvmlDeviceGetEccMode(h)),
        "applications_clock_sm_mhz": _read(lambda: nvml.nvmlDeviceGetApplicationsClock(h, sm)),
        "applications_clock_mem_mhz": _read(lambda: nvml.nvmlDeviceGetApplicationsClock(h, mem)),
        "max_sm_clock_mhz": _read(lambda: nvml.nvmlDeviceGetMaxClockInfo(h, sm)),
        "max_mem_clock_mhz": _read(lambda: nvml.nvmlDeviceGetMaxClockInfo(h, mem)),
    }


def difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """``{setting: [before, after]}`` for every setting that differs (empty: unchanged)."""
    return {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)}
