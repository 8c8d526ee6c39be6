"""Plans replayed on measured options, and the slack reclaimer: a solver step's plan evaluated
on a profile's (time s, energy J) options (:func:`replay_knobs`), and every instruction of a plan
moved to the least-energy option that fits its slack without lengthening the iteration
(:class:`SlackReclaimer`; Kareus uses it by default, the baselines only with ``--set
reclaim=true``: :class:`kareus.methods.profiling.TradeoffSettings`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from kareus.energy import dynamic_from_measured
from kareus.graph import (Direction, Instruction, boundary_delays, dag_dependencies,
                          dependency_delay)
from kareus.methods.tradeoff import Option, SolverStep, stage_waits, wait_before


def evaluate_on_options(step: SolverStep, options: Mapping[tuple[int, Direction], Sequence[Option]],
                        stages: int, microbatches: int, static_power_w: float
                        ) -> tuple[float, float]:
    """(time s, energy J) of a solver step replayed on measured options (:func:`replay_knobs`)."""
    replay = replay_knobs(step.knobs, options, stages, microbatches, static_power_w)
    return replay.time_s, replay.energy_j


@dataclass(frozen=True)
class Replay:
    """A plan replayed on measured options (:func:`replay_knobs`)."""

    time_s: float  #: iteration time on the 1F1B DAG (s)
    energy_j: float  #: dynamic energy plus every GPU's static power over ``time_s`` (J)
    dynamic_j: float  #: the chosen options' dynamic energies (J)


def replay_knobs(knobs: Mapping[Instruction, Hashable],
                 options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                 microbatches: int, static_power_w: float) -> Replay:
    """A knob per instruction replayed on measured options (a profile): instruction times from
    the chosen options on the 1F1B DAG, energy = their dynamic energies plus every GPU's static
    power for the whole iteration (one GPU per stage, as a profile describes). The one footing
    on which plans of different methods compare."""
    from kareus.energy import iteration_energy
    from kareus.graph import schedule_times

    by_knob = {key: {o.knob: o for o in opts} for key, opts in options.items()}
    durations: dict[Instruction, float] = {}
    dynamic = 0.0
    for ins, knob in knobs.items():
        opt = by_knob[(ins.stage, ins.direction)][knob]
        durations[ins] = opt.time_s
        dynamic += dynamic_from_measured(opt.energy_j, static_power_w, opt.time_s)
    times = schedule_times(stages, microbatches, durations)
    t = max(end for _, end in times.values())
    return Replay(t, iteration_energy(dynamic, stages, static_power_w, t).total_j, dynamic)


class SlackReclaimer:
    """Gives every instruction of a plan the least-energy measured option that fits its slack.

    lowtime's solver chooses options through a fitted cost model on a quantized time grid, so
    an instruction off the critical path can be left faster than it needs to be, or on an option
    the model ranks right but the measurement does not. Given a plan (a knob per instruction),
    the iteration's makespan ``T`` stays as it is; every instruction, in topological order, gets
    the option of least dynamic energy (measured energy minus static power over its time) that
    ends by its latest finish (the backward pass from ``T`` over the other instructions' current
    durations) when started at its earliest start (its predecessors as already chosen). Every
    instruction not yet visited can still keep its option, so the makespan never grows and the
    energy never rises; passes repeat while they still save energy (at most ``passes``). The
    transfers between stages (``p2p_time_s``: one time, or one per boundary) must be the ones
    the iteration runs: with a boundary's transfer understated, the slack it computes is not
    there and the makespan grows; so must each stage's first-forward wait
    (``first_forward_wait_s``, :func:`stage_waits`).
    """

    def __init__(self, options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                 microbatches: int, static_power_w: float,
                 p2p_time_s: float | Sequence[float] = 0.0, passes: int = 3,
                 first_forward_wait_s: Sequence[float] | None = None) -> None:
        from bisect import bisect_right

        from kareus.graph import topological_order

        self._bisect = bisect_right
        self.passes, self.static_power_w = passes, static_power_w
        self.order = topological_order(stages, microbatches)
        self.by_knob: dict[tuple[int, str], dict[Hashable, Option]] = {}
        tables: dict[tuple[int, str], tuple[list[float], list[Option]]] = {}
        for key, opts in options.items():
            self.by_knob[key] = {o.knob: o for o in opts}
            ranked = sorted(opts, key=lambda o: o.time_s)
            times, best, cheapest = [], [], None
            for o in ranked:  # least dynamic energy among the options at most this fast
                dyn = dynamic_from_measured(o.energy_j, static_power_w, o.time_s)
                if cheapest is None or dyn < cheapest[0]:
                    cheapest = (dyn, o)
                times.append(o.time_s)
                best.append(cheapest[1])
            tables[key] = (times, best)
        # The DAG on positions in topological order, each edge with its transfer (s) and each
        # instruction with its wait (s, :func:`wait_before`): the passes index lists instead of
        # hashing instructions.
        delays = boundary_delays(stages, p2p_time_s)
        waits = stage_waits(stages, first_forward_wait_s)

        def gap(a: Instruction, b: Instruction) -> float:
            """The delay on the edge ``a -> b`` (s): the transfer across a boundary, the
            sender's hold on one stage (:func:`kareus.graph.dependency_delay`)."""
            return dependency_delay(a, b, stages, delays)

        at = {ins: k for k, ins in enumerate(self.order)}
        self._pred_edges: list[list[tuple[int, float]]] = [[] for _ in self.order]
        self._succ_edges: list[list[tuple[int, float]]] = [[] for _ in self.order]
        for ins, preds in dag_dependencies(stages, microbatches).items():
            for p in preds:
                self._pred_edges[at[ins]].append((at[p], gap(p, ins)))
                self._succ_edges[at[p]].append((at[ins], gap(p, ins)))
        self._waits = [wait_before(ins, waits) for ins in self.order]
        self._tables = [tables[ins.type_key] for ins in self.order]

    def __call__(self, knobs: Mapping[Instruction, Hashable]) -> dict[Instruction, Hashable]:
        """The plan ``knobs`` with every instruction's option re-chosen within its slack."""
        chosen = [self.by_knob[ins.type_key][knobs[ins]] for ins in self.order]
        for _ in range(self.passes):
            if not self._one_pass(chosen):
                break
        picked = dict(zip(self.order, chosen))
        return {ins: picked[ins].knob for ins in knobs}

    def _one_pass(self, chosen: list[Option]) -> bool:
        """One pass over ``chosen`` (an option per position of :attr:`order`), in place; whether
        it changed an option."""
        preds, succs, waits = self._pred_edges, self._succ_edges, self._waits
        n = len(chosen)
        end = [0.0] * n
        for i in range(n):
            start = max((end[j] + gap for j, gap in preds[i]), default=0.0)
            end[i] = start + waits[i] + chosen[i].time_s
        makespan = max(end)
        latest = [0.0] * n
        for i in reversed(range(n)):
            latest[i] = min((latest[j] - chosen[j].time_s - waits[j] - gap for j, gap in succs[i]),
                            default=makespan)
        changed = False
        for i in range(n):
            start = max((end[j] + gap for j, gap in preds[i]), default=0.0) + waits[i]
            times, best = self._tables[i]
            k = self._bisect(times, latest[i] - start + 1e-12 * makespan) - 1
            current = chosen[i]
            if k >= 0 and best[k] is not current and self._cheaper(best[k], current):
                chosen[i] = best[k]
                changed = True
            end[i] = start + chosen[i].time_s
        return changed

    def _cheaper(self, a: Option, b: Option) -> bool:
        """Whether ``a`` draws less dynamic energy than ``b`` (J)."""
        return (dynamic_from_measured(a.energy_j, self.static_power_w, a.time_s)
                < dynamic_from_measured(b.energy_j, self.static_power_w, b.time_s))
