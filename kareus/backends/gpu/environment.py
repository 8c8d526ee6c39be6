"""What the GPU backend needs from the machine, checked before anything runs.

:func:`probe_environment` looks (torch's CUDA, zeus, NVML, the visible GPUs' names) without
failing; :func:`check_environment` turns what is missing into one :class:`InputError` line naming
it and the fix. :func:`match_preset` maps an NVML GPU name to the preset describing that part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from kareus.backends.gpu.nvml_api import NvmlHandle, import_pynvml
from kareus.errors import InputError, KareusError
from kareus.hardware.presets import GPUPreset

#: How a command with ``--backend`` goes on without a GPU (the end of each refusal).
SIM_HINT = "or use --backend sim"


@dataclass(frozen=True)
class Environment:
    """What :func:`probe_environment` found.

    Attributes:
        torch_version: ``torch.__version__``.
        torch_cuda: ``torch.version.cuda`` (``None``: a CPU-only build).
        cuda_devices: GPUs torch sees (0 when CUDA is unavailable).
        zeus_error: Why the NVML bindings (nvidia-ml-py) cannot be imported (``None``: they
            can; zeus itself is optional).
        nvml_error: Why NVML cannot be initialised (``None``: it can).
        gpu_names: NVML names of the visible GPUs.
        gpu_memory: Their memory (bytes).
    """

    torch_version: str
    torch_cuda: str | None
    cuda_devices: int
    zeus_error: str | None = None
    nvml_error: str | None = None
    gpu_names: tuple[str, ...] = ()
    gpu_memory: tuple[int, ...] = ()


def probe_environment() -> Environment:
    """Look at torch, NVML and zeus; never raises. Where zeus is not installed the GPUs are
    listed through the NVML bindings alone (the backend then measures NVML's energy counter
    directly, as ZeusMonitor does); ``zeus_error`` is set only when neither can be used."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = Environment(torch_version=torch.__version__, torch_cuda=torch.version.cuda,
                      cuda_devices=n)
    try:
        pynvml = import_pynvml()
    except Exception as e:  # noqa: BLE001 - ImportError
        return replace(env, zeus_error=f"{type(e).__name__}: {e}")
    from kareus.backends.gpu.device import nvml_index, zeus_available

    try:
        handles: list[NvmlHandle]
        if zeus_available():
            from kareus.backends.gpu.device import zeus_gpus

            gpus = zeus_gpus()
            names = tuple(str(gpus.get_name(i)) for i in range(len(gpus)))
            handles = [g.handle for g in gpus.gpus]
        else:
            pynvml.nvmlInit()
            count = n or pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(nvml_index(i, pynvml))
                       for i in range(count)]
            names = tuple(_text(pynvml.nvmlDeviceGetName(h)) for h in handles)
        mem = tuple(int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles)
    except Exception as e:  # noqa: BLE001 - ZeusGPUInitError, NVMLError, zeus refusing pynvml
        return replace(env, nvml_error=str(e) or type(e).__name__)
    return replace(env, gpu_names=names, gpu_memory=mem)


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def match_preset(name: str, memory_bytes: int | None = None) -> str | None:
    """The built-in preset describing the GPU NVML calls ``name`` (``None`` if none does).

    ``NVIDIA A100-SXM4-40GB`` / ``-80GB``, ``NVIDIA A100-PCIE-40GB`` / ``NVIDIA A100 80GB PCIe``,
    ``NVIDIA A40``, ``NVIDIA H100 80GB HBM3`` / ``H100 SXM``, ``NVIDIA H200``; ``memory_bytes``
    (NVML's total) tells an A100's 40 GB part from its 80 GB one when the name does not. H100
    PCIe and NVL, H200 NVL and the Grace parts have other power limits and links: no preset.
    """
    n = name.upper().replace("NVIDIA", "").strip()
    if re.search(r"\bNVL\b|GH200|GB200", n):
        return None
    if "A100" in n and ("SXM" in n or "PCIE" in n):
        part = "a100-sxm4" if "SXM" in n else "a100-pcie"
        large = "80GB" in n or (memory_bytes is not None and memory_bytes > 60e9)
        return f"{part}-80gb" if large else f"{part}-40gb"
    if re.search(r"\bPCIE\b", n):
        return None
    if re.fullmatch(r"A40", n):
        return "a40"
    if "H100" in n and ("SXM" in n or "HBM3" in n):
        return "h100-sxm"
    if re.fullmatch(r"H200( SXM)?( 141GB)?( HBM3E)?", n):
        return "h200"
    return None


