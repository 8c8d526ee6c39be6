"""GPU presets: every number the simulator uses about a GPU, with where it came from.

Each :class:`GPUPreset` field has an entry in ``sources`` saying whether the value is
``datasheet`` (vendor specification), ``published`` (a measurement in a paper), ``fitted`` (fitted by
:mod:`kareus.hardware.calibration` from measured profiles), ``derived`` (computed from other
entries, the rule stated) or ``assumed`` (a modelling prior with its reasoning). Fitted values were
produced by ``python benchmarks/calibration.py`` from ``shared/perseus_sosp24/stage_profile``
(Perseus SOSP '24 artifact, A100 SXM4 80 GB 500 W and A40 measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from kareus.errors import PresetError


@dataclass(frozen=True)
class GPUPreset:
    """A GPU model for the simulator. Units: MHz, W, B/s, bytes, s.

    Attributes:
        name: Preset name.
        sms: Streaming multiprocessors.
        flops_per_clk_per_sm: Dense bf16 / fp16 tensor FLOP per SM per clock cycle.
        tf32_flops_per_clk_per_sm: Dense TF32 tensor FLOP per SM per clock (0: no TF32).
        fp32_flops_per_clk_per_sm: fp32 FLOP per SM per clock on the CUDA cores (FMA = 2).
        precisions: The math precisions the GPU runs (``bf16``, ``fp16``, ``tf32``, ``fp32``).
        clock_min_mhz, clock_max_mhz, clock_step_mhz: Lockable SM clock range and step.
        memory_bytes: HBM capacity.
        hbm_bw: HBM bandwidth (B/s); independent of the SM clock.
        nvlink_bw: Intra-node link bandwidth per GPU per direction (B/s): NVLink, or PCIe on
            PCIe cards.
        network_bw: Inter-node network bandwidth per GPU per direction (B/s): one NIC per GPU
            (rail-optimised), so a ring crossing nodes with ``k`` ranks on each node uses ``k``
            NICs at once.
        network_efficiency: Fraction of the NICs' bandwidth NCCL's rings reach across nodes.
        network_hop_latency_s: Latency of one step of a ring or tree across the network (s); a
            ring all-reduce over ``n`` nodes takes ``2(n-1)`` steps, a tree ``2·log2(n)``, and NCCL
            takes the faster.
        host_eager_op_s: Host time the framework (eager PyTorch, Megatron-LM) spends to issue one
            op outside partitions (s). A sequential instruction takes the longer of its GPU time
            and its ops' host time: the host runs ahead of short kernels only as fast as it
            issues them.
        power_limit_w: Default board power limit; above it the card lowers its clock.
        static_power_w: Power while blocked on a point-to-point receive (the paper's static power).
        gemm_efficiency: Fraction of tensor peak a deep GEMM reaches per full wave.
        gemm_depth_half: Reduction depth ``K`` at which a GEMM reaches half of
            ``gemm_efficiency``: its efficiency is ``gemm_efficiency · K / (K + this)`` (each
            output tile pays a fixed prologue and epilogue).
        attention_efficiency: Same for flash attention's forward (softmax and masking cost extra).
        attention_bwd_efficiency: Same for flash attention's backward.
        hbm_efficiency: Fraction of HBM bandwidth an elementwise kernel reaches.
        link_efficiency: Fraction of link bandwidth a collective reaches (NCCL bus bandwidth).
        mem_sat_sm_fraction: Fraction of the SMs a memory-bound kernel needs to saturate HBM.
        comm_bw_per_sm_mhz: Throughput of one channel (SM) of the collective library (NCCL) per
            MHz of clock (bus B/s/MHz): below link saturation a library collective moves
            ``channels · clock · this`` bus bytes per second.
        comm_default_sms: SMs (NCCL channels) the collective library takes by default.
        comm_latency_s: Fixed cost of one collective (launch, synchronisation), s.
        comm_hbm_factor: HBM bytes a collective moves per bus byte (reads, writes, reductions).
        tuned_bw_per_sm_mhz: Throughput of one SM of a tuned side-stream collective (the
            MSCCL++ kernels Kareus schedules, ``comm_block_default`` threads per block) per MHz of
            clock (bus B/s/MHz).
        tuned_block_exponent: Per-SM throughput of a tuned collective scales as
            ``(threads / comm_block_default) ** this`` (memory-level parallelism per SM).
        tuned_link_fraction: Fraction of the link's bandwidth (per direction) that the tuned
            collective's link path reaches.
        tuned_pipelining: How the two limits of a tuned collective combine, the exponent ``p``
            of the soft minimum ``rate = ((SMs · per-SM rate)^-p + (link path)^-p)^(-1/p)``.
            ``p = 1`` is store-and-forward (the SMs' time and the link's add: no overlap between
            copying a chunk and sending the previous one); larger ``p`` is a chunked pipeline in
            which the slower of the two sets the rate and the knee between them is sharper.
        comm_block_default: Threads per block of a tuned collective unless a plan says otherwise.
        comm_max_sms: Most SMs (thread blocks) the collective library accepts for one kernel.
        comm_launch_s: Host time to launch a side-stream collective (s).
        comm_rate_beside_memory, comm_rate_beside_gemm, comm_rate_beside_attention: A tuned
            collective's throughput while a kernel of that class runs beside it, relative to
            alone (HBM, L2 and issue contention).
        library_rate_beside: The library collective's (NCCL's) throughput while compute runs
            beside it, relative to alone.
        overlap_slowdown_memory, overlap_slowdown_gemm, overlap_slowdown_attention: Extra
            slowdown of a compute kernel of that class per unit of ``collective SMs / SMs``
            beside a collective, on top of the SMs it loses (contention).
        host_issue_memory_s, host_issue_gemm_s, host_issue_attention_s: Host (CPU) time to issue
            one compute op of that class inside a synchronised partition (s); inside a partition
            the GPU waits for the host when an op is issued later than the previous op ends.
        host_issue_call_s: Host time of one framework call an op makes besides issuing its own
            kernel (:attr:`~kareus.graph.ComputeOp.host_calls`; s).
        iteration_host_fraction: The share of an op's host issue time that reaches the GPU inside
            an iteration. The partition sweep runs one partition per execution from an idle GPU
            and sees all of it; an iteration runs partitions back to back, and the fuser's
            boundaries are stream waits, so the host issues a partition's first ops while the GPU
            still runs the previous partition.
        partition_harness_s: Per-execution overhead of the partition-profiling harness (Python
            call, final synchronisation; s); only partition sweeps include it.
        partial_wave_loss: Fraction of one of its waves a GEMM (uniform tiles, lockstep waves)
            loses when a collective beside it ends mid-kernel and its SMs return (the waves go
            out of step; the last ends ragged).
        kernel_overhead_s: Launch and tail cost per compute kernel, s.
        sm_dyn_power_w: SM dynamic power at ``clock_max_mhz`` with every SM at full tensor
            activity (W).
        hbm_dyn_power_w: HBM dynamic power at full bandwidth (W).
        link_dyn_power_w: NVLink/NIC dynamic power at full link bandwidth (W).
        knee_mhz: Clock below which the core voltage stays at its floor (MHz).
        v_ratio: Core voltage at ``clock_max_mhz`` over the floor voltage.
        activity_gemm, activity_attention, activity_memory, activity_comm: SM switching activity
            of each kernel class relative to a dense GEMM, per SM it occupies (``activity_comm``:
            a tuned collective's, such as MSCCL++'s all-reduce).
        library_activity_comm: The same for the collective library's (NCCL's) channels, whose
            kernels (ring and tree protocols with their own reductions and flag polling) are not
            the tuned collective's.
        reference_gemm_efficiency, reference_attention_efficiency, reference_hbm_efficiency: The
            efficiencies at which the activities hold (those of the power fit); a kernel reaching
            less of its peak switches proportionally less (the same energy per FLOP or byte,
            spread over more time).
        sources: Field name -> "kind: where the number comes from".
    """

    name: str
    sms: int
    flops_per_clk_per_sm: float
    clock_min_mhz: float
    clock_max_mhz: float
    clock_step_mhz: float
    memory_bytes: float
    hbm_bw: float
    nvlink_bw: float
    network_bw: float
    power_limit_w: float
    static_power_w: float
    sm_dyn_power_w: float
    hbm_dyn_power_w: float
    knee_mhz: float
    v_ratio: float
    tf32_flops_per_clk_per_sm: float = 0.0
    fp32_flops_per_clk_per_sm: float = 128.0
    precisions: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32")
    network_efficiency: float = 0.80
    network_hop_latency_s: float = 10e-6
    host_eager_op_s: float = 75.44e-6
    gemm_efficiency: float = 0.80
    gemm_depth_half: float = 128.0
    attention_efficiency: float = 0.55
    attention_bwd_efficiency: float = 0.45
    hbm_efficiency: float = 0.85
    link_efficiency: float = 0.80
    mem_sat_sm_fraction: float = 0.5
    comm_bw_per_sm_mhz: float = 10.0e9 / 1410
    comm_default_sms: int = 24
    comm_latency_s: float = 25e-6
    comm_hbm_factor: float = 3.0
    tuned_bw_per_sm_mhz: float = 4.781e6
    tuned_block_exponent: float = 0.8557
    tuned_link_fraction: float = 0.2859
    tuned_pipelining: float = 1.766
    comm_block_default: int = 1024
    comm_max_sms: int = 32
    comm_launch_s: float = 35.25e-6
    comm_rate_beside_memory: float = 0.2377
    comm_rate_beside_gemm: float = 0.6348
    comm_rate_beside_attention: float = 0.959
    library_rate_beside: float = 0.8
    overlap_slowdown_memory: float = 0.1363
    overlap_slowdown_gemm: float = 0.02862
    overlap_slowdown_attention: float = 0.05416
    host_issue_memory_s: float = 187e-6
    host_issue_gemm_s: float = 32.09e-6
    host_issue_attention_s: float = 38.58e-6
    host_issue_call_s: float = 15.80e-6
    iteration_host_fraction: float = 0.3541
    partition_harness_s: float = 119.3e-6
    partial_wave_loss: float = 0.1132
    kernel_overhead_s: float = 4e-6
    link_dyn_power_w: float = 29.32
    activity_gemm: float = 1.0
    activity_attention: float = 0.85
    activity_memory: float = 0.35
    activity_comm: float = 0.2692
    library_activity_comm: float = 0.19
    reference_gemm_efficiency: float = 0.80
    reference_attention_efficiency: float = 0.55
    reference_hbm_efficiency: float = 0.85
    sources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}), compare=False)

    @property
    def peak_flops(self) -> float:
        """Dense bf16 tensor peak at the maximum clock (FLOP/s)."""
        return self.sms * self.flops_per_clk_per_sm * self.clock_max_mhz * 1e6

    def flops_per_clk(self, precision: str) -> float:
        """FLOP per SM per clock of math in ``precision`` (raises :class:`PresetError` for a
        precision this GPU cannot run)."""
        if precision not in self.precisions:
            raise PresetError(f"{self.name} cannot run {precision}; it runs "
                              f"{', '.join(self.precisions)}")
        return {"bf16": self.flops_per_clk_per_sm, "fp16": self.flops_per_clk_per_sm,
                "tf32": self.tf32_flops_per_clk_per_sm,
                "fp32": self.fp32_flops_per_clk_per_sm}[precision]

    def clock_grid(self, lo: float | None = None, hi: float | None = None) -> NDArray[np.float64]:
        """Lockable clocks from ``lo`` to ``hi`` (default: the whole range), ascending (MHz)."""
        lo = self.clock_min_mhz if lo is None else lo
        hi = self.clock_max_mhz if hi is None else hi
        n = int(round((hi - lo) / self.clock_step_mhz))
        return lo + self.clock_step_mhz * np.arange(n + 1, dtype=np.float64)

    def with_overrides(self, **changes: float) -> "GPUPreset":
        """A copy with some parameters changed (e.g. a fitted power curve, a static power)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise PresetError(f"unknown preset parameter(s) {', '.join(unknown)}")
        for k, v in changes.items():
            if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise PresetError(f"preset parameter {k} must be a non-negative number, got {v!r}")
        return replace(self, **changes)


