"""Where an iteration's time goes, per pipeline stage, as the simulator costs it.

Two views of each stage:

- **One micro-batch**, the mean of the stage's forward and of its backward instructions: the GPU
  time of their compute kernels by kind (``gemm``, ``attention``, ``memory``), of their
  collectives (``collective``: tensor- and context-parallel, alone on the library's kernel), of
  a nanobatched plan's ``overlapped`` partitions, and ``host_wait``, the time the GPU waits for
  the host to issue the next kernel (short kernels at small micro-batches). With each part its
  dynamic energy per GPU.
- **The iteration** on one GPU of the stage: its instructions back to back (``instructions_s``),
  the waits between and before them (``waiting_s``: the 1F1B pipeline's fill and drain and the
  transfers between stages), what the host gains a single-stage job by issuing ahead across
  instructions (``run_ahead_s``, subtracted), the stage's tail (``tail_s``: the optimizer step
  and what the data-parallel gradient synchronisation leaves exposed) and the wait for the
  slowest stage to end (``idle_at_end_s``). They add up to the iteration time.
"""

from __future__ import annotations

from dataclasses import dataclass

from kareus.backends.base import IterationResult
from kareus.backends.sim import SimulatorBackend
from kareus.graph import IterationGraph
from kareus.plan import IterationPlan


@dataclass(frozen=True)
class StageBreakdown:
    """One stage's share of an iteration (see the module docstring; s and J per GPU)."""

    stage: int
    layers: int
    forward_s: dict[str, float]
    backward_s: dict[str, float]
    forward_j: dict[str, float]
    backward_j: dict[str, float]
    instructions_s: float
    waiting_s: float
    run_ahead_s: float
    tail_s: float
    idle_at_end_s: float

    @property
    def iteration_s(self) -> float:
        """The parts' sum: the iteration's time (s)."""
        return (self.instructions_s + self.waiting_s - self.run_ahead_s + self.tail_s
                + self.idle_at_end_s)

    def to_dict(self) -> dict[str, object]:
        return {"stage": self.stage, "layers": self.layers,
                "microbatch": {"forward_s": self.forward_s, "backward_s": self.backward_s,
                               "forward_dynamic_j": self.forward_j,
                               "backward_dynamic_j": self.backward_j},
                "iteration": {"instructions_s": self.instructions_s,
                              "waiting_s": self.waiting_s, "run_ahead_s": self.run_ahead_s,
                              "tail_s": self.tail_s, "idle_at_end_s": self.idle_at_end_s}}


def time_breakdown(sim: SimulatorBackend, graph: IterationGraph, plan: IterationPlan,
                   result: IterationResult, stage_layers: tuple[int, ...]
                   ) -> list[StageBreakdown]:
    """Every stage's breakdown of ``result``, the simulator's evaluation of ``plan`` on
    ``graph`` (``stage_layers``: the transformer blocks of each stage)."""
    stages = []
    for s in range(graph.stages):
        mean: dict[str, dict[str, tuple[float, float]]] = {}
        busy = 0.0
        for direction in ("forward", "backward"):
            mine = [ins for ins in result.instruction_times
                    if ins.stage == s and ins.direction == direction]
            total: dict[str, list[float]] = {}
            for ins in mine:
                parts = sim.instruction_breakdown(graph, ins.type_key, plan.instructions[ins])
                for part, (t, e) in parts.items():
                    acc = total.setdefault(part, [0.0, 0.0])
                    acc[0] += t
                    acc[1] += e
                    busy += t
            mean[direction] = {part: (t / len(mine), e / len(mine))
                               for part, (t, e) in total.items() if t or e}
        last_end = max(end for ins, (_, end) in result.instruction_times.items()
                       if ins.stage == s)
        tail = result.stage_tail_s.get(s, 0.0)
        stages.append(StageBreakdown(
            stage=s, layers=stage_layers[s],
            forward_s={k: t for k, (t, _) in mean["forward"].items()},
            backward_s={k: t for k, (t, _) in mean["backward"].items()},
            forward_j={k: e for k, (_, e) in mean["forward"].items()},
            backward_j={k: e for k, (_, e) in mean["backward"].items()},
            instructions_s=busy, waiting_s=last_end - busy, run_ahead_s=result.run_ahead_s,
            tail_s=tail,
            idle_at_end_s=result.time_s - (last_end - result.run_ahead_s + tail)))
    return stages
