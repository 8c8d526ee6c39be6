"""Profiling real GPUs for calibration (``kareus calibrate --gpu-measure``).

:func:`gpu_measure` runs, on the GPU backend,

1. every instruction type (stage, forward/backward) of a workload at each available clock -- the
   clocks given when clock control is allowed, else only the card's current clock (recorded as
   the mean SM clock NVML reported during each window) -- and writes the rows as a Zeus-format
   profile (``stage,instruction,frequency,time,energy``; energy of one GPU, static included, as
   a meter reads it);
2. optionally each compute op of one layer's partitions alone ("op classes": GEMM, attention,
   memory-bound), and partition configurations over (SMs, launch slot; waited for at the end);

then, with at least four distinct clocks, fits the preset with
:func:`kareus.hardware.calibration.calibrate` and writes the fitted preset; and always reports the
simulator's prediction error against the measurements (preset as given, and fitted when there
is a fit). Outputs are written atomically.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kareus.atomic import atomic_write_json, atomic_write_text
from kareus.backends.gpu.backend import GPUBackend
from kareus.backends.gpu.results import InstructionResult, PartitionResult, PlanResult
from kareus.energy import measured_energy
from kareus.errors import InputError
from kareus.frontier import change_pct, mape_pct
from kareus.graph import Direction
from kareus.hardware.presets import GPUPreset
from kareus.hardware.profile import validate_profile
from kareus.json_types import JsonObject, record_dict
from kareus.plan import InstructionPlan
from workloads.parallel import Workload


def snap_to_grid(mhz: float, preset: GPUPreset) -> float:
    """The preset's grid clock at or below ``mhz`` (clamped to the preset's range)."""
    mhz = min(max(mhz, preset.clock_min_mhz), preset.clock_max_mhz)
    steps = math.floor((mhz - preset.clock_min_mhz) / preset.clock_step_mhz + 1e-6)
    return preset.clock_min_mhz + steps * preset.clock_step_mhz


def observed_clock(backend: GPUBackend, requested: float) -> float:
    """The clock a measurement ran at: the request when clocks are locked, else the mean SM clock
    sampled during the window (the request if nothing was sampled)."""
    if backend.allow_clock_control:
        return requested
    windows = [w for r in backend.last_run for w in (
        [row.window for row in r.rows] if isinstance(r, PartitionResult)
        else [r.window] if isinstance(r, (InstructionResult, PlanResult)) else [])]
    seen = [w.sm_clock_mhz for w in windows if w.sm_clock_mhz]
    return float(np.mean(seen)) if seen else requested


def measure_profile(backend: GPUBackend, workload: Workload, clocks_mhz: Sequence[float],
                    *, nanobatched: bool = False) -> pd.DataFrame:
    """Zeus-format profile of every instruction type of ``workload`` at each clock (MHz): time
    (s) and energy of one GPU (J, static included) of one instruction."""
    graph = backend.bind(workload)
    rows = []
    for key in sorted(graph.instruction_graphs):
        for clock in clocks_mhz:
            cost = backend.evaluate_instruction(graph, key, InstructionPlan.make(clock,
                                                                                 nanobatched))
            f = snap_to_grid(observed_clock(backend, clock), backend.gpu)
            rows.append({"stage": key[0], "instruction": key[1], "frequency": int(round(f)),
                         "time": cost.time_s,
                         "energy": measured_energy(cost.dynamic_energy_j,
                                                   backend.static_power_w, cost.time_s)})
    df = pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
    # Without clock control two requests can land on one observed clock: keep the mean.
    df = df.groupby(["stage", "instruction", "frequency"], as_index=False).mean()
    return validate_profile(df, "measured profile")


@dataclass(frozen=True)
class InstructionComparison:
    """One profile row (an instruction type at a clock) measured and simulated: time of one
    instruction (s) and energy of one GPU over it (J, static included)."""

    stage: int
    instruction: str
    frequency: int
    time_measured: float
    time_sim: float
    energy_measured: float
    energy_sim: float
    time_err_pct: float
    energy_err_pct: float

    def to_dict(self) -> JsonObject:
        return record_dict(self)


@dataclass(frozen=True)
class SimulatorError:
    """The simulator (with preset ``preset``) against a measured profile: each row, and the
    mean absolute percentage errors of time and energy (%)."""

    preset: str
    rows: tuple[InstructionComparison, ...]
    time_mape_pct: float
    energy_mape_pct: float

    def to_dict(self) -> JsonObject:
        return {"preset": self.preset, "rows": [r.to_dict() for r in self.rows],
                "time_mape_pct": self.time_mape_pct, "energy_mape_pct": self.energy_mape_pct}


def simulator_error(profile: pd.DataFrame, workload: Workload, preset: GPUPreset,
                    static_power_w: float, *, nanobatched: bool = False) -> SimulatorError:
    """The simulator's instruction time and energy (one GPU, static included) at each profile
    row's clock, against the measurement: rows and mean absolute percentage errors."""
    from kareus.backends.sim import SimulatorBackend
    from workloads.graph_builder import build_iteration_graph

    sim = SimulatorBackend(preset)
    graph = build_iteration_graph(workload)
    out = []
    for r in profile.itertuples():
        c = sim.evaluate_instruction(graph, (int(r.stage), r.instruction),
                                     InstructionPlan.make(float(r.frequency), nanobatched))
        e = measured_energy(c.dynamic_energy_j, static_power_w, c.time_s)
        out.append(InstructionComparison(
            stage=int(r.stage), instruction=r.instruction, frequency=int(r.frequency),
            time_measured=float(r.time), time_sim=c.time_s, energy_measured=float(r.energy),
            energy_sim=e, time_err_pct=float(change_pct(r.time, c.time_s)),
            energy_err_pct=float(change_pct(r.energy, e))))
    t = np.array([o.time_sim for o in out])
    tm = np.array([o.time_measured for o in out])
    es = np.array([o.energy_sim for o in out])
    em = np.array([o.energy_measured for o in out])
    return SimulatorError(preset.name, tuple(out), mape_pct(tm, t), mape_pct(em, es))


