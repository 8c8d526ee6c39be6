"""A transformer layer as ordered op lists (forward and backward, the graph's names and order)
over nanobatch contexts, and their cut into segments at the collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from kareus.backends.gpu.engine.tape import Tape, ResidualAddEntry, AutogradEntry
from workloads.models import ModelSpec
from workloads.torch_model import TransformerLayer


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


def _auto(ctx: NanoCtx, label: tuple, fn: Callable[..., Tensor | tuple[Tensor, ...]],
          ins: Sequence[str],
          outs: Sequence[str], params: Sequence[Tensor | None] = ()) -> None:
    """Run ``fn`` on ``st[ins]`` into ``st[outs]``; when recording, as its own autograd graph."""
    srcs = [ctx.st[k] for k in ins]
    if ctx.tape is not None:
        leaves = [s.detach().requires_grad_() for s in srcs]
        with torch.enable_grad():
            res = fn(*leaves)
        res = res if isinstance(res, tuple) else (res,)
        ctx.tape.entries[label] = AutogradEntry(leaves, srcs, list(res),
                                                [p for p in params if p is not None])
    else:
        res = fn(*srcs)
        res = res if isinstance(res, tuple) else (res,)
    for k, v in zip(outs, res):
        ctx.st[k] = v


def residual_add(ctx: NanoCtx, label: tuple, bias: Tensor | None) -> None:
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
        ctx.tape.entries[label] = ResidualAddEntry(ins, bias if p is not None else None, out)
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
            Op("bda", lambda c: residual_add(c, (i, "bda1"), prev_bias)),
            self._norm("norm1"),
            Op("linear_qkv", lambda c: _auto(c, (i, "qkv"), qkv, ["n_col"], ["q", "k", "v"],
                                             list(att.qkv.parameters()))),
        ]
        q_norm, k_norm, rotary = att.q_norm, att.k_norm, att.rope
        if q_norm is not None and k_norm is not None:  # both or neither (spec.qk_norm)
            def qk_norm(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
                return q_norm(q), k_norm(k)

            ops.append(Op("qk_norm", lambda c: _auto(
                c, (i, "qkn"), qk_norm, ["q", "k"], ["q", "k"],
                [*q_norm.parameters(), *k_norm.parameters()])))
        if rotary is not None:
            def rope(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
                return rotary(q, k)

            ops.append(Op("rope", lambda c: _auto(c, (i, "rope"), rope, ["q", "k"], ["q", "k"])))
        ops += [
            Op("attention", lambda c: _auto(c, (i, "attn"), attention, ["q", "k", "v"], ["y"])),
            Op("linear_proj", lambda c: _auto(c, (i, "proj"), att.proj, ["y"], ["p"],
                                              list(att.proj.parameters()))),
            CommSpec("fwd", "p", (i, "ar1")),
            Op("bda", lambda c: residual_add(c, (i, "bda2"), lay.proj_bias)),
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
