"""A thin device layer over ``zeus.device`` (NVML), and a fake for tests.

One :class:`Device` is one GPU as Zeus indexes it (after ``CUDA_VISIBLE_DEVICES``). Units: clocks
in MHz, power in W, energy in J (NVML reports mW and mJ; converted here and nowhere else).

Errors are typed: a missing permission to change clocks or power limits is
:class:`ClockPermissionError` (an :class:`~kareus.errors.InputError`: the user asked for clock
control without the rights to it); anything else NVML reports is :class:`DeviceError`.

Nothing here imports torch, and ``zeus`` / ``pynvml`` are imported only when a real device is made.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar, runtime_checkable

from kareus.backends.gpu.nvml_api import NvmlHandle, NvmlLike, import_pynvml
from kareus.errors import ClockPermissionError, DeviceError

P = ParamSpec("P")
T = TypeVar("T")

#: What to do when clock control is refused for lack of rights (shared by every message).
PERMISSION_HINT = (
    "changing SM clocks or power limits needs root / CAP_SYS_ADMIN, or a running Zeus daemon "
    "(zeusd, with ZEUSD_SOCK_PATH set); run as such a user, or drop --allow-clock-control to "
    "run at the GPU's current clocks"
)


@runtime_checkable
class Device(Protocol):
    """One GPU. Clocks in MHz, power in W, energy in J."""

    index: int

    def name(self) -> str:
        """Marketing name as NVML reports it, e.g. ``"NVIDIA H200"``."""
        ...

    def memory_bytes(self) -> int:
        """Total device memory (bytes)."""
        ...

    def sm_clock_mhz(self) -> float:
        """Current SM (graphics) clock (MHz)."""
        ...

    def max_sm_clock_mhz(self) -> float:
        """Highest SM clock the card supports (MHz)."""
        ...

    def supported_sm_clocks_mhz(self) -> list[int]:
        """SM clocks the card can be locked to (MHz), descending as NVML lists them."""
        ...

    def lock_sm_clock(self, mhz: int) -> None:
        """Lock the SM clock to ``mhz`` (min = max = ``mhz``)."""
        ...

    def reset_sm_clock(self) -> None:
        """Undo any SM clock lock (the driver's default boost behaviour)."""
        ...

    def power_limit_w(self) -> float:
        """Current board power limit (W)."""
        ...

    def set_power_limit_w(self, watts: float) -> None:
        """Set the board power limit (W)."""
        ...

    def energy_j(self) -> float:
        """NVML's cumulative energy counter (J since driver load)."""
        ...

    def power_w(self) -> float:
        """Instantaneous board power (W)."""
        ...

    def control_permission(self) -> tuple[bool, str]:
        """Whether this process may change clocks and limits, and why not if it may not."""
        ...


# --------------------------------------------------------------------------------- real device


def zeus_gpus() -> ZeusGpus:
    """Zeus's GPU manager (``zeus.device.get_gpus()``), as zeus raises its errors."""
    from zeus.device import get_gpus

    gpus: ZeusGpus = get_gpus()
    return gpus


def _zeus_gpus() -> ZeusGpus:
    """Zeus's GPU manager; raises :class:`DeviceError` if NVML cannot be initialised."""
    try:
        from zeus.device.gpu.common import ZeusBaseGPUError
    except ImportError as e:
        raise DeviceError(f"zeus is not installed ({e}); pip install zeus nvidia-ml-py") from None
    try:
        return zeus_gpus()
    except ZeusBaseGPUError as e:
        raise DeviceError(f"NVML unavailable: {e}") from None


class ZeusGpu(Protocol):
    """The methods of one of zeus's GPU objects (``zeus.device.gpu.nvidia.NVIDIAGPU``) used
    here. Units as zeus's (NVML's): MHz, mW, mJ."""

    handle: NvmlHandle

    def get_name(self) -> str: ...

    def get_supported_memory_clocks(self) -> list[int]: ...

    def get_supported_graphics_clocks(self, memory_clock_mhz: int | None = None) -> list[int]: ...

    def set_gpu_locked_clocks(self, min_clock_mhz: int, max_clock_mhz: int) -> None: ...

    def reset_gpu_locked_clocks(self) -> None: ...

    def get_power_management_limit(self) -> int: ...

    def set_power_management_limit(self, power_limit_mw: int) -> None: ...

    def get_total_energy_consumption(self) -> int: ...

    def get_instant_power_usage(self) -> int: ...


class ZeusGpus(Protocol):
    """zeus's GPU manager (``zeus.device.get_gpus()``), as used here."""

    @property
    def gpus(self) -> Sequence[ZeusGpu]: ...

    def __len__(self) -> int: ...

    def get_name(self, index: int) -> str: ...


def _name_of(fn: Callable[..., object]) -> str:
    return getattr(fn, "__name__", "?")


class ZeusDevice:
    """A real GPU through ``zeus.device.get_gpus()``; clock readings through ``pynvml`` on the
    same handle (Zeus exposes setters but no current-clock getter).

    Args:
        index: GPU index in Zeus's (``CUDA_VISIBLE_DEVICES``-aware) numbering.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self._gpus = _zeus_gpus()
        if index >= len(self._gpus):
            raise DeviceError(f"GPU {index} not visible (NVML sees {len(self._gpus)})")
        self._gpu = self._gpus.gpus[index]

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        from zeus.device.gpu.common import ZeusBaseGPUError, ZeusGPUNoPermissionError

        try:
            return fn(*args, **kwargs)
        except ZeusGPUNoPermissionError as e:
            raise ClockPermissionError(f"GPU {self.index}: NVML refused ({e}); "
                                       f"{PERMISSION_HINT}") from None
        except ZeusBaseGPUError as e:
            raise DeviceError(f"GPU {self.index}: {type(e).__name__}: {e}") from None

    def _nvml(self, fn: Callable[Concatenate[NvmlHandle, P], T], *args: P.args,
              **kwargs: P.kwargs) -> T:
        nvml = import_pynvml()
        try:
            return fn(self._gpu.handle, *args, **kwargs)
        except nvml.NVMLError as e:
            if getattr(e, "value", None) == nvml.NVML_ERROR_NO_PERMISSION:
                raise ClockPermissionError(f"GPU {self.index}: {e}; {PERMISSION_HINT}") from None
            raise DeviceError(f"GPU {self.index}: {_name_of(fn)}: {e}") from None

    def name(self) -> str:
        return str(self._call(self._gpu.get_name))

    def memory_bytes(self) -> int:
        return int(self._nvml(import_pynvml().nvmlDeviceGetMemoryInfo).total)

    def sm_clock_mhz(self) -> float:
        nvml = import_pynvml()
        return float(self._nvml(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM))

    def max_sm_clock_mhz(self) -> float:
        nvml = import_pynvml()
        return float(self._nvml(nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM))

    def supported_sm_clocks_mhz(self) -> list[int]:
        mem = self._call(self._gpu.get_supported_memory_clocks)
        top = max(mem) if mem else None
        return sorted((int(c) for c in self._call(self._gpu.get_supported_graphics_clocks, top)),
                      reverse=True)

    def lock_sm_clock(self, mhz: int) -> None:
        self._call(self._gpu.set_gpu_locked_clocks, int(mhz), int(mhz))

    def reset_sm_clock(self) -> None:
        self._call(self._gpu.reset_gpu_locked_clocks)

    def power_limit_w(self) -> float:
        return float(self._call(self._gpu.get_power_management_limit)) / 1e3

    def set_power_limit_w(self, watts: float) -> None:
        self._call(self._gpu.set_power_management_limit, int(round(watts * 1e3)))

    def energy_j(self) -> float:
        return float(self._call(self._gpu.get_total_energy_consumption)) / 1e3

    def power_w(self) -> float:
        return float(self._call(self._gpu.get_instant_power_usage)) / 1e3

    def control_permission(self) -> tuple[bool, str]:
        if os.environ.get("ZEUSD_SOCK_PATH") or os.environ.get("ZEUSD_HOST_PORT"):
            return True, ""  # the Zeus daemon (over its socket or TCP) sets clocks for it
        from zeus.device.common import has_sys_admin

        if has_sys_admin():
            return True, ""
        return False, f"this process lacks CAP_SYS_ADMIN and no Zeus daemon is configured; " \
                      f"{PERMISSION_HINT}"


class NvmlDevice:
    """A real GPU through the NVML bindings alone (``pynvml``), for machines without zeus: the
    same readings and controls as :class:`ZeusDevice` (the energy counter is the one ZeusMonitor
    reads). ``nvml`` may be any module with pynvml's names (e.g.
    :class:`~kareus.backends.gpu.fake_nvml.FakeNvml` in tests).

    Args:
        index: GPU index in CUDA's numbering (NVML's is :attr:`nvml_index`).
        nvml: The bindings module (default: ``import pynvml``, initialised here).
    """

    def __init__(self, index: int, nvml: NvmlLike | None = None) -> None:
        if nvml is None:
            try:
                nvml = import_pynvml()
            except ImportError as e:
                raise DeviceError(f"nvidia-ml-py is not installed ({e}); pip install "
                                  "nvidia-ml-py") from None
        self.index = index
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            #: The card's index in NVML's numbering (``CUDA_VISIBLE_DEVICES`` followed).
            self.nvml_index = nvml_index(index, nvml)
            self.handle = nvml.nvmlDeviceGetHandleByIndex(self.nvml_index)
        except nvml.NVMLError as e:
            raise DeviceError(f"NVML unavailable for GPU {index}: {e}") from None

    def _nvml(self, fn: Callable[Concatenate[NvmlHandle, P], T], *args: P.args,
              **kwargs: P.kwargs) -> T:
        nvml = self.nvml
        try:
            return fn(self.handle, *args, **kwargs)
        except nvml.NVMLError as e:
            if getattr(e, "value", None) == nvml.NVML_ERROR_NO_PERMISSION:
                raise ClockPermissionError(f"GPU {self.index}: {e}; {PERMISSION_HINT}") from None
            raise DeviceError(f"GPU {self.index}: {_name_of(fn)}: {e}") from None

    def name(self) -> str:
        n = self._nvml(self.nvml.nvmlDeviceGetName)
        return n.decode() if isinstance(n, bytes) else str(n)

    def memory_bytes(self) -> int:
        return int(self._nvml(self.nvml.nvmlDeviceGetMemoryInfo).total)

    def memory_used_bytes(self) -> int:
        """Device memory in use, all processes (bytes)."""
        return int(self._nvml(self.nvml.nvmlDeviceGetMemoryInfo).used)

    def sm_clock_mhz(self) -> float:
        return float(self._nvml(self.nvml.nvmlDeviceGetClockInfo, self.nvml.NVML_CLOCK_SM))

    def max_sm_clock_mhz(self) -> float:
        return float(self._nvml(self.nvml.nvmlDeviceGetMaxClockInfo, self.nvml.NVML_CLOCK_SM))

    def supported_sm_clocks_mhz(self) -> list[int]:
        top = max(self._nvml(self.nvml.nvmlDeviceGetSupportedMemoryClocks))
        return sorted((int(c) for c in self._nvml(self.nvml.nvmlDeviceGetSupportedGraphicsClocks,
                                                  top)), reverse=True)

    def lock_sm_clock(self, mhz: int) -> None:
        self._nvml(self.nvml.nvmlDeviceSetGpuLockedClocks, int(mhz), int(mhz))

    def reset_sm_clock(self) -> None:
        self._nvml(self.nvml.nvmlDeviceResetGpuLockedClocks)

    def power_limit_w(self) -> float:
        return float(self._nvml(self.nvml.nvmlDeviceGetPowerManagementLimit)) / 1e3

    def set_power_limit_w(self, watts: float) -> None:
        self._nvml(self.nvml.nvmlDeviceSetPowerManagementLimit, int(round(watts * 1e3)))

    def energy_j(self) -> float:
        return float(self._nvml(self.nvml.nvmlDeviceGetTotalEnergyConsumption)) / 1e3

    def power_w(self) -> float:
        return float(self._nvml(self.nvml.nvmlDeviceGetPowerUsage)) / 1e3

    def control_permission(self) -> tuple[bool, str]:
        if hasattr(os, "geteuid") and os.geteuid() == 0 and has_cap_sys_admin():
            return True, ""
        return False, f"this process is not root with CAP_SYS_ADMIN (a container's root may " \
                      f"lack it) and zeus (with its daemon) is not installed; {PERMISSION_HINT}"


def has_cap_sys_admin(status_file: str = "/proc/self/status") -> bool:
    """Whether this process's effective capabilities hold CAP_SYS_ADMIN (bit 21 of ``CapEff`` in
    ``status_file``), which NVML's clock and power-limit setters need. Where the file cannot be
    read (not Linux), ``True``: root decides there."""
    try:
        with open(status_file) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 21 & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True


def nvml_index(index: int, nvml: NvmlLike | None = None) -> int:
    """NVML's index of the ``index``-th GPU CUDA sees. ``CUDA_VISIBLE_DEVICES`` of plain numbers
    is followed, as zeus does; of GPU UUIDs (``GPU-...``, whole or a unique prefix, as CUDA takes
    them), each is looked up among NVML's GPUs with ``nvml`` (initialised). Anything else (MIG
    instances; UUIDs without ``nvml``) maps to itself."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if not visible or index >= len(visible):
        return index
    if all(v.isdigit() for v in visible):
        return int(visible[index])
    entry = visible[index]
    if nvml is None or not entry.startswith("GPU-"):
        return index
    for i in range(nvml.nvmlDeviceGetCount()):
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
        if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(entry):
            return i
    raise DeviceError(f"CUDA_VISIBLE_DEVICES names {entry}, which is none of the "
                      f"{nvml.nvmlDeviceGetCount()} GPUs NVML lists")