#: Source of the partition law's parameters (time, A100; other GPUs reuse the A100 fit).
_SWEEP_FIT = ("fitted: `kareus calibrate --partition-sweep` on the Kareus artifact's measured "
              "attention-partition sweep (shared/kareus_artifact/attention_partition, 2 x A100 "
              "SXM, default clock); GPUs without such a sweep reuse the A100 fit")

_MEGATRON_FIT_COMMON = (
    "fitted: benchmarks/fidelity.py --fit-megatron on vTrain's measured single-node Megatron-LM "
    "runs (shared/vtrain_megatron/single_node.csv); the host and framework, not the GPU, so "
    "every preset reuses it")

_COMMON_SOURCES = {
    "gemm_efficiency": "assumed: large bf16 GEMMs reach ~60-80% of tensor peak (hardware.md); "
                       "wave quantization is modelled separately",
    "attention_efficiency": "assumed: FlashAttention-2 reaches 50-70% of peak forward, less backward",
    "attention_bwd_efficiency": "assumed: FlashAttention-2's backward reaches ~40-50% of peak",
    "gemm_depth_half": "assumed: a 128x128 output tile's prologue/epilogue costs about as much as "
                       "128 steps of its reduction",
    "hbm_efficiency": "assumed: elementwise kernels reach 80-90% of HBM bandwidth (hardware.md)",
    "link_efficiency": "assumed: NCCL all-reduce bus bandwidth reaches ~80% of NVLink (hardware.md)",
    "mem_sat_sm_fraction": "assumed: about half the SMs saturate HBM with streaming kernels",
    "comm_bw_per_sm_mhz": "assumed: one NCCL channel (1 CTA) moves ~10 GB/s at 1410 MHz, so "
                          "~24 channels saturate A100 NVLink; throughput scales with SM clock",
    "comm_default_sms": "assumed: NCCL's default channel count on NVLink systems (~24)",
    "comm_latency_s": "assumed: NCCL small-message all-reduce latency on NVLink, ~25 us",
    "comm_hbm_factor": "assumed: ring all-reduce reads and writes local HBM about 3x per bus byte",
    **{name: _SWEEP_FIT for name in (
        "tuned_bw_per_sm_mhz", "tuned_block_exponent", "tuned_link_fraction", "tuned_pipelining",
        "comm_launch_s",
        "comm_rate_beside_memory", "comm_rate_beside_gemm", "comm_rate_beside_attention",
        "overlap_slowdown_memory", "overlap_slowdown_gemm", "overlap_slowdown_attention",
        "host_issue_memory_s", "host_issue_gemm_s", "host_issue_attention_s",
        "partition_harness_s", "partial_wave_loss")},
    "library_rate_beside": "assumed: NCCL keeps ~80% of its throughput beside compute",
    "precisions": "datasheet: Ampere and Hopper tensor cores run bf16, fp16 and tf32",
    "fp32_flops_per_clk_per_sm": "datasheet: 64 fp32 FMA units per SM (A100: 19.5 TFLOP/s)",
    "network_efficiency": ("assumed: NCCL's rings reach ~80% of the NICs' bandwidth (vTrain's "
                           "64-GPU runs, fitted, push it to its 1.0 bound and 7.1% MAPE, against "
                           "8.7% at 0.8: the 800 Gb/s per node their configs state is a floor)"),
    "network_hop_latency_s": ("assumed: ~10 us per ring/tree step over InfiniBand or EFA (vTrain's "
                              "64-GPU runs do not pin it: fitted it runs to its 1 us bound and "
                              "moves their MAPE by 0.04 points)"),
    "host_eager_op_s": _MEGATRON_FIT_COMMON,
    **{name: ("fitted: benchmarks/fidelity.py --fit (its second stage) on the Kareus "
              "artifact's measured ratios of Nanobatching + Perseus's fastest time to Perseus's "
              "(A100 SXM4 40 GB testbed; docs/simulator.md, 'The host inside an iteration'); the "
              "host and the framework, not the GPU, so every preset reuses it")
       for name in ("host_issue_call_s", "iteration_host_fraction")},
    "comm_block_default": "published: 1024 threads per block, the faster of the two block sizes "
                          "in the Kareus artifact's sweep at every SM count",
    "comm_max_sms": "datasheet: NCCL/MSCCL++ launch at most 32 channels (NCCL_MAX_NCHANNELS)",
    "kernel_overhead_s": "assumed: ~4 us launch + tail per kernel",
    "link_dyn_power_w": _SWEEP_FIT + " (energy: NVLink and fabric power at full link rate)",
    "activity_gemm": "definition: the reference activity",
    **{f"reference_{k}_efficiency": "definition: the efficiency the A100 power fit assumed "
                                    "(the preset's prior before calibration to the frontiers)"
       for k in ("gemm", "attention", "hbm")},
    "activity_attention": "assumed: softmax/masking leave tensor cores idle part of the time",
    "activity_memory": "assumed: memory-bound kernels keep ~1/3 of the SM logic switching",
    "activity_comm": _SWEEP_FIT + " (energy: the collective's SMs)",
    "library_activity_comm": "assumed: NCCL's channels switch about as much as the tuned "
                             "collective's SMs in the partition sweep (~0.2)",
}

