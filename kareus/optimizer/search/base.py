"""Per-partition multi-objective search: the space, the measuring evaluator, the result, and the
strategy interface.

A partition's knobs are (SM clock, communication SMs, launch/wait window). A search strategy decides which
configurations to measure; the :class:`Evaluator` measures them through the backend (simulator or
real GPUs) and counts every distinct configuration measured. The result keeps two Pareto fronts:
time vs dynamic energy (for partitions off the critical path) and time vs total energy, static
included (on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from kareus.backends.base import Backend
from kareus.energy import measured_energy
from kareus.errors import InputError
from kareus.frontier import hypervolume, pareto_indices
from kareus.graph import Partition


@dataclass(frozen=True)
class PartitionSpace:
    """The knob grid of one partition: clocks (MHz), communication SM counts (0: the collective
    library's kernel) and (launch, wait) windows, shape (W, 2)."""

    clocks_mhz: NDArray[np.float64]
    comm_sms: NDArray[np.int64]
    windows: NDArray[np.int64]

    def __post_init__(self) -> None:
        if np.ndim(self.clocks_mhz) != 1 or np.ndim(self.comm_sms) != 1 \
                or not (np.size(self.clocks_mhz) and np.size(self.comm_sms)):
            raise ValueError("a partition space's clocks and SM counts are non-empty 1-D arrays")
        if np.ndim(self.windows) != 2 or np.shape(self.windows)[1] != 2 \
                or not np.shape(self.windows)[0]:
            raise ValueError("a partition space's windows are (launch, wait) pairs, shape (W, 2); "
                             f"got shape {np.shape(self.windows)}")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.clocks_mhz.size, self.comm_sms.size, int(self.windows.shape[0]))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def all_indices(self) -> NDArray[np.int64]:
        """Every configuration as grid indices, shape (size, 3)."""
        return np.stack(np.unravel_index(np.arange(self.size), self.shape), axis=1)

    def flat(self, idx: NDArray[np.int64]) -> NDArray[np.int64]:
        """Flat index of (clock, sms, window) grid indices, shape (n,)."""
        return np.ravel_multi_index(tuple(np.asarray(idx).T), self.shape)


#: Default budget as a fraction of the space (at least :data:`MIN_DEFAULT_BUDGET` configurations).
DEFAULT_BUDGET_FRACTION = 0.15
MIN_DEFAULT_BUDGET = 20


def resolve_budget(space: PartitionSpace, budget: int | None, minimum: int, strategy: str) -> int:
    """The number of distinct configurations a sampling strategy may measure: ``budget`` (``None``:
    15 % of the space, at least 20), capped at the space size (a strategy given the whole space
    measures it at once). Raises :class:`InputError` when it is below ``minimum`` (and the space
    is larger than that)."""
    if budget is None:
        budget = max(MIN_DEFAULT_BUDGET, math.ceil(DEFAULT_BUDGET_FRACTION * space.size))
    budget = int(budget)
    if budget < min(minimum, space.size):
        raise InputError(f"{strategy} search needs a budget of at least {minimum} configurations "
                         f"(got {budget})")
    return min(budget, space.size)


@dataclass(frozen=True)
class SearchResult:
    """Configurations a search measured and the fronts they give.

    Attributes:
        key: Partition key.
        space: The searched space.
        idx: Grid indices of the measured configurations, shape (n, 3).
        time_s: Their partition times (s).
        dynamic_energy_j: Their dynamic energies per GPU (J).
        static_power_w: Static power per GPU (W), for the total-energy front.
        evaluations: Distinct configurations measured (the search's cost).
    """

    key: str
    space: PartitionSpace
    idx: NDArray[np.int64]
    time_s: NDArray[np.float64]
    dynamic_energy_j: NDArray[np.float64]
    static_power_w: float
    evaluations: int

    @property
    def total_energy_j(self) -> NDArray[np.float64]:
        """Per-GPU energy a meter reads: dynamic plus static over the partition's time (J)."""
        return measured_energy(self.dynamic_energy_j, self.static_power_w, self.time_s)

    def dynamic_front(self) -> NDArray[np.int64]:
        """Rows on the time vs dynamic-energy front, by time."""
        return pareto_indices(self.time_s, self.dynamic_energy_j)

    def total_front(self) -> NDArray[np.int64]:
        """Rows on the time vs total-energy front, by time."""
        return pareto_indices(self.time_s, self.total_energy_j)

    def hypervolume(self, ref: tuple[float, float], total: bool = True) -> float:
        """Hypervolume of the (time, total or dynamic energy) front under ``ref``."""
        e = self.total_energy_j if total else self.dynamic_energy_j
        return hypervolume(self.time_s, e, ref)


