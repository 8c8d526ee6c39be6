"""The iteration-level time–cost tradeoff, solved with ``lowtime`` exactly as Perseus does it.

Perseus (SOSP '24) and Kareus both end in the same step: every pipeline instruction type
(stage, forward/backward) has a set of execution options, each a measured (time, energy) with a
knob (a clock for Perseus; a clock plus per-partition schedules for Kareus). The procedure, as in
the ``lowtime`` reference driver for Perseus:

1. Per instruction type, wrap each option as a ``lowtime`` ``ExecutionOption`` (unit time 1 ms by
   default) and keep the Pareto-optimal ones with ``CandidateExecutionOptions`` (which also
   quantizes time and deduplicates equal quantized times). The *raw* pre-filter keeps options
   Pareto-optimal in measured energy (the Perseus artifact); the *effective* one filters after
   subtracting static energy. When three or fewer options survive, which noisy measurements
   cause, the type is filtered again from all its options with 5 % slack (lowtime's
   ``noise_factor`` 0.95: an option goes only if another beats it by more than 5 % in both time
   and energy), as the authors' driver does.
2. Map every option's cost to effective energy: ``energy - P_static · quant_time · unit_time``.
3. Fit ``lowtime``'s ``ExponentialModel`` to each type's options (its grid search over initial
   guesses, keeping the best fit, as the authors' driver does).
4. Build the synchronous 1F1B DAG of ``lowtime.perseus`` (program order within a stage, forward and
   backward dependencies between stages, a dummy source 0 and sink 1). When the executing
   backend puts an activation transfer between stages (``p2p_time_s`` > 0), every cross-stage
   edge carries it as an operation of fixed duration, so that the solver's critical path is the
   one the iteration runs; Perseus's own profiles (and ``kareus perseus``) have none.
5. Run ``PhillipsDessouky``: each step shortens the iteration by one time unit and assigns every
   instruction the slowest option that meets its new duration.

Each step is returned with its knob assignment and the solver's own time (``quant_time`` units)
and cost; the authors report exactly those (:func:`solver_energy`). Evaluating the resulting plans
(on a profile, a simulator or real GPUs) is the caller's job.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import networkx as nx

from kareus.energy import dynamic_from_measured
from kareus.errors import InputError
from kareus.graph import Direction, Instruction, dag_dependencies

Prefilter = Literal["raw", "effective"]

#: A type with this many Pareto-optimal options or fewer is filtered again with slack.
FEW_OPTIONS = 3
#: lowtime's ``noise_factor`` for that second filter (5 % slack), the authors' driver's value.
NOISE_FACTOR = 0.95


@dataclass(frozen=True)
class Option:
    """One way to execute an instruction type.

    Attributes:
        time_s: Measured time of one instruction (s).
        energy_j: Measured energy of one instruction, static included (J), for the GPUs the
            caller accounts per instruction (one GPU for a Zeus profile).
        knob: What to apply to get this option (a clock in MHz, or any hashable plan piece).
    """

    time_s: float
    energy_j: float
    knob: Hashable


@dataclass(frozen=True)
class SolverStep:
    """One Phillips–Dessouky step.

    Attributes:
        iteration: Solver iteration (1-based, as ``lowtime`` counts).
        knobs: Chosen option knob of every instruction.
        quant_time: Iteration time in time units, as the solver sees it.
        real_time_s: ``quant_time · unit_time`` (s).
        cost: Solver's total effective cost (J, from the fitted cost models).
    """

    iteration: int
    knobs: dict[Instruction, Hashable]
    quant_time: int
    real_time_s: float
    cost: float


def solve(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
          microbatches: int, static_power_w: float, *, unit_time_s: float = 1e-3,
          prefilter: Prefilter = "raw", p2p_time_s: float = 0.0) -> Iterator[SolverStep]:
    """Run the Perseus time–cost tradeoff; yield every solver step in solver order.

    Args:
        options: Execution options of each (stage, direction); every stage needs both directions.
        stages: Pipeline stages.
        microbatches: Microbatches per iteration.
        static_power_w: Static power of the GPUs one option's energy covers (W).
        unit_time_s: Time quantum (s); Perseus uses 1 ms.
        prefilter: ``"raw"`` or ``"effective"`` Pareto pre-filter (see module docstring).
        p2p_time_s: Activation transfer between adjacent stages (s), a fixed operation on every
            cross-stage edge; 0 for none.
    """
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.solver import PhillipsDessouky

    if prefilter not in ("raw", "effective"):
        raise InputError(f"unknown pre-filter {prefilter!r}; choose raw or effective")
    if not unit_time_s > 0:
        raise InputError(f"unit time must be positive, got {unit_time_s}")
    if not p2p_time_s >= 0:
        raise InputError(f"P2P time must be non-negative, got {p2p_time_s}")
    classes = {"forward": Forward, "backward": Backward}
    knob_tables: dict[tuple[int, str], list[Hashable]] = {}
    spec_map: dict[int, dict[type, OperationSpec]] = {}
    for stage in range(stages):
        spec_map[stage] = {}
        for direction, cls in classes.items():
            opts = list(options.get((stage, direction), ()))  # type: ignore[arg-type]
            if not opts:
                raise InputError(f"no execution options for stage {stage} {direction}")
            knob_tables[(stage, direction)] = [o.knob for o in opts]
            lt_opts = []
            for idx, o in enumerate(opts):
                cost = o.energy_j
                if prefilter == "effective":
                    quant = int(o.time_s // unit_time_s)
                    cost = dynamic_from_measured(o.energy_j, static_power_w, quant, unit_time_s)
                lt_opts.append(ExecutionOption[int](real_time=o.time_s, unit_time=unit_time_s,
                                                    cost=cost, knob=idx))
            cand = CandidateExecutionOptions[int](options=lt_opts)
            if len(cand.options) <= FEW_OPTIONS:
                cand = CandidateExecutionOptions[int](options=lt_opts, noise_factor=NOISE_FACTOR)
            if prefilter == "raw":
                for opt in cand.options:
                    opt.cost = dynamic_from_measured(opt.cost, static_power_w, opt.quant_time,
                                                     opt.unit_time)
            spec_map[stage][cls] = OperationSpec[int](options=cand,
                                                      cost_model=fit_exponential_model(cand))

    dag, nodes = build_1f1b_dag(spec_map, stages, microbatches)
    if p2p_time_s > 0:
        _add_transfers(dag, nodes, p2p_time_s, unit_time_s)
    solver = PhillipsDessouky(dag)
    quiet = logging.getLogger("lowtime")
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        for result in solver.run():
            knobs = {ins: knob_tables[(ins.stage, ins.direction)][lt.assigned_knob]  # type: ignore[attr-defined]
                     for ins, lt in nodes}
            yield SolverStep(iteration=result.iteration, knobs=knobs,
                             quant_time=int(result.quant_time),
                             real_time_s=float(result.real_time), cost=float(result.cost))
    finally:
        quiet.setLevel(level)


def solver_energy(step: SolverStep, stages: int, static_power_w: float) -> float:
    """The energy the authors' driver reports for a solver step (J): the solver's cost (fitted
    effective energies) plus every stage's GPU at static power for the solver's time."""
    return step.cost + stages * step.real_time_s * static_power_w


def fit_exponential_model(cand: object) -> object:
    """``lowtime``'s ``ExponentialModel`` (``a·exp(b·t) + c``) for candidate options.

    First exactly as the reference driver does (lowtime's own grid search over initial guesses,
    the best fit kept).
    lowtime rejects fits whose parameter covariance is infinite, which happens when three or
    fewer options are fitted exactly, and its grid assumes costs of tens to thousands of J. Then
    the same model is fitted here: ``c`` just below the least cost and ``a``, ``b`` from a line
    through ``log(cost - c)``, refined by least squares; with two options, a near-flat exponential
    through both; with one, a constant.
    """
    import numpy as np
    from lowtime.cost_model import ExponentialModel
    from scipy.optimize import curve_fit

    try:
        with warnings.catch_warnings():  # lowtime's grid search warns for every rejected guess
            warnings.simplefilter("ignore")
            return ExponentialModel(cand, search_strategy="best")  # type: ignore[arg-type]
    except (ValueError, RuntimeError, TypeError):  # TypeError: fewer points than parameters
        pass
    t = np.array([o.quant_time for o in cand.options], dtype=float)  # type: ignore[attr-defined]
    e = np.array([o.cost for o in cand.options], dtype=float)  # type: ignore[attr-defined]
    fn = lambda x, a, b, c: a * np.exp(b * x) + c  # noqa: E731 - lowtime's own form
    if len(t) == 1:
        coef = (0.0, 0.0, float(e[0]))
    elif len(t) == 2:
        b = -1e-3
        a = (e[0] - e[1]) / (np.exp(b * t[0]) - np.exp(b * t[1]))
        coef = (float(a), b, float(e[0] - a * np.exp(b * t[0])))
    else:
        c0 = e.min() - 0.05 * (np.ptp(e) + 1e-9)
        slope, intercept = np.polyfit(t, np.log(e - c0), 1)
        guess = (float(np.exp(intercept)), float(slope), float(c0))
        try:
            with warnings.catch_warnings():  # an exact fit has no covariance estimate
                warnings.simplefilter("ignore")
                coef = tuple(float(v) for v in curve_fit(fn, t, e, p0=guess, maxfev=50000)[0])
        except (ValueError, RuntimeError) as err:
            raise InputError(f"could not fit the exponential cost model to options at quantized "
                             f"times {t.astype(int).tolist()}: {err}") from None
    return _exponential(coef)


def _exponential(coefficients: tuple[float, float, float]) -> object:
    """lowtime's exponential cost model with given coefficients, through its public base."""
    import numpy as np
    from lowtime.cost_model import CostModel

    class FixedExponential(CostModel):
        """``a·exp(b·t) + c`` (J) at quantized time ``t``, coefficients fitted here."""

        def __init__(self) -> None:
            self.coefficients = coefficients

        def __call__(self, quant_time: int) -> float:
            a, b, c = self.coefficients
            return float(a * np.exp(b * quant_time) + c)

    return FixedExponential()