_A100_FIT = "fitted: benchmarks/calibration.py on perseus_sosp24 gpt3-175b+a100_sxm_bf16.csv"
_A40_FIT = ("fitted: benchmarks/calibration.py on perseus_sosp24 gpt3-175b+a40_bf16.csv, with the "
            "held cap (295 W) and sustained-clock ceiling fitted alongside (2026-12-04; Bloom "
            "hold-out: energy MAPE 2.3 % relative to 1740 MHz)")


def _preset(sources: dict[str, str], **values: float) -> GPUPreset:
    merged = dict(_COMMON_SOURCES)
    merged.update(sources)
    preset = GPUPreset(**values)  # type: ignore[arg-type]
    missing = [f.name for f in fields(preset) if f.name not in ("name", "sources")
               and f.name not in merged]
    assert not missing, f"preset {preset.name} lacks sources for {missing}"
    return replace(preset, sources=MappingProxyType(merged))


# Fitted from the A100 SXM4 80 GB (500 W) GPT-3 175B profile by benchmarks/calibration.py (the
# 40 GB part shares the GA100 die, clocks and V-f curve; it differs in HBM, static and cap power).
_A100_SM_DYN_W = 438.1
#: HBM dynamic power at full bandwidth: ~3.9 pJ/bit for HBM2/HBM2e x bandwidth x 8 bit/B
#: (assumed; clock sweeps cannot identify it because HBM keeps its own clock).
_HBM2_J_PER_BYTE = 3.9e-12 * 8
_A100_80_HBM_DYN_W = _HBM2_J_PER_BYTE * 2.039e12
_A100_KNEE_MHZ = 1077.2
_A100_V_RATIO = 1.318

