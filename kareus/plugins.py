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

import numpy as np

from kareus.backends.base import Backend
from kareus.errors import InputError
from kareus.graph import IterationGraph
from kareus.hardware.presets import GPUPreset
from kareus.plan import LIBRARY_DEFAULT, IterationPlan
from workloads.parallel import Workload

ENTRY_POINT_GROUP = "kareus.optimizers"


@dataclass(frozen=True)
class KnobSpace:
    """What optimizers may choose from.

    Attributes:
        clocks_mhz: Candidate locked SM clocks (MHz), ascending.
        comm_sms: Candidate SM counts of TP all-reduce kernels; 0
            (:data:`~kareus.plan.LIBRARY_DEFAULT`) is the collective library's own kernel.
        cp_comm_sms: Candidate SM counts of CP all-gather / reduce-scatter kernels (0 likewise).
        power_limits_w: Candidate board power limits (W), ascending (power-limit baselines).
    """

    clocks_mhz: tuple[float, ...]
    comm_sms: tuple[int, ...]
    cp_comm_sms: tuple[int, ...]
    power_limits_w: tuple[float, ...]

    @staticmethod
    def default(gpu: GPUPreset) -> "KnobSpace":
        """The Kareus paper's space scaled to ``gpu``: clocks from ~64 % of the maximum (A100:
        900 MHz) to the maximum in two hardware steps (30 MHz on A100); all-reduce SMs 3..30 step 3;
        CP collective SMs 1..20; both also the library's default kernel (0); power limits from
        ~1.6x static power to the default limit in 25 W steps. Every partition's (launch, wait)
        windows are searched (:func:`kareus.optimizer.partition_windows`)."""
        step = 2 * gpu.clock_step_mhz
        lo = gpu.clock_min_mhz + np.floor((0.64 * gpu.clock_max_mhz - gpu.clock_min_mhz) / step
                                          ) * step
        clocks = tuple(float(c) for c in np.arange(gpu.clock_max_mhz, lo - 1e-6, -step)[::-1])
        pl_lo = max(100.0, 25 * np.ceil(1.6 * gpu.static_power_w / 25))
        limits = tuple(float(x) for x in np.arange(pl_lo, gpu.power_limit_w + 1e-6, 25.0))
        cap = min(30, gpu.comm_max_sms)
        return KnobSpace(clocks_mhz=clocks, comm_sms=(LIBRARY_DEFAULT, *range(3, cap + 1, 3)),
                         cp_comm_sms=(LIBRARY_DEFAULT, *range(1, min(20, cap) + 1)),
                         power_limits_w=limits)

    def validate(self, gpu: GPUPreset) -> None:
        """Raise :class:`InputError` if the space is empty or does not fit ``gpu``."""
        for name in ("clocks_mhz", "comm_sms", "cp_comm_sms"):
            if not getattr(self, name):
                raise InputError(f"knob space: {name} is empty")
        lo, hi = min(self.clocks_mhz), max(self.clocks_mhz)
        if lo < gpu.clock_min_mhz or hi > gpu.clock_max_mhz:
            raise InputError(f"knob space: clocks {lo:.0f}-{hi:.0f} MHz outside {gpu.name}'s "
                             f"{gpu.clock_min_mhz:.0f}-{gpu.clock_max_mhz:.0f} MHz")
        sms = self.comm_sms + self.cp_comm_sms
        if min(sms) < 0 or max(sms) > gpu.comm_max_sms:
            raise InputError(f"knob space: communication SMs must be in 1..{gpu.comm_max_sms} "
                             f"on {gpu.name} (0: the library's kernel), got "
                             f"{min(sms)}..{max(sms)}")
        if self.power_limits_w and (min(self.power_limits_w) <= gpu.static_power_w):
            raise InputError("knob space: power limits must exceed the static power")


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
    """

    workload: Workload
    graph: IterationGraph
    backend: Backend
    gpu: GPUPreset
    knobs: KnobSpace
    seed: int = 0
    options: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Optimizer(Protocol):
    """The plugin protocol."""

    name: str

    def optimize(self, problem: Problem) -> Sequence[IterationPlan]:
        """Return the plans to evaluate (at least one)."""
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
