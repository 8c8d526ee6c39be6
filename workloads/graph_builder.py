"""Build the iteration graph of a workload: per-layer kernels with FLOPs and bytes, collectives
with message sizes, the nanobatch partitions with the Kareus paper's keys, and the 1F1B DAG.

Counting conventions (per GPU, bf16 = 2 bytes):

- GEMM ``[M,K] x [K,N]``: ``2·M·K·N`` FLOP; bytes = inputs + output once; tiles of 128 x 128
  output elements (``ceil(M/128)·ceil(N/128)`` thread blocks). Backward = two GEMMs of the same
  FLOPs (input gradient and weight gradient).
- Flash attention, causal: ``4·b·h·d·s_q·s_kv / 2`` FLOP (QK^T and PV, half the score matrix);
  backward 2.5x forward (five matmuls against two, the recomputed scores included). One thread
  block per 128 query rows per head; the causal mask makes their work uneven.
- Elementwise / norm / RoPE kernels are HBM bound: bytes read plus written, negligible FLOPs.
- TP all-reduce: the ``[tokens, hidden]`` activation after attention and after the MLP (forward),
  the input gradients of the column-parallel QKV and FC1 (backward). CP: all-gather of the local
  K,V chunk before attention (forward, and again in backward), reduce-scatter of dK,dV after the
  attention backward.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kareus.graph import (
    CommOp,
    ComputeOp,
    Direction,
    InstructionGraph,
    IterationGraph,
    Partition,
    Segment,
)
from workloads.models import ModelSpec
from workloads.parallel import Workload

BF16 = 2
_TILE = 128
#: How far past its even share (``tiles / SMs`` average tiles) causal flash attention ends, in
#: average tiles. FlashAttention-2 dispatches its grid with the query (forward) or key (backward)
#: block fastest; under the causal mask block ``m`` of ``Q`` does ``m + 1`` (forward) or ``Q - m``
#: (backward) blocks of work, so each (batch, head) is a ramp, and the grid ends with heavy blocks
#: still running. Greedy list scheduling of such grids (``python benchmarks/attention_tail.py``:
#: 16-64 query blocks, 8-128 (batch, head) pairs, 88-108 SMs) gives 1.14 forward (sd 0.04, range
#: 1.00-1.20) and 0.88 backward (sd 0.11, range 0.66-1.08), with no step where the tiles cross a
#: multiple of the SMs, unlike whole waves. Assumed: a fixed cost of two key blocks per tile (Q
#: load, epilogue); none gives 1.21 / 0.97, four 1.08 / 0.81. Under load-balanced context
#: parallelism a rank's query blocks form two such ramps against the gathered keys; the same
#: tails are used.
CAUSAL_TAIL_FWD = 1.14
CAUSAL_TAIL_BWD = 0.88
#: Host calls of Transformer Engine's all-gather context-parallel attention
#: (``AttnFuncWithCPAndKVAllGather``: TE 2.x, cuDNN fused attention, sbhd, causal; counted from
#: NVIDIA/TransformerEngine ``context_parallel.py`` at 9c61cd7) besides its first attention kernel
#: and its K/V collectives (the partition's own), forward and backward. Forward, 52 of its 61: the
#: second chunk's attention kernel on a second stream, two ``index_select`` reordering the
#: gathered K and V, two output copies, views, no-op ``contiguous`` calls and stream switches.
#: Backward, 83 of its 100: zero-filled dK and dV, four ``index_select``, two dQ copies, four
#: dK/dV accumulations, views and stream events. Their kernels move ~1 % of a layer's bytes
#: (left to the fitted efficiencies); their host time matters inside partitions only.
TE_CP_ATTENTION_HOST_CALLS = {False: 52, True: 83}


class _Cut:
    """Marker ending a segment: its name and the collective that follows it (or none)."""

    __slots__ = ("name", "comm")

    def __init__(self, name: str, comm: CommOp | None) -> None:
        self.name = name
        self.comm = comm


def gemm_op(name: str, m: int, k: int, n: int, elem_bytes: int = BF16) -> ComputeOp:
    """GEMM ``[M,K] x [K,N]``: ``2·M·K·N`` FLOP, inputs and output once, 128 x 128 output tiles."""
    return ComputeOp(
        name=name, kind="gemm", flops=2.0 * m * k * n,
        bytes=float(elem_bytes * (m * k + k * n + m * n)),
        tiles=math.ceil(m / _TILE) * math.ceil(n / _TILE), depth=k,
    )


def attention_op(name: str, b: int, hq: int, hkv: int, d: int, s_q: int, s_kv: int, *,
                 causal: bool = True, elem_bytes: int = BF16, backward: bool = False,
                 work_fraction: float = 1.0, host_calls: int = 0) -> ComputeOp:
    """Flash attention of ``b`` sequences, ``hq`` query / ``hkv`` key-value heads of width ``d``,
    ``s_q`` queries against ``s_kv`` keys: ``4·b·hq·d·s_q·s_kv`` FLOP (QK^T and PV), halved when
    causal over the same tokens, times ``work_fraction`` (the share of the score matrix this GPU
    computes, e.g. ``1/cp`` under load-balanced context parallelism). Backward: 2.5x the FLOPs
    (five matmuls against two, the scores recomputed) and twice the bytes. One thread block per
    128 query rows per head; causal tiles are uneven (:data:`CAUSAL_TAIL_FWD`). ``host_calls``:
    framework calls besides the kernel's own issue (:attr:`ComputeOp.host_calls`)."""
    flops = 4.0 * b * hq * d * s_q * s_kv * work_fraction / (2 if causal else 1)
    kv_bytes = elem_bytes * 2 * b * s_kv * hkv * d
    q_o_bytes = elem_bytes * 2 * b * s_q * hq * d
    if backward:
        return ComputeOp(name, "attention", 2.5 * flops, 2 * (q_o_bytes + kv_bytes),
                         tiles=b * hq * math.ceil(s_q / _TILE), depth=d, backward=True,
                         uneven_tail=CAUSAL_TAIL_BWD if causal else None,
                         host_calls=host_calls)
    return ComputeOp(name, "attention", flops, float(q_o_bytes + kv_bytes),
                     tiles=b * hq * math.ceil(s_q / _TILE), depth=d,
                     uneven_tail=CAUSAL_TAIL_FWD if causal else None, host_calls=host_calls)