#: Fitted by `python benchmarks/fidelity.py --fit` on the Kareus artifact's measured Perseus and
#: Nanobatching + Perseus frontiers (16 x A100 SXM4 40 GB, shared/kareus_artifact/
#: calibration_frontiers.csv): what the testbed's Megatron-LM / Transformer Engine kernels reach
#: (effective: time per counted FLOP or byte), the 40 GB part's SM power, how much of its
#: throughput NCCL keeps beside compute and how much NCCL's channels switch (the partition sweep
#: measured MSCCL++'s kernel, not NCCL's). Priors: 0.80, 0.85, 438.1 W (the 80 GB fit), 0.8, 0.19.
_A100_40_FRONTIER = dict(gemm_efficiency=0.7085, hbm_efficiency=0.4783, sm_dyn_power_w=409.5,
                         library_rate_beside=1.0, library_activity_comm=0.7288)
_FRONTIER_FIT = ("fitted: benchmarks/fidelity.py --fit on the Kareus artifact's measured "
                 "iteration frontiers (calibration_frontiers.csv, A100 SXM4 40 GB testbed)")

#: Fitted by `python benchmarks/fidelity.py --fit-megatron` on vTrain's 1,440 measured single-node
#: Megatron-LM runs (shared/vtrain_megatron/single_node.csv; A100 SXM, fp16, Megatron-LM's unfused
#: attention): what that software reaches on the A100's memory-bound kernels, and how a GEMM's
#: efficiency falls with its reduction depth. Priors: 0.85 and 128.
_A100_80_FIT = dict(hbm_efficiency=0.8012, gemm_depth_half=568.7)
_MEGATRON_FIT = ("fitted: benchmarks/fidelity.py --fit-megatron on vTrain's measured single-node "
                 "Megatron-LM runs (shared/vtrain_megatron/single_node.csv)")