def _users_own(preset: GPUPreset) -> bool:
    """Whether ``preset`` was read from the user's folder (``$KAREUS_GPU_DIR``), not built in."""
    from kareus.hardware.presets import BUILTIN_DIR, preset_path

    try:
        return preset_path(preset.name).parent != BUILTIN_DIR
    except KareusError:  # a preset made in code, under a name no file gives
        return False


def check_environment(env: Environment, preset: GPUPreset, *, gpus_needed: int = 1,
                      accept_unlisted_gpu: bool = False, hint: str = SIM_HINT) -> str:
    """Raise :class:`InputError` (one line: what is missing, how to fix it) unless the GPU
    backend can run ``preset`` here; returns the visible GPU's name.

    A preset of the user's own (a file in ``$KAREUS_GPU_DIR``) runs on whatever GPU is here: it
    is the user's description of their card (e.g. an A100 they refitted, or an H200 NVL).
    ``accept_unlisted_gpu``: a GPU that no built-in preset describes runs with a built-in preset
    instead of being refused -- for a preset the user named explicitly. A GPU that another
    built-in preset describes is still refused. ``hint`` ends each refusal: how the command
    can go on without this machine's GPU."""
    if env.torch_cuda is None:
        raise InputError(f"the GPU backend needs a CUDA GPU, but torch {env.torch_version} is a "
                         "CPU-only build; install a CUDA build of torch on a machine with NVIDIA "
                         f"GPUs, {hint}")
    if env.cuda_devices == 0:
        raise InputError(f"the GPU backend needs a CUDA GPU, but torch {env.torch_version} "
                         f"(CUDA {env.torch_cuda}) sees none (no driver, or CUDA_VISIBLE_DEVICES "
                         f"hides them); run on a GPU machine, {hint}")
    if env.zeus_error is not None:
        raise InputError(f"the GPU backend measures energy with NVML (directly or through "
                         f"zeus), whose bindings cannot be imported ({env.zeus_error}); pip "
                         f"install nvidia-ml-py (or the [gpu] extra), {hint}")
    if env.nvml_error is not None or not env.gpu_names:
        raise InputError(f"NVML is unavailable ({env.nvml_error or 'no GPUs listed'}); the "
                         f"NVIDIA driver must be loaded and nvidia-ml-py installed, {hint}")
    names = set(env.gpu_names)
    if len(names) > 1:
        raise InputError(f"the visible GPUs differ ({', '.join(sorted(names))}); set "
                         "CUDA_VISIBLE_DEVICES to GPUs of one model")
    name = env.gpu_names[0]
    mem = env.gpu_memory[0] if env.gpu_memory else None
    match = match_preset(name, mem)
    if match != preset.name and not _users_own(preset):
        if match is not None:
            raise InputError(f"GPU 0 is an {name}, which preset {preset.name!r} does not "
                             f"describe; use --gpu {match}")
        if not accept_unlisted_gpu:
            from kareus.hardware.presets import USER_DIR_ENV

            raise InputError(f"GPU 0 is an {name}, which no built-in preset describes; describe "
                             f"it in a GPU file of your own in ${USER_DIR_ENV} and name it with "
                             f"--gpu (docs/simulator.md, 'Parameters and their sources'), {hint}")
    if gpus_needed > env.cuda_devices:
        raise InputError(f"the job needs {gpus_needed} GPUs but {env.cuda_devices} are visible; "
                         "lower the parallelism (--tp/--pp/--dp) or run on a larger node")
    return name
