"""The calibrated GPU simulator: the default backend.

Physics, per GPU (all laws and their parameters live in :class:`~kareus.hardware.presets.GPUPreset`):

- **Compute kernels.** A GEMM or attention kernel runs its thread blocks in waves over the SMs it
  may use: ``ceil(tiles / SMs)`` waves, each taking ``tile FLOPs / (FLOP/clk/SM · f · efficiency)``.
  Time scales with ``1/f``, and losing a few SMs to a collective can add a whole wave. Its HBM
  traffic takes ``bytes / (achievable bandwidth)``, independent of the SM clock; the kernel takes
  the longer of the two (roofline). Memory-bound kernels are therefore nearly flat in the clock,
  until the clock is so low that the SMs cannot issue loads fast enough.
- **Collectives** run on their own SMs: throughput ``min(link bandwidth · efficiency,
  SMs · clock · per-SM rate)`` over NCCL's bus bytes, plus a fixed latency.
- **Overlap.** Beside a running collective, compute has fewer SMs and shares HBM with the
  collective's traffic, and both suffer L2/memory-controller contention.
- **Power** = static + SM dynamic (``activity · busy SM share · f · V(f)²``, convex above the
  fitted V–f knee) + HBM dynamic (∝ achieved bandwidth) + link dynamic. Above the board power limit
  the card lowers its clock until the power fits (throttling), per kernel phase.
- **Energy.** Ops report dynamic energy only; static power is charged once per iteration by
  :func:`kareus.energy.iteration_energy` to every GPU for the whole iteration.

The hot path, one partition over its whole (clock, SMs, launch slot) grid, is vectorised with
numpy: a short loop over the partition's compute ops, each step on the full grid at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kareus.backends.base import InstructionCost, IterationResult, PartitionGrid
from kareus.energy import iteration_energy
from kareus.errors import PlanError
from kareus.graph import (
    CommOp,
    ComputeOp,
    Direction,
    Instruction,
    IterationGraph,
    Partition,
    Segment,
    schedule_times,
    topological_order,
)
from kareus.hardware.power import sm_power_scale
from kareus.hardware.presets import GPUPreset
from kareus.plan import InstructionPlan, IterationPlan, PartitionSchedule

#: Bytes one SM can stream per clock cycle (load + store issue limit) for memory-bound kernels
#: (assumed: 64 B/clk/SM; binds only at very low clocks).
_MEM_BYTES_PER_CLK_PER_SM = 64.0


@dataclass(frozen=True)
class _Phase:
    """Time (s), dynamic power (W) and the grid index of the clock actually run (after the power
    cap), at each requested-clock grid index."""

    time: NDArray[np.float64]
    power: NDArray[np.float64]
    runs_at: NDArray[np.int64]


class SimulatorBackend:
    """Simulated GPUs of one preset.

    Args:
        gpu: The GPU preset.
        power_limit_w: Board power limit (default: the preset's).

    Instances cache per-op tables; they hold no state beyond that cache.
    """

    name = "sim"

    def __init__(self, gpu: GPUPreset, power_limit_w: float | None = None) -> None:
        self.gpu = gpu
        self.power_limit_w = gpu.power_limit_w if power_limit_w is None else float(power_limit_w)
        self.grid = gpu.clock_grid()
        self._hz = self.grid * 1e6
        self._sm_scale = sm_power_scale(self.grid, gpu.clock_max_mhz, gpu.knee_mhz, gpu.v_ratio)
        self._cache: dict[tuple, object] = {}
        self._limited: dict[float, SimulatorBackend] = {}

    # ------------------------------------------------------------------ clocks and throttling
    def clock_index(self, clocks_mhz: NDArray[np.float64] | float) -> NDArray[np.int64]:
        """Grid indices of requested clocks (snapped down to the 15 MHz-style grid)."""
        c = np.atleast_1d(np.asarray(clocks_mhz, dtype=np.float64))
        g = self.gpu
        if np.any(c < g.clock_min_mhz - 1e-6) or np.any(c > g.clock_max_mhz + 1e-6) or np.any(
                ~np.isfinite(c)):
            raise PlanError(
                f"clock(s) {c[(c < g.clock_min_mhz) | (c > g.clock_max_mhz)][:3].tolist()} MHz "
                f"outside {g.name}'s {g.clock_min_mhz:.0f}-{g.clock_max_mhz:.0f} MHz"
            )
        return np.floor((c - g.clock_min_mhz) / g.clock_step_mhz + 1e-6).astype(np.int64)

    def _throttle(self, time: NDArray[np.float64], power: NDArray[np.float64]) -> _Phase:
        """Apply the power cap along the last (grid) axis: asking for grid clock ``j`` runs at
        the highest clock ``<= j`` whose static + dynamic power fits under the limit."""
        ok = self.gpu.static_power_w + power <= self.power_limit_w + 1e-9
        idx = np.broadcast_to(np.arange(self.grid.size), ok.shape)
        last_ok = np.maximum.accumulate(np.where(ok, idx, -1), axis=-1)  # highest fit <= j
        last_ok = np.where(last_ok < 0, 0, last_ok)
        return _Phase(np.take_along_axis(time, last_ok, axis=-1),
                      np.take_along_axis(power, last_ok, axis=-1), last_ok)

    # ------------------------------------------------------------------ kernel laws
    def _compute_raw(self, op: ComputeOp, sms: NDArray[np.float64], hbm_extra: NDArray | float,
                     contention: float) -> tuple[NDArray, NDArray]:
        """Unthrottled time and dynamic power of ``op`` on ``sms`` SMs (shape (A, 1)) at every grid
        clock (shape (1, G)); ``hbm_extra`` is the share of HBM bandwidth taken by a collective."""
        g = self.gpu
        hz = self._hz[None, :]
        bw = g.hbm_bw * g.hbm_efficiency * np.minimum(1.0, sms / (g.mem_sat_sm_fraction * g.sms))
        t_mem = op.bytes / bw * (1.0 + hbm_extra)
        if op.kind == "memory":
            t_issue = op.bytes / (_MEM_BYTES_PER_CLK_PER_SM * sms * hz)
            t_core = np.maximum(t_mem, t_issue)
            busy = np.broadcast_to(g.activity_memory, t_core.shape)
        else:
            eff = g.gemm_efficiency if op.kind == "gemm" else g.attention_efficiency
            act = g.activity_gemm if op.kind == "gemm" else g.activity_attention
            waves = np.ceil(op.tiles / sms)
            t_comp = waves * (op.flops / op.tiles) / (g.flops_per_clk_per_sm * hz * eff)
            t_core = np.maximum(t_comp, t_mem)
            compute_share = t_comp / t_core
            occupancy = op.tiles / (waves * sms)
            busy = act * occupancy * compute_share + g.activity_memory * (1 - compute_share)
        t = t_core * (1.0 + contention) + g.kernel_overhead_s
        sm_power = g.sm_dyn_power_w * self._sm_scale[None, :] * busy * (sms / g.sms)
        hbm_power = g.hbm_dyn_power_w * np.minimum(1.0, op.bytes / (t * g.hbm_bw))
        return t, sm_power + hbm_power

    def _comm_raw(self, comm: CommOp, sms: NDArray[np.float64], slowdown: float
                  ) -> tuple[NDArray, NDArray]:
        """Throughput (bus B/s) and dynamic power of ``comm`` on ``sms`` SMs (shape (K, 1))."""
        g = self.gpu
        link = g.nvlink_bw if comm.intra_node else g.network_bw
        rate = np.minimum(link * g.link_efficiency, sms * g.comm_bw_per_sm_mhz * self.grid[None, :])
        rate = rate / (1.0 + slowdown)
        power = (g.sm_dyn_power_w * self._sm_scale[None, :] * g.activity_comm * (sms / g.sms)
                 + g.hbm_dyn_power_w * np.minimum(1.0, g.comm_hbm_factor * rate / g.hbm_bw)
                 + g.link_dyn_power_w * rate / link)
        return rate, power

    # ------------------------------------------------------------------ single-kernel queries
    def kernel_time(self, op: ComputeOp, clock_mhz: float, sms: int) -> float:
        """Time (s) of ``op`` on ``sms`` SMs at a clock it actually runs at (no power cap)."""
        j = int(self.clock_index(clock_mhz)[0])
        t, _ = self._compute_raw(op, np.array([[float(sms)]]), 0.0, 0.0)
        return float(t[0, j])

    def collective_time(self, comm: CommOp, clock_mhz: float, sms: int) -> float:
        """Time (s) of ``comm`` alone on ``sms`` SMs (no power cap)."""
        j = int(self.clock_index(clock_mhz)[0])
        rate, _ = self._comm_raw(comm, np.array([[float(sms)]]), 0.0)
        return self.gpu.comm_latency_s + comm.bus_bytes / float(rate[0, j])

    def kernel_power(self, op: ComputeOp, clock_mhz: float) -> tuple[float, float]:
        """(effective clock MHz, total board power W) of ``op`` alone on all SMs when asked to
        run at ``clock_mhz``, the power cap applied."""
        j = int(self.clock_index(clock_mhz)[0])
        ph = self._alone(op)
        return float(self.grid[ph.runs_at[j]]), float(ph.power[j] + self.gpu.static_power_w)

    # ------------------------------------------------------------------ cached phase tables
    def _alone(self, op: ComputeOp) -> _Phase:
        """``op`` on all SMs, nothing beside it; indexed by requested grid clock."""
        key = ("alone", op)
        if key not in self._cache:
            t, p = self._compute_raw(op, np.array([[float(self.gpu.sms)]]), 0.0, 0.0)
            ph = self._throttle(t, p)
            self._cache[key] = _Phase(ph.time[0], ph.power[0], ph.runs_at[0])
        return self._cache[key]  # type: ignore[return-value]

    def _comm_alone(self, comm: CommOp, ks: tuple[int, ...]) -> tuple[_Phase, NDArray]:
        """Collective on ``ks`` SMs alone: (time of the whole collective, power), and its rate;
        arrays (K, G)."""
        key = ("comm", comm, ks)
        if key not in self._cache:
            sms = np.asarray(ks, dtype=np.float64)[:, None]
            rate, power = self._comm_raw(comm, sms, 0.0)
            t = self.gpu.comm_latency_s + comm.bus_bytes / rate
            ph = self._throttle(t, power)
            # rate at the throttled clock, recovered from the throttled time
            rate_eff = comm.bus_bytes / np.maximum(ph.time - self.gpu.comm_latency_s, 1e-30)
            self._cache[key] = (ph, rate_eff)
        return self._cache[key]  # type: ignore[return-value]

    def _overlapped(self, op: ComputeOp, comm: CommOp, ks: tuple[int, ...]
                    ) -> tuple[_Phase, NDArray]:
        """``op`` on ``sms - k`` SMs beside ``comm`` on ``k`` SMs, shape (K, G): the compute
        time, the combined dynamic power, and the collective's throughput meanwhile."""
        key = ("ov", op, comm, ks)
        if key not in self._cache:
            g = self.gpu
            k = np.asarray(ks, dtype=np.float64)[:, None]
            rate, p_comm = self._comm_raw(comm, k, g.overlap_slowdown)
            hbm_share = g.comm_hbm_factor * rate / (g.hbm_bw * g.hbm_efficiency)
            t, p_comp = self._compute_raw(op, g.sms - k, hbm_share, g.overlap_slowdown)
            ph = self._throttle(t, p_comp + p_comm)
            self._cache[key] = (ph, np.take_along_axis(rate, ph.runs_at, axis=-1))
        return self._cache[key]  # type: ignore[return-value]

    # ------------------------------------------------------------------ partitions
    def evaluate_partition(self, partition: Partition, clocks_mhz: NDArray[np.float64],
                           comm_sms: NDArray[np.int64], slots: NDArray[np.int64]
                           ) -> PartitionGrid:
        """Time and dynamic energy per GPU of ``partition`` on the (clock, SMs, slot) grid.

        The collective launches together with compute op ``slot`` and joins at the end of the
        partition: ops before the slot run on all SMs, ops after it on ``sms - k`` SMs until the
        collective finishes (mid-op if need be), then on all SMs again; a collective still running
        when the compute ends runs alone to completion.
        """
        fi = self.clock_index(clocks_mhz)
        ks = tuple(int(k) for k in np.atleast_1d(comm_sms))
        slot_arr = np.atleast_1d(np.asarray(slots, dtype=np.int64))
        n = len(partition.compute)
        if n == 0:
            raise PlanError(f"partition {partition.key} has no compute ops")
        if np.any(slot_arr < 0) or np.any(slot_arr >= n):
            raise PlanError(f"launch slot out of range 0..{n - 1} for partition {partition.key}")
        if partition.comm is not None and (min(ks) < 1 or max(ks) >= self.gpu.sms):
            raise PlanError(f"communication SMs must be in 1..{self.gpu.sms - 1}, got {ks}")
        shape = (fi.size, len(ks), slot_arr.size)
        t = np.zeros(shape)
        e = np.zeros(shape)
        if partition.comm is None:
            for op in partition.compute:
                a = self._alone(op)
                t += a.time[fi][:, None, None]
                e += (a.time * a.power)[fi][:, None, None]
        else:
            comm_alone, rate_alone = self._comm_alone(partition.comm, ks)
            rate_alone = rate_alone[:, fi].T[:, :, None]  # (F, K, 1)
            comm_power = comm_alone.power[:, fi].T[:, :, None]
            # latency expressed as bytes at the collective's own rate
            remaining = (partition.comm.bus_bytes
                         + self.gpu.comm_latency_s * rate_alone) * np.ones(shape)
            active = np.zeros(shape, dtype=bool)
            for i, op in enumerate(partition.compute):
                a = self._alone(op)
                t_a = a.time[fi][:, None, None]
                p_a = a.power[fi][:, None, None]
                ov, rate_ov = self._overlapped(op, partition.comm, ks)
                t_o = ov.time[:, fi].T[:, :, None]
                p_o = ov.power[:, fi].T[:, :, None]
                r_o = rate_ov[:, fi].T[:, :, None]
                active |= (slot_arr == i)[None, None, :] & (remaining > 0)
                moved = r_o * t_o
                done = active & (remaining <= moved)
                tau = remaining / r_o
                rest = np.clip(1.0 - tau / t_o, 0.0, 1.0) * t_a
                dt = np.where(active, np.where(done, tau + rest, t_o), t_a)
                de = np.where(active, np.where(done, p_o * tau + p_a * rest, p_o * t_o),
                              p_a * t_a)
                remaining = np.where(active, np.where(done, 0.0, remaining - moved), remaining)
                active &= ~done
                t += dt
                e += de
            tail = remaining / rate_alone
            t += tail
            e += comm_power * tail
        return PartitionGrid(
            key=partition.key, clocks_mhz=self.grid[fi], comm_sms=np.asarray(ks),
            slots=slot_arr, time_s=t, dynamic_energy_j=e,
        )

    # ------------------------------------------------------------------ instructions
    def _segment_cost(self, seg: Segment, f_idx: int, comm_sms: int) -> tuple[float, float]:
        """Compute ops on all SMs, then the collective alone (sequential execution)."""
        t = e = 0.0
        for op in seg.compute:
            a = self._alone(op)
            t += float(a.time[f_idx])
            e += float(a.time[f_idx] * a.power[f_idx])
        if seg.comm is not None and seg.comm.group > 1:
            ph, _ = self._comm_alone(seg.comm, (comm_sms,))
            t += float(ph.time[0, f_idx])
            e += float(ph.time[0, f_idx] * ph.power[0, f_idx])
        return t, e

    def _partition_cost(self, part: Partition, clock: float, sched: PartitionSchedule
                        ) -> tuple[float, float]:
        # keyed by identity (hashing a partition's ops is slow); the cached value keeps the
        # partition alive, so its id cannot be reused while the entry exists
        key = ("part", id(part), clock, sched)
        if key not in self._cache:
            grid = self.evaluate_partition(part, np.array([clock]), np.array([sched.comm_sms]),
                                           np.array([sched.launch_slot]))
            self._cache[key] = (float(grid.time_s.item()), float(grid.dynamic_energy_j.item()),
                                part)
        t, e, _ = self._cache[key]  # type: ignore[misc]
        return t, e

    def evaluate_instruction(self, graph: IterationGraph, key: tuple[int, Direction],
                             plan: InstructionPlan) -> InstructionCost:
        """Time and dynamic energy per GPU of one instruction of type ``key`` under ``plan``."""
        if key not in graph.instruction_graphs:
            raise PlanError(f"unknown instruction {key}; the graph has "
                            f"{sorted(graph.instruction_graphs)}")
        ig = graph.instruction_graphs[key]
        cache_key = ("ins", id(ig), plan)  # the cached entry keeps ``ig`` alive (see below)
        if cache_key in self._cache:
            return self._cache[cache_key][0]  # type: ignore[index]
        f_idx = int(self.clock_index(plan.clock_mhz)[0])
        default = self.gpu.comm_default_sms
        t = e = 0.0
        if plan.nanobatched and ig.partitions:
            scheds = plan.schedule_map()
            unknown = set(scheds) - {p.key for p in ig.partitions}
            if unknown:
                raise PlanError(f"unknown partition(s) {sorted(unknown)} for {ig.name}; valid: "
                                f"{', '.join(p.key for p in ig.partitions)}")
            for part in ig.partitions:
                s = scheds.get(part.key, PartitionSchedule(default, 0))
                pt, pe = self._partition_cost(part, plan.clock_mhz, s)
                t += pt * ig.layers
                e += pe * ig.layers
            # Boundary of the chain: the first partition has nothing to overlap yet, and the
            # last layer's final collective runs exposed after the compute.
            first = ig.partitions[0]
            if first.comm is not None:
                s = scheds.get(first.key, PartitionSchedule(default, 0))
                pt, pe = self._partition_cost(first, plan.clock_mhz, s)
                ct, ce = self._segment_cost(Segment(first.compute, None), f_idx, default)
                xt, xe = self._segment_cost(Segment((), first.comm), f_idx, s.comm_sms)
                t += ct + xt - pt
                e += ce + xe - pe
        else:
            for seg in ig.sequential:
                st, se = self._segment_cost(seg, f_idx, default)
                t += st * ig.layers
                e += se * ig.layers
        for seg in ig.extra:
            st, se = self._segment_cost(seg, f_idx, default)
            t += st
            e += se
        cost = InstructionCost(t, e)
        self._cache[cache_key] = (cost, ig)
        return cost

    # ------------------------------------------------------------------ iterations
    def p2p_time(self, graph: IterationGraph) -> float:
        """Time of one activation transfer between adjacent stages (s); GPUs wait at static power."""
        if graph.p2p is None:
            return 0.0
        g = self.gpu
        link = g.nvlink_bw if graph.p2p.intra_node else g.network_bw
        return g.comm_latency_s + graph.p2p.bytes / (link * g.link_efficiency)

    def evaluate_plan(self, graph: IterationGraph, plan: IterationPlan) -> IterationResult:
        """Execute one iteration: instruction costs, the 1F1B DAG, stage tails, energy."""
        if plan.power_limit_w is not None and plan.power_limit_w != self.power_limit_w:
            return self._with_limit(plan.power_limit_w).evaluate_plan(
                graph, IterationPlan(plan.instructions, None, plan.label, plan.meta))
        order = topological_order(graph.stages, graph.microbatches)
        missing = [ins for ins in order if ins not in plan.instructions]
        if missing:
            raise PlanError(f"plan has no entry for {len(missing)} instruction(s), e.g. {missing[0]}")
        durations: dict[Instruction, float] = {}
        dyn = {s: 0.0 for s in range(graph.stages)}
        for ins in order:
            cost = self.evaluate_instruction(graph, ins.type_key, plan.instructions[ins])
            durations[ins] = cost.time_s
            dyn[ins.stage] += cost.dynamic_energy_j
        times = schedule_times(graph.stages, graph.microbatches, durations,
                               self.p2p_time(graph))
        f_top = int(self.clock_index(self.gpu.clock_max_mhz)[0])
        ends = {}
        for s in range(graph.stages):
            last = max(end for ins, (_, end) in times.items() if ins.stage == s)
            tail_t = 0.0
            for seg in graph.stage_tail.get(s, ()):
                st, se = self._segment_cost(seg, f_top, self.gpu.comm_default_sms)
                tail_t += st
                dyn[s] += se
            ends[s] = last + tail_t
        iteration_time = max(ends.values())
        cluster_dyn = sum(dyn[s] * graph.gpus_per_stage for s in dyn)
        energy = iteration_energy(cluster_dyn, graph.num_gpus, self.gpu.static_power_w,
                                  iteration_time)
        per_gpu_static = iteration_energy(0.0, 1, self.gpu.static_power_w, iteration_time).static_j
        return IterationResult(
            energy=energy, num_gpus=graph.num_gpus, gpus_per_stage=graph.gpus_per_stage,
            per_gpu_dynamic_j=dict(dyn),
            per_gpu_energy_j={s: dyn[s] + per_gpu_static for s in dyn},
            instruction_times=times, model_flops=graph.model_flops,
        )

    def _with_limit(self, limit_w: float) -> "SimulatorBackend":
        if not math.isfinite(limit_w) or limit_w <= self.gpu.static_power_w:
            raise PlanError(f"power limit {limit_w} W must exceed the static power "
                            f"{self.gpu.static_power_w} W")
        if limit_w not in self._limited:
            self._limited[limit_w] = SimulatorBackend(self.gpu, limit_w)
        return self._limited[limit_w]
