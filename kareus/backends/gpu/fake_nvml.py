"""An in-memory stand-in for the NVML bindings (``pynvml``), for CPU tests and the device check's
dry run: the same function names, units and error type, one or more fake GPUs.

Getters report the state; setters *change* it (so a test can tell a blocked setter from one that
ran). The energy counter integrates a constant board power and advances in steps of
``update_period_s``, like NVML's counter. Units as NVML's: mW, mJ, MHz, bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from kareus.backends.gpu.nvml_api import NvmlHandle, NvmlProcess


class NVMLError(Exception):
    """The fake's error type (``pynvml.NVMLError``'s role); ``value`` is the NVML code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class MemoryInfo:
    """``nvmlDeviceGetMemoryInfo``'s result (bytes)."""

    total: int
    used: int
    free: int


@dataclass
class FakeGpu:
    """One fake card's state (NVML units)."""

    name: str = "NVIDIA H200"
    memory_total: int = 150_754_820_096  # 143771 MiB, nvidia-smi's total
    memory_used: int = 600 * 2**20
    power_mw: int = 90_000
    clocks_mhz: list[int] = field(default_factory=lambda: list(range(1980, 344, -15)))
    mem_clock_mhz: int = 3201
    locked: tuple[int, int] | None = None
    mem_locked: tuple[int, int] | None = None
    power_limit_mw: int = 700_000
    default_power_limit_mw: int = 700_000
    persistence: int = 1
    compute_mode: int = 0
    mig: tuple[int, int] = (0, 0)
    ecc: tuple[int, int] = (1, 1)
    app_clocks: tuple[int, int] = (1980, 3201)
    processes: list[NvmlProcess] = field(default_factory=list)


