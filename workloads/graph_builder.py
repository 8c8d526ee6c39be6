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
- Elementwise work ``fused`` (Megatron-LM, Transformer Engine) is one kernel per block; ``eager``
  (PyTorch eager as Hugging Face models write it) is the kernels that code launches, each reading
  and writing whole tensors (:data:`GELU_EAGER_FWD` and the functions below).
- TP all-reduce: the ``[tokens, hidden]`` activation after attention and after the MLP (forward),
  the input gradients of the column-parallel QKV and FC1 (backward). CP: all-gather of the local
  K,V chunk before attention (forward, and again in backward), reduce-scatter of dK,dV after the
  attention backward.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kareus.graph import (
    Collective,
    CommOp,
    ComputeOp,
    Direction,
    GradBucket,
    InstructionGraph,
    IterationGraph,
    Partition,
    Segment,
)
from workloads.models import ModelSpec
from workloads.parallel import GRAD_BYTES, Workload, grad_bucket_params

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
    """Marker ending a segment: its name, the collective that follows it (or none), and whether
    that collective runs beside the segment's last op (:attr:`Segment.comm_beside_last`)."""

    __slots__ = ("name", "comm", "beside_last")

    def __init__(self, name: str, comm: CommOp | None, beside_last: bool = False) -> None:
        self.name = name
        self.comm = comm
        self.beside_last = beside_last


def gemm_op(name: str, m: int, k: int, n: int, elem_bytes: int = BF16,
            precision: str = "bf16") -> ComputeOp:
    """GEMM ``[M,K] x [K,N]``: ``2·M·K·N`` FLOP, inputs and output once, 128 x 128 output tiles;
    ``precision`` sets its math (:attr:`ComputeOp.precision`)."""
    return ComputeOp(
        name=name, kind="gemm", flops=2.0 * m * k * n,
        bytes=float(elem_bytes * (m * k + k * n + m * n)),
        tiles=math.ceil(m / _TILE) * math.ceil(n / _TILE), depth=k, precision=precision,
    )


#: An instruction type's directions, in build order.
_DIRECTIONS: tuple[Direction, Direction] = ("forward", "backward")


def _comm(name: str, collective: Collective, nbytes: float, group: int,
          placement: tuple[int, int]) -> CommOp:
    """A collective over ``group`` ranks placed on ``placement = (nodes, ranks per node)``."""
    nodes, per_node = placement
    return CommOp(name, collective, float(nbytes), group, nodes == 1,
                  nodes=nodes, ranks_per_node=per_node)


def attention_op(name: str, b: int, hq: int, hkv: int, d: int, s_q: int, s_kv: int, *,
                 causal: bool = True, elem_bytes: int = BF16, backward: bool = False,
                 work_fraction: float = 1.0, host_calls: int = 0,
                 precision: str = "bf16") -> ComputeOp:
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
                         host_calls=host_calls, precision=precision)
    return ComputeOp(name, "attention", flops, float(q_o_bytes + kv_bytes),
                     tiles=b * hq * math.ceil(s_q / _TILE), depth=d,
                     uneven_tail=CAUSAL_TAIL_FWD if causal else None, host_calls=host_calls,
                     precision=precision)


