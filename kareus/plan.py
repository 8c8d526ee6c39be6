"""Plans: what an optimizer decides and a backend executes.

A plan locks one SM clock per pipeline instruction and, for nanobatched instructions, chooses per
partition the number of SMs the communication kernel takes and the compute op it launches with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kareus.graph import Instruction, IterationGraph


#: ``comm_sms`` value in partition grids that means "the collective library's default" (NCCL
#: with its default channel count) rather than a tuned kernel on that many SMs.
LIBRARY_DEFAULT = 0

#: The (launch, wait) window that runs the collective alone before the partition's compute.
SEQUENTIAL = (-1, -1)


@dataclass(frozen=True)
class PartitionSchedule:
    """Fine-grained schedule of one partition: which collective kernel runs the other
    nanobatch's communication, and which compute it overlaps.

    The window follows the Kareus artifact: the collective is launched (on a side stream) just
    before compute op ``launch_slot`` is issued, and the compute stream waits for it right after
    op ``wait_after``. ``launch_slot = wait_after = -1`` runs the collective alone before the
    compute (no overlap).

    Attributes:
        comm_sms: SMs (thread blocks) of a tuned collective kernel; ``None`` runs the collective
            library's default kernel (NCCL, its default channel count).
        launch_slot: Index ``s`` of the compute op the collective is launched before (-1:
            sequential).
        wait_after: Index ``e`` of the compute op after which compute waits for the collective;
            ``None`` means the partition's last op (the collective joins at the end).
        block_size: Threads per block of a tuned kernel; ``None``: the GPU's default (1024 on
            A100).
    """

    comm_sms: int | None = None
    launch_slot: int = 0
    wait_after: int | None = None
    block_size: int | None = None

    def window(self, n_ops: int) -> tuple[int, int]:
        """``(s, e)`` with ``wait_after`` resolved for a partition of ``n_ops`` compute ops."""
        if self.launch_slot < 0:
            return SEQUENTIAL
        return (self.launch_slot, n_ops - 1 if self.wait_after is None else self.wait_after)

    def problem(self, n_ops: int, max_sms: int, max_threads: int = 1024) -> str | None:
        """Why this schedule cannot run on a partition of ``n_ops`` compute ops, or ``None``."""
        s, e = self.launch_slot, self.wait_after
        if e is None:
            e = n_ops - 1 if s >= 0 else -1
        if (s < 0) != (e < 0):
            return f"window ({s}, {e}): -1 must be on both sides (sequential) or neither"
        if s < -1 or e < -1 or (s >= 0 and not s <= e < n_ops):
            return (f"window ({s}, {e}) outside the partition's ops: need 0 <= s <= e <= "
                    f"{n_ops - 1}, or (-1, -1)")
        if self.comm_sms is not None and (isinstance(self.comm_sms, bool)
                                          or not 1 <= self.comm_sms <= max_sms):
            return f"communication SMs {self.comm_sms} outside 1..{max_sms}"
        b = self.block_size
        if b is not None and (isinstance(b, bool) or not 32 <= b <= max_threads or b % 32):
            return f"threads per block {b} must be a multiple of 32 in 32..{max_threads}"
        return None


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