def zeus_available() -> bool:
    """Whether a zeus this backend can call is installed: 0.13 or later, whose device API is
    snake_case (0.11 and 0.12 name it ``getTotalEnergyConsumption`` ...). One that fails to
    import (a dependency of its own missing) or is older counts as absent, so that the NVML
    bindings are used directly instead of a device that fails at its first call."""
    import importlib.util

    if importlib.util.find_spec("zeus") is None:
        return False
    try:
        from zeus.device.gpu.common import GPU
    except Exception:  # noqa: BLE001 - ImportError of its own dependencies, or anything else
        return False
    return hasattr(GPU, "get_total_energy_consumption")


# --------------------------------------------------------------------------------- fake device


class FakeDevice:
    """An in-memory GPU for tests: records every control call, optionally refuses them, and
    integrates a constant power into a cumulative energy counter.

    Args:
        index: GPU index.
        gpu_name: What :meth:`name` returns.
        memory: Total memory (bytes).
        clocks_mhz: Supported SM clocks (any order).
        power_w: Board power the energy counter integrates (W); settable.
        permitted: ``False`` makes every control call raise :class:`ClockPermissionError`.
        log_path: Also append every control call, one per line, to this file (flushed and
            fsynced at once, so a process killed right after still leaves the record).
        time_fn: Clock of the energy counter (s); ``time.monotonic`` by default.
    """

    def __init__(self, index: int = 0, *, gpu_name: str = "NVIDIA H200",
                 memory: int = 141 * 10**9, clocks_mhz: list[int] | None = None,
                 power_w: float = 300.0, permitted: bool = True,
                 log_path: str | Path | None = None,
                 time_fn: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self._name = gpu_name
        self._memory = memory
        self.clocks = sorted(clocks_mhz or list(range(345, 1981, 15)), reverse=True)
        self.default_clock = float(self.clocks[0])
        self.locked: int | None = None
        self.default_limit_w = 700.0
        self.limit_w = self.default_limit_w
        self.power = power_w
        self.permitted = permitted
        self.calls: list[str] = []
        self._log_path = Path(log_path) if log_path is not None else None
        self._time = time_fn
        self._t0 = time_fn()
        self._energy0 = 1.0e6  # the counter runs since driver load
        self._lock = threading.Lock()

    # -- recording
    def _record(self, call: str) -> None:
        self.calls.append(call)
        if self._log_path is not None:
            with open(self._log_path, "a") as f:
                f.write(call + "\n")
                f.flush()
                os.fsync(f.fileno())

    def _check(self, call: str) -> None:
        if not self.permitted:
            self._record(f"refused {call}")
            raise ClockPermissionError(f"GPU {self.index}: no permission for {call}; "
                                       f"{PERMISSION_HINT}")

    # -- Device protocol
    def name(self) -> str:
        return self._name

    def memory_bytes(self) -> int:
        return self._memory

    def sm_clock_mhz(self) -> float:
        return float(self.locked) if self.locked is not None else self.default_clock

    def max_sm_clock_mhz(self) -> float:
        return float(self.clocks[0])

    def supported_sm_clocks_mhz(self) -> list[int]:
        return list(self.clocks)

    def lock_sm_clock(self, mhz: int) -> None:
        self._check(f"lock {mhz}")
        if int(mhz) not in self.clocks:
            raise DeviceError(f"GPU {self.index}: {mhz} MHz is not a supported clock")
        self.locked = int(mhz)
        self._record(f"lock {int(mhz)}")

    def reset_sm_clock(self) -> None:
        self._check("reset_clock")
        self.locked = None
        self._record("reset_clock")

    def power_limit_w(self) -> float:
        return self.limit_w

    def set_power_limit_w(self, watts: float) -> None:
        self._check(f"power_limit {watts:g}")
        self.limit_w = float(watts)
        self._record(f"power_limit {watts:g}")

    def energy_j(self) -> float:
        with self._lock:
            return self._energy0 + self.power * (self._time() - self._t0)

    def power_w(self) -> float:
        return self.power

    def control_permission(self) -> tuple[bool, str]:
        if self.permitted:
            return True, ""
        return False, f"the fake device refuses control; {PERMISSION_HINT}"


def open_device(index: int, fake: bool = False) -> Device:
    """The real GPU ``index`` (through Zeus/NVML; through the NVML bindings alone where zeus is
    not installed), or a :class:`FakeDevice` when ``fake``."""
    if fake:
        return FakeDevice(index)
    if not zeus_available():
        return NvmlDevice(index)
    return ZeusDevice(index)
