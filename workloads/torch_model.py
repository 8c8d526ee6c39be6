"""The torch implementation of the suite's GPT-style models, as one tensor-parallel rank runs them.

This is the model code the GPU backend executes (bf16, CUDA, under ``torch.distributed``) and the
code :mod:`workloads.graph_builder`'s analytic op list describes. It is written nanoGPT style: one
readable module per block, Megatron-LM's tensor-parallel layout.

Tensor parallelism (Megatron): every rank of a TP group of size ``tp`` holds

- ``heads / tp`` query heads and ``kv_heads / tp`` key/value heads (contiguous: rank ``r`` holds
  query heads ``[r·hq, (r+1)·hq)`` and the key/value heads of their GQA groups);
- a column-parallel fused QKV projection ``[hidden] -> [(hq + 2·hkv)·head_dim]`` and a
  row-parallel output projection ``[hq·head_dim] -> [hidden]``;
- a column-parallel FC1 (``ffn / tp`` columns, twice that for SwiGLU's gate and up) and a
  row-parallel FC2 ``[ffn / tp] -> [hidden]``;
- the full (replicated) norms and the biases of the row-parallel layers, which are added once,
  *after* the all-reduce.

The two TP collectives are injected, so that this module needs no process group:

- ``allreduce`` runs on the partial outputs of the row-parallel layers (after the attention
  projection and after FC2): all-reduce in forward, identity in backward (Megatron's ``g``);
- ``grad_allreduce`` runs on the normed inputs of the column-parallel layers (before QKV and FC1):
  identity in forward, all-reduce of the gradient in backward (Megatron's ``f``).

Both default to the identity (``tp == 1``, or a FLOP / shape check). :func:`tensor_parallel_ops`
turns one in-place all-reduce (e.g. ``functools.partial(torch.distributed.all_reduce,
group=tp_group)``) into the pair of autograd-correct callables; an asynchronous backend passes its
own. Dropout is omitted (modern pretraining runs use none; it moves no FLOPs).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workloads.models import ModelSpec

#: A TP collective hook: takes a tensor, returns the tensor to continue with.
Hook = Callable[[Tensor], Tensor]


def _identity(x: Tensor) -> Tensor:
    return x


def _local(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ValueError(f"{what} ({n}) is not divisible by TP={tp}")
    return n // tp


# -- tensor-parallel collectives -----------------------------------------------------------------


class _AllReduceForward(torch.autograd.Function):
    """All-reduce in forward, identity in backward (the output of a row-parallel layer)."""

    @staticmethod
    def forward(ctx, x: Tensor,
                all_reduce_: Callable[[Tensor], object]) -> Tensor:
        out = x.clone()
        all_reduce_(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _AllReduceBackward(torch.autograd.Function):
    """Identity in forward, all-reduce of the gradient in backward (input of a column-parallel
    layer: each rank's input gradient is a partial sum over its shard of the columns)."""

    @staticmethod
    def forward(ctx, x: Tensor,
                all_reduce_: Callable[[Tensor], object]) -> Tensor:
        ctx.all_reduce_ = all_reduce_
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        out = grad.clone()
        ctx.all_reduce_(out)
        return out, None


def tensor_parallel_ops(all_reduce_: Callable[[Tensor], object]) -> tuple[Hook, Hook]:
    """The ``(allreduce, grad_allreduce)`` hooks of :meth:`TransformerLayer.forward` built from one
    in-place sum all-reduce over the TP group, e.g.
    ``functools.partial(torch.distributed.all_reduce, group=tp_group)``."""
    return (
        lambda x: _AllReduceForward.apply(x, all_reduce_),
        lambda x: _AllReduceBackward.apply(x, all_reduce_),
    )


# -- building blocks -------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension with a learned scale (Llama, Qwen)."""

    def __init__(self, dim: int, eps: float = 1e-6, **factory) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``[..., dim]`` -> same shape."""
        if hasattr(F, "rms_norm"):  # torch >= 2.4: fused kernel
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def _norm(spec: ModelSpec, dim: int, eps: float, **factory) -> nn.Module:
    if spec.norm == "layernorm":
        return nn.LayerNorm(dim, eps=eps, **factory)
    return RMSNorm(dim, eps=eps, **factory)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, "rotate half" layout (Llama / Qwen / Megatron default)."""

    def __init__(self, head_dim: int, theta: float, device=None) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device,
                                                dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: tuple[int, torch.dtype, Tensor, Tensor] | None = None

    def _cos_sin(self, seq: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        if self._cache is None or self._cache[:2] != (seq, dtype) or \
                self._cache[2].device != self.inv_freq.device:
            pos = torch.arange(seq, device=self.inv_freq.device, dtype=torch.float32)
            angles = pos[:, None] * self.inv_freq[None, :]  # [seq, head_dim / 2]
            angles = torch.cat((angles, angles), dim=-1)  # [seq, head_dim]
            # [1, seq, 1, head_dim]: broadcasts over batch and heads
            self._cache = (seq, dtype, angles.cos()[None, :, None, :].to(dtype),
                           angles.sin()[None, :, None, :].to(dtype))
        return self._cache[2], self._cache[3]

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``q``: ``[b, s, hq, d]``, ``k``: ``[b, s, hkv, d]`` -> rotated, same shapes."""
        cos, sin = self._cos_sin(q.shape[1], q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# -- the layer -------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Causal self-attention of one TP rank: fused QKV (column parallel), optional per-head QK
    RMSNorm and RoPE, SDPA (flash on CUDA) with GQA, output projection (row parallel).

    The output projection's bias (GPT-3) is not applied here: it belongs after the TP all-reduce,
    see :class:`TransformerLayer`.
    """

    def __init__(self, spec: ModelSpec, tp: int, rope_theta: float, norm_eps: float,
                 **factory) -> None:
        super().__init__()
        self.hq = _local(spec.heads, tp, "attention heads")
        self.hkv = _local(spec.kv_heads, tp, "key/value heads")
        self.d = spec.head_dim
        bias = spec.mlp == "gelu"  # GPT-3 keeps biases; Llama / Qwen have none
        self.qkv = nn.Linear(spec.hidden, (self.hq + 2 * self.hkv) * self.d, bias=bias, **factory)
        self.proj = nn.Linear(self.hq * self.d, spec.hidden, bias=False, **factory)
        self.q_norm = RMSNorm(self.d, norm_eps, **factory) if spec.qk_norm else None
        self.k_norm = RMSNorm(self.d, norm_eps, **factory) if spec.qk_norm else None
        self.rope = RotaryEmbedding(self.d, rope_theta, factory.get("device")) if spec.rope \
            else None

    def forward(self, x: Tensor) -> Tensor:
        """``x``: normed input ``[b, s, hidden]`` -> partial (pre-all-reduce) ``[b, s, hidden]``."""
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], -1)
        q = q.view(b, s, self.hq, self.d)
        k = k.view(b, s, self.hkv, self.d)
        v = v.view(b, s, self.hkv, self.d)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, k)
        # [b, heads, s, d] for SDPA; query head i attends with key/value head i // (hq / hkv)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.hq == self.hkv:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        y = y.transpose(1, 2).reshape(b, s, self.hq * self.d)
        return self.proj(y)


