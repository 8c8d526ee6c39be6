"""NCCL's all-reduce inside one A100 node, measured, and the ring law the simulator fits to it.

vTrain's authors measured NCCL's all-reduce on the A100 node behind their validation runs
(nccl-tests ``all_reduce_perf``, fp32, 1 MiB to 1 GiB, 2 to 8 GPUs of one node) and ship the
tables as their simulator's lookup tables (the public repository ``VIA-Research/vTrain``, MIT
licence, commit f8dda847, ``trace/a100/AR_GPU<n>_1M_1024M_LUT``). :data:`VTRAIN_ALLREDUCE_US`
quotes the powers of two from 1 to 256 MiB of the groups of 2, 3, 4, 6 and 8 GPUs, each the mean
of the table's out-of-place and in-place times (they agree within 5 %). Nothing of vTrain's
iteration times is here; these are the collective alone.

The simulator prices a library collective inside a node as NCCL's ring does
(:meth:`~kareus.backends.sim.SimulatorBackend.comm_latency`,
:meth:`~kareus.backends.sim.SimulatorBackend.link_rate`):

    t = comm_latency_s + steps · comm_step_latency_s + bus_bytes / (link_efficiency · NVLink)

with ``steps = 2(n − 1)`` for an all-reduce of ``n`` ranks (its reduce-scatter and all-gather
halves each pass ``n − 1`` chunks round the ring) and NCCL's bus bytes ``2(n − 1)/n`` of the
message. :func:`fit_ring_law` fits the three values on some groups through the simulator itself,
and :func:`ring_law_errors` compares any preset's law with the measurement, so a fit on the groups
of 2, 4 and 8 GPUs can be held against those of 3 and 6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kareus.frontier import change_pct

if TYPE_CHECKING:
    from kareus.hardware.presets import GPUPreset

#: Message sizes of :data:`VTRAIN_ALLREDUCE_US` (bytes): 1 to 256 MiB.
SIZES_BYTES = tuple(2**k * 1048576 for k in range(9))
#: Measured all-reduce time (µs) by group size, one per :data:`SIZES_BYTES`, on vTrain's A100
#: node (see the module docstring).
VTRAIN_ALLREDUCE_US: dict[int, tuple[float, ...]] = {
    2: (44.66, 52.28, 60.72, 87.13, 130.65, 229.5, 404.35, 764.65, 1455.1),
    3: (63.7, 70.7, 78.72, 103.05, 153.1, 265.2, 499.65, 929.0, 1786.2),
    4: (52.07, 55.84, 76.56, 115.2, 178.7, 282.95, 542.2, 999.65, 1928.35),
    6: (73.33, 74.26, 81.33, 125.15, 201.05, 303.55, 563.0, 1120.8, 2116.35),
    8: (92.47, 93.11, 94.92, 132.05, 231.7, 356.9, 579.75, 1164.0, 2160.15),
}
#: The fields of the ring law and the bounds of their fit (s, s, fraction of NVLink).
RING_LAW_BOUNDS = {"comm_latency_s": (1e-6, 300e-6), "comm_step_latency_s": (0.0, 50e-6),
                   "link_efficiency": (0.2, 1.0)}
#: Where the fit starts.
RING_LAW_START = {"comm_latency_s": 25e-6, "comm_step_latency_s": 1e-6, "link_efficiency": 0.6}


@dataclass(frozen=True)
class RingLawFit:
    """A ring law fitted on some groups' measured all-reduces.

    Attributes:
        values: The fitted preset fields (:data:`RING_LAW_BOUNDS`): ``comm_latency_s`` (s),
            ``comm_step_latency_s`` (s per ring step), ``link_efficiency`` (of NVLink).
        groups: The group sizes fitted on.
    """

    values: dict[str, float]
    groups: tuple[int, ...]


def measured(groups: tuple[int, ...] | None = None) -> pd.DataFrame:
    """The measurement as rows ``group, bytes, measured_s`` (all groups unless ``groups``)."""
    rows = [(n, b, t * 1e-6) for n, ts in VTRAIN_ALLREDUCE_US.items()
            if groups is None or n in groups for b, t in zip(SIZES_BYTES, ts)]
    return pd.DataFrame(rows, columns=["group", "bytes", "measured_s"])


def simulated_s(preset: "GPUPreset", rows: pd.DataFrame) -> np.ndarray:
    """The simulator's time (s) of NCCL's all-reduce of each row's bytes over its group inside
    one node, at the top clock, on ``preset``."""
    from kareus.backends.sim import SimulatorBackend
    from kareus.graph import CommOp

    sim = SimulatorBackend(preset)
    return np.array([sim.collective_time(CommOp("all_reduce", "all_reduce", float(b), int(n)),
                                         preset.clock_max_mhz, None)
                     for n, b in zip(rows.group, rows.bytes)])


def ring_law_errors(preset: "GPUPreset", groups: tuple[int, ...] | None = None) -> pd.DataFrame:
    """The measurement (of ``groups``) with ``simulated_s`` on ``preset`` and ``error_pct``
    (simulated over measured, minus 1)."""
    rows = measured(groups)
    sim = simulated_s(preset, rows)
    return rows.assign(simulated_s=sim, error_pct=change_pct(rows.measured_s, sim))


def fit_ring_law(preset: "GPUPreset", groups: tuple[int, ...]) -> RingLawFit:
    """The ring law's three fields fitted on ``groups``' measured all-reduces: least squares of
    the log time ratios, through the simulator on ``preset`` (its NVLink bandwidth and NCCL
    channels).

    The link efficiency is bounded by the channels' own path at the top clock
    (``comm_default_sms · comm_bw_per_sm_mhz · clock_max_mhz`` of NVLink): above it the channels
    bind and the time has no gradient in it. Raises :class:`ValueError` for fewer than two
    groups (one cannot tell the fixed cost from the steps), a group without measurements, or a
    fit that does not converge."""
    from scipy.optimize import least_squares

    unknown = sorted(set(groups) - set(VTRAIN_ALLREDUCE_US))
    if unknown or len(set(groups)) < 2:
        raise ValueError(f"the ring law needs two or more of the measured groups "
                         f"{sorted(VTRAIN_ALLREDUCE_US)}; got {sorted(set(groups))}")
    rows = measured(groups)
    names = list(RING_LAW_BOUNDS)
    channels = (preset.comm_default_sms * preset.comm_bw_per_sm_mhz * preset.clock_max_mhz
                / preset.nvlink_bw)
    bounds = {**RING_LAW_BOUNDS, "link_efficiency": (RING_LAW_BOUNDS["link_efficiency"][0],
                                                     min(RING_LAW_BOUNDS["link_efficiency"][1],
                                                         channels))}
    lo = np.array([bounds[n][0] for n in names])
    hi = np.array([bounds[n][1] for n in names])
    if np.any(hi <= lo):
        raise ValueError(f"{preset.name}'s NCCL channels reach only {channels:.2f} of its link: "
                         "below the least link efficiency the fit allows")
    x0 = np.clip([RING_LAW_START[n] for n in names], lo, hi)

    def resid(x: np.ndarray) -> np.ndarray:
        p = preset.with_overrides(**dict(zip(names, map(float, x))))
        return np.log(simulated_s(p, rows) / rows.measured_s.to_numpy())

    res = least_squares(resid, x0, bounds=(lo, hi), x_scale="jac")
    if not res.success:
        raise ValueError(f"the ring law's fit on {sorted(set(groups))} did not converge: "
                         f"{res.message}")
    return RingLawFit(dict(zip(names, map(float, res.x))), tuple(groups))