def _gemm_bwd(name: str, m: int, k: int, n: int) -> list[ComputeOp]:
    """Input gradient ``dX[M,K] = dY[M,N]·W^T`` and weight gradient ``dW[K,N] = X^T·dY``."""
    dgrad = ComputeOp(
        name=f"{name}_dgrad", kind="gemm", flops=2.0 * m * k * n,
        bytes=BF16 * (m * n + k * n + m * k), tiles=math.ceil(m / _TILE) * math.ceil(k / _TILE),
        depth=n, backward=True,
    )
    wgrad = ComputeOp(
        name=f"{name}_wgrad", kind="gemm", flops=2.0 * m * k * n,
        bytes=BF16 * (m * k + m * n + k * n), tiles=math.ceil(k / _TILE) * math.ceil(n / _TILE),
        depth=m, backward=True,
    )
    return [dgrad, wgrad]


def memory_op(name: str, nbytes: float, flops: float = 0.0) -> ComputeOp:
    """An HBM-bound kernel (elementwise, norm, RoPE) moving ``nbytes``."""
    return ComputeOp(name=name, kind="memory", flops=flops, bytes=float(nbytes))


class _LayerOps:
    """The op lists of one layer for ``b`` sequences (one nanobatch or a full microbatch)."""

    def __init__(self, model: ModelSpec, w: Workload, b: int) -> None:
        p = w.parallel
        self.m = model
        self.b = b
        self.s_local = p.seq // p.cp
        self.t = b * self.s_local  # tokens on this GPU
        self.hq = model.heads // p.tp  # local query heads
        self.hkv = model.kv_heads // p.tp
        self.ffn = model.ffn // p.tp
        self.tp, self.cp, self.seq = p.tp, p.cp, p.seq
        group_gpus = p.tp * p.cp
        self.intra = group_gpus <= p.gpus_per_node

    # -- collectives -------------------------------------------------------------------------
    def _tp_ar(self, name: str) -> CommOp | None:
        if self.tp == 1:
            return None
        return CommOp(name, "all_reduce", BF16 * self.t * self.m.hidden, self.tp, self.intra)

    def _cp_kv(self, name: str, collective: str) -> CommOp | None:
        if self.cp == 1:
            return None
        gathered = BF16 * 2 * self.b * self.seq * self.hkv * self.m.head_dim  # K and V, full seq
        return CommOp(name, collective, gathered, self.cp, self.intra)  # type: ignore[arg-type]

    # -- forward -----------------------------------------------------------------------------
    def _attention(self, name: str, backward: bool) -> ComputeOp:
        # Causal over the whole sequence; load-balanced CP gives each rank 1/cp of the queries
        # (hence of the score matrix) against all keys, through Transformer Engine's all-gather
        # CP attention and its host calls.
        calls = TE_CP_ATTENTION_HOST_CALLS[backward] if self.cp > 1 else 0
        return attention_op(name, self.b, self.hq, self.hkv, self.m.head_dim, self.s_local,
                            self.seq, backward=backward, host_calls=calls)

    def forward(self) -> list[ComputeOp | _Cut]:
        m, t, d = self.m, self.t, self.m.head_dim
        h = m.hidden
        qkv_n = (self.hq + 2 * self.hkv) * d
        qk_elems = t * (self.hq + self.hkv) * d
        ops: list[ComputeOp | _Cut] = [
            memory_op("bda", 3 * BF16 * t * h, flops=2.0 * t * h),
            memory_op("norm", 2 * BF16 * t * h, flops=5.0 * t * h),
            gemm_op("linear_qkv", t, h, qkv_n),
        ]
        if m.qk_norm:
            ops.append(memory_op("qk_norm", 2 * BF16 * qk_elems, flops=5.0 * qk_elems))
        if m.rope:
            ops.append(memory_op("rope", 2 * BF16 * qk_elems, flops=3.0 * qk_elems))
        if self.cp > 1:
            ops.append(_Cut("qkv", self._cp_kv("cp_allgather_kv", "all_gather")))
        ops.append(self._attention("attention", backward=False))
        ops.append(gemm_op("linear_proj", t, self.hq * d, h))
        ops.append(_Cut("ao" if self.cp > 1 else "attn", self._tp_ar("tp_allreduce_attn")))
        ops.append(memory_op("bda", 3 * BF16 * t * h, flops=2.0 * t * h))
        ops.append(memory_op("norm", 2 * BF16 * t * h, flops=5.0 * t * h))
        fc1_n = self.ffn * (2 if m.mlp == "swiglu" else 1)
        ops.append(gemm_op("linear_fc1", t, h, fc1_n))
        act_bytes = BF16 * t * (fc1_n + self.ffn)
        ops.append(memory_op("activation", act_bytes, flops=8.0 * t * self.ffn))
        ops.append(gemm_op("linear_fc2", t, self.ffn, h))
        ops.append(_Cut("mlp", self._tp_ar("tp_allreduce_mlp")))
        return ops

    # -- backward ----------------------------------------------------------------------------
    def backward(self) -> list[ComputeOp | _Cut]:
        m, t, d = self.m, self.t, self.m.head_dim
        h = m.hidden
        qkv_n = (self.hq + 2 * self.hkv) * d
        qk_elems = t * (self.hq + self.hkv) * d
        fc1_n = self.ffn * (2 if m.mlp == "swiglu" else 1)
        ops: list[ComputeOp | _Cut] = [memory_op("norm_bwd", 4 * BF16 * t * h, flops=8.0 * t * h)]
        ops += _gemm_bwd("linear_fc2", t, self.ffn, h)
        ops.append(memory_op("activation_bwd", BF16 * t * (2 * fc1_n + self.ffn),
                        flops=12.0 * t * self.ffn))
        ops += _gemm_bwd("linear_fc1", t, h, fc1_n)
        ops.append(_Cut("mlp", self._tp_ar("tp_allreduce_fc1_dgrad")))
        ops.append(memory_op("norm_bwd", 4 * BF16 * t * h, flops=8.0 * t * h))
        ops.append(memory_op("bda_bwd", 3 * BF16 * t * h, flops=1.0 * t * h))
        ops += _gemm_bwd("linear_proj", t, self.hq * d, h)
        if self.cp > 1:
            ops.append(_Cut("o", self._cp_kv("cp_allgather_kv", "all_gather")))
        ops.append(self._attention("attention_bwd", backward=True))
        if self.cp > 1:
            ops.append(_Cut("a", self._cp_kv("cp_reducescatter_dkv", "reduce_scatter")))
        if m.rope:
            ops.append(memory_op("rope_bwd", 2 * BF16 * qk_elems, flops=3.0 * qk_elems))
        if m.qk_norm:
            ops.append(memory_op("qk_norm_bwd", 3 * BF16 * qk_elems, flops=8.0 * qk_elems))
        ops += _gemm_bwd("linear_qkv", t, h, qkv_n)
        ops.append(_Cut("qkv" if self.cp > 1 else "attn", self._tp_ar("tp_allreduce_qkv_dgrad")))
        return ops


