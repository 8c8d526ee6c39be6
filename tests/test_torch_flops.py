"""Cross-check the analytic per-layer FLOPs of :mod:`workloads.graph_builder` against
``torch.utils.flop_counter.FlopCounterMode`` on the real
:class:`workloads.torch_model.TransformerLayer` (tiny shapes, CPU, float32), and sanity-check the
layer itself (shape, causality, TP sharding).

What torch counts (torch/utils/flop_counter.py, checked against torch 2.13):

- ``aten.mm`` / ``aten.addmm``: ``2·M·K·N``, the analytic GEMM convention. ``nn.Linear`` on a
  ``[b, s, h]`` input folds to one ``mm`` (``addmm`` with a bias); its backward is one ``mm`` for
  the input gradient and one for the weight gradient (bias gradients are reductions, not counted).
- SDPA (``sdpa_flop`` for the flash / efficient / cuDNN kernels): ``sdpa_flop_count`` counts
  QK^T and PV over the *full* ``s_q x s_k`` score matrix; the source says "NB: We aren't
  accounting for causal attention here" and ignores ``is_causal``. The analytic model counts half
  the matrix for causal attention, so ``analytic == torch / 2`` exactly.
- SDPA backward (``sdpa_backward_flop_count``): five matmuls of the forward's size (recomputed
  scores, dP = dO·V^T, dV = P^T·dO, dQ = dS·K, dK = dS^T·Q) against the forward's two, i.e.
  exactly 2.5x the forward: the same 2.5x convention graph_builder uses, so again
  ``analytic == torch / 2`` (causality) and ``torch_bwd == 2.5 · torch_fwd``.
- On CPU, SDPA runs ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its ``_backward``),
  which torch's registry does not list (those ops would count 0 FLOPs). We map them to the same
  formulas torch applies to the CUDA kernels (``sdpa_flop_count`` / ``sdpa_backward_flop_count``),
  so the attention numbers here are torch's own GPU-kernel formulas on the CPU kernel's shapes.
  :func:`test_math_sdpa_counts_full_matrix` is an independent check that needs no mapping: the
  math SDPA backend is plain ``bmm``s over the full score matrix (forward 2x analytic; its
  autograd backward, without recomputation, 2x its forward).
"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import (
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from kareus.graph import ComputeOp
from workloads.graph_builder import _LayerOps
from workloads.models import ModelSpec
from workloads.parallel import ParallelConfig, Workload
from workloads.torch_model import TransformerLayer, tensor_parallel_ops

aten = torch.ops.aten

MBS, SEQ = 2, 64

SPECS = {
    # GPT-3 style: GELU MLP with biases, LayerNorm, learned positions (no RoPE), MHA.
    "gpt3": ModelSpec("tiny-gpt3", hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=256,
                      layers=2, vocab=256, native_seq=64, mlp="gelu", norm="layernorm",
                      rope=False, tied_embeddings=True),
    # Llama style: SwiGLU, RMSNorm, RoPE, GQA (2 query heads per KV head).
    "llama": ModelSpec("tiny-llama", hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128,
                       layers=2, vocab=256, native_seq=64, mlp="swiglu", norm="rmsnorm"),
    # Qwen 3 style: as Llama plus per-head QK RMSNorm, and heads * head_dim != hidden.
    "qwen3": ModelSpec("tiny-qwen3", hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=128,
                       layers=2, vocab=256, native_seq=64, mlp="swiglu", norm="rmsnorm",
                       qk_norm=True),
}

#: The CPU flash-attention ops, counted with torch's own SDPA formulas (see module docstring).
_CPU_SDPA_FLOPS = {
    aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *args, **kwargs: sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad_out, q, k, v, *args, **kwargs: sdpa_backward_flop_count(grad_out, q, k, v),
}
_GEMM_OPS = {aten.mm, aten.addmm}
_ATTN_FWD = aten._scaled_dot_product_flash_attention_for_cpu
_ATTN_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward

#: graph_builder op name -> the TransformerLayer submodule that runs it.
_MODULE_OF = {
    "linear_qkv": "TransformerLayer.attn.qkv",
    "linear_proj": "TransformerLayer.attn.proj",
    "linear_fc1": "TransformerLayer.mlp.fc1",
    "linear_fc2": "TransformerLayer.mlp.fc2",
}


def _workload(spec: ModelSpec, tp: int) -> Workload:
    return Workload(model=spec, parallel=ParallelConfig(
        tp=tp, cp=1, pp=1, mbs=MBS, seq=SEQ, microbatches=1, nanobatches=1))


def _analytic(spec: ModelSpec, tp: int) -> dict[str, dict[str, float]]:
    """Analytic FLOPs per op name, forward and backward (``*_dgrad`` / ``*_wgrad`` summed)."""
    ops = _LayerOps(spec, _workload(spec, tp), b=MBS)
    out: dict[str, dict[str, float]] = {}
    for direction, items in (("fwd", ops.forward()), ("bwd", ops.backward())):
        flops: dict[str, float] = {}
        for op in items:
            if isinstance(op, ComputeOp) and op.kind != "memory":
                name = op.name.removesuffix("_dgrad").removesuffix("_wgrad")
                name = "attention" if op.kind == "attention" else name
                flops[name] = flops.get(name, 0.0) + op.flops
        out[direction] = flops
    return out


def _counted(spec: ModelSpec, tp: int) -> tuple[dict, dict]:
    """FlopCounterMode counts ``{module: {op: flops}}`` of the forward and of the backward."""
    torch.manual_seed(0)
    layer = TransformerLayer(spec, tp=tp)
    x = torch.randn(MBS, SEQ, spec.hidden, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=_CPU_SDPA_FLOPS) as counter:
        y = layer(x)
        fwd = copy.deepcopy(counter.get_flop_counts())
        y.square().mean().backward()
        total = counter.get_flop_counts()
    assert x.grad is not None and layer.attn.qkv.weight.grad is not None
    bwd = {
        mod: {op: n - fwd.get(mod, {}).get(op, 0) for op, n in ops.items()}
        for mod, ops in total.items()
    }
    return fwd, bwd


CASES = [(name, tp) for name in SPECS for tp in (1, 2)]


@pytest.mark.parametrize(("name", "tp"), CASES, ids=[f"{n}-tp{t}" for n, t in CASES])
def test_flops_match_flop_counter(name: str, tp: int) -> None:
    spec = SPECS[name]
    analytic = _analytic(spec, tp)
    fwd, bwd = _counted(spec, tp)
    hq, d = spec.heads // tp, spec.head_dim

    # Only GEMMs and SDPA may carry FLOPs: a norm, RoPE or activation written as a matmul (or
    # attention falling back to bmm) would show up here.
    fwd_ops = {op for op, n in fwd["Global"].items() if n}
    bwd_ops = {op for op, n in bwd["Global"].items() if n}
    assert fwd_ops - _GEMM_OPS == {_ATTN_FWD} and aten.mm in fwd_ops
    assert bwd_ops - _GEMM_OPS == {_ATTN_BWD} and aten.mm in bwd_ops

    # GEMMs: each linear exactly, forward and backward (dgrad + wgrad), and their sum.
    for op_name, module in _MODULE_OF.items():
        assert analytic["fwd"][op_name] == sum(fwd[module].values()), (op_name, "forward")
        assert analytic["bwd"][op_name] == sum(bwd[module].values()), (op_name, "backward")
    gemm_fwd = sum(n for op, n in fwd["Global"].items() if op in _GEMM_OPS)
    gemm_bwd = sum(n for op, n in bwd["Global"].items() if op in _GEMM_OPS)
    assert sum(analytic["fwd"][k] for k in _MODULE_OF) == gemm_fwd
    assert sum(analytic["bwd"][k] for k in _MODULE_OF) == gemm_bwd
    assert gemm_bwd == 2 * gemm_fwd

    # Attention: torch counts the full s x s matrix (ignores is_causal), the analytic model half.
    attn_fwd, attn_bwd = fwd["Global"][_ATTN_FWD], bwd["Global"][_ATTN_BWD]
    assert attn_fwd == 4 * MBS * hq * SEQ * SEQ * d
    assert analytic["fwd"]["attention"] == attn_fwd / 2
    # Backward: torch's five-matmul formula is exactly 2.5x its forward, the analytic convention.
    assert attn_bwd * 2 == attn_fwd * 5
    assert analytic["bwd"]["attention"] == attn_bwd / 2
    assert analytic["bwd"]["attention"] == 2.5 * analytic["fwd"]["attention"]


def test_math_sdpa_counts_full_matrix() -> None:
    """Independent of the CPU-op mapping: the math SDPA backend is bmm over the full matrix."""
    spec, tp = SPECS["llama"], 1  # GQA: the math path expands K, V to all query heads
    analytic = _analytic(spec, tp)
    torch.manual_seed(0)
    layer = TransformerLayer(spec, tp=tp)
    x = torch.randn(MBS, SEQ, spec.hidden, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        y = layer(x)
        fwd_bmm = counter.get_flop_counts()["Global"][aten.bmm]
        y.sum().backward()
        bwd_bmm = counter.get_flop_counts()["Global"][aten.bmm] - fwd_bmm
    assert fwd_bmm == 2 * analytic["fwd"]["attention"]
    assert bwd_bmm == 2 * fwd_bmm  # no recomputation of the scores in the math backward


@pytest.mark.parametrize("name", list(SPECS))
def test_layer_shape_and_causality(name: str) -> None:
    spec = SPECS[name]
    torch.manual_seed(0)
    layer = TransformerLayer(spec, tp=1)
    x = torch.randn(MBS, SEQ, spec.hidden)
    with torch.no_grad():
        y = layer(x)
        cut = SEQ // 2
        x2 = x.clone()
        x2[:, cut:] += torch.randn_like(x2[:, cut:])
        y2 = layer(x2)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y2[:, :cut], y[:, :cut], rtol=0, atol=1e-6)
    assert (y2[:, cut:] - y[:, cut:]).abs().max() > 1e-3
    # Token 0 sees only itself: the layer is not a per-token map that would pass trivially.
    x3 = x.clone()
    x3[:, 0] += torch.randn_like(x3[:, 0])
    with torch.no_grad():
        assert (layer(x3)[:, 1:] - y[:, 1:]).abs().max() > 1e-4


def _shard_state(full: TransformerLayer, spec: ModelSpec, tp: int, r: int) -> dict:
    """Rank ``r``'s shard of a ``tp=1`` layer's parameters (Megatron's contiguous layout)."""
    d, hq, hkv, f = spec.head_dim, spec.heads // tp, spec.kv_heads // tp, spec.ffn // tp
    q_w, kv_w = spec.heads * d, spec.kv_heads * d
    qkv_rows = torch.cat([
        torch.arange(r * hq * d, (r + 1) * hq * d),
        q_w + torch.arange(r * hkv * d, (r + 1) * hkv * d),
        q_w + kv_w + torch.arange(r * hkv * d, (r + 1) * hkv * d),
    ])
    fc1_rows = torch.arange(r * f, (r + 1) * f)
    if spec.mlp == "swiglu":
        fc1_rows = torch.cat([fc1_rows, spec.ffn + fc1_rows])
    sd = {k: v.clone() for k, v in full.state_dict().items()}
    sd["attn.qkv.weight"] = sd["attn.qkv.weight"][qkv_rows]
    if "attn.qkv.bias" in sd:
        sd["attn.qkv.bias"] = sd["attn.qkv.bias"][qkv_rows]
    sd["attn.proj.weight"] = sd["attn.proj.weight"][:, r * hq * d:(r + 1) * hq * d]
    sd["mlp.fc1.weight"] = sd["mlp.fc1.weight"][fc1_rows]
    if "mlp.fc1.bias" in sd:
        sd["mlp.fc1.bias"] = sd["mlp.fc1.bias"][fc1_rows]
    sd["mlp.fc2.weight"] = sd["mlp.fc2.weight"][:, r * f:(r + 1) * f]
    return sd


@pytest.mark.parametrize("name", list(SPECS))
def test_tensor_parallel_shards_reproduce_full_layer(name: str) -> None:
    """Two TP ranks (threads, summing through a barrier) give the full layer's output and input
    gradient: heads, GQA groups, SwiGLU halves and post-all-reduce biases are sharded right."""
    spec, tp = SPECS[name], 2
    torch.manual_seed(0)
    full = TransformerLayer(spec, tp=1)
    with torch.no_grad():  # non-trivial biases and norm scales
        for p in full.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(MBS, SEQ, spec.hidden)
    x_full = x.clone().requires_grad_()
    y_full = full(x_full)
    y_full.square().mean().backward()

    barrier = threading.Barrier(tp, timeout=30)
    slots: list[torch.Tensor | None] = [None] * tp
    results: list[tuple | BaseException | None] = [None] * tp

    def rank(r: int) -> None:
        def all_reduce_(t: torch.Tensor) -> None:
            slots[r] = t.clone()
            barrier.wait()
            total = sum(slots[1:], slots[0].clone())  # type: ignore[union-attr]
            barrier.wait()
            t.copy_(total)

        try:
            shard = TransformerLayer(spec, tp=tp)
            shard.load_state_dict(_shard_state(full, spec, tp, r))
            xr = x.clone().requires_grad_()
            y = shard(xr, *tensor_parallel_ops(all_reduce_))
            y.square().mean().backward()
            results[r] = (y.detach(), xr.grad)
        except BaseException as e:  # surfaced in the main thread
            barrier.abort()
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for res in results:
        if isinstance(res, BaseException):
            raise res
        y, grad = res  # type: ignore[misc]
        torch.testing.assert_close(y, y_full.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grad, x_full.grad, rtol=1e-5, atol=1e-6)
