"""The iteration graph: ops, partitions, pipeline instructions and the 1F1B DAG.

Vocabulary (the Kareus paper's):

- A **compute op** is one GPU kernel (a GEMM, flash attention, a norm, an elementwise op) with its
  FLOPs and the HBM bytes it moves, per GPU.
- A **comm op** is one collective (TP all-reduce, CP all-gather / reduce-scatter, PP send/recv)
  with its message size per GPU and its group size.
- Cutting a layer's op list at each communication op gives **segments**. With 2 nanobatches, each
  segment of one nanobatch runs together with the communication of the other nanobatch, which it
  does not depend on: that pair is a **partition**, the unit whose communication SM count and
  launch slot Kareus chooses.
- A **pipeline instruction** is the forward or backward of one microbatch on one stage; its SM
  clock is locked to one value. Instructions form the 1F1B DAG.

Everything here is plain data; the simulator and the GPU backend give it time and energy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

Direction = Literal["forward", "backward"]
KernelKind = Literal["gemm", "attention", "memory"]
#: The kinds of compute kernel (:attr:`ComputeOp.kind`), in the order reports list them.
KERNEL_KINDS: tuple[KernelKind, ...] = ("gemm", "attention", "memory")
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv"]


@dataclass(frozen=True)
class ComputeOp:
    """One compute kernel on one GPU.

    Attributes:
        name: Op name, e.g. ``"linear_qkv"`` or ``"attention_bwd"``.
        kind: ``"gemm"``, ``"attention"`` (tensor-core bound, tiled) or ``"memory"`` (elementwise,
            norms, RoPE: bound by HBM bandwidth).
        flops: Floating-point operations (FLOP).
        bytes: HBM bytes read plus written (B).
        tiles: Thread blocks the kernel launches; with one block per SM at a time they run in
            ``ceil(tiles / SMs)`` waves (wave quantization). 0 for memory-bound kernels.
        uneven_tail: ``None`` for uniform tiles (the whole waves above). For tiles of uneven work
            dispatched in grid order (causal flash attention), the kernel takes ``tiles / SMs +
            uneven_tail`` average tiles: the SMs stay busy until the grid is dispatched, and the
            last, heavy tiles end that far past the even share.
        slot: Launch-slot label within its partition, e.g. ``"linear_0"``.
        depth: Reduction depth of a GEMM (``K`` of ``[M,K] x [K,N]``): each output tile pays a
            fixed prologue and epilogue, so shallow GEMMs run below peak. 0: unknown.
        backward: The backward kernel of its op (attention backward has its own efficiency).
        host_calls: Framework calls the op makes on the host besides issuing its own kernel, each
            costing ``host_issue_call_s``. Inside a partition the GPU waits for them; in
            sequential execution the host runs ahead and they cost nothing. Transformer Engine's
            all-gather context-parallel attention makes dozens (K/V reordering, one attention
            kernel per sequence chunk on two streams, output copies).
        precision: The math the op's FLOPs run in: ``"bf16"`` / ``"fp16"`` (16-bit tensor
            cores), ``"tf32"`` (TF32 tensor cores on fp32 tensors) or ``"fp32"`` (no tensor
            cores).
        resident_grid: The kernel launches exactly as many thread blocks as the GPU holds at
            once and loops over its work inside them (Transformer Engine's LayerNorm and RMSNorm:
            ``SMs x blocks per SM``; PyTorch's fused dropout: at most ``SMs x 2048 / 256``).
            Beside a collective that already holds ``k`` SMs, the blocks that find no SM run in
            a second round; a collective launched while it runs finds every SM taken and starts
            when it ends.
    """

    name: str
    kind: KernelKind
    flops: float
    bytes: float
    tiles: int = 0
    slot: str = ""
    depth: int = 0
    backward: bool = False
    uneven_tail: float | None = None
    host_calls: int = 0
    precision: str = "bf16"
    resident_grid: bool = False


@dataclass(frozen=True)
class CommOp:
    """One collective on one GPU.

    Attributes:
        name: e.g. ``"tp_allreduce_attn"``.
        collective: Which collective.
        bytes: Message size per GPU (B): the full tensor for an all-reduce, the gathered output for
            an all-gather, the unreduced input for a reduce-scatter, the payload for send/recv.
        group: Ranks in the collective.
        intra_node: ``True`` inside one node (NVLink or PCIe), ``False`` over the inter-node
            network.
        nodes: Nodes the group spans (1 inside a node).
        ranks_per_node: The group's ranks on each node it spans; with one NIC per GPU, the NICs
            a ring crossing nodes can use at once.
    """

    name: str
    collective: Collective
    bytes: float
    group: int
    intra_node: bool = True
    nodes: int = 1
    ranks_per_node: int = 0

    def __post_init__(self) -> None:
        if self.ranks_per_node == 0:  # not given: all ranks on one node, or one per node
            per_node = self.group if self.intra_node else max(1, self.group // max(self.nodes, 2))
            object.__setattr__(self, "ranks_per_node", per_node)
            if not self.intra_node and self.nodes == 1:
                object.__setattr__(self, "nodes", max(2, self.group // per_node))

    @property
    def bus_bytes(self) -> float:
        """Bytes each rank moves over its links (NCCL's "bus bandwidth" convention)."""
        n = self.group
        if n <= 1:
            return 0.0
        if self.collective == "all_reduce":
            return 2.0 * (n - 1) / n * self.bytes
        if self.collective in ("all_gather", "reduce_scatter"):
            return (n - 1) / n * self.bytes
        return self.bytes


def ring_steps(collective: Collective, n: int) -> int:
    """Steps of NCCL's ring for ``collective`` over ``n`` members (ranks, or nodes across a
    network): ``2(n - 1)`` for an all-reduce (its reduce-scatter and all-gather halves), ``n - 1``
    for an all-gather or a reduce-scatter, one for a send; none for one member."""
    if n <= 1:
        return 0
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective == "send_recv":
        return 1
    return n - 1


@dataclass(frozen=True)
class Partition:
    """Compute of one nanobatch plus the communication of the other that may overlap it.

    Attributes:
        key: Unique within its instruction, e.g. ``"fwd_attn/0"`` (paper name / compute nanobatch).
        compute: Compute ops in program order; the launch slots are their indices.
        comm: The overlappable collective, or ``None`` (first partition of an instruction).
    """

    key: str
    compute: tuple[ComputeOp, ...]
    comm: CommOp | None

    @property
    def slots(self) -> tuple[str, ...]:
        """Launch-slot labels (index ``i`` launches the comm with compute op ``i``)."""
        return tuple(op.slot for op in self.compute)


@dataclass(frozen=True)
class Segment:
    """Compute ops between two collectives, for a full microbatch (sequential execution).

    Attributes:
        compute: The compute ops, in order.
        comm: The collective that ends the segment, or ``None``.
        comm_beside_last: The collective is launched just before the last compute op and runs
            beside it on a side stream; the next segment starts once both are done. Megatron-LM
            and Transformer Engine launch a column-parallel linear's input-gradient all-reduce
            (with sequence parallelism its reduce-scatter) asynchronously before the
            weight-gradient GEMM, and sequence parallelism's all-gather of that linear's input
            before the input-gradient GEMM (:attr:`workloads.parallel.ParallelConfig.
            overlap_tp_grad`). Otherwise the collective runs after the compute, alone.
    """

    compute: tuple[ComputeOp, ...]
    comm: CommOp | None
    comm_beside_last: bool = False


@dataclass(frozen=True)
class InstructionGraph:
    """What one pipeline instruction (stage, direction) executes for one microbatch.

    The transformer layers of a stage are identical, so one layer's work is stored once and
    repeated ``layers`` times.

    Attributes:
        stage: Pipeline stage.
        direction: ``"forward"`` or ``"backward"`` (with recomputation the backward re-runs the
            layer's forward first).
        layers: Transformer layers of this stage.
        sequential: One layer without nanobatching: segments of the full microbatch, each followed
            by its collective.
        partitions: One layer with nanobatching: the partition chain. The first partition's comm is
            the previous layer's last collective; for the first layer of the instruction it has
            nothing to overlap, and the last layer's final collective runs exposed.
        extra: Non-partitioned work of this instruction (embedding, output layer, loss), as
            segments of the full microbatch, run sequentially.
    """

    stage: int
    direction: Direction
    layers: int
    sequential: tuple[Segment, ...]
    partitions: tuple[Partition, ...]
    extra: tuple[Segment, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.direction}@{self.stage}"


@dataclass(frozen=True)
class Instruction:
    """One node of the 1F1B DAG: the forward or backward of microbatch ``microbatch`` on a stage."""

    stage: int
    microbatch: int
    direction: Direction

    @property
    def type_key(self) -> tuple[int, Direction]:
        """(stage, direction): instructions with the same key do the same work."""
        return (self.stage, self.direction)


@dataclass(frozen=True)
class GradBucket:
    """One of a stage's data-parallel buckets, in the order Megatron-core fills them: the
    stage's parameters in reverse (the backward's order: the output layer first, the input
    embedding last), a bucket closed once it holds ``bucket_size`` parameters.

    Attributes:
        share: Its fraction of the stage's parameters, so of the bytes of each data-parallel
            collective (the gradients' reduction, the parameters' all-gather).
        layers: The transformer layers whose parameters it holds (layer-equivalents by
            parameters: a layer's weights can straddle two buckets).
    """

    share: float
    layers: float


@dataclass(frozen=True)
class IterationGraph:
    """One training iteration: per-(stage, direction) work and the 1F1B instruction order.

    Attributes:
        workload: Name of the workload.
        stages: Pipeline stages.
        microbatches: Microbatches per iteration.
        gpus_per_stage: GPUs running each stage (TP x CP x DP); they do identical work.
        instruction_graphs: Work of each (stage, direction).
        p2p: Activation (or gradient) transfer between adjacent stages, one microbatch, over
            the slowest link a stage boundary uses.
        p2p_gather: With Megatron-LM's scatter/gather of transfers
            (:attr:`workloads.parallel.ParallelConfig.scatter_gather_p2p`), the all-gather over
            the receiving stage's TP group that rebuilds a transfer ``p2p`` carries 1/TP of; part
            of every transfer's time. ``None`` otherwise.
        p2p_across_nodes: For each stage boundary (``b``: between stages ``b`` and ``b + 1``),
            whether its transfer crosses nodes; empty: every boundary as ``p2p`` says. With
            stages smaller than a node some neighbours share one.
        stage_tail: Per-stage work after the last backward (DP gradient sync, optimizer step),
            in order; with ``overlap_grad_reduce`` its first segment is the data-parallel
            gradient reduction that overlaps the last backward.
        model_flops: Model FLOPs of one iteration over the whole job, without recomputation
            (for model FLOPs utilization).
        overlap_grad_reduce: The stage tail's data-parallel gradient reduction runs in
            ``grad_buckets`` buckets during the last microbatch's backward (Megatron-LM's
            ``--overlap-grad-reduce``); otherwise it runs whole after it.
        grad_buckets: Per stage, its gradient buckets in the backward's order (one holding
            everything without ``overlap_grad_reduce``); with ``param_gather`` also its
            parameter all-gather's, which the forward reaches in the reverse order. A stage
            missing here has one bucket.
        param_gather: Per stage, the distributed optimizer's parameter all-gather when it runs
            under the stage's first forward (Megatron-LM's ``--overlap-param-gather``) instead
            of in the stage tail: launched bucket by bucket as that forward reaches each bucket
            (:meth:`~kareus.backends.sim.SimulatorBackend.overlapped_param_gather` decides how
            much stays exposed); empty otherwise.
        nanobatch_refusal: Why the iteration cannot be nanobatched (e.g. a micro-batch size the
            nanobatches do not divide); empty when it can.
        job: The job the graph was built from, as plain JSON data (the workload's ``name`` and
            the fields of its ``model`` and ``parallel`` layout,
            :meth:`workloads.parallel.Workload.to_dict`), so a backend that runs the model (the
            GPU backend) can run a graph it is handed; empty for a graph built otherwise. Not
            compared: graphs of the same work are equal.
    """

    workload: str
    stages: int
    microbatches: int
    gpus_per_stage: int
    instruction_graphs: dict[tuple[int, Direction], InstructionGraph]
    p2p: CommOp | None
    stage_tail: dict[int, tuple[Segment, ...]] = field(default_factory=dict)
    model_flops: float = 0.0
    overlap_grad_reduce: bool = False
    grad_buckets: dict[int, tuple[GradBucket, ...]] = field(default_factory=dict)
    param_gather: dict[int, CommOp] = field(default_factory=dict)
    nanobatch_refusal: str = ""
    p2p_across_nodes: tuple[bool, ...] = ()
    p2p_gather: CommOp | None = None
    job: Mapping[str, object] = field(default_factory=dict, compare=False)

    @property
    def num_gpus(self) -> int:
        return self.stages * self.gpus_per_stage

    def schedule(self) -> dict[int, list[Instruction]]:
        """The synchronous 1F1B order of each stage (:func:`one_f_one_b`)."""
        return one_f_one_b(self.stages, self.microbatches)

    def dependencies(self) -> dict[Instruction, list[Instruction]]:
        """Predecessors of every instruction (:func:`dag_dependencies`)."""
        return dag_dependencies(self.stages, self.microbatches)


def one_f_one_b(stages: int, microbatches: int) -> dict[int, list[Instruction]]:
    """Per-stage program order of the synchronous 1F1B schedule.

    Stage ``s`` runs ``min(S - s - 1, M)`` warm-up forwards, then alternates one forward and one
    backward while forwards remain, then drains the remaining backwards. A fresh dict of fresh
    lists; the (immutable) instructions are the same objects on every call with the same
    arguments, so dictionaries keyed by them find each one by identity.
    """
    return {s: list(seq) for s, seq in enumerate(_one_f_one_b(stages, microbatches))}


@lru_cache(maxsize=16)
def _one_f_one_b(stages: int, microbatches: int) -> tuple[tuple[Instruction, ...], ...]:
    """:func:`one_f_one_b`'s order as tuples, built once per (stages, microbatches): a plan's
    checks, its evaluation and the solvers ask for it thousands of times per job."""
    order: list[tuple[Instruction, ...]] = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        seq: list[Instruction] = [Instruction(s, m, "forward") for m in range(warmup)]
        f, b = warmup, 0
        while f < microbatches:
            seq.append(Instruction(s, f, "forward"))
            f += 1
            seq.append(Instruction(s, b, "backward"))
            b += 1
        while b < microbatches:
            seq.append(Instruction(s, b, "backward"))
            b += 1
        order.append(tuple(seq))
    return tuple(order)


def dag_dependencies(stages: int, microbatches: int) -> dict[Instruction, list[Instruction]]:
    """Predecessors of each instruction: program order within a stage, F(s-1,m) -> F(s,m),
    B(s+1,m) -> B(s,m), and on the last stage F(S-1,m) -> B(S-1,m) (already program order).
    A fresh dict of fresh lists of :func:`one_f_one_b`'s instruction objects."""
    return {ins: list(preds) for ins, preds in _dag_dependencies(stages, microbatches)}


@lru_cache(maxsize=16)
def _dag_dependencies(stages: int, microbatches: int
                      ) -> tuple[tuple[Instruction, tuple[Instruction, ...]], ...]:
    """:func:`dag_dependencies` as tuples, built once per (stages, microbatches)."""
    order = _one_f_one_b(stages, microbatches)
    shared = {(ins.stage, ins.microbatch, ins.direction): ins for seq in order for ins in seq}
    deps: list[tuple[Instruction, tuple[Instruction, ...]]] = []
    for s, seq in enumerate(order):
        for i, ins in enumerate(seq):
            pred = [seq[i - 1]] if i > 0 else []
            if ins.direction == "forward" and s > 0:
                pred.append(shared[(s - 1, ins.microbatch, "forward")])
            if ins.direction == "backward" and s < stages - 1:
                pred.append(shared[(s + 1, ins.microbatch, "backward")])
            deps.append((ins, tuple(pred)))
    return tuple(deps)


def topological_order(stages: int, microbatches: int) -> list[Instruction]:
    """All instructions in an order where every predecessor comes first (Kahn's algorithm,
    linear in the instructions)."""
    from collections import deque

    deps = dag_dependencies(stages, microbatches)
    successors: dict[Instruction, list[Instruction]] = {ins: [] for ins in deps}
    waiting: dict[Instruction, int] = {}
    for ins, preds in deps.items():
        waiting[ins] = len(preds)
        for p in preds:
            successors[p].append(ins)
    ready = deque(ins for ins, n in waiting.items() if n == 0)
    out: list[Instruction] = []
    while ready:
        ins = ready.popleft()
        out.append(ins)
        for nxt in successors[ins]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                ready.append(nxt)
    if len(out) != len(deps):  # pragma: no cover - 1F1B is acyclic by construction
        raise RuntimeError("cycle in the 1F1B DAG")
    return out


def boundary_delays(stages: int, p2p_s: float | Sequence[float]) -> tuple[float, ...]:
    """The transfer time (s) across each of the ``stages - 1`` stage boundaries (boundary ``b``
    between stages ``b`` and ``b + 1``): one number for all, or one per boundary."""
    if isinstance(p2p_s, (int, float)):
        return (float(p2p_s),) * max(stages - 1, 0)
    delays = tuple(float(x) for x in p2p_s)
    if len(delays) != max(stages - 1, 0):
        raise ValueError(f"{len(delays)} transfer times for {stages - 1} stage boundaries")
    return delays


def transfer_delay(stage_a: int, stage_b: int, delays: Sequence[float]) -> float:
    """The transfer time (s) on a dependency between an instruction of stage ``stage_a`` and one
    of the neighbouring stage ``stage_b``: their boundary's (``delays`` as
    :func:`boundary_delays` gives them), 0 within one stage."""
    return delays[min(stage_a, stage_b)] if stage_a != stage_b else 0.0


def sender_hold(ins: Instruction, stages: int, delays: Sequence[float]) -> float:
    """The time (s) ``ins``'s stage stays busy after ``ins`` ends, sending its output across a
    stage boundary (``delays`` as :func:`boundary_delays` gives them): a forward on any stage
    but the last sends its activations to the next, a backward on any stage but the first its
    input gradient to the one before. Megatron-LM's 1F1B (and Merak's, on which the Perseus
    authors measured) pairs each send with a receive and waits for both before the stage's next
    instruction (``send_forward_recv_backward``, ``batch_isend_irecv`` then ``wait``), so a send
    holds its sender as long as the transfer takes its receiver. 0 for an instruction that
    sends nothing. With Megatron-LM's scatter/gather the transfer includes the receiver's
    all-gather (:attr:`IterationGraph.p2p_gather`), which a sender whose next call receives
    also does after its send; a send alone (the first stage's warm-up, a stage's last) holds
    its sender that much less, off the critical path of 1F1B."""
    if ins.direction == "forward":
        return delays[ins.stage] if ins.stage < stages - 1 else 0.0
    return delays[ins.stage - 1] if ins.stage > 0 else 0.0


def dependency_delay(pred: Instruction, succ: Instruction, stages: int,
                     delays: Sequence[float]) -> float:
    """The time (s) between ``pred``'s end and the earliest start of ``succ`` on the 1F1B DAG
    edge ``pred -> succ`` (:func:`dag_dependencies`): across a stage boundary the transfer
    (:func:`transfer_delay`), on one stage the sender's hold (:func:`sender_hold`). The one
    rule every schedule of the suite (the simulator's, the solver's DAG, the slack reclaimer,
    EnvPipe's critical path) keeps."""
    if pred.stage != succ.stage:
        return transfer_delay(pred.stage, succ.stage, delays)
    return sender_hold(pred, stages, delays)


def schedule_times(stages: int, microbatches: int, durations: Mapping[Instruction, float],
                   p2p_s: float | Sequence[float] = 0.0) -> dict[Instruction, tuple[float, float]]:
    """Earliest (start, end) of every instruction of the 1F1B DAG given their durations (s);
    ``p2p_s`` is the activation transfer across each boundary: one time for every boundary, or
    one per boundary (:func:`boundary_delays`).

    Each stage runs its program order (:func:`one_f_one_b`) as far as the other stages allow;
    an instruction starts when its stage's previous one has ended and sent its output
    (:func:`sender_hold`) and its cross-stage predecessor (:func:`dag_dependencies`) has ended
    and its output arrived (:func:`dependency_delay`). Linear in the instructions.
    """
    order = one_f_one_b(stages, microbatches)
    delay = boundary_delays(stages, p2p_s)
    forward_end: list[list[float | None]] = [[None] * microbatches for _ in range(stages)]
    backward_end: list[list[float | None]] = [[None] * microbatches for _ in range(stages)]
    position = [0] * stages
    free = [0.0] * stages
    times: dict[Instruction, tuple[float, float]] = {}
    left = sum(len(seq) for seq in order.values())
    while left:
        moved = False
        for s in range(stages):
            seq, i = order[s], position[s]
            while i < len(seq):
                ins = seq[i]
                m = ins.microbatch
                if ins.direction == "forward":
                    ready = forward_end[s - 1][m] if s > 0 else 0.0
                else:
                    ready = backward_end[s + 1][m] if s < stages - 1 else 0.0
                if ready is None:
                    break
                start = free[s] + sender_hold(seq[i - 1], stages, delay) if i > 0 else 0.0
                if s > 0 and ins.direction == "forward":
                    start = max(start, ready + transfer_delay(s - 1, s, delay))
                elif s < stages - 1 and ins.direction == "backward":
                    start = max(start, ready + transfer_delay(s + 1, s, delay))
                end = start + durations[ins]
                times[ins] = (start, end)
                (forward_end if ins.direction == "forward" else backward_end)[s][m] = end
                free[s] = end
                i += 1
                left -= 1
                moved = True
            position[s] = i
        if not moved:  # pragma: no cover - 1F1B is acyclic by construction
            raise RuntimeError("cycle in the 1F1B DAG")
    return times


def critical_path(stages: int, microbatches: int, times: dict[Instruction, tuple[float, float]],
                  p2p_s: float | Sequence[float] = 0.0) -> list[Instruction]:
    """Instructions on a longest path, from the first to the last-finishing instruction
    (``p2p_s`` as :func:`schedule_times` takes it)."""
    deps = dag_dependencies(stages, microbatches)
    delay = boundary_delays(stages, p2p_s)
    node = max(times, key=lambda i: times[i][1])
    path = [node]
    while deps[node]:
        start = times[node][0]
        prev = [d for d in deps[node]
                if abs(times[d][1] + dependency_delay(d, node, stages, delay) - start) < 1e-12]
        if not prev:
            break
        node = max(prev, key=lambda d: times[d][1])
        path.append(node)
    return path[::-1]