_SLOT_KIND = {
    "bda": "bda", "bda_bwd": "bda", "norm": "norm", "norm_bwd": "norm", "rope": "rope",
    "rope_bwd": "rope", "qk_norm": "qknorm", "qk_norm_bwd": "qknorm", "attention": "attn",
    "flash_attention": "attn", "qkv_split": "split",
    "attention_bwd": "attn", "activation": "activation", "activation_bwd": "activation",
}


def label_slots(ops: list[ComputeOp]) -> tuple[ComputeOp, ...]:
    """Give each op its launch-slot label ``<kind>_<n>`` (n counts that kind in the partition)."""
    counts: dict[str, int] = {}
    out = []
    for op in ops:
        kind = _SLOT_KIND.get(op.name, "linear")
        n = counts.get(kind, 0)
        counts[kind] = n + 1
        out.append(replace(op, slot=f"{kind}_{n}"))
    return tuple(out)


def _segments(items: list[ComputeOp | _Cut]) -> list[tuple[str, tuple[ComputeOp, ...], CommOp | None]]:
    """Cut an op list at its collectives; cuts without a collective (group of 1) merge away."""
    out: list[tuple[str, tuple[ComputeOp, ...], CommOp | None]] = []
    ops: list[ComputeOp] = []
    names: list[str] = []
    for item in items:
        if isinstance(item, _Cut):
            names.append(item.name)
            if item.comm is not None:
                out.append(("+".join(names), label_slots(ops), item.comm))
                ops, names = [], []
        else:
            ops.append(item)
    if ops:
        out.append(("+".join(names) if names else "tail", label_slots(ops), None))
    return out


