"""Model shapes of the GPT-style workloads the suite knows.

A :class:`ModelSpec` is the architecture of one decoder-only transformer: everything the iteration
graph needs to count FLOPs and bytes, and everything the torch implementation in
:mod:`workloads.torch_model` needs to build the same block. Shapes come from the models' published
configurations (GPT-3 paper, Table 2.1; Llama 3.2 / 3.3 and Qwen 3 ``config.json`` files); any other
dense decoder comes from its own ``config.json`` (:mod:`workloads.hf_config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal



@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one decoder-only transformer.

    Attributes:
        name: Registry name, e.g. ``"llama3.2-3b"``.
        hidden: Model width ``d_model``.
        heads: Number of attention (query) heads.
        kv_heads: Number of key/value heads (``== heads`` without GQA).
        head_dim: Width of one head.
        ffn: Width of the MLP's hidden layer (per branch for SwiGLU).
        layers: Number of transformer layers.
        vocab: Vocabulary size.
        native_seq: Sequence length the suite uses by default (tokens).
        mlp: ``"gelu"`` (two matrices) or ``"swiglu"`` (gate, up and down matrices).
        norm: ``"layernorm"`` (GPT-3) or ``"rmsnorm"`` (Llama, Qwen).
        qk_norm: Whether queries and keys are RMS-normalised per head (Qwen 3).
        rope: Rotary position embeddings (``False``: learned absolute positions, GPT-3, unless
            ``alibi``).
        tied_embeddings: Input embedding and output layer share weights.
        alibi: ALiBi attention (Bloom): a per-head linear bias on the attention scores, applied
            inside the attention kernel; no position embedding and no rotary op.
        embedding_norm: A LayerNorm right after the token embedding (Bloom's
            ``word_embeddings_layernorm``).
        gelu: How eager code computes a GELU MLP's activation (``--elementwise eager``; ignored
            for SwiGLU and for fused kernels): ``"gelu_new"`` (GPT-2's tanh approximation as a
            chain of elementwise kernels), ``"bloom"`` (Bloom's own chain and hand-written
            backward) or ``"torch"`` (``torch.nn.functional.gelu``, one kernel each way).
        max_positions: The positions a model with learned absolute positions has a table for
            (tokens; ``None``: ``native_seq``, as for the built-in GPT-3 models).
    """

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int
    native_seq: int
    mlp: Literal["gelu", "swiglu"]
    norm: Literal["layernorm", "rmsnorm"]
    qk_norm: bool = False
    rope: bool = True
    tied_embeddings: bool = False
    alibi: bool = False
    embedding_norm: bool = False
    gelu: Literal["gelu_new", "bloom", "torch"] = "gelu_new"
    max_positions: int | None = None

    @property
    def positions(self) -> int:
        """Length of the learned position table (tokens): :attr:`max_positions`, else
        :attr:`native_seq`."""
        return self.max_positions or self.native_seq

    @property
    def q_width(self) -> int:
        """Width of the query projection output (``heads * head_dim``)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of one of the key / value projection outputs."""
        return self.kv_heads * self.head_dim

    def layer_tensors(self) -> tuple[tuple[str, int], ...]:
        """Parameters of one transformer layer by weight, in the order the layer uses them
        (Megatron-core's module order: each linear with its bias, GPT-3 keeping biases; the
        norm scales (and shifts); SwiGLU's gate and up projections as one ``fc1``)."""
        h = self.hidden
        norm = self.norm_params()
        biased = self.linear_biases
        qkv_out = self.q_width + 2 * self.kv_width
        mlp_mats = 3 if self.mlp == "swiglu" else 2
        return (("input_norm", norm),
                ("qkv", h * qkv_out + (qkv_out if biased else 0)),
                ("qk_norm", 2 * self.head_dim if self.qk_norm else 0),
                ("proj", self.q_width * h + (h if biased else 0)),
                ("mlp_norm", norm),
                ("fc1", (mlp_mats - 1) * h * self.ffn + (self.ffn if biased else 0)),
                ("fc2", self.ffn * h + (h if biased else 0)))

    def norm_params(self) -> int:
        """Parameters of one norm over the hidden width: LayerNorm's scale and shift, RMSNorm's
        scale."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)

    def tp_replicated_layer_params(self, sequence_parallel: bool) -> int:
        """Parameters of one layer that every TP rank holds whole but computes only part of the
        gradient of, which Megatron-core therefore all-reduces over the TP group
        (``_allreduce_layernorm_grads``): the per-head q/k norm scales (each rank sees its own
        heads), and under sequence parallelism (each rank sees its own tokens) also the norms
        and the row-parallel GEMMs' biases (GPT-3's ``proj`` and ``fc2``)."""
        tensors = dict(self.layer_tensors())
        params = tensors["qk_norm"]
        if sequence_parallel:
            row_biases = 2 * self.hidden if self.linear_biases else 0  # proj's and fc2's
            params += tensors["input_norm"] + tensors["mlp_norm"] + row_biases
        return params

    @property
    def linear_biases(self) -> bool:
        """Whether the linear layers keep their biases: the GELU models (GPT-3, Bloom) do, the
        SwiGLU ones (Llama, Qwen) have none."""
        return self.mlp == "gelu"

    def layer_params(self) -> int:
        """Parameters of one transformer layer (weights, biases for GPT-3, norm scales)."""
        return sum(n for _, n in self.layer_tensors())

    def embedding_norm_params(self) -> int:
        """Parameters of the LayerNorm after the token embedding (its scale and shift; Bloom's),
        0 without one."""
        return 2 * self.hidden if self.embedding_norm else 0

    def embedding_params(self) -> int:
        """Parameters of the input embedding (and learned positions for GPT-3)."""
        pos = 0 if self.rope or self.alibi else self.positions * self.hidden
        norm = self.embedding_norm_params()
        return self.vocab * self.hidden + pos + norm

    def total_params(self) -> int:
        """All parameters, output layer included unless tied."""
        out = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (self.layers * self.layer_params() + self.embedding_params() + out
                + self.norm_params())


def _gpt3(name: str, hidden: int, heads: int, layers: int) -> ModelSpec:
    return ModelSpec(
        name=name, hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads,
        ffn=4 * hidden, layers=layers, vocab=50257, native_seq=2048, mlp="gelu",
        norm="layernorm", rope=False, tied_embeddings=True,
    )


#: Every model the suite knows, by registry name.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # GPT-3 paper (Brown et al. 2020), Table 2.1: n_layers, d_model, n_heads; d_ff = 4 d_model.
        _gpt3("gpt3-xl", 2048, 16, 24),
        _gpt3("gpt3-2.7b", 2560, 32, 32),
        _gpt3("gpt3-6.7b", 4096, 32, 32),
        _gpt3("gpt3-13b", 5120, 40, 40),
        _gpt3("gpt3-175b", 12288, 96, 96),
        # meta-llama/Llama-3.2-3B config.json
        ModelSpec("llama3.2-3b", hidden=3072, heads=24, kv_heads=8, head_dim=128, ffn=8192,
                  layers=28, vocab=128256, native_seq=4096, mlp="swiglu", norm="rmsnorm",
                  tied_embeddings=True),
        # Qwen/Qwen3-1.7B config.json
        ModelSpec("qwen3-1.7b", hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144,
                  layers=28, vocab=151936, native_seq=4096, mlp="swiglu", norm="rmsnorm",
                  qk_norm=True, tied_embeddings=True),
        # meta-llama/Llama-3.3-70B-Instruct config.json
        ModelSpec("llama3.3-70b", hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
                  layers=80, vocab=128256, native_seq=4096, mlp="swiglu", norm="rmsnorm"),
    )
}
