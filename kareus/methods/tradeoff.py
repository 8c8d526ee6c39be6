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
   backend puts an activation transfer between stages (``p2p_time_s`` > 0: one time for every
   boundary, or one per boundary), every cross-stage edge carries its boundary's as an operation
   of fixed duration, and so does every edge from an instruction that sends to its stage's next
   one (the send holds its sender: :func:`kareus.graph.dependency_delay`), so that the solver's
   critical path is the one the iteration runs;
   Perseus's own profiles (and ``kareus perseus``) have none. A stage whose first forward
   waits for work outside the instruction times (``first_forward_wait_s``: the parameter
   all-gather of Megatron-LM's ``--overlap-param-gather``) gets that wait as a fixed operation
   before its first forward.
5. Run ``PhillipsDessouky``: each step shortens the iteration by one time unit and assigns every
   instruction the slowest option that meets its new duration.

Each step is returned with its knob assignment and the solver's own time (``quant_time`` units)
and cost; the authors report exactly those (:func:`solver_energy`). Evaluating the resulting plans
(on a profile, a simulator or real GPUs) is the caller's job.

For large jobs ``solve(..., fast=True)`` folds a long pipeline's steady state into one block
per stage (:func:`folded_microbatches`) and uses exact integer minimum cuts
(:mod:`kareus.methods.phillips_dessouky`); :func:`~kareus.methods.solver_units.time_unit`
bounds the number of steps, :func:`~kareus.methods.solver_units.plan_budget` the plans kept.
Beside this module: the cost model (:mod:`kareus.methods.cost_models`), the unit and plan
budgets (:mod:`kareus.methods.solver_units`), and plans replayed on measured options and
re-chosen within their slack (:mod:`kareus.methods.slack`; Kareus uses the reclaimer by
default, the baselines keep Perseus's procedure unless ``--set reclaim=true``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeGuard, get_args

import networkx as nx

from kareus.energy import dynamic_from_measured, static_energy
from kareus.errors import InputError
from kareus.frontier import even_indices, pareto_indices
from kareus.graph import (Direction, Instruction, boundary_delays, dag_dependencies,
                          dependency_delay, one_f_one_b, sender_hold)
from kareus.methods.cost_models import fit_exponential_model

if TYPE_CHECKING:
    from lowtime.cost_model import CostModel
    from lowtime.operation import OperationSpec
    from lowtime.perseus.instruction import Instruction as LowtimeInstruction

    from kareus.plan import InstructionPlan, IterationPlan

    #: Operation specs of one stage by lowtime instruction class (``Forward``, ``Backward``).
    StageSpecs = dict[type[LowtimeInstruction], OperationSpec[int]]

Prefilter = Literal["raw", "effective"]
#: Perseus's time unit (s): its driver quantizes every instruction's time in 1 ms steps.
PERSEUS_UNIT_S = 1e-3


def is_prefilter(value: object) -> TypeGuard[Prefilter]:
    """Whether ``value`` names a pre-filter (:data:`Prefilter`)."""
    return value in get_args(Prefilter)

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
class StepLayout:
    """Every instruction of the iteration and where in a step's knobs its own is.

    Attributes:
        instructions: All ``2·S·M`` instructions of the iteration.
        source: For each, the index in :attr:`SolverStep.assigned` of the knob it takes (its
            own instruction's when the solve was not folded; a steady block's for the pairs one
            stands for: :func:`folded_source`).
    """

    instructions: tuple[Instruction, ...]
    source: tuple[int, ...]


@dataclass(frozen=True)
class SolverStep:
    """One Phillips–Dessouky step.

    Attributes:
        iteration: Solver iteration (1-based, as ``lowtime`` counts).
        quant_time: Iteration time in time units, as the solver sees it (when the solve was
            folded, of the folded DAG with its steady blocks, which stand for the rest of the
            iteration: :func:`folded_microbatches`).
        real_time_s: ``quant_time · unit_time`` (s).
        cost: Solver's total effective cost (J, from the fitted cost models).
        layout: Where every instruction's knob comes from in ``assigned`` (shared by steps).
        assigned: Chosen option knob of every instruction of the solved DAG, then, when the
            solve was folded, each stage's steady block's forward and backward knobs.
    """

    iteration: int
    quant_time: int
    real_time_s: float
    cost: float
    layout: StepLayout = field(repr=False)
    assigned: tuple[Hashable, ...] = field(repr=False)

    @property
    def knobs(self) -> dict[Instruction, Hashable]:
        """Chosen option knob of every instruction of the iteration."""
        a = self.assigned
        return {ins: a[k] for ins, k in zip(self.layout.instructions, self.layout.source)}


#: Microbatches up to which even the fast solver solves the whole DAG (folded_microbatches).
FOLD_MIN_MICROBATCHES = 32


def folded_microbatches(stages: int, microbatches: int) -> int:
    """Microbatches of the DAG the fast solver solves: ``max(2·S + 2, FOLD_MIN_MICROBATCHES)``,
    or all of them when there are not more.

    In synchronous 1F1B every stage ``s`` runs ``w = S − s − 1`` warm-up forwards, then pairs
    (the forward of microbatch ``w + i``, the backward of ``i``), then its drain. An iteration of
    ``M`` microbatches has ``M − F`` more pairs per stage than one of ``F``, and they repeat one
    period. The fast solver solves the ``F``-microbatch DAG with, on every stage, one *steady
    block* standing for those ``K = M − F`` pairs between its pairs :func:`steady_cut` and the
    next (:func:`folded_source`): an operation whose options are ``K`` times each (forward,
    backward) option pair's time and cost, followed by ``K`` times the pair's sends. A path
    through a block is then as long as the whole iteration's path through those pairs, so the
    block's stage can be no slower per period than the one that sets the iteration's period: a
    stage left slower there only because the short DAG's warm-up and drain had slack to spare
    would repeat that excess ``K`` times. Exact when the block runs the options of the pairs
    around it; otherwise the first forward after a stage's block, which waits for the last
    forward inside the previous stage's block (a backward follows it there), keeps only its
    edge from the pair before that block: off by up to about one instruction per boundary,
    whatever ``K``. The solver's work per step falls with the DAG, and
    its number of steps with the time unit; the plans are evaluated on the full iteration.
    """
    return min(microbatches, max(2 * stages + 2, FOLD_MIN_MICROBATCHES))


def steady_cut(stages: int, solved: int) -> int:
    """The pair (0-based, after each stage's warm-up) of the ``solved``-microbatch DAG after
    which every stage's steady block sits (:func:`folded_microbatches`): the middle of the pairs
    every stage has. The same on every stage, so that no path of the DAG runs through two
    blocks: a cut at pair ``c`` on every stage is closed under the 1F1B dependencies (a
    forward's input comes from the stage before at one pair earlier, a backward's from the
    stage after at the same pair)."""
    return (solved - stages) // 2


def folded_source(ins: Instruction, stages: int, microbatches: int, solved: int
                  ) -> Instruction | None:
    """The instruction of the ``solved``-microbatch DAG whose option ``ins`` (of the
    ``microbatches`` iteration) takes, or ``None`` for one of the repeated pairs its stage's
    steady block stands for (:func:`folded_microbatches`): pairs up to :func:`steady_cut` and
    every warm-up forward are themselves, the next ``microbatches − solved`` pairs are the
    block's, and the rest (the drain included) are the solved DAG's pairs as many microbatches
    earlier."""
    extra = microbatches - solved
    if extra <= 0:
        return ins
    cut = steady_cut(stages, solved)
    pair = (ins.microbatch - (stages - ins.stage - 1) if ins.direction == "forward"
            else ins.microbatch)
    if pair <= cut:
        return ins
    if pair <= cut + extra:
        return None
    return Instruction(ins.stage, ins.microbatch - extra, ins.direction)


def solve(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
          microbatches: int, static_power_w: float, *, unit_time_s: float = PERSEUS_UNIT_S,
          prefilter: Prefilter = "raw", p2p_time_s: float | Sequence[float] = 0.0,
          first_forward_wait_s: Sequence[float] | None = None,
          fast: bool = False) -> Iterator[SolverStep]:
    """Run the Perseus time–cost tradeoff; yield every solver step in solver order (when no
    operation can be sped up, lowtime has no step: its starting point is then the one step,
    ``iteration`` 0).

    Args:
        options: Execution options of each (stage, direction); every stage needs both directions.
        stages: Pipeline stages.
        microbatches: Microbatches per iteration.
        static_power_w: Static power of the GPUs one option's energy covers (W).
        unit_time_s: Time quantum (s); Perseus uses 1 ms.
        prefilter: ``"raw"`` or ``"effective"`` Pareto pre-filter (see module docstring).
        p2p_time_s: Activation transfer between adjacent stages (s), a fixed operation on every
            cross-stage edge and on every edge from a sending instruction to its stage's next
            (:func:`kareus.graph.dependency_delay`): one time for every boundary, or one per
            boundary (``b``: between stages ``b`` and ``b + 1``); 0 for none.
        first_forward_wait_s: Per stage, a fixed wait (s) between its first forward's input
            arriving and the forward starting (:func:`stage_waits`); ``None`` for none.
        fast: Solve the DAG of :func:`folded_microbatches` with one steady block per stage
            standing for the pairs it leaves out, with OR-tools' minimum cuts
            (:class:`~kareus.methods.phillips_dessouky.IncrementalPhillipsDessouky`); ``False``
            solves the whole DAG and reproduces lowtime's steps exactly, as Perseus does.
    """
    from lowtime.perseus.instruction import Backward, Forward

    from kareus.methods.phillips_dessouky import IncrementalPhillipsDessouky

    if not is_prefilter(prefilter):
        raise InputError(f"unknown pre-filter {prefilter!r}; choose "
                         f"{' or '.join(get_args(Prefilter))}")
    if not unit_time_s > 0:
        raise InputError(f"unit time must be positive, got {unit_time_s}")
    try:
        delays = boundary_delays(stages, p2p_time_s)
    except ValueError as e:
        raise InputError(str(e)) from None
    if not all(d >= 0 for d in delays):
        raise InputError(f"P2P time must be non-negative, got {p2p_time_s}")
    waits = stage_waits(stages, first_forward_wait_s)
    classes: dict[Direction, type[LowtimeInstruction]] = {"forward": Forward,
                                                          "backward": Backward}
    knob_tables: dict[tuple[int, Direction], list[Hashable]] = {}
    spec_map: dict[int, StageSpecs] = {}
    # stages of identical layers have identical options: each distinct set is fitted once
    models: dict[tuple[tuple[int, float], ...], CostModel] = {}
    for stage in range(stages):
        spec_map[stage] = {}
        for direction, cls in classes.items():
            opts = list(options.get((stage, direction), ()))
            if not opts:
                raise InputError(f"no execution options for stage {stage} {direction}")
            knob_tables[(stage, direction)] = [o.knob for o in opts]
            spec_map[stage][cls] = _operation_spec(
                [(o.time_s, o.energy_j) for o in opts], unit_time_s, prefilter,
                static_power_w, models)

    solved = folded_microbatches(stages, microbatches) if fast else microbatches
    dag, nodes = build_1f1b_dag(spec_map, stages, solved)
    blocks = _add_steady_blocks(dag, nodes, options, stages, microbatches - solved, delays,
                                unit_time_s, prefilter, static_power_w, models)
    layout = _layout(nodes, stages, microbatches, solved)
    if any(d > 0 for d in delays):
        _add_transfers(dag, nodes, delays, unit_time_s)
    if any(w > 0 for w in waits):
        _add_first_forward_waits(dag, nodes, waits, unit_time_s)
    solver = IncrementalPhillipsDessouky(dag, cut="ortools" if fast else "lowtime")
    tables = [knob_tables[(ins.stage, ins.direction)] for ins, _ in nodes]

    def assigned() -> tuple[Hashable, ...]:
        """Every solved instruction's knob, then each steady block's (forward, backward)."""
        own = tuple(table[lt.assigned_knob] for table, (_, lt) in zip(tables, nodes))
        return own + tuple(k for pairs, op in blocks for k in pairs[op.assigned_knob])

    steps = 0
    run = solver.run()
    while True:
        with _lowtime_quiet():  # only while lowtime's code runs: never across a ``yield``
            result = next(run, None)
        if result is None:
            break
        steps += 1
        yield SolverStep(iteration=result.iteration, quant_time=int(result.quant_time),
                         real_time_s=float(result.real_time), cost=float(result.cost),
                         layout=layout, assigned=assigned())
    if steps == 0:
        # No operation could be sped up (e.g. a host-bound job, whose time no clock
        # changes): lowtime yields no step. Its starting point, every operation at its
        # slowest, least-cost option, is then the one step.
        quant = _longest_path(dag)
        cost = sum(lt.get_cost() for _, lt in nodes) + sum(op.get_cost() for _, op in blocks)
        yield SolverStep(iteration=0, quant_time=quant, real_time_s=quant * unit_time_s,
                         cost=float(cost), layout=layout, assigned=assigned())


def _operation_spec(time_energy: Sequence[tuple[float, float]], unit_time_s: float,
                    prefilter: Prefilter, static_power_w: float,
                    models: dict[tuple[tuple[int, float], ...], CostModel]
                    ) -> OperationSpec[int]:
    """One operation's lowtime spec from its options' (time s, measured energy J), knob = the
    option's index: pre-filtered (module docstring, step 1), costed in effective energy (step
    2) and fitted (step 3); ``models`` caches fits by the options they fit."""
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec

    lt_opts = []
    for idx, (time_s, energy_j) in enumerate(time_energy):
        cost = energy_j
        if prefilter == "effective":
            quant = int(time_s // unit_time_s)
            cost = dynamic_from_measured(energy_j, static_power_w, quant, unit_time_s)
        lt_opts.append(ExecutionOption[int](real_time=time_s, unit_time=unit_time_s,
                                            cost=cost, knob=idx))
    cand = CandidateExecutionOptions[int](options=lt_opts)
    if len(cand.options) <= FEW_OPTIONS:
        cand = CandidateExecutionOptions[int](options=lt_opts, noise_factor=NOISE_FACTOR)
    if prefilter == "raw":
        for opt in cand.options:
            opt.cost = dynamic_from_measured(opt.cost, static_power_w, opt.quant_time,
                                             opt.unit_time)
    fitted = tuple((o.quant_time, o.cost) for o in cand.options)
    if fitted not in models:
        models[fitted] = fit_exponential_model(cand)
    return OperationSpec[int](options=cand, cost_model=models[fitted])


@contextmanager
def _lowtime_quiet() -> Iterator[None]:
    """lowtime's ``logging`` output held to warnings and above, restored on leaving: it logs
    every solver step at INFO."""
    logger = logging.getLogger("lowtime")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _longest_path(dag: nx.DiGraph) -> int:
    """The quantised length of ``dag`` (activity on node, each node's ``op`` at its current
    duration; dummy operations take none)."""
    finish: dict[object, int] = {}
    for node in nx.topological_sort(dag):
        op = dag.nodes[node]["op"]
        start = max((finish[p] for p in dag.predecessors(node)), default=0)
        finish[node] = start + (0 if op.is_dummy else int(op.duration))
    return max(finish.values(), default=0)


def _layout(nodes: Sequence[tuple[Instruction, object]], stages: int, microbatches: int,
            solved: int) -> StepLayout:
    """Every instruction of the ``microbatches`` iteration and where its knob is in a step's
    ``assigned``: its solved instruction's position in ``nodes`` (:func:`folded_source`), or,
    for one its stage's steady block stands for, ``len(nodes) + 2·stage`` (the block's
    forward) or one more (its backward)."""
    position = {ins: k for k, (ins, _) in enumerate(nodes)}
    instructions = tuple(ins for seq in one_f_one_b(stages, microbatches).values() for ins in seq)
    source = []
    for ins in instructions:
        solved_as = folded_source(ins, stages, microbatches, solved)
        source.append(position[solved_as] if solved_as is not None else
                      len(nodes) + 2 * ins.stage + (ins.direction == "backward"))
    return StepLayout(instructions, tuple(source))


def _add_steady_blocks(dag: nx.DiGraph, nodes: Sequence[tuple[Instruction, object]],
                       options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                       extra: int, delays: Sequence[float], unit_time_s: float,
                       prefilter: Prefilter, static_power_w: float,
                       models: dict[tuple[tuple[int, float], ...], CostModel]
                       ) -> list[tuple[list[tuple[Hashable, Hashable]], object]]:
    """Put each stage's steady block (:func:`folded_microbatches`) on the folded DAG, for the
    ``extra`` pairs per stage it leaves out: on stage ``s`` between the backward that ends pair
    :func:`steady_cut` and the forward that starts the next, an operation whose options are the
    Pareto-optimal (forward, backward) option pairs, each ``extra`` times the pair's time (s)
    and measured energy (J), then a fixed operation for the sends those pairs and the cut's
    backward make (:func:`kareus.graph.sender_hold`). Returns, per stage, the block's
    (forward knob, backward knob) by option index and its operation; nothing when ``extra`` is 0.
    """
    if extra <= 0:
        return []
    from lowtime.operation import Operation

    solved = 1 + max(ins.microbatch for ins, _ in nodes)
    cut = steady_cut(stages, solved)
    node_of = {id(d.get("op")): n for n, d in dag.nodes(data=True)}
    node = {ins: node_of[id(lt)] for ins, lt in nodes}
    next_id = max(dag.nodes) + 1
    blocks: list[tuple[list[tuple[Hashable, Hashable]], object]] = []
    for stage in range(stages):
        pairs = [(f, b) for f in options[(stage, "forward")] for b in options[(stage, "backward")]]
        times = [extra * (f.time_s + b.time_s) for f, b in pairs]
        energies = [extra * (f.energy_j + b.energy_j) for f, b in pairs]
        ranked = energies if prefilter == "raw" else [
            dynamic_from_measured(e, static_power_w, t) for t, e in zip(times, energies)]
        keep = pareto_indices(times, ranked)
        op = Operation[int](spec=_operation_spec([(times[k], energies[k]) for k in keep],
                                                 unit_time_s, prefilter, static_power_w,
                                                 models))
        before = node[Instruction(stage, cut, "backward")]
        after = node[Instruction(stage, stages - stage - 1 + cut + 1, "forward")]
        forward, backward = (Instruction(stage, 0, d) for d in ("forward", "backward"))
        sends = (sender_hold(backward, stages, delays)
                 + extra * (sender_hold(forward, stages, delays)
                            + sender_hold(backward, stages, delays)))
        dag.remove_edge(before, after)
        dag.add_node(next_id, op=op)
        dag.add_edge(before, next_id)
        chain_end = next_id
        next_id += 1
        if sends > 0:
            dag.add_node(next_id, op=_fixed_operation(sends, unit_time_s))
            dag.add_edge(chain_end, next_id)
            chain_end = next_id
            next_id += 1
        dag.add_edge(chain_end, after)
        blocks.append(([(pairs[k][0].knob, pairs[k][1].knob) for k in keep], op))
    return blocks


def solver_energy(step: SolverStep, stages: int, static_power_w: float) -> float:
    """The energy the authors' driver reports for a solver step (J): the solver's cost (fitted
    effective energies) plus every stage's GPU at static power for the solver's time."""
    return step.cost + static_energy(stages, static_power_w, step.real_time_s)


def build_1f1b_dag(spec_map: Mapping[int, StageSpecs], stages: int, microbatches: int
                   ) -> tuple[nx.DiGraph, list[tuple[Instruction, LowtimeInstruction]]]:
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
    nodes: list[tuple[Instruction, LowtimeInstruction]] = []
    ids: dict[Instruction, int] = {}
    for stage in range(stages):
        for inst in Synchronous1F1B(num_stages=stages, num_micro_batches=microbatches,
                                     stage_id=stage, operation_spec_map=spec_map[stage]):
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


def _add_transfers(dag: nx.DiGraph, nodes: Sequence[tuple[Instruction, object]],
                   delays: Sequence[float], unit_time_s: float) -> None:
    """Put a fixed operation on every edge between instructions that carries a delay
    (:func:`kareus.graph.dependency_delay`): the transfer (s) on each edge between two stages
    (``delays[b]`` across boundary ``b``, between stages ``b`` and ``b + 1``), and the sender's
    hold on each edge from an instruction that sends its output to its stage's next one."""
    stages = len(delays) + 1
    ins_of = {id(lt): ins for ins, lt in nodes}
    node_ins = {n: ins_of.get(id(d.get("op"))) for n, d in dag.nodes(data=True)}
    held = [(u, v, dependency_delay(node_ins[u], node_ins[v], stages, delays))
            for u, v in dag.edges if node_ins[u] is not None and node_ins[v] is not None]
    next_id = max(dag.nodes) + 1
    for u, v, delay in held:
        if delay <= 0:
            continue
        dag.remove_edge(u, v)
        dag.add_node(next_id, op=_fixed_operation(delay, unit_time_s))
        dag.add_edge(u, next_id)
        dag.add_edge(next_id, v)
        next_id += 1


def _add_first_forward_waits(dag: nx.DiGraph, nodes: Sequence[tuple[Instruction, object]],
                             waits: Sequence[float], unit_time_s: float) -> None:
    """Put a fixed operation of ``waits[s]`` (s) before stage ``s``'s first forward, after
    whatever it waited for (the source, or the transfer from the stage before)."""
    node_of = {id(d.get("op")): n for n, d in dag.nodes(data=True)}
    next_id = max(dag.nodes) + 1
    for ins, lt in nodes:
        wait = wait_before(ins, waits)
        if wait <= 0:
            continue
        node = node_of[id(lt)]
        dag.add_node(next_id, op=_fixed_operation(wait, unit_time_s))
        for u in list(dag.predecessors(node)):
            dag.remove_edge(u, node)
            dag.add_edge(u, next_id)
        dag.add_edge(next_id, node)
        next_id += 1


def stage_waits(stages: int, wait_s: Sequence[float] | None) -> tuple[float, ...]:
    """Each stage's first-forward wait (s), checked: one non-negative time per stage; zeros for
    ``None``."""
    if wait_s is None:
        return (0.0,) * stages
    waits = tuple(float(w) for w in wait_s)
    if len(waits) != stages:
        raise InputError(f"{len(waits)} first-forward waits for {stages} stages")
    if not all(w >= 0 for w in waits):
        raise InputError(f"first-forward waits must be non-negative, got {list(waits)}")
    return waits


def wait_before(ins: Instruction, waits: Sequence[float]) -> float:
    """The wait (s) before ``ins`` starts its work: its stage's first-forward wait if it is its
    stage's first forward, else none."""
    return waits[ins.stage] if ins.direction == "forward" and ins.microbatch == 0 else 0.0


def with_first_forward_waits(durations: Mapping[Instruction, float],
                             waits: Sequence[float]) -> dict[Instruction, float]:
    """``durations`` (s) with each stage's first forward lengthened by its wait (s), as the
    iteration runs it: on the 1F1B schedule (:func:`kareus.graph.schedule_times`) the wait
    then comes after the forward's input and before its work."""
    return {ins: d + wait_before(ins, waits) for ins, d in durations.items()}


def lowtime_dag_shape(stages: int, microbatches: int) -> tuple[int, int]:
    """(nodes, edges) of the 1F1B DAG :func:`build_1f1b_dag` builds, dummy source/sink included,
    before :func:`solve` puts the transfers on it (with transfers between stages, one more node
    and edge on each cross-stage edge and on each edge from a sending instruction).

    Program order gives ``S·(2M − 1)`` edges, forward and backward dependencies ``2·(S − 1)·M``,
    and the source/sink connect to the instructions without predecessors / successors.
    """
    instructions = 2 * stages * microbatches
    program = stages * (2 * microbatches - 1)
    cross = 2 * (stages - 1) * microbatches
    return instructions + 2, program + cross + 2  # only F(0,0) starts and B(0,M-1) ends


def spread_steps(steps: Sequence[SolverStep], limit: int | None) -> list[SolverStep]:
    """At most ``limit`` steps evenly spread over the solve, the first and last included."""
    if limit is None or len(steps) <= limit:
        return list(steps)
    if limit < 2:
        return [steps[-1]]
    return [steps[k] for k in even_indices(len(steps), limit)]


def plans_from_steps(steps: Sequence[SolverStep],
                     make_plan: Callable[[Hashable], InstructionPlan],
                     label: str, limit: int | None = None,
                     refine: Callable[[dict[Instruction, Hashable]], dict[Instruction, Hashable]]
                     | None = None) -> list[IterationPlan]:
    """One :class:`~kareus.plan.IterationPlan` per solver step (``make_plan(knob)`` gives each
    instruction's plan); with ``limit``, for at most that many steps (:func:`spread_steps`);
    ``refine`` (e.g. a :class:`~kareus.methods.slack.SlackReclaimer`) may re-choose each step's
    knobs first."""
    cache: dict[Hashable, InstructionPlan] = {}
    return [_iteration_plan(step.knobs if refine is None else refine(step.knobs), make_plan, cache,
                            f"{label} step {step.iteration}",
                            {"solver_iteration": step.iteration,
                             "solver_time_s": step.real_time_s})
            for step in spread_steps(steps, limit)]


def fastest_knobs(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                  microbatches: int) -> dict[Instruction, Hashable]:
    """The option space's fastest plan: every instruction of the iteration at its type's fastest
    option (the least energy among equally fast ones).

    No plan over ``options`` ends sooner, since an iteration's time never grows when one of its
    instructions' shrinks. The solver's fastest step may end later: its time unit rounds options
    less than a unit apart alike and keeps the cheaper one, and a fast solve's folded DAG times the
    iteration to about one instruction per stage boundary (:func:`folded_microbatches`).
    """
    best = {key: min(opts, key=lambda o: (o.time_s, o.energy_j)).knob
            for key, opts in options.items()}
    return {ins: best[(ins.stage, ins.direction)]
            for seq in one_f_one_b(stages, microbatches).values() for ins in seq}


def fastest_plan(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                 microbatches: int, make_plan: Callable[[Hashable], InstructionPlan], label: str,
                 refine: Callable[[dict[Instruction, Hashable]], dict[Instruction, Hashable]]
                 | None = None) -> IterationPlan:
    """:func:`fastest_knobs` as a plan (``make_plan`` and ``refine`` as in
    :func:`plans_from_steps`): the fast end a solve's frontier is checked against."""
    knobs = fastest_knobs(options, stages, microbatches)
    return _iteration_plan(knobs if refine is None else refine(knobs), make_plan, {},
                           f"{label} fastest options", {"solver_iteration": None})


def _iteration_plan(knobs: Mapping[Instruction, Hashable],
                    make_plan: Callable[[Hashable], InstructionPlan],
                    cache: dict[Hashable, InstructionPlan], label: str,
                    meta: dict[str, object]) -> IterationPlan:
    """The :class:`~kareus.plan.IterationPlan` giving every instruction ``make_plan`` of its knob
    (``cache`` keeps one plan per knob across calls)."""
    from kareus.plan import IterationPlan

    instr: dict[Instruction, InstructionPlan] = {}
    for ins, knob in knobs.items():
        if knob not in cache:
            cache[knob] = make_plan(knob)
        instr[ins] = cache[knob]
    return IterationPlan(instr, label=label, meta=meta)
