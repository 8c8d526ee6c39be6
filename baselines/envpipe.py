"""EnvPipe (ATC '23): keep the pipeline's outer envelope at the maximum clock, run everything else
at its energy-optimal clock, then raise clocks on the critical path until the iteration is as fast
as the envelope again. One plan near minimum time.
"""

from __future__ import annotations

from kareus.graph import critical_path
from kareus.plan import InstructionPlan, IterationPlan
from kareus.plugins import Problem
from kareus.profiling import profile_instructions

#: Slack on "as fast as the envelope" (relative), against clock-grid granularity.
_SLACK = 1e-3


class EnvPipe:
    """The envelope heuristic on the problem's backend (sequential execution)."""

    name = "envpipe"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        g, backend = problem.graph, problem.backend
        clocks = sorted(problem.knobs.clocks_mhz)
        f_max = clocks[-1]
        plan_at = {c: InstructionPlan.make(c) for c in clocks}
        options = profile_instructions(backend, g, clocks, lambda c: plan_at[c])  # type: ignore[index]
        # energy-optimal clock of each instruction type (measured energy, static included)
        best = {key: min(opts, key=lambda o: o.energy_j).knob for key, opts in options.items()}

        fastest = IterationPlan.uniform(g, f_max)
        base = backend.evaluate_plan(g, fastest)
        p2p = getattr(backend, "p2p_time", lambda _g: 0.0)(g)
        envelope = set(critical_path(g.stages, g.microbatches, base.instruction_times, p2p))
        clock = {ins: (f_max if ins in envelope else best[ins.type_key])
                 for ins in fastest.instructions}
        for _ in range(len(clocks) * len(clock)):
            plan = IterationPlan({i: plan_at[c] for i, c in clock.items()}, label="envpipe")
            res = backend.evaluate_plan(g, plan)
            if res.time_s <= base.time_s * (1 + _SLACK):
                return [plan]
            raise_me = [i for i in critical_path(g.stages, g.microbatches, res.instruction_times,
                                                 p2p) if clock[i] < f_max]
            if not raise_me:
                return [plan]
            for i in raise_me:
                clock[i] = clocks[clocks.index(clock[i]) + 1]
        return [IterationPlan({i: plan_at[c] for i, c in clock.items()}, label="envpipe")]
