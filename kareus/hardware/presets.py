"""GPU presets: every number the simulator uses about a GPU, with where it came from.

The presets are data: one JSON file per GPU in ``kareus/hardware/gpus/`` (and, for a user's own
GPUs, in the folder ``$KAREUS_GPU_DIR`` names), grouped as :data:`GROUPS` says (compute, memory,
links and collectives, overlap per kernel class, host, power), every value with its source:
``datasheet`` (vendor specification), ``published`` (a measurement in a paper), ``measured`` (a
reading taken on the card itself, such as CUDA's device query, and where it was published),
``fitted`` (the command and the measurement it was fitted on), ``derived`` (computed from other
entries, the rule stated), ``definition`` or ``assumed`` (a modelling prior with its reasoning).
What belongs to the host and the framework rather than the GPU, and so is the same for every GPU,
lives once in ``kareus/hardware/host.json`` (:data:`SHARED_FILE`, same form), as do the collective
libraries' defaults that a GPU with its own measurement overrides (NCCL's latency per ring step, a
tuned collective's fixed cost); every GPU file takes those values unless it sets its own. Refits
write the files (:func:`update_preset_file`: ``kareus calibrate --partition-sweep ...
--write-preset``, ``benchmarks/fidelity.py --fit/--fit-megatron --write-preset``), a built-in
preset's shared value to the shared file only, so a refit is a one-file diff; a user's GPU file
(``$KAREUS_GPU_DIR``) gets its refit shared value itself. In memory a preset is the flat, frozen
:class:`GPUPreset` the simulator reads.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kareus.errors import PresetError
from kareus.inputs import file_problem, loads_json


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
        memory_bytes: Device memory a process can allocate (bytes): CUDA's total where it was
            read (the card's binary capacity less ECC's share on GDDR and the driver's
            reservation), else nvidia-smi's; each preset's source says which.
        hbm_bw: HBM bandwidth (B/s); independent of the SM clock.
        nvlink_bw: Intra-node link bandwidth per GPU per direction (B/s): NVLink, or PCIe on
            PCIe cards.
        network_bw: Inter-node network bandwidth per GPU per direction (B/s): one NIC per GPU
            (rail-optimised), so a ring crossing nodes with ``k`` ranks on each node uses ``k``
            NICs at once.
        network_efficiency: Fraction of the NICs' bandwidth NCCL's rings reach across nodes.
        network_hop_latency_s: Latency of one step of a ring or tree across the network (s); a
            ring all-reduce over ``N`` nodes takes ``2(N-1)`` such steps, a tree
            ``2·floor(log2 N)``, and NCCL takes the faster.
        host_eager_op_s: Host time the framework (eager PyTorch, Megatron-LM) spends to issue one
            compute op outside partitions (s). A kernel of a sequential instruction starts when it
            has been issued and the one before it is done (with ``host_issue_call_s`` per
            collective): the host runs ahead of long kernels, and short ones wait for its issue.
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
        comm_step_latency_s: Latency of each step of the collective library's ring inside a node
            (s): an all-reduce of ``n`` ranks takes ``2(n - 1)`` steps, an all-gather or
            reduce-scatter ``n - 1``, a send one.
        comm_hbm_factor: HBM bytes a collective moves per bus byte (reads, writes, reductions).
        tuned_bw_per_sm_mhz: Throughput of one SM of a tuned side-stream collective (the
            MSCCL++ kernels Kareus schedules, ``comm_block_default`` threads per block) per MHz of
            clock (bus B/s/MHz).
        tuned_block_exponent: Per-SM throughput of a tuned collective scales as
            ``(threads / comm_block_default) ** this`` (memory-level parallelism per SM).
        tuned_link_fraction: Fraction of the link's bandwidth (per direction) that the tuned
            collective's link path reaches.
        tuned_link_fraction_beside_compute: The most a tuned collective moves beside a GEMM or
            attention kernel, as a fraction of the link: its remote loads are served by the peer
            GPU's memory system, which the peer's own compute keeps busy.
        tuned_pipelining: How the two limits of a tuned collective combine, the exponent ``p``
            of the soft minimum ``rate = ((SMs · per-SM rate)^-p + (link path)^-p)^(-1/p)``.
            ``p = 1`` is store-and-forward (the SMs' time and the link's add: no overlap between
            copying a chunk and sending the previous one); larger ``p`` is a chunked pipeline in
            which the slower of the two sets the rate and the knee between them is sharper.
        comm_block_default: Threads per block of a tuned collective unless a plan says otherwise.
        comm_max_sms: Most SMs (thread blocks) the collective library accepts for one kernel.
        comm_launch_s: Host time to launch a side-stream collective (s).
        tuned_latency_s: Fixed cost of one tuned collective (launch, its grid barriers), s: it
            reads its peers directly and pays no ring steps.
        comm_rate_beside_memory: A tuned collective's SM path (its per-SM rate) while a
            memory-bound kernel runs beside it, relative to alone (its loads queue behind the
            kernel's); its link path is unchanged.
        comm_rate_beside_gemm, comm_rate_beside_attention: A tuned collective's throughput while
            a kernel of that class runs beside it, relative to alone (HBM, L2 and issue
            contention).
        library_rate_beside: The library collective's (NCCL's) throughput while compute runs
            beside it, relative to alone.
        overlap_slowdown_memory, overlap_slowdown_gemm, overlap_slowdown_attention: Extra
            slowdown of a compute kernel of that class per unit of ``collective SMs / SMs``
            beside a collective, on top of the SMs it loses (contention).
        host_issue_memory_s, host_issue_gemm_s, host_issue_attention_s: Host (CPU) time to issue
            one compute op of that class inside a synchronised partition (s); inside a partition
            the GPU waits for the host when an op is issued later than the previous op ends.
        host_issue_call_s: Host time of one framework call an op makes besides issuing its own
            kernel (:attr:`~kareus.graph.ComputeOp.host_calls`; s); outside partitions, also
            what issuing a collective costs (one call into the communication library).
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
    tf32_flops_per_clk_per_sm: float
    fp32_flops_per_clk_per_sm: float
    precisions: tuple[str, ...]
    network_efficiency: float
    network_hop_latency_s: float
    host_eager_op_s: float
    gemm_efficiency: float
    gemm_depth_half: float
    attention_efficiency: float
    attention_bwd_efficiency: float
    hbm_efficiency: float
    link_efficiency: float
    mem_sat_sm_fraction: float
    comm_bw_per_sm_mhz: float
    comm_default_sms: int
    comm_latency_s: float
    comm_step_latency_s: float
    comm_hbm_factor: float
    tuned_bw_per_sm_mhz: float
    tuned_block_exponent: float
    tuned_link_fraction: float
    tuned_link_fraction_beside_compute: float
    tuned_pipelining: float
    comm_block_default: int
    comm_max_sms: int
    comm_launch_s: float
    tuned_latency_s: float
    comm_rate_beside_memory: float
    comm_rate_beside_gemm: float
    comm_rate_beside_attention: float
    library_rate_beside: float
    overlap_slowdown_memory: float
    overlap_slowdown_gemm: float
    overlap_slowdown_attention: float
    host_issue_memory_s: float
    host_issue_gemm_s: float
    host_issue_attention_s: float
    host_issue_call_s: float
    iteration_host_fraction: float
    partition_harness_s: float
    partial_wave_loss: float
    kernel_overhead_s: float
    link_dyn_power_w: float
    activity_gemm: float
    activity_attention: float
    activity_memory: float
    activity_comm: float
    library_activity_comm: float
    reference_gemm_efficiency: float
    reference_attention_efficiency: float
    reference_hbm_efficiency: float
    sources: MappingProxyType = field(default_factory=lambda: MappingProxyType({}), compare=False)

    @property
    def peak_flops(self) -> float:
        """Dense 16-bit tensor peak at the maximum clock (FLOP/s)."""
        return self.sms * self.flops_per_clk_per_sm * self.clock_max_mhz * 1e6

    def peak_flops_in(self, precision: str) -> float:
        """Dense peak of the math in ``precision`` at the maximum clock (FLOP/s): the tensor
        cores' for bf16, fp16 and tf32, the FP32 units' for fp32."""
        return self.sms * self.flops_per_clk(precision) * self.clock_max_mhz * 1e6

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

    def source_kinds(self) -> dict[str, int]:
        """How many of the preset's numbers are of each kind of source (the word before the
        colon of each :attr:`sources` entry: datasheet, published, measured, fitted, derived,
        assumed, ...), most common first."""
        counts: dict[str, int] = {}
        for text in self.sources.values():
            kind = text.split(":", 1)[0].strip() if ":" in text else "unstated"
            counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def provenance(self) -> str:
        """One line saying where the preset's numbers come from, by kind, and where to read
        each one's source."""
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.source_kinds().items())
        return (f"{self.name}'s numbers: {kinds or 'no sources recorded'} (each one's source: "
                f"`kareus gpus --json`)")

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


