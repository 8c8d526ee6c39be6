"""The backend interface: what optimizers and the harness may ask of a simulator or real GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from kareus.energy import EnergyBreakdown
from kareus.graph import Direction, Instruction, IterationGraph, Partition
from kareus.hardware.presets import GPUPreset
from kareus.plan import InstructionPlan, IterationPlan


@dataclass(frozen=True)
class PartitionGrid:
    """One partition evaluated over a knob grid; arrays are indexed ``[clock, sms, window]``.

    Attributes:
        key: Partition key.
        clocks_mhz: Requested SM clocks (MHz), shape (F,).
        comm_sms: Communication SM counts, shape (K,); :data:`~kareus.plan.LIBRARY_DEFAULT` (0)
            is the collective library's default kernel.
        windows: (launch, wait) windows, shape (W, 2) (see
            :class:`~kareus.plan.PartitionSchedule`); (-1, -1) is sequential.
        time_s: Partition time (s), shape (F, K, W).
        dynamic_energy_j: Dynamic energy per GPU (J), shape (F, K, W).
        block_size: Threads per block of the tuned kernels.
    """

    key: str
    clocks_mhz: NDArray[np.float64]
    comm_sms: NDArray[np.int64]
    windows: NDArray[np.int64]
    time_s: NDArray[np.float64]
    dynamic_energy_j: NDArray[np.float64]
    block_size: int = 1024


@dataclass(frozen=True)
class InstructionCost:
    """Time (s) and dynamic energy per GPU (J) of one instruction under one instruction plan."""

    time_s: float
    dynamic_energy_j: float


@dataclass(frozen=True)
class IterationResult:
    """One iteration executed under a plan.

    Attributes:
        energy: Whole-cluster breakdown (time, dynamic, static).
        num_gpus: GPUs in the job.
        gpus_per_stage: GPUs per pipeline stage.
        per_gpu_dynamic_j: Dynamic energy of one GPU of each stage (J).
        per_gpu_energy_j: Total energy of one GPU of each stage, static included (J).
        instruction_times: (start, end) of every instruction (s).
        model_flops: Model FLOPs of the iteration (for MFU).
        stage_tail_s: Per stage, its work after its last instruction (s): the optimizer step and
            what the data-parallel gradient synchronisation leaves exposed. Empty where the
            backend does not tell.
        stage_end_s: Per stage, when its work ends (s from the iteration's start): its last
            instruction's end and the time its last send holds it (pipeline stages), less
            ``run_ahead_s``, plus its tail; the iteration time is the latest. Empty where the backend does not tell.
        run_ahead_s: What a single-stage iteration gains over its instructions run one by one,
            by the host issuing ahead across them (s; 0 with pipeline stages).
    """

    energy: EnergyBreakdown
    num_gpus: int
    gpus_per_stage: int
    per_gpu_dynamic_j: dict[int, float]
    per_gpu_energy_j: dict[int, float]
    instruction_times: dict[Instruction, tuple[float, float]] = field(repr=False)
    model_flops: float = 0.0
    stage_tail_s: dict[int, float] = field(default_factory=dict)
    stage_end_s: dict[int, float] = field(default_factory=dict)
    run_ahead_s: float = 0.0

    @property
    def time_s(self) -> float:
        return self.energy.time_s


@dataclass(frozen=True)
class Point:
    """One measured plan: iteration time (s) and whole-cluster energy (J)."""

    time_s: float
    energy_j: float
    dynamic_energy_j: float
    static_energy_j: float
    plan_id: int = 0

    @staticmethod
    def from_result(result: IterationResult, plan_id: int = 0) -> "Point":
        e = result.energy
        return Point(e.time_s, e.total_j, e.dynamic_j, e.static_j, plan_id)

    def to_dict(self) -> dict[str, float]:
        return {"time_s": self.time_s, "energy_j": self.energy_j,
                "dynamic_energy_j": self.dynamic_energy_j,
                "static_energy_j": self.static_energy_j}


@runtime_checkable
class Backend(Protocol):
    """Measures time and energy. The simulator and the GPU backend implement this."""

    name: str
    gpu: GPUPreset

    def evaluate_partition(self, partition: Partition, clocks_mhz: NDArray[np.float64],
                           comm_sms: NDArray[np.int64], windows: NDArray[np.int64],
                           block_size: int | None = None) -> PartitionGrid:
        """Time and dynamic energy of ``partition`` at every (clock, SMs, window) combination, as
        it runs inside an iteration (back to back with the partitions around it); ``windows`` has
        shape (W, 2)."""
        ...

    def evaluate_instruction(self, graph: IterationGraph, key: tuple[int, Direction],
                             plan: InstructionPlan) -> InstructionCost:
        """Time and dynamic energy per GPU of one instruction of type ``key``."""
        ...

    def evaluate_plan(self, graph: IterationGraph, plan: IterationPlan) -> IterationResult:
        """One whole iteration."""
        ...

    def p2p_times(self, graph: IterationGraph) -> tuple[float, ...]:
        """Time (s) of one activation transfer across each stage boundary (``b``: between stages
        ``b`` and ``b + 1``) that an iteration's schedule puts between a stage's instruction and
        the next stage's; zeros when the backend's instruction times already contain them."""
        ...

    def first_forward_waits(self, graph: IterationGraph) -> tuple[float, ...]:
        """Per stage, the time (s) its first forward waits, once its input is there, for work
        its instruction times do not contain (the parameter all-gather Megatron-LM's
        ``--overlap-param-gather`` leaves exposed), at the maximum clock; zeros for none."""
        ...
