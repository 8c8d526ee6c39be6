"""The optimizer plugin interface and its registry.

An optimizer is any class with a ``name`` and an ``optimize(problem)`` method returning plans.
Built-ins and third-party optimizers register the same way: an entry point in the group
``kareus.optimizers`` naming the class (see ``pyproject.toml`` and ``examples/``). The harness
evaluates every returned plan on the problem's backend; optimizers may also call the backend
themselves (to profile, or to pick among candidates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

import pandas as pd

from kareus.backends.base import Backend
from kareus.errors import InputError
from kareus.graph import IterationGraph
from kareus.hardware.knobs import KnobSpace
from kareus.hardware.presets import GPUPreset
from kareus.plan import IterationPlan
from kareus.progress import SILENT, Progress
from workloads.parallel import Workload

ENTRY_POINT_GROUP = "kareus.optimizers"


@dataclass(frozen=True)
class Problem:
    """Everything an optimizer sees.

    Attributes:
        workload: The workload (model + parallelism).
        graph: Its iteration graph.
        backend: Where to measure (simulator or GPUs).
        gpu: The GPU preset.
        knobs: The knob space.
        seed: Seed for randomised optimizers.
        options: Optimizer-specific settings (``name -> value``), from the command line.
        progress: Where long work (solver steps, partition searches) reports its progress
            (:mod:`kareus.progress`); silent unless a face shows it.
    """

    workload: Workload
    graph: IterationGraph
    backend: Backend
    gpu: GPUPreset
    knobs: KnobSpace
    seed: int = 0
    options: dict[str, object] = field(default_factory=dict)
    progress: Progress = field(default=SILENT, repr=False, compare=False)


@runtime_checkable
class Optimizer(Protocol):
    """The plugin protocol."""

    name: str

    def optimize(self, problem: Problem) -> Sequence[IterationPlan]:
        """Return the plans to evaluate (at least one)."""
        ...


@runtime_checkable
class ProfileRunner(Protocol):
    """An optimizer that can also run on a measured Zeus-format profile (``kareus perseus``,
    ``kareus envpipe``): the CLI loads it through the registry and calls ``on_profile``."""

    name: str

    def on_profile(self, profile: pd.DataFrame, source: str, stages: int, microbatches: int,
                   static_power_w: float, *, unit_time_s: float,
                   **options: object) -> list[dict]:
        """Check the arguments against ``profile`` (read from ``source``; raise
        :class:`InputError`), run on it, and return point records (``time_s``, ``energy_j``).
        ``options`` may carry ``progress`` (:class:`kareus.progress.Progress`) for long runs."""
        ...


def registered_optimizers() -> dict[str, type]:
    """Optimizer classes registered under :data:`ENTRY_POINT_GROUP`, by entry-point name."""
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if not found:
        raise InputError("no optimizers are registered; install the suite with "
                         "`pip install -e .` so its entry points exist")
    return {name: ep for name, ep in sorted(found.items(), key=lambda kv: kv[0])}  # type: ignore[misc]


#: The order built-ins run and appear in tables; third-party ones follow alphabetically.
BUILTIN_ORDER = ("megatron", "perseus", "nanobatch", "nanobatch-perseus", "envpipe",
                 "zeus-power-limit", "kareus")


def optimizer_names() -> list[str]:
    """Registered names, built-ins first in their canonical order."""
    names = list(registered_optimizers())
    return [n for n in BUILTIN_ORDER if n in names] + sorted(set(names) - set(BUILTIN_ORDER))


def load_optimizer(name: str) -> Optimizer:
    """Instantiate a registered optimizer; unknown names raise :class:`InputError` listing the
    registered ones."""
    eps = registered_optimizers()
    if name not in eps:
        raise InputError(f"unknown optimizer {name!r}; registered: {', '.join(optimizer_names())}")
    cls = eps[name].load()  # type: ignore[attr-defined]
    opt = cls()
    if not isinstance(opt, Optimizer):
        raise InputError(f"plugin {name!r} ({cls!r}) has no `name` and `optimize(problem)`")
    return opt
