"""The NVML setter guard, the settings snapshot and the NVML-only device, on a fake NVML module."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from kareus.backends.gpu import nvml_guard
from kareus.backends.gpu.device import NvmlDevice
from kareus.backends.gpu.fake_nvml import FakeNvml
from kareus.backends.gpu.nvml_guard import SetterBlocked, activate, is_setter
from kareus.backends.gpu.settings import difference, snapshot

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", [
    "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetPowerManagementLimit_v2", "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceSetComputeMode", "nvmlDeviceSetMigMode", "nvmlDeviceResetApplicationsClocks",
    "nvmlDeviceSetGpuOperationMode", "nvmlDeviceSetEccMode", "nvmlDeviceClearEccErrorCounts",
    "nvmlUnitSetLedState", "nvmlGpuInstanceDestroy", "nvmlDeviceCreateGpuInstance",
    "nvmlDeviceModifyDrainState", "nvmlDeviceRemoveGpu", "nvmlSetVgpuVersion",
    "nvmlDevicePowerSmoothingSetState", "nvmlDevicePowerSmoothingUpdatePresetProfileParam",
    "nvmlDeviceWorkloadPowerProfileSetRequestedProfiles",
    "nvmlDeviceWorkloadPowerProfileClearRequestedProfiles",
    "nvmlDeviceWorkloadPowerProfileUpdateProfiles_v1", "nvmlDeviceFreezeNvLinkUtilizationCounter",
    "nvmlDeviceReadWritePRM_v1", "nvmlDevicePowerSmoothingActivatePresetProfile"])
def test_setter_names_are_recognised(name):
    assert is_setter(name)


@pytest.mark.parametrize("name", [
    "nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetTotalEnergyConsumption", "nvmlInit",
    "nvmlShutdown", "nvmlEventSetCreate", "nvmlEventSetWait", "nvmlDeviceGetClockInfo",
    "nvmlSystemGetDriverVersion", "nvmlDeviceWorkloadPowerProfileGetProfilesInfo",
    "nvmlDevicePowerSmoothingGetState"])
def test_getters_are_not_setters(name):
    assert not is_setter(name)


def test_guard_blocks_every_setter_and_leaves_the_card_unchanged():
    nvml = FakeNvml()
    before = snapshot(nvml)
    guard = activate(nvml)
    assert guard.active and guard.verify() == []
    assert "nvmlDeviceSetGpuLockedClocks" in guard.blocked
    assert "nvmlDeviceSetPowerManagementLimit" in guard.blocked
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    for call in (lambda: nvml.nvmlDeviceSetGpuLockedClocks(h, 1200, 1200),
                 lambda: nvml.nvmlDeviceSetPowerManagementLimit(h, 300_000),
                 lambda: nvml.nvmlDeviceSetPersistenceMode(h, 0),
                 lambda: nvml.nvmlDeviceSetMigMode(h, 1),
                 lambda: nvml.nvmlDeviceResetApplicationsClocks(h),
                 lambda: nvml._nvmlGetFunctionPointer("nvmlDeviceSetComputeMode")):
        with pytest.raises(SetterBlocked):
            call()
    assert len(guard.attempts) == 6
    assert difference(before, snapshot(nvml)) == {}
    assert not [c for c in nvml.calls if c.startswith("Set") or c.startswith("Reset")]
    # getters still work
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000
    guard.deactivate()
    nvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)  # the real one again: it changes
    assert difference(before, snapshot(nvml)) == {"enforced_power_limit_w": [700.0, 300.0],
                                                  "power_limit_w": [700.0, 300.0]}


def test_guard_covers_earlier_from_imports_and_zeus_style_calls(monkeypatch):
    """A module that did ``from pynvml import setter`` before the guard, and one calling
    ``pynvml.setter`` at call time (how zeus.device.gpu.nvidia binds them), both hit the guard."""
    nvml = FakeNvml()
    early = types.ModuleType("early_user")
    early.nvmlDeviceSetGpuLockedClocks = nvml.nvmlDeviceSetGpuLockedClocks
    monkeypatch.setitem(sys.modules, "early_user", early)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    guard = activate()  # default: the module imported as pynvml
    assert guard.module is nvml

    def zeus_like_lock(handle):
        import pynvml

        pynvml.nvmlDeviceSetGpuLockedClocks(handle, 1000, 1000)

    with pytest.raises(SetterBlocked):
        early.nvmlDeviceSetGpuLockedClocks(0, 1000, 1000)
    with pytest.raises(SetterBlocked):
        zeus_like_lock(0)
    assert nvml.gpus[0].locked is None
    guard.deactivate()
    assert early.nvmlDeviceSetGpuLockedClocks.__name__ == "nvmlDeviceSetGpuLockedClocks"
    assert not getattr(early.nvmlDeviceSetGpuLockedClocks, "__kareus_guard__", False)


def test_verify_reports_a_setter_that_escaped():
    nvml = FakeNvml()
    guard = activate(nvml)
    nvml.nvmlDeviceSetNewThing = lambda *a: None  # a setter added after activation
    assert guard.verify() == ["nvmlDeviceSetNewThing"] and not guard.active


def test_guard_without_bindings_is_vacuous(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    guard = activate()
    assert guard.module is None and guard.active and guard.verify() == []


def test_activate_if_requested(monkeypatch):
    monkeypatch.delenv(nvml_guard.ENV_VAR, raising=False)
    assert nvml_guard.activate_if_requested() is None
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv(nvml_guard.ENV_VAR, "1")
    guard = nvml_guard.activate_if_requested()
    assert guard is not None and guard.active
    guard.deactivate()


def test_nvml_device_reads_and_its_lock_is_blocked_by_the_guard():
    nvml = FakeNvml()
    dev = NvmlDevice(0, nvml=nvml)
    assert dev.name() == "NVIDIA H200" and dev.max_sm_clock_mhz() == 1980
    assert dev.supported_sm_clocks_mhz()[0] == 1980 and dev.power_limit_w() == 700.0
    assert dev.power_w() == 90.0 and dev.memory_used_bytes() > 0
    e0 = dev.energy_j()
    assert e0 > 0
    guard = activate(nvml)
    with pytest.raises(SetterBlocked):
        dev.lock_sm_clock(1200)
    with pytest.raises(SetterBlocked):
        dev.set_power_limit_w(300)
    assert nvml.gpus[0].locked is None and nvml.gpus[0].power_limit_mw == 700_000
    guard.deactivate()


def test_settings_snapshot_records_refusals():
    nvml = FakeNvml()

    def refuse(h):
        raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)

    nvml.nvmlDeviceGetMigMode = refuse
    snap = snapshot(nvml)
    assert str(snap.mig_mode).startswith("unavailable:") and snap.persistence_mode == 1
    assert difference(snap, snapshot(nvml)) == {}


def test_guarded_runner_usage_and_guard(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kareus.backends.gpu.guarded"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage:")
    script = tmp_path / "probe_guard.py"
    script.write_text("import os, sys\nsys.exit(0 if os.environ.get('KAREUS_NVML_GUARD') == '1' "
                      "else 3)\n")
    proc = subprocess.run([sys.executable, "-m", "kareus.backends.gpu.guarded", "probe_guard"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert proc.returncode == 0, proc.stderr
