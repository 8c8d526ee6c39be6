"""Measurement windows over NVML's cumulative energy counter, the way Zeus, Perseus and Kareus do.

A window: optional cooldown (the GPU idles so temperature, hence leakage, settles), warm-up
(repeat the step until ``warmup_s`` has passed, which also estimates the step time), then ``n``
steps inside one energy-counter window chosen so the window lasts at least ``window_s`` seconds
(NVML's counter updates about every 100 ms: windows of seconds). Times in s, energies in J.

Across ranks, ``agree`` makes every rank run the same number of steps (the largest asked for) and
starts the windows together; the caller then takes time = max over ranks and energy = sum over
GPUs.

Also here: :class:`ClockSampler` (mean SM clock during a window, read from NVML). Results are
written with :func:`kareus.atomic.atomic_write_json` (a temporary file, renamed, so a run killed
mid-write leaves no half-written result).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from kareus.backends.gpu.device import Device


@dataclass(frozen=True)
class MeasureConfig:
    """How long to measure (s).

    Attributes:
        warmup_s: Run the step about this long before measuring (at least ``warmup_steps`` + 2
            times).
        warmup_steps: Cold warm-up steps; after them one step is timed with a wait for the GPU,
            and the warm-up's remaining steps (at least one, agreed between ranks) are run back
            to back as in the window: their time sizes it.
        window_s: Minimum window length.
        min_steps: Minimum steps inside the window.
        cooldown_s: Idle time before the warm-up (0: none).
    """

    warmup_s: float = 2.0
    warmup_steps: int = 2
    window_s: float = 5.0
    min_steps: int = 3
    cooldown_s: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class WindowResult:
    """One measured window: its length (s), this process's GPU energy over it (J), the steps run
    inside it, and the mean SM clock sampled during it (MHz; ``None`` if not sampled)."""

    time_s: float
    energy_j: float
    steps: int
    sm_clock_mhz: float | None = None

    @property
    def time_per_step_s(self) -> float:
        return self.time_s / self.steps

    @property
    def energy_per_step_j(self) -> float:
        return self.energy_j / self.steps


def per_gpu_step(windows: Sequence[WindowResult]) -> tuple[float, float]:
    """One step measured on a group of GPUs, one window each: its time (s), the slowest GPU's
    time per step, and the mean energy per GPU per step (J)."""
    return (max(w.time_per_step_s for w in windows),
            float(sum(w.energy_per_step_j for w in windows) / len(windows)))


class Meter(Protocol):
    """Reads energy over a window of this process's GPU(s)."""

    def begin(self) -> None:
        ...

    def end(self) -> tuple[float, float]:
        """(seconds, joules) since :meth:`begin`."""
        ...


class ZeusMeter:
    """A window over ``zeus.monitor.ZeusMonitor`` (NVML's energy counter), synchronizing CUDA at
    both ends so the window holds exactly the work launched inside it.

    Args:
        gpu_indices: GPUs of this process, in Zeus's numbering.
    """

    _KEY = "kareus-window"

    def __init__(self, gpu_indices: list[int]) -> None:
        from zeus.monitor import ZeusMonitor

        self._mon = ZeusMonitor(gpu_indices=gpu_indices, cpu_indices=[],
                                sync_execution_with="torch")

    def begin(self) -> None:
        try:
            self._mon.begin_window(self._KEY, sync_execution=True)
        except ValueError:  # a window that a failed measurement left open: start it afresh
            self._mon.end_window(self._KEY, sync_execution=False)
            self._mon.begin_window(self._KEY, sync_execution=True)

    def end(self) -> tuple[float, float]:
        m = self._mon.end_window(self._KEY, sync_execution=True)
        return float(m.time), float(sum(m.gpu_energy.values()))


class CounterMeter:
    """A window over :meth:`Device.energy_j` of some devices (the fake device in tests, or any
    device without Zeus's monitor). ``sync`` is called at both ends (e.g.
    ``torch.cuda.synchronize``)."""

    def __init__(self, devices: list[Device], sync: Callable[[], None] | None = None,
                 time_fn: Callable[[], float] = time.monotonic) -> None:
        self.devices = devices
        self._sync = sync or (lambda: None)
        self._time = time_fn
        self._t0 = 0.0
        self._e0 = 0.0

    def _energy(self) -> float:
        return sum(d.energy_j() for d in self.devices)

    def begin(self) -> None:
        self._sync()
        self._t0, self._e0 = self._time(), self._energy()

    def end(self) -> tuple[float, float]:
        self._sync()
        return self._time() - self._t0, self._energy() - self._e0


class ClockSampler:
    """Samples a device's SM clock every ``period_s`` in a background thread; :meth:`stop`
    returns the mean (MHz), or ``None`` if nothing was sampled."""

    def __init__(self, device: Device | None, period_s: float = 0.1) -> None:
        self.device = device
        self.period_s = period_s
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        assert self.device is not None
        while not self._stop.is_set():
            try:
                self._samples.append(self.device.sm_clock_mhz())
            except Exception:  # noqa: BLE001 - a failed read loses one sample, not the run
                pass
            self._stop.wait(self.period_s)

    def start(self) -> "ClockSampler":
        if self.device is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return sum(self._samples) / len(self._samples) if self._samples else None


def measure_window(step: Callable[[], object], meter: Meter, cfg: MeasureConfig, *,
                   sync: Callable[[], None] | None = None,
                   agree: Callable[[int], int] | None = None,
                   barrier: Callable[[], None] | None = None,
                   sampler: ClockSampler | None = None,
                   time_fn: Callable[[], float] = time.monotonic,
                   sleep_fn: Callable[[float], None] = time.sleep) -> WindowResult:
    """Cooldown, warm up, then measure ``n`` calls of ``step`` in one meter window.

    Args:
        step: One unit of work (an iteration, an instruction, a partition).
        meter: The energy meter of this process's GPU(s).
        cfg: Durations.
        sync: Waits for queued GPU work (``torch.cuda.synchronize``); no-op by default.
        agree: Maps this rank's step count to the count all ranks use (all-reduce max).
        barrier: Lines ranks up before the cooldown and before the window.
        sampler: Samples the SM clock during the window.
    """
    sync = sync or (lambda: None)
    if barrier:
        barrier()
    if cfg.cooldown_s > 0:
        sleep_fn(cfg.cooldown_s)
    # The warm-up: ``warmup_steps`` cold steps (caches, autotuning), one step timed with a wait
    # for the GPU (at least a step's time), then as many more as fill ``warmup_s``, run back to
    # back as the window runs them; their time sizes the window. Every count is agreed between
    # ranks (``agree``) before it runs, so that ranks whose steps hold collectives run the same
    # number of them.
    t0 = time_fn()
    for _ in range(max(0, cfg.warmup_steps)):
        step()
    sync()
    t1 = time_fn()
    step()
    sync()
    probe = max(time_fn() - t1, 1e-9)
    more = max(1, math.ceil(max(0.0, cfg.warmup_s - (time_fn() - t0)) / probe))
    if agree:
        more = agree(more)
    t2 = time_fn()
    for _ in range(more):
        step()
    sync()
    per_step = max((time_fn() - t2) / more, 1e-9)
    n = max(cfg.min_steps, math.ceil(cfg.window_s / per_step))
    if agree:
        n = agree(n)
    if barrier:
        barrier()
    if sampler:
        sampler.start()
    meter.begin()
    for _ in range(n):
        step()
    t, e = meter.end()
    clock = sampler.stop() if sampler else None
    return WindowResult(time_s=t, energy_j=e, steps=n, sm_clock_mhz=clock)