@dataclass(frozen=True)
class PartitionOpFactors:
    """The per-op part of a partition fit: what a measured partition's own kernels cost beyond
    the simulator's FLOP and byte counts (see :mod:`kareus.backends.partition_calibration`).

    Attributes:
        op_work: Work factor of each kernel of the spec's partition (``spec.partition()``: the
            fuser's basic ops), in program order (its FLOPs and bytes are that many times what
            the spec's shapes count).
        op_host: Host-issue factor of each op (times its class's host issue time).
        source: Where the factors come from.
    """

    op_work: tuple[float, ...]
    op_host: tuple[float, ...]
    source: str


# --- Presets as data ----------------------------------------------------------------------------
#
# One JSON file per GPU: the built-in ones in ``kareus/hardware/gpus/`` (package data), a user's
# in the folder ``$KAREUS_GPU_DIR`` names. A file holds the preset's ``name`` (its file name without
# ``.json``), one object per group of :data:`GROUPS`, each entry ``{"value": ..., "source":
# "kind: where the number comes from"}``, and optionally ``partition_op_factors``: the per-op
# factors of the partition fits behind the law, ``[{"spec_sha256", "op_work", "op_host",
# "source"}]``. A field of the shared file (:data:`SHARED_FILE`: the host's and the framework's
# values, grouped the same way) may be left out: the GPU takes the shared value and its source. A
# GPU file that sets it overrides it. Refits write these files (:func:`update_preset_file`), one
# line per value.