@dataclass(frozen=True)
class OpMeasurement:
    """One compute op of a partition measured alone at a clock (MHz), beside the simulator's
    time (s) and energy (J, static included) of the same op on all SMs."""

    direction: str
    partition: str
    op: str
    kind: str
    clock_mhz: float
    time_measured: float
    energy_measured: float
    time_sim: float
    energy_sim: float

    def to_dict(self) -> JsonObject:
        return record_dict(self)


def measure_ops(backend: GPUBackend, workload: Workload, clock_mhz: float,
                stage: int = 0, limit: int | None = None) -> list[OpMeasurement]:
    """Each compute op of one layer's forward and backward partitions (nanobatch 0) alone, next
    to the simulator's time and energy (static included) for the same op on all SMs; the first
    ``limit`` ops only when given."""
    from kareus.backends.sim import SimulatorBackend

    graph = backend.bind(workload)
    sim = SimulatorBackend(backend.gpu)
    rows: list[OpMeasurement] = []
    for d in ("forward", "backward"):
        parts = graph.instruction_graphs[(stage, d)].partitions
        seen: set[tuple[str, str]] = set()
        for part in parts:
            if not part.key.endswith("/0"):
                continue
            for i, op in enumerate(part.compute):
                if (part.key, op.name) in seen or (limit is not None and len(rows) >= limit):
                    continue
                seen.add((part.key, op.name))
                t, dyn = backend.measure_partition_op(part, i, clock_mhz)
                obs = snap_to_grid(observed_clock(backend, clock_mhz), backend.gpu)
                # the card ran at ``obs``: the law there, time and power alike, without a cap
                ts = sim.kernel_time(op, obs, backend.gpu.sms)
                dyn_sim = sim.kernel_dynamic_power(op, obs) * ts
                rows.append(OpMeasurement(
                    direction=d, partition=part.key, op=op.name, kind=op.kind, clock_mhz=obs,
                    time_measured=t,
                    energy_measured=measured_energy(dyn, backend.static_power_w, t),
                    time_sim=ts, energy_sim=measured_energy(dyn_sim, sim.gpu.static_power_w, ts)))
    return rows