def megatron_fused_softmax(b: int, hq: int, s_q: int, s_kv: int, precision: str) -> bool:
    """Whether Megatron-LM's fused causal scale-mask-softmax kernel runs for a ``[b, hq, s_q,
    s_kv]`` score tensor (``FusedScaleMaskSoftmax.is_kernel_available``): half-precision input,
    ``16 < s_kv <= 4096``, ``s_q`` and ``s_kv`` multiples of 4, and ``b · hq`` (the attention
    batches) a multiple of 4 and of the kernel's batches per block (four 32-wide warps of 128
    threads, two rows per warp up to 128 keys). Otherwise Megatron-LM falls back to PyTorch's
    kernels (:func:`torch_softmax_ops`). ``hq``: the heads on this GPU."""
    if precision not in ("fp16", "bf16") or not 16 < s_kv <= 4096 or s_q % 4 or s_kv % 4:
        return False
    pow2 = 1 << math.ceil(math.log2(s_kv))
    batch_per_block = (128 // min(pow2, 32)) * (2 if pow2 <= 128 else 1)
    return (b * hq) % 4 == 0 and (b * hq) % batch_per_block == 0


def torch_softmax_ops(n: int, elem_bytes: int, backward: bool) -> list[ComputeOp]:
    """Megatron-LM's softmax when its fused kernel cannot run (``forward_torch_softmax``, the
    softmax in fp32 as Megatron Core's ``TransformerConfig`` defaults ask:
    ``attention_softmax_in_fp32``, no query-key layer scaling; older Megatron-LM, whose
    query-key layer scaling was on by default, runs a fifth, scaling pass each way): the ``n``
    scores cast to fp32 (16-bit scores only), the causal mask filled in, ``torch.softmax``, and
    the cast back; the backward is autograd's kernels of the same passes. Bytes are HBM bytes
    read plus written (the boolean mask, ``s_q x s_kv`` bytes broadcast over the batches, stays
    in L2)."""
    e = elem_bytes
    cast = e < 4
    if backward:
        return [*([memory_op("attention_softmax_uncast_bwd", (e + 4) * n)] if cast else []),
                memory_op("attention_softmax_bwd", 12 * n, flops=3.0 * n),
                memory_op("attention_mask_bwd", 8 * n),
                *([memory_op("attention_softmax_cast_bwd", (4 + e) * n)] if cast else [])]
    return [*([memory_op("attention_softmax_cast", (e + 4) * n)] if cast else []),
            memory_op("attention_mask", 8 * n, flops=1.0 * n),
            memory_op("attention_softmax", 8 * n, flops=5.0 * n),
            *([memory_op("attention_softmax_uncast", (4 + e) * n)] if cast else [])]


def unfused_attention_ops(b: int, hq: int, d: int, s_q: int, s_kv: int, elem_bytes: int,
                          precision: str, backward: bool, torch_softmax: bool = False
                          ) -> list[ComputeOp]:
    """Megatron-LM's core attention without flash attention (``CoreAttention``: ``baddbmm``,
    the fused scale-mask-softmax, dropout, ``bmm``), which materialises the ``N = b·hq·s_q·s_kv``
    score matrix and, the mask notwithstanding, computes all of it.

    Forward: ``QK^T`` (``2·N·d`` FLOP, writes the scores), softmax (reads and writes them),
    dropout (reads them, writes them and a one-byte mask), ``PV`` (``2·N·d`` FLOP, reads them).
    Backward: ``dP = dO·V^T`` and ``dV = P^T·dO``, dropout's and softmax's backward (each
    reading two score-sized tensors and writing one), ``dQ = dS·K`` and ``dK = dS^T·Q``. Batched
    GEMMs tile like GEMMs (128 x 128 output tiles per (batch, head)). ``torch_softmax``: the
    softmax is PyTorch's kernels instead (:func:`torch_softmax_ops`; see
    :func:`megatron_fused_softmax`)."""
    n = b * hq * s_q * s_kv
    e = elem_bytes
    qkv = e * b * hq * d * (s_q + 2 * s_kv)

    def bmm(name: str, rows: int, cols: int, depth: int, io_bytes: float) -> ComputeOp:
        return ComputeOp(name, "gemm", 2.0 * b * hq * rows * cols * depth, float(io_bytes),
                         tiles=b * hq * math.ceil(rows / _TILE) * math.ceil(cols / _TILE),
                         depth=depth, backward=backward, precision=precision)

    if not backward:
        return [
            bmm("attention_scores", s_q, s_kv, d, qkv + e * n),
            *([memory_op("attention_softmax", 2 * e * n, flops=5.0 * n)] if not torch_softmax
              else torch_softmax_ops(n, e, backward)),
            dropout_op("attention_dropout", (2 * e + 1) * n, flops=1.0 * n),
            bmm("attention_context", s_q, d, s_kv, qkv + e * n),
        ]
    return [
        bmm("attention_context_dgrad", s_q, s_kv, d, qkv + e * n),
        bmm("attention_context_wgrad", s_kv, d, s_q, qkv + e * n),
        memory_op("attention_dropout_bwd", (2 * e + 1) * n, flops=1.0 * n),
        *([memory_op("attention_softmax_bwd", 3 * e * n, flops=3.0 * n)] if not torch_softmax
          else torch_softmax_ops(n, e, backward)),
        bmm("attention_scores_dgrad", s_q, d, s_kv, qkv + e * n),
        bmm("attention_scores_wgrad", s_kv, d, s_q, qkv + e * n),
    ]


#: The PyTorch eager kernels of GPT-2's tanh GELU (Hugging Face ``gelu_new``:
#: ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``) as (tensors read, tensors written), each tensor
#: the ``[tokens, ffn]`` activation: ``pow``, the two constant products, the inner sum, ``tanh``,
#: ``1 +``, ``0.5·x`` and the final product. One fused GELU reads one and writes one.
GELU_EAGER_FWD: tuple[tuple[int, int], ...] = (
    (1, 1), (1, 1), (2, 1), (1, 1), (1, 1), (1, 1), (1, 1), (2, 1))
#: Its autograd backward: the final product's two input gradients, ``tanh``'s backward, the two
#: constant products', ``pow``'s (``x²``, ``3·``, times the gradient), ``0.5·x``'s, and the two sums
#: accumulating ``x``'s three gradients. One fused GELU backward reads two and writes one.
GELU_EAGER_BWD: tuple[tuple[int, int], ...] = (
    (2, 1), (2, 1), (2, 1), (1, 1), (1, 1), (1, 1), (1, 1), (2, 1), (1, 1), (2, 1), (2, 1))
#: Bloom's tanh GELU in eager code (Hugging Face ``bloom_gelu_forward``,
#: ``x·0.5·(1 + tanh(0.79788456·x·(1 + 0.044715·x·x)))``): nine kernels, in Python's order.
BLOOM_GELU_EAGER_FWD: tuple[tuple[int, int], ...] = (
    (1, 1), (1, 1), (1, 1), (2, 1), (1, 1), (2, 1), (1, 1), (1, 1), (2, 1))
#: Its hand-written backward (``bloom_gelu_back``): ``tanh`` recomputed (six kernels), the
#: derivative assembled (eleven) and multiplied by the gradient (one).
BLOOM_GELU_EAGER_BWD: tuple[tuple[int, int], ...] = (
    (1, 1), (1, 1), (2, 1), (1, 1), (2, 1), (1, 1),
    (1, 1), (2, 1), (1, 1), (1, 1), (2, 1), (1, 1), (2, 1), (2, 1), (1, 1), (1, 1), (2, 1),
    (2, 1))
#: SwiGLU in eager code (Hugging Face Llama: ``act_fn(gate) * up``): SiLU and the product, each
#: over ``[tokens, ffn]``; backward, the product's two input gradients and SiLU's backward.
SWIGLU_EAGER_FWD: tuple[tuple[int, int], ...] = ((1, 1), (2, 1))
SWIGLU_EAGER_BWD: tuple[tuple[int, int], ...] = ((2, 1), (2, 1), (2, 1))


def eager_kernels(name: str, passes: tuple[tuple[int, int], ...], elements: int,
                  elem_bytes: int) -> list[ComputeOp]:
    """One HBM-bound kernel per ``(read, written)`` entry of ``passes``, each tensor of
    ``elements`` elements of ``elem_bytes`` bytes: the kernel moves ``elem_bytes · elements ·
    (read + written)`` bytes and does one FLOP per element written."""
    return [memory_op(name, elem_bytes * elements * (r + w), flops=float(w * elements))
            for r, w in passes]


def vocab_parallel_cross_entropy_ops(elements: int, elem_bytes: int, backward: bool
                                     ) -> list[ComputeOp]:
    """Megatron-LM's vocabulary-parallel cross entropy (``tensor_parallel.cross_entropy``) over a
    GPU's ``elements`` logits (tokens x its vocabulary share) of ``elem_bytes`` bytes, as the
    kernels its code launches; bytes are HBM bytes read plus written. Forward: the logits cast to
    fp32 (none when they are fp32 already), their maximum, the maximum subtracted in place, ``exp``
    in place, the sum, and the division in place that leaves the softmax saved for the backward
    (the all-reduces of the maximum and the sum carry one number per token). Backward: the softmax
    scaled in place by the loss's gradient (after the target's entries are corrected, one per
    token), and the cast back to the logits' precision. (:func:`_extra_segments` puts a
    tensor-parallel all-reduce after the maximum, the subtraction (the target logits) and the
    sum.)"""
    e, f32 = elem_bytes, 4
    cast = elem_bytes != f32
    if backward:
        passes = [("cross_entropy_grad", 2 * f32)]
        if cast:
            passes.append(("cross_entropy_cast_bwd", f32 + e))
    else:
        passes = [("cross_entropy_cast", e + f32)] if cast else []
        passes += [("cross_entropy_max", f32), ("cross_entropy_sub", 2 * f32),
                   ("cross_entropy_exp", 2 * f32), ("cross_entropy_sum", f32),
                   ("cross_entropy_softmax", 2 * f32)]
    return [memory_op(name, nbytes * elements, flops=float(elements)) for name, nbytes in passes]


def eager_residual(elements: int, elem_bytes: int, backward: bool) -> list[ComputeOp]:
    """The residual branch's dropout and add as eager code runs them (two kernels where a fused
    bias-dropout-add is one), over ``elements`` elements of ``elem_bytes`` bytes (HBM bytes
    counted read plus written): dropout reads the branch and writes it with a one-byte mask, the
    add reads it and the residual and writes their sum. Backward: the dropout's (the gradient
    and the mask in, one out) and the add accumulating the residual stream's gradient."""
    e = elem_bytes
    if backward:
        return [memory_op("residual_dropout_bwd", (2 * e + 1) * elements, flops=float(elements)),
                memory_op("residual_add_bwd", 3 * e * elements, flops=float(elements))]
    return [dropout_op("residual_dropout", (2 * e + 1) * elements, flops=float(elements)),
            memory_op("residual_add", 3 * e * elements, flops=float(elements))]


def eager_attention_passes(b: int, hq: int, d: int, s_q: int, s_kv: int, elem_bytes: int,
                           backward: bool, alibi: bool = False
                           ) -> tuple[list[ComputeOp], list[ComputeOp], list[ComputeOp]]:
    """What Hugging Face's eager attention adds to :func:`unfused_attention_ops`, as kernels
    (before the scores, after them, at the end); bytes are HBM bytes read plus written.

    - Before: the heads split out of ``[tokens, hidden]`` are permuted views that the batched
      matmuls copy into contiguous ``q``, ``kᵀ`` and ``v`` (three copies).
    - After the scores: the mask (GPT-2's ``torch.where``, Bloom's ``masked_fill`` against the
      ``s_q × s_kv`` boolean mask) and, unless ``alibi``, the division by ``√d``, each a pass of
      its own where Megatron-LM's fused softmax scales and masks in its one pass. Bloom's
      ``baddbmm`` scales inside the matmul but first copies the broadcast ALiBi bias into its
      output, which the matmul reads back (``alibi``).
    - At the end: the heads merged back into ``[tokens, hidden]`` (``permute().contiguous()``).

    Backward: the same passes' gradients, in reverse (the ALiBi bias needs none).
    """
    n = b * hq * s_q * s_kv
    e = elem_bytes
    head_tensor = 2 * e * b * s_q * hq * d  # one [tokens, heads x d] tensor read and written
    suffix = "_bwd" if backward else ""
    split = [memory_op("attention_split" + suffix, head_tensor) for _ in range(3)]
    mask = memory_op("attention_mask" + suffix, 2 * e * n + s_q * s_kv, flops=float(n))
    if alibi:
        scale = [] if backward else [memory_op("attention_alibi", 2 * e * n)]
    else:
        scale = [memory_op("attention_scale" + suffix, 2 * e * n, flops=float(n))]
    merge = [memory_op("attention_merge" + suffix, head_tensor)]
    if backward:
        return split, [mask, *scale], merge
    if alibi:  # the bias is copied into the output before the matmul
        return split + scale, [mask], merge
    return split, [*scale, mask], merge


def _gemm_bwd(name: str, m: int, k: int, n: int, elem_bytes: int = BF16,
              precision: str = "bf16") -> list[ComputeOp]:
    """Input gradient ``dX[M,K] = dY[M,N]·W^T`` and weight gradient ``dW[K,N] = X^T·dY``."""
    dgrad = ComputeOp(
        name=f"{name}_dgrad", kind="gemm", flops=2.0 * m * k * n,
        bytes=elem_bytes * (m * n + k * n + m * k),
        tiles=math.ceil(m / _TILE) * math.ceil(k / _TILE), depth=n, backward=True,
        precision=precision,
    )
    wgrad = ComputeOp(
        name=f"{name}_wgrad", kind="gemm", flops=2.0 * m * k * n,
        bytes=elem_bytes * (m * k + m * n + k * n),
        tiles=math.ceil(k / _TILE) * math.ceil(n / _TILE), depth=m, backward=True,
        precision=precision,
    )
    return [dgrad, wgrad]


def memory_op(name: str, nbytes: float, flops: float = 0.0, *,
              resident_grid: bool = False) -> ComputeOp:
    """An HBM-bound kernel (elementwise, norm, RoPE) moving ``nbytes``; ``resident_grid``: its
    grid fills the GPU once (:attr:`ComputeOp.resident_grid`)."""
    return ComputeOp(name=name, kind="memory", flops=flops, bytes=float(nbytes),
                     resident_grid=resident_grid)


def norm_op(name: str, nbytes: float, flops: float) -> ComputeOp:
    """A LayerNorm or RMSNorm kernel (forward or backward) as Transformer Engine launches it: one
    block per free slot of every SM, looping over the rows (``ctas_per_col = SMs x blocks per
    SM``), so its grid fills the GPU once."""
    return memory_op(name, nbytes, flops, resident_grid=True)


def dropout_op(name: str, nbytes: float, flops: float) -> ComputeOp:
    """PyTorch's fused dropout kernel (eager ``F.dropout`` in training): its grid is capped at
    ``SMs x 2048 / 256`` blocks, each looping over its share, so it fills the GPU once. (The
    backward, ``native_dropout_backward``, is a plain elementwise kernel.)"""
    return memory_op(name, nbytes, flops, resident_grid=True)


class _LayerOps:
    """The op lists of one layer for ``b`` sequences (one nanobatch or a full microbatch)."""

    def __init__(self, model: ModelSpec, w: Workload, b: int, stage: int | None = None) -> None:
        p = w.parallel
        self.m = model
        self.b = b
        self.eb = p.element_bytes
        self.precision = p.precision
        self.recompute = p.recompute
        self.attention = p.core_attention
        self.eager = p.elementwise == "eager"
        self.s_local = p.seq // p.cp
        self.t = b * self.s_local  # tokens on this GPU
        self.sp = p.sequence_sharded
        self.overlap_grad = p.overlap_tp_grad  # TP gradient collectives beside the GEMMs
        # tokens of the norms, dropouts and residual adds: 1/TP of them with sequence parallelism
        self.t_norm = p.sequence_shard(self.t)
        self.hq = model.heads // p.tp  # local query heads
        self.hkv = model.kv_heads // p.tp
        self.ffn = model.ffn // p.tp
        self.tp, self.cp, self.seq = p.tp, p.cp, p.seq
        # the groups of ``stage`` (None: the job's slowest), which its collectives run over
        self.tp_place = p.group_placement(p.tp, 1, stage)
        self.cp_place = p.group_placement(p.cp, p.tp, stage)

    # -- collectives -------------------------------------------------------------------------
    def _tp_ar(self, name: str) -> CommOp | None:
        """The TP all-reduce of a row-parallel GEMM's output (or a column-parallel one's input
        gradient); with sequence parallelism its reduce-scatter (the same bytes)."""
        if self.tp == 1:
            return None
        if self.sp:
            return self._tp_sp(name.replace("allreduce", "reducescatter"), "reduce_scatter")
        return _comm(name, "all_reduce", self.eb * self.t * self.m.hidden, self.tp, self.tp_place)

    def _tp_sp(self, name: str, collective: Collective) -> CommOp:
        """A sequence-parallel all-gather or reduce-scatter of ``[tokens, hidden]`` over TP (the
        bytes of the whole, gathered tensor)."""
        return _comm(name, collective, self.eb * self.t * self.m.hidden, self.tp, self.tp_place)

    def _sp_gather(self, cut: str, name: str, beside_last: bool = False) -> list[_Cut]:
        """The cut at a sequence-parallel all-gather over TP (none without sequence
        parallelism, so the layer's segments stay as they are); ``beside_last``: it runs beside
        the op before the cut."""
        return [_Cut(cut, self._tp_sp(name, "all_gather"), beside_last)] if self.sp else []

    def _cp_kv(self, name: str, collective: Collective) -> CommOp | None:
        if self.cp == 1:
            return None
        gathered = self.eb * 2 * self.b * self.seq * self.hkv * self.m.head_dim  # K and V, full seq
        return _comm(name, collective, gathered, self.cp, self.cp_place)

    # -- forward -----------------------------------------------------------------------------
    def _attention(self, name: str, backward: bool) -> ComputeOp:
        # Causal over the whole sequence; load-balanced CP gives each rank 1/cp of the queries
        # (hence of the score matrix) against all keys, through Transformer Engine's all-gather
        # CP attention and its host calls.
        calls = TE_CP_ATTENTION_HOST_CALLS[backward] if self.cp > 1 else 0
        return attention_op(name, self.b, self.hq, self.hkv, self.m.head_dim, self.s_local,
                            self.seq, backward=backward, host_calls=calls, elem_bytes=self.eb,
                            precision=self.precision)

    def _core_attention(self, backward: bool) -> list[ComputeOp]:
        """The core attention's kernels: one flash-attention kernel, or Megatron-LM's unfused
        path (:func:`unfused_attention_ops`)."""
        if self.attention == "flash":
            return [self._attention("attention_bwd" if backward else "attention", backward)]
        # Megatron-LM's own path falls back to PyTorch's softmax where its fused kernel cannot
        # run; Hugging Face's eager attention always runs PyTorch's one softmax kernel.
        torch_softmax = not self.eager and not megatron_fused_softmax(
            self.b, self.hq, self.s_local, self.seq, self.precision)
        ops = unfused_attention_ops(self.b, self.hq, self.m.head_dim, self.s_local, self.seq,
                                    self.eb, self.precision, backward, torch_softmax)
        if not self.eager:
            return ops
        before, inner, after = eager_attention_passes(
            self.b, self.hq, self.m.head_dim, self.s_local, self.seq, self.eb, backward,
            alibi=self.m.alibi)
        if backward:  # reversed: merge's gradient first, the mask's after the softmax's
            return after + ops[:4] + inner + ops[4:] + before
        return before + ops[:1] + inner + ops[1:] + after

    def _gemm(self, name: str, m: int, k: int, n: int) -> ComputeOp:
        return gemm_op(name, m, k, n, elem_bytes=self.eb, precision=self.precision)

    def _gemm_bwd(self, name: str, m: int, k: int, n: int) -> list[ComputeOp]:
        return _gemm_bwd(name, m, k, n, elem_bytes=self.eb, precision=self.precision)

    def _residual(self, backward: bool) -> list[ComputeOp]:
        """The residual branch's bias-dropout-add: one fused kernel, or eager's two
        (:func:`eager_residual`)."""
        t, h, eb = self.t_norm, self.m.hidden, self.eb
        if self.eager:
            return eager_residual(t * h, eb, backward)
        if backward:
            return [memory_op("bda_bwd", 3 * eb * t * h, flops=1.0 * t * h)]
        return [memory_op("bda", 3 * eb * t * h, flops=2.0 * t * h)]

    def _activation(self, backward: bool) -> list[ComputeOp]:
        """The MLP's activation over ``[tokens, ffn]``: one fused kernel (GELU reads FC1's output,
        SwiGLU its two halves), or the eager kernels (:data:`GELU_EAGER_FWD`, Bloom's
        :data:`BLOOM_GELU_EAGER_FWD`, :data:`SWIGLU_EAGER_FWD` and their backward)."""
        t, eb = self.t, self.eb
        fc1_n = self.ffn * (2 if self.m.mlp == "swiglu" else 1)
        if self.eager:
            if self.m.mlp == "swiglu":
                passes = SWIGLU_EAGER_BWD if backward else SWIGLU_EAGER_FWD
            elif self.m.gelu == "bloom":  # Bloom's own GELU and its hand-written backward
                passes = BLOOM_GELU_EAGER_BWD if backward else BLOOM_GELU_EAGER_FWD
            elif self.m.gelu == "gelu_new":
                passes = GELU_EAGER_BWD if backward else GELU_EAGER_FWD
            else:  # torch's one GELU kernel: FC1's output in, the activation out
                passes = ((2, 1),) if backward else ((1, 1),)
            return eager_kernels("activation_bwd" if backward else "activation", passes,
                                 t * self.ffn, eb)
        if backward:
            return [memory_op("activation_bwd", eb * t * (2 * fc1_n + self.ffn),
                              flops=12.0 * t * self.ffn)]
        return [memory_op("activation", eb * t * (fc1_n + self.ffn), flops=8.0 * t * self.ffn)]

    def forward(self) -> list[ComputeOp | _Cut]:
        m, t, d, eb = self.m, self.t, self.m.head_dim, self.eb
        h = m.hidden
        qkv_n = (self.hq + 2 * self.hkv) * d
        qk_elems = t * (self.hq + self.hkv) * d
        tn = self.t_norm
        ops: list[ComputeOp | _Cut] = [
            *self._residual(backward=False),
            norm_op("norm", 2 * eb * tn * h, flops=5.0 * tn * h),
            *self._sp_gather("ln1", "tp_allgather_ln1"),
            self._gemm("linear_qkv", t, h, qkv_n),
        ]
        if m.qk_norm:
            ops.append(norm_op("qk_norm", 2 * eb * qk_elems, flops=5.0 * qk_elems))
        if m.rope:
            ops.append(memory_op("rope", 2 * eb * qk_elems, flops=3.0 * qk_elems))
        if self.cp > 1:
            ops.append(_Cut("qkv", self._cp_kv("cp_allgather_kv", "all_gather")))
        ops += self._core_attention(backward=False)
        ops.append(self._gemm("linear_proj", t, self.hq * d, h))
        ops.append(_Cut("ao" if self.cp > 1 else "attn", self._tp_ar("tp_allreduce_attn")))
        ops += self._residual(backward=False)
        ops.append(norm_op("norm", 2 * eb * tn * h, flops=5.0 * tn * h))
        ops += self._sp_gather("ln2", "tp_allgather_ln2")
        fc1_n = self.ffn * (2 if m.mlp == "swiglu" else 1)
        ops.append(self._gemm("linear_fc1", t, h, fc1_n))
        ops += self._activation(backward=False)
        ops.append(self._gemm("linear_fc2", t, self.ffn, h))
        ops.append(_Cut("mlp", self._tp_ar("tp_allreduce_mlp")))
        return ops

    # -- backward ----------------------------------------------------------------------------
    def backward(self) -> list[ComputeOp | _Cut]:
        m, t, d, eb = self.m, self.t, self.m.head_dim, self.eb
        h = m.hidden
        qkv_n = (self.hq + 2 * self.hkv) * d
        qk_elems = t * (self.hq + self.hkv) * d
        fc1_n = self.ffn * (2 if m.mlp == "swiglu" else 1)
        tn = self.t_norm
        # with sequence parallelism the output gradient of a row-parallel GEMM is gathered (the
        # reduce-scatter's backward), and a column-parallel GEMM's input gathered again for its
        # weight gradient (Megatron-LM keeps only its shard)
        ops: list[ComputeOp | _Cut] = [
            norm_op("norm_bwd", 4 * eb * tn * h, flops=8.0 * tn * h),
            *self._sp_gather("mlp_grad", "tp_allgather_fc2_grad")]
        ops += self._gemm_bwd("linear_fc2", t, self.ffn, h)
        ops += self._activation(backward=True)
        ops += self._column_parallel_bwd("linear_fc1", t, h, fc1_n, "fc1")
        ops.append(_Cut("mlp", self._tp_ar("tp_allreduce_fc1_dgrad"), self.overlap_grad))
        ops.append(norm_op("norm_bwd", 4 * eb * tn * h, flops=8.0 * tn * h))
        ops += self._residual(backward=True)
        ops += self._sp_gather("attn_grad", "tp_allgather_proj_grad")
        ops += self._gemm_bwd("linear_proj", t, self.hq * d, h)
        if self.cp > 1:
            ops.append(_Cut("o", self._cp_kv("cp_allgather_kv", "all_gather")))
        if self.recompute == "selective":  # Megatron-LM recomputes the core attention only
            ops += self._core_attention(backward=False)
        ops += self._core_attention(backward=True)
        if self.cp > 1:
            ops.append(_Cut("a", self._cp_kv("cp_reducescatter_dkv", "reduce_scatter")))
        if m.rope:
            ops.append(memory_op("rope_bwd", 2 * eb * qk_elems, flops=3.0 * qk_elems))
        if m.qk_norm:
            ops.append(norm_op("qk_norm_bwd", 3 * eb * qk_elems, flops=8.0 * qk_elems))
        ops += self._column_parallel_bwd("linear_qkv", t, h, qkv_n, "qkv")
        ops.append(_Cut("qkv" if self.cp > 1 else "attn", self._tp_ar("tp_allreduce_qkv_dgrad"),
                        self.overlap_grad))
        return ops

    def _column_parallel_bwd(self, name: str, m: int, k: int, n: int, short: str
                             ) -> list[ComputeOp | _Cut]:
        """A column-parallel GEMM's backward: its input gradient, then (sequence parallelism)
        the all-gather of its input, beside the input gradient where the TP gradient
        collectives overlap (:attr:`overlap_grad`), then its weight gradient."""
        dgrad, wgrad = self._gemm_bwd(name, m, k, n)
        return [dgrad, *self._sp_gather(f"{short}_input", f"tp_allgather_{short}_input",
                                        self.overlap_grad), wgrad]


_SLOT_KIND = {
    "bda": "bda", "bda_bwd": "bda", "norm": "norm", "norm_bwd": "norm", "rope": "rope",
    "rope_bwd": "rope", "qk_norm": "qknorm", "qk_norm_bwd": "qknorm", "attention": "attn",
    "flash_attention": "attn", "qkv_split": "split", "linear_qkv_bias": "bias",
    "attention_bwd": "attn", "activation": "activation", "activation_bwd": "activation",
    "attention_softmax": "softmax", "attention_softmax_bwd": "softmax",
    "attention_dropout": "dropout", "attention_dropout_bwd": "dropout",
    "residual_dropout": "bda", "residual_dropout_bwd": "bda", "residual_add": "bda",
    "residual_add_bwd": "bda", "attention_scale": "softmax", "attention_scale_bwd": "softmax",
    "attention_mask": "softmax", "attention_mask_bwd": "softmax", "attention_merge": "split",
    "attention_merge_bwd": "split", "attention_split": "split", "attention_split_bwd": "split",
    "attention_alibi": "softmax", "attention_softmax_cast": "softmax",
    "attention_softmax_uncast": "softmax", "attention_softmax_cast_bwd": "softmax",
    "attention_softmax_uncast_bwd": "softmax",
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


def _segments(items: list[ComputeOp | _Cut]
              ) -> list[tuple[str, tuple[ComputeOp, ...], CommOp | None, bool]]:
    """Cut an op list at its collectives: ``(name, compute, comm, comm beside the last op)``;
    cuts without a collective (group of 1) merge away."""
    out: list[tuple[str, tuple[ComputeOp, ...], CommOp | None, bool]] = []
    ops: list[ComputeOp] = []
    names: list[str] = []
    for item in items:
        if isinstance(item, _Cut):
            names.append(item.name)
            if item.comm is not None:
                out.append(("+".join(names), label_slots(ops), item.comm,
                            item.beside_last and bool(ops)))
                ops, names = [], []
        else:
            ops.append(item)
    if ops:
        out.append(("+".join(names) if names else "tail", label_slots(ops), None, False))
    return out


def _partition_chain(
    segs0: list[tuple[str, str, tuple[ComputeOp, ...], CommOp | None, bool]],
    segs1: list[tuple[str, str, tuple[ComputeOp, ...], CommOp | None, bool]],
    has_cp: bool,
) -> tuple[Partition, ...]:
    """Interleave the two nanobatches' segments; each compute overlaps the previous collective.

    ``segs`` items are ``(direction prefix, segment name, compute, comm, beside)`` (the
    partitions overlap each collective with the other nanobatch's compute instead, so
    ``beside`` is not used). Partition names follow the Kareus paper: ``<dir>_<segment>`` for
    TP-only layers, ``<dir>_<segment>_<ar|ag|rs>`` for CP+TP layers (the overlapped
    collective), ``<dir>_mlp`` in both.
    """
    order = []
    for a, b in zip(segs0, segs1):
        order.append((0, a))
        order.append((1, b))
    abbrev = {"all_reduce": "ar", "all_gather": "ag", "reduce_scatter": "rs", "send_recv": "p2p"}
    parts = []
    for k, (nb, (prefix, seg, compute, _, _)) in enumerate(order):
        comm = order[k - 1][1][3]  # k == 0 wraps to the previous layer's last collective
        name = f"{prefix}_{seg}"
        if has_cp and seg != "mlp" and comm is not None:
            name += "_" + abbrev[comm.collective]
        parts.append(Partition(key=f"{name}/{nb}", compute=compute, comm=comm))
    return tuple(parts)


def _instruction_ops(layer: _LayerOps, direction: Direction
                     ) -> list[tuple[str, list[ComputeOp | _Cut]]]:
    if direction == "forward":
        return [("fwd", layer.forward())]
    blocks = [("rcp_fwd", layer.forward())] if layer.recompute == "full" else []
    return blocks + [("bwd", layer.backward())]


def _flatten(blocks: list[tuple[str, list[ComputeOp | _Cut]]]
             ) -> list[tuple[str, str, tuple[ComputeOp, ...], CommOp | None, bool]]:
    out = []
    for prefix, items in blocks:
        for seg, compute, comm, beside in _segments(items):
            out.append((prefix, seg, compute, comm, beside))
    return out


def _extra_segments(w: Workload, stage: int, direction: Direction) -> tuple[Segment, ...]:
    """Embedding on the first stage, final norm + output layer + loss on the last (full mbs).
    With sequence parallelism the embedding's all-reduce is a reduce-scatter (RoPE and ALiBi
    models; with learned positions Megatron-core keeps the all-reduce and takes its shard), its
    gradient gathered back, and the final norm runs on 1/TP of the tokens, gathered for the
    output layer (its input gathered again for the weight gradient, its input gradient
    reduce-scattered)."""
    m, p = w.model, w.parallel
    t = p.tokens_per_gpu
    tn = p.sequence_shard(t)  # the norms' tokens
    h, v = m.hidden, w.padded_vocab // p.tp
    eb = p.element_bytes
    place = p.group_placement(p.tp, 1, stage)
    segs: list[Segment] = []

    def tp_all_reduce(name: str, nbytes: float) -> CommOp | None:
        return _comm(name, "all_reduce", nbytes, p.tp, place) if p.tp > 1 else None

    def tp_sp(name: str, collective: Collective) -> CommOp:
        return _comm(name, collective, eb * t * h, p.tp, place)

    if stage == 0:
        if direction == "forward":
            ops = [memory_op("embedding", 3 * eb * t * h)]
            # Megatron-core reduce-scatters the embedding under sequence parallelism unless a
            # learned position table is added after it: then it all-reduces and takes its shard
            scatter = p.sequence_sharded and (m.rope or m.alibi)
            comm = (tp_sp("tp_reducescatter_embedding", "reduce_scatter") if scatter
                    else tp_all_reduce("tp_allreduce_embedding", eb * t * h))
            norm = ([norm_op("norm", 2 * eb * tn * h, flops=5.0 * tn * h)]
                    if m.embedding_norm else [])  # after the embedding's collective
            if p.sequence_sharded and comm is not None:
                segs += [Segment(label_slots(ops), comm)] + (
                    [Segment(label_slots(norm), None)] if norm else [])
            else:
                segs.append(Segment(label_slots(ops + norm), comm))
        else:
            norm = ([norm_op("norm_bwd", 4 * eb * tn * h, flops=8.0 * tn * h)]
                    if m.embedding_norm else [])
            ops = [memory_op("embedding_bwd", 3 * eb * t * h)]
            if p.sequence_sharded:
                segs.append(Segment(label_slots(norm), tp_sp("tp_allgather_embedding_grad",
                                                             "all_gather")))
            else:
                ops = norm + ops
            segs.append(Segment(label_slots(ops), None))
    if stage == p.pp - 1:
        backward = direction == "backward"
        if p.cross_entropy == "unfused":
            loss = vocab_parallel_cross_entropy_ops(t * v, eb, backward)
        else:  # one kernel: the logits in, fp32 softmax statistics; the gradient out
            loss = [memory_op("cross_entropy_bwd" if backward else "cross_entropy",
                              ((4 + eb) if backward else (eb + 4 + 4)) * t * v,
                              flops=(3.0 if backward else 5.0) * t * v)]
        if direction == "forward":
            head = [norm_op("norm", 2 * eb * tn * h, flops=5.0 * tn * h),
                    gemm_op("linear_output", t, h, v, elem_bytes=eb, precision=p.precision)]
            if p.sequence_sharded:  # the norm's shard gathered for the output layer
                segs.append(Segment(label_slots(head[:1]),
                                    tp_sp("tp_allgather_output", "all_gather")))
                head = head[1:]
            if p.cross_entropy == "unfused":  # an all-reduce after the max, target and sum
                by = {op.name: op for op in loss}
                cast = [by["cross_entropy_cast"]] if "cross_entropy_cast" in by else []
                segs += [
                    Segment(label_slots([*head, *cast, by["cross_entropy_max"]]),
                            tp_all_reduce("tp_allreduce_loss_max", 4 * t)),
                    Segment(label_slots([by["cross_entropy_sub"]]),
                            tp_all_reduce("tp_allreduce_loss_target", 4 * t)),
                    Segment(label_slots([by["cross_entropy_exp"], by["cross_entropy_sum"]]),
                            tp_all_reduce("tp_allreduce_loss_sum", 4 * t)),
                    Segment(label_slots([by["cross_entropy_softmax"]]), None)]
                return tuple(segs)
            ops = [*head, *loss]
            ar = tp_all_reduce("tp_allreduce_loss", 4 * 3 * t)
        elif p.sequence_sharded:
            dgrad, wgrad = _gemm_bwd("linear_output", t, h, v, elem_bytes=eb,
                                     precision=p.precision)
            segs += [Segment(label_slots([*loss, dgrad]),
                             tp_sp("tp_allgather_output_input", "all_gather"), p.overlap_tp_grad),
                     Segment(label_slots([wgrad]),
                             tp_sp("tp_reducescatter_output_dgrad", "reduce_scatter"),
                             p.overlap_tp_grad)]
            ops = [norm_op("norm_bwd", 4 * eb * tn * h, flops=8.0 * tn * h)]
            ar = None
        else:
            ops = [*loss, *_gemm_bwd("linear_output", t, h, v, elem_bytes=eb,
                                     precision=p.precision)]
            norm = norm_op("norm_bwd", 4 * eb * t * h, flops=8.0 * t * h)
            ar = tp_all_reduce("tp_allreduce_output_dgrad", eb * t * h)
            if ar is not None and p.overlap_tp_grad:  # the all-reduce beside the weight
                segs.append(Segment(label_slots(ops), ar, True))  # gradient, then the norm
                ops, ar = [], None
            ops.append(norm)
        segs.append(Segment(label_slots(ops), ar))
    return tuple(segs)


def _stage_tail(w: Workload, stage: int) -> tuple[Segment, ...]:
    """What a stage runs after its last backward: the data-parallel gradient synchronisation
    still exposed and the optimizer step, as Megatron-LM runs them.

    - Gradients (:data:`~workloads.parallel.GRAD_BYTES` per element) are all-reduced over the
      ranks that hold the same parameters (DP x CP, :attr:`ParallelConfig.grad_sync_ranks`), or
      reduce-scattered with the distributed optimizer, which all-gathers the updated
      parameters after its step.
    - With ``overlap_param_gather`` the all-gather leaves the tail for the next iteration's
      first forward (:func:`param_gather`).
    - Without ``overlap_grad_reduce`` the reduction runs whole after the last backward. With it,
      buckets are reduced during the last microbatch's backward (:func:`overlapped_grad_sync`
      in the simulator decides how much stays exposed); the tail keeps the collective with the
      bucket count in its name so the backend can tell.
    - The gradients of the parameters every TP rank holds whole but sees only part of (the
      q/k norms; under sequence parallelism every norm and the row-parallel biases,
      :meth:`~workloads.parallel.Workload.tp_replicated_grad_params`) are all-reduced over the
      stage's TP group in one flat buffer, as Megatron-core's ``finalize_model_grads`` does
      after the data-parallel reduction.
    - With tied embeddings and more than one stage, the first stage's input embedding and the
      last stage's output layer are two copies of one matrix: after the data-parallel
      reduction, each pair of ranks holding them (Megatron-LM's embedding group, ``(pp - 1) x
      TP x CP x DP`` ranks apart) all-reduces that matrix's gradient
      (``_allreduce_word_embedding_grads``), over the network when the two stages sit on
      different nodes. The last stage, done with its backwards first, waits there for the
      first, so the iteration ends with the first stage's tail as before.
    - Adam reads the gradient, master weight and two moments and writes them back with the
      working-precision weight, on this rank's shard (1/(DP x CP) with the distributed
      optimizer).
    """
    m, p = w.model, w.parallel
    ranks = p.grad_sync_ranks
    params = w.stage_params(stage)
    shard = params / ranks if p.distributed_optimizer else params
    grad_b = GRAD_BYTES[p.precision]
    # fp32 / tf32: the weight is the master copy, read and written; otherwise the fp32 master
    # is read and written and the working-precision copy written
    weight = 2 * p.element_bytes if p.precision in ("fp32", "tf32") else 2 * 4 + p.element_bytes
    # fp16 keeps fp32 main gradients: Megatron-LM's Float16OptimizerWithFloat16Params copies
    # the 16-bit gradients into them (read 2, write 4) and the step reads them (4)
    step_grad_b = grad_b + 4 + 4 if p.precision == "fp16" else grad_b
    step = memory_op("optimizer_step", shard * (step_grad_b + weight + 4 * 4),
                     flops=12.0 * shard)
    tail: list[Segment] = []
    gather = None
    if ranks > 1:
        place = p.group_placement(ranks, p.tp, stage)
        if p.distributed_optimizer:
            tail.append(Segment((), _comm("dp_reducescatter_grads", "reduce_scatter",
                                          grad_b * params, ranks, place)))
            if not p.overlap_param_gather:
                gather = param_gather(w, stage)
        else:
            tail.append(Segment((), _comm("dp_allreduce_grads", "all_reduce", grad_b * params,
                                          ranks, place)))
    replicated = w.tp_replicated_grad_params(stage)
    if replicated:
        tail.append(Segment((), _comm("tp_allreduce_norm_grads", "all_reduce",
                                      grad_b * replicated, p.tp,
                                      p.group_placement(p.tp, 1, stage))))
    if m.tied_embeddings and p.pp > 1 and stage in (0, p.pp - 1):
        tail.append(Segment((), _comm(
            "pp_allreduce_embedding_grads", "all_reduce", grad_b * w.padded_vocab * m.hidden / p.tp,
            2,
            p.group_placement(2, (p.pp - 1) * p.gpus_per_stage))))
    tail.append(Segment(label_slots([step]), gather))
    return tuple(tail)


def grad_buckets(w: Workload, stage: int) -> tuple[GradBucket, ...]:
    """``stage``'s data-parallel buckets as Megatron-core's ``_ParamAndGradBuffer`` fills them:
    the stage's weights in reverse order (the output layer, the layers from the last, their
    weights from ``fc2`` back, the input embedding), a bucket closed once it holds
    :func:`~workloads.parallel.grad_bucket_params` parameters, and with the distributed
    optimizer a tied embedding shared across stages in a bucket of its own. Only the first
    stage buckets, and only with ``overlap_grad_reduce``; every other stage (and every stage
    without it) has one bucket."""
    m, p = w.model, w.parallel
    layers = w.stage_layers()[stage]
    if not (p.overlap_grad_reduce and stage == 0):
        return (GradBucket(1.0, float(layers)),)
    layer_total = m.layer_params()
    # forward order: (parameters, layer-equivalents, a tied embedding shared across stages)
    weights: list[tuple[float, float, bool]] = []
    shared = m.tied_embeddings and p.pp > 1 and p.distributed_optimizer
    weights.append((w.embedding_params() / p.tp, 0.0, shared))
    for _ in range(layers):
        weights += [(n / p.tp, n / layer_total, False) for _, n in m.layer_tensors() if n]
    if p.pp == 1 and not m.tied_embeddings:
        weights.append((w.padded_vocab * m.hidden / p.tp, 0.0, False))
    size = grad_bucket_params(p.dp)
    total = sum(n for n, _, _ in weights)
    buckets: list[GradBucket] = []
    params = held = 0.0
    for n, share, own in reversed(weights):
        if own and params:
            buckets.append(GradBucket(params / total, held))
            params = held = 0.0
        params, held = params + n, held + share
        if params >= size or own:
            buckets.append(GradBucket(params / total, held))
            params = held = 0.0
    if params:
        buckets.append(GradBucket(params / total, held))
    return tuple(buckets)


def param_gather(w: Workload, stage: int) -> CommOp:
    """The distributed optimizer's all-gather of ``stage``'s updated parameters (in the working
    precision) over the ranks that share them (DP x CP)."""
    p = w.parallel
    ranks = p.grad_sync_ranks
    return _comm("dp_allgather_params", "all_gather", p.element_bytes * w.stage_params(stage),
                 ranks, p.group_placement(ranks, p.tp, stage))


def build_iteration_graph(w: Workload) -> IterationGraph:
    """The iteration graph of ``w`` (per-GPU ops; all GPUs of a stage do the same work)."""
    m, p = w.model, w.parallel
    nb = p.nanobatches
    graphs: dict[tuple[int, Direction], InstructionGraph] = {}
    # a stage's TP and CP collectives run over its own groups; stages whose groups have the
    # same shape share their layers' ops
    layer_ops: dict[tuple[tuple[int, int], tuple[int, int]], tuple] = {}
    for stage, layers in enumerate(w.stage_layers()):
        shape = (p.group_placement(p.tp, 1, stage), p.group_placement(p.cp, p.tp, stage))
        if shape not in layer_ops:
            layer_ops[shape] = (_LayerOps(m, w, p.mbs, stage), _LayerOps(
                m, w, p.mbs // nb, stage) if p.splits_into_nanobatches else None)
        full, half = layer_ops[shape]
        for direction in _DIRECTIONS:
            blocks = _instruction_ops(full, direction)
            sequential = tuple(
                Segment(compute, comm, beside) for _, _, compute, comm, beside in _flatten(blocks)
            )
            partitions: tuple[Partition, ...] = ()
            if half is not None:
                segs = _flatten(_instruction_ops(half, direction))
                partitions = _partition_chain(segs, segs, has_cp=p.cp > 1)
            graphs[(stage, direction)] = InstructionGraph(
                stage=stage, direction=direction, layers=layers,
                sequential=sequential, partitions=partitions,
                extra=_extra_segments(w, stage, direction),
            )
    p2p, across, gather = None, (), None
    if p.pp > 1:
        # the stage boundaries' slowest link: a boundary crosses nodes when ranks one stage
        # apart (TP·CP·DP) sit on different nodes; with stages smaller than a node only some do
        place = p.group_placement(p.pp, p.gpus_per_stage)
        # the activation a rank sends: its sequence shard with sequence parallelism; its 1/TP,
        # all-gathered by the receiving TP group, with Megatron-LM's scatter/gather
        tensor = float(p.element_bytes * p.sequence_shard(p.tokens_per_gpu) * m.hidden)
        p2p = CommOp("pp_send_recv", "send_recv", tensor / p.tp if p.p2p_scattered else tensor,
                     2, intra_node=place[0] == 1, nodes=min(place[0], 2), ranks_per_node=1)
        if p.p2p_scattered:
            gather = _comm("pp_allgather_received", "all_gather", tensor, p.tp,
                           p.group_placement(p.tp, 1))
        across = p.stage_boundaries_across_nodes()
    tails = {s: _stage_tail(w, s) for s in range(p.pp)}
    buckets = {s: grad_buckets(w, s) for s in range(p.pp)}
    return IterationGraph(
        workload=w.name, stages=p.pp, microbatches=p.microbatches,
        gpus_per_stage=p.gpus_per_stage, instruction_graphs=graphs, p2p=p2p,
        p2p_across_nodes=across, p2p_gather=gather,
        stage_tail=tails, model_flops=model_flops(w),
        overlap_grad_reduce=p.overlap_grad_reduce and p.grad_sync_ranks > 1, grad_buckets=buckets,
        param_gather={s: param_gather(w, s) for s in range(p.pp)}
        if p.overlap_param_gather and p.grad_sync_ranks > 1 else {},
        nanobatch_refusal=p.nanobatch_refusal, job=w.to_dict(),
    )


def model_flops(w: Workload) -> float:
    """Model FLOPs of one iteration, whole job, without recomputation: 3x the forward FLOPs of
    every layer's matmuls and attention plus the output layer, the model's own vocabulary and
    half the causal scores (PaLM's MFU convention; Megatron-LM's logged TFLOP/s counts the padded
    vocabulary and every score, so it reads higher)."""
    m, p = w.model, w.parallel
    # the model's FLOPs, whatever kernels compute them: causal attention counts half the scores
    # (as flash attention computes it; 32-bit precisions always run the unfused path)
    layer = _LayerOps(m, Workload(m, replace(p, attention="flash", precision="bf16")), p.mbs)
    fwd = sum(op.flops for op in layer.forward() if isinstance(op, ComputeOp) and op.kind != "memory")
    # the model's own vocabulary: the padding is work, not the model's FLOPs
    per_gpu_mb = m.layers * fwd + 2.0 * p.tokens_per_gpu * m.hidden * m.vocab / p.tp
    # per-GPU numbers times the TP x CP group size give one microbatch of one pipeline replica
    return 3.0 * per_gpu_mb * p.tp * p.cp * p.microbatches * p.dp
