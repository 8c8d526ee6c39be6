"""Fit a GPU preset's clock -> time and clock -> power laws from a measured profile.

The measured unit is one pipeline instruction (stage, forward/backward) of a real training run at
each locked SM clock. Its time and power are modelled with the simulator's own laws, aggregated
over the instruction's kernels:

- time: a share ``m`` of the work is clock-insensitive (HBM-bound kernels, communication); the
  rest scales with ``1/f``: ``T(f) = τ · (m + (1 - m) · f_max / f_eff)``;
- power: ``P(f) = P_static + α · s(f_eff) · (φ + a_mem · (1 - φ)) + P_hbm · (φ · u_c + (1 - φ) · u_m)``
  where ``φ`` is the time share of clock-scaling work at ``f``, ``s`` the V–f law of
  :mod:`kareus.hardware.power`, ``a_mem`` the SM activity of memory-bound kernels, ``P_hbm`` the
  preset's HBM power at full bandwidth (not identifiable from clock sweeps: HBM runs on its own
  clock, so it is taken from the preset) and ``u`` the HBM utilisations of compute- and
  memory-bound kernels;
- a power cap: the card runs at ``f_eff = min(f, f_cap)``, the highest clock whose power fits.

GPU-level parameters (``m``, knee, voltage ratio) are shared by all instructions; ``τ`` and
``α`` are per instruction. ``α`` at full tensor activity is the preset's SM dynamic power.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from scipy.optimize import least_squares

from kareus.errors import ProfileError
from kareus.hardware.power import sm_power_scale
from kareus.hardware.presets import GPUPreset


@dataclass(frozen=True)
class StageLaw:
    """GPU-level parameters of the aggregated instruction model (see module docstring)."""

    insensitive_share: float  # m: share of time at f_max that does not scale with the clock
    knee_mhz: float
    v_ratio: float


@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of :func:`calibrate`.

    Attributes:
        gpu: Preset name the fit was made for.
        law: Fitted GPU-level parameters.
        sm_dyn_power_w: Median per-instruction SM dynamic power at f_max, full activity (W).
        hbm_dyn_power_w: HBM power at full bandwidth used in the fit (the preset's, W).
        time_mape_pct: Mean absolute percentage error of the fitted times.
        energy_mape_pct: Same for energies.
        power_limit_w: Power cap used in the fit (W).
        static_power_w: Static power used in the fit (W).
        points: Rows fitted.
    """

    gpu: str
    law: StageLaw
    sm_dyn_power_w: float
    hbm_dyn_power_w: float
    time_mape_pct: float
    energy_mape_pct: float
    power_limit_w: float
    static_power_w: float
    points: int

    def fitted_preset(self, base: GPUPreset, reference: "CalibrationResult | None" = None
                      ) -> GPUPreset:
        """``base`` with the fitted SM power curve.

        The aggregated law's SM power is the power of whole instructions, mixes of kernels; the
        simulator's ``sm_dyn_power_w`` is that of a reference GEMM. With ``reference``, the same
        fit made on ``base``'s own simulation of the profiled instructions, the simulator's value
        is scaled by the measured-to-simulated ratio instead of replaced.
        """
        sm_w = self.sm_dyn_power_w if reference is None else \
            base.sm_dyn_power_w * self.sm_dyn_power_w / reference.sm_dyn_power_w
        return base.with_overrides(
            sm_dyn_power_w=sm_w, knee_mhz=self.law.knee_mhz, v_ratio=self.law.v_ratio,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        return d


class _Model:
    """The aggregated instruction model for one set of GPU-level parameters."""

    def __init__(self, preset: GPUPreset, law: StageLaw, static_w: float, cap_w: float) -> None:
        self.p = preset
        self.law = law
        self.static_w = static_w
        self.cap_w = cap_w
        # u_c: HBM use of compute-bound kernels (operand streaming); u_m: of memory-bound ones.
        self.u_c, self.u_m = 0.15, preset.hbm_efficiency
        self.grid = preset.clock_grid()

    def _phi(self, f: NDArray[np.float64]) -> NDArray[np.float64]:
        """Time share of clock-scaling work at clock f."""
        m, scale = self.law.insensitive_share, self.p.clock_max_mhz / f
        return (1 - m) * scale / (m + (1 - m) * scale)

    def _sm_bracket(self, f: NDArray[np.float64]) -> NDArray[np.float64]:
        """SM dynamic power per unit α at (effective) clock f."""
        phi = self._phi(f)
        s = sm_power_scale(f, self.p.clock_max_mhz, self.law.knee_mhz, self.law.v_ratio)
        return s * (phi + self.p.activity_memory * (1 - phi))

    def _hbm_power(self, f: NDArray[np.float64]) -> NDArray[np.float64]:
        phi = self._phi(f)
        return self.p.hbm_dyn_power_w * (phi * self.u_c + (1 - phi) * self.u_m)

    def power(self, f: NDArray[np.float64], alpha: NDArray[np.float64]) -> NDArray[np.float64]:
        """Total power (W) at effective clock f."""
        return self.static_w + alpha * self._sm_bracket(f) + self._hbm_power(f)

    def effective_clock(self, f: NDArray[np.float64], alpha: NDArray[np.float64]
                        ) -> NDArray[np.float64]:
        """Per row: the clock the card runs at under the power cap."""
        power = self.power(self.grid[None, :], alpha[:, None])
        ok = power <= self.cap_w
        f_cap = np.where(ok, self.grid[None, :], -np.inf).max(axis=1)
        f_cap = np.where(np.isfinite(f_cap), f_cap, self.grid[0])
        return np.minimum(f, f_cap)

    def predict(self, f: NDArray[np.float64], tau: NDArray[np.float64],
                alpha: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Time (s) and energy (J) of rows with clock ``f`` and per-row ``tau``, ``alpha``."""
        fe = self.effective_clock(f, alpha)
        m = self.law.insensitive_share
        t = tau * (m + (1 - m) * self.p.clock_max_mhz / fe)
        return t, self.power(fe, alpha) * t

    def anchor(self, f_ref: float, t_ref: NDArray[np.float64], e_ref: NDArray[np.float64]
               ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``tau`` and ``alpha`` that reproduce a measured (time, energy) at ``f_ref`` exactly,
        assuming the card is not throttled there."""
        m = self.law.insensitive_share
        f = np.full_like(t_ref, f_ref)
        tau = t_ref / (m + (1 - m) * self.p.clock_max_mhz / f)
        alpha = (e_ref / t_ref - self.static_w - self._hbm_power(f)) / self._sm_bracket(f)
        return tau, alpha


def calibrate(profile: pd.DataFrame, preset: GPUPreset, *, static_power_w: float | None = None,
              power_limit_w: float | None = None) -> CalibrationResult:
    """Fit the GPU-level laws and per-instruction scales to a validated profile.

    Args:
        profile: Output of :func:`kareus.hardware.profile.load_profile`.
        preset: GPU whose clock range and activity priors are used.
        static_power_w: Blocked-on-P2P power of the measured GPUs (default: the preset's).
        power_limit_w: Power cap of the measured GPUs (default: the preset's).
    """
    static_w = preset.static_power_w if static_power_w is None else static_power_w
    cap_w = preset.power_limit_w if power_limit_w is None else power_limit_w
    f_lo, f_hi = profile.frequency.min(), profile.frequency.max()
    if f_hi > preset.clock_max_mhz or f_lo < preset.clock_min_mhz:
        raise ProfileError(
            f"profile clocks {f_lo}-{f_hi} MHz fall outside {preset.name}'s "
            f"{preset.clock_min_mhz:.0f}-{preset.clock_max_mhz:.0f} MHz; choose the matching --gpu"
        )
    if profile.frequency.nunique() < 4:
        raise ProfileError("profile needs at least 4 distinct clocks to fit a clock law")
    keys = list(profile.groupby(["stage", "instruction"]).groups)
    gidx = profile.set_index(["stage", "instruction"]).index.map({k: i for i, k in enumerate(keys)})
    gidx = np.asarray(gidx, dtype=int)
    f = profile.frequency.to_numpy(float)
    t_obs = profile.time.to_numpy(float)
    e_obs = profile.energy.to_numpy(float)
    n_groups = len(keys)

    # initial per-group guesses from the fastest-clock rows
    top = profile.loc[profile.groupby(["stage", "instruction"]).frequency.idxmax()]
    tau0 = top.time.to_numpy(float) * 0.9
    alpha0 = np.maximum(top.energy.to_numpy(float) / top.time.to_numpy(float) - static_w, 10.0)

    f_max = preset.clock_max_mhz

    def unpack(x: NDArray[np.float64]) -> tuple[StageLaw, NDArray, NDArray]:
        law = StageLaw(insensitive_share=x[0], knee_mhz=x[1], v_ratio=x[2])
        return law, np.exp(x[3:3 + n_groups]), np.exp(x[3 + n_groups:])

    def residuals(x: NDArray[np.float64]) -> NDArray[np.float64]:
        law, tau, alpha = unpack(x)
        model = _Model(preset, law, static_w, cap_w)
        t, e = model.predict(f, tau[gidx], alpha[gidx])
        return np.concatenate([t / t_obs - 1, e / e_obs - 1])

    x0 = np.concatenate([[0.15, 0.75 * f_max, 1.2], np.log(tau0), np.log(alpha0)])
    lo = np.concatenate([[0.0, preset.clock_min_mhz, 1.0], np.full(2 * n_groups, -np.inf)])
    hi = np.concatenate([[0.9, f_max - preset.clock_step_mhz, 2.5],
                         np.full(2 * n_groups, np.inf)])
    fit = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", max_nfev=4000)
    law, tau, alpha = unpack(fit.x)
    model = _Model(preset, law, static_w, cap_w)
    t, e = model.predict(f, tau[gidx], alpha[gidx])
    sm_w = float(np.median(alpha))
    return CalibrationResult(
        gpu=preset.name, law=law, sm_dyn_power_w=sm_w,
        hbm_dyn_power_w=preset.hbm_dyn_power_w,
        time_mape_pct=float(np.mean(np.abs(t / t_obs - 1)) * 100),
        energy_mape_pct=float(np.mean(np.abs(e / e_obs - 1)) * 100),
        power_limit_w=cap_w, static_power_w=static_w, points=len(profile),
    )


@dataclass(frozen=True)
class TransferResult:
    """Error of predicting another profile's clock response from a fitted law.

    Times and energies are predicted relative to each instruction's ``anchor_mhz`` point.
    """

    anchor_mhz: float
    time_mape_pct: float
    energy_mape_pct: float
    points: int


def predict_relative(result: CalibrationResult, preset: GPUPreset, profile: pd.DataFrame,
                     anchor_mhz: float) -> tuple[pd.DataFrame, TransferResult]:
    """Predict ``profile``'s per-clock time and energy from ``result``'s law and each
    instruction's measurement at ``anchor_mhz`` alone; return the rows and the error."""
    model = _Model(preset, result.law, result.static_power_w, result.power_limit_w)
    anchor = profile[profile.frequency == anchor_mhz]
    if anchor.empty:
        raise ProfileError(f"profile has no rows at the anchor clock {anchor_mhz} MHz")
    ref = anchor[["stage", "instruction", "time", "energy"]].rename(
        columns={"time": "time_ref", "energy": "energy_ref"})
    rows = profile.merge(ref, on=["stage", "instruction"], how="inner")
    tau, alpha = model.anchor(anchor_mhz, rows.time_ref.to_numpy(float),
                              rows.energy_ref.to_numpy(float))
    t, e = model.predict(rows.frequency.to_numpy(float), tau, alpha)
    rows = rows.assign(time_pred=t, energy_pred=e)
    err_t = np.abs(rows.time_pred / rows.time - 1)
    err_e = np.abs(rows.energy_pred / rows.energy - 1)
    mask = rows.frequency != anchor_mhz
    return rows, TransferResult(
        anchor_mhz=anchor_mhz, time_mape_pct=float(err_t[mask].mean() * 100),
        energy_mape_pct=float(err_e[mask].mean() * 100), points=int(mask.sum()),
    )