def build_1f1b_dag(spec_map: Mapping[int, Mapping[type, object]], stages: int, microbatches: int
                   ) -> tuple[nx.DiGraph, list[tuple[Instruction, object]]]:
    """The activity-on-node 1F1B DAG of ``lowtime.perseus`` as the reference driver builds it:
    ``Synchronous1F1B`` instructions per stage (nodes 2, 3, ...), dummy source 0 and sink 1.

    The edges are the suite's one 1F1B dependency definition
    (:func:`kareus.graph.dag_dependencies`: program order within a stage, forward/backward
    dependencies between stages), added in the order the reference driver adds them (program
    order stage by stage, then the cross-stage edges by node id), so lowtime visits the graph as
    it does there; ``tests/test_perseus.py`` checks them against lowtime's own resolver.

    ``spec_map[stage]`` maps lowtime's ``Forward`` / ``Backward`` classes to operation specs.
    Returns the DAG and, in 1F1B order per stage, (our instruction, lowtime's instruction).
    """
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.perseus.instruction import Forward
    from lowtime.perseus.schedule import Synchronous1F1B

    dag = nx.DiGraph()
    node_id = 2  # 0 and 1 are the dummy source and sink, as in the reference driver
    nodes: list[tuple[Instruction, object]] = []
    ids: dict[Instruction, int] = {}
    for stage in range(stages):
        for inst in Synchronous1F1B(num_stages=stages, num_micro_batches=microbatches,
                                     stage_id=stage, operation_spec_map=spec_map[stage]):  # type: ignore[arg-type]
            dag.add_node(node_id, op=inst)
            direction: Direction = "forward" if isinstance(inst, Forward) else "backward"
            ins = Instruction(stage, inst.micro_batch_id, direction)
            nodes.append((ins, inst))
            ids[ins] = node_id
            node_id += 1
    deps = dag_dependencies(stages, microbatches)
    edges = sorted((ids[p], ids[ins]) for ins, preds in deps.items() for p in preds)
    same_stage = {(ids[p], ids[ins]) for ins, preds in deps.items() for p in preds
                  if p.stage == ins.stage}
    dag.add_edges_from(e for e in edges if e in same_stage)
    dag.add_edges_from(e for e in edges if e not in same_stage)
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"] = 0
    dag.graph["sink_node"] = 1

    return dag, nodes


