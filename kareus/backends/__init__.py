"""Backends measure plans: the simulator (default) and real GPUs (imported only when asked)."""

from __future__ import annotations

from kareus.backends.base import Backend
from kareus.errors import InputError
from kareus.hardware.presets import GPUPreset

BACKENDS = ("sim", "gpu")


def make_backend(name: str, gpu: GPUPreset, **options: object) -> Backend:
    """The backend called ``name`` for ``gpu``; raises :class:`InputError` for unknown names or a
    GPU backend that cannot run here. ``options`` go to the GPU backend: its one option is
    ``allow_clock_control`` (a :class:`TypeError` names any other)."""
    if name == "sim":
        from kareus.backends.sim import SimulatorBackend

        if options.get("allow_clock_control"):
            raise InputError("--allow-clock-control applies to --backend gpu only")
        return SimulatorBackend(gpu)
    if name == "gpu":
        try:
            from kareus.backends.gpu import GPUBackend
        except ImportError:
            raise InputError("the GPU backend is not available in this installation; "
                             "use --backend sim") from None
        unknown = sorted(set(options) - {"allow_clock_control"})
        if unknown:
            raise TypeError(f"unknown GPU backend option(s): {', '.join(unknown)}")
        return GPUBackend.create(gpu, allow_clock_control=bool(options.get("allow_clock_control",
                                                                           False)))
    raise InputError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
