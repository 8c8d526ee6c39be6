"""SM contention on one GPU: a communication-like kernel confined to ``k`` SMs on a side stream,
beside a compute op (a GEMM, causal attention, an elementwise add) on the main stream.

One GPU has no NCCL peer, so a one-rank all-reduce does no work and never takes SMs from compute.
This stands in for the collective: :data:`KERNEL` runs ``k`` thread blocks, each reserving the
SM's whole opt-in shared memory (so no other block -- of it or of the compute kernel -- fits on
that SM), streaming a buffer through HBM the way a reduction's copy loop does (read two, add,
write). Each block records the SM it ran on (``%smid``): the result says how many *distinct* SMs
the kernel held (the proof that it was confined to ``k`` SMs, one block each). The reservation
keeps out only blocks that need shared memory (the GEMM's, the attention's): the elementwise
add's blocks need none and still fit beside the kernel's 512 threads on its SMs, so that row
measures the two sharing SMs, not the add confined to the ``sms - k`` left, and its comparison
with the law below is looser than the other two.

For each op and ``k``: the op's time per call on the main stream (CUDA events), the window's
energy and power, next to the simulator's law: the op on the ``sms - k`` SMs the collective
leaves (:meth:`SimulatorBackend.kernel_time`) times the preset's contention factor
``1 + overlap_slowdown_<kind> * k / sms`` (the simulator's extra slowdown beside a collective).
Units: s, J, W, MHz.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kareus.backends.gpu.device import Device
from kareus.backends.gpu.measure import ClockSampler, CounterMeter
from kareus.graph import ComputeOp
from kareus.hardware.presets import GPUPreset
from kareus.json_types import JsonObject, record_dict
from workloads.parallel import Workload

if TYPE_CHECKING:
    import torch

    from kareus.backends.sim import SimulatorBackend

KERNEL = r"""
extern "C" __global__ void comm_like(const float4* __restrict__ src, float4* __restrict__ dst,
                                     int n4, int iters, int* smids) {
    extern __shared__ float4 reserve[];
    unsigned int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    if (threadIdx.x == 0) { smids[blockIdx.x] = (int)smid; reserve[0] = src[0]; }
    for (int it = 0; it < iters; ++it) {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
            float4 a = src[i];
            float4 b = dst[i];
            b.x += a.x; b.y += a.y; b.z += a.z; b.w += a.w;
            dst[i] = b;
        }
    }
}
"""


class _Kernel(Protocol):
    """A kernel compiled by ``torch.cuda._compile_kernel``."""

    def set_shared_memory_config(self, shared_mem_bytes: int) -> None: ...

    def __call__(self, *, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: list[object], shared_mem: int) -> None: ...


@dataclass(frozen=True)
class OpCase:
    """One compute op to run beside the collective: its name, the graph's op (for the
    simulator), and a function making its torch step on a device."""

    name: str
    op: ComputeOp
    make_step: Callable[[str], Callable[[], object]]


def op_cases(workload: Workload, device: str) -> list[OpCase]:
    """The GEMM (``linear_fc1``), causal attention and elementwise op (``bda``, the residual
    add) of one layer of ``workload`` (TP 1), as the graph describes them and as torch runs them
    (bf16 on CUDA, float32 on CPU)."""
    import torch
    import torch.nn.functional as F

    from workloads.graph_builder import build_iteration_graph

    graph = build_iteration_graph(workload)
    ops = {op.name: op for seg in graph.instruction_graphs[(0, "forward")].sequential
           for op in seg.compute}
    m, p = workload.model, workload.parallel
    t = p.mbs * p.seq
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def gemm(dev: str) -> Callable[[], object]:
        x = torch.randn(t, m.hidden, device=dev, dtype=dtype)
        w = torch.randn(m.hidden, m.ffn, device=dev, dtype=dtype)
        return lambda: torch.mm(x, w)

    def attention(dev: str) -> Callable[[], object]:
        q = torch.randn(p.mbs, m.heads, p.seq, m.head_dim, device=dev, dtype=dtype)
        kv = torch.randn(p.mbs, m.kv_heads, p.seq, m.head_dim, device=dev, dtype=dtype)
        return lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True,
                                                      enable_gqa=m.kv_heads != m.heads)

    def elementwise(dev: str) -> Callable[[], object]:
        a = torch.randn(t, m.hidden, device=dev, dtype=dtype)
        b = torch.randn(t, m.hidden, device=dev, dtype=dtype)
        return lambda: torch.add(a, b)

    return [OpCase("gemm", ops["linear_fc1"], gemm),
            OpCase("attention", ops["attention"], attention),
            OpCase("elementwise", ops["bda"], elementwise)]


class CommLike:
    """The communication-like kernel on ``k`` SMs (CUDA: compiled with NVRTC through
    ``torch.cuda._compile_kernel``; CPU: a host thread adding buffers, for the dry run, whose SM
    ids are not measured)."""

    def __init__(self, device: str, nbytes: int = 256 << 20) -> None:
        import torch

        self.device = device
        self.n4 = nbytes // 16
        self.src = torch.ones(self.n4 * 4, device=device, dtype=torch.float32)
        self.dst = torch.zeros_like(self.src)
        self.kernel: _Kernel | None = None
        self._pass_times: dict[int, float] = {}
        if device == "cuda":
            self.kernel = torch.cuda._compile_kernel(KERNEL, "comm_like")
            props = torch.cuda.get_device_properties(0)
            self.shared = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
            self.kernel.set_shared_memory_config(self.shared)
            self.stream = torch.cuda.Stream()

    def pass_time(self, k: int) -> float:
        """Seconds of one pass over the buffer on ``k`` SMs (CUDA), timed alone (once per
        ``k``)."""
        import torch

        if k in self._pass_times:
            return self._pass_times[k]
        self.launch(k, 1)  # warm
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(self.stream)
        self.launch(k, 2)
        b.record(self.stream)
        b.synchronize()
        self._pass_times[k] = max(a.elapsed_time(b) / 2e3, 1e-6)
        return self._pass_times[k]

    def launch(self, k: int, iters: int) -> torch.Tensor:
        """Queue one kernel on ``k`` SMs (CUDA) and return the tensor its blocks write their SM
        ids to."""
        import torch

        smids = torch.full((k,), -1, device=self.device, dtype=torch.int32)
        if self.kernel is not None:
            self.stream.wait_stream(torch.cuda.current_stream())  # smids filled first
            with torch.cuda.stream(self.stream):
                self.kernel(grid=(k, 1, 1), block=(512, 1, 1),
                            args=[self.src, self.dst, self.n4, iters, smids],
                            shared_mem=self.shared)
        return smids


@dataclass(frozen=True)
class SimulatedContention:
    """The simulator's time of an op beside a collective on ``k`` SMs (s): alone on all SMs, on
    the SMs left, the preset's contention factor, the op's time beside the collective and its
    slowdown against alone."""

    time_alone_s: float
    time_on_sms_left_s: float
    contention_factor: float
    time_s: float
    slowdown: float

    def to_dict(self) -> JsonObject:
        return record_dict(self)


def predict(sim: SimulatorBackend, preset: GPUPreset, op: ComputeOp, clock_mhz: float, k: int
            ) -> SimulatedContention:
    """The simulator's time of ``op`` beside a collective on ``k`` SMs at ``clock_mhz``: on the
    SMs left, and with the preset's contention factor."""
    alone = sim.kernel_time(op, clock_mhz, preset.sms)
    left = sim.kernel_time(op, clock_mhz, preset.sms - k) if k else alone
    factor = 1.0 + float(getattr(preset, f"overlap_slowdown_{op.kind}")) * k / preset.sms
    return SimulatedContention(time_alone_s=alone, time_on_sms_left_s=left,
                               contention_factor=factor, time_s=left * factor,
                               slowdown=left * factor / alone)