#: The file groups and the :class:`GPUPreset` fields each holds, in file order.
GROUPS: dict[str, tuple[str, ...]] = {
    "compute": ("sms", "flops_per_clk_per_sm", "tf32_flops_per_clk_per_sm",
                "fp32_flops_per_clk_per_sm", "precisions", "clock_min_mhz", "clock_max_mhz",
                "clock_step_mhz", "gemm_efficiency", "gemm_depth_half", "attention_efficiency",
                "attention_bwd_efficiency", "partial_wave_loss", "kernel_overhead_s"),
    "memory": ("memory_bytes", "hbm_bw", "hbm_efficiency", "mem_sat_sm_fraction"),
    "links_collectives": ("nvlink_bw", "network_bw", "network_efficiency",
                          "network_hop_latency_s", "link_efficiency", "comm_bw_per_sm_mhz",
                          "comm_default_sms", "comm_max_sms", "comm_latency_s",
                          "comm_step_latency_s", "comm_hbm_factor", "comm_launch_s",
                          "tuned_latency_s", "comm_block_default", "tuned_bw_per_sm_mhz",
                          "tuned_block_exponent", "tuned_link_fraction",
                          "tuned_link_fraction_beside_compute", "tuned_pipelining",
                          "library_rate_beside"),
    "overlap": ("comm_rate_beside_memory", "comm_rate_beside_gemm", "comm_rate_beside_attention",
                "overlap_slowdown_memory", "overlap_slowdown_gemm", "overlap_slowdown_attention",
                "partition_harness_s"),
    "host": ("host_eager_op_s", "host_issue_memory_s", "host_issue_gemm_s",
             "host_issue_attention_s", "host_issue_call_s", "iteration_host_fraction"),
    "power": ("power_limit_w", "static_power_w", "sm_dyn_power_w", "hbm_dyn_power_w",
              "link_dyn_power_w", "knee_mhz", "v_ratio", "activity_gemm", "activity_attention",
              "activity_memory", "activity_comm", "library_activity_comm",
              "reference_gemm_efficiency", "reference_attention_efficiency",
              "reference_hbm_efficiency"),
}
_GROUP_OF = {f: g for g, names in GROUPS.items() for f in names}
_INT_FIELDS = frozenset(f.name for f in fields(GPUPreset) if f.type in ("int", int))
_PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
_TOP_KEYS = frozenset({"name", "description", "partition_op_factors", *GROUPS})
assert set(_GROUP_OF) == {f.name for f in fields(GPUPreset)} - {"name", "sources"}

#: The built-in presets' folder (package data).
BUILTIN_DIR = Path(__file__).with_name("gpus")
#: The values every GPU shares, because they are the host's and the framework's (eager PyTorch,
#: Megatron-LM, the collective libraries), not the GPU's, unless a GPU file sets its own:
#: ``{"description", GROUP: {field: {"value", "source"}}}``.
SHARED_FILE = Path(__file__).with_name("host.json")
#: Environment variable naming a folder of the user's own GPU files.
USER_DIR_ENV = "KAREUS_GPU_DIR"

DEFAULT_GPU = "a100-sxm4-40gb"


def _number(v: object, integer: bool) -> bool:
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
        return False
    return bool(np.isfinite(v)) and v >= 0


