"""The device check's dry run: the whole driver (benchmarks/device_check.sh --fake) on the CPU
with a fake NVML card; every phase writes its record, the guard holds, settings are unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.device_check import phases as device_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device-check")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), str(out),
                           "--fake"], capture_output=True, text=True, timeout=900,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                               "HOME": str(out)})
    return out, proc


@pytest.mark.slow
def test_dry_run_writes_every_phase_and_passes(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([f"{p}.json" for p in device_check.PHASES] + ["summary.json",
                                                                          "log.txt"])
    assert len(files) <= 8 and "Traceback" not in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["settings_changed"] == {}
    assert summary["blocked_setter_attempts"] == [] and summary["fake_device"]
    env = json.loads((out / "env.json").read_text())
    assert env["guard"]["active"] and "nvmlDeviceSetGpuLockedClocks" in env["guard"]["blocked"]
    assert env["energy_counter"]["works"]
    work = json.loads((out / "workload.json").read_text())
    it = work["models"]["gpt3-xl"]["iteration"]
    assert it["measured"]["time_s"] > 0 and it["simulated"]["time_s"] > 0
    cont = json.loads((out / "contention.json").read_text())
    assert {r["comm_sms"] for r in cont["rows"]} == {0, 8, 16, 32, 64}
    fault = json.loads((out / "fault.json").read_text())
    assert [k["signal"] for k in fault["kills"]] == ["SIGTERM", "SIGKILL"]
    assert all(k["windows_kept"] >= 2 and k["record_intact"] for k in fault["kills"])
    pyt = json.loads((out / "pytest.json").read_text())
    assert pyt["exit_status"] == 0 and pyt["counts"].get("skipped", 0) >= 1


@pytest.mark.slow
def test_rerun_skips_finished_phases_and_only_reruns(dry_run, tmp_path):
    out, _ = dry_run
    for p in out.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "power.json").unlink()
    before = (tmp_path / "workload.json").read_text()
    code = device_check.main(["--out", str(tmp_path), "--fake"])
    assert code == 0
    log = (tmp_path / "log.txt").read_text()
    assert "-- workload: record exists, skipped" in log and "gemm_fp32_cpu" in log
    assert (tmp_path / "workload.json").read_text() == before
    assert json.loads((tmp_path / "power.json").read_text())["ok"]


@pytest.mark.slow
def test_a_killed_run_keeps_finished_phases(tmp_path):
    """The driver writes each phase's record as it ends: a run stopped after `env` keeps it."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.device_check.phases", "--out",
                             str(tmp_path), "--fake", "--only", "env,power"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in proc.stdout:
        if line.startswith("-- power"):
            proc.kill()
            break
    proc.wait(timeout=60)
    assert json.loads((tmp_path / "env.json").read_text())["ok"]
    assert not (tmp_path / "power.json").exists()
    # SIGKILL may land between a temporary file and its rename: the temp name may stay, the
    # records are whole
    for p in tmp_path.iterdir():
        if p.suffix == ".json" and not p.name.startswith("."):
            json.loads(p.read_text())


@pytest.mark.slow
def test_the_time_limits_sigterm_stops_the_run_and_writes_the_summary(tmp_path):
    """device_check.sh's time limit sends SIGTERM: the run stops in its phase, keeps the ones
    finished and writes summary.json (which phase stopped, the settings after), exit 124."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.device_check.phases", "--out",
                             str(tmp_path), "--fake", "--only", "env,power"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in proc.stdout:
        if line.startswith("-- power"):
            proc.send_signal(signal.SIGTERM)
            break
    proc.stdout.read()
    assert proc.wait(timeout=60) == 124
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_in"] == "power" and not summary["ok"]
    assert summary["phases"]["env"]["ok"] and "SIGTERM" in summary["phases"]["power"]["error"]
    assert not summary["settings_changed"]


@pytest.mark.parametrize("args, words", [
    (["--out", "x", "--only", "nope"], "unknown phase 'nope'"),
    (["--out", "x", "--only", "env", "--from", "env"], "not both"),
    (["--out", "x"], "CUDA"),
])
def test_bad_input_exits_2(args, words, capsys, tmp_path, monkeypatch):
    import torch

    if words == "CUDA" and torch.cuda.is_available():  # pragma: no cover
        pytest.skip("a CUDA GPU is present")
    monkeypatch.chdir(tmp_path)
    assert device_check.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1


def test_script_usage_exits_2():
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("usage:")


def test_a_card_that_cannot_be_opened_leaves_its_reason_in_the_record_folder(tmp_path,
                                                                              monkeypatch, capsys):
    """NVML failing at start-up (the driver, gVisor): the one record the tool brings back says
    why, not only the command's stderr."""
    from kareus.backends.gpu.device import NvmlDevice
    from kareus.backends.gpu.fake_nvml import FakeNvml

    class Uninitialisable(FakeNvml):
        def nvmlInit(self) -> None:
            raise self.NVMLError("NVML error 9")

    def open_card(fake):  # as the real one: the device's constructor initialises NVML
        nvml = Uninitialisable()
        return device_check.Card(nvml, NvmlDevice(0, nvml=nvml), "cpu", True)

    monkeypatch.setattr(device_check, "open_card", open_card)
    assert device_check.main(["--out", str(tmp_path / "out"), "--fake"]) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["ok"] and "NVML error 9" in summary["error"]
    err = capsys.readouterr().err
    assert err.startswith("error: the card could not be opened: DeviceError: NVML unavailable")
