"""The stage engine: forward and backward instructions of one pipeline stage on one TP rank --
the partition chain with launch slots, recomputation, embedding and vocab-parallel loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kareus.backends.gpu.engine.collectives import Comm, Work, blocking_reduce
from kareus.backends.gpu.engine.ops import (LayerProgram, NanoCtx, Segment, cut_segments,
                                            residual_add)
from kareus.backends.gpu.engine.streams import Streams
from kareus.backends.gpu.engine.tape import Tape, ResidualAddEntry
from workloads.torch_model import GPTStage, Hook, tensor_parallel_ops


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
        layers = stage.transformer_layers()
        self.programs = [LayerProgram(lay, i, layers[i - 1] if i else None, i == len(layers) - 1,
                                      self.tp) for i, lay in enumerate(layers)]
        self.first = stage.wte is not None
        self.last = stage.out is not None
        reduce = blocking_reduce(self.comm)
        self._ar_fwd: Hook | None = None
        self._ar_bwd: Hook | None = None
        if self.comm:
            self._ar_fwd, self._ar_bwd = tensor_parallel_ops(reduce)

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

    def _reduction(self, t: Tensor | None, sms: int | None) -> Callable[[], Work]:
        """The all-reduce of ``t`` (on the communicator of ``sms`` SMs), ready to launch."""
        assert t is not None
        return lambda: self._all_reduce(t, sms)

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
            self.streams.join(self.streams.launch(self._reduction(pending, sms), True))
            launched = True
        for i, op in enumerate(seg.ops):
            if not launched and i == slot:
                handle = self.streams.launch(self._reduction(pending, sms), True)
                launched = True
            op.run(ctx)
            if handle is not None and i == end:
                self.streams.join(handle)
                handle = None
        if not launched:  # slot past the last op: launch at the end
            handle = self.streams.launch(self._reduction(pending, sms), True)
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
                    self.streams.launch(self._reduction(t, None), False)
            if seg.after is not None:
                seg.after(ctx)
        if pending is not None and flush:
            self.streams.join(self.streams.launch(self._reduction(pending, first_sms), True))
            pending = None
        return pending

    def segment_items(self, direction: str, layers: Sequence[int], ctxs: list[NanoCtx],
                      nanobatched: bool, hooks: Callable[[Segment], Segment] = lambda s: s
                      ) -> list[tuple[Segment, NanoCtx, str | None]]:
        """The chain :meth:`run_chain` runs for ``direction`` over ``layers``: each segment
        (through ``hooks``) once per nanobatch context, with its partition's key when
        ``nanobatched`` (``None`` otherwise)."""
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

    def split_nanobatches(self, x: Tensor, nanobatched: bool) -> list[Tensor]:
        """``x`` cut along the batch into this stage's nanobatches (itself when not
        ``nanobatched``)."""
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
        ctxs = [NanoCtx(st={"x": part}) for part in self.split_nanobatches(x, nb)]
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
            self.run_chain(self.segment_items("forward", range(len(self.programs)), ctxs, nb, save),
                           nb, sched)
            top = self.programs[-1].layer
            outs = []
            for ctx in ctxs:
                residual_add(ctx, ("final",), top.fc2_bias)
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
        gparts = self.split_nanobatches(grad_out, nb)
        ctxs = []
        for fctx, g in zip(state.ctxs, gparts):
            tape = Tape(keep=keep)
            ctx = NanoCtx(st={}, tape=tape, ckpts=fctx.ckpts)
            ctx.out_ref = torch.empty(0, device=g.device)
            tape.grads[id(ctx.out_ref)] = g
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
                        assert ctx.out_ref is not None
                        ctx.tape.entries[("final",)] = ResidualAddEntry(
                            [x, p], self.programs[layer].layer.fc2_bias, ctx.out_ref)
                    else:
                        ctx.tape.rebind((layer + 1, "bda1"), [x, p])
                seg = Segment(seg.prefix, seg.name, layer, seg.ops, seg.comm, seg.before, after)
            return seg

        order = list(layers) if layers is not None else list(range(n_layers - 1, -1, -1))
        return ctxs, self.segment_items("backward", order, ctxs, nb, hook)

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
    def forward(ctx, logits: Tensor, targets: Tensor, vocab_start: int,
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
    def backward(ctx, g: Tensor):
        soft, idx, inside = ctx.saved_tensors
        grad = soft.clone()
        grad[torch.arange(grad.shape[0], device=grad.device), idx] -= inside.float()
        grad = grad * (g / grad.shape[0])
        return grad.view(ctx.shape).to(ctx.dtype), None, None, None