def _check_value(path: Path, key: str, name: str, v: object) -> object:
    if name == "precisions":
        if not (isinstance(v, list) and v and all(p in _PRECISIONS for p in v)):
            raise PresetError(f"{path}: {key} must be a list of {', '.join(_PRECISIONS)}, "
                              f"got {v!r}")
        return tuple(v)
    integer = name in _INT_FIELDS
    if not _number(v, integer):
        raise PresetError(f"{path}: {key} must be a non-negative "
                          f"{'integer' if integer else 'number'}, got {v!r}")
    return v


#: The shared file's entries by field: ``{field: {"value": ..., "source": ...}}``.
Shared = dict[str, dict[str, object]]


def _entries(path: Path, raw: dict, group: str, names: tuple[str, ...], optional: bool
             ) -> dict[str, object]:
    """The ``group`` object of a file, its fields checked to belong there (``optional``: an
    absent group reads as empty)."""
    entries = raw.get(group, {} if optional else None)
    if not isinstance(entries, dict):
        raise PresetError(f"{path}: missing group {group!r} (an object of "
                          "{\"field\": {\"value\": ..., \"source\": ...}})")
    for k in entries:
        if k not in names:
            where = f"; it belongs in {_GROUP_OF[k]!r}" if k in _GROUP_OF else ""
            raise PresetError(f"{path}: unknown field {group}.{k}{where}")
    return entries


def _entry(path: Path, key: str, name: str, e: object) -> dict[str, object]:
    """One ``{"value", "source"}`` entry, checked; its value as the preset holds it."""
    if not isinstance(e, dict) or set(e) != {"value", "source"}:
        raise PresetError(f"{path}: {key} must be {{\"value\": ..., \"source\": ...}}")
    if not isinstance(e["source"], str) or not e["source"].strip():
        raise PresetError(f"{path}: {key} needs a source (\"kind: where it comes from\")")
    return {"value": _check_value(path, key, name, e["value"]), "source": e["source"]}


def load_shared(path: str | Path | None = None) -> Shared:
    """The entries of the shared file at ``path`` [:data:`SHARED_FILE`] by field;
    :class:`PresetError` (one line) if malformed."""
    p = Path(path) if path is not None else SHARED_FILE
    return _parse_shared(p, _read_json(p, "shared preset file"))


def _parse_shared(p: Path, raw: object) -> Shared:
    if not isinstance(raw, dict) or set(raw) - {"description", *GROUPS}:
        raise PresetError(f"{p}: the shared file holds \"description\" and groups of "
                          f"{', '.join(GROUPS)}")
    out: Shared = {}
    for group, names in GROUPS.items():
        for n, e in _entries(p, raw, group, names, optional=True).items():
            out[n] = _entry(p, f"{group}.{n}", n, e)
    return out


def _parse(path: Path, raw: object, shared: Shared | None = None
           ) -> tuple[GPUPreset, dict[str, PartitionOpFactors]]:
    """A preset file's content -> the preset and its partition op factors (by spec hash), the
    fields it leaves out taken from ``shared`` [the shared file's]; :class:`PresetError` with
    one line naming the file and the field otherwise."""
    if shared is None:
        shared = _shared()
    if not isinstance(raw, dict):
        raise PresetError(f"{path}: a GPU file holds one JSON object")
    name = raw.get("name")
    if name != path.stem:
        raise PresetError(f"{path}: name must be the file's name, {path.stem!r}; got {name!r}")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise PresetError(f"{path}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(_TOP_KEYS))})")
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for group, names in GROUPS.items():
        entries = _entries(path, raw, group, names, optional=all(n in shared for n in names))
        for n in names:
            key = f"{group}.{n}"
            e = entries.get(n)
            if e is None and n not in shared:
                raise PresetError(f"{path}: missing field {key}")
            checked = shared[n] if e is None else _entry(path, key, n, e)
            values[n] = checked["value"]
            sources[n] = str(checked["source"])
    factors: dict[str, PartitionOpFactors] = {}
    pof = raw.get("partition_op_factors", [])
    if not isinstance(pof, list):
        raise PresetError(f"{path}: partition_op_factors must be a list")
    for i, f in enumerate(pof):
        key = f"partition_op_factors[{i}]"
        if not (isinstance(f, dict) and set(f) == {"spec_sha256", "op_work", "op_host", "source"}
                and isinstance(f["spec_sha256"], str) and isinstance(f["source"], str)
                and all(isinstance(f[k], list) and f[k] and len(f[k]) == len(f["op_work"])
                        and all(_number(x, False) and x > 0 for x in f[k])
                        for k in ("op_work", "op_host"))):
            raise PresetError(f"{path}: {key} must be {{spec_sha256, op_work, op_host, source}} "
                              "with equally long lists of positive numbers")
        factors[f["spec_sha256"]] = PartitionOpFactors(tuple(f["op_work"]), tuple(f["op_host"]),
                                                       f["source"])
    # The fields come by name from the file, each value checked against its own field by
    # _check_value (the precisions a tuple of names, integer fields integers, the rest numbers);
    # mypy cannot tie a value looked up by name to that field's type.
    preset = GPUPreset(name=name, sources=MappingProxyType(sources), **values)  # type: ignore[arg-type]
    why = physical_problem(preset)
    if why:
        raise PresetError(f"{path}: {why}")
    return preset, factors


