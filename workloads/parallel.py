"""Parallel configuration of a training job and the :class:`Workload` (model + parallelism).

The default shape of every workload is the Kareus paper's testbed (2 nodes x 8 A100): PP=2, TP=8,
micro-batch size 8, 8 microbatches, the model's native sequence length, bf16 and full activation
recomputation (the paper's runs recompute every layer; the default keeps that). The layers are
split over the stages by FLOPs (:meth:`Workload.stage_layers`), not as the testbed split them:
the paper's suite gives its configurations their 15 + 13 explicitly. A model whose
heads, KV heads or FFN width TP=8 does not divide (a Hugging Face config, e.g. GPT-2's 12 heads)
gets TP halved until it divides them all (GPT-2: TP=4).

Placement is Megatron-LM's: global rank ``r = tp_rank + TP·(cp_rank + CP·(dp_rank + DP·pp_rank))``
(TP innermost, then CP, DP, PP), ``gpus_per_node`` consecutive ranks per node. A group of ranks
``stride`` apart spans ``nodes`` nodes with ``ranks_per_node`` of its ranks on each; where groups
of one kind differ, the slowest stands for all (:meth:`ParallelConfig.group_placement`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from kareus.json_types import JsonObject, construct

from workloads.errors import WorkloadError
from workloads.catalog import get_model
from workloads.models import ModelSpec

Precision = Literal["bf16", "fp16", "tf32", "fp32"]
Recompute = Literal["none", "selective", "full"]
Attention = Literal["flash", "unfused"]
ATTENTION_KINDS: tuple[str, ...] = ("flash", "unfused")
Elementwise = Literal["fused", "eager"]
ELEMENTWISE_KINDS: tuple[str, ...] = ("fused", "eager")
CrossEntropy = Literal["fused", "unfused"]
CROSS_ENTROPY_KINDS: tuple[str, ...] = ("fused", "unfused")
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32")
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")

#: Bytes of one activation / weight element under each precision (tf32: fp32 tensors whose
#: matmuls run on TF32 tensor cores).
ELEMENT_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
#: Bytes of one gradient element as Megatron-LM reduces it: bf16 training accumulates and reduces
#: fp32 main gradients (``accumulate_allreduce_grads_in_fp32`` is forced on with bf16); fp16
#: reduces fp16 gradients by default; fp32 / tf32 train in fp32.
GRAD_BYTES: dict[str, int] = {"bf16": 4, "fp16": 2, "tf32": 4, "fp32": 4}
#: Parameters per gradient bucket with ``overlap_grad_reduce``: Megatron-core's default
#: ``bucket_size``, ``max(40 M, 1 M x DP)`` of the rank's own (TP-sharded) parameters, DP without
#: the context-parallel ranks (``DistributedDataParallel``; :func:`grad_bucket_params`), a bucket
#: closed once it holds that many; only the first pipeline stage buckets its gradients, the
#: others reduce them in one piece (:func:`workloads.graph_builder.grad_buckets`).
GRAD_BUCKET_PARAMS = 40_000_000
GRAD_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def grad_bucket_params(dp: int) -> int:
    """Parameters of one gradient bucket on a rank of a ``dp``-way data-parallel group
    (Megatron-core's default ``bucket_size``; context-parallel ranks not counted)."""
    return max(GRAD_BUCKET_PARAMS, GRAD_BUCKET_PARAMS_PER_DP_RANK * dp)
#: Adam's fp32 master weight and two moments (bytes per parameter, shardable over DP x CP with the
#: distributed optimizer), held through the whole iteration; mixed precision keeps the master
#: copy, fp32 training does not.
_OPTIMIZER_BYTES: dict[str, int] = {"bf16": 12, "fp16": 12, "tf32": 8, "fp32": 8}
#: What the optimizer step adds for its own duration (bytes per parameter, sharded like the
#: optimizer): fp16's gradients are 16-bit, so the step copies them into fp32 main gradients
#: (``main_param.grad = main_grad.float()`` in Megatron-LM's ``Float16OptimizerWithFloat16Params``)
#: and frees them at the next ``zero_grad``, before the forward pass; bf16's main gradients are
#: fp32 already (the copy is an alias). With the held bytes this is Megatron-core's
#: distributed-optimizer guide's 18 / 6 + 12/d bytes for bf16 and 20 / 4 + 16/d for fp16, at the
#: step; the activations are freed by then.
_STEP_ONLY_BYTES: dict[str, int] = {"bf16": 0, "fp16": 4, "tf32": 0, "fp32": 0}
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
        recompute: What the backward pass recomputes: ``"full"`` re-runs each layer's forward
            (the Kareus paper's runs), ``"selective"`` only its core attention (Megatron-LM's
            selective recomputation), ``"none"`` nothing (activations stored).
        nanobatches: Nanobatches a microbatch is split into for overlap (2 in Kareus; 1 = none).
            A micro-batch size it does not divide builds no partitions: only plans that are not
            nanobatched can run it.
        gpus_per_node: GPUs of one node (NVLink or PCIe inside); groups spanning nodes use the
            network.
        layer_split: Transformer layers per stage; ``None`` lets :meth:`Workload.stage_layers`
            choose.
        precision: ``bf16`` / ``fp16`` (16-bit tensors, tensor cores), ``tf32`` (fp32 tensors,
            TF32 tensor-core matmuls) or ``fp32`` (no tensor cores).
        distributed_optimizer: Megatron-LM's distributed optimizer: gradients are
            reduce-scattered over DP x CP, each rank steps its shard, and parameters are
            all-gathered; without it gradients are all-reduced and every rank steps every
            parameter.
        attention: The core attention's implementation: ``"flash"`` (one fused kernel:
            Transformer Engine, FlashAttention) or ``"unfused"`` (Megatron-LM's path before
            flash attention, and plain PyTorch GPT models: the score matrix in HBM).
        elementwise: How the elementwise work between the matmuls runs: ``"fused"`` (one
            kernel per block: Megatron-LM's fused bias-GELU, bias-dropout-add and
            scale-mask-softmax, Transformer Engine) or ``"eager"`` (PyTorch eager code as Hugging
            Face models write it, run by frameworks such as Merak: GPT-2's tanh GELU as eight
            kernels, the residual dropout and add apart and, with ``attention="unfused"``, the
            attention scores scaled and masked in passes of their own;
            :mod:`workloads.graph_builder`). Simulator-only: the GPU backend runs fused kernels.
        overlap_grad_reduce: Bucketed gradient reduction overlapped with the backward pass
            (Megatron-LM's ``--overlap-grad-reduce``, buckets of :func:`grad_bucket_params`
            of the rank's parameters on the first stage, one piece on the others, as
            Megatron-core buckets); without it one reduction runs after the last backward.
        overlap_param_gather: The distributed optimizer's parameter all-gather leaves the end of
            the optimizer step for the next iteration's first forward (Megatron-LM's
            ``--overlap-param-gather``, which needs ``distributed_optimizer`` and
            ``overlap_grad_reduce``): the forward pre-hook of the first module that needs a
            bucket launches its all-gather and waits for it, and launches the next bucket's, so
            the first bucket's stays exposed and each later one runs under the forward of the
            bucket before. The buckets are the gradient buckets (several on the first stage, one
            on the others, as Megatron-core builds them); without interleaving Megatron-LM turns
            ``align_param_gather`` off, so a later stage launches its all-gather only once its
            first activation has arrived (Megatron-core from 2024 on; earlier versions launched
            the first bucket's in the optimizer's ``zero_grad``).
        cross_entropy: The loss over the vocabulary: ``"fused"`` (one kernel each way:
            Megatron-LM's ``--cross-entropy-loss-fusion``, as the Kareus testbed runs it; close in
            bytes to PyTorch's log-softmax loss, which Hugging Face code calls) or ``"unfused"`` (Megatron-LM's
            default: its vocabulary-parallel cross entropy in PyTorch ops, six passes over fp32
            logits forward and two backward; :func:`workloads.graph_builder.
            vocab_parallel_cross_entropy_ops`). Simulator-only, as ``elementwise``.
        make_vocab_size_divisible_by: Megatron-LM's flag of that name: the vocabulary is padded
            to a multiple of this times TP (:attr:`Workload.padded_vocab`; 128, Megatron-LM's
            default; 1 keeps it as it is, as Hugging Face code run by Merak does).
        sequence_parallel: Megatron-LM's ``--sequence-parallel``: with TP > 1 the layer norms,
            dropouts and residual adds run on 1/TP of the tokens, each TP all-reduce becomes a
            reduce-scatter after the row-parallel GEMM and an all-gather before the
            column-parallel one (the same bytes on the wire), the backward gathers each
            column-parallel GEMM's input again for its weight gradient, and the activations
            stored and sent between stages are 1/TP. With TP 1 it changes nothing (Megatron-LM
            turns it off). The input's all-gather in the backward and the input gradient's
            reduce-scatter overlap GEMMs as :attr:`overlap_tp_grad` says. The norms'
            gradients are all-reduced over TP after the backward
            (:meth:`Workload.tp_replicated_grad_params`).
        overlap_tp_grad: The backward's TP collectives overlap GEMMs, as Megatron-LM's code does
            from late 2021 on (``--no-async-tensor-model-parallel-allreduce`` turns it off) and
            Transformer Engine's: a column-parallel linear's input-gradient all-reduce (with
            sequence parallelism its reduce-scatter) is launched on a side stream before the
            weight-gradient GEMM and runs beside it, and with sequence parallelism the
            all-gather of its input runs beside the input-gradient GEMM
            (:attr:`kareus.graph.Segment.comm_beside_last`). Off (the default): they run between
            the kernels, which the shared measurements fit better (docs/calibration.md, "The
            backward's TP collectives beside the GEMMs"). Simulator-only; nanobatched plans
            overlap each collective with the other nanobatch's compute instead.
        scatter_gather_p2p: Megatron-LM's ``--scatter-gather-tensors-in-pipeline``, on by
            default in Megatron-LM before Megatron Core (2021 to 2023; Narayanan et al., SC '21,
            section 4.1): with TP > 1 each TP rank sends only its 1/TP of the activation to the
            next stage (or of the gradient to the one before), each over its own link, and the
            receiving TP group all-gathers the pieces (inside its node unless TP spans nodes)
            (:attr:`p2p_scattered`). Megatron Core sends the whole tensor from every TP rank (the
            default here). With sequence parallelism the tensor sent is already 1/TP, and
            nothing changes. Simulator-only.
    """

    tp: int = 8
    cp: int = 1
    pp: int = 2
    dp: int = 1
    mbs: int = 8
    microbatches: int = 8
    seq: int = 2048
    recompute: Recompute = "full"
    nanobatches: int = 2
    gpus_per_node: int = 8
    layer_split: tuple[int, ...] | None = None
    precision: Precision = "bf16"
    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    attention: Attention = "flash"
    elementwise: Elementwise = "fused"
    cross_entropy: CrossEntropy = "fused"
    make_vocab_size_divisible_by: int = 128
    sequence_parallel: bool = False
    overlap_tp_grad: bool = False
    scatter_gather_p2p: bool = False

    def job_fields(self) -> dict[str, object]:
        """The job's shape as commands and result files report it (``--json``'s and
        ``summary.json``'s ``parallel``): the :data:`JOB_FIELDS` and their values, ``attention``
        the one that runs (:attr:`core_attention`), so that the fields given back as flags are
        the same job."""
        return {k: self.core_attention if k == "attention" else getattr(self, k)
                for k in JOB_FIELDS}

    @property
    def num_gpus(self) -> int:
        """All GPUs of the job."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def core_attention(self) -> Attention:
        """The core attention that runs: :attr:`attention`, but flash attention needs 16-bit
        tensors; with ``tf32`` or ``fp32`` Transformer Engine falls back to its unfused path
        (``UnfusedDotProductAttention``: the score matrix in HBM), and so does Megatron-LM."""
        return self.attention if self.precision in ("bf16", "fp16") else "unfused"

    @property
    def gpus_per_stage(self) -> int:
        """GPUs that run one pipeline stage (TP x CP x DP)."""
        return self.tp * self.cp * self.dp

    @property
    def sequence_sharded(self) -> bool:
        """Whether sequence parallelism is on and shards anything (it needs TP > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def p2p_scattered(self) -> bool:
        """Whether a transfer between stages is scattered over the TP ranks and all-gathered by
        the receiver (:attr:`scatter_gather_p2p` with TP > 1 and no sequence parallelism)."""
        return self.scatter_gather_p2p and self.tp > 1 and not self.sequence_sharded

    def sequence_shard(self, tokens: int) -> int:
        """A GPU's share of ``tokens`` where sequence parallelism splits them over TP (the norms'
        and residual adds' tokens, the activations stored and sent between stages): ``tokens /
        TP`` with it, all of them without."""
        return tokens // self.tp if self.sequence_sharded else tokens

    @property
    def tokens_per_gpu(self) -> int:
        """Tokens of one microbatch that one GPU processes (its CP shard)."""
        return self.mbs * self.seq // self.cp

    @property
    def element_bytes(self) -> int:
        """Bytes of one activation or weight element (:data:`ELEMENT_BYTES`)."""
        return ELEMENT_BYTES[self.precision]

    @property
    def nanobatch_refusal(self) -> str:
        """Why nanobatched plans cannot run this job ('' when they can, or when the job is not
        split into nanobatches at all)."""
        if self.nanobatches == 1 or self.splits_into_nanobatches:
            return ""
        return (f"micro-batch size {self.mbs} cannot be split into {self.nanobatches} "
                f"nanobatches; use an MBS that is a multiple of {self.nanobatches} for "
                "nanobatched plans")

    @property
    def splits_into_nanobatches(self) -> bool:
        """Whether the micro-batch divides into :attr:`nanobatches` (partitions exist)."""
        return self.nanobatches > 1 and self.mbs % self.nanobatches == 0

    def stage_boundaries_across_nodes(self) -> tuple[bool, ...]:
        """For each of the ``pp - 1`` boundaries between adjacent pipeline stages, whether it
        crosses nodes under Megatron-LM's placement (stage ``b`` holds the ``gpus_per_stage``
        consecutive ranks from ``b · gpus_per_stage``; rank ``r`` sends to ``r +
        gpus_per_stage``). A boundary stays inside a node when both stages fit in one node's run
        of consecutive ranks: ``(b · G) mod gpus_per_node + 2G <= gpus_per_node``."""
        g, n = self.gpus_per_stage, self.gpus_per_node
        return tuple((b * g) % n + 2 * g > n for b in range(self.pp - 1))

    @property
    def grad_sync_ranks(self) -> int:
        """Ranks that hold the same parameters and reduce their gradients together:
        Megatron-LM's data-parallel group with context parallelism (DP x CP; each CP rank's
        weight gradients come from its own share of the sequence). The distributed optimizer
        shards over it."""
        return self.dp * self.cp

    def group_placement(self, size: int, stride: int, stage: int | None = None
                        ) -> tuple[int, int]:
        """``(nodes, ranks_per_node)`` of the slowest group of ``size`` ranks ``stride`` apart
        under Megatron-LM's placement (TP innermost, then CP, DP, PP; ``gpus_per_node``
        consecutive ranks per node).

        Groups of one kind start at every rank ``r`` with ``r mod (size · stride) < stride``
        (and end inside the job); with ``stage``, only those of that pipeline stage (the graph
        gives each stage its own TP, CP and gradient groups). The groups of a stage run at once
        and the stage waits for the slowest, so this is the group spread over the most nodes
        and, of those, the one with the fewest ranks on its emptiest node (whose share of the
        network binds): ``ranks_per_node`` is that node's count. When the node size is a
        multiple of the group's extent, or the other way round, every group has the same shape;
        otherwise some groups straddle a node boundary that the first one does not (TP4 on
        nodes of 6: ranks 4-7 sit two and two on two nodes)."""
        if size <= 1:
            return 1, 1
        g, n, block = self.gpus_per_node, self.num_gpus, size * stride
        first, last = (0, n) if stage is None else (stage * self.gpus_per_stage,
                                                     (stage + 1) * self.gpus_per_stage)
        # a group's shape depends only on where in its node it starts (r mod g): collect those
        # offsets from the blocks' starts (periodic mod g in the block index) and their ranks
        # (periodic mod g in r), with the first and last blocks for the job's edges
        offsets: set[int] = set()
        blocks = range(first // block, (last - 1) // block + 1)
        for o in {*blocks[:g + 1], *blocks[-(g + 1):]}:
            base = o * block
            lo = max(0, first - base)
            hi = min(stride, last - base, n - (size - 1) * stride - base)
            offsets.update((base + i) % g for i in range(lo, min(hi, lo + g)))
        if not offsets:
            raise ValueError(f"no group of {size} ranks {stride} apart in a job of {n} GPUs")
        worst = max(_spread(r, size, stride, g) for r in offsets)
        return worst[0], -worst[1]


def _spread(offset: int, size: int, stride: int, node: int) -> tuple[int, int]:
    """``(nodes, −ranks on the emptiest)`` of ``size`` ranks ``stride`` apart from rank
    ``offset`` of a node of ``node`` ranks (ordered so that the larger is the slower group)."""
    if stride >= node:
        return size, -1
    nodes = (offset + (size - 1) * stride) // node + 1

    def before(x: int) -> int:  # ranks of the group below rank x
        return 0 if x <= offset else min(size, -(-(x - offset) // stride))

    return nodes, -min(before((j + 1) * node) - before(j * node) for j in range(nodes))


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

    @property
    def padded_vocab(self) -> int:
        """The vocabulary the embedding and the output layer hold (tokens): the model's, padded
        to a multiple of ``make_vocab_size_divisible_by`` x TP as Megatron-LM pads it
        (``_vocab_size_with_padding``; GPT-2's 50,257 at TP8: 51,200)."""
        multiple = self.parallel.make_vocab_size_divisible_by * self.parallel.tp
        return -(-self.model.vocab // multiple) * multiple

    def embedding_params(self) -> float:
        """Parameters of the input embedding over the whole TP group: the model's
        (:meth:`~workloads.models.ModelSpec.embedding_params`) with the padded rows."""
        return self.model.embedding_params() + (self.padded_vocab - self.model.vocab) \
            * self.model.hidden

    def to_dict(self) -> JsonObject:
        """The workload as plain JSON data: ``name``, and every field of ``model`` and
        ``parallel`` (what a GPU job file and an iteration graph carry)."""
        par: JsonObject = asdict(self.parallel)
        if self.parallel.layer_split is not None:
            par["layer_split"] = list(self.parallel.layer_split)
        return {"name": self.name, "model": asdict(self.model), "parallel": par}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "Workload":
        """The workload :meth:`to_dict` gave; :class:`WorkloadError` (one line) for a field
        missing, unknown or of the wrong type, or a job that does not validate."""
        for part in ("model", "parallel"):
            if not isinstance(d.get(part), Mapping):
                raise WorkloadError(f"a workload's {part} must be a JSON object, got "
                                    f"{type(d.get(part)).__name__}")
        par = dict(d["parallel"])  # type: ignore[call-overload]
        split = par.get("layer_split")
        if split is not None:
            if not isinstance(split, (list, tuple)):
                raise WorkloadError(f"layer_split must be a list, got {split!r}")
            par["layer_split"] = tuple(split)
        name = d.get("name", "")
        if not isinstance(name, str):
            raise WorkloadError(f"a workload's name must be a string, got {name!r}")
        return Workload(model=construct(ModelSpec, d["model"]),  # type: ignore[arg-type]
                        parallel=construct(ParallelConfig, par), name=name)

    def stage_params(self, stage: int) -> float:
        """Parameters one GPU of ``stage`` holds: its 1/TP share of its layers, the embedding on
        the first stage and the output layer on the last (one matrix with the embedding when
        they are tied and one stage holds both)."""
        m, p = self.model, self.parallel
        params = self.stage_layers()[stage] * m.layer_params() / p.tp
        if stage == 0:
            params += self.embedding_params() / p.tp
        if stage == p.pp - 1 and (not m.tied_embeddings or p.pp > 1):
            params += self.padded_vocab * m.hidden / p.tp
        return params

    def tp_replicated_grad_params(self, stage: int) -> int:
        """Parameters of ``stage`` whose gradients are all-reduced over its TP group after the
        backward (:meth:`ModelSpec.tp_replicated_layer_params` of each of its layers; under
        sequence parallelism also the final norm on the last stage and an embedding norm, as
        Bloom's, on the first, both run on each rank's share of the tokens); 0 without TP."""
        m, p = self.model, self.parallel
        if p.tp == 1:
            return 0
        params = self.stage_layers()[stage] * m.tp_replicated_layer_params(p.sequence_sharded)
        if p.sequence_sharded and stage == p.pp - 1:
            params += m.norm_params()
        if p.sequence_sharded and stage == 0:
            params += m.embedding_norm_params()
        return params

    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers per pipeline stage.

        Without ``layer_split``, the suite's uneven split: the last stage also runs the output
        layer and the loss, so layers move to earlier stages until the most expensive stage is
        as cheap as possible, and among splits as cheap, the one whose stages cost the most
        alike (a stage lighter than the rest only idles in the pipeline's fill and drain: GPT-3
        XL on 4 stages gets 7, 6, 6, 5, not 7, 7, 7, 3). (Megatron-LM's own default is an even
        split, ``layers / pp`` each; ``--stage-layers`` asks for it.) The cost of a stage is its
        FLOPs per token over one iteration (forward, backward = 2x forward, plus one more forward
        with recomputation for transformer layers; the output layer is not recomputed). For
        Llama 3.2 3B on 2 stages this gives 15 + 13, the Kareus artifact's split.
        """
        if self.parallel.layer_split is not None:
            return self.parallel.layer_split
        m, p = self.model, self.parallel
        per_layer = _layer_flops_per_token(m, p.seq) * (4 if p.recompute == "full" else 3)
        output = 2 * m.hidden * self.padded_vocab * 3
        stages = p.pp
        best: tuple[float, float, tuple[int, ...]] | None = None
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
            costs = [split[i] * per_layer + (output if i == stages - 1 else 0)
                     for i in range(stages)]
            cost, spread = max(costs), max(costs) - min(costs)
            tie = 1e-9 * cost
            if best is None or cost < best[0] - tie or (cost <= best[0] + tie
                                                        and spread < best[1] - tie):
                best = (cost, spread, split)
        assert best is not None
        return best[2]

    def memory_estimate_bytes(self) -> dict[int, float]:
        """Rough peak memory per GPU for each stage (bytes): weights, gradients, Adam states
        (sharded over DP x CP with the distributed optimizer), stored activations of the
        microbatches in flight (1F1B keeps ``pp - stage`` of them: each layer's input under full
        recomputation, everything but the core attention under selective, everything under none),
        one layer's working set during recomputation/backward (with unfused attention, its scores),
        the cross-entropy's fp32 softmax of the logits and their gradient on the last stage, and a
        runtime allowance; or, where larger, the optimizer step's (the states with the step's own
        copies, :data:`_STEP_ONLY_BYTES`, and the allowance, the activations freed)."""
        m, p = self.model, self.parallel
        layers = self.stage_layers()
        tokens = p.tokens_per_gpu
        out: dict[int, float] = {}
        for s, n in enumerate(layers):
            params = self.stage_params(s)
            shards = p.grad_sync_ranks if p.distributed_optimizer else 1
            optimizer = _OPTIMIZER_BYTES[p.precision] / shards
            states = params * (p.element_bytes + GRAD_BYTES[p.precision] + optimizer)
            step = states + params * _STEP_ONLY_BYTES[p.precision] / shards
            in_flight = min(p.pp - s, p.microbatches)
            eb = p.element_bytes
            per_layer_input = p.sequence_shard(tokens) * m.hidden * eb
            # Korthikanti et al. (2022): a layer stores ~34·s·b·h + 5·a·s²·b bytes at 16 bits
            # without recomputation, the 5·a·s²·b of it the core attention's; TP shards 24 of
            # the 34, sequence parallelism the other 10
            per_token = 34 / p.tp if p.sequence_sharded else 10 + 24 / p.tp
            layer_acts = tokens * m.hidden * per_token * eb / 2
            # flash attention keeps O(s) per head (its output and log-sum-exp), not the scores;
            # the unfused one, per score, its softmax (2 bytes at 16 bits), dropout mask (1) and
            # dropout output (2), and holds the QK^T product (2) while it computes them
            score = (m.heads / p.tp * tokens * (p.seq / p.cp) * eb / 2
                     if p.core_attention == "unfused" else 0.0)
            attn_acts = 5 * score
            per_layer = {"full": per_layer_input, "selective": layer_acts,
                         "none": layer_acts + attn_acts}[p.recompute]
            stored = n * per_layer * in_flight
            # the layer being recomputed and differentiated (its scores too, unless stored)
            working = ((tokens * m.hidden * per_token + tokens * m.ffn * 4 / p.tp) * eb / 2
                       + 2 * score + (attn_acts if p.recompute != "none" else 0.0))
            # Megatron-LM's vocab-parallel cross-entropy keeps an fp32 softmax of the logits (the
            # training precision's copy freed) and, in the backward, makes their gradient
            logits = tokens * self.padded_vocab / p.tp * (4 + eb) if s == p.pp - 1 else 0.0
            out[s] = max(states + stored + working + logits, step) + _RUNTIME_OVERHEAD_BYTES
        return out

    def check_fits(self, gpu_memory_bytes: float) -> list[str]:
        """Messages for the stages whose estimated memory exceeds the GPU's (empty: fits)."""
        return [
            f"stage {s} needs about {b / 2**30:.1f} GiB per GPU, more than the "
            f"{gpu_memory_bytes / 2**30:.1f} GiB available"
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

    def pipeline_fill_warnings(self) -> list[str]:
        """:func:`pipeline_fill_warnings` of this job's microbatches and stages."""
        return pipeline_fill_warnings(self.parallel.microbatches, self.parallel.pp)

    def job_warnings(self, gpu_memory_bytes: float, strict: bool = False) -> list[str]:
        """Every warning a command prints before it runs the job, in the order of
        :meth:`job_warnings_by_kind`."""
        return [m for kind in self.job_warnings_by_kind(gpu_memory_bytes, strict).values()
                for m in kind]

    def job_warnings_by_kind(self, gpu_memory_bytes: float, strict: bool = False
                             ) -> dict[str, list[str]]:
        """The job's warnings by the ``--json`` field that lists them (docs/metrics.md):
        ``memory_warnings`` (:meth:`memory_warnings`, raising with ``strict``),
        ``pipeline_warnings`` (:meth:`pipeline_fill_warnings`), ``position_warnings``
        (:meth:`position_warnings`), ``sequence_parallel_warnings``
        (:meth:`sequence_parallel_warnings`) and ``placement_warnings``
        (:meth:`placement_warnings`)."""
        return {"memory_warnings": self.memory_warnings(gpu_memory_bytes, strict),
                "pipeline_warnings": self.pipeline_fill_warnings(),
                "position_warnings": self.position_warnings(),
                "sequence_parallel_warnings": self.sequence_parallel_warnings(),
                "placement_warnings": self.placement_warnings()}

    def placement_warnings(self) -> list[str]:
        """A message when a tensor-parallel group spans nodes (empty otherwise): a TP group
        larger than a node, or one that straddles a node boundary (TP 4 on nodes of 6). Its
        collectives, every layer's, then run over the network, and the stage waits for the
        slowest group."""
        p = self.parallel
        nodes, _ = p.group_placement(p.tp, 1)
        if p.tp == 1 or nodes == 1:
            return []
        return [f"a TP group of {p.tp} spans {nodes} nodes of --gpus-per-node {p.gpus_per_node}: "
                "every layer's TP collectives run over the network"]

    def sequence_parallel_warnings(self) -> list[str]:
        """A message when ``--sequence-parallel`` is given without TP, where it does nothing
        (Megatron-LM turns it off with a warning); empty otherwise."""
        p = self.parallel
        if p.sequence_parallel and p.tp == 1:
            return ["--sequence-parallel does nothing with TP 1 (Megatron-LM turns it off): "
                    "the sequence is split over the tensor-parallel group"]
        return []

    def position_warnings(self) -> list[str]:
        """A message when the sequence is longer than the positions a model with learned
        absolute positions (GPT-2, GPT-3) has a table for (empty otherwise, and for RoPE or
        ALiBi, which set no such limit)."""
        m, seq = self.model, self.parallel.seq
        if m.rope or m.alibi or seq <= m.positions:
            return []
        return [f"--seq {seq} is longer than the {m.positions} positions {self.name} learned: "
                "the model itself cannot run it (the simulator does, as if its table were "
                "longer)"]



def pipeline_fill_warnings(microbatches: int, stages: int) -> list[str]:
    """A message when a 1F1B pipeline has fewer microbatches than stages (empty: it has enough).
    Megatron-LM runs such a job (stage ``s`` warms up with ``min(S - s - 1, M)`` forwards,
    :func:`kareus.graph.one_f_one_b`), but its pipeline never fills: the 1F1B bubble, ``S - 1``
    of the ``M + S - 1`` microbatch slots of every stage, is at least half of the iteration."""
    if not 0 < microbatches < stages:
        return []
    return [f"{microbatches} microbatch{'es' if microbatches > 1 else ''} over {stages} pipeline "
            f"stages: the pipeline never fills, and each stage idles for {stages - 1} of its "
            f"{microbatches + stages - 1} microbatch slots (--microbatches >= {stages} fills it)"]


#: The fields of a job's shape that commands and result files report (``--json``'s and
#: ``summary.json``'s ``parallel``): the parallel degrees and everything the job-shape options set.
JOB_FIELDS: tuple[str, ...] = (
    "tp", "cp", "pp", "dp", "mbs", "microbatches", "seq", "recompute", "precision",
    "gpus_per_node", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
    "attention", "elementwise", "cross_entropy", "make_vocab_size_divisible_by",
    "sequence_parallel", "overlap_tp_grad", "scatter_gather_p2p")

def shape_label(fields: Mapping[str, object]) -> str:
    """A job's shape in a few words, from its :meth:`ParallelConfig.job_fields` (or the
    ``parallel`` object of a result file): ``TP8 PP2, MBS 8 x 8, seq 4096`` (the parallel
    degrees above 1, TP always; micro-batch size x microbatches; the sequence length)."""
    grid = " ".join(f"{k.upper()}{fields[k]}" for k in ("tp", "cp", "pp", "dp")
                    if fields[k] != 1 or k == "tp")
    return f"{grid}, MBS {fields['mbs']} x {fields['microbatches']}, seq {fields['seq']}"


def _layer_flops_per_token(m: ModelSpec, seq: int) -> float:
    """Forward FLOPs of one layer per token: the matmuls plus causal attention (half of s^2)."""
    mats = m.hidden * (m.q_width + 2 * m.kv_width) + m.q_width * m.hidden
    mats += (3 if m.mlp == "swiglu" else 2) * m.hidden * m.ffn
    attention = 2 * m.q_width * seq  # QK^T and PV, 2 FLOPs per MAC, halved by causality
    return 2 * mats + attention


#: Most (microbatch, stage) pairs an iteration may have: every one holds a forward and a
#: backward instruction in the iteration graph, the plans and the schedule.
MAX_PIPELINE_SLOTS = 1 << 20
#: Most GPUs a job may have (about a million, beyond any cluster built): the simulator's cost
#: barely grows with them (0.14 s to build a million-GPU graph), but a count past this is a
#: typo.
MAX_GPUS = 1 << 20
#: The largest integer a job's shape may give (a 32-bit index's reach): beyond it the costs'
#: floating-point arithmetic overflows, and no job is that large.
MAX_JOB_INTEGER = 2**31 - 1
#: Memory one (microbatch, stage) pair takes through the graph and a simulated plan (bytes),
#: measured on ``kareus simulate`` (peak resident size over microbatch counts).
GRAPH_BYTES_PER_SLOT = 1500


def validate(model: ModelSpec, p: ParallelConfig) -> None:
    """Raise :class:`WorkloadError` with one line naming the first impossible setting: a size
    that is not a positive integer or is out of reach, a model the layout cannot split, a shape
    the parallelism cannot take, an unknown or contradictory mode, or a stage split that does not
    fit."""
    _check_sizes(p)
    _check_model_splits(model, p)
    _check_shape(p)
    _check_modes(p)
    _check_stage_layers(model, p)


def _check_sizes(p: ParallelConfig) -> None:
    """Every count is a positive integer, the job at most :data:`MAX_GPUS` GPUs, and no count
    beyond :data:`MAX_JOB_INTEGER`."""
    for name in ("tp", "cp", "pp", "dp", "mbs", "microbatches", "seq", "nanobatches",
                 "gpus_per_node", "make_vocab_size_divisible_by"):
        value = getattr(p, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            flag = "--" + name.replace("_", "-")
            raise WorkloadError(f"{flag} must be a positive integer, got {value!r}")
    if p.num_gpus > MAX_GPUS:
        raise WorkloadError(
            f"{p.num_gpus:,} GPUs (TP{p.tp} x CP{p.cp} x DP{p.dp} x PP{p.pp}); at most "
            f"{MAX_GPUS:,}")
    for name in ("mbs", "microbatches", "seq", "nanobatches", "gpus_per_node",
                 "make_vocab_size_divisible_by"):
        value = getattr(p, name)
        if value > MAX_JOB_INTEGER:
            raise WorkloadError(f"--{name.replace('_', '-')} ({len(str(value))} digits) is "
                                f"larger than any job's (at most {MAX_JOB_INTEGER:,})")


def _check_model_splits(model: ModelSpec, p: ParallelConfig) -> None:
    """TP divides the model's heads, key/value heads and FFN width; PP has a layer per stage."""
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
            f"{model.name} has {model.layers} layers, fewer than PP={p.pp} pipeline stages; "
            f"pass --pp {model.layers} or fewer")


def _check_shape(p: ParallelConfig) -> None:
    """The pipeline's (micro-batch, stage) pairs fit in memory, CP and sequence parallelism split
    the sequence evenly, and a multi-node job fills whole nodes."""
    if p.microbatches * p.pp > MAX_PIPELINE_SLOTS:
        raise WorkloadError(
            f"--microbatches {p.microbatches} x {p.pp} stages is {p.microbatches * p.pp:,} "
            f"(microbatch, stage) pairs; the iteration graph would need about "
            f"{p.microbatches * p.pp * GRAPH_BYTES_PER_SLOT / 2**30:,.1f} GiB of memory; at most "
            f"{MAX_PIPELINE_SLOTS:,} (--microbatches <= {MAX_PIPELINE_SLOTS // p.pp:,} here)"
        )
    if p.cp > 1 and p.seq % (2 * p.cp):
        raise WorkloadError(
            f"sequence length {p.seq} must be divisible by 2*CP={2 * p.cp} "
            "(load-balanced causal context parallelism)"
        )
    if p.sequence_sharded and (p.seq // p.cp) % p.tp:
        raise WorkloadError(
            f"--sequence-parallel splits each sequence over TP={p.tp}: its {p.seq // p.cp} "
            f"tokens per GPU (--seq {p.seq} / CP {p.cp}) are not divisible by {p.tp}")
    if p.num_gpus > p.gpus_per_node and p.num_gpus % p.gpus_per_node:
        raise WorkloadError(
            f"{p.num_gpus} GPUs (TP{p.tp} x CP{p.cp} x DP{p.dp} x PP{p.pp}) do not fill whole "
            f"nodes of --gpus-per-node {p.gpus_per_node}; use a job of a multiple of "
            f"{p.gpus_per_node} GPUs or another node size")


def _check_modes(p: ParallelConfig) -> None:
    """Each mode is a known one, and none contradicts another as Megatron-LM would refuse it."""
    for what, value, choices in (("precision", p.precision, PRECISIONS),
                                 ("attention", p.attention, ATTENTION_KINDS),
                                 ("elementwise mode", p.elementwise, ELEMENTWISE_KINDS),
                                 ("cross entropy", p.cross_entropy, CROSS_ENTROPY_KINDS),
                                 ("recompute mode", p.recompute, RECOMPUTE_MODES)):
        if value not in choices:
            raise WorkloadError(f"unknown {what} {value!r}; choose one of: {', '.join(choices)}")
    if p.cp > 1 and p.core_attention == "unfused":
        why = ("--attention unfused" if p.attention == "unfused" else
               f"--precision {p.precision}, whose attention falls back to the unfused path")
        raise WorkloadError(
            f"context parallelism runs inside Transformer Engine's fused attention, not with "
            f"{why}; use --cp 1, or --attention flash with --precision bf16 or fp16")
    if p.overlap_param_gather and not (p.distributed_optimizer and p.overlap_grad_reduce):
        raise WorkloadError(
            "--overlap-param-gather needs --distributed-optimizer and --overlap-grad-reduce, as "
            "Megatron-LM requires (without the first no all-gather follows the step; without "
            "the second its buckets are not built)")


def _check_stage_layers(model: ModelSpec, p: ParallelConfig) -> None:
    """``--stage-layers``, when given: one positive entry per stage, summing to the layers."""
    if p.layer_split is None:
        return
    split = p.layer_split
    if len(split) != p.pp:
        raise WorkloadError(f"--stage-layers gives {len(split)} stage(s) "
                            f"({','.join(map(str, split))}) but PP={p.pp}")
    if min(split) < 1:
        raise WorkloadError(f"--stage-layers entries must be positive, got "
                            f"{','.join(map(str, split))}")
    if sum(split) != model.layers:
        raise WorkloadError(f"--stage-layers {','.join(map(str, split))} sums to "
                            f"{sum(split)}, but {model.name} has {model.layers} layers")


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
    recompute: Recompute | None = None,
    layer_split: tuple[int, ...] | None = None,
    precision: Precision | None = None,
    gpus_per_node: int | None = None,
    distributed_optimizer: bool | None = None,
    overlap_grad_reduce: bool | None = None,
    overlap_param_gather: bool | None = None,
    attention: Attention | None = None,
    elementwise: Elementwise | None = None,
    cross_entropy: CrossEntropy | None = None,
    make_vocab_size_divisible_by: int | None = None,
    sequence_parallel: bool | None = None,
    overlap_tp_grad: bool | None = None,
    scatter_gather_p2p: bool | None = None,
) -> Workload:
    """Build a validated workload: the paper's testbed shape with the given overrides. ``name``
    is a built-in model or a Hugging Face config path (:func:`workloads.catalog.get_model`).
    Flash attention asked for by name with 32-bit tensors is refused: it would silently run the
    unfused path (:attr:`ParallelConfig.core_attention`), which the default already does."""
    if attention == "flash" and precision in ("tf32", "fp32"):
        raise WorkloadError(f"--attention flash needs 16-bit tensors (--precision bf16 or fp16); "
                            f"with --precision {precision} attention runs the unfused path "
                            "(leave --attention out, or give --attention unfused)")
    model = get_model(name)
    parallel = ParallelConfig(seq=model.native_seq)
    parallel = replace(parallel, tp=default_tp(model, parallel.tp))
    overrides = {
        k: v
        for k, v in dict(tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, seq=seq,
                         microbatches=microbatches, recompute=recompute,
                         layer_split=layer_split, precision=precision,
                         gpus_per_node=gpus_per_node, distributed_optimizer=distributed_optimizer,
                         overlap_grad_reduce=overlap_grad_reduce,
                         overlap_param_gather=overlap_param_gather, attention=attention,
                         elementwise=elementwise, cross_entropy=cross_entropy,
                         make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                         sequence_parallel=sequence_parallel, overlap_tp_grad=overlap_tp_grad,
                         scatter_gather_p2p=scatter_gather_p2p).items()
        if v is not None
    }
    return Workload(model=model, parallel=replace(parallel, **overrides))