@dataclass(frozen=True)
class PartitionComparison:
    """One partition at one (clock MHz, communication SMs, launch slot) point, measured and
    simulated: time (s) and dynamic energy per GPU (J)."""

    partition: str
    clock_mhz: float
    comm_sms: int
    slot: int
    time_measured: float
    dynamic_energy_measured: float
    time_sim: float
    dynamic_energy_sim: float

    def to_dict(self) -> JsonObject:
        return record_dict(self)


def measure_partitions(backend: GPUBackend, workload: Workload, clocks_mhz: Sequence[float],
                       comm_sms: Sequence[int], slots: Sequence[int], stage: int = 0,
                       direction: Direction = "forward") -> list[PartitionComparison]:
    """Every partition of one layer of ``(stage, direction)`` over the (clock, SMs, launch slot)
    grid, the collective waited for at the partition's end, next to the simulator's prediction
    (time, dynamic energy per GPU)."""
    from kareus.backends.sim import SimulatorBackend

    graph = backend.bind(workload)
    sim = SimulatorBackend(backend.gpu)
    rows: list[PartitionComparison] = []
    for part in graph.instruction_graphs[(stage, direction)].partitions:
        n = len(part.compute)
        ok_slots = np.array([s for s in slots if s < n] or [0])
        windows = np.stack([ok_slots, np.full(ok_slots.size, n - 1)], axis=1)
        f = np.asarray(clocks_mhz, dtype=float)
        k = np.asarray(comm_sms, dtype=np.int64)
        got = backend.evaluate_partition(part, f, k, windows)
        obs = snap_to_grid(observed_clock(backend, float(f[0])), backend.gpu) \
            if not backend.allow_clock_control else None
        # the GPU backend runs a partition's executions back to back, as an iteration does: the
        # simulator's in-iteration host share, not the partition sweep's (harness) one
        pred = sim.evaluate_partition(part, np.array([obs]) if obs else
                                      np.array([snap_to_grid(c, backend.gpu) for c in f]),
                                      k, windows)
        for fi, kk, si in np.ndindex(got.time_s.shape):
            pf = 0 if obs else fi
            rows.append(PartitionComparison(
                partition=part.key, clock_mhz=float(f[fi]), comm_sms=int(k[kk]),
                slot=int(ok_slots[si]), time_measured=float(got.time_s[fi, kk, si]),
                dynamic_energy_measured=float(got.dynamic_energy_j[fi, kk, si]),
                time_sim=float(pred.time_s[pf, kk, si]),
                dynamic_energy_sim=float(pred.dynamic_energy_j[pf, kk, si])))
    return rows


