"""JSON records of the outside contract (``../shared/architecture.md``): points and frontier-like
objects. Every command that prints or writes a frontier builds it here. :class:`Point` lives with
the backend interface (:mod:`kareus.backends.base`), which produces the results it records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kareus.backends.base import IterationResult, Point
from kareus.frontier import fastest
from kareus.hardware.presets import GPUPreset


@dataclass(frozen=True)
class Choice:
    """The plan an optimizer singles out as its own pick (:data:`kareus.plan.CHOICE`): its
    measured point and its label."""

    point: Point
    label: str

    def to_dict(self) -> dict[str, object]:
        """The contract's ``choice``: the point's fields, ``plan_id`` and ``label``."""
        return {**self.point.to_dict(), "plan_id": self.point.plan_id, "label": self.label}


def frontier_object(*, workload: str, optimizer: str, backend: str, gpu: str, num_gpus: int,
                    gpus_per_stage: int, points: Sequence[Point], **extra: object) -> dict:
    """The contract's frontier-like object: points sorted by time, each with its ``plan_id`` (the
    index of its plan among those the optimizer returned), and the fastest point."""
    ordered = sorted(points, key=lambda p: (p.time_s, p.energy_j))

    def entry(p: Point) -> dict[str, object]:
        return {**p.to_dict(), "plan_id": p.plan_id}

    obj: dict[str, object] = {
        "workload": workload, "optimizer": optimizer, "backend": backend, "gpu": gpu,
        "num_gpus": num_gpus, "gpus_per_stage": gpus_per_stage,
        "points": [entry(p) for p in ordered],
        "max_throughput": entry(ordered[fastest([p.time_s for p in ordered],
                                                [p.energy_j for p in ordered])])
        if ordered else None,
    }
    obj.update(extra)
    return obj


def iteration_details(result: IterationResult, gpu: GPUPreset, precision: str = "bf16"
                      ) -> dict[str, float]:
    """Derived figures of one iteration: average power per GPU (W), model FLOPs utilisation
    (against the GPU's peak in the job's ``precision``, :meth:`GPUPreset.peak_flops_in`), static
    share of energy, and per-stage energy of one GPU (J)."""
    e = result.energy
    peak = gpu.peak_flops_in(precision)
    return {
        "avg_power_per_gpu_w": e.total_j / e.time_s / result.num_gpus,
        "mfu": result.model_flops / (e.time_s * result.num_gpus * peak),
        "static_share": e.static_j / e.total_j,
        "per_gpu_energy_j": {str(s): v for s, v in result.per_gpu_energy_j.items()},
    }
