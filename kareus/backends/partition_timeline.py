"""The timeline of one partition: host issue, compute stream and side-stream collective.

This is how the Kareus partition fuser executes a partition, and what the artifact's partition
sweep measured (``shared/kareus_artifact/attention_partition``):

- The **host** issues the compute ops in order; issuing op ``i`` takes ``host_s`` of CPU time.
  A partition starts with the GPU idle (the fuser synchronises at partition boundaries), so the
  GPU starts op ``i`` when it has been issued *and* op ``i - 1`` is done.
- The **collective** (the other nanobatch's communication, whose input is ready) is launched by the
  host just before it issues op ``s`` (``launch_s`` of host time), and runs on a side stream from
  then on, whatever the compute stream is doing (unless a kernel holds every SM, below).
- The **compute stream waits** for the collective right after op ``e``: op ``e + 1`` cannot start
  before the collective is done.
- Window ``(-1, -1)``: the collective runs alone before op 0 (no overlap).
- While a compute op runs beside the collective, the op takes its ``t_beside`` time (it lost the
  collective's SMs and shares HBM / L2) and the collective moves ``rate_beside`` bus bytes per
  second; in the compute stream's idle gaps the collective runs at its own ``rate``. When the
  collective finishes mid-op, the rest of the op runs at its ``t_alone`` speed.
- The host never waits for the GPU inside a partition, so it usually runs ahead: a collective
  launched before op ``s`` often starts while op ``s - 1`` (or an earlier op) still runs, and is
  beside that op from then on: the op runs alone until the collective joins, then at its
  ``t_beside`` speed.
- A kernel of uniform tiles (a GEMM, non-causal attention) that gets the collective's SMs back
  mid-kernel loses ``partial_wave_loss`` of one of its waves (``wave_s``): its tiles run in
  lockstep waves, which go out of step, and the last one ends ragged. (Causal attention's tiles
  differ in work, so its blocks already end at scattered times: it has no ``wave_s``.)
- A kernel whose grid fills the GPU once (``resident_grid``: Transformer Engine's norms,
  PyTorch's dropout) holds every SM from its start: a collective launched while it runs starts
  when it ends. Beside a collective that was already running when it started, it takes its
  ``t_beside`` (the blocks that found no SM run in a second round); if the collective ends inside
  it, the rest runs at its ``t_alone`` pace, as for any op (an approximation: the first round,
  on more SMs, does more than its share of the work per second).

Everything is vectorised over a grid of configurations (any common array shape): each op and the
collective carry per-configuration arrays; the loop runs over the partition's ops only.
Units: s, W, J, bus bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: A per-configuration quantity: an array that broadcasts against the configuration grid, or one
#: value for every configuration.
PerConfig = NDArray[np.float64] | float


@dataclass(frozen=True)
class TimelineOp:
    """One compute op of a partition, per configuration.

    Attributes:
        t_alone: Time of the op alone on all SMs (s).
        p_alone: Its dynamic power alone (W).
        host_s: Host time to issue it (s), the same for every configuration.
        wave_s: Time of one of its waves alone (s); 0: not a kernel of uniform tiles (no wave
            to lose when the collective ends inside it).
        t_beside: Time of the op beside the collective (s); needed when the partition has one.
        p_beside: Combined dynamic power of the op and the collective beside it (W).
        rate_beside: The collective's throughput beside the op (bus B/s).
        resident_grid: The op's grid fills the GPU once (see the module docstring).
    """

    t_alone: PerConfig
    p_alone: PerConfig
    host_s: float
    wave_s: PerConfig = 0.0
    t_beside: PerConfig | None = None
    p_beside: PerConfig | None = None
    rate_beside: PerConfig | None = None
    resident_grid: bool = False


@dataclass(frozen=True)
class TimelineCollective:
    """The partition's collective running alone, per configuration.

    Attributes:
        bus_bytes: Bus bytes it moves (B).
        rate: Its throughput alone (bus B/s).
        power: Its dynamic power alone (W).
    """

    bus_bytes: float
    rate: PerConfig
    power: PerConfig


def partition_timeline(ops: Sequence[TimelineOp], comm: TimelineCollective | None,
                       start: NDArray[np.int64], end: NDArray[np.int64], *, launch_s: float,
                       latency_s: float | NDArray[np.float64], partial_wave_loss: float = 0.0
                       ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Time (s) and dynamic energy (J) of one partition per configuration.

    Args:
        ops: The compute ops, in program order; with a collective, each needs its ``t_beside``,
            ``p_beside`` and ``rate_beside`` (:class:`ValueError` otherwise).
        comm: The collective alone; ``None`` for a partition without one (the window is then
            ignored).
        start, end: The window ``(s, e)`` of every configuration; (-1, -1) is sequential.
        launch_s: Host time to launch the collective (s).
        latency_s: Fixed cost of the collective (s), charged as ``latency · rate`` extra bytes;
            an array broadcasts against the configurations (one per SM count, say).
        partial_wave_loss: Fraction of a wave a tiled kernel loses when the collective ends
            inside it.
    """
    shape = np.broadcast_shapes(start.shape, *(np.shape(o.t_alone) for o in ops))
    host = np.zeros(shape)
    gpu = np.zeros(shape)
    energy = np.zeros(shape)
    if comm is None:
        for op in ops:
            host = host + float(op.host_s)
            gpu = np.maximum(host, gpu) + op.t_alone
            energy = energy + op.p_alone * op.t_alone
        return np.maximum(host, gpu), energy

    rate0 = np.asarray(comm.rate)
    p0 = np.asarray(comm.power)
    work = float(comm.bus_bytes) + latency_s * rate0
    seq = start < 0
    # Sequential: launch, run alone, and only then issue the compute.
    alone = work / rate0
    host = np.where(seq, launch_s + alone, 0.0)
    gpu = host.copy()
    energy = np.where(seq, p0 * alone, 0.0)

    # The host never waits for the GPU inside a partition, so when it launches the collective
    # is known up front: after issuing ops 0..s-1 (and ``launch_s`` later). From then on the
    # collective runs beside whatever the compute stream is running, possibly op s-1 or earlier.
    issue = np.cumsum([0.0] + [float(op.host_s) for op in ops])
    launch_at = np.where(~seq, issue[np.clip(start, 0, len(ops))] + launch_s, np.inf)
    remaining = np.zeros(shape)
    active = np.zeros(shape, dtype=bool)
    started = seq.copy()
    clock = np.zeros(shape)  # where the collective has got to (s)
    host = host + np.where(start == 0, launch_s, 0.0)
    for i, op in enumerate(ops):
        host = host + float(op.host_s)
        begin = np.maximum(host, gpu)
        host = host + np.where(start == i + 1, launch_s, 0.0)
        t_a, p_a = op.t_alone, op.p_alone
        if op.resident_grid:  # launched while the op holds every SM: it starts when the op ends
            launch_at = np.where(~started & (launch_at > begin) & (launch_at < begin + t_a),
                                 begin + t_a, launch_at)
        # The collective starts before this op ends (in the idle gap before it, or during it).
        joins = ~started & (launch_at < begin + t_a)
        if joins.any():
            clock = np.where(joins, launch_at, clock)
            remaining = np.where(joins, work, remaining)
            active = active | joins
            started = started | joins
        if not active.any():  # no collective running anywhere: the op alone
            gpu = begin + t_a
            energy = energy + p_a * t_a
            wait = end == i
            if wait.any():
                gpu = np.where(wait, np.maximum(gpu, clock), gpu)
            continue
        # The collective runs alone while the compute stream waits for the host.
        gap = np.where(active, np.clip(begin - clock, 0.0, None), 0.0)
        moved = rate0 * gap
        done = active & (moved >= remaining)
        dt = np.where(done, remaining / rate0, gap)
        energy = energy + p0 * dt
        clock = np.where(active, clock + dt, clock)
        remaining = np.where(active, np.where(done, 0.0, remaining - moved), remaining)
        active = active & ~done
        # The op: alone until the collective joins (launched mid-op), then beside it while it
        # lasts, then alone again.
        t_b, p_b, r_b = op.t_beside, op.p_beside, op.rate_beside
        if t_b is None or p_b is None or r_b is None:
            raise ValueError(f"op {i} of a partition with a collective lacks its beside phase")
        first = np.where(active, np.clip((clock - begin) / t_a, 0.0, 1.0), 1.0)
        moved = r_b * (1.0 - first) * t_b
        done = active & (remaining <= moved)
        tau = np.where(done, remaining / r_b, (1.0 - first) * t_b)
        rest = np.clip(1.0 - first - tau / t_b, 0.0, 1.0) * t_a
        # A tiled kernel that gets the collective's SMs back mid-kernel loses part of a wave:
        # its waves go out of step and the last one ends ragged. (A step: a kernel with almost
        # nothing left loses as much, so a partition can take longer at a higher clock; the two
        # continuous forms tried fit the sweep's hold-out worse, docs/calibration.md.)
        rest = rest + np.where(done & (rest > 0), partial_wave_loss * op.wave_s, 0.0)
        dur = first * t_a + tau + rest
        energy = energy + p_a * (first * t_a + rest) + p_b * tau
        gpu = begin + dur
        clock = np.where(active, begin + first * t_a + tau, clock)
        remaining = np.where(active, np.where(done, 0.0, remaining - moved), remaining)
        active = active & ~done
        # The compute stream waits for the collective after op e.
        wait = end == i
        rest_t = np.where(wait & active, remaining / rate0, 0.0)
        energy = energy + p0 * rest_t
        clock = clock + rest_t
        remaining = np.where(wait, 0.0, remaining)
        active = active & ~wait
        gpu = np.where(wait, np.maximum(gpu, clock), gpu)
    return np.maximum(host, gpu), energy
