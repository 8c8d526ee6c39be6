"""Short probes of one GPU for the device check: the energy counter's update period, idle power,
power while a kernel spins waiting (the stand-in for a GPU blocked on P2P: the static power of
the suite's energy accounting), and the ceilings -- a large bf16 GEMM's throughput and HBM copy
bandwidth -- with the power and SM clock they ran at.

Every probe measures through a :class:`~kareus.backends.gpu.device.Device` (NVML's energy counter
over a window, the SM clock sampled meanwhile) and runs its kernels with torch on ``device``
(``"cuda"``; ``"cpu"`` for the dry run with a fake NVML device, where the numbers mean nothing but
every line runs). Units: s, J, W, MHz, FLOP/s, B/s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from kareus.backends.gpu.device import Device
from kareus.backends.gpu.measure import (
    ClockSampler,
    CounterMeter,
    MeasureConfig,
    measure_window,
)
from kareus.json_types import JsonObject, record_dict


@dataclass(frozen=True)
class ProbeResult:
    """One probe's window: its length (s), energy (J), mean power (W), steps, mean SM clock
    (MHz; ``None`` if not sampled) and the probe's own figure (``rate``, in ``rate_unit``)."""

    name: str
    time_s: float
    energy_j: float
    power_w: float
    steps: int
    sm_clock_mhz: float | None
    rate: float | None = None
    rate_unit: str | None = None

    def to_dict(self) -> JsonObject:
        return record_dict(self)


@dataclass(frozen=True)
class CounterPeriod:
    """How NVML's cumulative energy counter moved while polled for ``polled_s`` seconds: whether
    it increased, how often it changed, and the median and largest interval between changes
    (s; ``None`` with fewer than two changes)."""

    works: bool
    changes: int
    median_update_s: float | None
    max_update_s: float | None
    polled_s: float

    def to_dict(self) -> JsonObject:
        return record_dict(self)


def _sync_of(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def window(name: str, step: Callable[[], None], dev: Device, device: str, cfg: MeasureConfig,
           work_per_step: float | None = None, unit: str | None = None) -> ProbeResult:
    """Run ``step`` in a measurement window on ``dev``; ``work_per_step`` (FLOP, B) gives the
    rate."""
    import math
    from dataclasses import replace

    sync = _sync_of(device)
    res = measure_window(step, CounterMeter([dev], sync=sync), cfg, sync=sync,
                         sampler=ClockSampler(dev, period_s=0.05))
    if res.time_s < 0.5 * cfg.window_s:  # the warm-up overestimated the step: measure again
        steps = math.ceil(cfg.window_s / res.time_per_step_s)
        res = measure_window(step, CounterMeter([dev], sync=sync),
                             replace(cfg, warmup_s=0.0, warmup_steps=1, min_steps=steps),
                             sync=sync, sampler=ClockSampler(dev, period_s=0.05))
    rate = work_per_step * res.steps / res.time_s if work_per_step is not None else None
    return ProbeResult(name, res.time_s, res.energy_j, res.energy_j / res.time_s, res.steps,
                       res.sm_clock_mhz, rate, unit)


def counter_update_period(dev: Device, seconds: float = 1.0) -> CounterPeriod:
    """Poll NVML's cumulative energy counter for ``seconds``: how often it changes (median and
    largest interval between changes, s) and whether it increases at all."""
    t_end = time.monotonic() + seconds
    last = dev.energy_j()
    first = last
    changes: list[float] = []
    while time.monotonic() < t_end:
        e = dev.energy_j()
        if e != last:
            changes.append(time.monotonic())
            last = e
        time.sleep(0.0005)
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    return CounterPeriod(works=last > first, changes=len(changes),
                         median_update_s=statistics.median(gaps) if gaps else None,
                         max_update_s=max(gaps) if gaps else None, polled_s=seconds)


def idle_power(dev: Device, device: str, seconds: float) -> ProbeResult:
    """Board power with nothing running (the host sleeps through the window)."""
    sync = _sync_of(device)
    sync()
    meter = CounterMeter([dev], sync=sync)
    sampler = ClockSampler(dev, period_s=0.05).start()
    meter.begin()
    time.sleep(seconds)
    t, e = meter.end()
    return ProbeResult("idle", t, e, e / t, 1, sampler.stop())


def spin_power(dev: Device, device: str, cfg: MeasureConfig) -> ProbeResult:
    """Board power while one kernel spins waiting on one SM (``torch.cuda._sleep``), the way a
    GPU sits in a P2P receive: the static power of the energy accounting."""
    import torch

    if device == "cuda":
        # ~50 ms of SM cycles (NVML's max clock: cudaDeviceProp.clockRate is gone in CUDA 13)
        cycles = int(dev.max_sm_clock_mhz() * 1e6 * 0.05)

        def step() -> None:
            torch.cuda._sleep(cycles)
    else:
        def step() -> None:
            time.sleep(0.05)
    return window("spin_wait", step, dev, device, cfg)


def gemm_ceiling(dev: Device, device: str, cfg: MeasureConfig, n: int = 8192,
                 repeat: int = 10) -> ProbeResult:
    """A square ``n`` GEMM in bf16 (float32 on CPU), ``repeat`` per step: FLOP/s, power, clock."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)

    def step() -> None:
        for _ in range(repeat):
            torch.mm(a, b, out=c)

    try:
        return window("gemm_bf16" if device == "cuda" else "gemm_fp32_cpu", step, dev, device,
                      cfg, 2.0 * n ** 3 * repeat, "FLOP/s")
    finally:  # free the GPU memory now (the closure holds the tensors)
        a = b = c = None  # noqa: F841


def copy_bandwidth(dev: Device, device: str, cfg: MeasureConfig, nbytes: int = 4 << 30,
                   repeat: int = 10) -> ProbeResult:
    """Device-to-device copies of ``nbytes``, ``repeat`` per step: bytes read + written per
    second (HBM), power, clock."""
    import torch

    src = torch.empty(nbytes // 2, device=device, dtype=torch.int16).fill_(1)
    dst = torch.empty_like(src)

    def step() -> None:
        for _ in range(repeat):
            dst.copy_(src)

    try:
        return window("hbm_copy", step, dev, device, cfg, 2.0 * nbytes * repeat, "B/s")
    finally:  # free the GPU memory now (the closure holds the tensors)
        src = dst = None  # noqa: F841
