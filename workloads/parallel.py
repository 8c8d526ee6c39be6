"""Parallel configuration of a training job and the :class:`Workload` (model + parallelism).

The default shape of every workload is the Kareus paper's testbed (2 nodes x 8 A100): PP=2, TP=8,
micro-batch size 8, 8 microbatches, the model's native sequence length and full activation
recomputation. A model whose heads, KV heads or FFN width TP=8 does not divide (a Hugging Face
config, e.g. GPT-2's 12 heads) gets TP halved until it divides them all (GPT-2: TP=4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from workloads.errors import WorkloadError
from workloads.models import ModelSpec, get_model

#: Bytes per parameter of bf16 mixed-precision Adam as Megatron-LM keeps it: bf16 weight (2),
#: fp32 main gradient (4), and fp32 master weight + two Adam moments (12, shardable over DP).
_BYTES_WEIGHT_AND_GRAD = 2 + 4
_BYTES_OPTIMIZER = 12
#: CUDA context, NCCL buffers, allocator fragmentation (bytes); a rough allowance.
_RUNTIME_OVERHEAD_BYTES = 3 * 2**30


@dataclass(frozen=True)
class ParallelConfig:
    """How one training iteration is split over GPUs.

    Attributes:
        tp: Tensor-parallel degree (Megatron style, inside a node).
        cp: Context-parallel degree (sequence split, K/V all-gather).
        pp: Pipeline stages.
        dp: Data-parallel replicas.
        mbs: Micro-batch size (sequences per microbatch).
        microbatches: Microbatches per iteration and pipeline.
        seq: Sequence length (tokens).
        recompute: Full activation recomputation (backward re-runs the layer's forward).
        nanobatches: Nanobatches a microbatch is split into for overlap (2 in Kareus; 1 = none).
        gpus_per_node: GPUs joined by NVLink; groups larger than this cross the network.
        layer_split: Layers per stage; ``None`` lets :meth:`Workload.stage_layers` choose.
    """

    tp: int = 8
    cp: int = 1
    pp: int = 2
    dp: int = 1
    mbs: int = 8
    microbatches: int = 8
    seq: int = 2048
    recompute: bool = True
    nanobatches: int = 2
    gpus_per_node: int = 8
    layer_split: tuple[int, ...] | None = None

    @property
    def num_gpus(self) -> int:
        """All GPUs of the job."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def gpus_per_stage(self) -> int:
        """GPUs that run one pipeline stage (TP x CP x DP)."""
        return self.tp * self.cp * self.dp

    @property
    def tokens_per_gpu(self) -> int:
        """Tokens of one microbatch that one GPU processes (its CP shard)."""
        return self.mbs * self.seq // self.cp


@dataclass(frozen=True)
class Workload:
    """A model trained under a parallel configuration; validated on construction."""

    model: ModelSpec
    parallel: ParallelConfig
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.model.name)
        validate(self.model, self.parallel)

    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers per pipeline stage.

        Megatron-style uneven split: the last stage also runs the output layer and the loss, so
        layers move to earlier stages until the most expensive stage is as cheap as possible. The
        cost of a stage is its FLOPs per token over one iteration (forward, backward = 2x forward,
        plus one more forward with recomputation for transformer layers; the output layer is not
        recomputed). For Llama 3.2 3B on 2 stages this gives 15 + 13, the Kareus artifact's split.
        """
        if self.parallel.layer_split is not None:
            return self.parallel.layer_split
        m, p = self.model, self.parallel
        per_layer = _layer_flops_per_token(m, p.seq) * (4 if p.recompute else 3)
        output = 2 * m.hidden * m.vocab * 3
        stages = p.pp
        best: tuple[float, tuple[int, ...]] | None = None
        base = m.layers // stages
        # Search splits that differ from the even one by at most a few layers per stage.
        for extra_last in range(-min(base - 1, 6), 1):
            last = base + extra_last
            rest = m.layers - last
            k = stages - 1
            if k == 0:
                split = (m.layers,)
            else:
                q, r = divmod(rest, k)
                if q < 1:
                    continue
                split = tuple(q + (1 if i < r else 0) for i in range(k)) + (last,)
            cost = max(
                split[i] * per_layer + (output if i == stages - 1 else 0) for i in range(stages)
            )
            if best is None or cost < best[0] - 1e-9:
                best = (cost, split)
        assert best is not None
        return best[1]

    def memory_estimate_bytes(self) -> dict[int, float]:
        """Rough peak memory per GPU for each stage (bytes): weights, gradients, Adam states
        (sharded over DP as with Megatron's distributed optimizer), stored layer inputs of the
        microbatches in flight (1F1B keeps ``pp - stage`` of them), one layer's working set during
        recomputation/backward, the logits on the last stage, and a runtime allowance."""
        m, p = self.model, self.parallel
        layers = self.stage_layers()
        tokens = p.tokens_per_gpu
        out: dict[int, float] = {}
        for s, n in enumerate(layers):
            params = n * m.layer_params() / p.tp
            if s == 0:
                params += m.embedding_params() / p.tp
            if s == p.pp - 1 and (not m.tied_embeddings or p.pp > 1):
                params += m.vocab * m.hidden / p.tp
            states = params * (_BYTES_WEIGHT_AND_GRAD + _BYTES_OPTIMIZER / p.dp)
            in_flight = min(p.pp - s, p.microbatches)
            per_layer_input = tokens * m.hidden * 2
            stored = (n if p.recompute else n * (10 + 24 / p.tp) / 2) * per_layer_input * in_flight
            working = tokens * m.hidden * (10 + 24 / p.tp) + tokens * m.ffn * 4 / p.tp
            logits = tokens * m.vocab / p.tp * 4 * 2 if s == p.pp - 1 else 0.0
            out[s] = states + stored + working + logits + _RUNTIME_OVERHEAD_BYTES
        return out

    def check_fits(self, gpu_memory_bytes: float) -> list[str]:
        """Messages for the stages whose estimated memory exceeds the GPU's (empty: fits)."""
        return [
            f"stage {s} needs about {b / 2**30:.1f} GiB per GPU, more than the "
            f"{gpu_memory_bytes / 2**30:.0f} GiB available"
            for s, b in self.memory_estimate_bytes().items()
            if b > gpu_memory_bytes
        ]

    def memory_warnings(self, gpu_memory_bytes: float, strict: bool = False) -> list[str]:
        """:meth:`check_fits`'s messages to print as warnings; with ``strict`` (``--strict``) a
        workload that does not fit raises :class:`WorkloadError` (one line with the estimate)."""
        fits = self.check_fits(gpu_memory_bytes)
        if fits and strict:
            raise WorkloadError(f"{self.name} does not fit in GPU memory (--strict): "
                                f"{'; '.join(fits)}; raise TP/PP or lower the micro-batch size")
        return fits


def _layer_flops_per_token(m: ModelSpec, seq: int) -> float:
    """Forward FLOPs of one layer per token: the matmuls plus causal attention (half of s^2)."""
    mats = m.hidden * (m.q_width + 2 * m.kv_width) + m.q_width * m.hidden
    mats += (3 if m.mlp == "swiglu" else 2) * m.hidden * m.ffn
    attention = 2 * m.q_width * seq  # QK^T and PV, 2 FLOPs per MAC, halved by causality
    return 2 * mats + attention


#: Most (microbatch, stage) pairs an iteration may have: every one holds a forward and a
#: backward instruction in the iteration graph, the plans and the schedule.
MAX_PIPELINE_SLOTS = 1 << 20
#: Memory one (microbatch, stage) pair takes through the graph and a simulated plan (bytes),
#: measured on ``kareus simulate`` (peak resident size over microbatch counts).
GRAPH_BYTES_PER_SLOT = 1500


def validate(model: ModelSpec, p: ParallelConfig) -> None:
    """Raise :class:`WorkloadError` with one line naming the first impossible setting."""
    for name in ("tp", "cp", "pp", "dp", "mbs", "microbatches", "seq", "nanobatches",
                 "gpus_per_node"):
        value = getattr(p, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise WorkloadError(f"--{name} must be a positive integer, got {value!r}")
    if model.heads % p.tp:
        raise WorkloadError(
            f"{model.name}: {model.heads} attention heads are not divisible by TP={p.tp}; "
            f"valid TP: {', '.join(str(d) for d in _divisors(math.gcd(model.heads, model.kv_heads)))}"
        )
    if model.kv_heads % p.tp:
        raise WorkloadError(
            f"{model.name}: {model.kv_heads} key/value heads are not divisible by TP={p.tp}; "
            f"valid TP: {', '.join(str(d) for d in _divisors(model.kv_heads))}"
        )
    if model.ffn % p.tp:
        raise WorkloadError(f"{model.name}: FFN width {model.ffn} is not divisible by TP={p.tp}")
    if model.layers < p.pp:
        raise WorkloadError(
            f"{model.name} has {model.layers} layers, fewer than PP={p.pp} pipeline stages"
        )
    if p.microbatches < p.pp:
        raise WorkloadError(
            f"--microbatches {p.microbatches} is fewer than the {p.pp} pipeline stages; 1F1B "
            f"needs at least one microbatch per stage (use --microbatches >= {p.pp})"
        )
    if p.microbatches * p.pp > MAX_PIPELINE_SLOTS:
        raise WorkloadError(
            f"--microbatches {p.microbatches} x {p.pp} stages is {p.microbatches * p.pp:,} "
            f"(microbatch, stage) pairs; the iteration graph would need about "
            f"{p.microbatches * p.pp * GRAPH_BYTES_PER_SLOT / 2**30:,.1f} GiB of memory; at most "
            f"{MAX_PIPELINE_SLOTS:,} (--microbatches <= {MAX_PIPELINE_SLOTS // p.pp:,} here)"
        )
    if p.seq % (2 * p.cp):
        raise WorkloadError(
            f"sequence length {p.seq} must be divisible by 2*CP={2 * p.cp} "
            "(load-balanced causal context parallelism)"
        )
    if p.nanobatches > 1 and (p.mbs < p.nanobatches or p.mbs % p.nanobatches):
        raise WorkloadError(
            f"micro-batch size {p.mbs} cannot be split into {p.nanobatches} nanobatches; "
            f"use an MBS that is a multiple of {p.nanobatches} (>= {p.nanobatches})"
        )
    if p.layer_split is not None:
        if len(p.layer_split) != p.pp or sum(p.layer_split) != model.layers or min(
            p.layer_split
        ) < 1:
            raise WorkloadError(
                f"layer split {p.layer_split} must give each of the {p.pp} stages at least one "
                f"layer and sum to {model.layers}"
            )


def default_tp(model: ModelSpec, tp: int) -> int:
    """``tp``, halved until it divides the model's heads, KV heads and FFN width (1 at worst)."""
    while tp > 1 and math.gcd(model.heads, model.kv_heads, model.ffn) % tp:
        tp //= 2
    return tp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def make_workload(
    name: str,
    *,
    tp: int | None = None,
    cp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    mbs: int | None = None,
    seq: int | None = None,
    microbatches: int | None = None,
    recompute: bool | None = None,
    layer_split: tuple[int, ...] | None = None,
) -> Workload:
    """Build a validated workload: the paper's testbed shape with the given overrides. ``name``
    is a built-in model or a Hugging Face config path (:func:`workloads.models.get_model`)."""
    model = get_model(name)
    parallel = ParallelConfig(seq=model.native_seq)
    parallel = replace(parallel, tp=default_tp(model, parallel.tp))
    overrides = {
        k: v
        for k, v in dict(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, seq=seq,
                         microbatches=microbatches, recompute=recompute,
                         layer_split=layer_split).items()
        if v is not None
    }
    return Workload(model=model, parallel=replace(parallel, **overrides))
