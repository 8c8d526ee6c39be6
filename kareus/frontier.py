"""Pareto filtering, hypervolume and the comparison metrics — each defined once, here.

Metrics (``shared/method.md`` §7), all on measured points (time s, whole-cluster energy J):

- **Max throughput vs Megatron-LM**: a method's fastest point against Megatron's:
  time reduction ``100·(T_M − T)/T_M`` and energy reduction ``100·(E_M − E)/E_M`` (%).
- **Iso-time energy reduction** vs a reference frontier (Perseus): at the reference's fastest point
  ``(T_P, E_P)``, the lowest energy among the method's points with ``T ≤ T_P``:
  ``100·(E_P − E)/E_P``.
- **Iso-energy time reduction**: at the reference's lowest-energy point ``(T_P, E_P)``, the lowest
  time among the method's points with ``E ≤ E_P``: ``100·(T_P − T)/T_P``.

When no point of the method qualifies the metric is *not attainable* and reported as ``None``,
never as 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: Relative slack when comparing a time or energy with a reference (floating-point noise only).
_TOL = 1e-9


def pareto_indices(times: ArrayLike, energies: ArrayLike) -> NDArray[np.int64]:
    """Indices of the points no other point dominates (smaller-or-equal in both, smaller in one),
    sorted by time ascending; of exact duplicates the first is kept; a point with a non-finite
    time or energy is never kept."""
    t = np.asarray(times, dtype=np.float64)
    e = np.asarray(energies, dtype=np.float64)
    if t.shape != e.shape or t.ndim != 1:
        raise ValueError("times and energies must be 1-D arrays of equal length")
    finite = np.isfinite(t) & np.isfinite(e)
    order = np.lexsort((e, t))  # by time, then energy
    keep: list[int] = []
    best_e = np.inf
    for i in order:
        if finite[i] and e[i] < best_e:
            keep.append(int(i))
            best_e = e[i]
    return np.asarray(keep, dtype=np.int64)


def undominated(ref_times: ArrayLike, ref_energies: ArrayLike, times: ArrayLike,
                energies: ArrayLike, strict: bool = False) -> NDArray[np.bool_]:
    """Which points (``times`` s, ``energies`` J) no reference point dominates: a reference
    point dominates one that is no faster and no cheaper, so a point equal to a reference point
    counts as dominated (``strict``: one that is slower *and* costlier, lowtime's rule for an
    instruction's options, under which a tie on either axis survives). One boolean per point."""
    rt, re_ = np.asarray(ref_times, float), np.asarray(ref_energies, float)
    t, e = np.asarray(times, float), np.asarray(energies, float)
    if strict:
        beats = (rt[None, :] < t[:, None]) & (re_[None, :] < e[:, None])
    else:
        beats = (rt[None, :] <= t[:, None]) & (re_[None, :] <= e[:, None])
    return ~beats.any(axis=1)


def hypervolume(times: ArrayLike, energies: ArrayLike, ref_point: tuple[float, float]) -> float:
    """Area dominated by the points and bounded by ``ref_point`` (both objectives minimised),
    computed with pymoo's HV indicator."""
    from pymoo.indicators.hv import HV

    pts = np.column_stack([np.asarray(times, float), np.asarray(energies, float)])
    pts = pts[(pts[:, 0] < ref_point[0]) & (pts[:, 1] < ref_point[1])]
    if len(pts) == 0:
        return 0.0
    return float(HV(ref_point=np.asarray(ref_point, dtype=float))(pts))


def reduction_pct(reference: float, value: float) -> float:
    """``100·(reference − value)/reference`` (%): positive when ``value`` is smaller."""
    return 100.0 * (reference - value) / reference


def change_pct(reference: ArrayLike, value: ArrayLike) -> ArrayLike:
    """``100·(value/reference − 1)`` (%): the relative change (or error) of ``value`` against
    ``reference``, positive when ``value`` is larger; element-wise on arrays."""
    return 100.0 * (np.divide(value, reference) - 1.0)


def mape_pct(reference: ArrayLike, value: ArrayLike) -> float:
    """Mean absolute :func:`change_pct` of ``value`` against ``reference`` (%): the MAPE of a
    prediction ``value`` of measurements ``reference``; NaN when there are none."""
    err = np.abs(np.asarray(change_pct(reference, value), dtype=float))
    return float(err.mean()) if err.size else float("nan")


def fastest(times: ArrayLike, energies: ArrayLike) -> int:
    """Index of the fastest point (a non-finite time is no point); among points as fast within
    floating-point slack, the one with the least energy. :class:`ValueError` when no time is
    finite."""
    t, e = np.asarray(times, float), np.asarray(energies, float)
    finite = np.isfinite(t)
    if not finite.any():
        raise ValueError("no point with a finite time")
    least = t[finite].min()
    tied = np.flatnonzero(finite & (t <= least + abs(least) * _TOL))
    return int(tied[np.lexsort((t[tied], e[tied]))[0]])


def least_energy(times: ArrayLike, energies: ArrayLike) -> int:
    """Index of the least-energy point (a non-finite energy is no point); among points as
    frugal within floating-point slack, the fastest. :class:`ValueError` when no energy is
    finite."""
    if not np.isfinite(np.asarray(energies, float)).any():
        raise ValueError("no point with a finite energy")
    return fastest(energies, times)


def best_within(x: ArrayLike, y: ArrayLike, limit: float) -> int | None:
    """Index of the point with the least ``y`` among those with ``x`` no larger than ``limit``
    (within floating-point slack; ties: least ``x``; a non-finite ``y`` is no point), or
    ``None`` when none qualifies. With (x, y) = (time s, energy J): the least energy within a
    time budget; swapped, the fastest point within an energy budget."""
    xs, ys = np.asarray(x, float), np.asarray(y, float)
    ok = np.flatnonzero((xs <= limit + abs(limit) * _TOL) & np.isfinite(ys))
    if not ok.size:
        return None
    return int(ok[fastest(ys[ok], xs[ok])])


def _iso_reduction(ref_x: Sequence[float], ref_y: Sequence[float], x: Sequence[float],
                   y: Sequence[float], slack: float = 0.0) -> float | None:
    """At the reference point with the least ``x`` (ties: least ``y``), the reduction (%) of the
    least ``y`` among the method's points with ``x`` no larger (by more than the fraction
    ``slack``); ``None`` if there is none. With (x, y) = (time, energy) this is the iso-time
    energy reduction; swapped, iso-energy time."""
    rx, ry = np.asarray(ref_x, float), np.asarray(ref_y, float)
    ok = np.flatnonzero(np.isfinite(rx) & np.isfinite(ry))  # a reference point must be whole
    if not ok.size:
        return None
    i = ok[fastest(rx[ok], ry[ok])]
    x_ref, y_ref = float(rx[i]), float(ry[i])
    j = best_within(x, y, x_ref * (1 + slack))
    return None if j is None else reduction_pct(y_ref, float(np.asarray(y, float)[j]))


def iso_time_energy_reduction(ref_times: Sequence[float], ref_energies: Sequence[float],
                              times: Sequence[float], energies: Sequence[float],
                              time_slack: float = 0.0) -> float | None:
    """Iso-time energy reduction (%) of a method vs a reference frontier (see module docstring);
    ``None`` when no point of the method is as fast as the reference's fastest point.
    ``time_slack``: the method's points may be this fraction slower (0.01: within +1 %)."""
    return _iso_reduction(ref_times, ref_energies, times, energies, time_slack)


def iso_energy_time_reduction(ref_times: Sequence[float], ref_energies: Sequence[float],
                              times: Sequence[float], energies: Sequence[float]) -> float | None:
    """Iso-energy time reduction (%) of a method vs a reference frontier (see module docstring);
    ``None`` when no point of the method uses as little energy as the reference's lowest."""
    return _iso_reduction(ref_energies, ref_times, energies, times)


def even_indices(count: int, limit: int) -> list[int]:
    """At most ``limit`` (at least 2) of the indices ``0 .. count - 1``, evenly spread by
    position, both ends included, in order; all of them when ``count <= limit``. (By time
    instead: :func:`spread_indices`.)"""
    limit = max(limit, 2)
    if count <= limit:
        return list(range(count))
    return sorted({round(k * (count - 1) / (limit - 1)) for k in range(limit)})


def spread_indices(times: ArrayLike, count: int) -> NDArray[np.int64]:
    """Up to ``count`` indices of a time-sorted frontier spread evenly over its time range: the
    point nearest each of ``count`` evenly spaced times (the fastest and the slowest included;
    fewer when several targets share a nearest point)."""
    t = np.asarray(times, float)
    if t.size <= count:
        return np.arange(t.size)
    targets = np.linspace(t[0], t[-1], count)
    right = np.clip(np.searchsorted(t, targets), 1, t.size - 1)
    left = right - 1
    nearest = np.where(np.abs(t[left] - targets) <= np.abs(t[right] - targets), left, right)
    return np.unique(nearest).astype(np.int64)
