"""An exact reference for the iteration-level problem on small instances (MILP, HiGHS).

Given execution options per instruction type, choose one option for *every* instruction of the
1F1B DAG (not per type) so that the iteration finishes within a deadline ``T`` and the energy

    sum of the chosen options' dynamic energies + S · P_static · makespan

is minimal (one GPU per stage, as in a profile). Variables: ``x[i, o]`` binary (instruction ``i``
runs option ``o``), start times ``s[i] >= 0`` and the makespan ``C``; constraints: one option per
instruction, ``s[b] >= s[a] + d[a]`` for every DAG edge, ``C >= s[i] + d[i]``, ``C <= T``. Solved
with ``scipy.optimize.milp`` (HiGHS). This measures how far the lowtime frontier is from optimal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from kareus.energy import dynamic_from_measured, iteration_energy, static_energy
from kareus.errors import InputError, SolverTimeout
from kareus.graph import (
    Direction,
    Instruction,
    dag_dependencies,
    schedule_times,
    topological_order,
)
from kareus.methods.tradeoff import Option


@dataclass(frozen=True)
class ExactSolution:
    """Optimal assignment within a deadline.

    Attributes:
        deadline_s: The deadline (s).
        time_s: Makespan of the optimum (s), ``<= deadline_s``: its choice on the 1F1B
            schedule (:func:`kareus.graph.schedule_times`).
        energy_j: Its energy (J), static included for the stages' GPUs.
        choice: Option index chosen for every instruction.
    """

    deadline_s: float
    time_s: float
    energy_j: float
    choice: dict[Instruction, int]


def reference_options(options: Mapping[tuple[int, Direction], Sequence[Option]], per_type: int
                      ) -> dict[tuple[int, Direction], list[Option]]:
    """A small instance's options: each instruction type's Pareto-optimal ones (time s, energy
    J), at most ``per_type`` of them spread evenly over their times. A dominated option is never
    worth choosing, so keeping one would make the instance easier than it looks."""
    from kareus.frontier import pareto_indices, spread_indices

    out = {}
    for key, opts in options.items():
        front = [opts[i] for i in pareto_indices([o.time_s for o in opts],  # by time
                                                 [o.energy_j for o in opts])]
        out[key] = [front[i] for i in spread_indices([o.time_s for o in front], per_type)]
    return out


def min_energy_within(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                      microbatches: int, static_power_w: float, deadline_s: float,
                      time_limit_s: float = 60.0) -> ExactSolution | None:
    """The minimum-energy assignment finishing within ``deadline_s``; ``None`` if infeasible.
    Raises :class:`~kareus.errors.SolverTimeout` when HiGHS stops at ``time_limit_s`` (s)
    before proving its best assignment optimal: a reference must be the optimum."""
    order = topological_order(stages, microbatches)
    deps = dag_dependencies(stages, microbatches)
    col: dict[tuple[Instruction, int], int] = {}
    durations, dyn = [], []
    for ins in order:
        opts = options.get(ins.type_key)
        if not opts:
            raise InputError(f"no options for {ins.type_key}")
        for o_idx, opt in enumerate(opts):
            col[(ins, o_idx)] = len(durations)
            durations.append(opt.time_s)
            dyn.append(dynamic_from_measured(opt.energy_j, static_power_w, opt.time_s))
    n_x = len(durations)
    pos = {ins: n_x + k for k, ins in enumerate(order)}
    c_idx = n_x + len(order)
    n = c_idx + 1
    d = np.asarray(durations)
    cost = np.zeros(n)
    cost[:n_x] = dyn
    cost[c_idx] = static_energy(stages, static_power_w, 1.0)  # per second of C

    rows: list[tuple[dict[int, float], float, float]] = []
    for ins in order:  # exactly one option each
        rows.append(({col[(ins, o)]: 1.0 for o in range(len(options[ins.type_key]))}, 1.0, 1.0))
    for ins in order:
        mine = {col[(ins, o)]: d[col[(ins, o)]] for o in range(len(options[ins.type_key]))}
        for pred in deps[ins]:  # s[ins] - s[pred] - d[pred] >= 0
            coeffs = {pos[ins]: 1.0, pos[pred]: -1.0}
            for o in range(len(options[pred.type_key])):
                coeffs[col[(pred, o)]] = -d[col[(pred, o)]]
            rows.append((coeffs, 0.0, np.inf))
        # C - s[ins] - d[ins] >= 0
        rows.append(({c_idx: 1.0, pos[ins]: -1.0, **{k: -v for k, v in mine.items()}},
                     0.0, np.inf))
    a = lil_matrix((len(rows), n))
    lo, hi = np.empty(len(rows)), np.empty(len(rows))
    for r, (coeffs, l, h) in enumerate(rows):
        for j, v in coeffs.items():
            a[r, j] = v
        lo[r], hi[r] = l, h
    integrality = np.zeros(n)
    integrality[:n_x] = 1
    ub = np.full(n, np.inf)
    ub[:n_x] = 1.0
    ub[c_idx] = deadline_s
    res = milp(cost, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(n), ub),
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-7})
    if res.status == 1:  # a time or node limit: whatever it holds is not proven optimal
        raise SolverTimeout(f"the exact solve of {stages} stages x {microbatches} microbatches "
                            f"stopped at its {time_limit_s:g} s limit before proving optimality")
    if res.x is None:
        return None
    x = res.x
    choice = {}
    for ins in order:
        k = len(options[ins.type_key])
        choice[ins] = int(np.argmax([x[col[(ins, o)]] for o in range(k)]))
    total_dyn = sum(dyn[col[(ins, o)]] for ins, o in choice.items())
    # the chosen options' own schedule: C is only bounded by it (and free without static power)
    times = schedule_times(stages, microbatches,
                           {ins: options[ins.type_key][o].time_s for ins, o in choice.items()})
    makespan = max(end for _, end in times.values())
    return ExactSolution(deadline_s=deadline_s, time_s=makespan,
                         energy_j=iteration_energy(total_dyn, stages, static_power_w,
                                                   makespan).total_j,
                         choice=choice)