_A100_COMMON = dict(
    sms=108, flops_per_clk_per_sm=2048.0, tf32_flops_per_clk_per_sm=1024.0, clock_min_mhz=210.0, clock_max_mhz=1410.0,
    clock_step_mhz=15.0, nvlink_bw=300e9, network_bw=25e9,
    sm_dyn_power_w=_A100_SM_DYN_W, knee_mhz=_A100_KNEE_MHZ, v_ratio=_A100_V_RATIO,
)
_A100_SOURCES = {
    "sms": "datasheet: NVIDIA A100 whitepaper, 108 SMs",
    "flops_per_clk_per_sm": "datasheet: 312 TFLOP/s bf16 dense = 108 SMs x 2048 x 1.41 GHz",
    "tf32_flops_per_clk_per_sm": "datasheet: 156 TFLOP/s TF32 dense = 108 SMs x 1024 x 1.41 GHz",
    "clock_min_mhz": "datasheet: nvidia-smi supported clocks 210-1410 MHz",
    "clock_max_mhz": "datasheet: 1410 MHz boost",
    "clock_step_mhz": "datasheet: 15 MHz steps",
    "nvlink_bw": "datasheet: NVLink 3, 600 GB/s total = 300 GB/s per direction",
    "network_bw": "datasheet: DGX A100, one 200 Gb/s HDR InfiniBand NIC per GPU",
    "sm_dyn_power_w": _A100_FIT,
    "knee_mhz": _A100_FIT,
    "v_ratio": _A100_FIT,
}