def _fixed_operation(time_s: float, unit_time_s: float) -> object:
    """A lowtime operation that always takes ``time_s`` and costs nothing the solver can save."""
    from lowtime.cost_model import CostModel
    from lowtime.operation import (
        CandidateExecutionOptions,
        ExecutionOption,
        Operation,
        OperationSpec,
    )

    class ZeroCost(CostModel):
        """A fixed operation's cost: nothing to trade (J)."""

        def __call__(self, quant_time: int) -> float:
            return 0.0

    cand = CandidateExecutionOptions[None](options=[ExecutionOption[None](
        real_time=time_s, unit_time=unit_time_s, cost=0.0, knob=None)])
    return Operation[None](spec=OperationSpec[None](options=cand, cost_model=ZeroCost()))


def _add_transfers(dag: nx.DiGraph, nodes: Sequence[tuple[Instruction, object]], time_s: float,
                   unit_time_s: float) -> None:
    """Put a fixed transfer of ``time_s`` on every edge between instructions of two stages."""
    stage_of = {id(lt): ins.stage for ins, lt in nodes}
    node_stage = {n: stage_of.get(id(d.get("op"))) for n, d in dag.nodes(data=True)}
    cross = [(u, v) for u, v in dag.edges if node_stage[u] is not None
             and node_stage[v] is not None and node_stage[u] != node_stage[v]]
    next_id = max(dag.nodes) + 1
    for u, v in cross:
        dag.remove_edge(u, v)
        dag.add_node(next_id, op=_fixed_operation(time_s, unit_time_s))
        dag.add_edge(u, next_id)
        dag.add_edge(next_id, v)
        next_id += 1