#: The most clock steps a preset's range may hold: every optimizer sweeps the grid, and real GPUs
#: have about a hundred lockable clocks (A100: 81 from 210 to 1410 MHz in 15 MHz steps).
MAX_CLOCK_STEPS = 10_000

#: Preset fields that must be above zero: a GPU without SMs, clocks, memory, bandwidth or a power
#: budget, or a kernel class without efficiency, cannot run anything.
_POSITIVE_FIELDS = (
    "sms", "flops_per_clk_per_sm", "clock_min_mhz", "clock_max_mhz", "clock_step_mhz",
    "memory_bytes", "hbm_bw", "nvlink_bw", "network_bw", "power_limit_w", "gemm_efficiency",
    "attention_efficiency", "attention_bwd_efficiency", "hbm_efficiency", "link_efficiency",
    "network_efficiency", "comm_bw_per_sm_mhz", "comm_default_sms", "tuned_bw_per_sm_mhz",
    "comm_block_default", "comm_max_sms")

#: Preset fields that are shares of a peak, a budget, a whole or a rate alone, so at most 1: a
#: kernel, a link or the network past its own peak is a typo, not a GPU.
_FRACTION_FIELDS = (
    "gemm_efficiency", "attention_efficiency", "attention_bwd_efficiency", "hbm_efficiency",
    "link_efficiency", "network_efficiency", "mem_sat_sm_fraction", "tuned_link_fraction",
    "tuned_link_fraction_beside_compute", "iteration_host_fraction", "partial_wave_loss",
    "comm_rate_beside_memory", "comm_rate_beside_gemm", "comm_rate_beside_attention",
    "library_rate_beside",
    "reference_gemm_efficiency", "reference_attention_efficiency", "reference_hbm_efficiency")


def physical_problem(preset: GPUPreset) -> str:
    """Why ``preset`` describes no GPU that can run ('' if it can): a field of
    :data:`_POSITIVE_FIELDS` at zero, one of :data:`_FRACTION_FIELDS` above 1, a voltage ratio
    (``v_ratio``) below 1, a clock range
    upside down or not a whole number of steps, static power at or above the power limit (W), or
    more communication SMs than the GPU has."""
    for name in _POSITIVE_FIELDS:
        if not getattr(preset, name) > 0:
            return f"{name} must be above zero, got {getattr(preset, name)!r}"
    for name in _FRACTION_FIELDS:
        if getattr(preset, name) > 1:
            return f"{name} is a fraction, at most 1, got {getattr(preset, name)!r}"
    if not preset.v_ratio >= 1:  # the voltage at the top clock over the floor's: never below
        return (f"v_ratio (the core voltage at clock_max_mhz over its floor) must be at least 1, "
                f"got {preset.v_ratio!r}")
    if preset.clock_min_mhz > preset.clock_max_mhz:
        return (f"clock_min_mhz {preset.clock_min_mhz:g} is above clock_max_mhz "
                f"{preset.clock_max_mhz:g}")
    steps = (preset.clock_max_mhz - preset.clock_min_mhz) / preset.clock_step_mhz
    if abs(steps - round(steps)) > 1e-6:
        return (f"clock_max_mhz {preset.clock_max_mhz:g} is not clock_min_mhz "
                f"{preset.clock_min_mhz:g} plus whole {preset.clock_step_mhz:g} MHz steps")
    if steps > MAX_CLOCK_STEPS:
        return (f"clock_step_mhz {preset.clock_step_mhz:g} makes {round(steps) + 1:,} lockable "
                f"clocks from {preset.clock_min_mhz:g} to {preset.clock_max_mhz:g} MHz; at most "
                f"{MAX_CLOCK_STEPS + 1:,} (GPUs step by about 15 MHz)")
    if preset.static_power_w >= preset.power_limit_w:
        return (f"static power {preset.static_power_w:g} W is not below the power limit "
                f"{preset.power_limit_w:g} W")
    for name in ("comm_max_sms", "comm_default_sms"):
        if getattr(preset, name) > preset.sms:
            return f"{name} {getattr(preset, name)} is more than the GPU's {preset.sms} SMs"
    return ""


