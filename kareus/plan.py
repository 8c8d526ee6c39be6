"""Plans: what an optimizer decides and a backend executes.

A plan locks one SM clock per pipeline instruction and, for nanobatched instructions, chooses per
partition the number of SMs the communication kernel takes and the compute op it launches with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kareus.graph import Instruction, IterationGraph


@dataclass(frozen=True)
class PartitionSchedule:
    """Fine-grained schedule of one partition.

    Attributes:
        comm_sms: SMs (thread blocks / NCCL channels) of the communication kernel.
        launch_slot: Index of the compute op the communication launches with; it joins at the end
            of the partition.
    """

    comm_sms: int
    launch_slot: int = 0


@dataclass(frozen=True)
class InstructionPlan:
    """How one pipeline instruction runs.

    Attributes:
        clock_mhz: Locked SM clock (MHz).
        nanobatched: Split the microbatch into nanobatches and overlap communication.
        schedules: Partition key -> schedule, as sorted ``(key, schedule)`` pairs; partitions not
            listed use the collective library's default SM count and launch at the partition start.
    """

    clock_mhz: float
    nanobatched: bool = False
    schedules: tuple[tuple[str, PartitionSchedule], ...] = ()

    @staticmethod
    def make(clock_mhz: float, nanobatched: bool = False,
             schedules: Mapping[str, PartitionSchedule] | None = None) -> "InstructionPlan":
        return InstructionPlan(float(clock_mhz), nanobatched,
                               tuple(sorted((schedules or {}).items())))

    def schedule_map(self) -> dict[str, PartitionSchedule]:
        return dict(self.schedules)


@dataclass(frozen=True)
class IterationPlan:
    """A complete plan for one iteration.

    Attributes:
        instructions: Plan of every instruction of the 1F1B DAG.
        power_limit_w: Board power limit to apply (``None``: the GPU's default).
        label: Free-form description (e.g. which optimizer step produced it).
    """

    instructions: Mapping[Instruction, InstructionPlan]
    power_limit_w: float | None = None
    label: str = ""
    meta: Mapping[str, object] = field(default_factory=dict, compare=False)

    @staticmethod
    def uniform(graph: IterationGraph, clock_mhz: float, nanobatched: bool = False,
                schedules: Mapping[str, PartitionSchedule] | None = None,
                power_limit_w: float | None = None, label: str = "") -> "IterationPlan":
        """The same clock and schedule for every instruction."""
        ip = InstructionPlan.make(clock_mhz, nanobatched, schedules)
        return IterationPlan(
            {ins: ip for seq in graph.schedule().values() for ins in seq},
            power_limit_w=power_limit_w, label=label,
        )
