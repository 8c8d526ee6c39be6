"""The real-GPU backend: the torch model of :mod:`workloads.torch_model` in bf16 on CUDA, under
torchrun for multi-GPU jobs, measured with zeus (NVML's energy counter), SM clocks locked per
instruction only when explicitly allowed. See ``docs/gpu.md``.

Importing this package is cheap: it does not import torch, zeus or CUDA; :class:`GPUBackend`
loads them when it runs something. Modules:

- :mod:`~kareus.backends.gpu.device` -- one GPU over zeus.device, and a fake for tests;
- :mod:`~kareus.backends.gpu.clocks` -- clock/power-limit control with guaranteed restore;
- :mod:`~kareus.backends.gpu.measure` -- measurement windows, atomic result files;
- :mod:`~kareus.backends.gpu.engine` -- op-by-op stage execution (nanobatches, launch slots,
  side-stream collectives, recomputation);
- :mod:`~kareus.backends.gpu.runner` -- distributed setup, 1F1B, the job modes;
- :mod:`~kareus.backends.gpu.worker` -- the torchrun entry point;
- :mod:`~kareus.backends.gpu.backend` -- :class:`GPUBackend` (the Backend protocol);
- :mod:`~kareus.backends.gpu.calibrate` -- profiling for ``kareus calibrate --gpu-measure``;
- :mod:`~kareus.backends.gpu.check` -- the shared-machine GPU check (``benchmarks/gpu_check.sh``).
"""

from kareus.backends.gpu.backend import GPUBackend

__all__ = ["GPUBackend"]
