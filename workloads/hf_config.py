"""A Hugging Face ``config.json`` as a :class:`~workloads.models.ModelSpec`.

``-w PATH`` (a ``config.json`` or a folder holding one) names a model the suite does not ship. The
file is read with transformers' ``AutoConfig`` (the optional extra ``.[hf]``; nothing is
downloaded: ``local_files_only``) and mapped to the fields the iteration graph and the torch model
use. Supported are dense decoder-only families:

- ``llama``, ``mistral``, ``qwen2``, ``qwen3``: RMSNorm, RoPE, SwiGLU (``hidden_act`` silu),
  grouped-query attention; ``qwen3`` adds the per-head QK RMSNorm. Ignored, as they change neither
  the shapes nor (measurably) the work: the QKV bias of ``qwen2`` and ``attention_bias`` /
  ``mlp_bias`` of ``llama`` (the spec counts no biases for these families), RoPE scaling, and the
  sliding window of ``mistral`` / ``qwen2`` (attention is costed as full causal attention).
- ``gpt2``: ``n_embd``, ``n_head``, ``n_layer``, ``n_inner`` (``None``: 4 x ``n_embd``),
  learned positions (no RoPE), LayerNorm, GELU, biases, tied embeddings.
- ``bloom``: ``n_embed`` (``hidden_size``), ``n_head``, ``n_layer``, ``vocab_size`` (all four
  required: Bloom's config has no defaults worth trusting), ALiBi attention (no position
  embedding), LayerNorm, the LayerNorm after the word embedding, GELU MLP of 4x the width,
  biases, tied embeddings; default sequence 2048 (its training length; ALiBi has no limit).
- ``gpt_neox``: LayerNorm, GELU, biases, rotary embeddings (a partial rotary fraction counts as
  RoPE), ``tie_word_embeddings``. The parallel residual (``use_parallel_residual``) is ignored:
  the layer is costed and built as the sequential pre-norm block, which has the same matrices.

``head_dim`` is the config's when it gives one, else transformers' default for the family when
its config class has one (Qwen3: 128), else ``hidden_size / num_attention_heads``;
``num_key_value_heads`` is what transformers' config class gives when the file omits it (the
model transformers would build): the number of heads for Llama and GPT families (no GQA), the
class's own default for others (Mistral 8, Qwen2 and Qwen3 32).

Default sequence length (``native_seq``): ``min(max_position_embeddings, 4096)``, i.e. the
model's context when it is short (GPT-2: 1024) and 4096 otherwise (Llama 3.2 3B: 131072 -> 4096,
the built-in ``llama3.2-3b``'s default). ``--seq`` overrides it.

Name: the last component of the config's ``_name_or_path`` when it has one; else, for a file
named ``config.json``, the folder holding it (a hub cache snapshot
``models--org--name/snapshots/<hash>`` gives ``name``); else the file's stem; lower-cased, with characters other than letters, digits, ``.``, ``_`` and
``-`` replaced by ``-``, and ``-hf`` appended when it would equal a built-in model's name (so its
results never overwrite the built-in's ``results/<name>/``).

Refused with one line naming what is unsupported: mixture-of-experts models, encoder-decoder
models, and every other ``model_type``. Missing files, malformed JSON and missing, non-positive or
contradictory sizes are refused the same way (:class:`WorkloadError`, exit status 2). The sizes
(:data:`REQUIRED_SIZES`) must be in the file itself: transformers' ``AutoConfig`` fills any it
lacks from the family's defaults, so ``{"model_type": "llama"}`` alone would become a 6.7B model;
such a file is refused, naming the fields it lacks.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from kareus.inputs import file_problem, loads_json
from workloads.errors import WorkloadError
from workloads.models import MODELS, ModelSpec

#: The ``model_type`` values this module maps.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "bloom")
#: Bloom's size fields, every one required in the file (``hidden_size`` may be ``n_embed``).
_BLOOM_SIZES = (("n_embed", "hidden_size"), ("n_head", "num_attention_heads"),
                ("n_layer", "num_hidden_layers"), ("vocab_size",))
#: Bloom's training sequence length, the default ``native_seq`` (ALiBi sets no context limit).
_BLOOM_SEQ = 2048
#: Families whose MLP is gated (gate, up, down) with RMSNorm and RoPE.
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
#: Keys that only mixture-of-experts configs carry.
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
             "moe_intermediate_size", "moe_layer_freq", "n_shared_experts")
#: Sizes a config must give itself (transformers' names; each family's aliases apply, e.g.
#: gpt2's ``n_embd``), plus ``intermediate_size`` for every family but gpt2 (whose ``n_inner``
#: may be absent or null: 4 x ``n_embd``). Absent, transformers would silently fill in its own
#: defaults (a Llama config with none of them is a 6.7B model).
REQUIRED_SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
#: The default sequence length is the model's context, capped at this many tokens.
NATIVE_SEQ_CAP = 4096
#: The largest size a config may give (a 32-bit index's reach); larger ones describe no model
#: and would overflow the arithmetic of the costs.
MAX_SIZE = 2**31 - 1
#: Pip's name for the optional dependency.
EXTRA_HINT = "pip install -e '.[hf]'"


def looks_like_path(name: str) -> bool:
    """Whether ``name`` (not a built-in model) names a file or folder rather than a model."""
    if not name.strip():
        return False  # an empty name names nothing (not the current folder)
    if os.sep in name or "/" in name or name.endswith(".json"):
        return True
    try:
        return Path(name).exists()
    except OSError:  # a name too long to look up can only have been meant as a path
        return True


def config_file(path: str | os.PathLike[str]) -> Path:
    """The ``config.json`` that ``path`` names (itself, or the one in the folder ``path``)."""
    p = Path(path).expanduser()
    why = file_problem(p)
    if why == "is a folder, not a file":
        why = file_problem(p / "config.json")
        if why == "does not exist":
            raise WorkloadError(f"folder {path} holds no config.json")
        if why is not None:
            raise WorkloadError(f"{p / 'config.json'} {why}")
        return p / "config.json"
    if why is not None:
        raise WorkloadError(f"config file {path} {why}")
    return p


def workload_ref(name: str) -> str:
    """What to store to rebuild ``name``'s workload in another process or a later run: a built-in
    model's name as is, a config path as the absolute path of its ``config.json``."""
    if name in MODELS or not looks_like_path(name):
        return name
    return str(config_file(name).resolve())


