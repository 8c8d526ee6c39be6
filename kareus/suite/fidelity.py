"""The simulator held against measured iteration frontiers (the Kareus artifact's).

The artifact's frontiers (``shared/kareus_artifact/calibration_frontiers.csv``) are Perseus's own
view of each plan: its solver ran on per-instruction time/energy profiles measured in situ, and
each frontier point is a solver step's iteration time (the critical path of the instruction
times on the 1F1B DAG; point-to-point transfers are outside the instructions) and energy (the
fitted per-instruction costs plus every stage's GPU at the blocked-on-P2P power for the whole
iteration), for one GPU per stage.

:func:`artifact_frontier` builds the same view from the simulator: it profiles every instruction
type on the simulator over the clock grid (sequential for Perseus, nanobatched with the library's
default schedules for Nanobatching + Perseus), runs the same solver, and reads each step the same
way. :func:`endpoints` reduces a frontier to the four numbers compared: the fastest time, the
energy there, the least energy and the time there; :func:`method_comparison` compares the two
methods by the suite's iso metrics, on the measured frontiers and on the simulated ones, and
:func:`nanobatch_dynamic_change` by the energy above the blocking power at both ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from kareus.energy import static_energy
from kareus.errors import InputError
from kareus.frontier import (change_pct, fastest, iso_energy_time_reduction,
                             iso_time_energy_reduction, least_energy)
from kareus.methods.profiling import profile_instructions
from kareus.methods.tradeoff import PERSEUS_UNIT_S, solve, solver_energy
from kareus.plan import InstructionPlan
from kareus.plugins import Problem

#: The two methods the artifact's frontiers cover, and whether each runs nanobatched.
METHODS = {"perseus": False, "nanobatch-perseus": True}
ENDPOINTS = ("T_min", "E_at_T_min", "E_min", "T_at_E_min")


@dataclass(frozen=True)
class FrontierConfig:
    """One measured configuration of the artifact (PP, microbatches and split as the paper)."""

    model: str
    tp: int
    cp: int
    mbs: int
    seq: int

    @property
    def label(self) -> str:
        par = f"cp{self.cp}tp{self.tp}" if self.cp > 1 else f"tp{self.tp}"
        return f"{self.model}_{par}_mbs{self.mbs}_seq{self.seq}"

    #: Pipeline stages of every configuration (the paper's testbed).
    pp: ClassVar[int] = 2

    def overrides(self) -> dict[str, object]:
        """Parallelism overrides: the paper's testbed, PP 2 x 8 microbatches, 15 + 13 layers."""
        return dict(tp=self.tp, cp=self.cp, pp=self.pp, mbs=self.mbs, seq=self.seq,
                    microbatches=8, layer_split=(15, 13))


#: (configuration, method) -> (time s, energy J) of its frontier.
Frontiers = dict[tuple[FrontierConfig, str], tuple[np.ndarray, np.ndarray]]


def endpoints(time_s: ArrayLike, energy_j: ArrayLike) -> dict[str, float]:
    """The fastest point's time and energy, and the least-energy point's energy and time."""
    t, e = np.asarray(time_s, dtype=float), np.asarray(energy_j, dtype=float)
    if t.size == 0:
        raise InputError("an empty frontier has no endpoints")
    i, j = fastest(t, e), least_energy(t, e)
    return {"T_min": float(t[i]), "E_at_T_min": float(e[i]), "E_min": float(e[j]),
            "T_at_E_min": float(t[j])}


