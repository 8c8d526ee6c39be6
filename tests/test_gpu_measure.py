"""Measurement windows over a fake energy counter, the clock sampler and atomic result files."""

from __future__ import annotations

import json
import os

import pytest

from kareus.backends.gpu.device import FakeDevice
from kareus.backends.gpu.measure import (
    ClockSampler,
    CounterMeter,
    MeasureConfig,
    measure_window,
)
from kareus.atomic import atomic_write_json as write_json_atomic


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_window_counts_steps_and_energy():
    clock = FakeClock()
    dev = FakeDevice(power_w=400.0, time_fn=clock)
    meter = CounterMeter([dev], time_fn=clock)
    calls = []

    def step():  # one step takes 0.25 s of fake time
        calls.append(clock.t)
        clock.t += 0.25

    cfg = MeasureConfig(warmup_s=1.0, warmup_steps=2, window_s=3.0, min_steps=3, cooldown_s=5.0)
    res = measure_window(step, meter, cfg, time_fn=clock, sleep_fn=clock.sleep)
    assert calls[0] == pytest.approx(105.0)  # after the cooldown
    assert res.steps == 12  # ceil(3.0 / 0.25)
    assert len(calls) == 4 + 12  # warm-up ran >= 1 s (4 steps), then the window
    assert res.time_s == pytest.approx(3.0)
    assert res.energy_j == pytest.approx(400.0 * 3.0)
    assert res.time_per_step_s == pytest.approx(0.25)
    assert res.energy_per_step_j == pytest.approx(100.0)


def test_window_agrees_on_step_count_and_uses_barriers():
    clock = FakeClock()
    dev = FakeDevice(time_fn=clock)
    seen = []

    def step():
        clock.t += 1.0

    res = measure_window(step, CounterMeter([dev], time_fn=clock),
                         MeasureConfig(warmup_s=0, warmup_steps=1, window_s=0.5, min_steps=1),
                         agree=lambda n: (seen.append(n), 7)[1],
                         barrier=lambda: seen.append("barrier"), time_fn=clock,
                         sleep_fn=clock.sleep)
    # the warm-up's count and the window's, each agreed between ranks before it runs
    assert seen == ["barrier", 1, 1, "barrier"] and res.steps == 7


def test_clock_sampler_reads_the_device():
    dev = FakeDevice()
    dev.locked = 1410
    s = ClockSampler(dev, period_s=0.001).start()
    import time

    time.sleep(0.02)
    assert s.stop() == pytest.approx(1410.0)
    assert ClockSampler(None).start().stop() is None


def test_atomic_json_write(tmp_path, monkeypatch):
    path = tmp_path / "res" / "rank0.json"
    write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}

    def dies(*a, **k):  # the process dies between writing the data and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}  # old result intact, no half file
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank0.json"]
    with pytest.raises(TypeError):  # unserialisable: nothing written either
        write_json_atomic(tmp_path / "x.json", {"a": object()})
    assert not (tmp_path / "x.json").exists()


def test_meter_falls_back_to_nvml_counter_when_zeus_monitor_fails(monkeypatch, capsys):
    """ZeusMonitor also probes CPUs (RAPL), which can fail in VMs: the runner then reads the
    same NVML energy counter through its device."""
    from types import SimpleNamespace

    import torch

    from kareus.backends.gpu.measure import CounterMeter
    from kareus.backends.gpu.runner import modes

    def broken(indices):
        raise OSError("powercap: permission denied")

    from kareus.backends.gpu import device as device_mod

    monkeypatch.setattr(device_mod, "zeus_available", lambda: True)
    monkeypatch.setattr(modes, "ZeusMeter", broken)
    dev = FakeDevice(power_w=200.0)
    s = SimpleNamespace(job=SimpleNamespace(fake_device=False), r=SimpleNamespace(local_rank=0),
                        dev=dev, device=torch.device("cpu"))
    meter = modes._meter(s)
    assert isinstance(meter, CounterMeter) and meter.devices == [dev]
    assert "reading NVML's energy counter directly" in capsys.readouterr().err


def test_meter_reads_the_nvml_counter_where_zeus_is_not_installed(monkeypatch, capsys):
    from types import SimpleNamespace

    import torch

    from kareus.backends.gpu import device as device_mod
    from kareus.backends.gpu.measure import CounterMeter
    from kareus.backends.gpu.runner import modes

    def never(indices):
        raise AssertionError("ZeusMonitor must not be tried without zeus")

    monkeypatch.setattr(device_mod, "zeus_available", lambda: False)
    monkeypatch.setattr(modes, "ZeusMeter", never)
    dev = FakeDevice(power_w=200.0)
    s = SimpleNamespace(job=SimpleNamespace(fake_device=False), r=SimpleNamespace(local_rank=0),
                        dev=dev, device=torch.device("cpu"))
    assert isinstance(modes._meter(s), CounterMeter)
    assert capsys.readouterr().err == ""


