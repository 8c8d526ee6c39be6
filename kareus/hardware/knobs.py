"""The knob space: what optimizers may choose from on one GPU (SM clocks, communication-kernel
SM counts, board power limits), and its default for a preset."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kareus.errors import InputError
from kareus.hardware.presets import GPUPreset
from kareus.plan import LIBRARY_DEFAULT


#: The paper's lowest clock as a share of the top clock: 900 of 1410 MHz on A100.
FLOOR_OF_MAX = 0.64

#: The paper's lowest clock as a share of the V–f knee: 900 MHz against the A100's 1077 MHz.
FLOOR_OF_KNEE = 0.836


def clock_floor_mhz(gpu: GPUPreset) -> float:
    """The lowest clock (MHz, before rounding to the clock grid) of the default knob space: the
    Kareus paper's A100 floor, 900 MHz, carried to ``gpu`` as the lower of the same share of its
    top clock (:data:`FLOOR_OF_MAX`) and the same share of its V–f knee
    (:data:`FLOOR_OF_KNEE`). Below the knee the voltage stays at its floor, so a lower clock
    saves no dynamic energy per operation and only adds static energy: an instruction's
    least-energy clock lies near the knee, and the space reaches a little below it on every GPU.
    A GPU whose knee sits low in its range (Hopper: 1077 of 1980 MHz) would otherwise have its
    frugal clocks cut off, leaving power caps (which slow each kernel below the space) the only
    way there."""
    return min(FLOOR_OF_MAX * gpu.clock_max_mhz, FLOOR_OF_KNEE * gpu.knee_mhz)


@dataclass(frozen=True)
class KnobSpace:
    """What optimizers may choose from.

    Attributes:
        clocks_mhz: Candidate locked SM clocks (MHz), ascending.
        comm_sms: Candidate SM counts of TP all-reduce kernels; 0
            (:data:`~kareus.plan.LIBRARY_DEFAULT`) is the collective library's own kernel.
        cp_comm_sms: Candidate SM counts of CP all-gather / reduce-scatter kernels (0 likewise).
        power_limits_w: Candidate board power limits (W), ascending (power-limit baselines).
    """

    clocks_mhz: tuple[float, ...]
    comm_sms: tuple[int, ...]
    cp_comm_sms: tuple[int, ...]
    power_limits_w: tuple[float, ...]

    @staticmethod
    def default(gpu: GPUPreset) -> "KnobSpace":
        """The Kareus paper's space carried to ``gpu``: clocks from its floor
        (:func:`clock_floor_mhz`; A100: 900 MHz) to the maximum in two hardware steps (30 MHz on
        A100); all-reduce SMs 3..30 step 3; CP collective SMs 1..20; both also the library's
        default kernel (0); power limits from ~1.6x static power to the default limit in 25 W
        steps. Every partition's (launch, wait) windows are searched
        (:func:`kareus.optimizer.kareus.partition_windows`)."""
        step = 2 * gpu.clock_step_mhz
        lo = gpu.clock_min_mhz + np.floor((clock_floor_mhz(gpu) - gpu.clock_min_mhz) / step
                                          ) * step
        clocks = tuple(float(c) for c in np.arange(gpu.clock_max_mhz, lo - 1e-6, -step)[::-1])
        pl_lo = max(100.0, 25 * np.ceil(1.6 * gpu.static_power_w / 25))
        limits = tuple(float(x) for x in np.arange(pl_lo, gpu.power_limit_w + 1e-6, 25.0))
        cap = min(30, gpu.comm_max_sms)
        return KnobSpace(clocks_mhz=clocks, comm_sms=(LIBRARY_DEFAULT, *range(3, cap + 1, 3)),
                         cp_comm_sms=(LIBRARY_DEFAULT, *range(1, min(20, cap) + 1)),
                         power_limits_w=limits)

    def validate(self, gpu: GPUPreset) -> None:
        """Raise :class:`InputError` if the space is empty or does not fit ``gpu``."""
        for name in ("clocks_mhz", "comm_sms", "cp_comm_sms"):
            if not getattr(self, name):
                raise InputError(f"knob space: {name} is empty")
        lo, hi = min(self.clocks_mhz), max(self.clocks_mhz)
        if lo < gpu.clock_min_mhz or hi > gpu.clock_max_mhz:
            raise InputError(f"knob space: clocks {lo:.0f}-{hi:.0f} MHz outside {gpu.name}'s "
                             f"{gpu.clock_min_mhz:.0f}-{gpu.clock_max_mhz:.0f} MHz")
        sms = self.comm_sms + self.cp_comm_sms
        if min(sms) < 0 or max(sms) > gpu.comm_max_sms:
            raise InputError(f"knob space: communication SMs must be in 1..{gpu.comm_max_sms} "
                             f"on {gpu.name} (0: the library's kernel), got "
                             f"{min(sms)}..{max(sms)}")
        if self.power_limits_w and (min(self.power_limits_w) <= gpu.static_power_w):
            raise InputError("knob space: power limits must exceed the static power")