def _partition_chain(
    segs0: list[tuple[str, str, tuple[ComputeOp, ...], CommOp | None]],
    segs1: list[tuple[str, str, tuple[ComputeOp, ...], CommOp | None]],
    has_cp: bool,
) -> tuple[Partition, ...]:
    """Interleave the two nanobatches' segments; each compute overlaps the previous collective.

    ``segs`` items are ``(direction prefix, segment name, compute, comm)``. Partition names follow
    the Kareus paper: ``<dir>_<segment>`` for TP-only layers, ``<dir>_<segment>_<ar|ag|rs>`` for
    CP+TP layers (the overlapped collective), ``<dir>_mlp`` in both.
    """
    order = []
    for a, b in zip(segs0, segs1):
        order.append((0, a))
        order.append((1, b))
    abbrev = {"all_reduce": "ar", "all_gather": "ag", "reduce_scatter": "rs", "send_recv": "p2p"}
    parts = []
    for k, (nb, (prefix, seg, compute, _)) in enumerate(order):
        comm = order[k - 1][1][3]  # k == 0 wraps to the previous layer's last collective
        name = f"{prefix}_{seg}"
        if has_cp and seg != "mlp" and comm is not None:
            name += "_" + abbrev[comm.collective]
        parts.append(Partition(key=f"{name}/{nb}", compute=compute, comm=comm))
    return tuple(parts)


def _instruction_ops(layer: _LayerOps, direction: Direction, recompute: bool
                     ) -> list[tuple[str, list[ComputeOp | _Cut]]]:
    if direction == "forward":
        return [("fwd", layer.forward())]
    blocks = [("rcp_fwd", layer.forward())] if recompute else []
    return blocks + [("bwd", layer.backward())]


def _flatten(blocks: list[tuple[str, list[ComputeOp | _Cut]]]
             ) -> list[tuple[str, str, tuple[ComputeOp, ...], CommOp | None]]:
    out = []
    for prefix, items in blocks:
        for seg, compute, comm in _segments(items):
            out.append((prefix, seg, compute, comm))
    return out


def _extra_segments(w: Workload, stage: int, direction: Direction) -> tuple[Segment, ...]:
    """Embedding on the first stage, final norm + output layer + loss on the last (full mbs)."""
    m, p = w.model, w.parallel
    t = p.tokens_per_gpu
    h, v = m.hidden, m.vocab // p.tp
    intra = p.tp * p.cp <= p.gpus_per_node
    segs: list[Segment] = []
    if stage == 0:
        if direction == "forward":
            ar = CommOp("tp_allreduce_embedding", "all_reduce", BF16 * t * h, p.tp, intra) \
                if p.tp > 1 else None
            segs.append(Segment(label_slots([memory_op("embedding", 3 * BF16 * t * h)]), ar))
        else:
            segs.append(Segment(label_slots([memory_op("embedding_bwd", 3 * BF16 * t * h)]), None))
    if stage == p.pp - 1:
        if direction == "forward":
            ops = [
                memory_op("norm", 2 * BF16 * t * h, flops=5.0 * t * h),
                gemm_op("linear_output", t, h, v),
                memory_op("cross_entropy", (BF16 + 4 + 4) * t * v, flops=5.0 * t * v),
            ]
            ar = CommOp("tp_allreduce_loss", "all_reduce", 4 * 3 * t, p.tp, intra) \
                if p.tp > 1 else None
        else:
            ops = [
                memory_op("cross_entropy_bwd", (4 + BF16) * t * v, flops=3.0 * t * v),
                *_gemm_bwd("linear_output", t, h, v),
                memory_op("norm_bwd", 4 * BF16 * t * h, flops=8.0 * t * h),
            ]
            ar = CommOp("tp_allreduce_output_dgrad", "all_reduce", BF16 * t * h, p.tp, intra) \
                if p.tp > 1 else None
        segs.append(Segment(label_slots(ops), ar))
    return tuple(segs)


