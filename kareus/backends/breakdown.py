"""Where an iteration's time goes, per pipeline stage, as the simulator costs it.

Two views of each stage:

- **One micro-batch**, the mean of the stage's forward and of its backward instructions: the GPU
  time of their compute kernels by kind (``gemm``, ``attention``, ``memory``), of their
  collectives (``collective``: tensor- and context-parallel, alone on the library's kernel, or
  with ``--overlap-tp-grad`` what a collective beside a GEMM adds to it), of
  a nanobatched plan's ``overlapped`` partitions, and ``host_wait``, the time the GPU waits for
  the host to issue the next kernel (short kernels at small micro-batches); with each part its
  dynamic energy per GPU (:meth:`~kareus.backends.sim.SimulatorBackend.instruction_breakdown`,
  whose parts are what the simulator adds up into an instruction's cost).
- **The iteration** on one GPU of the stage, from the simulated schedule: its instructions
  (``instructions_s``, their durations added up), the waits before and between them
  (``waiting_s``: the pipeline filling, the stage waiting for its neighbours' work, for the
  transfers between stages and for its own sends to finish, and with ``--overlap-param-gather`` for what its parameter
  all-gather leaves exposed before its first forward), what the host gains a single-stage job by issuing ahead across
  instructions (``run_ahead_s``, subtracted), the stage's tail (``tail_s``: the optimizer step
  and what the data-parallel gradient synchronisation leaves exposed), and the time after its
  work until the iteration ends (``after_s``: in 1F1B the first stage ends last, so for the
  others this is the pipeline draining). They add up to the iteration time. With them the
  energy of one GPU of the stage over the iteration (``dynamic_j``, ``energy_j``: static
  included, :func:`kareus.energy.iteration_energy`'s accounting).
"""

from __future__ import annotations

from dataclasses import dataclass

from kareus.backends.base import IterationResult
from kareus.backends.sim import SimulatorBackend
from kareus.graph import Instruction, IterationGraph
from kareus.plan import IterationPlan


@dataclass(frozen=True)
class StageBreakdown:
    """One stage's share of an iteration, per GPU of the stage (see the module docstring).

    Attributes:
        stage: The pipeline stage.
        layers: Its transformer blocks.
        forward_s: One micro-batch's forward, by part (s, the mean over the micro-batches).
        backward_s: One micro-batch's backward, by part (s).
        forward_dynamic_j: The forward's dynamic energy by part (J).
        backward_dynamic_j: The backward's dynamic energy by part (J).
        instructions_s: The stage's instructions' durations added up (s).
        waiting_s: Its waits before and between them, and after the last while it sends (s).
        run_ahead_s: What the host's issuing ahead saves (s; only without pipeline stages).
        tail_s: Its optimizer step and exposed gradient synchronisation (s).
        after_s: From the end of its work to the end of the iteration (s).
        dynamic_j: One GPU's dynamic energy over the iteration (J).
        energy_j: One GPU's energy over the iteration, static included (J).
    """

    stage: int
    layers: int
    forward_s: dict[str, float]
    backward_s: dict[str, float]
    forward_dynamic_j: dict[str, float]
    backward_dynamic_j: dict[str, float]
    instructions_s: float
    waiting_s: float
    run_ahead_s: float
    tail_s: float
    after_s: float
    dynamic_j: float
    energy_j: float

    @property
    def iteration_s(self) -> float:
        """The parts' sum: the iteration's time (s)."""
        return (self.instructions_s + self.waiting_s - self.run_ahead_s + self.tail_s
                + self.after_s)

    def to_dict(self) -> dict[str, object]:
        return {"stage": self.stage, "layers": self.layers,
                "microbatch": {"forward_s": self.forward_s, "backward_s": self.backward_s,
                               "forward_dynamic_j": self.forward_dynamic_j,
                               "backward_dynamic_j": self.backward_dynamic_j},
                "iteration": {"instructions_s": self.instructions_s,
                              "waiting_s": self.waiting_s, "run_ahead_s": self.run_ahead_s,
                              "tail_s": self.tail_s, "after_s": self.after_s,
                              "dynamic_j": self.dynamic_j, "energy_j": self.energy_j}}


def time_breakdown(sim: SimulatorBackend, graph: IterationGraph, plan: IterationPlan,
                   result: IterationResult, stage_layers: tuple[int, ...]
                   ) -> list[StageBreakdown]:
    """Every stage's breakdown of ``result``, ``sim``'s evaluation of ``plan`` on ``graph``
    (``stage_layers``: the transformer blocks of each stage)."""
    if plan.power_limit_w is not None:  # the plan was evaluated under its own limit
        sim = sim.under_limit(plan.power_limit_w)
    by_stage: dict[int, list[Instruction]] = {s: [] for s in range(graph.stages)}
    for ins in result.instruction_times:
        by_stage[ins.stage].append(ins)
    # instructions of one type under one instruction plan cost the same: broken down once
    parts_of: dict[tuple, dict[str, tuple[float, float]]] = {}
    stages = []
    for s in range(graph.stages):
        spans = sorted(result.instruction_times[ins] for ins in by_stage[s])
        busy = sum(end - start for start, end in spans)
        mean: dict[str, dict[str, tuple[float, float]]] = {}
        for direction in ("forward", "backward"):
            mine = [ins for ins in by_stage[s] if ins.direction == direction]
            total: dict[str, list[float]] = {}
            for ins in mine:
                key = (ins.type_key, plan.instructions[ins])
                if key not in parts_of:
                    parts_of[key] = sim.instruction_breakdown(graph, *key)
                for part, (t, e) in parts_of[key].items():
                    acc = total.setdefault(part, [0.0, 0.0])
                    acc[0] += t
                    acc[1] += e
            mean[direction] = {part: (t / len(mine), e / len(mine))
                               for part, (t, e) in total.items() if t or e}
        stages.append(StageBreakdown(
            stage=s, layers=stage_layers[s],
            forward_s={k: t for k, (t, _) in mean["forward"].items()},
            backward_s={k: t for k, (t, _) in mean["backward"].items()},
            forward_dynamic_j={k: e for k, (_, e) in mean["forward"].items()},
            backward_dynamic_j={k: e for k, (_, e) in mean["backward"].items()},
            # the waits run to the stage's last send (its last instruction's end plus the
            # sender's hold), where its tail starts
            instructions_s=busy,
            waiting_s=(result.stage_end_s[s] - result.stage_tail_s.get(s, 0.0)
                       + result.run_ahead_s - busy),
            run_ahead_s=result.run_ahead_s, tail_s=result.stage_tail_s.get(s, 0.0),
            after_s=result.time_s - result.stage_end_s[s],
            dynamic_j=result.per_gpu_dynamic_j[s], energy_j=result.per_gpu_energy_j[s]))
    return stages
