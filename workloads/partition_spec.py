"""A single partition described by a spec file, as the Kareus artifact's partition sweeps are.

The artifact (``shared/kareus_artifact/attention_partition/spec.json``) measured one forward
attention partition: the compute of one nanobatch (a list of named ops) on one GPU of a
tensor-parallel group, with the other nanobatch's collective on a side stream. A
:class:`PartitionSpec` reads that description, checks that it is consistent, and builds the
:class:`~kareus.graph.Partition` the simulator runs, with the same FLOP and byte counting as the
iteration graph (:mod:`workloads.graph_builder`).

Spec format (JSON)::

    {"model": {"hidden_size", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "attention": "causal" | "full",
               "position_embedding": "rope" | "learned" | "none", "norm": "layernorm" | "rmsnorm"},
     "tp": 2, "batch_size": 4, "nanobatch_size": 2, "seq_len": 4096, "dtype": "fp16",
     "ops": ["bias_dropout_add", "layernorm", "qkv_linear", "qkv_split", "rope",
             "flash_attention", "out_proj_linear"],
     "comm": {"kind": "all_reduce", "group_size": 2, "bytes": 33554432, "library": "msccl++"},
     "fuse_ops": false,
     "description", "window", "energy": free text}

**Windows count the fuser's basic ops, not the spec's op names.** The Kareus fuser
(``AttentionFuser`` in the artifact) flattens each of Transformer Engine's fused operations into
its basic operations and numbers the windows over those; a ``Linear`` is two, its GEMM
(``BasicLinear``) and its ``Bias``. With ``fuse_ops`` false (the artifact's harness builds
``AttentionFuser(..., fuse_ops=False)``, and it is the default here) the bias is a kernel of its
own where it is applied (the QKV projection), and launches nothing where it is returned for a
later fusion (the output projection, ``return_bias=True``: Megatron-LM adds it in the next
bias-dropout-add), so the partition above runs eight kernels: BDA, LayerNorm, QKV GEMM, QKV bias,
QKV split, RoPE, attention, output GEMM, and window index 6 is the attention. With ``fuse_ops``
true the bias rides in the GEMM's epilogue and each linear is one op.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kareus.graph import Collective, CommOp, ComputeOp, Partition
from kareus.inputs import file_problem, loads_json
from workloads.errors import WorkloadError
from workloads.graph_builder import (attention_op, dropout_op, gemm_op, label_slots, memory_op,
                                     norm_op)

#: Bytes per element of each supported dtype.
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
_TOP = {"description", "model", "tp", "batch_size", "nanobatch_size", "seq_len", "dtype", "ops",
        "comm", "fuse_ops", "window", "energy"}
_REQUIRED = {"model", "tp", "batch_size", "nanobatch_size", "seq_len", "dtype", "ops", "comm"}
_MODEL = {"hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "attention", "position_embedding", "norm", "head_dim"}
_COMM = {"kind", "group_size", "bytes", "library"}
_COLLECTIVES: tuple[Collective, ...] = ("all_reduce", "all_gather", "reduce_scatter")
#: Fields that only describe (free text): they do not enter the spec's hash.
_FREE_TEXT = {"description", "window", "energy"}


def _bad(path: str, msg: str) -> WorkloadError:
    return WorkloadError(f"{path}: {msg}")


def _int(obj: dict, key: str, where: str, path: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _bad(path, f"{where}{key} must be a positive integer, got {v!r}")
    return v


@dataclass(frozen=True)
class PartitionSpec:
    """One measured partition's shapes (per GPU of a tensor-parallel group).

    Attributes:
        hidden, heads, kv_heads, head_dim: Model width, query heads, key/value heads, head width.
        tp: Tensor-parallel degree (heads are split over it).
        batch, nanobatch: Micro-batch and nanobatch sizes (sequences).
        seq: Sequence length (tokens).
        dtype: ``fp16``, ``bf16`` or ``fp32``.
        ops: Compute op names in program order (each one or more kernels, see
            :meth:`partition`).
        comm_kind, comm_group, comm_bytes: The overlapped collective (bytes per GPU).
        causal: Causal attention.
        fuse_ops: The fuser fuses each linear's bias into its GEMM (otherwise the bias is a basic
            op of its own and the window indices count it).
        sha256: Hash of the spec's canonical JSON without its free-text fields (ties a
            calibration to the partition it measured, whatever its description says).
    """

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    tp: int
    batch: int
    nanobatch: int
    seq: int
    dtype: str
    ops: tuple[str, ...]
    comm_kind: Collective
    comm_group: int
    comm_bytes: int
    causal: bool
    sha256: str
    fuse_ops: bool = False

    @staticmethod
    def load(path: str | Path) -> "PartitionSpec":
        """Read and validate a spec file; raises :class:`WorkloadError` with one line."""
        p = str(path)
        why = file_problem(path)
        if why is not None:
            raise _bad(p, "no such file" if why == "does not exist" else why)
        try:
            raw = loads_json(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _bad(p, f"not a JSON spec ({type(e).__name__})") from None
        return PartitionSpec.from_dict(raw, p)

    @staticmethod
    def from_dict(raw: object, path: str = "spec") -> "PartitionSpec":
        """Validate a parsed spec (see the module docstring for the format)."""
        spec, model, comm = _objects(raw, path)
        tp = _int(spec, "tp", "", path)
        hidden, heads, kv, head_dim = _model_dims(model, tp, path)
        batch = _int(spec, "batch_size", "", path)
        nano = _int(spec, "nanobatch_size", "", path)
        if batch % nano or batch // nano != 2:
            raise _bad(path, f"nanobatch_size {nano} must be half of batch_size {batch} "
                             "(two nanobatches)")
        seq = _int(spec, "seq_len", "", path)
        dtype = spec["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise _bad(path, f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        ops = _ops(spec["ops"], path)
        _model_words(model, ops, path)
        kind, group, nbytes = _comm(comm, tp, (nano, seq, hidden, DTYPE_BYTES[dtype]), path)
        fuse_ops = spec.get("fuse_ops", False)
        if not isinstance(fuse_ops, bool):
            raise _bad(path, f"fuse_ops must be true or false, got {fuse_ops!r}")
        # ``fuse_ops`` at its default is left out, so writing it or not gives the same hash
        canon = json.dumps({k: v for k, v in spec.items()
                            if k not in _FREE_TEXT and not (k == "fuse_ops" and v is False)},
                           sort_keys=True, separators=(",", ":"))
        return PartitionSpec(
            hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim, tp=tp, batch=batch,
            nanobatch=nano, seq=seq, dtype=dtype, ops=ops, comm_kind=kind,
            comm_group=group, comm_bytes=nbytes,
            causal=model.get("attention", "causal") == "causal",
            sha256=hashlib.sha256(canon.encode()).hexdigest(), fuse_ops=fuse_ops)

    @property
    def tokens(self) -> int:
        """Tokens of one nanobatch on one GPU."""
        return self.nanobatch * self.seq

    def partition(self) -> Partition:
        """The partition the simulator runs: the kernels of one nanobatch, in the order and
        numbering of the fuser's basic ops (see the module docstring), and the collective of the
        other nanobatch."""
        ops = [op for name in self.ops for op in _OP_BUILDERS[name](self)]
        comm = CommOp(f"tp_{self.comm_kind}", self.comm_kind, float(self.comm_bytes),
                      self.comm_group, intra_node=True)
        return Partition(key="spec/0", compute=label_slots(ops), comm=comm)


def _qkv_width(s: PartitionSpec) -> int:
    return (s.heads + 2 * s.kv_heads) // s.tp * s.head_dim


def _attention(s: PartitionSpec) -> ComputeOp:
    hq, hkv = s.heads // s.tp, s.kv_heads // s.tp
    return attention_op("flash_attention", s.nanobatch, hq, hkv, s.head_dim, s.seq, s.seq,
                        causal=s.causal, elem_bytes=DTYPE_BYTES[s.dtype])


def _linear(name: str, shape: Callable[[PartitionSpec], tuple[int, int, int]],
            bias: Literal["applied", "returned"]) -> "OpBuilder":
    """A Transformer Engine ``Linear`` of ``shape(spec) = (M, K, N)``: its GEMM, then its bias as
    the fuser runs it: ``"applied"`` adds it in a kernel of its own (reading and writing the
    output) unless ``fuse_ops``, when the GEMM's epilogue adds it; ``"returned"`` hands it on and
    launches nothing."""
    def build(s: PartitionSpec) -> tuple[ComputeOp, ...]:
        eb = DTYPE_BYTES[s.dtype]
        m, k, n = shape(s)
        gemm = gemm_op(name, m, k, n, eb)
        if bias == "returned" or s.fuse_ops:
            return (gemm,)
        return gemm, memory_op(name + "_bias", 2 * eb * m * n, float(m * n))
    return build


OpBuilder = Callable[[PartitionSpec], tuple[ComputeOp, ...]]


def _one(build: Callable[[PartitionSpec], ComputeOp]) -> OpBuilder:
    return lambda s: (build(s),)


_OP_BUILDERS: dict[str, OpBuilder] = {
    # residual + bias + dropout: read input and residual, write output (+ a 1-byte dropout mask);
    # the mask is drawn by ``aten.native_dropout`` (PyTorch's fused dropout kernel, whose grid
    # fills the GPU once)
    "bias_dropout_add": _one(lambda s: dropout_op(
        "bda", (3 * DTYPE_BYTES[s.dtype] + 1) * s.tokens * s.hidden, 2.0 * s.tokens * s.hidden)),
    "layernorm": _one(lambda s: norm_op("norm", 2 * DTYPE_BYTES[s.dtype] * s.tokens * s.hidden,
                                        5.0 * s.tokens * s.hidden)),
    "rmsnorm": _one(lambda s: norm_op("norm", 2 * DTYPE_BYTES[s.dtype] * s.tokens * s.hidden,
                                      4.0 * s.tokens * s.hidden)),
    "qkv_linear": _linear("linear_qkv", lambda s: (s.tokens, s.hidden, _qkv_width(s)), "applied"),
    # split the fused QKV output into contiguous Q, K, V (read and write each once)
    "qkv_split": _one(lambda s: memory_op("qkv_split", 2 * DTYPE_BYTES[s.dtype] * s.tokens
                                          * _qkv_width(s))),
    "rope": _one(lambda s: memory_op(
        "rope", 2 * DTYPE_BYTES[s.dtype] * s.tokens * (s.heads + s.kv_heads) // s.tp
        * s.head_dim, 3.0 * s.tokens * (s.heads + s.kv_heads) // s.tp * s.head_dim)),
    "flash_attention": _one(_attention),
    "out_proj_linear": _linear("linear_proj",
                               lambda s: (s.tokens, s.heads // s.tp * s.head_dim, s.hidden),
                               "returned"),
}

#: Op names a spec may use.
KNOWN_OPS = tuple(_OP_BUILDERS)


def _objects(raw: object, path: str) -> tuple[dict, dict, dict]:
    """The spec and its ``model`` and ``comm`` objects, after checking every field name."""
    if not isinstance(raw, dict):
        raise _bad(path, "the spec must be a JSON object")
    unknown = sorted(set(raw) - _TOP)
    if unknown:
        raise _bad(path, f"unknown field(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(_TOP))}")
    missing = sorted(_REQUIRED - set(raw))
    if missing:
        raise _bad(path, f"missing field(s) {', '.join(missing)}")
    model, comm = raw["model"], raw["comm"]
    if not isinstance(model, dict) or not isinstance(comm, dict):
        raise _bad(path, "model and comm must be JSON objects")
    for name, obj, known in (("model", model, _MODEL), ("comm", comm, _COMM)):
        bad = sorted(set(obj) - known)
        if bad:
            raise _bad(path, f"unknown {name} field(s) {', '.join(bad)}; known: "
                             f"{', '.join(sorted(known))}")
    if model.get("attention", "causal") not in ("causal", "full"):
        raise _bad(path, f"model.attention must be causal or full, got "
                         f"{model.get('attention')!r}")
    return raw, model, comm


def _model_dims(model: dict, tp: int, path: str) -> tuple[int, int, int, int]:
    """``(hidden, heads, key/value heads, head dim)`` of the spec's model, split over ``tp``."""
    hidden = _int(model, "hidden_size", "model.", path)
    heads = _int(model, "num_attention_heads", "model.", path)
    kv = _int(model, "num_key_value_heads", "model.", path) \
        if "num_key_value_heads" in model else heads
    if hidden % heads:
        raise _bad(path, f"hidden_size {hidden} is not divisible by {heads} heads")
    head_dim = _int(model, "head_dim", "model.", path) if "head_dim" in model \
        else hidden // heads
    if heads % kv:
        raise _bad(path, f"{heads} heads are not divisible by {kv} key/value heads")
    if heads % tp or kv % tp:
        raise _bad(path, f"{heads} heads / {kv} key/value heads are not divisible by tp={tp}")
    return hidden, heads, kv, head_dim