PRESETS: dict[str, GPUPreset] = {
    p.name: p
    for p in (
        _preset(
            {**_A100_SOURCES,
             "memory_bytes": "datasheet: 40 GB HBM2",
             "hbm_bw": "datasheet: 1.555 TB/s",
             "power_limit_w": "datasheet: 400 W",
             "static_power_w": "published: 85 W blocked-on-P2P power (Kareus paper)",
             "hbm_dyn_power_w": "assumed: ~3.9 pJ/bit (HBM2) x 1.555 TB/s",
             "network_bw": "published: the paper's testbed, 4 x 100 Gb/s EFA per node of 8 "
                           "GPUs = 6.25 GB/s per GPU (hardware.md)",
             **{k: _FRONTIER_FIT for k in _A100_40_FRONTIER}},
            name="a100-sxm4-40gb", memory_bytes=40e9, hbm_bw=1.555e12, power_limit_w=400.0,
            static_power_w=85.0, hbm_dyn_power_w=_HBM2_J_PER_BYTE * 1.555e12,
            **{**_A100_COMMON, "network_bw": 400e9 / 8 / 8, **_A100_40_FRONTIER},
        ),
        _preset(
            {**_A100_SOURCES,
             "memory_bytes": "datasheet: 80 GB HBM2e",
             "hbm_bw": "datasheet: 2.039 TB/s",
             "power_limit_w": "datasheet: 400 W and 500 W SKUs exist; 500 W, the Perseus parts",
             "static_power_w": "published: 83.64 W (Perseus artifact)",
             "hbm_dyn_power_w": "assumed: ~3.9 pJ/bit (HBM2e) x 2.039 TB/s",
             **{k: _MEGATRON_FIT for k in _A100_80_FIT}},
            name="a100-sxm4-80gb", memory_bytes=80e9, hbm_bw=2.039e12, power_limit_w=500.0,
            static_power_w=83.64, hbm_dyn_power_w=_A100_80_HBM_DYN_W,
            **{**_A100_COMMON, **_A100_80_FIT},
        ),
        _preset(
            {"sms": "datasheet: NVIDIA A40, 84 SMs (GA102)",
             "flops_per_clk_per_sm": "datasheet: ~150 TFLOP/s bf16 dense = 84 x 1024 x 1.74 GHz",
             "tf32_flops_per_clk_per_sm": "datasheet: 74.8 TFLOP/s TF32 dense = 84 x 512 x "
                                          "1.74 GHz",
             "fp32_flops_per_clk_per_sm": "datasheet: 37.4 TFLOP/s fp32 = 84 x 256 x 1.74 GHz",
             "clock_min_mhz": "datasheet: 210 MHz", "clock_max_mhz": "datasheet: 1740 MHz",
             "clock_step_mhz": "datasheet: 15 MHz",
             "memory_bytes": "datasheet: 48 GB GDDR6", "hbm_bw": "datasheet: 696 GB/s",
             "nvlink_bw": "datasheet: NVLink bridge pairs, 112.5 GB/s total; PCIe 4.0 x16 "
                          "(~25 GB/s) between other GPUs -- modelled as PCIe",
             "network_bw": "assumed: 100 Gb/s per node shared, ~12.5 GB/s",
             "power_limit_w": "datasheet: 300 W",
             "static_power_w": "published: 70.38 W (Perseus artifact)",
             "sm_dyn_power_w": _A40_FIT,
             "hbm_dyn_power_w": "assumed: ~7.5 pJ/bit (GDDR6) x 696 GB/s",
             "knee_mhz": _A40_FIT, "v_ratio": _A40_FIT},
            name="a40", sms=84, flops_per_clk_per_sm=1024.0, tf32_flops_per_clk_per_sm=512.0,
            fp32_flops_per_clk_per_sm=256.0, clock_min_mhz=210.0,
            clock_max_mhz=1740.0, clock_step_mhz=15.0, memory_bytes=48e9, hbm_bw=696e9,
            nvlink_bw=25e9, network_bw=12.5e9, power_limit_w=300.0, static_power_w=70.38,
            sm_dyn_power_w=469.2, hbm_dyn_power_w=7.5e-12 * 8 * 696e9, knee_mhz=1094.9, v_ratio=1.344,
            comm_default_sms=16,
        ),
    )
}

