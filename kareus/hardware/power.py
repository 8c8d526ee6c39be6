"""Clock -> power and clock -> time laws shared by the simulator and the calibration.

Dynamic power of CMOS logic is ``P ∝ activity · f · V(f)²``. GPUs run at a floor voltage below a
knee clock and raise the voltage roughly linearly above it, so SM power is near-linear in the clock
below the knee and strongly convex above it. No public V–f table exists for A100/H100; the knee
and the voltage ratio are fitted per GPU from measured profiles (:mod:`kareus.hardware.calibration`).

Every clock here is an SM clock in MHz; every power in W.
"""

from __future__ import annotations

from collections.abc import Callable

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


def throttled_clock(f_mhz: ArrayLike, power_at: Callable[[NDArray[np.float64]], ArrayLike],
                    cap_w: float,
                    grid_mhz: NDArray[np.float64]) -> NDArray[np.float64]:
    """The clock a power-capped GPU actually runs at when asked for ``f``.

    The card lowers its clock until the power fits under ``cap_w``: the result is the highest clock
    of ``grid_mhz`` not above ``f`` whose power ``power_at(g)`` is within the cap (the lowest grid
    clock if none is).
    """
    f = np.asarray(f_mhz, dtype=np.float64)
    p = np.asarray(power_at(grid_mhz), dtype=np.float64)  # (..., G)
    ok = p <= cap_w + 1e-9
    # highest feasible grid clock: grid is ascending; power is monotone in the clock
    feasible = np.where(ok, grid_mhz, -np.inf)
    f_cap = np.max(feasible, axis=-1)
    f_cap = np.where(np.isfinite(f_cap), f_cap, grid_mhz[0])
    return np.minimum(f, f_cap)