def _read_json(p: Path, what: str) -> object:
    why = file_problem(p)
    if why is not None and why != "does not exist":
        raise PresetError(f"{p}: {why}")
    try:
        return loads_json(p.read_text())
    except FileNotFoundError:
        raise PresetError(f"{p}: no such {what}") from None
    except json.JSONDecodeError as e:
        raise PresetError(f"{p}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(f"{p}: unreadable ({type(e).__name__})") from None


def load_preset_file(path: str | Path, shared: Shared | None = None
                     ) -> tuple[GPUPreset, dict[str, PartitionOpFactors]]:
    """Read one GPU file (see :data:`GROUPS`), the fields it leaves out taken from ``shared``
    [the shared file's, :data:`SHARED_FILE`]; :class:`PresetError` (one line) if malformed."""
    p = Path(path)
    return _parse(p, _read_json(p, "GPU file"), shared)


def preset_files() -> list[Path]:
    """The GPU files read, in order: the built-in folder's, then ``$KAREUS_GPU_DIR``'s, each by
    file name."""
    return _files_in(BUILTIN_DIR, os.environ.get(USER_DIR_ENV) or None)


def _files_in(builtin_dir: Path, user: str | None) -> list[Path]:
    files = sorted(builtin_dir.glob("*.json"))
    if user:
        d = Path(user)
        if not d.is_dir():
            raise PresetError(f"${USER_DIR_ENV}={user}: not a folder")
        files += sorted(d.glob("*.json"))
    return files


#: What the loaded GPU files give: presets by name, partition op factors by (GPU, spec hash), the
#: file each preset was read from, and the files of ``$KAREUS_GPU_DIR`` that could not be read,
#: each with its one-line error.
Loaded = tuple[dict[str, GPUPreset], dict[tuple[str, str], PartitionOpFactors], dict[str, Path],
               dict[Path, str]]


@functools.cache
def _shared_at(path: Path) -> Shared:
    """The entries of the shared file at ``path``, read once per path (:func:`reload_presets`
    forgets them)."""
    return load_shared(path)


def _shared() -> Shared:
    """The shared file's entries (:data:`SHARED_FILE`), read once."""
    return _shared_at(SHARED_FILE)


@functools.cache
def _loaded_from(builtin_dir: Path, user_dir: str | None, shared_path: Path) -> Loaded:
    """The GPU files of ``builtin_dir`` and ``user_dir`` (``$KAREUS_GPU_DIR``), on the shared
    file at ``shared_path``; read once per folder pair (:func:`reload_presets` forgets them). A
    user's file that cannot be read is set aside with its error (asking for its GPU raises it),
    so that it does not stop the other GPUs; a built-in one raises."""
    shared = _shared_at(shared_path)
    presets: dict[str, GPUPreset] = {}
    factors: dict[tuple[str, str], PartitionOpFactors] = {}
    files: dict[str, Path] = {}
    broken: dict[Path, str] = {}
    for path in _files_in(builtin_dir, user_dir):
        try:
            preset, own = load_preset_file(path, shared)
        except PresetError as e:
            if path.parent == builtin_dir:
                raise
            broken[path] = str(e)
            continue
        if preset.name in presets:
            raise PresetError(f"{path}: GPU {preset.name!r} is already defined by "
                              f"{files[preset.name]}")
        presets[preset.name] = preset
        files[preset.name] = path
        factors.update({(preset.name, h): f for h, f in own.items()})
    return presets, factors, files, broken


def _loaded() -> Loaded:
    """The presets of the built-in folder and the current ``$KAREUS_GPU_DIR`` (a changed
    variable reads its folder; a changed file needs :func:`reload_presets`)."""
    return _loaded_from(BUILTIN_DIR, os.environ.get(USER_DIR_ENV) or None, SHARED_FILE)


def reload_presets() -> None:
    """Forget the loaded presets and shared values (after a file changed); the next use reads
    the files again."""
    _loaded_from.cache_clear()
    _shared_at.cache_clear()


def __getattr__(name: str) -> object:
    # ``PRESETS`` is read on first use, not at import, so that a malformed user file is a
    # one-line error of the command that needed it. Read-only: the cache is shared.
    if name == "PRESETS":
        return MappingProxyType(_loaded()[0])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def preset_path(name: str) -> Path:
    """The file preset ``name`` was read from."""
    get_preset(name)
    return _loaded()[2][name]


def partition_op_factors(gpu: str, spec_sha256: str) -> PartitionOpFactors | None:
    """The preset's own per-op factors for a partition spec, or ``None`` when the preset's law
    was not fitted on that partition."""
    return _loaded()[1].get((gpu, spec_sha256))


def unreadable_preset_files() -> dict[Path, str]:
    """The files of ``$KAREUS_GPU_DIR`` that could not be read, each with its one-line error
    (their GPUs are not listed; asking for one raises its error)."""
    return dict(_loaded()[3])


def get_preset(name: str) -> GPUPreset:
    """Look a preset up by name; raises :class:`PresetError` naming the valid choices, or the
    error of the unreadable user file named after it."""
    presets, _, _, broken = _loaded()
    for path, error in broken.items():  # even where a built-in GPU has its name
        if path.stem == name:
            raise PresetError(error)
    try:
        return presets[name]
    except KeyError:
        unreadable = (f"; unreadable there: {', '.join(p.name for p in broken)}" if broken
                      else "")
        raise PresetError(f"unknown GPU {name!r}; choose one of: {', '.join(presets)} (a GPU "
                          f"file of your own goes in ${USER_DIR_ENV}{unreadable})") from None


# --- Writing: a refit is a one-file diff ---------------------------------------------------------

def _dumps(raw: dict[str, Any]) -> str:
    """A GPU file's text: groups in order, one line per value (so a refit's diff is one line
    per value); floats as Python's repr (exact)."""
    d = json.dumps
    lines = ["{"] + ([f'  "name": {d(raw["name"])},'] if "name" in raw else [])
    if "description" in raw:
        lines.append(f'  "description": {d(raw["description"])},')
    blocks = []
    for group in GROUPS:
        entries = raw.get(group)
        if not entries:  # a group the shared file holds whole, or one it has nothing of
            continue
        body = ",\n".join(f'    {d(k)}: {{"value": {d(e["value"])}, "source": {d(e["source"])}}}'
                          for k, e in entries.items())
        blocks.append(f'  {d(group)}: {{\n{body}\n  }}')
    if raw.get("partition_op_factors"):
        body = ",\n".join(
            "    {" + ", ".join(f"{d(k)}: {d(f[k])}" for k in
                                ("spec_sha256", "op_work", "op_host", "source")) + "}"
            for f in raw["partition_op_factors"])
        blocks.append(f'  "partition_op_factors": [\n{body}\n  ]')
    return "\n".join(lines) + "\n" + ",\n".join(blocks) + "\n}\n"


def preset_to_dict(preset: GPUPreset, op_factors: dict[str, PartitionOpFactors] | None = None,
                   shared: Shared | None = None) -> dict[str, Any]:
    """The file form of ``preset``: every field with its source, but for those equal (value and
    source) to the shared file's (``shared``, [:data:`SHARED_FILE`'s]), which it takes from
    there."""
    shared = _shared() if shared is None else shared
    raw: dict[str, Any] = {"name": preset.name}
    for group, names in GROUPS.items():
        raw[group] = {}
        for n in names:
            v, source = getattr(preset, n), preset.sources.get(n, "")
            same = shared.get(n)
            if same is None or not (type(same["value"]) is type(v) and same["value"] == v
                                    and same["source"] == source):
                raw[group][n] = {"value": list(v) if isinstance(v, tuple) else v,
                                 "source": source}
    if op_factors:
        raw["partition_op_factors"] = [
            {"spec_sha256": h, "op_work": list(f.op_work), "op_host": list(f.op_host),
             "source": f.source} for h, f in op_factors.items()]
    return raw


def write_preset(preset: GPUPreset, path: str | Path,
                 op_factors: dict[str, PartitionOpFactors] | None = None) -> None:
    """Write ``preset`` as a GPU file (atomically; it must read back as it is)."""
    from kareus.atomic import atomic_write_text

    p = Path(path)
    shared = _shared()
    text = _dumps(preset_to_dict(preset, op_factors, shared))
    _parse(p, json.loads(text), shared)
    atomic_write_text(p, text)
    reload_presets()


def fitted_value(v: float) -> float:
    """A fitted value as the presets carry it: four significant digits (what a fit's report
    prints)."""
    return float(f"{v:.4g}")


def update_preset_file(name: str, changes: dict[str, tuple[object, str]], *,
                       op_factors: dict[str, PartitionOpFactors] | None = None,
                       path: str | Path | None = None, write: bool = True,
                       shared_path: str | Path | None = None) -> str:
    """Set fields of preset ``name`` (``{field: (value, source)}``; ``op_factors``: per-op
    partition factors by spec hash, replacing those of the same spec) and return the unified
    diff. A field a built-in GPU file (one in :data:`BUILTIN_DIR`, or any file when
    ``shared_path`` is given) takes from the shared file is set in the shared file, for every
    GPU; a user's GPU file (``$KAREUS_GPU_DIR``) never writes the package's shared file: the
    refit value goes into that file, overriding the shared one for that GPU alone. Every other
    field is set in the GPU file. A value the refit leaves unchanged
    keeps its line, source included, so the diff shows what moved. ``path``: the GPU file [the one
    the preset was read from]; ``shared_path``: the shared file [:data:`SHARED_FILE`];
    ``write=False``: only the diff. The results must read back (:class:`PresetError` otherwise);
    the loaded presets are reloaded after a write.

    A source names one fit (its command and its measurement), and a fit has one value. So a refit
    that keeps a field's source (the same procedure on the same data) also rewrites the GPU files
    beside this one that hold the very entry it replaces, value and source: the A100 PCIe files
    hold the kernel values fitted on vTrain's SXM runs, every file the partition law fitted on the
    SXM4 40 GB. A refit under a new source (another card's profile, say) changes this file only."""
    import difflib

    p = Path(path) if path is not None else preset_path(name)
    sp = Path(shared_path) if shared_path is not None else SHARED_FILE
    old, old_shared = p.read_text(), sp.read_text()
    raw, raw_shared = json.loads(old), json.loads(old_shared)
    before = json.loads(old)
    # only the built-in presets share the package's file; a user's preset overrides it
    may_share = shared_path is not None or p.resolve().parent == BUILTIN_DIR.resolve()
    for field_name, (value, source) in changes.items():
        if field_name not in _GROUP_OF:
            raise PresetError(f"unknown preset parameter {field_name!r}")
        group = _GROUP_OF[field_name]
        own = (not may_share or field_name in raw.get(group, {})
               or field_name not in raw_shared.get(group, {}))
        target = raw if own else raw_shared
        value = list(value) if isinstance(value, tuple) else value
        entry = target.setdefault(group, {}).get(field_name)
        if not (isinstance(entry, dict) and entry.get("value") == value):
            target[group][field_name] = {"value": value, "source": source}
    old_factors = {f.get("spec_sha256"): f for f in raw.get("partition_op_factors", [])
                   if isinstance(f, dict)}
    for h, f in (op_factors or {}).items():
        prev = old_factors.get(h)
        if not (prev and prev.get("op_work") == list(f.op_work)
                and prev.get("op_host") == list(f.op_host)):
            old_factors[h] = {"spec_sha256": h, "op_work": list(f.op_work),
                              "op_host": list(f.op_host), "source": f.source}
    if old_factors:
        raw["partition_op_factors"] = list(old_factors.values())
    new, new_shared = _dumps(raw), _dumps(raw_shared)
    # every file must read back, on the new shared values
    shared_values = _parse_shared(sp, json.loads(new_shared))
    _parse(p, json.loads(new), shared_values)
    texts = {sp: (old_shared, new_shared), p: (old, new)}
    for q, (q_old, q_new) in _carried_copies(p, before, raw, changes, sp,
                                             shared_values).items():
        _parse(q, json.loads(q_new), shared_values)
        texts[q] = (q_old, q_new)
    if write and any(a != b for a, b in texts.values()):
        from kareus.atomic import atomic_write_text

        for q, (q_old, q_new) in texts.items():
            if q_new != q_old:
                atomic_write_text(q, q_new)
        reload_presets()
    return "".join("".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), str(q),
                                                str(q))) for q, (a, b) in texts.items())