def _a100_pcie(name: str, memory: float, hbm_bw: float, power_limit: float, static: float,
               mem_src: str, bw_src: str, limit_src: str, static_src: str) -> GPUPreset:
    """An A100 PCIe card: the GA100 die, clocks and V-f curve of the SXM module (the 80 GB SXM
    fit), a lower board power limit, and four GPUs of a node that talk over PCIe 4.0 x16 (no
    NVLink bridges)."""
    sxm = PRESETS["a100-sxm4-80gb"]
    return _preset(
        {**_A100_SOURCES, **{k: sxm.sources[k] for k in _A100_80_FIT},
         "memory_bytes": mem_src, "hbm_bw": bw_src, "power_limit_w": limit_src,
         "static_power_w": static_src,
         "hbm_dyn_power_w": "assumed: ~3.9 pJ/bit (HBM2/HBM2e) x bandwidth",
         "nvlink_bw": "datasheet: PCIe 4.0 x16, 32 GB/s per direction (no NVLink bridge "
                      "between the 4 GPUs of a PCIe node)",
         "network_bw": "assumed: one 200 Gb/s NIC per GPU, as the SXM nodes",
         "comm_default_sms": "assumed: NCCL opens few channels over PCIe (the link, not the "
                             "SMs, limits it)"},
        name=name, memory_bytes=memory, hbm_bw=hbm_bw, power_limit_w=power_limit,
        static_power_w=static, hbm_dyn_power_w=_HBM2_J_PER_BYTE * hbm_bw,
        **{**_A100_COMMON, "nvlink_bw": 32e9, "comm_default_sms": 4, **_A100_80_FIT},
    )


PRESETS["a100-pcie-80gb"] = _a100_pcie(
    "a100-pcie-80gb", 80e9, 1.935e12, 300.0, 83.64, "datasheet: 80 GB HBM2e",
    "datasheet: 1.935 TB/s", "datasheet: 300 W (A100 80GB PCIe)",
    "assumed: the 80 GB SXM part's 83.64 W (Perseus artifact): same die and HBM2e")
PRESETS["a100-pcie-40gb"] = _a100_pcie(
    "a100-pcie-40gb", 40e9, 1.555e12, 250.0, 85.0, "datasheet: 40 GB HBM2",
    "datasheet: 1.555 TB/s", "datasheet: 250 W (A100 40GB PCIe)",
    "assumed: the 40 GB SXM part's 85 W (Kareus paper): same die and HBM2")

_HOPPER_SOURCES = {
    "sms": "datasheet: H100 SXM5, 132 SMs",
    "flops_per_clk_per_sm": "datasheet: 4096 bf16 FLOP/clk/SM (989 TFLOP/s at 1830 MHz)",
    "tf32_flops_per_clk_per_sm": "datasheet: 2048 TF32 FLOP/clk/SM (494 TFLOP/s dense)",
    "fp32_flops_per_clk_per_sm": "datasheet: 128 fp32 FMA units per SM (67 TFLOP/s)",
    "clock_min_mhz": "datasheet: 345 MHz", "clock_max_mhz": "datasheet: 1980 MHz",
    "clock_step_mhz": "datasheet: 15 MHz",
    "nvlink_bw": "datasheet: NVLink 4, 900 GB/s total = 450 GB/s per direction",
    "network_bw": "datasheet: DGX H100, one 400 Gb/s NDR NIC per GPU",
    "power_limit_w": "datasheet: 700 W",
    "static_power_w": "assumed: unpublished; idle ~71-75 W x the A100's blocked/idle ratio (~1.45)",
    "sm_dyn_power_w": "derived: A100 fit x (700-110)/(400-85) budget ratio x 0.95 (4N node)",
    "knee_mhz": "derived: A100 fitted knee at the same fraction of the max clock (0.70)",
    "v_ratio": "derived: A100 fit",
    "comm_bw_per_sm_mhz": "assumed: ~12 GB/s per channel at 1980 MHz",
}