@dataclass(frozen=True)
class ContentionRow:
    """One op measured beside the collective on ``comm_sms`` SMs (0: alone): per-call time (s),
    its slowdown against alone, the window's length (s), energy (J), power (W) and mean SM
    clock (MHz), the distinct SMs the collective's blocks ran on (``None``: not measured, CPU)
    and whether they prove it held ``comm_sms`` SMs, and the simulator's prediction."""

    op: str
    graph_op: str
    kind: str
    comm_sms: int
    distinct_sms: int | None
    sms_proven: bool | None
    time_per_call_s: float
    slowdown: float | None
    window_s: float
    energy_j: float
    power_w: float | None
    sm_clock_mhz: float | None
    calls: int
    #: Whether the collective's kernel was still running when the op's last call ended (None
    #: without one): where it was not, the window's end ran uncontended and the slowdown is
    #: understated.
    comm_outlived_op: bool | None
    simulated: SimulatedContention

    def to_dict(self) -> JsonObject:
        return record_dict(self)


def measure_case(case: OpCase, ks: list[int], dev: Device, device: str, comm: CommLike | None,
                 window_s: float, sim: SimulatorBackend, preset: GPUPreset
                 ) -> list[ContentionRow]:
    """``case``'s op alone (k = 0) and beside the collective on each ``k``: per-call time,
    window energy and power, SMs proven, and the simulator's prediction."""
    import torch

    step = case.make_step(device)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    sync()
    per_call = max((time.perf_counter() - t0) / 5, 1e-6)
    calls = max(5, int(window_s / per_call))
    rows: list[ContentionRow] = []
    base: float | None = None
    for k in ks:
        stop = threading.Event()
        smids = None
        host_thread = None
        if k and comm is not None and cuda:
            # one kernel that outlasts the op's calls even when they run 2.5 times slower beside
            # it (``comm_outlived_op`` says whether it did): passes timed alone first
            iters = max(1, math.ceil(2.5 * calls * per_call / comm.pass_time(k)))
            smids = comm.launch(k, iters)
        elif k and comm is not None:
            def spin() -> None:
                while not stop.is_set():
                    comm.dst.add_(comm.src)
            host_thread = threading.Thread(target=spin, daemon=True)
            host_thread.start()
        meter = CounterMeter([dev], sync=None)
        sampler = ClockSampler(dev, period_s=0.05).start()
        meter.begin()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        t_host = time.perf_counter()
        for _ in range(calls):
            step()
        outlived = None
        if cuda:
            b.record()
            b.synchronize()
            t_op = a.elapsed_time(b) / 1e3 / calls
            if smids is not None:
                outlived = not comm.stream.query()
        else:
            t_op = (time.perf_counter() - t_host) / calls
        t, e = meter.end()
        clock = sampler.stop()
        stop.set()
        if host_thread is not None:
            host_thread.join()
        sync()
        distinct = None
        if smids is not None:
            ids = smids.tolist()
            distinct = len({i for i in ids if i >= 0})
        f = clock or preset.clock_max_mhz
        from kareus.backends.gpu.calibrate import snap_to_grid

        pred = predict(sim, preset, case.op, snap_to_grid(f, preset), k)
        if k == 0:
            base = t_op
        rows.append(ContentionRow(
            op=case.name, graph_op=case.op.name, kind=case.op.kind, comm_sms=k,
            distinct_sms=distinct, sms_proven=(distinct == k) if smids is not None else None,
            time_per_call_s=t_op, slowdown=t_op / base if base else None, window_s=t,
            energy_j=e, power_w=e / t if t > 0 else None, sm_clock_mhz=clock, calls=calls,
            comm_outlived_op=outlived, simulated=pred))
    return rows
