"""Clock -> power laws shared by the simulator and the calibration, and the clock a power-capped
GPU sustains over a measurement window (the calibration's view of the cap; the simulator applies
the cap per phase on the clock grid, :meth:`kareus.backends.sim.SimulatorBackend.throttled_index`).

Dynamic power of CMOS logic is ``P ∝ activity · f · V(f)²``. GPUs run at a floor voltage below a
knee clock and raise the voltage roughly linearly above it, so SM power is near-linear in the clock
below the knee and strongly convex above it. No public V–f table exists for A100/H100; the knee
and the voltage ratio are fitted per GPU from measured profiles (:mod:`kareus.hardware.calibration`).

Every clock here is an SM clock in MHz; every power in W.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray


def voltage_fraction(f_mhz: ArrayLike, f_max: float, knee_mhz: float, v_ratio: float
                     ) -> NDArray[np.float64]:
    """``V(f) / V(f_max)``: flat below ``knee_mhz``, linear above it, 1 at ``f_max``.

    Args:
        f_mhz: SM clock(s) (MHz).
        f_max: Maximum SM clock (MHz).
        knee_mhz: Clock below which the voltage stays at its floor (MHz).
        v_ratio: ``V(f_max) / V(knee)`` (>= 1).
    """
    f = np.asarray(f_mhz, dtype=np.float64)
    span = max(f_max - knee_mhz, 1e-9)
    rise = np.clip((f - knee_mhz) / span, 0.0, None)
    return (1.0 + (v_ratio - 1.0) * rise) / v_ratio


def sm_power_scale(f_mhz: ArrayLike, f_max: float, knee_mhz: float, v_ratio: float
                   ) -> NDArray[np.float64]:
    """SM dynamic power at ``f`` relative to ``f_max`` at equal activity: ``(f/f_max)·(V/V_max)²``."""
    f = np.asarray(f_mhz, dtype=np.float64)
    return (f / f_max) * voltage_fraction(f, f_max, knee_mhz, v_ratio) ** 2


class PowerParams(Protocol):
    """The preset fields the power law reads (a :class:`~kareus.hardware.presets.GPUPreset`),
    read-only: W each."""

    @property
    def sm_dyn_power_w(self) -> float: ...

    @property
    def hbm_dyn_power_w(self) -> float: ...

    @property
    def link_dyn_power_w(self) -> float: ...


def dynamic_power(gpu: PowerParams, sm_scale: ArrayLike, sm_busy: ArrayLike,
                  hbm_util: ArrayLike, link_util: ArrayLike = 0.0) -> NDArray[np.float64]:
    """Dynamic power (W) of one phase of a GPU: the one law that carries energy across clocks.

    ``P_dyn = P_sm · s(f) · busy + P_hbm · u_hbm + P_link · u_link``, where ``s(f)`` is
    :func:`sm_power_scale` (the only clock-dependent factor: ``f · V(f)²`` relative to
    ``f_max``), ``busy`` the SMs' switching activity relative to a dense GEMM on every SM (activity
    x share of the SMs in use), and ``u`` the fractions of HBM and link bandwidth in use (HBM and
    links keep their own clocks, so their power per byte does not depend on the SM clock). The
    static power (the blocked-on-P2P power of the Kareus/Perseus accounting) is charged
    separately. The simulator (per kernel and collective, :mod:`kareus.backends.sim`) and the
    profile calibration (per instruction, :mod:`kareus.hardware.calibration`) both call this.

    Args:
        gpu: Preset (``sm_dyn_power_w``, ``hbm_dyn_power_w``, ``link_dyn_power_w``, W).
        sm_scale: :func:`sm_power_scale` at the clock(s) the phase runs at.
        sm_busy: Switching activity x busy SM share (1: a dense GEMM on every SM).
        hbm_util: Fraction of the HBM bandwidth in use (0-1).
        link_util: Fraction of the link bandwidth in use (0-1).
    """
    return (gpu.sm_dyn_power_w * np.asarray(sm_scale) * np.asarray(sm_busy)
            + gpu.hbm_dyn_power_w * np.asarray(hbm_util)
            + gpu.link_dyn_power_w * np.asarray(link_util))


def sustained_clock(f_mhz: ArrayLike, excess_w: NDArray[np.float64], grid_mhz: NDArray[np.float64],
                    ceiling_mhz: float | None = None) -> NDArray[np.float64]:
    """The clock a GPU sustains when asked for ``f``, averaged over a measurement window.

    Two limits: the power cap, where the power controller dithers between grid clocks so that the
    average power sits at the cap (the crossing of ``excess_w``, the power above the cap at each
    grid clock, interpolated linearly between grid clocks), and ``ceiling_mhz``, a clock the card
    does not exceed under sustained load whatever its power (fitted from profiles; ``None``: none).

    Args:
        f_mhz: Requested clock(s), shape (N,) (MHz).
        excess_w: Power minus the cap at each grid clock, shape (N, G), increasing along G (W).
        grid_mhz: Grid clocks, ascending (MHz).
        ceiling_mhz: Sustained-clock ceiling (MHz) or ``None``.
    """
    f = np.asarray(f_mhz, dtype=np.float64)
    above = excess_w > 0
    j = np.clip(np.argmax(above, axis=-1), 1, len(grid_mhz) - 1)
    p0 = np.take_along_axis(excess_w, (j - 1)[..., None], -1)[..., 0]
    p1 = np.take_along_axis(excess_w, j[..., None], -1)[..., 0]
    step = grid_mhz[j] - grid_mhz[j - 1]
    f_cap = grid_mhz[j - 1] + step * np.clip(-p0 / np.maximum(p1 - p0, 1e-12), 0.0, 1.0)
    f_cap = np.where(above.any(axis=-1), f_cap, np.inf)
    f_cap = np.where(above[..., 0], grid_mhz[0], f_cap)
    out = np.minimum(f, f_cap)
    return out if ceiling_mhz is None else np.minimum(out, ceiling_mhz)
