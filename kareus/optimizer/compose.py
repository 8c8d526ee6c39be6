"""Composition: from per-partition fronts to execution options of pipeline instructions.

At one clock per instruction (the clock is locked per instruction), an instruction's time and
dynamic energy are the sums over its partitions (times its layers, plus non-partitioned ops): the
partitions run back to back and each one's (SMs, window) only affects itself. The Pareto set of such
a sum is contained in the sums of each partition's own Pareto points, so the instruction front is
built by merging partition fronts pairwise (a Minkowski sum), pruning to the Pareto set after each
merge. Every surviving combination is then measured as a whole instruction on the backend (which
also accounts for the chain's boundaries) and the sequential, no-overlap execution at the same
clock is added, so Kareus can always fall back to what Perseus does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from kareus.backends.base import Backend
from kareus.energy import measured_energy
from kareus.frontier import pareto_indices, spread_indices
from kareus.graph import Direction, IterationGraph, Partition
from kareus.methods.tradeoff import Option
from kareus.optimizer.search.base import SearchResult
from kareus.plan import LIBRARY_DEFAULT, InstructionPlan, PartitionSchedule

#: Cap on combinations kept per merge (spread over the front's time range). It binds on the
#: paper's jobs (most of gpt3-xl's merges give more); lifting it lowers Kareus's least energy only
#: slightly, at several times the run time.
MAX_COMBINATIONS = 200


def merge_fronts(a: tuple[NDArray, NDArray, NDArray], b: tuple[NDArray, NDArray, NDArray]
                 ) -> tuple[NDArray, NDArray, NDArray]:
    """Pareto set of the pairwise sums of two fronts.

    Each front is ``(time, energy, choices)`` with ``choices`` of shape (n, j): which option of
    each partition merged so far. Returns the merged front with choices of shape (m, j_a + j_b).
    """
    ta, ea, ca = a
    tb, eb, cb = b
    t = (ta[:, None] + tb[None, :]).ravel()
    e = (ea[:, None] + eb[None, :]).ravel()
    keep = pareto_indices(t, e)
    if keep.size > MAX_COMBINATIONS:
        keep = keep[spread_indices(t[keep], MAX_COMBINATIONS)]
    ia, ib = np.divmod(keep, tb.size)
    return t[keep], e[keep], np.concatenate([ca[ia], cb[ib]], axis=1)


def schedule_of(comm_sms: int, window: NDArray[np.int64]) -> PartitionSchedule:
    """The plan's schedule for a grid point: SM count (0: the library's kernel) and window."""
    return PartitionSchedule(None if comm_sms == LIBRARY_DEFAULT else comm_sms,
                             int(window[0]), int(window[1]))


def partition_front(result: SearchResult, clock_index: int) -> tuple[NDArray, NDArray, NDArray]:
    """Time vs dynamic-energy front of one partition at one clock: (time, energy, row index)."""
    rows = np.flatnonzero(result.idx[:, 0] == clock_index)
    if rows.size == 0:
        return np.zeros(0), np.zeros(0), np.zeros((0, 1), dtype=np.int64)
    keep = rows[pareto_indices(result.time_s[rows], result.dynamic_energy_j[rows])]
    return result.time_s[keep], result.dynamic_energy_j[keep], keep[:, None]


def nearest_measured_clock(result: SearchResult, clock_index: int) -> int | None:
    """The grid index of the clock nearest (in MHz) to ``clock_index``'s at which ``result``
    measured anything, ``clock_index`` itself when it did (ties: the lower clock); ``None`` when
    it measured nothing."""
    measured = np.unique(result.idx[:, 0])
    if measured.size == 0:
        return None
    clocks = np.asarray(result.space.clocks_mhz, dtype=np.float64)
    gap = np.abs(clocks[measured] - clocks[clock_index])
    return int(measured[np.lexsort((clocks[measured], gap))[0]])


def instruction_options(backend: Backend, graph: IterationGraph, key: tuple[int, Direction],
                        results: Mapping[Partition, SearchResult],
                        clocks_mhz: Sequence[float]) -> list[Option]:
    """Kareus execution options of instruction type ``key``: for every clock, the composed
    nanobatched schedules on the instruction's front, and the sequential execution. A partition
    a sampling search did not measure at a clock takes the schedules of its front at the nearest
    clock it did measure (the instruction is then evaluated at its own clock), so that no clock
    loses its overlapped options for one partition's gap."""
    ig = graph.instruction_graphs[key]
    static_w = backend.gpu.static_power_w
    plans: list[InstructionPlan] = []
    for clock in clocks_mhz:
        plans.append(InstructionPlan.make(clock, False))
        if not ig.partitions:
            continue
        merged: tuple[NDArray, NDArray, NDArray] | None = None
        for part in ig.partitions:
            res = results[part]
            fi = nearest_measured_clock(
                res, int(np.flatnonzero(np.isclose(res.space.clocks_mhz, clock))[0]))
            if fi is None:  # nothing measured for this partition
                merged = None
                break
            front = partition_front(res, fi)
            merged = front if merged is None else merge_fronts(merged, front)
        if merged is None:
            continue
        for choice in merged[2]:
            scheds = {}
            for part, row in zip(ig.partitions, choice):
                res = results[part]
                _, ki, wi = res.idx[row]
                scheds[part.key] = schedule_of(int(res.space.comm_sms[ki]),
                                               res.space.windows[wi])
            plans.append(InstructionPlan.make(clock, True, scheds))
    options, dynamic = [], []
    for plan in plans:
        cost = backend.evaluate_instruction(graph, key, plan)
        options.append(Option(cost.time_s, measured_energy(cost.dynamic_energy_j, static_w,
                                                           cost.time_s), plan))
        dynamic.append(cost.dynamic_energy_j)
    # keep what can matter to the time-cost tradeoff: the (time, dynamic energy) front
    keep = pareto_indices([o.time_s for o in options], dynamic)
    return [options[i] for i in keep]