def _hopper(name: str, memory: float, hbm_bw: float, hbm_power: float, mem_src: str,
            bw_src: str) -> GPUPreset:
    return _preset(
        {**_HOPPER_SOURCES, "memory_bytes": mem_src, "hbm_bw": bw_src,
         "hbm_dyn_power_w": "assumed: ~3.5 pJ/bit (HBM3/HBM3e) x bandwidth"},
        name=name, sms=132, flops_per_clk_per_sm=4096.0, tf32_flops_per_clk_per_sm=2048.0,
        fp32_flops_per_clk_per_sm=256.0, clock_min_mhz=345.0,
        clock_max_mhz=1980.0, clock_step_mhz=15.0, memory_bytes=memory, hbm_bw=hbm_bw,
        nvlink_bw=450e9, network_bw=50e9, power_limit_w=700.0, static_power_w=110.0,
        sm_dyn_power_w=_A100_SM_DYN_W * (700 - 110) / (400 - 85) * 0.95,
        hbm_dyn_power_w=hbm_power, knee_mhz=round(0.70 * 1980 / 15) * 15,
        v_ratio=_A100_V_RATIO, comm_bw_per_sm_mhz=12e9 / 1980,
    )


PRESETS["h100-sxm"] = _hopper("h100-sxm", 80e9, 3.35e12, 3.5e-12 * 8 * 3.35e12,
                              "datasheet: 80 GB HBM3", "datasheet: 3.35 TB/s")
PRESETS["h200"] = _hopper("h200", 141e9, 4.8e12, 3.5e-12 * 8 * 4.8e12,
                          "datasheet: 141 GB HBM3e", "datasheet: 4.8 TB/s")

DEFAULT_GPU = "a100-sxm4-40gb"


@dataclass(frozen=True)
class PartitionOpFactors:
    """The per-op part of a partition fit: what a measured partition's own kernels cost beyond
    the simulator's FLOP and byte counts (see :mod:`kareus.backends.partition_calibration`).

    Attributes:
        op_work: Work factor of each op of the spec, in program order (its FLOPs and bytes are
            that many times what the spec's shapes count).
        op_host: Host-issue factor of each op (times its class's host issue time).
        source: Where the factors come from.
    """

    op_work: tuple[float, ...]
    op_host: tuple[float, ...]
    source: str


#: The per-op factors of the partition fits behind the presets' partition laws, by (GPU preset,
#: spec hash: :attr:`workloads.partition_spec.PartitionSpec.sha256`). They come from the same
#: fit as the law's parameters above, so ``kareus partition`` without ``--calibration`` predicts
#: the artifact's partition as a fresh ``kareus calibrate`` would (the iteration model uses the
#: law alone: its ops are counted, not fitted).
_PARTITION_OP_FACTORS: MappingProxyType = MappingProxyType({
    ("a100-sxm4-40gb", "5687b86cf4b0cad7364b6fee84feb940a87e42bbb429914cdec2c5e20ae2ff61"):
        PartitionOpFactors(
            op_work=(0.7576, 0.5783, 1.002, 0.7222, 0.7919, 0.7125, 6.169),
            op_host=(0.6409, 0.805, 0.6745, 1.819, 1.819, 0.8847, 1),
            source=_SWEEP_FIT),
})


def partition_op_factors(gpu: str, spec_sha256: str) -> PartitionOpFactors | None:
    """The preset's own per-op factors for a partition spec, or ``None`` when the preset's law
    was not fitted on that partition."""
    return _PARTITION_OP_FACTORS.get((gpu, spec_sha256))


def get_preset(name: str) -> GPUPreset:
    """Look a preset up by name; raises :class:`PresetError` naming the valid choices."""
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(f"unknown GPU {name!r}; choose one of: {', '.join(PRESETS)}") from None