def lowtime_dag_shape(stages: int, microbatches: int) -> tuple[int, int]:
    """(nodes, edges) of the 1F1B DAG ``solve`` hands to lowtime, dummy source/sink included.

    Program order gives ``S·(2M − 1)`` edges, forward and backward dependencies ``2·(S − 1)·M``,
    and the source/sink connect to the instructions without predecessors / successors.
    """
    instructions = 2 * stages * microbatches
    program = stages * (2 * microbatches - 1)
    cross = 2 * (stages - 1) * microbatches
    return instructions + 2, program + cross + 2  # only F(0,0) starts and B(0,M-1) ends


def evaluate_on_options(step: SolverStep, options: Mapping[tuple[int, Direction], Sequence[Option]],
                        stages: int, microbatches: int, static_power_w: float
                        ) -> tuple[float, float]:
    """(time s, energy J) of a solver step replayed on measured options (a profile): instruction
    times from the chosen options on the 1F1B DAG, energy = their dynamic energies plus every
    GPU's static power for the whole iteration (one GPU per stage, as a profile describes)."""
    from kareus.energy import iteration_energy
    from kareus.graph import schedule_times

    by_knob = {key: {o.knob: o for o in opts} for key, opts in options.items()}
    durations: dict[Instruction, float] = {}
    dynamic = 0.0
    for ins, knob in step.knobs.items():
        opt = by_knob[(ins.stage, ins.direction)][knob]
        durations[ins] = opt.time_s
        dynamic += dynamic_from_measured(opt.energy_j, static_power_w, opt.time_s)
    times = schedule_times(stages, microbatches, durations)
    t = max(end for _, end in times.values())
    return t, iteration_energy(dynamic, stages, static_power_w, t).total_j


def plans_from_steps(steps: Sequence[SolverStep], make_plan: Callable[[Hashable], object],
                     label: str) -> list:
    """One :class:`~kareus.plan.IterationPlan` per solver step (``make_plan(knob)`` gives each
    instruction's plan)."""
    from kareus.plan import IterationPlan

    cache: dict[Hashable, object] = {}
    plans = []
    for step in steps:
        instr = {}
        for ins, knob in step.knobs.items():
            if knob not in cache:
                cache[knob] = make_plan(knob)
            instr[ins] = cache[knob]
        plans.append(IterationPlan(instr, label=f"{label} step {step.iteration}",  # type: ignore[arg-type]
                                   meta={"solver_iteration": step.iteration,
                                         "solver_time_s": step.real_time_s}))
    return plans
