"""GPUBackend.create(): one-line InputErrors naming what is missing (no CUDA, no zeus, no NVML,
a GPU the preset does not describe), the preset matching, and wiring through make_backend and
the CLI (exit status 2). No GPU needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kareus.backends import make_backend
from kareus.backends.gpu import GPUBackend
from kareus.backends.gpu.environment import Environment, check_environment, match_preset
from kareus.cli import main
from kareus.errors import InputError
from kareus.hardware.presets import get_preset

H200 = get_preset("h200")
A100 = get_preset("a100-sxm4-40gb")


def env(**kw) -> Environment:
    base = dict(torch_version="2.13.0", torch_cuda="12.8", cuda_devices=1,
                gpu_names=("NVIDIA H200",), gpu_memory=(150_000_000_000,))
    base.update(kw)
    return Environment(**base)


def one_line_error(preset, e) -> str:
    with pytest.raises(InputError) as info:
        GPUBackend.create(preset, env=e, announce=False)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("name,mem,want", [
    ("NVIDIA H200", 150e9, "h200"),
    ("NVIDIA H100 80GB HBM3", 85e9, "h100-sxm"),
    ("NVIDIA A100-SXM4-40GB", 42e9, "a100-sxm4-40gb"),
    ("NVIDIA A100-SXM4-80GB", 85e9, "a100-sxm4-80gb"),
    ("NVIDIA A40", 48e9, "a40"),
    ("NVIDIA H200 NVL", 150e9, None),
    ("NVIDIA A100-PCIE-40GB", 42e9, "a100-pcie-40gb"),
    ("NVIDIA A100 80GB PCIe", 85e9, "a100-pcie-80gb"),
    ("NVIDIA H100 PCIe", 85e9, None),
    ("NVIDIA GeForce RTX 4090", 24e9, None),
])
def test_match_preset(name, mem, want):
    assert match_preset(name, int(mem)) == want


def test_cpu_only_torch():
    msg = one_line_error(H200, env(torch_cuda=None, cuda_devices=0))
    assert "CPU-only build" in msg and "--backend sim" in msg


def test_cuda_build_without_gpu():
    msg = one_line_error(H200, env(cuda_devices=0))
    assert "sees none" in msg and "CUDA_VISIBLE_DEVICES" in msg


def test_zeus_missing():
    msg = one_line_error(H200, env(zeus_error="ModuleNotFoundError: No module named 'zeus'"))
    assert "zeus" in msg and "pip install" in msg


def test_nvml_unavailable():
    msg = one_line_error(H200, env(nvml_error="NVML Shared Library Not Found", gpu_names=()))
    assert msg.startswith("NVML is unavailable") and "driver" in msg


def test_preset_mismatch_names_the_matching_preset():
    msg = one_line_error(A100, env())
    assert "NVIDIA H200" in msg and "a100-sxm4-40gb" in msg and "--gpu h200" in msg


def test_no_preset_matches():
    msg = one_line_error(H200, env(gpu_names=("NVIDIA GeForce RTX 4090",)))
    assert "no built-in preset describes" in msg and "KAREUS_GPU_DIR" in msg


def test_unlisted_gpu_runs_with_an_explicit_preset():
    nvl = env(gpu_names=("NVIDIA H200 NVL",))
    assert "no built-in preset describes" in one_line_error(H200, nvl)
    assert check_environment(nvl, H200, accept_unlisted_gpu=True) == "NVIDIA H200 NVL"
    b = GPUBackend.create(H200, env=nvl, announce=False, accept_unlisted_gpu=True)
    assert b.gpu_name == "NVIDIA H200 NVL"
    # a GPU another preset describes is still refused
    with pytest.raises(InputError, match="--gpu h200"):
        check_environment(env(), A100, accept_unlisted_gpu=True)


def test_a_preset_of_the_users_own_runs_on_the_card_it_was_written_for(tmp_path, monkeypatch):
    """A GPU file in $KAREUS_GPU_DIR is the user's description of their card: a refit of a
    listed part, or a part no built-in preset describes, runs without being sent to a built-in
    preset; a built-in preset on the wrong card is still refused."""
    import json

    from kareus.hardware import presets

    raw = json.loads(presets.preset_path("a100-sxm4-80gb").read_text())
    raw["name"] = "my-a100"
    (tmp_path / "my-a100.json").write_text(json.dumps(raw))
    monkeypatch.setenv(presets.USER_DIR_ENV, str(tmp_path))
    presets.reload_presets()
    try:
        mine = get_preset("my-a100")
        listed = env(gpu_names=("NVIDIA A100-SXM4-80GB",), gpu_memory=(85_000_000_000,))
        assert check_environment(listed, mine) == "NVIDIA A100-SXM4-80GB"
        nvl = env(gpu_names=("NVIDIA H200 NVL",))
        assert check_environment(nvl, mine) == "NVIDIA H200 NVL"
        with pytest.raises(InputError, match="--gpu a100-sxm4-80gb"):
            check_environment(listed, A100)
    finally:
        monkeypatch.delenv(presets.USER_DIR_ENV)
        presets.reload_presets()


def test_mixed_gpus():
    msg = one_line_error(H200, env(cuda_devices=2, gpu_names=("NVIDIA H200", "NVIDIA A40")))
    assert "CUDA_VISIBLE_DEVICES" in msg


def test_too_few_gpus_for_a_job():
    with pytest.raises(InputError, match="needs 8 GPUs but 1 are visible"):
        check_environment(env(), H200, gpus_needed=8)


def test_matching_environment_creates_a_backend(capsys):
    b = GPUBackend.create(H200, env=env(cuda_devices=2))
    assert b.gpu is H200 and b.visible_gpus == 2 and b.name == "gpu"
    assert not b.allow_clock_control and "current clocks" in b.clock_note
    assert "clock control off" in capsys.readouterr().err


def test_clock_control_refused_without_permission(monkeypatch):
    from kareus.backends.gpu import device

    monkeypatch.setattr(device, "open_device",
                        lambda i, fake=False: device.FakeDevice(i, permitted=False))
    with pytest.raises(device.ClockPermissionError, match="--allow-clock-control"):
        GPUBackend.create(H200, env=env(), allow_clock_control=True, announce=False)


def test_this_machine_via_make_backend():
    # The CI machine has a CPU-only torch: the real probe must say so, through make_backend.
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(InputError, match="CUDA"):
        make_backend("gpu", H200)


def test_cli_backend_gpu_exits_2(capsys):
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines
        pytest.skip("a CUDA GPU is present")
    code = main(["frontier", "--workload", "qwen3-1.7b", "--optimizer", "megatron",
                 "--backend", "gpu", "--gpu", "h200"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "CUDA" in err
    assert len(err.strip().splitlines()) == 1


def test_import_is_cheap():
    code = ("import sys, kareus.backends.gpu; "
            "assert 'torch' not in sys.modules and 'zeus' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('torch', 'zeus'))][:5]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_calibrate_gpu_measure_takes_the_layout(monkeypatch, capsys):
    """`kareus calibrate --gpu-measure` runs the job layout it is given (one GPU: TP1 PP1),
    not the workload's default (TP 8)."""
    from kareus.backends.gpu import calibrate as gcal

    seen = {}
    monkeypatch.setattr(GPUBackend, "create", classmethod(lambda cls, preset, **kw: "backend"))

    def fake_measure(backend, w, out_dir, **kw):
        seen["w"] = w
        return {"workload": w.name}

    monkeypatch.setattr(gcal, "gpu_measure", fake_measure)
    code = main(["calibrate", "--gpu-measure", "--gpu", "h200", "-w", "qwen3-1.7b",
                 "--layers", "2", "--tp", "1", "--pp", "1", "--mbs", "2", "--seq", "512",
                 "--microbatches", "3", "--json"])
    assert code == 0, capsys.readouterr().err
    p = seen["w"].parallel
    assert (p.tp, p.pp, p.dp, p.mbs, p.seq, p.microbatches) == (1, 1, 1, 2, 512, 3)
    assert seen["w"].model.layers == 2 and p.num_gpus == 1


