"""The timeline of one partition: host issue, compute stream and side-stream collective.

This is how the Kareus partition fuser executes a partition, and what the artifact's partition
sweep measured (``shared/kareus_artifact/attention_partition``):

- The **host** issues the compute ops in order; issuing op ``i`` takes ``host_s`` of CPU time.
  A partition starts with the GPU idle (the fuser synchronises at partition boundaries), so the
  GPU starts op ``i`` when it has been issued *and* op ``i - 1`` is done.
- The **collective** (the other nanobatch's communication, whose input is ready) is launched by the
  host just before it issues op ``s`` (``launch_s`` of host time), and runs on a side stream from
  then on, whatever the compute stream is doing.
- The **compute stream waits** for the collective right after op ``e``: op ``e + 1`` cannot start
  before the collective is done.
- Window ``(-1, -1)``: the collective runs alone before op 0 (no overlap).
- While a compute op runs beside the collective, the op takes its ``t_beside`` time (it lost the
  collective's SMs and shares HBM / L2) and the collective moves ``rate_beside`` bus bytes per
  second; in the compute stream's idle gaps the collective runs at its own ``rate``. When the
  collective finishes mid-op, the rest of the op runs at its ``t_alone`` speed.
- A collective launched while op ``s - 1`` still runs (the host ahead of the GPU) runs at its own
  rate and power until that op ends, and the op keeps its own speed: the tail's power is the two
  added, which no power cap sees (each phase table is capped on its own): an approximation.

Everything is vectorised over a grid of configurations (any common array shape): each op and the
collective carry per-configuration arrays; the loop runs over the partition's ops only.
Units: s, W, J, bus bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray


def partition_timeline(ops: Sequence[Mapping[str, object]], comm: Mapping[str, object] | None,
                       start: NDArray[np.int64], end: NDArray[np.int64], *, launch_s: float,
                       latency_s: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Time (s) and dynamic energy (J) of one partition per configuration.

    Args:
        ops: Per compute op, in program order: ``t_alone``, ``p_alone`` (time s and dynamic
            power W alone), ``host_s`` (host issue time, s) and, when there is a collective,
            ``t_beside``, ``p_beside`` (time and combined compute + collective power beside it)
            and ``rate_beside`` (the collective's bus B/s meanwhile).
        comm: ``bytes`` (bus bytes), ``rate`` and ``power`` of the collective alone; ``None``
            for a partition without one (the window is then ignored).
        start, end: The window ``(s, e)`` of every configuration; (-1, -1) is sequential.
        launch_s: Host time to launch the collective (s).
        latency_s: Fixed cost of the collective, charged as ``latency · rate`` extra bytes.
    """
    shape = np.broadcast_shapes(start.shape, *(np.shape(o["t_alone"]) for o in ops))
    host = np.zeros(shape)
    gpu = np.zeros(shape)
    energy = np.zeros(shape)
    if comm is None:
        for op in ops:
            host = host + float(op["host_s"])  # type: ignore[arg-type]
            gpu = np.maximum(host, gpu) + op["t_alone"]  # type: ignore[operator]
            energy = energy + op["p_alone"] * op["t_alone"]  # type: ignore[operator]
        return np.maximum(host, gpu), energy

    rate0 = np.asarray(comm["rate"])
    p0 = np.asarray(comm["power"])
    work = float(comm["bytes"]) + latency_s * rate0  # type: ignore[arg-type]
    seq = start < 0
    # Sequential: launch, run alone, and only then issue the compute.
    alone = work / rate0
    host = np.where(seq, launch_s + alone, 0.0)
    gpu = host.copy()
    energy = np.where(seq, p0 * alone, 0.0)

    remaining = np.zeros(shape)
    active = np.zeros(shape, dtype=bool)
    clock = np.zeros(shape)  # where the collective has got to (s)
    for i, op in enumerate(ops):
        launch = start == i
        if launch.any():
            host = host + np.where(launch, launch_s, 0.0)
            clock = np.where(launch, host, clock)
            remaining = np.where(launch, work, remaining)
            active = active | launch
        host = host + float(op["host_s"])  # type: ignore[arg-type]
        begin = np.maximum(host, gpu)
        if not active.any():  # no collective running anywhere: the op alone
            gpu = begin + op["t_alone"]  # type: ignore[operator]
            energy = energy + op["p_alone"] * op["t_alone"]  # type: ignore[operator]
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
        # The op, beside the collective while it lasts.
        t_a, p_a = op["t_alone"], op["p_alone"]
        t_b, p_b, r_b = op["t_beside"], op["p_beside"], op["rate_beside"]
        moved = r_b * t_b  # type: ignore[operator]
        done = active & (remaining <= moved)
        tau = remaining / r_b  # type: ignore[operator]
        rest = np.clip(1.0 - tau / t_b, 0.0, 1.0) * t_a  # type: ignore[operator]
        dur = np.where(active, np.where(done, tau + rest, t_b), t_a)
        energy = energy + np.where(active, np.where(done, p_b * tau + p_a * rest, p_b * t_b),
                                   p_a * t_a)  # type: ignore[operator]
        gpu = begin + dur
        clock = np.where(active, np.where(done, begin + tau, gpu), clock)
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
