"""Backends measure plans: the simulator (default) and real GPUs (imported only when asked)."""

from __future__ import annotations

from kareus.backends.base import Backend
from kareus.errors import InputError
from kareus.hardware.presets import GPUPreset

BACKENDS = ("sim", "gpu")


def make_backend(name: str, gpu: GPUPreset) -> Backend:
    """The backend called ``name`` for ``gpu``; raises :class:`InputError` for unknown names or a
    GPU backend that cannot run here."""
    if name == "sim":
        from kareus.backends.sim import SimulatorBackend

        return SimulatorBackend(gpu)
    if name == "gpu":
        try:
            from kareus.backends.gpu import GPUBackend  # type: ignore[import-not-found]
        except ImportError:
            raise InputError("the GPU backend is not available in this installation; "
                             "use --backend sim") from None
        return GPUBackend.create(gpu)
    raise InputError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
