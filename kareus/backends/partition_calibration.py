"""The partition law fitted to a measured partition sweep, and predictions from it.

``kareus calibrate --partition-sweep`` and ``kareus partition`` live here. The law is the
simulator's own (:func:`~kareus.backends.partition_timeline.partition_timeline` with the kernel
laws of :class:`~kareus.backends.sim.SimulatorBackend`); the fit chooses its parameters:

- **the tuned collective**: throughput per SM (``tuned_bw_per_sm_mhz``, proportional to the SM
  clock), its dependence on threads per block (``tuned_block_exponent``), the link path it
  saturates on (``tuned_link_fraction`` of the link), how sharply the two combine
  (``tuned_pipelining``, the soft minimum's exponent; identified, with the three before it, on
  the sequential window, where the collective runs alone) and its launch cost (``comm_launch_s``);
  its fixed latency (``tuned_latency_s``) stays the preset's, since one message size cannot tell
  it from the link path;
- **contention**: the collective's throughput beside a GEMM or attention kernel and its SM
  path beside a memory-bound one (``comm_rate_beside_*``), the most it moves beside a GEMM or
  attention kernel (``tuned_link_fraction_beside_compute`` of the link) and the extra slowdown
  of compute beside it (``overlap_slowdown_*``);
- **waves**: the fraction of a wave a tiled kernel loses when the collective ends inside it
  (``partial_wave_loss``);
- **the host**: time to issue each class of op (``host_issue_*_s``) and the profiling harness's
  per-execution overhead (``partition_harness_s``);
- **power**: the collective's SM activity (``activity_comm``) and link power
  (``link_dyn_power_w``); the compute kernels' power is the preset's (its SM power curve and
  activities), not refitted here;
- **the partition's own ops**: one work factor per op (the op does that many times the work the
  FLOP/byte count says: extra or unfused kernels), pulled towards 1 by a weak penalty, and one
  host factor per op. An op that runs after the compute stream's wait in every measured window
  is only ever seen through the constant time it adds to every configuration, which the
  harness's overhead adds too: its work factor stays 1. Likewise the parameters a sweep cannot
  see (how the collective depends on threads per block, with one block size; the contention
  beside a class of op the collective never runs beside) keep the preset's values and stay out
  of the fitted law (:func:`held_by_sweep`).

Everything is fitted at the sweep's clock. Other clocks follow from the laws: compute-bound work
scales with ``1/f``, HBM-bound work does not, the collective's per-SM throughput scales with
``f``, its link path and the host do not, and power follows the fitted voltage-frequency curve.
Nothing is refitted per clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeGuard

import numpy as np
from numpy.typing import NDArray

from kareus.backends.partition_fit_report import (
    BestConfigurations,
    BlockFloorSlope,
    FloorSlope,
    HoldoutHalf,
    PartitionFitReport,
    PartitionHoldout,
    SweepConfiguration,
)
from kareus.errors import InputError, SweepError
from kareus.frontier import change_pct, mape_pct
from kareus.graph import Partition
from kareus.hardware.partition_sweep import PartitionConfigs, PartitionSweep
from kareus.hardware.presets import GPUPreset
from kareus.inputs import file_problem, loads_json
from kareus.json_types import is_finite_number
from kareus.progress import SILENT, Progress, ProgressTask

CALIBRATION_KIND = "kareus-partition-calibration"
#: 4: the op factors follow the fuser's basic ops (a linear's applied bias is an op of its own).
#: 5: ``comm_rate_beside_memory`` scales the tuned collective's SM path, not its rate.
CALIBRATION_VERSION = 5

# (preset field, transform, initial value): "log" > 0, "unit" in (0, 1), "lo..hi" bounded
_TIME_PARAMS: tuple[tuple[str, str, float], ...] = (
    ("tuned_bw_per_sm_mhz", "log", 7.0e9 / 1410),
    ("tuned_block_exponent", "log", 0.86),
    ("tuned_link_fraction", "unit", 0.9),
    ("tuned_pipelining", "0.5..6", 1.5),
    ("tuned_link_fraction_beside_compute", "unit", 0.15),
    ("comm_launch_s", "log", 6e-6),
    ("comm_rate_beside_memory", "unit", 0.8),
    ("comm_rate_beside_gemm", "unit", 0.9),
    ("comm_rate_beside_attention", "unit", 0.9),
    ("overlap_slowdown_memory", "log", 0.3),
    ("overlap_slowdown_gemm", "log", 0.3),
    ("overlap_slowdown_attention", "log", 0.1),
    ("host_issue_memory_s", "log", 50e-6),
    ("host_issue_gemm_s", "log", 50e-6),
    ("host_issue_attention_s", "log", 50e-6),
    ("partition_harness_s", "log", 500e-6),
    ("partial_wave_loss", "0..1", 0.5),
)
_ENERGY_PARAMS: tuple[tuple[str, str, float], ...] = (
    ("activity_comm", "0.05..2", 0.45),
    # NVLink SerDes and switch ports at full rate: tens of watts, not more (a looser bound lets
    # the link term absorb other power the sweep cannot separate)
    ("link_dyn_power_w", "1..40", 20.0),
)
#: How far below the requested clock the power cap is looked for in predictions (MHz).
_CAP_SPAN_MHZ = 300.0
#: The collective's own law: identified by the sequential window, where it runs alone.
_COMM_ALONE = {"tuned_bw_per_sm_mhz", "tuned_block_exponent", "tuned_link_fraction",
               "tuned_pipelining"}
#: Weight of the penalty pulling log(work factor) towards 0 (relative-error units).
_WORK_PRIOR = 0.02
#: Function evaluations each least-squares stage may spend per free parameter, by default
#: (``max_nfev_per_param`` of :func:`fit_partition`): a fit on part of a sweep that leaves some
#: parameters unidentified stops here instead of wandering.
_MAX_NFEV_PER_PARAM = 10
#: Termination tolerances of the least-squares stages (relative change of the cost and of the
#: parameters). The law's valley is flat (the launch, the harness and the host issue all add
#: near-constant time), and at scipy's defaults (1e-8) the fit stopped early at a point that
#: depended on the machine's floating-point path: on one 2-core machine the full sweep's fit
#: ranked the measured fastest configuration 3rd, on another 5th (joint cost 0.0490). At 1e-10 it
#: goes on to cost 0.0478, ranks it 3rd and returns the preset's law within 4.4 % (the launch
#: cost) and 1.3 % (the others) per parameter; the main fit's stages still end by
#: tolerance within about 80 evaluations.
_TOLERANCES = {"xtol": 1e-10, "ftol": 1e-10}


def _bounds(kind: str) -> tuple[float, float] | None:
    """``(lo, hi)`` of a bounded transform ``"lo..hi"``; ``None`` for the others."""
    if ".." not in kind:
        return None
    lo, hi = kind.split("..")
    return float(lo), float(hi)


def _encode(kind: str, v: float) -> float:
    if kind == "log":
        return float(np.log(v))
    b = _bounds(kind) or ((0.0, 1.0) if kind == "unit" else None)
    if b is not None:
        u = min(max((v - b[0]) / (b[1] - b[0]), 1e-6), 1 - 1e-6)
        return float(np.log(u / (1 - u)))
    return float(v)


def _decode(kind: str, x: float) -> float:
    if kind == "log":
        return float(np.exp(x))
    b = _bounds(kind) or ((0.0, 1.0) if kind == "unit" else None)
    if b is not None:
        return float(b[0] + (b[1] - b[0]) / (1 + np.exp(-x)))
    return float(x)


def _check_factors(partition: Partition, factors: NDArray[np.float64] | None, what: str) -> None:
    """Refuse per-op factors made for another numbering of the partition's kernels (a fit made
    before the spec's linears became two basic ops, say) in one line."""
    if factors is not None and len(factors) != len(partition.compute):
        raise InputError(f"{len(factors)} per-op {what} factors for a partition of "
                         f"{len(partition.compute)} kernels: refit them for this partition "
                         "(`kareus calibrate --partition-sweep`)")