def artifact_frontier(problem: Problem, nanobatched: bool, unit_s: float = PERSEUS_UNIT_S
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(time s, energy J per GPU of each stage) of every Perseus solver step, on a ``unit_s``
    time unit (s), on the simulator's in-situ profiles of ``problem`` (see the module docstring)."""
    options = profile_instructions(problem.backend, problem.graph, problem.knobs.clocks_mhz,
                                   lambda c: InstructionPlan.make(float(c), nanobatched))
    g = problem.graph
    steps = list(solve(options, g.stages, g.microbatches, problem.gpu.static_power_w,
                       unit_time_s=unit_s))
    return (np.array([s.real_time_s for s in steps]),
            np.array([solver_energy(s, g.stages, problem.gpu.static_power_w) for s in steps]))


def load_measured(path: str) -> pd.DataFrame:
    """The artifact's frontier CSV (``method, model, tp, cp, pp, mbs, seq, microbatches,
    solver_iteration, energy_j, energy_above_blocking_j, iteration_time_s``)."""
    df = pd.read_csv(path)
    need = {"method", "model", "tp", "cp", "mbs", "seq", "energy_j", "iteration_time_s"}
    if need - set(df.columns):
        raise InputError(f"{path}: missing column(s) {', '.join(sorted(need - set(df.columns)))}")
    return df


def measured_configs(df: pd.DataFrame) -> list[FrontierConfig]:
    """The configurations a measured frontier file covers, in file order."""
    seen: dict[tuple, None] = {}
    for r in df.itertuples():
        seen[(r.model, int(r.tp), int(r.cp), int(r.mbs), int(r.seq))] = None
    return [FrontierConfig(*k) for k in seen]


def measured_frontier(df: pd.DataFrame, cfg: FrontierConfig, method: str
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(time s, energy J) of one measured frontier."""
    m = df[(df.method == method) & (df.model == cfg.model) & (df.tp == cfg.tp)
           & (df.cp == cfg.cp) & (df.mbs == cfg.mbs) & (df.seq == cfg.seq)]
    if m.empty:
        raise InputError(f"no measured {method} frontier for {cfg.label}")
    return m.iteration_time_s.to_numpy(float), m.energy_j.to_numpy(float)


def measured_endpoints(df: pd.DataFrame, cfg: FrontierConfig, method: str) -> dict[str, float]:
    """Endpoints of one measured frontier."""
    return endpoints(*measured_frontier(df, cfg, method))


def _method_pairs(cfg: FrontierConfig, measured: pd.DataFrame, frontiers: Frontiers
                  ) -> tuple[tuple[str, tuple[np.ndarray, np.ndarray],
                                   tuple[np.ndarray, np.ndarray]], ...]:
    """(source, Perseus frontier, Nanobatching + Perseus frontier) of ``cfg``, measured and
    simulated."""
    return (("measured", measured_frontier(measured, cfg, "perseus"),
             measured_frontier(measured, cfg, "nanobatch-perseus")),
            ("simulated", frontiers[(cfg, "perseus")], frontiers[(cfg, "nanobatch-perseus")]))


def method_comparison(configs: list[FrontierConfig], measured: pd.DataFrame,
                      frontiers: Frontiers) -> pd.DataFrame:
    """Nanobatching + Perseus against Perseus by the suite's iso metrics, measured and simulated:
    one row per configuration with the iso-time energy reduction and the iso-energy time
    reduction (%, positive when nanobatching is better; NaN where it never reaches Perseus's
    fastest time or least energy). ``frontiers``: :func:`simulated_frontiers` of ``configs``."""
    rows = []
    for cfg in configs:
        row: dict[str, object] = {"config": cfg.label}
        for source, ref, new in _method_pairs(cfg, measured, frontiers):
            it = iso_time_energy_reduction(*ref, *new)
            ie = iso_energy_time_reduction(*ref, *new)
            row[f"iso_time_energy_{source}_pct"] = np.nan if it is None else it
            row[f"iso_energy_time_{source}_pct"] = np.nan if ie is None else ie
        rows.append(row)
    return pd.DataFrame(rows)


def nanobatch_dynamic_change(configs: list[FrontierConfig], measured: pd.DataFrame,
                             frontiers: Frontiers, static_power_w: float) -> pd.DataFrame:
    """How nanobatching changes the energy above the blocked-on-P2P power (the artifact view's
    dynamic part: ``E - stages · P_s · T``), measured and simulated: one row per configuration
    with the change (%) of Nanobatching + Perseus against Perseus at each frontier's fastest
    point and at its least-energy point. ``frontiers``: :func:`simulated_frontiers` of
    ``configs``; ``static_power_w``: the blocking power (W) the frontiers were built with."""
    def dynamic(front: tuple[np.ndarray, np.ndarray], stages: int) -> tuple[float, float]:
        ends = endpoints(*front)
        return (ends["E_at_T_min"] - static_energy(stages, static_power_w, ends["T_min"]),
                ends["E_min"] - static_energy(stages, static_power_w, ends["T_at_E_min"]))

    rows = []
    for cfg in configs:
        stages = cfg.pp
        row: dict[str, object] = {"config": cfg.label}
        for source, ref, new in _method_pairs(cfg, measured, frontiers):
            (p_fast, p_frugal), (n_fast, n_frugal) = dynamic(ref, stages), dynamic(new, stages)
            row[f"at_T_min_{source}_pct"] = change_pct(p_fast, n_fast)
            row[f"at_E_min_{source}_pct"] = change_pct(p_frugal, n_frugal)
        rows.append(row)
    return pd.DataFrame(rows)


def simulated_frontiers(problems: dict[FrontierConfig, Problem]) -> Frontiers:
    """The artifact-view frontier (time s, energy J) of each configuration and method."""
    return {(cfg, method): artifact_frontier(problem, nb)
            for cfg, problem in problems.items() for method, nb in METHODS.items()}


def compare(problems: dict[FrontierConfig, Problem], measured: pd.DataFrame,
            frontiers: Frontiers | None = None) -> pd.DataFrame:
    """One row per (configuration, method, endpoint): measured, simulated, error (%).
    ``frontiers``: the :func:`simulated_frontiers` of ``problems``, if already built."""
    sims = frontiers if frontiers is not None else simulated_frontiers(problems)
    rows = []
    for cfg in problems:
        for method in METHODS:
            sim = endpoints(*sims[(cfg, method)])
            meas = measured_endpoints(measured, cfg, method)
            for k in ENDPOINTS:
                rows.append({"config": cfg.label, "method": method, "endpoint": k,
                             "measured": meas[k], "simulated": sim[k],
                             "error_pct": change_pct(meas[k], sim[k])})
    return pd.DataFrame(rows)