def test_check_readings_tolerate_refused_nvml_queries():
    from kareus.backends.gpu.check import _fmt, _readings

    class Partial(FakeDevice):
        def power_limit_w(self):
            raise RuntimeError("NVML: Not Supported")

    r = _readings(Partial(power_w=100.0), "power_w", "power_limit_w")
    assert r == {"power_w": 100.0, "power_limit_w": None}
    assert _fmt(None) == "n/a" and _fmt(412.4) == "412"


def test_check_failure_on_the_gpu_leaves_a_record(monkeypatch, tmp_path, capsys):
    from kareus.backends.gpu import check

    def boom(args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(check, "run_check", boom)
    assert check.main(["--out", str(tmp_path)]) == 1
    rec = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rec["ok"] is False and rec["error"].startswith("failed: RuntimeError: CUDA error")
    assert "Traceback" in rec["traceback"] and "Traceback" in capsys.readouterr().err


def test_atomic_writes_keep_a_files_mode(tmp_path):
    """A new file is readable by all (not mkstemp's private 0600); a rewrite keeps the mode."""
    import os
    import stat

    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    os.chmod(path, 0o600)
    write_json_atomic(path, {"a": 2})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_group_s_step_is_its_slowest_gpu_s_time_and_mean_energy():
    from kareus.backends.gpu.measure import WindowResult, per_gpu_step

    t, e = per_gpu_step([WindowResult(2.0, 600.0, 4), WindowResult(3.0, 1000.0, 5)])
    assert t == pytest.approx(0.6) and e == pytest.approx((150.0 + 200.0) / 2)


def test_zeus_windows_use_the_oldest_zeus_the_project_allows(monkeypatch):
    """zeus>=0.13 (pyproject): its ``begin_window(key, sync_execution)`` takes no ``restart``
    (only 0.16 has it). A window that a failed measurement left open is ended and begun again."""
    import sys
    from types import ModuleType, SimpleNamespace

    from kareus.backends.gpu.measure import ZeusMeter

    class ZeusMonitor011:  # the 0.11-0.15 signatures and behaviour (0.13 is the oldest allowed)
        def __init__(self, gpu_indices, cpu_indices, sync_execution_with):
            self.measurement_states: dict[str, float] = {}
            self.energy_j = 0.0

        def begin_window(self, key: str, sync_execution: bool = True) -> None:
            if key in self.measurement_states:
                raise ValueError(f"Measurement window '{key}' already exists")
            self.measurement_states[key] = self.energy_j

        def end_window(self, key: str, sync_execution: bool = True):
            start = self.measurement_states.pop(key)
            return SimpleNamespace(time=1.0, gpu_energy={0: self.energy_j - start})

    zeus_monitor = ModuleType("zeus.monitor")
    zeus_monitor.ZeusMonitor = ZeusMonitor011
    monkeypatch.setitem(sys.modules, "zeus", ModuleType("zeus"))
    monkeypatch.setitem(sys.modules, "zeus.monitor", zeus_monitor)
    meter = ZeusMeter([0])
    meter.begin()  # ...and the measurement fails before its end
    meter._mon.energy_j = 5.0
    meter.begin()
    meter._mon.energy_j = 12.0
    assert meter.end() == (1.0, 7.0)


@pytest.mark.parametrize("api,importable,expected", [
    ("get_total_energy_consumption", True, True),  # 0.13 and later
    ("getTotalEnergyConsumption", True, False),  # 0.11 / 0.12: camelCase device API
    ("get_total_energy_consumption", False, False),  # a dependency of zeus's own missing
])
def test_zeus_counts_only_where_its_device_api_can_be_called(monkeypatch, api, importable,
                                                              expected):
    """A zeus the backend cannot call counts as absent: the NVML bindings are then used
    directly, instead of a device whose first call fails."""
    import importlib.machinery
    import sys
    from types import ModuleType

    from kareus.backends.gpu.device import zeus_available

    common = ModuleType("zeus.device.gpu.common")
    if importable:
        common.GPU = type("GPU", (), {api: lambda self: 0})
    else:
        def missing(name):
            raise ImportError("No module named 'httpx'")
        common.__getattr__ = missing
    for name in ("zeus", "zeus.device", "zeus.device.gpu"):
        module = ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "zeus.device.gpu.common", common)
    assert zeus_available() is expected


def test_the_window_is_sized_on_warm_steps_not_the_cold_first_ones():
    """A first step ten times slower (autotuning, cold caches) does not shrink the window: the
    step time that sizes it comes from the warm-up's steps after ``warmup_steps``."""
    clock = FakeClock()
    dev = FakeDevice(power_w=300.0, time_fn=clock)
    durations = iter([2.5] + [0.25] * 100)

    def step():
        clock.t += next(durations)

    cfg = MeasureConfig(warmup_s=1.0, warmup_steps=1, window_s=3.0, min_steps=2)
    res = measure_window(step, CounterMeter([dev], time_fn=clock), cfg, time_fn=clock,
                         sleep_fn=clock.sleep)
    # sized on the whole warm-up's mean step (1.375 s) the window would take min_steps, 2
    assert res.steps == 12 and res.time_s == pytest.approx(3.0)
