"""Fit a GPU preset's clock -> time and clock -> power laws from a measured profile.

The measured unit is one pipeline instruction (stage, forward/backward) of a real training run at
each locked SM clock. Its time and power are modelled with the simulator's own laws, aggregated
over the instruction's kernels:

- time: a share ``m`` of the work is clock-insensitive (HBM-bound kernels, communication); the
  rest scales with ``1/f``: ``T(f) = τ · (m + (1 - m) · f_max / f_eff)``;
- power: the simulator's own law, :func:`kareus.hardware.power.dynamic_power`, applied to the
  instruction's mix of kernels: ``P(f) = P_static + α · s(f_eff) · (φ + a_mem · (1 - φ)) +
  P_hbm · (φ · u_c + (1 - φ) · u_m)`` where ``φ`` is the time share of clock-scaling work at
  ``f``, ``s`` the V–f law of :mod:`kareus.hardware.power`, ``a_mem`` the SM activity of
  memory-bound kernels, ``P_hbm`` the preset's HBM power at full bandwidth (not identifiable from
  clock sweeps: HBM runs on its own clock, so it is taken from the preset) and ``u`` the HBM
  utilisations of compute- and memory-bound kernels;
- the clock the card sustains (:func:`kareus.hardware.power.sustained_clock`): ``f_eff =
  min(f, f_cap, f_ceiling)``, where the power controller holds the average power at the cap
  (``f_cap``, the crossing of the cap), and, fitted with ``clock_limits=True``, a sustained-clock
  ceiling ``f_ceiling`` and the cap itself (the average power the controller holds, at or below
  the board limit). The A100 profiles need the ceiling: GPT-3 175B and Bloom stop speeding up above
  ~1380 MHz at different powers (~480 and ~462 W), so the limit is a clock, not a power.

GPU-level parameters (``m``, knee, voltage ratio) are shared by all instructions; ``τ`` and
``α`` are per instruction. ``α`` at full tensor activity is the preset's SM dynamic power.

Above the knee the voltage rises linearly with the clock, so a profile whose clocks all lie above
it shows at most that slope, one combination of the knee and the voltage ratio, and near the
power cap not even that (a flat voltage and a low knee fit the A40's top 150 MHz as well as the
real curve). With fewer than :data:`MIN_CLOCKS_BELOW_KNEE` clocks below the preset's knee, the
knee and the voltage ratio keep the preset's values (``CalibrationResult.kept_from_preset``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from scipy.optimize import least_squares

from kareus.errors import ProfileError
from kareus.frontier import change_pct, mape_pct
from kareus.hardware.power import dynamic_power, sm_power_scale, sustained_clock
from kareus.hardware.presets import GPUPreset


#: Distinct profile clocks below the preset's knee needed to fit the knee and the voltage ratio.
MIN_CLOCKS_BELOW_KNEE = 2
#: The preset fields a profile's fit sets: SM dynamic power at full activity (W), the V-f knee
#: (MHz) and the voltage ratio (:meth:`CalibrationResult.fitted_preset`).
FITTED_FIELDS = ("sm_dyn_power_w", "knee_mhz", "v_ratio")


@dataclass(frozen=True)
class StageLaw:
    """GPU-level parameters of the aggregated instruction model (see module docstring)."""

    insensitive_share: float  # m: share of time at f_max that does not scale with the clock
    knee_mhz: float
    v_ratio: float
    ceiling_mhz: float | None = None  # sustained-clock ceiling under load (MHz); None: none
    cap_w: float | None = None  # average power the cap holds (W); None: the board limit


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
        alphas: Per (stage, instruction) fitted SM power ``α`` (W), the activity prior for an
            instruction whose anchor runs at the cap (see :func:`predict_relative`).
        kept_from_preset: Law parameters the profile cannot identify, held at the preset's
            values (see the module docstring).
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
    alphas: tuple[tuple[int, str, float], ...] = ()
    kept_from_preset: tuple[str, ...] = ()

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
        self.cap_w = cap_w if law.cap_w is None else law.cap_w
        # u_c: HBM use of compute-bound kernels (operand streaming); u_m: of memory-bound ones.
        self.u_c, self.u_m = 0.15, preset.hbm_efficiency
        self.grid = preset.clock_grid()

    def _phi(self, f: NDArray[np.float64]) -> NDArray[np.float64]:
        """Time share of clock-scaling work at clock f."""
        m, scale = self.law.insensitive_share, self.p.clock_max_mhz / f
        return (1 - m) * scale / (m + (1 - m) * scale)

    def power(self, f: NDArray[np.float64], alpha: NDArray[np.float64]) -> NDArray[np.float64]:
        """Total power (W) at effective clock f of instructions of SM power ``alpha`` (W): the
        static power plus :func:`~kareus.hardware.power.dynamic_power` of the kernel mix."""
        phi = self._phi(f)
        s = sm_power_scale(f, self.p.clock_max_mhz, self.law.knee_mhz, self.law.v_ratio)
        busy = alpha / self.p.sm_dyn_power_w * (phi + self.p.activity_memory * (1 - phi))
        hbm = phi * self.u_c + (1 - phi) * self.u_m
        return self.static_w + dynamic_power(self.p, s, busy, hbm)

    def effective_clock(self, f: NDArray[np.float64], alpha: NDArray[np.float64]
                        ) -> NDArray[np.float64]:
        """Per row: the clock the card sustains (cap and ceiling)."""
        excess = self.power(self.grid[None, :], alpha[:, None]) - self.cap_w
        return sustained_clock(f, excess, self.grid, self.law.ceiling_mhz)

    def time_factor(self, fe: NDArray[np.float64]) -> NDArray[np.float64]:
        """Time at effective clock ``fe`` per unit ``τ``."""
        m = self.law.insensitive_share
        return m + (1 - m) * self.p.clock_max_mhz / fe

    def predict(self, f: NDArray[np.float64], tau: NDArray[np.float64],
                alpha: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Time (s) and energy (J) of rows with clock ``f`` and per-row ``tau``, ``alpha``."""
        fe = self.effective_clock(f, alpha)
        t = tau * self.time_factor(fe)
        return t, self.power(fe, alpha) * t


