"""The calibrated GPU simulator: the default backend.

Physics, per GPU (every GPU's parameters live in :class:`~kareus.hardware.presets.GPUPreset`;
two assumed constants that no GPU here changes, an SM's streaming issue limit and split-K's
smallest slice, are this module's ``_MEM_BYTES_PER_CLK_PER_SM`` and ``_SPLIT_K_DEPTH``):

- **Compute kernels.** A GEMM or attention kernel runs its thread blocks in waves over the SMs it
  may use: ``ceil(tiles / SMs)`` waves, each taking ``tile FLOPs / (FLOP/clk/SM · f · efficiency)``.
  Time scales with ``1/f`` (beside a collective the waves are fluid: see Overlap). Its HBM
  traffic takes ``bytes / (achievable bandwidth)``, independent of the SM clock; the kernel takes
  the longer of the two (roofline). Memory-bound kernels are therefore nearly flat in the clock,
  until the clock is so low that the SMs cannot issue loads fast enough.
- **Collectives** run on their own SMs over their bus bytes, plus a fixed latency. The
  library's (NCCL) at ``min(link bandwidth · efficiency, channels · clock · per-channel rate)``;
  a tuned kernel (MSCCL++) at a pipelined soft minimum of its SM path (threads per block to the
  fitted block exponent) and ``tuned_link_fraction`` of the link (``_comm_raw``). Across nodes,
  the NICs' share and NCCL's ring or two-node tree (:meth:`SimulatorBackend.link_rate`).
- **Overlap.** Beside a running collective, compute has fewer SMs (each collective block takes a
  whole SM), shared fluidly (no whole waves: the collective holds them for part of the kernel
  only), and shares HBM with the collective's traffic, and both suffer L2/memory-controller
  contention.
- **Power** = static + SM dynamic (``activity · busy SM share · f · V(f)²``, convex above the
  fitted V–f knee) + HBM dynamic (∝ achieved bandwidth) + link dynamic. Above the board power limit
  the card lowers its clock until the power fits (throttling), per phase: each compute kernel alone,
  each kernel beside a collective, each collective alone. The power controller is taken to act
  within milliseconds, the length of the large GEMMs and attention kernels that exceed the limit at
  the top clock (assumed; the measured A100 frontiers support it, see docs/simulator.md), so those
  run throttled while the memory-bound kernels and collectives between them keep the requested
  clock.
- **Energy.** Ops report dynamic energy only; static power is charged once per iteration by
  :func:`kareus.energy.iteration_energy` to every GPU for the whole iteration.

The hot path, one partition over its whole (clock, SMs, launch slot) grid, is vectorised with
numpy: a short loop over the partition's compute ops, each step on the full grid at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from kareus.backends.base import InstructionCost, IterationResult, PartitionGrid
from kareus.energy import iteration_energy, static_energy
from kareus.errors import PlanError
from kareus.graph import (
    KERNEL_KINDS,
    CommOp,
    ComputeOp,
    Direction,
    GradBucket,
    Instruction,
    InstructionGraph,
    IterationGraph,
    Partition,
    Segment,
    ring_steps,
    schedule_times,
    sender_hold,
)
from kareus.backends.partition_timeline import (
    TimelineCollective,
    TimelineOp,
    partition_timeline,
)
from kareus.hardware.power import dynamic_power, sm_power_scale
from kareus.hardware.presets import GPUPreset
from kareus.plan import LIBRARY_DEFAULT, InstructionPlan, IterationPlan, PartitionSchedule

#: Bytes one SM can stream per clock cycle (load + store issue limit) for memory-bound kernels
#: (assumed: 64 B/clk/SM; binds only at very low clocks).
_MEM_BYTES_PER_CLK_PER_SM = 64.0
#: Smallest reduction slice a split-K GEMM gives one thread block (cuBLAS-like heuristic).
_SPLIT_K_DEPTH = 512

#: Per compute-op class: a tuned collective's throughput beside it (relative; beside a memory
#: kernel only its SM path slows, :meth:`SimulatorBackend._overlapped`), the op's extra slowdown
#: per unit of collective SMs / SMs, and the host time to issue it inside a partition.
_RATE_BESIDE = {"gemm": lambda g: g.comm_rate_beside_gemm,
                "attention": lambda g: g.comm_rate_beside_attention}
_SLOWDOWN_BESIDE = {"memory": lambda g: g.overlap_slowdown_memory,
                    "gemm": lambda g: g.overlap_slowdown_gemm,
                    "attention": lambda g: g.overlap_slowdown_attention}
_HOST_ISSUE = {"memory": lambda g: g.host_issue_memory_s,
               "gemm": lambda g: g.host_issue_gemm_s,
               "attention": lambda g: g.host_issue_attention_s}


@dataclass(frozen=True)
class _Phase:
    """Time (s) and dynamic power (W) at each requested grid clock, with the power cap applied:
    where the phase would exceed the board's limit, the values of the clock it throttles to
    (:meth:`SimulatorBackend.throttled_index`)."""

    time: NDArray[np.float64]
    power: NDArray[np.float64]


@dataclass(frozen=True)
class _KernelsBeside:
    """An instruction's kernels beside a collective, added up (:meth:`SimulatorBackend.
    _kernels_beside`).

    Attributes:
        time_alone_s: Their time alone (s).
        time_beside_s: Their time beside the collective (s).
        energy_alone_j: Their dynamic energy alone (J).
        energy_beside_j: Their and the collective's dynamic energy meanwhile (J).
        bus_bytes: Bus bytes the collective moves meanwhile (B).
    """

    time_alone_s: float
    time_beside_s: float
    energy_alone_j: float
    energy_beside_j: float
    bus_bytes: float

    @property
    def stretch(self) -> float:
        """Time beside over time alone (1 without kernels)."""
        return self.time_beside_s / self.time_alone_s if self.time_alone_s > 0 else 1.0

    @property
    def rate_beside(self) -> float:
        """The collective's mean throughput beside them (bus B/s)."""
        return self.bus_bytes / self.time_beside_s if self.time_beside_s > 0 else 0.0

    @property
    def extra_power_w(self) -> float:
        """Dynamic energy beside over alone, per second of the kernels alone (W)."""
        return ((self.energy_beside_j - self.energy_alone_j) / self.time_alone_s
                if self.time_alone_s > 0 else 0.0)


@dataclass(frozen=True)
class _PartitionCosts:
    """A partition under one schedule at every grid clock: time (s) and dynamic energy (J) per
    requested grid clock. Holds the partition itself, so the ``id`` that keys the entry cannot be
    reused while the entry exists."""

    time_s: list[float]
    dynamic_energy_j: list[float]
    partition: Partition


@dataclass(frozen=True)
class _InstructionEntry:
    """An instruction's cost under one plan; holds its graph, so the ``id`` that keys the entry
    (and the instruction's per-clock entries) cannot be reused while the entry exists."""

    cost: InstructionCost
    graph: InstructionGraph


@dataclass
class _Tables:
    """The simulator's memoised tables, one typed dictionary per kind. Entries are pure functions
    of their key and the simulator's preset and power limit: they only spare recomputation.

    Attributes:
        index: Grid index of a requested clock (MHz).
        alone_uncapped: A compute op on all SMs at every grid clock, no power limit.
        alone: The same with the power limit applied (throttled phases).
        comm_uncapped: A collective's (rate B/s, power W), (K, G), by (collective, SM counts,
            threads per block), no power limit.
        comm: The collective alone with the limit applied: (time and power, rate B/s).
        overlapped: A compute op beside a collective: (its time and the combined power, the
            collective's rate B/s), by (op, collective, SM counts, threads per block).
        beside: A compute op with the library's collective launched just before it (a segment's
            :attr:`~kareus.graph.Segment.comm_beside_last`): (time s, dynamic energy J) of the
            pair at every grid clock, by (op, collective).
        partition: Per-clock costs of a partition by (its ``id``, schedule).
        instruction: An instruction's cost by (its graph's ``id``, plan).
        instruction_at: (time s, dynamic energy J) of an instruction by (its graph's ``id``, plan,
            grid clock index), with the graph, which the entry keeps alive.
        issue: The host's issue queue through a sequential instruction, (host s, A s, B s) of
            :meth:`SimulatorBackend.issue_map`, by (its graph's ``id``, grid clock index); the
            entry keeps the graph alive, so its ``id`` is not reused while it exists.
    """

    index: dict[float, int] = field(default_factory=dict)
    alone_uncapped: dict[ComputeOp, _Phase] = field(default_factory=dict)
    alone: dict[ComputeOp, _Phase] = field(default_factory=dict)
    comm_uncapped: dict[tuple[CommOp, tuple[int, ...], int],
                        tuple[NDArray[np.float64], NDArray[np.float64]]] = \
        field(default_factory=dict)
    comm: dict[tuple[CommOp, tuple[int, ...], int], tuple[_Phase, NDArray[np.float64]]] = \
        field(default_factory=dict)
    overlapped: dict[tuple[ComputeOp, CommOp, tuple[int, ...], int],
                     tuple[_Phase, NDArray[np.float64]]] = field(default_factory=dict)
    beside: dict[tuple[ComputeOp, CommOp], tuple[NDArray[np.float64], NDArray[np.float64]]] = \
        field(default_factory=dict)
    partition: dict[tuple[int, PartitionSchedule], _PartitionCosts] = \
        field(default_factory=dict)
    instruction: dict[tuple[int, InstructionPlan], _InstructionEntry] = \
        field(default_factory=dict)
    instruction_at: dict[tuple[int, InstructionPlan, int],
                         tuple[tuple[float, float], InstructionGraph]] = field(default_factory=dict)
    issue: dict[tuple[int, int], tuple[tuple[float, float, float], InstructionGraph]] = \
        field(default_factory=dict)


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
        self._tables = _Tables()
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

    def _scalar_index(self, clock_mhz: float) -> int:
        """:meth:`clock_index` of one clock, memoised (the hot path asks for a handful of clocks
        thousands of times)."""
        table = self._tables.index
        if clock_mhz not in table:
            table[clock_mhz] = int(self.clock_index(clock_mhz)[0])
        return table[clock_mhz]

    def within_limit(self, dynamic_w: NDArray[np.float64]) -> NDArray[np.bool_]:
        """Whether a phase drawing ``dynamic_w`` (W) keeps the board's power, static included,
        within its limit."""
        return self.gpu.static_power_w + np.asarray(dynamic_w, dtype=np.float64) \
            <= self.power_limit_w + 1e-9

    def throttled_index(self, dynamic_w: NDArray[np.float64]) -> NDArray[np.int64]:
        """Per requested grid clock (last axis of ``dynamic_w``, a phase's dynamic power in W at
        every grid clock): the index of the clock the phase actually runs at, the highest grid
        clock not above the requested one at which the board's power (static included) fits the
        limit; the lowest clock where none does."""
        return self._fitting_index(self.within_limit(dynamic_w))

    @staticmethod
    def _fitting_index(fits: NDArray[np.bool_]) -> NDArray[np.int64]:
        """:meth:`throttled_index` from the phase's per-clock fit test."""
        idx = np.maximum.accumulate(np.where(fits, np.arange(fits.shape[-1]), -1), axis=-1)
        return np.maximum(idx, 0)

    def _throttled(self, time: NDArray[np.float64], power: NDArray[np.float64],
                   *others: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
        """``time``, ``power`` and ``others`` (same shape, clock on the last axis) at the clock
        each requested clock throttles to."""
        fits = self.within_limit(power)
        if fits.all():  # most phases (memory-bound kernels, collectives)
            return (time, power, *others)
        j = self._fitting_index(fits)
        return tuple(np.take_along_axis(a, j, axis=-1) for a in (time, power, *others))

    # ------------------------------------------------------------------ kernel laws
    def _compute_raw(self, op: ComputeOp, sms: NDArray[np.float64], hbm_extra: NDArray | float,
                     contention: NDArray | float, beside: bool = False) -> tuple[NDArray, NDArray]:
        """Unthrottled time and dynamic power of ``op`` on ``sms`` SMs (shape (A, 1)) at every grid
        clock (shape (1, G)); ``hbm_extra`` is the share of HBM bandwidth taken by a collective,
        ``contention`` the extra slowdown beside it, and ``beside`` whether the SMs are shared
        with a collective (fluid waves) rather than the kernel's own (whole waves)."""
        g = self.gpu
        hz = self._hz[None, :]
        bw = g.hbm_bw * g.hbm_efficiency * np.minimum(1.0, sms / (g.mem_sat_sm_fraction * g.sms))
        t_mem = op.bytes / bw * (1.0 + hbm_extra)
        mem_activity = g.activity_memory * g.hbm_efficiency / g.reference_hbm_efficiency
        if op.kind == "memory":
            t_issue = op.bytes / (_MEM_BYTES_PER_CLK_PER_SM * sms * hz)
            t_core = np.maximum(t_mem, t_issue)
            busy = np.broadcast_to(mem_activity, t_core.shape)
        else:
            tiles = self._tiles(op, sms)
            if op.kind == "gemm":
                nominal = g.gemm_efficiency
                # a split-K thread block runs its slice of the reduction, with a whole tile's
                # prologue and epilogue
                depth = op.depth * op.tiles / tiles if op.depth else 0.0
                eff = nominal * (depth / (depth + g.gemm_depth_half) if op.depth else 1.0)
                act = g.activity_gemm
            else:
                nominal = g.attention_bwd_efficiency if op.backward else g.attention_efficiency
                eff, act = nominal, g.activity_attention
            waves = self.waves(op, sms, beside)
            t_comp = waves * (op.flops / tiles) / (g.flops_per_clk(op.precision) * hz * eff)
            t_core = np.maximum(t_comp, t_mem)
            compute_share = t_comp / t_core
            occupancy = tiles / (waves * sms)
            # switching activity follows the throughput achieved (the same energy per FLOP or
            # byte, spread over more time): shallow GEMMs and slow kernels stall more
            reference = g.reference_gemm_efficiency if op.kind == "gemm" \
                else g.reference_attention_efficiency
            busy = act * (eff / reference) * occupancy * compute_share \
                + mem_activity * (1 - compute_share)
        t = t_core * (1.0 + contention) + g.kernel_overhead_s
        # contention stalls the SMs: the same switching spread over the longer time
        sm_busy = busy * (sms / g.sms) / (1.0 + contention)
        return t, dynamic_power(g, self._sm_scale[None, :], sm_busy,
                                np.minimum(1.0, op.bytes / (t * g.hbm_bw)))

    def _comm_raw(self, comm: CommOp, sms: NDArray[np.float64], threads: int
                  ) -> tuple[NDArray, NDArray]:
        """Throughput (bus B/s) and dynamic power of ``comm`` alone at every grid clock.

        ``sms`` (shape (K, 1)) holds SM counts of tuned kernels, or :data:`LIBRARY_DEFAULT` for
        the collective library's kernel. A library collective (NCCL) moves ``min(link ·
        efficiency, channels · clock · per-channel rate)``. A tuned kernel is bounded by its SMs'
        path (SMs · clock · per-SM rate, the per-SM rate scaled by its threads per block) and its
        link path (``tuned_link_fraction`` of the link); a chunked pipeline combines the two as a
        soft minimum, ``(sm_path^-p + link_path^-p)^(-1/p)`` with ``p = tuned_pipelining``
        (``p = 1``: the two times add, store and forward).
        """
        g = self.gpu
        f = self.grid[None, :]
        link = self.link_bw(comm)
        library = sms == LIBRARY_DEFAULT
        channels = np.where(library, g.comm_default_sms, sms)
        lib_rate = np.minimum(self.link_rate(comm), channels * g.comm_bw_per_sm_mhz * f)
        rate = np.where(library, lib_rate, self._tuned_rate(comm, sms, threads))
        activity = np.where(library, g.library_activity_comm, g.activity_comm)
        return rate, dynamic_power(g, self._sm_scale[None, :], activity * (channels / g.sms),
                                   np.minimum(1.0, g.comm_hbm_factor * rate / g.hbm_bw),
                                   np.minimum(1.0, rate / link))

    def _tuned_rate(self, comm: CommOp, sms: NDArray[np.float64], threads: int,
                    sm_share: NDArray | float = 1.0) -> NDArray:
        """A tuned collective's throughput (bus B/s) on ``sms`` SMs (shape (K, 1)) at every grid
        clock: the soft minimum ``(sm_path^-p + link_path^-p)^(-1/p)`` of its SM path (SMs ·
        clock · per-SM rate, times ``sm_share``) and its link path (``tuned_link_fraction`` of
        the link), ``p = tuned_pipelining`` (see :meth:`_comm_raw`)."""
        g = self.gpu
        per_sm = g.tuned_bw_per_sm_mhz * (threads / g.comm_block_default) ** g.tuned_block_exponent
        link_path = g.tuned_link_fraction * self.link_bw(comm)
        sm_path = np.maximum(sms, 1) * per_sm * self.grid[None, :] * sm_share
        # written as lo · (1 + (lo/hi)^p)^(-1/p) so that no power of a bandwidth under- or
        # overflows
        lo, hi = np.minimum(sm_path, link_path), np.maximum(sm_path, link_path)
        ratio = np.divide(lo, hi, out=np.zeros(np.broadcast(lo, hi).shape), where=hi > 0)
        return lo * (1.0 + ratio ** g.tuned_pipelining) ** (-1.0 / g.tuned_pipelining)

    def link_bw(self, comm: CommOp) -> float:
        """Raw bandwidth per direction (B/s) of the links a collective's ring uses on one GPU:
        the intra-node link, or, across nodes, the NICs of the group's ranks on one node (one
        NIC per GPU; the node's other NICs serve the other groups)."""
        g = self.gpu
        if comm.intra_node:
            return g.nvlink_bw
        return min(g.nvlink_bw, comm.ranks_per_node * g.network_bw)

    def link_rate(self, comm: CommOp) -> float:
        """Bus bandwidth (B/s) a library collective reaches at most on its links: NCCL's rings
        inside a node at ``link_efficiency`` of the link; across nodes the slower of the NVLink
        hops and the NICs at ``network_efficiency``.

        An all-reduce over two nodes with several ranks on each runs NCCL's tree where that is
        faster (NCCL's maintainers, NVIDIA/nccl#946 and #320): reduced inside each node first, it
        sends each byte across the network once each way instead of the ring's ``2(n-1)/n``
        times, while the chain inside the node carries twice the data. Its algorithm bandwidth
        is the slower of the NICs and half the NVLink rate, in bus bytes ``2(n-1)/n`` of that.
        """
        g = self.gpu
        nvlink = g.nvlink_bw * g.link_efficiency
        if comm.intra_node:
            return nvlink
        network = comm.ranks_per_node * g.network_bw * g.network_efficiency
        ring = min(nvlink, network)
        if comm.collective != "all_reduce" or comm.nodes != 2 or comm.ranks_per_node < 2:
            return ring
        tree = min(network, nvlink / 2.0) * comm.bus_bytes / comm.bytes
        return max(ring, tree)

    def comm_latency(self, comm: CommOp, library: bool = True) -> float:
        """Fixed time of one collective (s), after NCCL's tuning model: the launch and
        synchronisation (``comm_latency_s`` for the library's kernel, ``library``;
        ``tuned_latency_s`` for a tuned one), plus each step of the algorithm, at
        ``comm_step_latency_s`` inside a node and ``network_hop_latency_s`` across nodes.

        NCCL's ring over the group's ``n`` ranks on ``N`` nodes takes :func:`ring_steps` of
        ``n`` steps, :func:`ring_steps` of ``N`` of them across the network; its tree, for an
        all-reduce across nodes, ``2(r - 1)`` steps inside the nodes (``r`` ranks each) and
        ``2·floor(log2 N)`` across (NCCL's ``log2i``: a binary tree of ``N`` nodes is that
        deep); the fewer count (:meth:`link_rate` picks the bandwidth on its own: the ring's, or
        the two-node tree's where faster). A tuned kernel reads its peers directly and pays no
        steps inside a node."""
        g = self.gpu
        fixed = g.comm_latency_s if library else g.tuned_latency_s
        intra = g.comm_step_latency_s if library else 0.0
        if comm.intra_node or comm.nodes <= 1:
            return fixed + ring_steps(comm.collective, comm.group) * intra
        n, nodes = comm.group, comm.nodes
        across = ring_steps(comm.collective, nodes)
        ring = (ring_steps(comm.collective, n) - across) * intra + across * g.network_hop_latency_s
        if comm.collective != "all_reduce":
            return fixed + ring
        depth = int(nodes).bit_length() - 1
        tree = (2 * (comm.ranks_per_node - 1) * intra
                + 2 * depth * g.network_hop_latency_s)
        return fixed + min(ring, tree)

    def _comm_latencies(self, comm: CommOp, ks: tuple[int, ...]) -> NDArray[np.float64]:
        """:meth:`comm_latency` of ``comm`` on each of ``ks`` (tuned kernels' block counts, or
        :data:`LIBRARY_DEFAULT` for the library's kernel), (K, 1)."""
        k = np.asarray(ks, dtype=np.float64)[:, None]
        return np.where(k == LIBRARY_DEFAULT, self.comm_latency(comm),
                        self.comm_latency(comm, library=False))

    def _comm_sms(self, ks: tuple[int, ...]) -> NDArray[np.float64]:
        """SMs the collectives of ``ks`` (tuned kernels' block counts; the library's: its
        channels) take from compute beside them, (K, 1).

        Every block takes a whole SM, whatever its size: the GEMM and attention blocks beside it
        (hundreds of registers per thread, large shared-memory tiles) leave no room for a second
        resident block, and the collective's kernels hold their blocks together (MSCCL++'s
        all-reduce is built for 1024 threads x 64 registers and waits on a grid-wide barrier).
        The artifact's sweep shows it: past each window's fastest SM count an SM costs the
        partition the same with 512- as with 1024-thread blocks (``floor_slope``'s ``by_block``).
        """
        k = np.asarray(ks, dtype=np.float64)[:, None]
        return np.where(k == LIBRARY_DEFAULT, float(self.gpu.comm_default_sms), k)

    def _tiles(self, op: ComputeOp, sms: NDArray[np.float64] | float) -> NDArray | float:
        """Thread blocks a tiled kernel runs on ``sms`` SMs: its output tiles, times the split-K
        factor of a GEMM with too few output tiles to fill the SMs."""
        tiles: NDArray[np.float64] | float = float(op.tiles)
        if op.kind == "gemm" and op.depth:
            tiles = tiles * np.clip(np.floor(np.asarray(sms) / tiles), 1.0,
                                    max(1.0, op.depth // _SPLIT_K_DEPTH))
        return tiles

    def waves(self, op: ComputeOp, sms: NDArray[np.float64] | float, beside: bool = False
              ) -> NDArray | float:
        """Time of a tiled kernel on ``sms`` SMs, in waves of its average tile (one tile per SM
        at a time); ``beside``: a collective holds the SMs the kernel lacks for part of it.

        - Uneven tiles dispatched in grid order (causal attention, ``op.uneven_tail``): the SMs
          stay busy until the grid is dispatched, then its heavy last tiles end the tail later:
          ``tiles / SMs + uneven_tail``, with or without a collective.
        - Uniform tiles (GEMMs) on their own SMs run in lockstep: ``ceil(tiles / SMs)``.
        - Uniform tiles beside a collective share the SMs fluidly: the collective holds its SMs
          for only part of the kernel and the block scheduler hands tiles to whichever SMs are
          free. Only the last wave's tail, at the SM count the kernel ends on (all of them), is
          quantised: ``tiles / SMs`` plus that tail.
        """
        tiles = self._tiles(op, sms)
        if op.uneven_tail is not None:
            return tiles / sms + op.uneven_tail
        if beside:
            full = self._tiles(op, float(self.gpu.sms))
            return tiles / sms + (np.ceil(full / self.gpu.sms) - full / self.gpu.sms)
        return np.ceil(tiles / sms)

    def _wave_s(self, op: ComputeOp, time_alone_s: NDArray) -> NDArray | float:
        """Time (s) of one of ``op``'s waves alone on every SM, from its time alone
        (:attr:`~kareus.backends.partition_timeline.TimelineOp.wave_s`); 0 where it has no
        waves to put out of step. Only a kernel of uniform tiles (a GEMM, non-causal attention)
        loses part of one when a collective's SMs return mid-kernel: its tiles run in lockstep
        and the last wave ends ragged. Causal attention's tiles differ in work (the mask,
        ``uneven_tail``): its blocks already end at scattered times, and a returning SM just
        takes the next one; memory-bound kernels have no tiles."""
        if op.kind == "memory" or op.uneven_tail is not None:
            return 0.0
        return time_alone_s / self.waves(op, float(self.gpu.sms))

    # ------------------------------------------------------------------ single-kernel queries
    def kernel_time(self, op: ComputeOp, clock_mhz: float, sms: int) -> float:
        """Time (s) of ``op`` on ``sms`` SMs at a clock it actually runs at (no power cap)."""
        j = int(self.clock_index(clock_mhz)[0])
        t, _ = self._compute_raw(op, np.array([[float(sms)]]), 0.0, 0.0)
        return float(t[0, j])

    def kernel_dynamic_power(self, op: ComputeOp, clock_mhz: float) -> float:
        """Dynamic power (W) of ``op`` on all SMs, back to back, at a clock it actually runs at
        (no power cap): the power that goes with :meth:`kernel_time` there."""
        j = int(self.clock_index(clock_mhz)[0])
        return float(self._alone_uncapped(op).power[j])

    def collective_time(self, comm: CommOp, clock_mhz: float, sms: int | None,
                        threads: int | None = None) -> float:
        """Time (s) of ``comm`` alone on ``sms`` SMs (``None``: the library's kernel; no cap)."""
        j = int(self.clock_index(clock_mhz)[0])
        k = LIBRARY_DEFAULT if sms is None else sms
        rate, _ = self._comm_raw(comm, np.array([[float(k)]]),
                                 threads or self.gpu.comm_block_default)
        latency = self.comm_latency(comm, library=k == LIBRARY_DEFAULT)
        return latency + comm.bus_bytes / float(rate[0, j])

    def kernel_power(self, op: ComputeOp, clock_mhz: float) -> tuple[float, float]:
        """(effective clock MHz, total board power W) of ``op`` running alone, back to back, on
        all SMs when asked to run at ``clock_mhz``: the highest clock not above it whose power
        fits under the limit."""
        j = int(self.clock_index(clock_mhz)[0])
        k = int(self.throttled_index(self._alone_uncapped(op).power)[j])
        return float(self.grid[k]), float(self._alone(op).power[j] + self.gpu.static_power_w)

    # ------------------------------------------------------------------ cached phase tables
    def _alone_uncapped(self, op: ComputeOp) -> _Phase:
        """``op`` on all SMs, nothing beside it, at each grid clock as if no limit applied."""
        table = self._tables.alone_uncapped
        if op not in table:
            t, p = self._compute_raw(op, np.array([[float(self.gpu.sms)]]), 0.0, 0.0)
            table[op] = _Phase(t[0], p[0])
        return table[op]

    def _alone(self, op: ComputeOp) -> _Phase:
        """``op`` on all SMs, nothing beside it; indexed by requested grid clock."""
        table = self._tables.alone
        if op not in table:
            raw = self._alone_uncapped(op)
            table[op] = _Phase(*self._throttled(raw.time, raw.power))
        return table[op]

    def _comm_uncapped(self, comm: CommOp, ks: tuple[int, ...], threads: int
                       ) -> tuple[NDArray, NDArray]:
        """:meth:`_comm_raw` of ``ks`` SMs (rate and power, (K, G)), cached."""
        table, key = self._tables.comm_uncapped, (comm, ks, threads)
        if key not in table:
            table[key] = self._comm_raw(comm, np.asarray(ks, dtype=np.float64)[:, None], threads)
        return table[key]

    def _comm_alone(self, comm: CommOp, ks: tuple[int, ...], threads: int
                    ) -> tuple[_Phase, NDArray]:
        """Collective on ``ks`` SMs alone: (time of the whole collective, power), and its rate;
        arrays (K, G), indexed by requested grid clock."""
        table, key = self._tables.comm, (comm, ks, threads)
        if key not in table:
            rate, power = self._comm_uncapped(comm, ks, threads)
            t = self._comm_latencies(comm, ks) + comm.bus_bytes / rate
            t, power, rate = self._throttled(t, power, rate)
            table[key] = (_Phase(t, power), rate)
        return table[key]

    def _overlapped(self, op: ComputeOp, comm: CommOp, ks: tuple[int, ...], threads: int
                    ) -> tuple[_Phase, NDArray]:
        """``op`` on the SMs the collective leaves, beside ``comm``, shape (K, G): the compute
        time, the combined dynamic power, and the collective's throughput meanwhile.

        Beside a memory-bound kernel a tuned collective's SM path slows to
        ``comm_rate_beside_memory`` of itself (its latency-bound loads queue behind the kernel's
        in the memory system) and its link path does not: on few SMs it runs at that share of its
        speed alone, on many, where the link bounds it, nearly at its speed alone. Beside a GEMM
        or attention kernel its throughput is ``comm_rate_beside_<class>`` of alone, and at most
        ``tuned_link_fraction_beside_compute`` of its link: its remote loads are served by the
        peer GPU's memory system, which the peer's own compute keeps busy. A kernel whose grid
        fills the GPU once (:attr:`ComputeOp.resident_grid`) runs in two rounds: its blocks on
        the SMs the collective left, then, with the same work each, the blocks that found no SM.
        """
        table, key = self._tables.overlapped, (op, comm, ks, threads)
        if key not in table:
            g = self.gpu
            k = self._comm_sms(ks)
            kk = np.asarray(ks, dtype=np.float64)[:, None]
            library = kk == LIBRARY_DEFAULT
            rate, p_comm = self._comm_uncapped(comm, ks, threads)  # cached: shared by every op
            if op.kind == "memory":
                tuned = self._tuned_rate(comm, kk, threads, g.comm_rate_beside_memory)
            else:
                cap = g.tuned_link_fraction_beside_compute * self.link_bw(comm)
                tuned = np.minimum(rate * _RATE_BESIDE[op.kind](g), cap)
            rate = np.where(library, rate * g.library_rate_beside, tuned)
            hbm_share = g.comm_hbm_factor * rate / g.hbm_bw  # of the peak: kernels leave headroom
            contention = _SLOWDOWN_BESIDE[op.kind](g) * k / g.sms
            t, p_comp = self._compute_raw(op, g.sms - k, hbm_share, contention, beside=True)
            if op.resident_grid:
                left = (g.sms - k) / g.sms  # the first round's share of the blocks
                t2, p2 = self._compute_raw(op, k, hbm_share, contention, beside=True)
                t1 = (t - g.kernel_overhead_s) * left
                t2 = (t2 - g.kernel_overhead_s) * (1.0 - left)
                t = t1 + t2 + g.kernel_overhead_s
                span = t1 + t2
                p_comp = np.divide(p_comp * t1 + p2 * t2, span, out=np.broadcast_to(
                    p_comp, span.shape).copy(), where=span > 0)
            t, p, rate = self._throttled(t, p_comp + p_comm, rate)
            table[key] = (_Phase(t, p), rate)
        return table[key]

    # ------------------------------------------------------------------ partitions
    def evaluate_partition(self, partition: Partition, clocks_mhz: NDArray[np.float64],
                           comm_sms: NDArray[np.int64], windows: NDArray[np.int64],
                           block_size: int | None = None, harness: bool = False,
                           host_scale: NDArray[np.float64] | None = None) -> PartitionGrid:
        """Time and dynamic energy per GPU of ``partition`` on the (clock, SMs, window) grid.

        The partition runs as the Kareus partition fuser runs it (see :func:`partition_timeline`):
        the host issues the compute ops one by one (``host_issue_*_s`` each) and the GPU starts
        each when it is issued and the previous one is done; the collective is launched just
        before op ``s`` is issued and the compute stream waits for it right after op ``e``;
        window (-1, -1) runs it alone first. ``comm_sms`` 0 is the library's kernel. ``harness``
        is a partition measured alone by the profiling harness (partition sweeps): each execution
        starts from an idle GPU, so all of the host issue time reaches the GPU, and the harness
        adds its per-execution overhead. Otherwise the partition runs inside an iteration, back
        to back with the previous one, and ``iteration_host_fraction`` of the host issue time
        reaches the GPU. ``host_scale`` multiplies each op's host issue time (a calibrated
        partition's own).
        Every phase (an op alone, an op beside the collective, the collective alone) runs at the
        requested clock or, where it would exceed the board's power limit there, at the clock it
        throttles to; ``clocks_mhz`` of the result are the requested ones.
        """
        g = self.gpu
        fi = self.clock_index(clocks_mhz)
        ks = tuple(int(k) for k in np.atleast_1d(comm_sms))
        win = np.asarray(windows, dtype=np.int64).reshape(-1, 2)
        threads = int(block_size or g.comm_block_default)
        n = len(partition.compute)
        if n == 0:
            raise PlanError(f"partition {partition.key} has no compute ops")
        for s_, e_ in win:
            why = PartitionSchedule(1, int(s_), int(e_)).problem(n, g.comm_max_sms)
            if why:
                raise PlanError(f"partition {partition.key}: {why}")
        if partition.comm is not None:
            for k in ks:
                if k != LIBRARY_DEFAULT:
                    why = PartitionSchedule(k, 0, None, threads).problem(n, g.comm_max_sms)
                    if why:
                        raise PlanError(f"partition {partition.key}: {why}")
        shape = (fi.size, len(ks), win.shape[0])

        def grid(a: NDArray) -> NDArray:  # (K, G) table -> (F, K, 1), broadcasts over windows
            return a[:, fi].T[:, :, None]

        def per_clock(a: NDArray) -> NDArray:  # (G,) table -> (F, 1, 1)
            return a[fi][:, None, None]

        exposed = 1.0 if harness else g.iteration_host_fraction
        ops: list[TimelineOp] = []
        for i, op in enumerate(partition.compute):
            a = self._alone(op)
            host = exposed * (_HOST_ISSUE[op.kind](g)
                              * (1.0 if host_scale is None else float(host_scale[i]))
                              + op.host_calls * g.host_issue_call_s)
            wave_s = self._wave_s(op, per_clock(a.time))
            if partition.comm is None:
                ops.append(TimelineOp(per_clock(a.time), per_clock(a.power), host, wave_s))
            else:
                ov, rate_ov = self._overlapped(op, partition.comm, ks, threads)
                ops.append(TimelineOp(per_clock(a.time), per_clock(a.power), host, wave_s,
                                      grid(ov.time), grid(ov.power), grid(rate_ov),
                                      resident_grid=op.resident_grid))
        comm = None
        if partition.comm is not None:
            ph, rate = self._comm_alone(partition.comm, ks, threads)
            comm = TimelineCollective(partition.comm.bus_bytes, grid(rate), grid(ph.power))
        t, e = partition_timeline(
            ops, comm, np.broadcast_to(win[:, 0], shape), np.broadcast_to(win[:, 1], shape),
            launch_s=g.comm_launch_s,
            latency_s=(g.comm_latency_s if partition.comm is None
                       else self._comm_latencies(partition.comm, ks)[None]),
            partial_wave_loss=g.partial_wave_loss)
        t, e = np.broadcast_to(t, shape), np.broadcast_to(e, shape)
        if harness:
            t = t + g.partition_harness_s
        return PartitionGrid(
            key=partition.key, clocks_mhz=self.grid[fi], comm_sms=np.asarray(ks), windows=win,
            time_s=t, dynamic_energy_j=e, block_size=threads,
        )

    # ------------------------------------------------------------------ instructions
    def segment_parts(self, segs: tuple[Segment, ...], f_idx: int, times: int = 1
                      ) -> dict[str, tuple[float, float]]:
        """GPU time (s) and dynamic energy (J) of ``segs`` run ``times`` over in sequential
        execution (compute ops on all SMs, then the collective alone on the library's kernel, or
        beside the last op: :attr:`~kareus.graph.Segment.comm_beside_last`), by what runs: the
        compute kernels by kind (``gemm``, ``attention``, ``memory``) and the collectives
        (``collective``; beside an op, what the pair takes beyond the op alone), in that order.
        The GPU's own time only; where the host's issue holds it back is :meth:`issue_map`'s."""
        parts = {kind: [0.0, 0.0] for kind in (*KERNEL_KINDS, "collective")}
        for seg in segs:
            for op in seg.compute:
                a = self._alone(op)
                part = parts[op.kind]
                part[0] += float(a.time[f_idx])
                part[1] += float(a.time[f_idx] * a.power[f_idx])
            if seg.comm is not None and seg.comm.group > 1:
                if seg.comm_beside_last and seg.compute:
                    # beside the last op: the collective's part is what the pair takes beyond
                    # that op alone (its own overhang and the op's slowdown)
                    bt, be = self._beside(seg.compute[-1], seg.comm)
                    t, e = float(bt[f_idx]), float(be[f_idx])
                    a = self._alone(seg.compute[-1])
                    t -= float(a.time[f_idx])
                    e -= float(a.time[f_idx] * a.power[f_idx])
                else:
                    ph, _ = self._comm_alone(seg.comm, (LIBRARY_DEFAULT,),
                                             self.gpu.comm_block_default)
                    t = float(ph.time[0, f_idx])
                    e = t * float(ph.power[0, f_idx])
                parts["collective"][0] += t
                parts["collective"][1] += e
        return {kind: (t * times, e * times) for kind, (t, e) in parts.items()}

    def _beside(self, op: ComputeOp, comm: CommOp) -> tuple[NDArray, NDArray]:
        """``op`` with the library's collective ``comm`` launched just before it on a side
        stream (:attr:`~kareus.graph.Segment.comm_beside_last`): time (s) until both are done
        and their dynamic energy (J), at every grid clock. The one-op timeline of a partition
        (:func:`partition_timeline`, window (0, 0)) with no host issue: the op runs beside the
        collective while both last, then whichever is left runs alone."""
        table, key = self._tables.beside, (op, comm)
        if key not in table:
            g = self.gpu
            ks, threads = (LIBRARY_DEFAULT,), g.comm_block_default
            a = self._alone(op)
            wave_s = self._wave_s(op, a.time)
            ov, rate_ov = self._overlapped(op, comm, ks, threads)
            ph, rate = self._comm_alone(comm, ks, threads)
            zero = np.zeros(a.time.shape, dtype=np.int64)
            table[key] = partition_timeline(
                [TimelineOp(a.time, a.power, 0.0, wave_s, ov.time[0], ov.power[0], rate_ov[0],
                            resident_grid=op.resident_grid)],
                TimelineCollective(comm.bus_bytes, rate[0], ph.power[0]), zero, zero,
                launch_s=0.0, latency_s=self._comm_latencies(comm, ks)[0],
                partial_wave_loss=g.partial_wave_loss)
        return table[key]

    def _segment_cost(self, seg: Segment, f_idx: int) -> tuple[float, float]:
        """One segment's GPU time (s) and dynamic energy (J), sequential (:meth:`segment_parts`)."""
        parts = self.segment_parts((seg,), f_idx).values()
        return sum(t for t, _ in parts), sum(e for _, e in parts)

    def _partition_cost(self, part: Partition, clock: float, sched: PartitionSchedule
                        ) -> tuple[float, float]:
        """Time (s) and dynamic energy (J) of one partition under schedule ``sched`` at
        ``clock`` (MHz, snapped down to the grid like every clock here)."""
        # Keyed by identity (hashing a partition's ops is slow); the cached value keeps the
        # partition alive, so its id cannot be reused while the entry exists. Every clock of the
        # grid at once: one vectorised call serves all the clocks a search or a plan asks this
        # partition and schedule for.
        table, key = self._tables.partition, (id(part), sched)
        if key not in table:
            k = LIBRARY_DEFAULT if sched.comm_sms is None else sched.comm_sms
            grid = self.evaluate_partition(part, self.grid, np.array([k]),
                                           np.array([sched.window(len(part.compute))]),
                                           sched.block_size)
            table[key] = _PartitionCosts(grid.time_s[:, 0, 0].tolist(),
                                         grid.dynamic_energy_j[:, 0, 0].tolist(), part)
        costs = table[key]
        return (costs.time_s[self._scalar_index(clock)],
                costs.dynamic_energy_j[self._scalar_index(clock)])

    def _exposed_cost(self, comm: CommOp, f_idx: int, sched: PartitionSchedule
                      ) -> tuple[float, float]:
        """A collective alone on the kernel ``sched`` chooses (launch included)."""
        k = LIBRARY_DEFAULT if sched.comm_sms is None else sched.comm_sms
        ph, _ = self._comm_alone(comm, (k,), int(sched.block_size or self.gpu.comm_block_default))
        return (self.gpu.comm_launch_s + float(ph.time[0, f_idx]),
                float(ph.time[0, f_idx] * ph.power[0, f_idx]))

    def evaluate_instruction(self, graph: IterationGraph, key: tuple[int, Direction],
                             plan: InstructionPlan) -> InstructionCost:
        """Time and dynamic energy per GPU of one instruction of type ``key`` under ``plan``.

        The locked clock is the one every phase asks for; the phases that would exceed the power
        limit there (large GEMMs and attention kernels at the top clocks) run throttled, the
        others at the locked clock (see the module docstring).
        """
        ig = graph.instruction_graphs.get(key)
        table, cache_key = self._tables.instruction, (id(ig), plan)  # the entry keeps ``ig`` alive
        if ig is not None and cache_key in table:
            return table[cache_key].cost
        plan.validate(graph, key, self.gpu)
        assert ig is not None  # validate refuses an unknown instruction
        f_idx = self._scalar_index(plan.clock_mhz)
        cost = InstructionCost(*self._instruction_at(ig, plan, f_idx))
        table[cache_key] = _InstructionEntry(cost, ig)
        return cost

    def _instruction_at(self, ig: InstructionGraph, plan: InstructionPlan, f_idx: int
                        ) -> tuple[float, float]:
        """Time and dynamic energy of one instruction with every phase asking for grid clock
        ``f_idx``, started with the GPU's queue empty (:meth:`issue_map`): so it runs on a
        pipeline stage, after its transfer's synchronisation. A single stage's host runs ahead
        across instructions, which :meth:`evaluate_plan` credits over the iteration."""
        table, key = self._tables.instruction_at, (id(ig), plan, f_idx)  # the entry keeps ``ig``
        if key in table:
            return table[key][0]
        clock = float(self.grid[f_idx])
        t = e = 0.0
        if plan.nanobatched and ig.partitions:
            scheds = plan.schedule_map()
            for part in ig.partitions:
                pt, pe = self._partition_cost(part, clock, scheds.get(part.key,
                                                                      PartitionSchedule()))
                t += pt * ig.layers
                e += pe * ig.layers
            # Boundary of the chain: the first partition has nothing to overlap yet, and the
            # last layer's final collective runs exposed after the compute.
            first = ig.partitions[0]
            if first.comm is not None:
                s = scheds.get(first.key, PartitionSchedule())
                pt, pe = self._partition_cost(first, clock, s)
                ct, ce = self._partition_cost(Partition(first.key, first.compute, None), clock,
                                              PartitionSchedule())
                xt, xe = self._exposed_cost(first.comm, f_idx, s)
                t += ct + xt - pt
                e += ce + xe - pe
        else:
            for st, se in self.segment_parts(ig.sequential, f_idx, ig.layers).values():
                t += st
                e += se
        for st, se in self.segment_parts(ig.extra, f_idx).values():
            t += st
            e += se
        if not (plan.nanobatched and ig.partitions):  # partitions model their own host issue
            host, a, b = self.issue_map(ig, f_idx)
            t = max(t, host + max(a, b))
        table[key] = ((t, e), ig)
        return t, e

    def instruction_breakdown(self, graph: IterationGraph, key: tuple[int, Direction],
                              plan: InstructionPlan) -> dict[str, tuple[float, float]]:
        """Where one instruction's time (s) and dynamic energy (J) per GPU go: the parts of
        :meth:`segment_parts` (``gemm``, ``attention``, ``memory``, ``collective``) and
        ``host_wait``, the time the GPU waits for the host's issue (no dynamic energy). A
        nanobatched instruction's overlapped partitions are one part, ``overlapped``, and its
        host issue is inside them. The parts add up to :meth:`evaluate_instruction`'s cost."""
        ig = graph.instruction_graphs[key]
        plan.validate(graph, key, self.gpu)
        f_idx = self._scalar_index(plan.clock_mhz)
        total_t, total_e = self._instruction_at(ig, plan, f_idx)
        extra = self.segment_parts(ig.extra, f_idx)
        if plan.nanobatched and ig.partitions:
            return {"overlapped": (total_t - sum(t for t, _ in extra.values()),
                                   total_e - sum(e for _, e in extra.values())),
                    **extra, "host_wait": (0.0, 0.0)}
        parts = self.segment_parts(ig.sequential, f_idx, ig.layers)
        parts = {kind: (t + extra[kind][0], e + extra[kind][1]) for kind, (t, e) in parts.items()}
        parts["host_wait"] = (total_t - sum(t for t, _ in parts.values()), 0.0)
        return parts

    def issue_map(self, ig: InstructionGraph, f_idx: int) -> tuple[float, float, float]:
        """How the host's issue queue runs through one sequential instruction at grid clock
        ``f_idx``: ``(host, A, B)`` with ``host`` its issue time (s, :meth:`host_time`) and the
        GPU's lead over the host after it ``max(lead + A, B)`` (s) for a lead of ``lead`` before.

        The host issues the ops one after another (``host_eager_op_s`` each, ``host_issue_call_s``
        a collective) and each kernel starts once it is issued and the one before has ended: a
        kernel of ``g`` s issued in ``h`` s turns a lead ``d`` into ``max(d - h, 0) + g``, the map
        ``(g - h, g)``; maps compose as ``(A1 + A2, max(B1 + A2, B2))``, and ``L`` identical
        layers as ``(L A, B + (L - 1) max(A, 0))``. An instruction that starts with the queue
        empty (Megatron-LM synchronises host and GPU at every pipeline transfer) takes
        ``host + max(A, B)``: at least its GPU time (``host + A``) and its issue time, more where
        short kernels wait for their issue between long ones."""
        table, key = self._tables.issue, (id(ig), f_idx)
        if key in table:
            return table[key][0]
        g = self.gpu

        def segment_map(segs: tuple[Segment, ...]) -> tuple[float, float, float]:
            host, a, b = 0.0, 0.0, 0.0
            for seg in segs:
                steps = [(g.host_eager_op_s, float(self._alone(op).time[f_idx]))
                         for op in seg.compute]
                if seg.comm is not None and seg.comm.group > 1:
                    if seg.comm_beside_last and seg.compute:  # the pair as one step
                        steps[-1] = (g.host_issue_call_s + g.host_eager_op_s,
                                     float(self._beside(seg.compute[-1], seg.comm)[0][f_idx]))
                    else:
                        ph, _ = self._comm_alone(seg.comm, (LIBRARY_DEFAULT,),
                                                 g.comm_block_default)
                        steps.append((g.host_issue_call_s, float(ph.time[0, f_idx])))
                for h, t in steps:
                    host, a, b = host + h, a + t - h, max(b + t - h, t)
            return host, a, b

        lh, la, lb = segment_map(ig.sequential)
        n = ig.layers
        host, a, b = n * lh, n * la, (lb + (n - 1) * max(la, 0.0)) if n else 0.0
        eh, ea, eb = segment_map(ig.extra)
        out = (host + eh, a + ea, max(b + ea, eb) if ig.extra else b)
        table[key] = (out, ig)
        return out

    def host_time(self, ig: InstructionGraph) -> float:
        """Host time (s) to issue one sequential instruction's ops: ``host_eager_op_s`` per
        compute op and ``host_issue_call_s`` per collective (one call into the communication
        library, from inside the layer's autograd function: no module of its own). The host
        runs ahead of the GPU; where it falls behind (small micro-batches, short kernels) the GPU
        waits (:meth:`issue_map`)."""
        def ops(segs: tuple[Segment, ...]) -> int:
            return sum(len(seg.compute) for seg in segs)

        def collectives(segs: tuple[Segment, ...]) -> int:
            return sum(seg.comm is not None and seg.comm.group > 1 for seg in segs)

        g = self.gpu
        return (g.host_eager_op_s * (ops(ig.sequential) * ig.layers + ops(ig.extra))
                + g.host_issue_call_s * (collectives(ig.sequential) * ig.layers
                                         + collectives(ig.extra)))

    # ------------------------------------------------------------------ iterations
    def p2p_times(self, graph: IterationGraph) -> tuple[float, ...]:
        """Time (s) of one activation transfer across each stage boundary (``b``: between stages
        ``b`` and ``b + 1``): over one NIC per GPU where the boundary crosses nodes, over NVLink
        where both stages share a node (stages smaller than a node); with Megatron-LM's
        scatter/gather (:attr:`IterationGraph.p2p_gather`) each rank sends its 1/TP and the
        receiving TP group all-gathers the pieces (NCCL's kernel at the top clock), which the
        transfer includes. GPUs wait at static power."""
        comm = graph.p2p
        if comm is None:
            return (0.0,) * max(graph.stages - 1, 0)
        g = self.gpu
        gather = (0.0 if graph.p2p_gather is None
                  else self.collective_time(graph.p2p_gather, g.clock_max_mhz, None))
        inside = replace(comm, intra_node=True, nodes=1, ranks_per_node=comm.group)
        t_inside = self.comm_latency(inside) + comm.bytes / self.link_rate(inside) + gather
        if comm.intra_node:
            return (t_inside,) * (graph.stages - 1)
        t_across = (self.comm_latency(comm)  # one NIC per GPU: a send uses one
                    + comm.bytes / (g.network_bw * g.network_efficiency) + gather)
        across = graph.p2p_across_nodes or (True,) * (graph.stages - 1)
        return tuple(t_across if a else t_inside for a in across)

    def first_forward_waits(self, graph: IterationGraph) -> tuple[float, ...]:
        """Per stage, the time (s) its first forward waits for its parameter all-gather
        (``--overlap-param-gather``: :meth:`overlapped_param_gather`) with every kernel at the
        maximum clock, as :meth:`evaluate_plan` adds it; zeros for the stages without one. The
        optimizers plan with it on the pipeline's filling path."""
        waits = [0.0] * graph.stages
        top = InstructionPlan.make(self.gpu.clock_max_mhz)
        f_top = self._scalar_index(self.gpu.clock_max_mhz)
        for s, comm in graph.param_gather.items():
            forward_s = self.evaluate_instruction(graph, (s, "forward"), top).time_s
            waits[s] = self.overlapped_param_gather(graph, s, comm, forward_s, f_top)[0]
        return tuple(waits)

    def evaluate_plan(self, graph: IterationGraph, plan: IterationPlan) -> IterationResult:
        """Execute one iteration: instruction costs, the 1F1B DAG, stage tails, energy."""
        plan.validate(graph, self.gpu)
        if plan.power_limit_w is not None and plan.power_limit_w != self.power_limit_w:
            return self.under_limit(plan.power_limit_w).evaluate_plan(
                graph, IterationPlan(plan.instructions, None, plan.label, plan.meta))
        order = [ins for seq in graph.schedule().values() for ins in seq]
        durations: dict[Instruction, float] = {}
        dyn = {s: 0.0 for s in range(graph.stages)}
        # per (type, plan object); each entry keeps its plan, so that its id is not reused
        costs: dict[tuple[int, Direction, int], tuple[InstructionPlan, InstructionCost]] = {}
        for ins in order:
            ip = plan.instructions[ins]
            kind = (ins.stage, ins.direction, id(ip))
            entry = costs.get(kind)
            if entry is None or entry[0] is not ip:
                entry = costs[kind] = (ip, self.evaluate_instruction(graph, ins.type_key, ip))
            cost = entry[1]
            durations[ins] = cost.time_s
            dyn[ins.stage] += cost.dynamic_energy_j
        f_top = int(self.clock_index(self.gpu.clock_max_mhz)[0])
        # --overlap-param-gather: each stage's first forward waits for what its parameter
        # all-gather leaves exposed (a wait before the forward in the instruction times)
        gather_wait: dict[Instruction, float] = {}
        for s, comm in graph.param_gather.items():
            first = Instruction(s, 0, "forward")
            wait, energy = self.overlapped_param_gather(
                graph, s, comm, durations[first],
                self._scalar_index(plan.instructions[first].clock_mhz))
            gather_wait[first] = wait
            dyn[s] += energy
            durations[first] += wait
        # the host issues on while the GPU waits: a single stage's queue starts that far behind
        run_ahead = self._run_ahead(graph, plan, order, durations,
                                    gather_wait.get(Instruction(0, 0, "forward"), 0.0))
        delays = self.p2p_times(graph)
        times = schedule_times(graph.stages, graph.microbatches, durations, delays)
        for ins, wait in gather_wait.items():
            start, end = times[ins]
            times[ins] = (start + wait, end)
        ends, tails = {}, {}
        last_end, held = [0.0] * graph.stages, [0.0] * graph.stages
        for ins, (_, end) in times.items():
            if end > last_end[ins.stage]:
                last_end[ins.stage] = end
                held[ins.stage] = sender_hold(ins, graph.stages, delays)
        last_backward = {ins.stage: times[ins] for ins in times
                         if ins.direction == "backward" and ins.microbatch == graph.microbatches - 1}
        for s in range(graph.stages):
            # the stage tail starts once its last instruction has sent its output
            last = last_end[s] + held[s] - run_ahead
            tail_t = 0.0
            for i, seg in enumerate(graph.stage_tail.get(s, ())):
                if i == 0 and graph.overlap_grad_reduce and seg.comm is not None:
                    # bucketed reduction during the last backward: only its overhang shows,
                    # and it runs on while the last send holds the stage
                    start, end = last_backward[s]
                    clock = plan.instructions[Instruction(s, graph.microbatches - 1,
                                                          "backward")].clock_mhz
                    st, se = self.overlapped_grad_sync(graph, s, seg.comm, start, end, f_top,
                                                       self._scalar_index(clock))
                    st = max(0.0, st - held[s])
                elif seg.comm is not None and seg.comm.collective == "all_gather":
                    # the distributed optimizer's all-gather after its step, bucket by bucket
                    st, se = self._segment_cost(Segment(seg.compute, None), f_top)
                    gathers, energy = self._bucket_costs(seg.comm, self._stage_buckets(graph, s),
                                                         f_top)
                    st, se = st + sum(gathers), se + energy
                else:
                    st, se = self._segment_cost(seg, f_top)
                tail_t += st
                dyn[s] += se
            ends[s] = last + tail_t
            tails[s] = tail_t
        iteration_time = max(ends.values())
        cluster_dyn = sum(dyn[s] * graph.gpus_per_stage for s in dyn)
        energy = iteration_energy(cluster_dyn, graph.num_gpus, self.gpu.static_power_w,
                                  iteration_time)
        per_gpu_static = static_energy(1, self.gpu.static_power_w, iteration_time)
        return IterationResult(
            energy=energy, num_gpus=graph.num_gpus, gpus_per_stage=graph.gpus_per_stage,
            per_gpu_dynamic_j=dict(dyn),
            per_gpu_energy_j={s: dyn[s] + per_gpu_static for s in dyn},
            instruction_times=times, model_flops=graph.model_flops,
            stage_tail_s=tails, stage_end_s=ends, run_ahead_s=run_ahead,
        )

    def _run_ahead(self, graph: IterationGraph, plan: IterationPlan,
                   order: list[Instruction], durations: dict[Instruction, float],
                   gpu_behind_s: float = 0.0) -> float:
        """Time (s) a single-stage iteration gains over its instructions run one by one from an
        empty queue (their costs, which the optimizers plan with). Without pipeline transfers
        nothing synchronises the host with the GPU between instructions, so the host runs
        ahead across the whole iteration and one issue queue runs through all of them
        (:meth:`issue_map`; a nanobatched instruction models its own host issue and passes as
        GPU time): the iteration's compute ends at the host's whole issue time plus the GPU's
        final lead, never later than the instructions' own costs added up. ``gpu_behind_s``:
        how far the GPU starts behind the host (a wait of the first instruction's own, within
        its duration, which the host issues through). With stages each instruction starts
        drained, and this is 0."""
        if graph.stages > 1:
            return 0.0
        host, lead = 0.0, gpu_behind_s
        for ins in order:
            ip, ig = plan.instructions[ins], graph.instruction_graphs[ins.type_key]
            if ip.nanobatched and ig.partitions:
                h, a, b = 0.0, durations[ins], durations[ins]
            else:
                h, a, b = self.issue_map(ig, self._scalar_index(ip.clock_mhz))
            host, lead = host + h, max(lead + a, b)
        return max(0.0, sum(durations[ins] for ins in order) - (host + lead))

    def _stage_buckets(self, graph: IterationGraph, stage: int) -> tuple[GradBucket, ...]:
        """``stage``'s data-parallel buckets in the backward's order (:attr:`IterationGraph.
        grad_buckets`; one holding everything when the graph lists none)."""
        return graph.grad_buckets.get(stage) or (
            GradBucket(1.0, float(graph.instruction_graphs[(stage, "forward")].layers)),)

    def _bucket_costs(self, comm: CommOp, buckets: tuple[GradBucket, ...], f_idx: int
                      ) -> tuple[list[float], float]:
        """Each bucket's share of ``comm`` on the library's own kernel: their times (s, each
        with its fixed latency) and their dynamic energy together (J)."""
        times, energy = [], 0.0
        for b in buckets:
            ph, _ = self._comm_alone(replace(comm, bytes=comm.bytes * b.share), (LIBRARY_DEFAULT,),
                                     self.gpu.comm_block_default)
            t = float(ph.time[0, f_idx])
            times.append(t)
            energy += t * float(ph.power[0, f_idx])
        return times, energy

    def _bucket_work(self, graph: IterationGraph, stage: int, direction: Direction,
                     buckets: tuple[GradBucket, ...], f_idx: int) -> list[float]:
        """Each bucket's fraction of ``stage``'s ``direction`` instruction, in the buckets'
        (the backward's) order: its layers' share of the layer work, and the instruction's
        other work with the bucket beside it: the head (output layer, loss) of a last stage
        with the first bucket, which the backward reaches first and the forward last; a first
        stage's embedding with the last."""
        ig = graph.instruction_graphs[(stage, direction)]
        layer = sum(self._segment_cost(seg, f_idx)[0] for seg in ig.sequential)
        work = [b.layers * layer for b in buckets]
        work[0 if stage == graph.stages - 1 else -1] += sum(
            self._segment_cost(seg, f_idx)[0] for seg in ig.extra)
        total = sum(work)
        return [w / total for w in work] if total > 0 else [1 / len(work)] * len(work)

    def _kernels_beside(self, graph: IterationGraph, key: tuple[int, Direction], comm: CommOp,
                        f_idx: int) -> _KernelsBeside:
        """The kernels of instruction ``key`` (its layers' and its extra segments' compute ops,
        without nanobatching) beside the library's collective ``comm`` at grid clock
        ``f_idx``, added up (:class:`_KernelsBeside`): each op on the SMs NCCL's channels
        leave, sharing HBM with it (:meth:`_overlapped`), as the partition law has it."""
        ig = graph.instruction_graphs[key]
        ks, threads = (LIBRARY_DEFAULT,), self.gpu.comm_block_default
        t_a = t_b = e_a = e_b = moved = 0.0
        for segments, repeat in ((ig.sequential, ig.layers), (ig.extra, 1)):
            for seg in segments:
                for op in seg.compute:
                    a = self._alone(op)
                    ov, rate = self._overlapped(op, comm, ks, threads)
                    tb = float(ov.time[0, f_idx])
                    t_a += repeat * float(a.time[f_idx])
                    e_a += repeat * float(a.time[f_idx] * a.power[f_idx])
                    t_b += repeat * tb
                    e_b += repeat * tb * float(ov.power[0, f_idx])
                    moved += repeat * tb * float(rate[0, f_idx])
        return _KernelsBeside(t_a, t_b, e_a, e_b, moved)

    def overlapped_grad_sync(self, graph: IterationGraph, stage: int, comm: CommOp,
                             start_s: float, end_s: float, f_idx: int,
                             backward_idx: int | None = None) -> tuple[float, float]:
        """Exposed time (s) and dynamic energy (J) of ``stage``'s gradient reduction ``comm``
        in its buckets (:attr:`IterationGraph.grad_buckets`) during the last backward
        (``start_s`` to ``end_s``, at grid clock ``backward_idx``; default ``f_idx``, the
        reduction's): a bucket is ready once the backward has done its work
        (:meth:`_bucket_work`), and the buckets reduce one after another on NCCL's stream,
        each with its fixed latency (their times alone at ``f_idx``).

        While a bucket reduces, the two slow each other as in a partition: the backward's
        kernels run on the SMs NCCL's channels leave, sharing HBM with it, and the reduction
        moves at its rate beside them (:meth:`_kernels_beside`, averaged over the backward:
        its kernels' share of the backward stretches by their time beside over their time
        alone; the rest, its own collectives and the host's gaps, runs as before, the reduction
        at its own rate meanwhile). The exposed time is how much later the stage is done with
        both than the backward alone: its slowdown and what runs past its end. The energy is
        the reduction's, alone or beside, and what the backward's kernels draw beside it over
        what they draw alone (already in the instruction's energy)."""
        buckets = self._stage_buckets(graph, stage)
        times, _ = self._bucket_costs(comm, buckets, f_idx)
        work = self._bucket_work(graph, stage, "backward", buckets, f_idx)
        span = end_s - start_s
        b_idx = f_idx if backward_idx is None else backward_idx
        ready = np.cumsum([w * span for w in work])  # a bucket once its own work is done
        done_s, energy = self._beside_streams(
            graph, (stage, "backward"), comm, f_idx, b_idx, span, times,
            comm_after_work=ready.tolist(), work_after_comm=[0] * len(work), work_shares=work)
        return max(0.0, done_s - span), energy

    def overlapped_param_gather(self, graph: IterationGraph, stage: int, comm: CommOp,
                                forward_s: float, f_idx: int) -> tuple[float, float]:
        """Exposed time (s) and dynamic energy (J) of ``stage``'s parameter all-gather ``comm``
        run under its first forward of ``forward_s`` (Megatron-LM's ``--overlap-param-gather``,
        at that forward's clock ``f_idx``): the forward reaches the buckets in the reverse of
        the backward's order; the forward pre-hook of a bucket's first module waits for its
        all-gather and launches the next, so the buckets gather one after another on NCCL's
        stream while the forward computes each bucket's work (:meth:`_bucket_work`) once its own
        has arrived, the two slowing each other meanwhile as under
        :meth:`overlapped_grad_sync`. What the forward waits and slows in all is exposed: at
        least the first bucket."""
        buckets = self._stage_buckets(graph, stage)
        times, _ = self._bucket_costs(comm, buckets, f_idx)
        work = list(reversed(self._bucket_work(graph, stage, "forward", buckets, f_idx)))
        done_s, energy = self._beside_streams(
            graph, (stage, "forward"), comm, f_idx, f_idx, forward_s, list(reversed(times)),
            comm_after_work=[0.0] * len(work), work_after_comm=list(range(1, len(work) + 1)),
            work_shares=work)
        return done_s - forward_s, energy

    def _beside_streams(self, graph: IterationGraph, key: tuple[int, Direction], comm: CommOp,
                        f_idx: int, work_idx: int, span_s: float, comm_s: list[float], *,
                        comm_after_work: list[float], work_after_comm: list[int],
                        work_shares: list[float]) -> tuple[float, float]:
        """Instruction ``key`` (``span_s`` alone, at grid clock ``work_idx``) in chunks of
        ``work_shares`` of it, beside the buckets of the library's collective ``comm`` on NCCL's
        stream, one after another (``comm_s``: each bucket's time alone at ``f_idx``, its fixed
        latency included). Bucket ``i`` starts once the instruction has done
        ``comm_after_work[i]`` seconds of its work alone; chunk ``j`` once ``work_after_comm[j]``
        buckets are done. Returns when both are done (s after the instruction's start) and the
        dynamic energy beyond the instruction's own (J): the buckets' alone, and beside it what
        its kernels and the collective draw over what the kernels draw alone.

        While both run they slow each other as in a partition (:meth:`_kernels_beside`,
        averaged over the instruction): its kernels' share of it stretches by their time beside
        over their time alone, and the rest (its own collectives, the host's gaps) runs as
        before, the collective at its own rate meanwhile; both at the instruction's clock, the
        collective's rate beside the kernels taken relative to its rate alone there."""
        ph, rate = self._comm_alone(comm, (LIBRARY_DEFAULT,), self.gpu.comm_block_default)
        p_alone = float(ph.power[0, f_idx])
        k = self._kernels_beside(graph, key, comm, work_idx)
        share = min(1.0, k.time_alone_s / span_s) if span_s > 0 and k.time_alone_s > 0 else 0.0
        # per second of the instruction alone run beside: the seconds it takes, the seconds of
        # the collective alone it moves, and the energy beyond the instruction's own (J)
        stretch = 1.0 + share * (k.stretch - 1.0)
        moves = share * k.stretch * k.rate_beside / float(rate[0, work_idx]) + (1.0 - share)
        extra_w = share * k.extra_power_w + (1.0 - share) * p_alone
        chunks = [w * span_s for w in work_shares]
        t = energy = done = 0.0  # time, energy, seconds of the instruction alone done
        i = j = 0  # the bucket and the chunk under way
        left_c = comm_s[0] if comm_s else 0.0
        left_w = chunks[0] if chunks else 0.0
        while i < len(comm_s) or j < len(chunks):
            comm_on = i < len(comm_s) and (j == len(chunks)
                                             or done >= comm_after_work[i] - 1e-12 * span_s)
            work_on = j < len(chunks) and i >= work_after_comm[j]
            if comm_on and work_on:  # beside each other until one of them ends
                x = left_w if moves <= 0 else min(left_w, left_c / moves)
                t, energy, done = t + x * stretch, energy + x * extra_w, done + x
                left_w, left_c = left_w - x, max(0.0, left_c - x * moves)
            elif work_on:  # the instruction alone, up to its chunk's end or the next bucket
                x = left_w if i >= len(comm_s) else min(left_w, comm_after_work[i] - done)
                t, done, left_w = t + x, done + x, left_w - x
            elif comm_on:  # the bucket alone
                t, energy, left_c = t + left_c, energy + left_c * p_alone, 0.0
            else:
                raise AssertionError("the buckets and the chunks wait for each other")
            if i < len(comm_s) and left_c <= 1e-15 and comm_on:
                i += 1
                left_c = comm_s[i] if i < len(comm_s) else 0.0
            if j < len(chunks) and left_w <= 1e-15:
                j += 1
                left_w = chunks[j] if j < len(chunks) else 0.0
        return t, energy

    def under_limit(self, limit_w: float) -> "SimulatorBackend":
        """This simulator under a board power limit of ``limit_w`` W (checked by
        :meth:`IterationPlan.validate`: above the static power); itself under its own."""
        if limit_w == self.power_limit_w:
            return self
        if limit_w not in self._limited:
            self._limited[limit_w] = SimulatorBackend(self.gpu, limit_w)
        return self._limited[limit_w]