def _carried_copies(p: Path, before: dict[str, Any], after: dict[str, Any],
                    fields_changed: Iterable[str], shared_path: Path, shared: Shared
                    ) -> dict[Path, tuple[str, str]]:
    """The GPU files beside ``p`` (not the shared file at ``shared_path``) holding a copy (the
    same value and source) of an entry of ``p``'s that a refit changed under the same source
    (``before`` -> ``after``), each as (old text, text with the new entries). A file that does not
    read as a preset on ``shared`` is left alone: loading it names its problem."""
    moved = {}
    for f in fields_changed:
        group = _GROUP_OF[f]
        was, now = before.get(group, {}).get(f), after.get(group, {}).get(f)
        if isinstance(was, dict) and isinstance(now, dict) and now != was \
                and now.get("source") == was.get("source"):
            moved[f] = (group, was, now)
    out: dict[Path, tuple[str, str]] = {}
    if not moved:
        return out
    for q in sorted(p.parent.glob("*.json")):
        if q.resolve() in (p.resolve(), shared_path.resolve()):
            continue
        try:
            text = q.read_text()
            raw = loads_json(text)
            _parse(q, raw, shared)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, PresetError):
            continue
        hit = False
        for f, (group, was, now) in moved.items():
            entries = raw.get(group)
            if isinstance(entries, dict) and entries.get(f) == was:
                entries[f] = dict(now)
                hit = True
        if hit:
            out[q] = (text, _dumps(raw))
    return out