@pytest.mark.parametrize("args, words", [
    (["--gpu-measure", "--tp", "0"], "tp"),
    (["--profile", "x.csv", "--tp", "1"], "--gpu-measure only"),
])
def test_calibrate_layout_errors_exit_2(args, words, capsys):
    code = main(["calibrate", "--gpu", "h200", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert words in err.lower()


@pytest.mark.parametrize("visible,want", [
    ("", 1), ("3,1", 1), ("2", 1),  # plain numbers are followed; index 1 beyond them is itself
    ("GPU-00000002-fake,GPU-00000000", 0),  # a UUID prefix, looked up among NVML's GPUs
    ("MIG-1234,MIG-5678", 1),  # MIG instances: itself
])
def test_nvml_index_follows_cuda_visible_devices(monkeypatch, visible, want):
    """Energy must be read from the card CUDA runs on: with UUIDs in CUDA_VISIBLE_DEVICES (as
    container runtimes set them), CUDA's GPU 1 is the card with the second UUID, not NVML's 1."""
    from kareus.backends.gpu.device import NvmlDevice, nvml_index
    from kareus.backends.gpu.fake_nvml import FakeGpu, FakeNvml

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = FakeNvml(gpus=[FakeGpu(), FakeGpu(), FakeGpu(), FakeGpu()])
    assert nvml_index(1, nvml) == want
    assert NvmlDevice(1, nvml=nvml).nvml_index == want


def test_a_uuid_no_gpu_has_is_refused(monkeypatch):
    from kareus.backends.gpu.device import nvml_index
    from kareus.backends.gpu.fake_nvml import FakeNvml
    from kareus.errors import DeviceError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-deadbeef")
    with pytest.raises(DeviceError, match="GPU-deadbeef, which is none of the 1 GPUs"):
        nvml_index(0, FakeNvml())