class MLP(nn.Module):
    """The MLP of one TP rank: FC1 (column parallel) -> GELU or SwiGLU -> FC2 (row parallel).

    For SwiGLU, FC1 produces the gate and the up branch side by side (``2 · ffn / tp`` columns).
    FC2's bias (GPT-3) is applied after the TP all-reduce, see :class:`TransformerLayer`.
    """

    def __init__(self, spec: ModelSpec, tp: int, **factory) -> None:
        super().__init__()
        self.swiglu = spec.mlp == "swiglu"
        ffn = _local(spec.ffn, tp, "FFN width")
        self.fc1 = nn.Linear(spec.hidden, 2 * ffn if self.swiglu else ffn,
                             bias=not self.swiglu, **factory)
        self.fc2 = nn.Linear(ffn, spec.hidden, bias=False, **factory)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: normed input ``[b, s, hidden]`` -> partial (pre-all-reduce) ``[b, s, hidden]``."""
        h = self.fc1(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


class TransformerLayer(nn.Module):
    """One pre-norm transformer layer as one tensor-parallel rank holds and runs it.

    Order (Megatron-LM)::

        x -> norm1 -> [grad_allreduce] -> qkv -> (qk_norm) -> (rope) -> attention -> proj
          -> [allreduce] -> + proj bias + x
          -> norm2 -> [grad_allreduce] -> fc1 -> act -> fc2 -> [allreduce] -> + fc2 bias + residual

    Args:
        spec: The model.
        tp: Tensor-parallel degree; the layer holds rank-local shards (``heads / tp`` query heads,
            ``kv_heads / tp`` KV heads, ``ffn / tp`` MLP columns).
        dtype: Parameter dtype (bf16 on the GPU).
        device: Parameter device.
        rope_theta: RoPE base (500000 for Llama 3, 1e6 for Qwen 3; FLOPs do not depend on it).
        norm_eps: Epsilon of the norms.
        init_std: Standard deviation of the weights (GPT-2/3 init); the two row-parallel
            projections use ``init_std / sqrt(2 · layers)``.
    """

    def __init__(self, spec: ModelSpec, tp: int = 1, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, *, rope_theta: float = 500_000.0,
                 norm_eps: float = 1e-5, init_std: float = 0.02) -> None:
        super().__init__()
        factory = {"dtype": dtype, "device": device}
        self.spec, self.tp = spec, tp
        self.norm1 = _norm(spec, spec.hidden, norm_eps, **factory)
        self.attn = Attention(spec, tp, rope_theta, norm_eps, **factory)
        self.norm2 = _norm(spec, spec.hidden, norm_eps, **factory)
        self.mlp = MLP(spec, tp, **factory)
        # Biases of the row-parallel layers: replicated, added once after the all-reduce.
        has_bias = spec.mlp == "gelu"
        self.proj_bias = nn.Parameter(torch.zeros(spec.hidden, **factory)) if has_bias else None
        self.fc2_bias = nn.Parameter(torch.zeros(spec.hidden, **factory)) if has_bias else None
        self._init_weights(init_std)

    @torch.no_grad()
    def _init_weights(self, std: float) -> None:
        for lin in (self.attn.qkv, self.mlp.fc1):
            nn.init.normal_(lin.weight, 0.0, std)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for lin in (self.attn.proj, self.mlp.fc2):
            nn.init.normal_(lin.weight, 0.0, std / math.sqrt(2 * self.spec.layers))

    def forward(self, x: Tensor, allreduce: Hook | None = None,
                grad_allreduce: Hook | None = None) -> Tensor:
        """``x``: ``[batch, seq, hidden]`` (the full hidden width on every TP rank) -> same shape.

        Args:
            allreduce: Sum over the TP group of the row-parallel outputs (forward all-reduce,
                identity backward); ``None`` is the identity.
            grad_allreduce: Identity forward, sum of the input gradient of the column-parallel
                layers over the TP group in backward; ``None`` is the identity.
        """
        reduce = allreduce or _identity
        copy = grad_allreduce or _identity
        a = reduce(self.attn(copy(self.norm1(x))))
        x = x + (a + self.proj_bias if self.proj_bias is not None else a)
        m = reduce(self.mlp(copy(self.norm2(x))))
        return x + (m + self.fc2_bias if self.fc2_bias is not None else m)


# -- a pipeline stage ------------------------------------------------------------------------------


class GPTStage(nn.Module):
    """The layers of one pipeline stage on one TP rank, with the vocab-parallel input embedding
    (first stage: token ids ``[b, s]`` in) and final norm + vocab-parallel output layer (last
    stage: the rank's logit shard ``[b, s, ceil(vocab / tp)]`` out; the vocab-parallel
    cross-entropy is the caller's). Other stages map ``[b, s, hidden]`` to ``[b, s, hidden]``.

    The vocabulary is padded to a multiple of ``tp``. With tied embeddings and the first and last
    stage on one rank the output layer reuses the embedding; across stages the caller keeps the
    two copies' gradients in sync (as Megatron-LM does).
    """

    def __init__(self, spec: ModelSpec, num_layers: int, *, first: bool, last: bool, tp: int = 1,
                 tp_rank: int = 0, max_seq: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 **layer_kwargs) -> None:
        super().__init__()
        if spec.alibi:
            from workloads.errors import WorkloadError

            raise WorkloadError(f"{spec.name}: the torch model has no ALiBi attention yet; "
                                "simulate it instead (--backend sim)")
        factory = {"dtype": dtype, "device": device}
        self.vocab_local = -(-spec.vocab // tp)
        self.vocab_start = tp_rank * self.vocab_local
        self.wte = nn.Embedding(self.vocab_local, spec.hidden, **factory) if first else None
        self.wpe = nn.Embedding(max_seq or spec.positions, spec.hidden, **factory) \
            if first and not spec.rope else None
        self.layers = nn.ModuleList(
            TransformerLayer(spec, tp, dtype, device, **layer_kwargs) for _ in range(num_layers))
        self.norm = _norm(spec, spec.hidden, layer_kwargs.get("norm_eps", 1e-5), **factory) \
            if last else None
        self.out: nn.Linear | None = None
        if last:
            self.out = nn.Linear(spec.hidden, self.vocab_local, bias=False, **factory)
            if spec.tied_embeddings and self.wte is not None:
                self.out.weight = self.wte.weight
        for emb in (self.wte, self.wpe):
            if emb is not None:
                nn.init.normal_(emb.weight, 0.0, 0.02)
        if self.out is not None and self.out.weight is not getattr(self.wte, "weight", None):
            nn.init.normal_(self.out.weight, 0.0, 0.02)

    def transformer_layers(self) -> list[TransformerLayer]:
        """The stage's transformer layers, in order (``layers``, typed)."""
        out: list[TransformerLayer] = []
        for lay in self.layers:
            if not isinstance(lay, TransformerLayer):  # pragma: no cover - built above
                raise TypeError(f"stage layer is a {type(lay).__name__}")
            out.append(lay)
        return out

    def forward(self, x: Tensor, allreduce: Hook | None = None,
                grad_allreduce: Hook | None = None) -> Tensor:
        """``x``: token ids ``[b, s]`` on the first stage, else ``[b, s, hidden]``."""
        reduce = allreduce or _identity
        if self.wte is not None:
            local = x - self.vocab_start
            outside = (local < 0) | (local >= self.vocab_local)
            h = self.wte(local.masked_fill(outside, 0)).masked_fill(outside[..., None], 0.0)
            x = reduce(h)  # each token's row lives on exactly one rank
            if self.wpe is not None:
                x = x + self.wpe(torch.arange(x.shape[1], device=x.device))[None]
        for layer in self.layers:
            x = layer(x, allreduce, grad_allreduce)
        if self.norm is not None and self.out is not None:
            copy = grad_allreduce or _identity
            x = self.out(copy(self.norm(x)))
        return x
