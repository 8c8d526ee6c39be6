"""Op-by-op execution of one pipeline stage: nanobatches, launch slots, side-stream collectives and
full recomputation, over the modules of :mod:`workloads.torch_model`.

Why op by op: a Kareus plan launches each partition's collective *together with a chosen compute
op* and joins it at the partition's end, in forward and in backward. So the engine runs every layer
as the ordered op list :mod:`workloads.graph_builder` describes -- the same names, in the same
order, cut at the same collectives -- calling the layer's own submodules (``norm1``, ``attn.qkv``,
``attn.rope``, SDPA, ``attn.proj``, ``mlp.fc1``, ...). The runner checks, per instruction, that the
engine's op names equal the graph's partition op names, so a launch slot index means the same op
in the plan, the simulator and here.

Forward instruction: ``torch.no_grad``; each layer's input is kept as its recomputation
checkpoint (two tensors: the residual stream and the previous layer's reduced branch output, whose
bias-add is the first op, ``bda``, of the next layer in the graph's cut).

Backward instruction (full recomputation, as in the paper's runs): for each layer from the top,
re-run its forward while recording a *tape* -- every op is its own small autograd graph whose
inputs are detached leaves -- then run the backward ops one by one from the tape
(``torch.autograd.backward`` with ``inputs=``: a linear layer's input gradient ("dgrad") and
weight gradient ("wgrad") are two separate ops, as in the graph). Gradients between ops travel in
a table keyed by tensor identity, so residual fan-out sums correctly.

Collectives (tensor parallelism, Megatron layout): forward all-reduce of the row-parallel outputs,
backward all-reduce of the column-parallel inputs' gradients; the embedding and the vocab-parallel
cross-entropy use the model's own :func:`~workloads.torch_model.tensor_parallel_ops`. With
nanobatches, the collective of one nanobatch's segment is launched on a side CUDA stream when the
other nanobatch's next segment reaches the plan's launch slot (the side stream waits on an event
recorded just before that op), and the main stream waits for it at the partition's end. The SM
count of a collective is the CTA limit of the process group it runs on (see
:mod:`kareus.backends.gpu.runner`). On CPU (tests) there are no streams: collectives run when
launched.

Context parallelism is not implemented (the torch model has no ring / all-gather attention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from workloads.models import ModelSpec
from workloads.torch_model import GPTStage, TransformerLayer, tensor_parallel_ops

# ================================================================================ collectives


class Work(Protocol):
    def wait(self) -> Any:
        ...


class _Done:
    def wait(self) -> None:
        return None


class Comm(Protocol):
    """The tensor-parallel group of this rank. ``sms`` selects the communicator whose CTA limit
    is that many SMs (``None``: the library's default)."""

    size: int

    def all_reduce(self, t: Tensor, sms: int | None = None, op: str = "sum") -> Work:
        """In-place all-reduce of ``t``, asynchronous; ``wait()`` on the result orders the current
        stream after it."""
        ...


class GroupComm:
    """:class:`Comm` over ``torch.distributed`` process groups: ``groups[None]`` is the default
    TP group, ``groups[k]`` the same ranks with an NCCL CTA limit of ``k``."""

    def __init__(self, groups: dict[int | None, Any], size: int) -> None:
        self.groups = groups
        self.size = size

    def all_reduce(self, t: Tensor, sms: int | None = None, op: str = "sum") -> Work:
        import torch.distributed as dist

        group = self.groups.get(sms, self.groups[None])
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        return dist.all_reduce(t, op=red, group=group, async_op=True)


class LocalComm:
    """A stand-in collective for one process (tests, single-GPU side-stream checks): an
    all-reduce over ``size`` identical ranks, i.e. ``t *= size`` for a sum (identity for max).
    ``log`` records ``(sms, numel)`` per call."""

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self.log: list[tuple[int | None, int]] = []

    def all_reduce(self, t: Tensor, sms: int | None = None, op: str = "sum") -> Work:
        self.log.append((sms, t.numel()))
        if op == "sum" and self.size != 1:
            t.mul_(self.size)
        return _Done()


def _sync_reduce(comm: Comm | None) -> Callable[[Tensor], object]:
    """A blocking in-place sum all-reduce (what :func:`tensor_parallel_ops` expects)."""
    def reduce(t: Tensor) -> None:
        if comm is not None:
            comm.all_reduce(t).wait()
    return reduce


# ================================================================================ streams


class Streams:
    """Main and side CUDA streams; on CPU everything is immediate."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device=device) if self.cuda else None

    def launch(self, fn: Callable[[], Work], side: bool) -> Any:
        """Run the collective ``fn`` on the side stream, starting once the main stream reaches
        this point; returns a handle for :meth:`join`. ``side=False``: on the main stream."""
        if not self.cuda:
            fn().wait()
            return None
        if not side:
            fn().wait()  # NCCL's stream waits for main; main waits for NCCL
            return None
        main = torch.cuda.current_stream()
        ready = main.record_event()
        assert self.side is not None
        with torch.cuda.stream(self.side):
            self.side.wait_event(ready)
            fn().wait()
            return self.side.record_event()

    def join(self, handle: Any) -> None:
        """Make the main stream wait for a side-stream collective."""
        if handle is not None:
            torch.cuda.current_stream().wait_event(handle)


# ================================================================================ the tape


@dataclass(eq=False)
class _Auto:
    """An op recorded with autograd: detached leaf inputs, their source tensors, outputs."""

    leaves: list[Tensor]
    srcs: list[Tensor]
    outs: list[Tensor]
    params: list[Tensor]


@dataclass(eq=False)
class _Add:
    """A residual add ``out = sum(ins) (+ bias)``; backward by hand (gradients pass through)."""

    ins: list[Tensor]
    bias: Tensor | None
    out: Tensor


class Tape:
    """Recorded ops of one nanobatch, and the gradients flowing between them (by tensor id).

    Args:
        keep: Never consume entries or gradients (for repeating one op or partition in a
            measurement window); the caller snapshots and restores :attr:`grads`.
    """

    def __init__(self, keep: bool = False) -> None:
        self.entries: dict[tuple, _Auto | _Add] = {}
        self.grads: dict[int, Tensor] = {}
        self.keep = keep

    def add_grad(self, t: Tensor, g: Tensor) -> None:
        k = id(t)
        old = self.grads.get(k)
        self.grads[k] = g if old is None else old + g

    def pop_grad(self, t: Tensor) -> Tensor | None:
        return self.grads.get(id(t)) if self.keep else self.grads.pop(id(t), None)

    def backward(self, label: tuple, part: str = "all") -> None:
        """Run the backward of entry ``label``: ``part`` is ``"all"``, ``"dgrad"`` (input
        gradients only) or ``"wgrad"`` (parameter gradients only; consumes the entry)."""
        e = self.entries.get(label)
        if e is None:
            return
        if isinstance(e, _Add):
            g = self.pop_grad(e.out)
            if g is not None:
                for t in e.ins:
                    self.add_grad(t, g)
                if e.bias is not None:
                    gb = g.reshape(-1, g.shape[-1]).sum(0)
                    e.bias.grad = gb if e.bias.grad is None else e.bias.grad + gb
            if not self.keep:
                del self.entries[label]
            return
        outs, grads = [], []
        for o in e.outs:
            g = self.grads.get(id(o))
            if g is not None:
                outs.append(o)
                grads.append(g)
        last = part in ("all", "wgrad")
        if outs:
            params = [p for p in e.params if p is not None and p.requires_grad]
            if part == "dgrad":
                inputs = list(e.leaves)
            elif part == "wgrad":
                inputs = params
            else:
                inputs = list(e.leaves) + params
            if inputs:
                for leaf in e.leaves:
                    leaf.grad = None
                torch.autograd.backward(outs, grads, inputs=inputs,
                                        retain_graph=self.keep or not last)
                if part != "wgrad":
                    for leaf, src in zip(e.leaves, e.srcs):
                        if leaf.grad is not None:
                            self.add_grad(src, leaf.grad)
                            leaf.grad = None
        if last and not self.keep:
            for o in e.outs:
                self.grads.pop(id(o), None)
            del self.entries[label]

    def rebind(self, label: tuple, ins: list[Tensor]) -> None:
        """Point a residual add's inputs at other tensors (the recomputed ones)."""
        e = self.entries.get(label)
        if isinstance(e, _Add):
            e.ins = list(ins)


# ================================================================================ contexts, ops


@dataclass(eq=False)
class NanoCtx:
    """State of one nanobatch: named tensors of the residual stream and the current op, the tape
    when recording, and the per-layer checkpoints of the forward instruction."""

    st: dict[str, Tensor]
    tape: Tape | None = None
    ckpts: list[tuple[Tensor, Tensor | None]] = field(default_factory=list)
    out_ref: Tensor | None = None  # holds the stage output's gradient in backward
    #: forward all-reduces when recording: label -> (partial, reduced)
    ar_pairs: dict[tuple, tuple[Tensor, Tensor]] = field(default_factory=dict)
    #: column-parallel inputs when recording: (layer, norm) -> (normed, its TP copy)
    f_pairs: dict[tuple, tuple[Tensor, Tensor]] = field(default_factory=dict)

    @property
    def recording(self) -> bool:
        return self.tape is not None


@dataclass(frozen=True)
class Op:
    """One compute op: its graph name and what it does to a nanobatch."""

    name: str
    run: Callable[[NanoCtx], None]


@dataclass(frozen=True)
class CommSpec:
    """The collective ending a segment: ``"fwd"`` all-reduces ``st[key]`` (row-parallel output),
    ``"bwd"`` all-reduces the gradient of the column-parallel input recorded as ``label``."""

    kind: str
    key: str = "p"
    label: tuple = ()


@dataclass(frozen=True)
class Segment:
    """Ops between two collectives, for one layer; ``name`` is the graph's segment name
    (``attn``, ``mlp``; joined with ``+`` where no collective cuts them)."""

    prefix: str  # "fwd", "rcp_fwd" or "bwd"
    name: str
    layer: int
    ops: tuple[Op, ...]
    comm: CommSpec | None
    before: Callable[[NanoCtx], None] | None = None
    after: Callable[[NanoCtx], None] | None = None


def _auto(ctx: NanoCtx, label: tuple, fn: Callable[..., Any], ins: Sequence[str],
          outs: Sequence[str], params: Sequence[Tensor | None] = ()) -> None:
    """Run ``fn`` on ``st[ins]`` into ``st[outs]``; when recording, as its own autograd graph."""
    srcs = [ctx.st[k] for k in ins]
    if ctx.tape is not None:
        leaves = [s.detach().requires_grad_() for s in srcs]
        with torch.enable_grad():
            res = fn(*leaves)
        res = res if isinstance(res, tuple) else (res,)
        ctx.tape.entries[label] = _Auto(leaves, srcs, list(res),
                                        [p for p in params if p is not None])
    else:
        res = fn(*srcs)
        res = res if isinstance(res, tuple) else (res,)
    for k, v in zip(outs, res):
        ctx.st[k] = v


def _add(ctx: NanoCtx, label: tuple, bias: Tensor | None) -> None:
    """``x = x + (p + bias)`` (the model's bias-dropout-add order), or ``x = x`` without ``p``."""
    x, p = ctx.st["x"], ctx.st.get("p")
    with torch.no_grad():
        if p is None:
            out = x.detach()
            ins = [x]
        else:
            out = x + (p + bias if bias is not None else p)
            ins = [x, p]
    ctx.st.pop("p", None)
    if ctx.tape is not None:
        ctx.tape.entries[label] = _Add(ins, bias if p is not None else None, out)
    ctx.st["x"] = out


class LayerProgram:
    """The op lists of one transformer layer (forward and backward) as closures over its modules.

    Args:
        layer: The layer.
        index: Its index within the stage.
        prev: The layer below it in the stage (whose FC2 bias the first ``bda`` adds), if any.
        top: Whether it is the stage's last layer.
        tp: Whether tensor-parallel collectives cut the segments.
    """

    def __init__(self, layer: TransformerLayer, index: int, prev: TransformerLayer | None,
                 top: bool, tp: bool) -> None:
        self.layer, self.i, self.prev, self.top, self.tp = layer, index, prev, top, tp
        self.spec: ModelSpec = layer.spec

    # ------------------------------------------------------------------ forward ops
    def _norm(self, which: str) -> Op:
        i, norm = self.i, getattr(self.layer, which)

        def run(ctx: NanoCtx) -> None:
            _auto(ctx, (i, which), norm, ["x"], ["n"], list(norm.parameters()))
            if self.tp and ctx.tape is not None:  # identity forward; all-reduce of the grad
                ctx.st["n_col"] = ctx.st["n"].detach()
                ctx.f_pairs[(i, which)] = (ctx.st["n"], ctx.st["n_col"])
            else:
                ctx.st["n_col"] = ctx.st["n"]
        return Op("norm", run)

    def forward_ops(self) -> list[Op | CommSpec]:
        """Forward ops with the collectives that cut them (graph order)."""
        lay, i, spec = self.layer, self.i, self.spec
        att = lay.attn
        prev_bias = self.prev.fc2_bias if self.prev is not None else None
        hq, hkv, d = att.hq, att.hkv, att.d

        def qkv(n: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            b, s, _ = n.shape
            q, k, v = att.qkv(n).split([hq * d, hkv * d, hkv * d], -1)
            return q.view(b, s, hq, d), k.view(b, s, hkv, d), v.view(b, s, hkv, d)

        def qk_norm(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            return att.q_norm(q), att.k_norm(k)  # type: ignore[misc]

        def rope(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            return att.rope(q, k)  # type: ignore[misc]

        def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            b, s = q.shape[:2]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if hq == hkv:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return y.transpose(1, 2).reshape(b, s, hq * d)

        def act(h: Tensor) -> Tensor:
            if spec.mlp == "swiglu":
                gate, up = h.chunk(2, dim=-1)
                return F.silu(gate) * up
            return F.gelu(h, approximate="tanh")

        ops: list[Op | CommSpec] = [
            Op("bda", lambda c: _add(c, (i, "bda1"), prev_bias)),
            self._norm("norm1"),
            Op("linear_qkv", lambda c: _auto(c, (i, "qkv"), qkv, ["n_col"], ["q", "k", "v"],
                                             list(att.qkv.parameters()))),
        ]
        if att.q_norm is not None:
            ops.append(Op("qk_norm", lambda c: _auto(
                c, (i, "qkn"), qk_norm, ["q", "k"], ["q", "k"],
                [*att.q_norm.parameters(), *att.k_norm.parameters()])))  # type: ignore[union-attr]
        if att.rope is not None:
            ops.append(Op("rope", lambda c: _auto(c, (i, "rope"), rope, ["q", "k"], ["q", "k"])))
        ops += [
            Op("attention", lambda c: _auto(c, (i, "attn"), attention, ["q", "k", "v"], ["y"])),
            Op("linear_proj", lambda c: _auto(c, (i, "proj"), att.proj, ["y"], ["p"],
                                              list(att.proj.parameters()))),
            CommSpec("fwd", "p", (i, "ar1")),
            Op("bda", lambda c: _add(c, (i, "bda2"), lay.proj_bias)),
            self._norm("norm2"),
            Op("linear_fc1", lambda c: _auto(c, (i, "fc1"), lay.mlp.fc1, ["n_col"], ["h"],
                                             list(lay.mlp.fc1.parameters()))),
            Op("activation", lambda c: _auto(c, (i, "act"), act, ["h"], ["a"])),
            Op("linear_fc2", lambda c: _auto(c, (i, "fc2"), lay.mlp.fc2, ["a"], ["p"],
                                             list(lay.mlp.fc2.parameters()))),
            CommSpec("fwd", "p", (i, "ar2")),
        ]
        return ops

    # ------------------------------------------------------------------ backward ops
    def backward_ops(self) -> list[Op | CommSpec]:
        """Backward ops (graph order), each running entries of the tape; the first ``norm_bwd``
        is the layer above's ``norm1`` and residual add (or the stage's final add)."""
        i, spec = self.i, self.spec

        def run(*steps: tuple[tuple, str]) -> Callable[[NanoCtx], None]:
            def f(ctx: NanoCtx) -> None:
                assert ctx.tape is not None
                for label, part in steps:
                    if label[-1] in ("ar1", "ar2"):
                        _alias_back(ctx, label)
                    else:
                        ctx.tape.backward(label, part)
            return f

        above = [(("final",), "all")] if self.top else [((i + 1, "norm1"), "all"),
                                                        ((i + 1, "bda1"), "all")]
        ops: list[Op | CommSpec] = [
            Op("norm_bwd", run(*above, ((i, "ar2"), "all"))),
            Op("linear_fc2_dgrad", run(((i, "fc2"), "dgrad"))),
            Op("linear_fc2_wgrad", run(((i, "fc2"), "wgrad"))),
            Op("activation_bwd", run(((i, "act"), "all"))),
            Op("linear_fc1_dgrad", run(((i, "fc1"), "dgrad"))),
            Op("linear_fc1_wgrad", run(((i, "fc1"), "wgrad"))),
            CommSpec("bwd", label=(i, "norm2")),
            Op("norm_bwd", run(((i, "norm2"), "all"))),
            Op("bda_bwd", run(((i, "bda2"), "all"), ((i, "ar1"), "all"))),
            Op("linear_proj_dgrad", run(((i, "proj"), "dgrad"))),
            Op("linear_proj_wgrad", run(((i, "proj"), "wgrad"))),
            Op("attention_bwd", run(((i, "attn"), "all"))),
        ]
        if spec.rope:
            ops.append(Op("rope_bwd", run(((i, "rope"), "all"))))
        if spec.qk_norm:
            ops.append(Op("qk_norm_bwd", run(((i, "qkn"), "all"))))
        ops += [
            Op("linear_qkv_dgrad", run(((i, "qkv"), "dgrad"))),
            Op("linear_qkv_wgrad", run(((i, "qkv"), "wgrad"))),
            CommSpec("bwd", label=(i, "norm1")),
        ]
        return ops


def _alias_back(ctx: NanoCtx, label: tuple) -> None:
    """Backward of a forward all-reduce: identity from the reduced tensor to the partial one."""
    assert ctx.tape is not None
    pair = ctx.ar_pairs.get(label)
    if pair is None:  # TP = 1: no all-reduce was recorded
        return
    partial, reduced = pair
    g = ctx.tape.pop_grad(reduced)
    if g is not None:
        ctx.tape.add_grad(partial, g)
    if not ctx.tape.keep:
        del ctx.ar_pairs[label]


def cut_segments(prefix: str, layer: int, items: list[Op | CommSpec], tp: bool
                 ) -> list[Segment]:
    """Cut an op list at its collectives as :func:`workloads.graph_builder._segments` does:
    without tensor parallelism no collective cuts, and the whole block is one segment."""
    names_fwd = {("fwd", 0): "attn", ("fwd", 1): "mlp", ("bwd", 0): "mlp", ("bwd", 1): "attn"}
    kind = "bwd" if prefix == "bwd" else "fwd"
    segs: list[Segment] = []
    ops: list[Op] = []
    cut_names: list[str] = []
    cuts = 0
    for item in items:
        if isinstance(item, CommSpec):
            cut_names.append(names_fwd[(kind, cuts)])
            cuts += 1
            if tp:
                segs.append(Segment(prefix, "+".join(cut_names), layer, tuple(ops), item))
                ops, cut_names = [], []
        else:
            ops.append(item)
    if ops:
        segs.append(Segment(prefix, "+".join(cut_names) if cut_names else "tail", layer,
                            tuple(ops), None))
    return segs


# ================================================================================ the engine


@dataclass
class ForwardState:
    """What a forward instruction leaves for its backward: per-nanobatch checkpoints, the
    embedding output (first stage, with its autograd graph), the head's loss and input leaf
    (last stage)."""

    ctxs: list[NanoCtx]
    output: Tensor | None = None
    embed_out: Tensor | None = None
    head_in: Tensor | None = None
    loss: Tensor | None = None


@dataclass(frozen=True)
class Schedule:
    """How one instruction runs: nanobatched or not, and partition key -> (SMs, launch slot,
    wait-after op); SMs ``None``: the library's default, wait ``None``: the partition's end."""

    nanobatched: bool = False
    partitions: tuple[tuple[str, tuple[int | None, int, int | None]], ...] = ()

    def get(self, key: str) -> tuple[int | None, int, int | None]:
        return dict(self.partitions).get(key, (None, 0, None))


class StageEngine:
    """Runs forward and backward instructions of one pipeline stage on one TP rank.

    Args:
        stage: The stage's modules (:class:`~workloads.torch_model.GPTStage`).
        comm: The TP group (``None``: TP = 1, no collectives).
        nanobatches: Nanobatches per microbatch when an instruction is nanobatched.
        partition_keys: ``(direction) -> keys`` of one layer's partition chain in graph order
            (``[seg0/0, seg0/1, seg1/0, ...]``); lets schedules address partitions by key.
    """

    def __init__(self, stage: GPTStage, comm: Comm | None, *, nanobatches: int = 2,
                 partition_keys: dict[str, list[str]] | None = None) -> None:
        self.stage = stage
        # A one-rank comm still cuts the layers at the collectives and runs them on the side
        # stream (single-GPU side-stream checks); only a real group shards the model's extras.
        self.comm = comm if comm is not None and comm.size > 1 else None
        self._comm_any = comm
        self.tp = comm is not None
        self.nanobatches = nanobatches
        self.partition_keys = partition_keys or {}
        self.device = next(stage.parameters()).device
        self.streams = Streams(self.device)
        layers = list(stage.layers)
        self.programs = [LayerProgram(lay, i, layers[i - 1] if i else None, i == len(layers) - 1,
                                      self.tp) for i, lay in enumerate(layers)]
        self.first = stage.wte is not None
        self.last = stage.out is not None
        reduce = _sync_reduce(self.comm)
        self._ar_fwd, self._ar_bwd = tensor_parallel_ops(reduce) if self.comm else (None, None)

    # ------------------------------------------------------------------ op lists
    def segments(self, direction: str, layer: int) -> list[Segment]:
        """The segments of one layer of a forward or backward instruction."""
        prog = self.programs[layer]
        if direction == "forward":
            return cut_segments("fwd", layer, prog.forward_ops(), self.tp)
        return (cut_segments("rcp_fwd", layer, prog.forward_ops(), self.tp)
                + cut_segments("bwd", layer, prog.backward_ops(), self.tp))

    def op_names(self, direction: str, nanobatched: bool) -> list[tuple[str, ...]]:
        """Op names of one layer's partitions (nanobatched: each segment twice, for nanobatch 0
        and 1) or sequential segments, in chain order; compare with the graph's."""
        out = []
        for seg in self.segments(direction, 0):
            names = tuple(op.name for op in seg.ops)
            out += [names] * (self.nanobatches if nanobatched else 1)
        return out

    # ------------------------------------------------------------------ the chain
    def _comm_tensor(self, seg: Segment, ctx: NanoCtx) -> Tensor | None:
        """At a segment's end: the tensor its collective all-reduces (in place), with the state
        and tape updated to read the reduced value once the collective is joined."""
        c = seg.comm
        if c is None or not self.tp:
            return None
        if c.kind == "fwd":
            partial = ctx.st[c.key]
            reduced = partial.detach()
            ctx.st[c.key] = reduced
            if ctx.tape is not None:
                ctx.ar_pairs[c.label] = (partial, reduced)
            return reduced
        assert ctx.tape is not None
        n, n_col = ctx.f_pairs[c.label] if ctx.tape.keep else ctx.f_pairs.pop(c.label)
        g = ctx.tape.pop_grad(n_col)
        if g is None:
            return None
        ctx.tape.add_grad(n, g)
        return g

    def _all_reduce(self, t: Tensor, sms: int | None) -> Work:
        assert self._comm_any is not None
        return self._comm_any.all_reduce(t, sms)

    def run_segment(self, seg: Segment, ctx: NanoCtx, pending: Tensor | None,
                    sms: int | None, slot: int, wait: int | None = None) -> None:
        """One partition: ``seg``'s ops on ``ctx``, the collective on ``pending`` (the other
        nanobatch's) launched on the side stream just before op ``slot`` and joined right after
        op ``wait`` (``None``: the last op); ``slot = -1`` runs it alone before the ops."""
        handle, launched = None, pending is None
        end = len(seg.ops) - 1 if wait is None else wait
        if seg.before is not None:
            seg.before(ctx)
        if not launched and slot < 0:  # sequential: the collective alone first
            t = pending
            self.streams.join(self.streams.launch(lambda t=t, s=sms: self._all_reduce(t, s),
                                                  True))
            launched = True
        for i, op in enumerate(seg.ops):
            if not launched and i == slot:
                t = pending
                handle = self.streams.launch(lambda t=t, s=sms: self._all_reduce(t, s), True)
                launched = True
            op.run(ctx)
            if handle is not None and i == end:
                self.streams.join(handle)
                handle = None
        if not launched:  # slot past the last op: launch at the end
            t = pending
            handle = self.streams.launch(lambda t=t, s=sms: self._all_reduce(t, s), True)
        if handle is not None:
            self.streams.join(handle)

    def run_chain(self, items: list[tuple[Segment, NanoCtx, str | None]], overlap: bool,
                  sched: Schedule, flush: bool = True) -> Tensor | None:
        """Run segments in order. With ``overlap``, each segment's collective launches in the
        next segment at that partition's slot (on the side stream) and joins at its end; the last
        one runs exposed (``flush=False``: it is returned instead, not run). Without overlap,
        each collective runs right after its segment."""
        pending: Tensor | None = None
        first_sms = sched.get(items[0][2])[0] if items and items[0][2] else None
        for seg, ctx, key in items:
            sms, slot, wait = sched.get(key) if key else (None, 0, None)
            self.run_segment(seg, ctx, pending, sms, slot, wait)
            pending = None
            t = self._comm_tensor(seg, ctx)
            if t is not None:
                if overlap:
                    pending = t
                else:
                    self.streams.launch(lambda t=t: self._all_reduce(t, None), False)
            if seg.after is not None:
                seg.after(ctx)
        if pending is not None and flush:
            t = pending
            self.streams.join(self.streams.launch(
                lambda t=t, s=first_sms: self._all_reduce(t, s), True))
            pending = None
        return pending

    def _items(self, direction: str, layers: Sequence[int], ctxs: list[NanoCtx],
               nanobatched: bool, hooks: Callable[[Segment], Segment] = lambda s: s
               ) -> list[tuple[Segment, NanoCtx, str | None]]:
        keys = self.partition_keys.get(direction, [])
        items = []
        for layer in layers:
            for j, seg in enumerate(self.segments(direction, layer)):
                seg = hooks(seg)
                for nb, ctx in enumerate(ctxs):
                    idx = j * len(ctxs) + nb
                    key = keys[idx] if nanobatched and idx < len(keys) else None
                    items.append((seg, ctx, key))
        return items

    def _split(self, x: Tensor, nanobatched: bool) -> list[Tensor]:
        if not nanobatched or self.nanobatches == 1:
            return [x]
        return list(x.chunk(self.nanobatches, dim=0))

    def sync_replicated_grads(self) -> None:
        """All-reduce over the TP group the gradients of replicated parameters that each rank
        sees only part of: the per-head QK-norm scales (each rank holds a subset of the heads),
        as Megatron-LM does for QK layernorm. One flat all-reduce; no-op without TP."""
        if self.comm is None:
            return
        grads = [p.grad for prog in self.programs for m in (prog.layer.attn.q_norm,
                                                              prog.layer.attn.k_norm)
                 if m is not None for p in m.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.comm.all_reduce(flat).wait()
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    # ------------------------------------------------------------------ extras
    def embed(self, tokens: Tensor) -> Tensor:
        """Vocab-parallel embedding (+ learned positions), as :class:`GPTStage` does it."""
        st = self.stage
        assert st.wte is not None
        local = tokens - st.vocab_start
        outside = (local < 0) | (local >= st.vocab_local)
        h = st.wte(local.masked_fill(outside, 0)).masked_fill(outside[..., None], 0.0)
        x = self._ar_fwd(h) if self._ar_fwd is not None else h
        if st.wpe is not None:
            x = x + st.wpe(torch.arange(x.shape[1], device=x.device))[None]
        return x

    def head_loss(self, x: Tensor, targets: Tensor) -> Tensor:
        """Final norm, vocab-parallel output layer, vocab-parallel cross-entropy (mean)."""
        st = self.stage
        assert st.norm is not None and st.out is not None
        h = st.norm(x)
        if self._ar_bwd is not None:
            h = self._ar_bwd(h)
        logits = st.out(h)
        if self.comm is None:
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return _VocabParallelCE.apply(logits, targets, st.vocab_start, self.comm)

    # ------------------------------------------------------------------ instructions
    def forward(self, x: Tensor, sched: Schedule, targets: Tensor | None = None
                ) -> ForwardState:
        """One forward instruction: ``x`` is token ids on the first stage, else the previous
        stage's activation ``[b, s, hidden]``. Returns the state its backward needs; the
        activation to send is ``state.output`` (``None`` on the last stage)."""
        state = ForwardState(ctxs=[])
        if self.first:
            with torch.enable_grad():
                emb = self.embed(x)
            state.embed_out = emb
            x = emb.detach()
        nb = sched.nanobatched
        ctxs = [NanoCtx(st={"x": part}) for part in self._split(x, nb)]
        state.ctxs = ctxs

        def save(seg: Segment) -> Segment:
            if seg.name.startswith("attn") or seg.name == "tail":
                def before(ctx: NanoCtx, layer: int = seg.layer) -> None:
                    if len(ctx.ckpts) == layer:
                        ctx.ckpts.append((ctx.st["x"], ctx.st.get("p")))
                return Segment(seg.prefix, seg.name, seg.layer, seg.ops, seg.comm, before,
                               seg.after)
            return seg

        with torch.no_grad():
            self.run_chain(self._items("forward", range(len(self.programs)), ctxs, nb, save),
                           nb, sched)
            top = self.programs[-1].layer
            outs = []
            for ctx in ctxs:
                _add(ctx, ("final",), top.fc2_bias)
                outs.append(ctx.st["x"])
            out = torch.cat(outs, dim=0) if len(outs) > 1 else outs[0]
        if self.last:
            assert targets is not None
            leaf = out.detach().requires_grad_()
            with torch.enable_grad():
                state.loss = self.head_loss(leaf, targets)
            state.head_in = leaf
        else:
            state.output = out
        return state

    def backward(self, state: ForwardState, sched: Schedule, grad_out: Tensor | None = None,
                 *, keep: bool = False) -> Tensor | None:
        """One backward instruction (recompute + backward, layer by layer from the top). Returns
        the gradient of the stage input to send (``None`` on the first stage, whose embedding
        takes it). ``keep`` leaves ``state`` reusable (repeated measurement)."""
        if self.last:
            assert state.loss is not None and state.head_in is not None
            state.head_in.grad = None
            state.loss.backward(retain_graph=keep)
            grad_out = state.head_in.grad
            state.head_in.grad = None
        assert grad_out is not None
        ctxs, items = self.backward_items(state, sched, grad_out, keep=False)
        self.run_chain(items, sched.nanobatched, sched)
        return self.backward_finish(state, ctxs, keep)

    def backward_items(self, state: ForwardState, sched: Schedule, grad_out: Tensor, *,
                       keep: bool, layers: Sequence[int] | None = None
                       ) -> tuple[list[NanoCtx], list[tuple[Segment, NanoCtx, str | None]]]:
        """Contexts and chain items of a backward instruction (``layers``: top-down subset)."""
        nb = sched.nanobatched
        gparts = self._split(grad_out, nb)
        ctxs = []
        for fctx, g in zip(state.ctxs, gparts):
            ctx = NanoCtx(st={}, tape=Tape(keep=keep), ckpts=fctx.ckpts)
            ctx.out_ref = torch.empty(0, device=g.device)
            ctx.tape.grads[id(ctx.out_ref)] = g  # type: ignore[union-attr]
            ctxs.append(ctx)
        n_layers = len(self.programs)

        def hook(seg: Segment) -> Segment:
            layer = seg.layer
            if seg.prefix == "rcp_fwd" and (seg.name.startswith("attn") or seg.name == "tail"):
                def before(ctx: NanoCtx) -> None:
                    x, p = ctx.ckpts[layer]
                    ctx.st = {"x": x} if p is None else {"x": x, "p": p}
                seg = Segment(seg.prefix, seg.name, layer, seg.ops, seg.comm, before, seg.after)
            if seg.prefix == "rcp_fwd" and (seg.name.endswith("mlp") or seg.name == "tail"):
                def after(ctx: NanoCtx) -> None:
                    assert ctx.tape is not None
                    x, p = ctx.st["x"], ctx.st["p"]
                    if layer == n_layers - 1:
                        ctx.tape.entries[("final",)] = _Add(
                            [x, p], self.programs[layer].layer.fc2_bias, ctx.out_ref)  # type: ignore[arg-type]
                    else:
                        ctx.tape.rebind((layer + 1, "bda1"), [x, p])
                seg = Segment(seg.prefix, seg.name, layer, seg.ops, seg.comm, seg.before, after)
            return seg

        order = list(layers) if layers is not None else list(range(n_layers - 1, -1, -1))
        return ctxs, self._items("backward", order, ctxs, nb, hook)

    def backward_finish(self, state: ForwardState, ctxs: list[NanoCtx], keep: bool
                        ) -> Tensor | None:
        """The bottom layer's norm and residual backward, then the embedding (first stage) or
        the gradient to send (others)."""
        grads = []
        for ctx in ctxs:
            assert ctx.tape is not None
            ctx.tape.backward((0, "norm1"))
            ctx.tape.backward((0, "bda1"))
            x0 = ctx.ckpts[0][0]
            g = ctx.tape.pop_grad(x0)
            grads.append(g if g is not None else torch.zeros_like(x0))
        grad_in = torch.cat(grads, dim=0) if len(grads) > 1 else grads[0]
        if self.first:
            assert state.embed_out is not None
            state.embed_out.backward(grad_in, retain_graph=keep)
            return None
        return grad_in


class _VocabParallelCE(torch.autograd.Function):
    """Cross-entropy over logits sharded by vocabulary across the TP group (Megatron-LM's):
    all-reduce of the row max, of the sum of exponentials and of the target logit."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, vocab_start: int,  # type: ignore[override]
                comm: Comm) -> Tensor:
        lg = logits.float().flatten(0, 1)
        t = targets.flatten()
        mx = lg.max(dim=-1).values
        comm.all_reduce(mx, op="max").wait()
        lg = lg - mx[:, None]
        local = t - vocab_start
        inside = (local >= 0) & (local < lg.shape[-1])
        idx = local.clamp(0, lg.shape[-1] - 1)
        pred = lg.gather(1, idx[:, None]).squeeze(1) * inside
        ex = lg.exp()
        both = torch.stack([ex.sum(-1), pred])
        comm.all_reduce(both).wait()
        sumexp, pred = both[0], both[1]
        loss = (sumexp.log() - pred).mean()
        ctx.save_for_backward(ex / sumexp[:, None], idx, inside)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        soft, idx, inside = ctx.saved_tensors
        grad = soft.clone()
        grad[torch.arange(grad.shape[0], device=grad.device), idx] -= inside.float()
        grad = grad * (g / grad.shape[0])
        return grad.view(ctx.shape).to(ctx.dtype), None, None, None