def read_raw(path: str | os.PathLike[str]) -> tuple[Path, dict[str, object]]:
    """The config file ``path`` names and its JSON object (raises :class:`WorkloadError`)."""
    file = config_file(path)
    try:
        raw = loads_json(file.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"cannot read {file}: {e}") from None
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise WorkloadError(f"{file} is not a JSON object (a model config)")
    return file, raw


def refusal(raw: Mapping[str, object]) -> str | None:
    """Why the architecture ``raw`` describes is unsupported (``None``: it is supported)."""
    model_type = raw.get("model_type")
    if raw.get("is_encoder_decoder"):
        return f"encoder-decoder models are not supported (model_type {model_type!r})"
    moe = [k for k in _MOE_KEYS if raw.get(k)]
    if moe or (isinstance(model_type, str) and re.search(r"moe|mixtral|deepseek|dbrx", model_type)):
        why = f"{moe[0]} = {raw[moe[0]]}" if moe else f"model_type {model_type!r}"
        return f"mixture of experts is not supported ({why}); dense decoders only"
    if model_type is None or model_type == "":
        return f"no model_type given; supported: {', '.join(SUPPORTED)}"
    if not isinstance(model_type, str):
        return (f"model_type must be a family's name, got {model_type!r}; supported: "
                f"{', '.join(SUPPORTED)}")
    if model_type not in SUPPORTED:
        return f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}"
    return None


def model_name(file: Path, raw: Mapping[str, object]) -> str:
    """The derived model's name (rule in the module docstring)."""
    given = raw.get("_name_or_path")
    base = ""
    if isinstance(given, str) and given.strip("/\\ "):
        base = re.split(r"[/\\]", given.strip("/\\ "))[-1]
    elif file.name == "config.json":
        folder = file.resolve().parent
        base = folder.name
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
            base = folder.parent.parent.name.split("--")[-1]
    if not base:
        base = file.stem
    name = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip(".-") or "hf-model"
    return f"{name}-hf" if name in MODELS else name