def gpu_measure(backend: GPUBackend, workload: Workload, out_dir: str | Path, *,
                clocks_mhz: Sequence[float] | None = None, nanobatched: bool = False,
                ops: bool = True, partitions: bool = False,
                partition_sms: Sequence[int] = (6, 12, 24), partition_slots: Sequence[int] = (0, 2)
                ) -> JsonObject:
    """Profile ``workload`` on the GPUs, fit the preset, report the simulator's error.

    Args:
        backend: The GPU backend (its preset is the one fitted).
        workload: What to run (a reduced layer count keeps it short).
        out_dir: Where ``profile.csv``, ``fitted_preset.json`` (with >= 4 clocks) and
            ``report.json`` go.
        clocks_mhz: Clocks to profile (MHz). Default: six clocks spread over the knob space
            with clock control, else the card's current clock only.
        nanobatched: Profile nanobatched instructions (default sequential, as Perseus does).
        ops: Also measure each compute op of one layer alone (at the highest clock).
        partitions: Also measure partition configurations (needs TP > 1 to mean anything).

    Returns the report (also written to ``report.json``).
    """
    from kareus.hardware.calibration import FITTED_FIELDS, calibrate
    from kareus.hardware.knobs import KnobSpace

    preset = backend.gpu
    out = Path(out_dir)
    if clocks_mhz is None:
        if backend.allow_clock_control:
            grid = KnobSpace.default(preset).clocks_mhz
            idx = np.unique(np.linspace(0, len(grid) - 1, 6).round().astype(int))
            clocks_mhz = [grid[i] for i in idx][::-1]
        else:
            clocks_mhz = [preset.clock_max_mhz]
    clocks_mhz = [float(c) for c in clocks_mhz]
    for c in clocks_mhz:
        if not preset.clock_min_mhz <= c <= preset.clock_max_mhz:
            raise InputError(f"clock {c} MHz outside {preset.name}'s "
                             f"{preset.clock_min_mhz:.0f}-{preset.clock_max_mhz:.0f} MHz")
    profile = measure_profile(backend, workload, clocks_mhz, nanobatched=nanobatched)
    buf = io.StringIO()
    profile.to_csv(buf, index=False)
    atomic_write_text(out / "profile.csv", buf.getvalue())
    as_given = simulator_error(profile, workload, preset, backend.static_power_w,
                               nanobatched=nanobatched)
    sim_error: JsonObject = {"preset": as_given.to_dict()}
    report: JsonObject = {
        "gpu": preset.name, "workload": workload.name, "layers": workload.model.layers,
        "parallel": asdict(workload.parallel), "backend": backend.describe(),
        "clocks_requested_mhz": clocks_mhz,
        "clocks_profiled_mhz": sorted(int(f) for f in profile.frequency.unique()),
        "profile": str(out / "profile.csv"),
        "simulator_error": sim_error,
    }
    if profile.frequency.nunique() >= 4:
        # the fitted preset feeds the simulator, which applies neither a sustained-clock ceiling
        # nor a held cap below the board limit: fit the law it can express
        res = calibrate(profile, preset, static_power_w=backend.static_power_w,
                        clock_limits=False)
        # the same fit on the preset's own simulation of these instructions maps the aggregated
        # law's power onto the simulator's parameters
        simulated = pd.DataFrame([r.to_dict() for r in as_given.rows]).rename(
            columns={"time_sim": "time", "energy_sim": "energy"})
        ref = calibrate(simulated[["stage", "instruction", "frequency", "time", "energy"]],
                        preset, static_power_w=backend.static_power_w, clock_limits=False)
        fitted = res.fitted_preset(preset, reference=ref)
        atomic_write_json(out / "fitted_preset.json", {
            "base": preset.name, "static_power_w": res.static_power_w,
            "overrides": {k: getattr(fitted, k) for k in FITTED_FIELDS},
            "fit": res.to_dict()})
        report["fit"] = {"time_mape_pct": res.time_mape_pct,
                         "energy_mape_pct": res.energy_mape_pct, **asdict(res.law),
                         "sm_dyn_power_w": fitted.sm_dyn_power_w,
                         "kept_from_preset": list(res.kept_from_preset)}
        report["fitted_preset"] = str(out / "fitted_preset.json")
        sim_error["fitted"] = simulator_error(
            profile, workload, fitted, backend.static_power_w, nanobatched=nanobatched).to_dict()
    else:
        report["fit"] = None
        report["fit_skipped"] = (f"{profile.frequency.nunique()} distinct clock(s) measured; "
                                 "fitting the clock law needs >= 4 (run with "
                                 "--allow-clock-control and several --clocks)")
    if ops and workload.parallel.nanobatches > 1:
        rows = measure_ops(backend, workload, max(clocks_mhz))
        report["ops"] = [r.to_dict() for r in rows]
        by_kind: dict[str, dict[str, float]] = {}
        for kind in sorted({r.kind for r in rows}):
            rs = [r for r in rows if r.kind == kind]
            by_kind[kind] = {
                "time_mape_pct": mape_pct([r.time_measured for r in rs],
                                          [r.time_sim for r in rs]),
                "energy_mape_pct": mape_pct([r.energy_measured for r in rs],
                                            [r.energy_sim for r in rs])}
        report["ops_error_by_kind"] = by_kind
    if partitions and workload.parallel.nanobatches > 1:
        report["partitions"] = [r.to_dict() for r in measure_partitions(
            backend, workload, [max(clocks_mhz)], partition_sms, partition_slots)]
    atomic_write_json(out / "report.json", report)
    return report