def scaled_partition(partition: Partition, work: NDArray[np.float64] | None) -> Partition:
    """``partition`` with op ``i`` doing ``work[i]`` times its counted FLOPs and bytes."""
    if work is None:
        return partition
    _check_factors(partition, work, "work")
    ops = tuple(replace(op, flops=op.flops * w, bytes=op.bytes * w)
                for op, w in zip(partition.compute, work, strict=True))
    return replace(partition, compute=ops)


def predict(partition: Partition, configs: PartitionConfigs, gpu: GPUPreset,
            clock_mhz: float | None = None, work: NDArray[np.float64] | None = None,
            host: NDArray[np.float64] | None = None, harness: bool = True
            ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Time (s) and meter energy (J, the collective group's GPUs, static included) of every
    configuration, at ``clock_mhz`` (``None``: the default, unlocked clock: the maximum, lowered by
    the power cap where it binds)."""
    from kareus.backends.sim import SimulatorBackend
    from kareus.energy import measured_energy

    clock = gpu.clock_max_mhz if clock_mhz is None else float(clock_mhz)
    SimulatorBackend(gpu).clock_index(clock)  # validates the clock
    # The power cap lowers the clock by at most _CAP_SPAN_MHZ here; simulating only that range of
    # the clock grid keeps the (repeated) predictions of a fit fast.
    lo = max(gpu.clock_min_mhz, clock - _CAP_SPAN_MHZ)
    lo = gpu.clock_min_mhz + np.floor((lo - gpu.clock_min_mhz) / gpu.clock_step_mhz) \
        * gpu.clock_step_mhz
    sim = SimulatorBackend(gpu.with_overrides(clock_min_mhz=lo))
    _check_factors(partition, host, "host")
    part = scaled_partition(partition, work)
    time = np.zeros(len(configs))
    dyn = np.zeros(len(configs))
    win = configs.windows()
    for threads in np.unique(configs.threads):
        rows = np.flatnonzero(configs.threads == threads)
        ks = np.unique(configs.sms[rows])
        grid = sim.evaluate_partition(part, np.array([clock]), ks, win, int(threads),
                                      harness=harness, host_scale=host)
        ki = np.searchsorted(ks, configs.sms[rows])
        wi = np.array([int(np.flatnonzero((win[:, 0] == s) & (win[:, 1] == e))[0])
                       for s, e in zip(configs.start[rows], configs.end[rows])])
        time[rows] = grid.time_s[0, ki, wi]
        dyn[rows] = grid.dynamic_energy_j[0, ki, wi]
    group = partition.comm.group if partition.comm is not None else 1
    return time, group * measured_energy(dyn, gpu.static_power_w, time)


@dataclass(frozen=True)
class PartitionCalibration:
    """A fitted partition law for one spec on one GPU.

    Attributes:
        gpu: Preset name the fit was made for.
        spec_sha256: Hash of the spec the sweep measured.
        clock_mhz: Clock of the sweep (``None``: the default, unlocked clock).
        law: Fitted preset parameters (see the module docstring).
        op_work: Work factor of each kernel of the spec's partition (``spec.partition()``, the
            fuser's basic ops; its FLOPs and bytes are that many times what the spec's shapes
            count).
        op_host: Host-issue factor of each kernel of that partition (times its class's host
            time).
        fit: Fit and hold-out errors (``None``: a calibration made without a fit).
    """

    gpu: str
    spec_sha256: str
    clock_mhz: float | None
    law: dict[str, float]
    op_work: tuple[float, ...]
    op_host: tuple[float, ...]
    fit: PartitionFitReport | None = None

    def apply(self, gpu: GPUPreset) -> GPUPreset:
        """``gpu`` with the fitted law parameters."""
        return gpu.with_overrides(**self.law)

    def to_dict(self) -> dict[str, object]:
        return {"kind": CALIBRATION_KIND, "version": CALIBRATION_VERSION, "gpu": self.gpu,
                "spec_sha256": self.spec_sha256, "clock_mhz": self.clock_mhz,
                "law": self.law, "op_work": list(self.op_work), "op_host": list(self.op_host),
                "fit": {} if self.fit is None else self.fit.to_dict()}

    @staticmethod
    def load(path: str | Path, gpu: str, spec_sha256: str, n_ops: int) -> "PartitionCalibration":
        """Read a calibration file and check it was made for this spec and GPU."""
        p = str(path)
        why = file_problem(path)
        if why is not None:
            raise InputError(f"{p}: no such calibration file" if why == "does not exist"
                             else f"{p}: {why}")
        try:
            raw = loads_json(Path(path).read_text())
        except FileNotFoundError:
            raise InputError(f"{p}: no such calibration file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{p}: not a calibration file ({type(e).__name__})") from None
        if not isinstance(raw, dict) or raw.get("kind") != CALIBRATION_KIND:
            raise InputError(f"{p}: not a partition calibration (kind {CALIBRATION_KIND!r})")
        if raw.get("version") != CALIBRATION_VERSION:
            raise InputError(f"{p}: calibration version {raw.get('version')!r}, this suite reads "
                             f"{CALIBRATION_VERSION}")
        if raw.get("gpu") != gpu:
            raise InputError(f"{p}: calibration made for GPU {raw.get('gpu')!r}, not {gpu!r}")
        if raw.get("spec_sha256") != spec_sha256:
            raise InputError(f"{p}: calibration made for another spec (hash "
                             f"{str(raw.get('spec_sha256'))[:12]}...)")
        law, work, host = raw.get("law"), raw.get("op_work"), raw.get("op_host")

        def factors(v: object) -> TypeGuard[list[float]]:
            return isinstance(v, list) and len(v) == n_ops and all(
                isinstance(x, (int, float)) and np.isfinite(x) and x > 0 for x in v)

        if not isinstance(law, dict) or not factors(work) or not factors(host):
            raise InputError(f"{p}: malformed calibration (law, op_work or op_host)")
        bad = _law_problem(law)
        if bad:
            raise InputError(f"{p}: malformed calibration law: {bad}")
        clock, fit = raw.get("clock_mhz"), raw.get("fit", {})
        if clock is not None and not (is_finite_number(clock) and clock > 0):
            raise InputError(f"{p}: malformed calibration: clock_mhz {clock!r} is neither null "
                             "nor a positive number (MHz)")
        if not isinstance(fit, dict):
            raise InputError(f"{p}: malformed calibration: fit is a {type(fit).__name__}, not "
                             "an object")
        try:
            report = PartitionFitReport.from_dict(fit) if fit else None
        except ValueError as e:
            raise InputError(f"{p}: malformed calibration: fit: {e}") from None
        return PartitionCalibration(gpu=gpu, spec_sha256=spec_sha256, clock_mhz=clock,
                                    law={k: float(v) for k, v in law.items()},
                                    op_work=tuple(float(v) for v in work),
                                    op_host=tuple(float(v) for v in host), fit=report)


def _law_problem(law: dict[object, object]) -> str:
    """Why ``law`` is not a fitted partition law ("" when it is): every key one of the fit's
    parameters (:data:`_TIME_PARAMS`, :data:`_ENERGY_PARAMS`), every value a finite number in
    that parameter's range; at least one."""
    if not law:
        return "it names no parameter"
    kinds = {name: kind for name, kind, _ in _TIME_PARAMS + _ENERGY_PARAMS}
    for name, value in law.items():
        if name not in kinds:
            return f"{name!r} is not a parameter the partition fit chooses"
        kind = kinds[str(name)]
        if kind == "log":
            if not is_finite_number(value) or not float(value) > 0:  # type: ignore[arg-type]
                return f"{name} = {value!r} is not a positive number"
            continue
        lo, hi = _bounds(kind) or (0.0, 1.0)
        if not is_finite_number(value) or not lo <= float(value) <= hi:  # type: ignore[arg-type]
            return f"{name} = {value!r} is not a number in [{lo:g}, {hi:g}]"
    return ""


def _at_starting_point(gpu: GPUPreset) -> GPUPreset:
    """``gpu`` with every parameter the fit chooses at its starting point in
    :data:`_TIME_PARAMS` and :data:`_ENERGY_PARAMS`: a fit never starts from a previous fit's
    values (the power parameters matter to the time stages too, through the power cap), so a
    refit from the preset it produced lands where it did."""
    return gpu.with_overrides(**{name: v for name, _, v in _TIME_PARAMS + _ENERGY_PARAMS})


def _fit_collective_alone(partition: Partition, sweep: PartitionSweep, gpu: GPUPreset,
                          clock_mhz: float | None, fixed: dict[str, float] | None = None
                          ) -> tuple[dict[str, float], float]:
    """Least squares of the collective's own law (:data:`_COMM_ALONE`, less ``fixed``, which is
    held at the given values) and one common work factor for the compute chain, on rows where
    the collective runs alone (window (-1, -1)); every other time parameter at its starting point
    in :data:`_TIME_PARAMS`. Returns the law (``fixed`` included) and the work factor."""
    from scipy.optimize import least_squares

    fixed = dict(fixed or {})
    free = [(name, kind, v) for name, kind, v in _TIME_PARAMS
            if name in _COMM_ALONE and name not in fixed]
    n = len(partition.compute)

    def unpack(y: NDArray) -> tuple[dict[str, float], float]:
        law = {name: _decode(kind, v) for (name, kind, _), v in zip(free, y)}
        return {**law, **fixed}, float(np.exp(y[-1]))

    start = _at_starting_point(gpu)

    def resid(y: NDArray) -> NDArray:
        law, work = unpack(y)
        t, _ = predict(partition, sweep.configs, start.with_overrides(**law), clock_mhz,
                       np.full(n, work))
        return t / sweep.time_s - 1

    y0 = np.array([_encode(kind, v) for _, kind, v in free] + [0.0])
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # rejected trial steps
        return unpack(least_squares(resid, y0).x)


def collective_alone_holdout(partition: Partition, sweep: PartitionSweep, gpu: GPUPreset,
                             clock_mhz: float | None = None, split_sms: int = 10
                             ) -> dict[str, dict[str, float]]:
    """How the collective's law extrapolates in SMs: fitted on the sequential rows with at most
    ``split_sms`` SMs, the time MAPE and max APE (%) of the rows above, for the pipelined soft
    minimum (the simulator's law) and for the series law (``tuned_pipelining`` = 1)."""
    seq = sweep.subset(sweep.configs.start < 0)
    low = seq.configs.sms <= split_sms
    if low.sum() < len(_COMM_ALONE) + 2 or low.all():
        raise InputError(f"the sweep's sequential window needs rows on both sides of "
                         f"{split_sms} SMs for this hold-out")
    train, test = seq.subset(low), seq.subset(~low)
    start = _at_starting_point(gpu)
    out = {}
    for label, fixed in (("pipelined", None), ("series", {"tuned_pipelining": 1.0})):
        law, work = _fit_collective_alone(partition, train, gpu, clock_mhz, fixed)
        t, _ = predict(partition, test.configs, start.with_overrides(**law), clock_mhz,
                       np.full(len(partition.compute), work))
        ape = np.abs(change_pct(test.time_s, t))
        out[label] = {"time_mape_pct": float(ape.mean()), "time_max_ape_pct": float(ape.max()),
                      "tuned_pipelining": float(law["tuned_pipelining"])}
    return out


def _never_overlapped(configs: PartitionConfigs, n_ops: int) -> NDArray[np.bool_]:
    """The ops that run after the compute stream's wait in every window of ``configs`` (the
    collective never runs beside them)."""
    return np.arange(n_ops) > int(np.max(configs.end))


def held_by_sweep(partition: Partition, sweep: PartitionSweep) -> list[str]:
    """Time parameters a sweep of ``partition`` cannot identify. The fit holds them at the
    preset's values and leaves them out of its law, so a calibration applied to other partitions
    keeps what the preset knows; fitted, the solver would move them where nothing pins them:

    - the collective's dependence on threads per block (``tuned_block_exponent``) needs rows of
      two block sizes or more: with one, ``(threads / comm_block_default) ** exponent`` is the
      same for every row (or, with one other size, a constant factor the per-SM throughput
      absorbs);
    - a class of op (memory, GEMM, attention) the partition does not have leaves its host issue
      time unseen;
    - a class the collective never runs beside (no op of it before the last wait of the sweep's
      windows; none at all in a sweep of the sequential window only) leaves the class's slowdown
      beside the collective and the collective's rate beside it unseen; with no GEMM or attention
      kernel beside it, its link cap beside them (``tuned_link_fraction_beside_compute``); with no
      kernel of uniform tiles (a GEMM, non-causal attention) beside it, the wave such a kernel
      loses when the collective ends inside it (``partial_wave_loss``).
    """
    names: list[str] = []
    if np.unique(sweep.configs.threads).size < 2:
        names.append("tuned_block_exponent")
    never = _never_overlapped(sweep.configs, len(partition.compute))
    beside = [op for op, out in zip(partition.compute, never) if not out]
    kinds = {op.kind for op in partition.compute}
    kinds_beside = {op.kind for op in beside}
    for kind in ("memory", "gemm", "attention"):
        if kind not in kinds:
            names.append(f"host_issue_{kind}_s")
        if kind not in kinds_beside:
            names += [f"overlap_slowdown_{kind}", f"comm_rate_beside_{kind}"]
    if not kinds_beside & {"gemm", "attention"}:
        names.append("tuned_link_fraction_beside_compute")
    if not any(op.kind != "memory" and op.uneven_tail is None for op in beside):
        names.append("partial_wave_loss")
    return names


def _fit_law(partition: Partition, sweep: PartitionSweep, gpu: GPUPreset,
             clock_mhz: float | None, starts: int = 2,
             max_nfev_per_param: int = _MAX_NFEV_PER_PARAM
             ) -> tuple[dict[str, float], NDArray[np.float64], NDArray[np.float64]]:
    """Least-squares fit of the time parameters (best of ``starts`` starting points), then of
    the power parameters, each stage within ``max_nfev_per_param`` function evaluations per free
    parameter. Returns the law, the op work factors and the op host factors."""
    from scipy.optimize import least_squares

    unseen = held_by_sweep(partition, sweep)
    preset_values = {name: getattr(gpu, name) for name in unseen}
    gpu = _at_starting_point(gpu).with_overrides(**preset_values)
    n = len(partition.compute)
    t_meas, e_meas = sweep.time_s, sweep.energy_j
    m = len(_TIME_PARAMS)

    held = _never_overlapped(sweep.configs, n)

    def unpack_time(x: NDArray) -> tuple[dict[str, float], NDArray, NDArray]:
        law = {name: _decode(kind, v) for (name, kind, _), v in zip(_TIME_PARAMS, x)
               if name not in preset_values}
        return law, np.where(held, 1.0, np.exp(x[m:m + n])), np.exp(x[m + n:])

    def time_resid(x: NDArray) -> NDArray:
        law, work, host = unpack_time(x)
        t, _ = predict(partition, sweep.configs, gpu.with_overrides(**law), clock_mhz, work, host)
        return np.concatenate([t / t_meas - 1, _WORK_PRIOR * np.log(work),
                               _WORK_PRIOR * np.log(host)])

    x0 = np.array([_encode(k, v) for _, k, v in _TIME_PARAMS] + [0.0] * (2 * n))
    # Stage 1: the collective's own law from the sequential window (it runs alone there).
    seq = sweep.configs.start < 0
    if seq.sum() >= len(_COMM_ALONE) + 2:
        alone, common_work = _fit_collective_alone(partition, sweep.subset(seq), gpu, clock_mhz,
                                                   fixed=preset_values)
        for i, (name, kind, _) in enumerate(_TIME_PARAMS):
            if name in alone:
                x0[i] = _encode(kind, alone[name])
        x0[m:m + n] = np.log(common_work)
    # Stage 2: everything, from several starting points of the per-op factors and contention.
    rng = np.random.default_rng(0)
    best = None
    free = np.array([name not in _COMM_ALONE and name not in preset_values
                     for name, _, _ in _TIME_PARAMS] + [True] * (2 * n))
    n_free = x0.size - len(preset_values)  # the held ones stay in x, unused
    for k in range(starts):
        start = x0 + (rng.normal(0.0, 0.6, x0.size) * free if k else 0.0)
        res = least_squares(time_resid, start, max_nfev=max_nfev_per_param * n_free,
                            **_TOLERANCES)
        if best is None or res.cost < best.cost:
            best = res
    # Stage 3: time and power together (power sets where the cap throttles the clock).
    q = len(_ENERGY_PARAMS)
    p0 = np.array([_encode(k, v) for _, k, v in _ENERGY_PARAMS])

    def unpack(x: NDArray) -> tuple[dict[str, float], NDArray, NDArray]:
        law, work, host = unpack_time(x[:-q])
        law.update({name: _decode(kind, v) for (name, kind, _), v in zip(_ENERGY_PARAMS, x[-q:])})
        return law, work, host

    def joint_resid(x: NDArray) -> NDArray:
        law, work, host = unpack(x)
        t, e = predict(partition, sweep.configs, gpu.with_overrides(**law), clock_mhz, work, host)
        return np.concatenate([t / t_meas - 1, e / e_meas - 1,
                               _WORK_PRIOR * np.log(work), _WORK_PRIOR * np.log(host)])

    assert best is not None  # starts >= 1
    res = least_squares(joint_resid, np.concatenate([best.x, p0]),
                        max_nfev=max_nfev_per_param * (n_free + q), **_TOLERANCES)
    return unpack(res.x)


def fit_partition(partition: Partition, sweep: PartitionSweep, gpu: GPUPreset, spec_sha256: str,
                  clock_mhz: float | None = None, holdout: bool = True,
                  progress: Progress = SILENT, *,
                  max_nfev_per_param: int = _MAX_NFEV_PER_PARAM) -> PartitionCalibration:
    """Fit the partition law to ``sweep`` and measure its errors.

    The hold-out splits the sweep's windows in two alternating halves (by window order), fits on
    one half and predicts the other, both ways; it reports the errors on the predicted halves, or
    why it was skipped (``fit.holdout.skipped``: a half without an overlapped window).
    ``progress`` counts the fits (one, or three with the hold-out). Each least-squares stage of a
    fit spends at most ``max_nfev_per_param`` function evaluations per free parameter.
    """
    overlapped = sweep.configs.start >= 0
    if not overlapped.any():
        raise SweepError("the sweep has no row with the collective beside compute (every window "
                         "is (-1, -1)); the partition law is fitted on overlapped windows")
    _check_enough_rows(partition, sweep)
    skipped = _holdout_gap(sweep) if holdout else ""
    holdout = holdout and not skipped
    task = progress.start("partition law: fits", total=3 if holdout else 1)
    try:
        # the solver's trial steps may reach a rate of zero (an infinite time): a step it rejects,
        # not a warning for the user
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            cal = _fit_partition(partition, sweep, gpu, spec_sha256, clock_mhz, holdout, task,
                                 max_nfev_per_param)
    finally:
        task.done()
    if skipped and cal.fit is not None:
        cal = replace(cal, fit=replace(cal.fit, holdout=PartitionHoldout(skipped=skipped)))
    return cal


def _check_enough_rows(partition: Partition, sweep: PartitionSweep) -> None:
    """Refuse a sweep too small for the law (:class:`SweepError`): the fit needs at least as many
    rows as the law has free parameters (those :func:`held_by_sweep` leaves out do not count)."""
    need = len(_TIME_PARAMS) + len(_ENERGY_PARAMS) - len(held_by_sweep(partition, sweep))
    if len(sweep.configs) < need:
        raise SweepError(f"the sweep has {len(sweep.configs)} rows; the partition law has {need} "
                         "free parameters, so it needs at least that many rows")


def _holdout_gap(sweep: PartitionSweep) -> str:
    """Why the hold-out cannot run on ``sweep`` ("" when it can): it fits on every other window
    and predicts the rest, so each half needs an overlapped window."""
    wins = sweep.configs.windows()
    if all((half[:, 0] >= 0).any() for half in (wins[0::2], wins[1::2])):
        return ""
    return (f"skipped: each half of the windows needs an overlapped one, and the sweep has "
            f"{int((wins[:, 0] >= 0).sum())}")


def _fit_partition(partition: Partition, sweep: PartitionSweep, gpu: GPUPreset,
                   spec_sha256: str, clock_mhz: float | None, holdout: bool,
                   task: ProgressTask, max_nfev_per_param: int) -> PartitionCalibration:
    law, work, host = _fit_law(partition, sweep, gpu, clock_mhz,
                               max_nfev_per_param=max_nfev_per_param)
    task.advance()
    fitted = gpu.with_overrides(**law)
    t, e = predict(partition, sweep.configs, fitted, clock_mhz, work, host)
    holdout_report = None
    if holdout:
        wins = sweep.configs.windows()
        halves = [wins[0::2], wins[1::2]]
        parts = []
        for train, test in (halves, halves[::-1]):
            in_test = _in_windows(sweep.configs, test)
            law_h, work_h, host_h = _fit_law(partition, sweep.subset(~in_test), gpu, clock_mhz,
                                             max_nfev_per_param=max_nfev_per_param)
            task.advance()
            held = sweep.subset(in_test)
            th, eh = predict(partition, held.configs, gpu.with_overrides(**law_h), clock_mhz,
                             work_h, host_h)
            parts.append(HoldoutHalf(tuple((int(a), int(b)) for a, b in train),
                                     tuple((int(a), int(b)) for a, b in test),
                                     mape_pct(held.time_s, th), mape_pct(held.energy_j, eh)))
        holdout_report = PartitionHoldout(tuple(parts))
    fit = PartitionFitReport(
        rows=len(sweep.configs), repeats=sweep.repeats,
        time_mape_pct=mape_pct(sweep.time_s, t), energy_mape_pct=mape_pct(sweep.energy_j, e),
        time_max_ape_pct=float(np.max(np.abs(change_pct(sweep.time_s, t)))),
        best=best_configurations(sweep, t), floor=floor_slope(sweep, t, e),
        kept_from_preset=tuple(held_by_sweep(partition, sweep)), holdout=holdout_report)
    return PartitionCalibration(gpu=gpu.name, spec_sha256=spec_sha256, clock_mhz=clock_mhz,
                                law=law, op_work=tuple(float(w) for w in work),
                                op_host=tuple(float(h) for h in host), fit=fit)


def _in_windows(configs: PartitionConfigs, windows: NDArray[np.int64]) -> NDArray[np.bool_]:
    key = configs.start * 1000 + configs.end
    return np.isin(key, windows[:, 0] * 1000 + windows[:, 1])


def best_configurations(sweep: PartitionSweep, predicted_time: NDArray[np.float64]
                        ) -> BestConfigurations:
    """Where the measured fastest configuration ranks among the predicted ones (1 = fastest),
    and how much slower (%) the predicted fastest measures than it."""
    c = sweep.configs
    best = int(np.argmin(sweep.time_s))
    rank = int(np.sum(predicted_time < predicted_time[best])) + 1
    pred_best = int(np.argmin(predicted_time))

    def cfg(i: int) -> SweepConfiguration:
        return SweepConfiguration(int(c.start[i]), int(c.end[i]), int(c.sms[i]),
                                  int(c.threads[i]))

    return BestConfigurations(
        cfg(best), float(sweep.time_s[best]), rank, cfg(pred_best),
        float(predicted_time[pred_best]), float(sweep.time_s[pred_best]),
        float(change_pct(sweep.time_s[best], sweep.time_s[pred_best])))


def floor_slope(sweep: PartitionSweep, predicted_time: NDArray[np.float64],
                predicted_energy: NDArray[np.float64], min_rows: int = 5) -> FloorSlope:
    """What each SM given to the collective past a window's fastest SM count costs, measured and
    predicted: the least-squares slope of time (us per SM) and energy (mJ per SM) over SM count
    from that window's (and block size's) measured fastest SM count up, averaged over the
    overlapped windows with at least ``min_rows`` such rows.

    Past that point the collective is hidden and more SMs only take from the compute: the slope
    is the floor's rise, which decides where the fastest configuration lies. ``windows`` counts
    the (window, block size) groups averaged; ``by_block`` gives the time slopes per block size
    (threads, as a string key): whether an SM costs the same whatever its block's size tells
    whole-SM occupancy from a share of the SM's thread slots.
    """
    c = sweep.configs
    # per window: measured and predicted us per SM, measured and predicted mJ per SM
    slopes: list[tuple[float, ...]] = []
    blocks: list[int] = []
    for s, e, b in sorted(set(zip(c.start.tolist(), c.end.tolist(), c.threads.tolist()))):
        if s < 0:
            continue
        rows = np.flatnonzero((c.start == s) & (c.end == e) & (c.threads == b))
        rows = rows[np.argsort(c.sms[rows])]
        rows = rows[int(np.argmin(sweep.time_s[rows])):]
        if rows.size < min_rows:
            continue
        k = c.sms[rows].astype(np.float64)
        slopes.append(tuple(float(np.polyfit(k, y[rows], 1)[0]) for y in (
            1e6 * sweep.time_s, 1e6 * predicted_time, 1e3 * sweep.energy_j,
            1e3 * predicted_energy)))
        blocks.append(int(b))
    if not slopes:
        return FloorSlope(0)
    table, block = np.array(slopes), np.array(blocks)
    mean = table.mean(axis=0)
    by_block = {str(b): BlockFloorSlope(int(np.sum(block == b)),
                                        float(table[block == b, 0].mean()),
                                        float(table[block == b, 1].mean()))
                for b in sorted(set(blocks))}
    return FloorSlope(len(slopes), float(mean[0]), float(mean[1]), float(mean[2]),
                      float(mean[3]), by_block)