def load_model(path: str | os.PathLike[str]) -> ModelSpec:
    """The :class:`ModelSpec` of the Hugging Face config ``path`` (a file or its folder).

    Raises :class:`WorkloadError` (one line) for a missing or malformed file, an unsupported
    architecture, missing / non-positive / contradictory sizes, or transformers not installed.
    """
    file, raw = read_raw(path)
    why = refusal(raw)
    if why:
        raise WorkloadError(f"{file}: {why}")
    try:
        from transformers import AutoConfig
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        raise WorkloadError(f"reading a Hugging Face config needs transformers: {EXTRA_HINT}") \
            from None
    model_type = str(raw["model_type"])  # a supported family's name (refusal() checked it)
    if model_type not in CONFIG_MAPPING:
        import transformers

        raise WorkloadError(f"{file}: transformers {transformers.__version__} does not know "
                            f"model_type {model_type!r}; upgrade it: {EXTRA_HINT}")
    if model_type == "bloom":
        missing = [" or ".join(names) for names in _BLOOM_SIZES
                   if all(raw.get(n) is None for n in names)]
        if missing:
            raise WorkloadError(f"{file}: a bloom config must give {', '.join(missing)}")
        for names in _BLOOM_SIZES:
            given = {n: raw[n] for n in names if raw.get(n) is not None}
            for n, value in given.items():
                _check_positive_int(file, n, value)
            if len(set(given.values())) > 1:
                both = " and ".join(f"{n} = {v}" for n, v in given.items())
                raise WorkloadError(f"{file}: {both} contradict each other; give one")
    head_dim_default = _class_default(CONFIG_MAPPING[model_type], "head_dim")
    _check_raw(file, raw, CONFIG_MAPPING[model_type].attribute_map, head_dim_default)
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warnings (e.g. token ids) are not about the shapes
    try:
        cfg = AutoConfig.from_pretrained(str(file), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' validators raise many kinds
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise WorkloadError(f"{file}: transformers rejects it: "
                            f"{lines[-1] if lines else type(e).__name__}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return _spec(file, raw, cfg, head_dim_default)


def _class_default(config_class: type, name: str) -> object:
    """The default of argument ``name`` of a transformers config class (``None`` when it has no
    such argument, or derives the value from others, as Llama's ``head_dim``)."""
    import inspect

    parameter = inspect.signature(config_class.__init__).parameters.get(name)
    return None if parameter is None or parameter.default is inspect.Parameter.empty \
        else parameter.default


def _check_positive_int(file: Path, key: str, value: object) -> None:
    """Refuse (one line naming the file and ``key``) a size that is not a positive integer of
    at most :data:`MAX_SIZE`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkloadError(f"{file}: {key} must be a positive integer, got {value!r}")
    if value > MAX_SIZE:
        raise WorkloadError(f"{file}: {key} ({len(str(value))} digits) is larger than any "
                            f"model's (at most {MAX_SIZE:,})")


def _check_raw(file: Path, raw: Mapping[str, object], alias: Mapping[str, str],
               head_dim_default: object = None) -> None:
    """Sizes the file gives must be positive integers that divide as attention needs, checked
    before transformers (some of its versions divide by them, or accept them silently); the
    hidden size must divide into the heads unless a head size is given or the family's class
    has its own default (``head_dim_default``)."""
    def get(field: str) -> tuple[str, object]:
        key = alias.get(field, field)
        return key, raw.get(key)

    for field, key in alias.items():  # e.g. gpt2's n_layer beside num_hidden_layers
        if key != field and raw.get(key) is not None and raw.get(field) is not None \
                and raw[key] != raw[field]:
            raise WorkloadError(f"{file}: {key} = {raw[key]!r} and {field} = {raw[field]!r} "
                                "contradict each other; give one")
    # gpt2's MLP width defaults to 4x (n_inner None); bloom's sizes are checked by their own names
    required = () if raw["model_type"] == "bloom" else REQUIRED_SIZES + (
        () if raw["model_type"] == "gpt2" else ("intermediate_size",))
    missing = [alias.get(f, f) for f in required if raw.get(alias.get(f, f)) is None]
    if missing:
        raise WorkloadError(f"{file}: missing size field(s) {', '.join(missing)}; the file must "
                            f"give them (transformers would fill in its "
                            f"{raw['model_type']} defaults, a different model)")

    sizes: dict[str, tuple[str, int | None]] = {}  # field -> (the file's key, its value)
    for field, optional in (("hidden_size", False), ("num_attention_heads", False),
                            ("num_hidden_layers", False), ("vocab_size", False),
                            ("num_key_value_heads", True), ("head_dim", True),
                            ("intermediate_size", True), ("n_inner", True),
                            ("max_position_embeddings", True)):
        key, value = get(field)
        if value is None and (optional or key not in raw):
            sizes[field] = key, None
            continue
        _check_positive_int(file, key, value)
        sizes[field] = key, value
    (hk, hidden), (ak, heads), (kk, kv) = (sizes["hidden_size"], sizes["num_attention_heads"],
                                           sizes["num_key_value_heads"])
    if heads is not None and kv is not None and heads % kv:
        raise WorkloadError(f"{file}: {ak} = {heads} is not divisible by {kk} = {kv}")
    if (raw.get("head_dim") is None and head_dim_default is None and hidden is not None
            and heads is not None and hidden % heads):
        raise WorkloadError(f"{file}: {hk} = {hidden} is not divisible by {ak} = {heads} "
                            "(and no head_dim is given)")


class _HFConfig(Protocol):
    """What :func:`_spec` reads of every transformers config (the family's own fields are
    read with ``getattr``)."""

    @property
    def model_type(self) -> str: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_attention_heads(self) -> int: ...

    @property
    def num_hidden_layers(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...


def _spec(file: Path, raw: Mapping[str, object], cfg: _HFConfig,
          head_dim_default: object = None) -> ModelSpec:
    """Map a transformers config of a supported family to a validated :class:`ModelSpec`
    (``head_dim_default``: the family's config class's default head size, or ``None``)."""
    family = cfg.model_type
    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    if "num_key_value_heads" not in raw and heads % kv_heads:
        raise WorkloadError(f"{file}: gives no num_key_value_heads, and transformers' {family} "
                            f"default, {kv_heads}, does not divide its {heads} attention heads")
    head_dim = (getattr(cfg, "head_dim", None)
                if raw.get("head_dim") is not None or head_dim_default is not None else None)
    if head_dim is None:
        if hidden % heads:
            raise WorkloadError(f"{file}: hidden size {hidden} is not divisible by {heads} "
                                "attention heads (and no head_dim is given)")
        head_dim = hidden // heads
    # RoPE and ALiBi models run at the file's own context (under its family's name for it),
    # not the class default transformers fills in when the file gives none; a model with learned
    # positions has the table transformers builds, given or not (below)
    key = getattr(cfg, "attribute_map", {}).get("max_position_embeddings",
                                                "max_position_embeddings")
    given = raw.get(key) is not None or raw.get("max_position_embeddings") is not None
    table = getattr(cfg, "max_position_embeddings", None)
    context = table if given else None
    native_seq = min(context or NATIVE_SEQ_CAP, NATIVE_SEQ_CAP)
    tied_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
    mlp: Literal["gelu", "swiglu"]
    norm: Literal["layernorm", "rmsnorm"]
    qk_norm = alibi = embedding_norm = False
    gelu: Literal["gelu_new", "bloom", "torch"] = "gelu_new"
    if family == "bloom":
        native_seq = _BLOOM_SEQ  # tied unless the file unties them (transformers' default)
        ffn, mlp, norm, rope, alibi, embedding_norm = 4 * hidden, "gelu", "layernorm", False, \
            True, True
        gelu = "bloom"
    elif family in _LLAMA_LIKE:
        act = getattr(cfg, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise WorkloadError(f"{file}: hidden_act {act!r} is not supported for {family} "
                                "(gated MLP: SwiGLU, silu, only)")
        ffn, mlp, norm = getattr(cfg, "intermediate_size"), "swiglu", "rmsnorm"
        qk_norm, rope = family == "qwen3", True
    else:  # gpt2, gpt_neox
        act = getattr(cfg, "activation_function" if family == "gpt2" else "hidden_act", "gelu")
        if not str(act).startswith("gelu"):
            raise WorkloadError(f"{file}: activation {act!r} is not supported for {family} "
                                "(GELU only)")
        ffn = (getattr(cfg, "n_inner") or 4 * hidden) if family == "gpt2" \
            else getattr(cfg, "intermediate_size")
        mlp, norm, rope = "gelu", "layernorm", family == "gpt_neox"
        # GPT-2's gelu_new / gelu_fast are chains of elementwise ops in eager code; "gelu" and
        # "gelu_pytorch_tanh" call torch's one GELU kernel
        gelu = "gelu_new" if act in ("gelu_new", "gelu_fast") else "torch"
    if not (rope or alibi):
        context = table
        native_seq = min(context or NATIVE_SEQ_CAP, NATIVE_SEQ_CAP)
    spec = ModelSpec(name=model_name(file, raw), hidden=hidden, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, layers=cfg.num_hidden_layers, vocab=cfg.vocab_size,
                     native_seq=native_seq, tied_embeddings=tied_embeddings, ffn=ffn, mlp=mlp,
                     norm=norm, qk_norm=qk_norm, rope=rope, alibi=alibi,
                     embedding_norm=embedding_norm, gelu=gelu,
                     max_positions=None if rope or alibi else context)
    _check_spec(file, spec)
    return spec


def _check_spec(file: Path, m: ModelSpec) -> None:
    """Every size positive, and KV heads dividing heads (also for values from the defaults)."""
    for field in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "layers", "vocab",
                  "native_seq"):
        _check_positive_int(file, field, getattr(m, field))
    if m.heads % m.kv_heads:
        raise WorkloadError(f"{file}: {m.heads} attention heads are not divisible by "
                            f"{m.kv_heads} key/value heads")
