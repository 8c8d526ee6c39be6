"""A snapshot of a card's settings (what a run must leave as it found), and its difference.

:func:`snapshot` reads, through the NVML bindings, everything a careless run could change: the
power limit (current, enforced, default), persistence, compute, MIG and ECC mode (current and
pending), application clocks, and the highest SM and memory clocks. A value the driver refuses is
recorded as ``"unavailable: <reason>"`` (the same refusal before and after is no difference).
Units: W and MHz.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeAlias

from kareus.backends.gpu.nvml_api import NvmlLike
from kareus.json_types import Json

#: One setting: a number, a ``[current, pending]`` mode pair, or ``"unavailable: <reason>"``.
Setting: TypeAlias = "int | float | str | list[int]"


def _read(fn: Callable[[], int | float | str | bytes | list[int]]) -> Setting:
    try:
        v = fn()
    except Exception as e:  # noqa: BLE001 - NVMLError (NOT_SUPPORTED in a VM) and friends
        return f"unavailable: {type(e).__name__}: {e}"
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return v


@dataclass(frozen=True)
class CardSettings:
    """The settings of one card (power limits in W, clocks in MHz, modes as NVML's codes; MIG and
    ECC mode as ``[current, pending]``); any of them ``"unavailable: <reason>"``."""

    power_limit_w: Setting
    enforced_power_limit_w: Setting
    default_power_limit_w: Setting
    persistence_mode: Setting
    compute_mode: Setting
    mig_mode: Setting
    ecc_mode: Setting
    applications_clock_sm_mhz: Setting
    applications_clock_mem_mhz: Setting
    max_sm_clock_mhz: Setting
    max_mem_clock_mhz: Setting

    def to_dict(self) -> dict[str, Json]:
        """The flat JSON form (field order)."""
        return {f.name: self.value(f.name) for f in fields(self)}

    def value(self, name: str) -> Setting:
        """The setting called ``name``."""
        v: Setting = getattr(self, name)
        return v


def snapshot(nvml: NvmlLike, index: int = 0) -> CardSettings:
    """The settings of GPU ``index`` (NVML's numbering)."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    return CardSettings(
        power_limit_w=_read(lambda: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1e3),
        enforced_power_limit_w=_read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3),
        default_power_limit_w=_read(
            lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1e3),
        persistence_mode=_read(lambda: nvml.nvmlDeviceGetPersistenceMode(h)),
        compute_mode=_read(lambda: nvml.nvmlDeviceGetComputeMode(h)),
        mig_mode=_read(lambda: nvml.nvmlDeviceGetMigMode(h)),
        ecc_mode=_read(lambda: nvml.nvmlDeviceGetEccMode(h)),
        applications_clock_sm_mhz=_read(lambda: nvml.nvmlDeviceGetApplicationsClock(h, sm)),
        applications_clock_mem_mhz=_read(lambda: nvml.nvmlDeviceGetApplicationsClock(h, mem)),
        max_sm_clock_mhz=_read(lambda: nvml.nvmlDeviceGetMaxClockInfo(h, sm)),
        max_mem_clock_mhz=_read(lambda: nvml.nvmlDeviceGetMaxClockInfo(h, mem)),
    )


def difference(before: CardSettings, after: CardSettings) -> dict[str, list[Setting]]:
    """``{setting: [before, after]}`` for every setting that differs (empty: unchanged)."""
    return {f.name: [before.value(f.name), after.value(f.name)]
            for f in sorted(fields(CardSettings), key=lambda f: f.name)
            if before.value(f.name) != after.value(f.name)}