class Evaluator:
    """Measures partition configurations through a backend, counting distinct configurations.

    Args:
        backend: The backend to measure on.
        partition: The partition.
        space: Its knob grid.
    """

    def __init__(self, backend: Backend, partition: Partition, space: PartitionSpace) -> None:
        if space.size == 0:
            raise InputError(f"partition {partition.key}: the knob space is empty")
        self.backend = backend
        self.partition = partition
        self.space = space
        self._time: dict[int, float] = {}
        self._dyn: dict[int, float] = {}

    @property
    def evaluations(self) -> int:
        """Distinct configurations measured so far."""
        return len(self._time)

    def measure(self, idx: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Time (s) and dynamic energy (J) of configurations given as grid indices (n, 3)."""
        idx = np.atleast_2d(np.asarray(idx, dtype=np.int64))
        flat = self.space.flat(idx)
        todo = sorted({int(f) for f in flat} - set(self._time))
        if todo:
            # measure exactly the requested points: one backend call per (clock, SM count) with
            # the windows wanted there (a real GPU measures every configuration it is asked for)
            t_idx = np.stack(np.unravel_index(np.asarray(todo), self.space.shape), axis=1)
            for fi, ki in {(int(a), int(b)) for a, b, _ in t_idx}:
                ss = np.unique(t_idx[(t_idx[:, 0] == fi) & (t_idx[:, 1] == ki), 2])
                grid = self.backend.evaluate_partition(
                    self.partition, self.space.clocks_mhz[[fi]], self.space.comm_sms[[ki]],
                    self.space.windows[ss])
                for b, si in enumerate(ss):
                    f = int(self.space.flat(np.array([[fi, ki, si]]))[0])
                    self._time[f] = float(grid.time_s[0, 0, b])
                    self._dyn[f] = float(grid.dynamic_energy_j[0, 0, b])
        return (np.array([self._time[int(f)] for f in flat]),
                np.array([self._dyn[int(f)] for f in flat]))

    def measure_all(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The whole grid in one backend call, arrays of shape (F, K, S); counts every config."""
        s = self.space
        grid = self.backend.evaluate_partition(self.partition, s.clocks_mhz, s.comm_sms,
                                               s.windows)
        for f, (t, e) in enumerate(zip(grid.time_s.ravel(), grid.dynamic_energy_j.ravel())):
            self._time[f] = float(t)
            self._dyn[f] = float(e)
        return grid.time_s, grid.dynamic_energy_j

    def result(self) -> SearchResult:
        """Everything measured so far."""
        flat = np.array(sorted(self._time), dtype=np.int64)
        idx = np.stack(np.unravel_index(flat, self.space.shape), axis=1) if flat.size else \
            np.zeros((0, 3), dtype=np.int64)
        return SearchResult(
            key=self.partition.key, space=self.space, idx=idx,
            time_s=np.array([self._time[int(f)] for f in flat]),
            dynamic_energy_j=np.array([self._dyn[int(f)] for f in flat]),
            static_power_w=self.backend.gpu.static_power_w, evaluations=len(flat),
        )


@runtime_checkable
class PartitionSearch(Protocol):
    """A search strategy: measure configurations through ``evaluator`` within ``budget``
    (distinct configurations; ``None`` = no limit) and return what was measured."""

    name: str

    def search(self, evaluator: Evaluator, budget: int | None,
               rng: np.random.Generator) -> SearchResult:
        ...