#: A profile whose median row draws more than this many times the power limit, or less than this
#: share of the static power, is not one GPU's joules per instruction (:func:`calibrate`).
_MAX_POWER_OVER_LIMIT = 2.0
_MIN_POWER_OVER_STATIC = 0.25


def _check_power_plausible(profile: pd.DataFrame, preset: GPUPreset, static_w: float,
                           cap_w: float) -> None:
    """Refuse a profile whose rows' average power (energy / time, W) cannot be one GPU's: the
    median above :data:`_MAX_POWER_OVER_LIMIT` times the power limit or below
    :data:`_MIN_POWER_OVER_STATIC` of the static power (energies in the wrong unit, or summed
    over GPUs). Its fit would carry that power into the preset."""
    watts = float(np.median(profile.energy.to_numpy(float) / profile.time.to_numpy(float)))
    if watts > _MAX_POWER_OVER_LIMIT * cap_w or watts < _MIN_POWER_OVER_STATIC * static_w:
        raise ProfileError(
            f"the profile's rows draw {watts:,.1f} W (median energy / time), not what one "
            f"{preset.name} can ({static_w:.0f} W static, {cap_w:.0f} W limit): energy must be "
            "joules per instruction of one GPU and time seconds")


def calibrate(profile: pd.DataFrame, preset: GPUPreset, *, static_power_w: float | None = None,
              power_limit_w: float | None = None, clock_limits: bool = True,
              max_nfev: int = 4000,
              min_clocks_below_knee: int = MIN_CLOCKS_BELOW_KNEE) -> CalibrationResult:
    """Fit the GPU-level laws and per-instruction scales to a validated profile.

    Args:
        profile: Output of :func:`kareus.hardware.profile.load_profile`.
        preset: GPU whose clock range and activity priors are used.
        static_power_w: Blocked-on-P2P power of the measured GPUs (default: the preset's).
        power_limit_w: Power cap of the measured GPUs (default: the preset's).
        clock_limits: Also fit the sustained-clock ceiling and the average power the cap holds
            (at most ``power_limit_w``); ``False`` is the earlier law (no ceiling, the cap at the
            board limit).
        max_nfev: The fit's budget: residual evaluations each of the three least-squares starts
            (one per knee guess) may spend.
        min_clocks_below_knee: With fewer distinct clocks below the preset's knee, the knee and
            the voltage ratio keep the preset's values (0: always fit them).
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
    _check_power_plausible(profile, preset, static_w, cap_w)
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
    n_law = 5 if clock_limits else 3

    below_knee = int(np.sum(np.unique(profile.frequency.to_numpy(float))
                            < preset.knee_mhz))
    vf_held = below_knee < min_clocks_below_knee

    def unpack(x: NDArray[np.float64]) -> tuple[StageLaw, NDArray, NDArray]:
        knee, v_ratio = (preset.knee_mhz, preset.v_ratio) if vf_held else (x[1], x[2])
        law = StageLaw(insensitive_share=x[0], knee_mhz=knee, v_ratio=v_ratio,
                       ceiling_mhz=float(x[3]) if clock_limits else None,
                       cap_w=float(x[4]) if clock_limits else None)
        return law, np.exp(x[n_law:n_law + n_groups]), np.exp(x[n_law + n_groups:])

    def residuals(x: NDArray[np.float64]) -> NDArray[np.float64]:
        law, tau, alpha = unpack(x)
        model = _Model(preset, law, static_w, cap_w)
        t, e = model.predict(f, tau[gidx], alpha[gidx])
        return np.concatenate([t / t_obs - 1, e / e_obs - 1])

    lo = [0.0, preset.clock_min_mhz, 1.0]
    hi = [0.9, f_max - preset.clock_step_mhz, 2.5]
    x_law = [0.15, 0.75 * f_max, 1.2]
    if clock_limits:  # the ceiling may sit above the top clock (no ceiling)
        lo += [0.85 * f_max, 0.6 * cap_w]
        hi += [f_max + preset.clock_step_mhz, cap_w]
        x_law += [f_max - 2 * preset.clock_step_mhz, 0.97 * cap_w]
    lo = np.concatenate([lo, np.full(2 * n_groups, -np.inf)])
    hi = np.concatenate([hi, np.full(2 * n_groups, np.inf)])
    fit = None
    # the knee's loss surface has local minima; held, one start does
    for knee in (0.75,) if vf_held else (0.65, 0.75, 0.85):
        x_law[1] = knee * f_max
        x0 = np.concatenate([x_law, np.log(tau0), np.log(alpha0)])
        r = least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", max_nfev=max_nfev)
        if fit is None or r.cost < fit.cost:
            fit = r
    law, tau, alpha = unpack(fit.x)
    model = _Model(preset, law, static_w, cap_w)
    t, e = model.predict(f, tau[gidx], alpha[gidx])
    sm_w = float(np.median(alpha))
    return CalibrationResult(
        gpu=preset.name, law=law, sm_dyn_power_w=sm_w,
        hbm_dyn_power_w=preset.hbm_dyn_power_w,
        time_mape_pct=mape_pct(t_obs, t), energy_mape_pct=mape_pct(e_obs, e),
        power_limit_w=cap_w, static_power_w=static_w, points=len(profile),
        alphas=tuple((int(k[0]), str(k[1]), float(a)) for k, a in zip(keys, alpha)),
        kept_from_preset=("knee_mhz", "v_ratio") if vf_held else (),
    )


@dataclass(frozen=True)
class TransferResult:
    """Error of predicting another profile's clock response from a fitted law.

    Times and energies are predicted relative to each instruction's ``anchor_mhz`` point; the
    errors are over the other clocks (percent).
    """

    anchor_mhz: float
    time_mape_pct: float
    energy_mape_pct: float
    points: int
    time_max_pct: float = float("nan")
    energy_max_pct: float = float("nan")


def predict_relative(result: CalibrationResult, preset: GPUPreset, profile: pd.DataFrame,
                     anchor_mhz: float | None = None) -> tuple[pd.DataFrame, TransferResult]:
    """Predict ``profile``'s per-clock time and energy relative to each instruction's point at
    ``anchor_mhz`` (default: the profile's top clock) from ``result``'s law.

    Nothing of ``profile`` but its clocks enters the prediction: each instruction takes the SM
    power ``α`` fitted for the same (stage, instruction) of ``result``'s profile (the median over
    its stages for a stage it lacks), as the simulator takes activities from kernel classes; ``τ``
    cancels in the ratios. (A single anchor point cannot give ``α``: at the top clock the A40
    runs at its cap, where the measured power shows the cap, not the activity.)

    Returns the rows (with ``time_pred``, ``energy_pred`` in absolute units scaled to the
    measured anchor, and ``time_ref``, ``energy_ref``) and the error.
    """
    model = _Model(preset, result.law, result.static_power_w, result.power_limit_w)
    anchor_mhz = float(profile.frequency.max()) if anchor_mhz is None else float(anchor_mhz)
    anchor = profile[profile.frequency == anchor_mhz]
    if anchor.empty:
        raise ProfileError(f"profile has no rows at the anchor clock {anchor_mhz} MHz")
    if not result.alphas:
        raise ProfileError("calibration result carries no per-instruction SM powers")
    ref = anchor[["stage", "instruction", "time", "energy"]].rename(
        columns={"time": "time_ref", "energy": "energy_ref"})
    rows = profile.merge(ref, on=["stage", "instruction"], how="inner")
    fitted = pd.DataFrame(list(result.alphas), columns=["stage", "instruction", "alpha"])
    by_kind = fitted.groupby("instruction").alpha.median()
    exact = fitted.set_index(["stage", "instruction"]).alpha
    alpha = np.array([exact.get((s, i), by_kind.get(i, fitted.alpha.median()))
                      for s, i in zip(rows.stage, rows.instruction)], dtype=float)
    f = rows.frequency.to_numpy(float)
    t, e = model.predict(f, np.ones_like(f), alpha)
    t0, e0 = model.predict(np.full_like(f, anchor_mhz), np.ones_like(f), alpha)
    rows = rows.assign(time_pred=t / t0 * rows.time_ref, energy_pred=e / e0 * rows.energy_ref)
    err_t = np.abs(change_pct(rows.time, rows.time_pred))
    err_e = np.abs(change_pct(rows.energy, rows.energy_pred))
    mask = rows.frequency != anchor_mhz
    return rows, TransferResult(
        anchor_mhz=anchor_mhz, time_mape_pct=float(err_t[mask].mean()),
        energy_mape_pct=float(err_e[mask].mean()), points=int(mask.sum()),
        time_max_pct=float(err_t[mask].max()), energy_max_pct=float(err_e[mask].max()),
    )


def transfer_table(rows: pd.DataFrame, anchor_mhz: float | None = None) -> pd.DataFrame:
    """Per (stage, instruction): MAPE and max (percent) of the predicted time and energy relative
    to the anchor point, over the other clocks (``rows`` from :func:`predict_relative`)."""
    anchor_mhz = rows.frequency.max() if anchor_mhz is None else anchor_mhz
    r = rows[rows.frequency != anchor_mhz]
    err = r.assign(t=change_pct(r.time, r.time_pred).abs(),
                   e=change_pct(r.energy, r.energy_pred).abs())
    return err.groupby(["stage", "instruction"]).agg(
        time_mape_pct=("t", "mean"), time_max_pct=("t", "max"),
        energy_mape_pct=("e", "mean"), energy_max_pct=("e", "max")).reset_index()