class FakeNvml(ModuleType):
    """A module object with pynvml's names over :class:`FakeGpu` cards.

    Args:
        gpus: The cards (default one H200).
        update_period_s: Granularity of the energy counter (s).
        time_fn: Clock (s).
    """

    NVMLError = NVMLError
    NVML_CLOCK_GRAPHICS = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4

    def __init__(self, gpus: list[FakeGpu] | None = None, *, update_period_s: float = 0.02,
                 time_fn: Callable[[], float] = time.monotonic) -> None:
        super().__init__("fake_pynvml")
        self.gpus = gpus or [FakeGpu()]
        self.update_period_s = update_period_s
        self._time = time_fn
        self._t0 = time_fn()
        self._energy_mj = [1.0e9 for _ in self.gpus]  # since "driver load"
        self._last = [self._t0 for _ in self.gpus]
        self.calls: list[str] = []
        self._nvmlGetFunctionPointer_cache: dict[str, Callable[..., object]] = {}
        # a module lists its own attributes only: put the functions and constants there
        for name in dir(type(self)):
            if name.startswith(("nvml", "NVML", "_nvmlGetFunctionPointer")):
                setattr(self, name, getattr(self, name))

    # ------------------------------------------------------------------ plumbing
    def _index(self, handle: NvmlHandle) -> int:
        """The card a handle names (the fake's handles are the cards' indices)."""
        if not isinstance(handle, int):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return handle

    def _gpu(self, handle: NvmlHandle) -> FakeGpu:
        return self.gpus[self._index(handle)]

    def _nvmlGetFunctionPointer(self, name: str) -> Callable[..., object]:
        """The C function ``name`` (here: the module's Python function of that name)."""
        fn = getattr(self, name, None)
        if fn is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self._nvmlGetFunctionPointer_cache[name] = fn
        return fn

    # ------------------------------------------------------------------ system
    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "575.57.08-fake"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.575.57.08-fake"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12090

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)
        return index

    # ------------------------------------------------------------------ getters
    def nvmlDeviceGetName(self, h: NvmlHandle) -> str:
        return self._gpu(h).name

    def nvmlDeviceGetUUID(self, h: NvmlHandle) -> str:
        return f"GPU-{int(h):08x}-fake-0000-0000-000000000000"

    def nvmlDeviceGetMemoryInfo(self, h: NvmlHandle) -> MemoryInfo:
        g = self._gpu(h)
        return MemoryInfo(total=g.memory_total, used=g.memory_used,
                          free=g.memory_total - g.memory_used)

    def nvmlDeviceGetPowerUsage(self, h: NvmlHandle) -> int:
        return self._gpu(h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: NvmlHandle) -> int:
        i = self._index(h)
        now = self._time()
        steps = int((now - self._last[i]) / self.update_period_s)
        if steps > 0:
            dt = steps * self.update_period_s
            self._energy_mj[i] += self.gpus[i].power_mw * dt  # mW x s = mJ
            self._last[i] += dt
        return int(self._energy_mj[i])

    def nvmlDeviceGetClockInfo(self, h: NvmlHandle, kind: int) -> int:
        g = self._gpu(h)
        if kind == self.NVML_CLOCK_MEM:
            return g.mem_clock_mhz
        return g.locked[1] if g.locked else g.clocks_mhz[0]

    def nvmlDeviceGetMaxClockInfo(self, h: NvmlHandle, kind: int) -> int:
        g = self._gpu(h)
        return g.mem_clock_mhz if kind == self.NVML_CLOCK_MEM else max(g.clocks_mhz)

    def nvmlDeviceGetSupportedMemoryClocks(self, h: NvmlHandle) -> list[int]:
        return [self._gpu(h).mem_clock_mhz]

    def nvmlDeviceGetSupportedGraphicsClocks(self, h: NvmlHandle, mem: int) -> list[int]:
        return list(self._gpu(h).clocks_mhz)

    def nvmlDeviceGetPowerManagementLimit(self, h: NvmlHandle) -> int:
        return self._gpu(h).power_limit_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: NvmlHandle) -> int:
        return self._gpu(h).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: NvmlHandle) -> int:
        return self._gpu(h).default_power_limit_mw

    def nvmlDeviceGetPersistenceMode(self, h: NvmlHandle) -> int:
        return self._gpu(h).persistence

    def nvmlDeviceGetComputeMode(self, h: NvmlHandle) -> int:
        return self._gpu(h).compute_mode

    def nvmlDeviceGetMigMode(self, h: NvmlHandle) -> list[int]:
        return list(self._gpu(h).mig)

    def nvmlDeviceGetEccMode(self, h: NvmlHandle) -> list[int]:
        return list(self._gpu(h).ecc)

    def nvmlDeviceGetApplicationsClock(self, h: NvmlHandle, kind: int) -> int:
        g = self._gpu(h)
        return g.app_clocks[1] if kind == self.NVML_CLOCK_MEM else g.app_clocks[0]

    def nvmlDeviceGetDefaultApplicationsClock(self, h: NvmlHandle, kind: int) -> int:
        g = self._gpu(h)
        return g.mem_clock_mhz if kind == self.NVML_CLOCK_MEM else max(g.clocks_mhz)

    def nvmlDeviceGetComputeRunningProcesses(self, h: NvmlHandle) -> list[NvmlProcess]:
        return list(self._gpu(h).processes)

    # ------------------------------------------------------------------ setters (they change)
    def _set(self, call: str) -> None:
        self.calls.append(call)

    def nvmlDeviceSetGpuLockedClocks(self, h: NvmlHandle, lo: int, hi: int) -> None:
        self._set(f"SetGpuLockedClocks {lo} {hi}")
        self._gpu(h).locked = (int(lo), int(hi))

    def nvmlDeviceResetGpuLockedClocks(self, h: NvmlHandle) -> None:
        self._set("ResetGpuLockedClocks")
        self._gpu(h).locked = None

    def nvmlDeviceSetMemoryLockedClocks(self, h: NvmlHandle, lo: int, hi: int) -> None:
        self._set(f"SetMemoryLockedClocks {lo} {hi}")
        self._gpu(h).mem_locked = (int(lo), int(hi))

    def nvmlDeviceResetMemoryLockedClocks(self, h: NvmlHandle) -> None:
        self._set("ResetMemoryLockedClocks")
        self._gpu(h).mem_locked = None

    def nvmlDeviceSetApplicationsClocks(self, h: NvmlHandle, mem: int, sm: int) -> None:
        self._set(f"SetApplicationsClocks {mem} {sm}")
        self._gpu(h).app_clocks = (int(sm), int(mem))

    def nvmlDeviceResetApplicationsClocks(self, h: NvmlHandle) -> None:
        self._set("ResetApplicationsClocks")
        g = self._gpu(h)
        g.app_clocks = (max(g.clocks_mhz), g.mem_clock_mhz)

    def nvmlDeviceSetPowerManagementLimit(self, h: NvmlHandle, mw: int) -> None:
        self._set(f"SetPowerManagementLimit {mw}")
        self._gpu(h).power_limit_mw = int(mw)

    def nvmlDeviceSetPersistenceMode(self, h: NvmlHandle, mode: int) -> None:
        self._set(f"SetPersistenceMode {mode}")
        self._gpu(h).persistence = int(mode)

    def nvmlDeviceSetComputeMode(self, h: NvmlHandle, mode: int) -> None:
        self._set(f"SetComputeMode {mode}")
        self._gpu(h).compute_mode = int(mode)

    def nvmlDeviceSetMigMode(self, h: NvmlHandle, mode: int) -> int:
        self._set(f"SetMigMode {mode}")
        g = self._gpu(h)
        g.mig = (g.mig[0], int(mode))
        return 0

    def nvmlDeviceSetEccMode(self, h: NvmlHandle, mode: int) -> None:
        self._set(f"SetEccMode {mode}")
        g = self._gpu(h)
        g.ecc = (g.ecc[0], int(mode))

    def nvmlDeviceClearEccErrorCounts(self, h: NvmlHandle, kind: int) -> None:
        self._set(f"ClearEccErrorCounts {kind}")