def _stage_tail(w: Workload, stage: int, layers: int) -> tuple[Segment, ...]:
    """DP gradient all-reduce (fp32 main grads) and the Adam step after the last backward."""
    m, p = w.model, w.parallel
    params = layers * m.layer_params() / p.tp
    if stage == 0:
        params += m.embedding_params() / p.tp
    if stage == p.pp - 1:
        params += m.vocab * m.hidden / p.tp
    # Adam, distributed optimizer: read fp32 grad + master + 2 moments, write master + moments +
    # bf16 weight, on this rank's 1/dp shard.
    step = memory_op("optimizer_step", params / p.dp * (4 * 4 + 3 * 4 + BF16), flops=12.0 * params / p.dp)
    sync = None
    if p.dp > 1:
        sync = CommOp("dp_allreduce_grads", "all_reduce", 4 * params, p.dp,
                      p.gpus_per_stage <= p.gpus_per_node)
    return (Segment((), sync), Segment(label_slots([step]), None)) if sync else (
        Segment(label_slots([step]), None),)


def build_iteration_graph(w: Workload) -> IterationGraph:
    """The iteration graph of ``w`` (per-GPU ops; all GPUs of a stage do the same work)."""
    m, p = w.model, w.parallel
    nb = p.nanobatches
    full = _LayerOps(m, w, p.mbs)
    half = _LayerOps(m, w, p.mbs // nb) if nb > 1 else None
    graphs: dict[tuple[int, Direction], InstructionGraph] = {}
    for stage, layers in enumerate(w.stage_layers()):
        for direction in ("forward", "backward"):
            blocks = _instruction_ops(full, direction, p.recompute)  # type: ignore[arg-type]
            sequential = tuple(
                Segment(compute, comm) for _, _, compute, comm in _flatten(blocks)
            )
            partitions: tuple[Partition, ...] = ()
            if half is not None:
                segs = _flatten(_instruction_ops(half, direction, p.recompute))  # type: ignore[arg-type]
                partitions = _partition_chain(segs, segs, has_cp=p.cp > 1)
            graphs[(stage, direction)] = InstructionGraph(
                stage=stage, direction=direction, layers=layers,  # type: ignore[arg-type]
                sequential=sequential, partitions=partitions,
                extra=_extra_segments(w, stage, direction),  # type: ignore[arg-type]
            )
    p2p = None
    if p.pp > 1:
        p2p = CommOp("pp_send_recv", "send_recv", BF16 * p.tokens_per_gpu * m.hidden, 2,
                     intra_node=p.gpus_per_stage < p.gpus_per_node)
    tails = {s: _stage_tail(w, s, n) for s, n in enumerate(w.stage_layers())}
    return IterationGraph(
        workload=w.name, stages=p.pp, microbatches=p.microbatches,
        gpus_per_stage=p.gpus_per_stage, instruction_graphs=graphs, p2p=p2p,
        stage_tail=tails, model_flops=model_flops(w),
    )


def model_flops(w: Workload) -> float:
    """Model FLOPs of one iteration, whole job, without recomputation: 3x the forward FLOPs of
    every layer's matmuls and attention plus the output layer (the usual MFU convention)."""
    m, p = w.model, w.parallel
    layer = _LayerOps(m, w, p.mbs)
    fwd = sum(op.flops for op in layer.forward() if isinstance(op, ComputeOp) and op.kind != "memory")
    per_gpu_mb = m.layers * fwd + 2.0 * p.tokens_per_gpu * m.hidden * (m.vocab // p.tp)
    # per-GPU numbers times the TP x CP group size give one microbatch of one pipeline replica
    return 3.0 * per_gpu_mb * p.tp * p.cp * p.microbatches * p.dp