#: The values the model's descriptive fields may take (``attention``: :func:`_objects`).
_MODEL_WORDS = {"position_embedding": ("rope", "learned", "none"),
                "norm": ("layernorm", "rmsnorm")}


def _model_words(model: dict, ops: tuple[str, ...], path: str) -> None:
    """Check the model's descriptive fields: each one of :data:`_MODEL_WORDS`' values, a norm
    and a position embedding that are the ops the partition runs, and an ``intermediate_size`` (the MLP's width, not
    in an attention partition) that is a positive integer when given."""
    for key, allowed in _MODEL_WORDS.items():
        if key in model and model[key] not in allowed:
            raise _bad(path, f"model.{key} {model[key]!r} is not one of {', '.join(allowed)}")
    run = [o for o in ops if o in _MODEL_WORDS["norm"]]
    if "norm" in model and run and run[0] != model["norm"]:
        raise _bad(path, f"model.norm is {model['norm']!r} but the ops run {run[0]!r}")
    if "rope" in ops and model.get("position_embedding", "rope") != "rope":
        raise _bad(path, f"model.position_embedding is {model['position_embedding']!r} but the "
                         f"ops run rope")
    if "intermediate_size" in model:
        _int(model, "intermediate_size", "model.", path)


def _ops(ops: object, path: str) -> tuple[str, ...]:
    """The spec's op names, each one the fuser knows."""
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) for o in ops):
        raise _bad(path, "ops must be a non-empty list of op names")
    unknown_ops = [o for o in ops if o not in _OP_BUILDERS]
    if unknown_ops:
        raise _bad(path, f"unknown op(s) {', '.join(unknown_ops)}; known: "
                         f"{', '.join(_OP_BUILDERS)}")
    return tuple(ops)


def _comm(comm: dict, tp: int, activation: tuple[int, int, int, int], path: str
          ) -> tuple[Collective, int, int]:
    """``(kind, group size, bytes)`` of the spec's collective; an all-reduce runs over the
    tensor-parallel group on the other nanobatch's activation, ``activation`` = (nanobatch,
    sequence, hidden, bytes per element)."""
    kind_name = comm.get("kind")
    kind = next((c for c in _COLLECTIVES if c == kind_name), None)
    if kind is None:
        raise _bad(path, f"comm.kind {kind_name!r} is not one of {', '.join(_COLLECTIVES)}")
    group = _int(comm, "group_size", "comm.", path)
    nbytes = _int(comm, "bytes", "comm.", path)
    if group < 2:
        raise _bad(path, "comm.group_size must be at least 2")
    if kind == "all_reduce":
        if group != tp:
            raise _bad(path, f"an all-reduce over the tensor-parallel group needs "
                             f"comm.group_size == tp ({tp}), got {group}")
        expect = math.prod(activation)
        if nbytes != expect:
            raise _bad(path, f"comm.bytes {nbytes} does not match the other nanobatch's "
                             f"activation: {' x '.join(map(str, activation))} B = {expect}")
    return kind, group, nbytes
