"""Any Hugging Face model as a workload (workloads/hf_config.py): ``-w PATH`` with a config.json.

The configs are hand-written fixtures under tests/fixtures/ (nothing is downloaded): Llama 3.2 3B's
published config.json must give exactly the built-in ``llama3.2-3b``, the small qwen3 / gpt2 /
gpt_neox ones the mapping of each family, and the rest a one-line refusal (exit status 2).
Tests that read a config skip without transformers, except the one that checks the error naming
the extra.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import reproduce
from kareus.backends.sim import SimulatorBackend
from kareus.cli import main
from kareus.errors import WorkloadError
from kareus.hardware.presets import DEFAULT_GPU, get_preset
from kareus.plan import IterationPlan
from workloads import MODELS, get_model, make_workload, workload_ref
from workloads.graph_builder import build_iteration_graph
from workloads.parallel import Workload

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LLAMA = FIXTURES / "llama3.2-3b"
BAD = FIXTURES / "bad"


@pytest.fixture()
def hf():
    """Skip the test without transformers (the optional extra ``.[hf]``)."""
    return pytest.importorskip("transformers")


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, **fields: object) -> Path:
    """A config.json in its own folder under ``tmp_path``."""
    folder = tmp_path / str(fields.get("_folder", "model"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {k: v for k, v in fields.items() if k != "_folder"}))
    return folder


def simulate_default_plan(workload):  # noqa: ANN001, ANN201
    """``kareus simulate``'s iteration: the Megatron-LM plan at max clock on the default GPU."""
    preset = get_preset(DEFAULT_GPU)
    graph = build_iteration_graph(workload)
    plan = IterationPlan.uniform(graph, preset.clock_max_mhz, label="megatron")
    return SimulatorBackend(preset).evaluate_plan(graph, plan)


# ------------------------------------------------------------------ Llama 3.2 3B = the built-in


def test_llama_config_gives_the_builtin_model(hf):
    for path in (LLAMA, LLAMA / "config.json", str(LLAMA) + "/"):
        m = get_model(str(path))
        assert m.name == "llama3.2-3b-hf"  # never the built-in's name (results/<name>/)
        assert replace(m, name="llama3.2-3b") == MODELS["llama3.2-3b"]


def test_llama_config_simulates_the_builtin_iteration(hf):
    ours, builtin = make_workload(str(LLAMA)), make_workload("llama3.2-3b")
    assert ours.parallel == builtin.parallel and ours.stage_layers() == builtin.stage_layers()
    a, b = simulate_default_plan(ours), simulate_default_plan(builtin)
    assert a.energy.time_s == b.energy.time_s
    assert a.energy.total_j == b.energy.total_j and a.energy.dynamic_j == b.energy.dynamic_j
    assert a.model_flops == b.model_flops


def test_llama_config_through_kareus_simulate(hf, capsys):
    code, out, err = run(capsys, "simulate", "-w", str(LLAMA), "--json")
    assert code == 0 and err == ""
    ours = json.loads(out)
    code, out, _ = run(capsys, "simulate", "-w", "llama3.2-3b", "--json")
    builtin = json.loads(out)
    assert ours["workload"] == "llama3.2-3b-hf"
    assert {k: v for k, v in ours.items() if k != "workload"} == \
        {k: v for k, v in builtin.items() if k != "workload"}


# ------------------------------------------------------------------ the other families


def test_qwen3_has_qk_norm_and_its_own_head_dim(hf):
    m = get_model(str(FIXTURES / "qwen3-tiny"))
    assert (m.name, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.layers, m.vocab) == \
        ("qwen3-tiny", 64, 4, 2, 32, 192, 4, 1024)
    assert m.qk_norm and m.rope and m.mlp == "swiglu" and m.norm == "rmsnorm"
    assert m.tied_embeddings and m.native_seq == 4096  # min(40960, 4096)
    assert m.q_width == 128 != m.hidden
    w = make_workload(str(FIXTURES / "qwen3-tiny"))
    assert w.parallel.tp == 2  # TP8 does not divide 4 heads / 2 KV heads: halved until it does


def test_gpt2_learned_positions_layernorm_gelu_tied(hf):
    m = get_model(str(FIXTURES / "gpt2"))
    assert (m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.layers, m.vocab, m.native_seq) == \
        (768, 12, 12, 64, 3072, 12, 50257, 1024)  # n_inner null -> 4 n_embd; n_positions 1024
    assert (m.mlp, m.norm, m.rope, m.qk_norm, m.tied_embeddings) == \
        ("gelu", "layernorm", False, False, True)
    assert m.total_params() == 124_439_808  # GPT-2 small's count, the final LayerNorm's bias in


def test_gpt_neox_rotary_layernorm_gelu_untied(hf):
    m = get_model(str(FIXTURES / "pythia-70m"))
    assert (m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn, m.layers, m.vocab, m.native_seq) == \
        (512, 8, 8, 64, 2048, 6, 50304, 2048)
    assert (m.mlp, m.norm, m.rope, m.tied_embeddings) == ("gelu", "layernorm", True, False)
    assert m.total_params() == 70_426_624  # Pythia-70M


def test_eager_gelu_form_follows_the_config(hf):
    # GPT-2's gelu_new is a chain of eager kernels; GPT-NeoX's "gelu" is torch's one kernel
    assert get_model(str(FIXTURES / "gpt2")).gelu == "gelu_new"
    assert get_model(str(FIXTURES / "pythia-70m")).gelu == "torch"


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_llama_like_families(hf, tmp_path, family):
    path = write(tmp_path, model_type=family, hidden_size=256, intermediate_size=512,
                 num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                 vocab_size=1000, max_position_embeddings=32768, hidden_act="silu",
                 tie_word_embeddings=False, sliding_window=4096, _folder=f"My {family} Model")
    m = get_model(str(path))
    assert m.name == f"my-{family}-model"
    assert (m.heads, m.kv_heads, m.head_dim, m.ffn, m.native_seq) == (8, 2, 32, 512, 4096)
    assert (m.mlp, m.norm, m.rope, m.qk_norm, m.tied_embeddings) == \
        ("swiglu", "rmsnorm", True, False, False)


def test_name_comes_from_name_or_path_then_the_folder(hf, tmp_path):
    base = json.loads((FIXTURES / "qwen3-tiny" / "config.json").read_text())
    named = write(tmp_path, **base, _name_or_path="/scratch/ckpt/Qwen3 Tiny (v2)")
    assert get_model(str(named)).name == "qwen3-tiny-v2"
    snap = write(tmp_path, **base, _folder="models--org--Tiny-Model/snapshots/0123abc")
    assert get_model(str(snap)).name == "tiny-model"
    file = tmp_path / "gpt3-xl.json"  # a name of a built-in model never comes back
    file.write_text(json.dumps(base))
    assert get_model(str(file)).name == "gpt3-xl-hf"


@pytest.mark.parametrize("fixture", ["qwen3-tiny", "pythia-70m"])
def test_derived_spec_builds_the_torch_model(hf, fixture):
    import torch

    from workloads.torch_model import GPTStage, TransformerLayer

    m = get_model(str(FIXTURES / fixture))
    layer = TransformerLayer(m)
    assert sum(p.numel() for p in layer.parameters()) == m.layer_params()
    stage = GPTStage(replace(m, layers=1), 1, first=True, last=True)
    logits = stage(torch.randint(0, m.vocab, (1, 16)))
    assert logits.shape == (1, 16, m.vocab)


# ------------------------------------------------------------------ refusals and bad input


@pytest.mark.parametrize("path,fragment", [
    (FIXTURES / "mixtral-tiny", "mixture of experts is not supported (num_local_experts = 8)"),
    (BAD / "encoder-decoder.json", "encoder-decoder models are not supported"),
    (BAD / "bert.json", "model_type 'bert' is not supported; supported: llama, mistral, qwen2, "
                        "qwen3, gpt2, gpt_neox"),
    (BAD / "no-model-type.json", "no model_type"),
    (BAD / "truncated.json", "is not valid JSON"),
    (BAD / "missing.json", "does not exist"),
    (BAD, "holds no config.json"),
])
def test_refused_without_transformers_too(capsys, path, fragment):
    """What is wrong with the file itself is found before transformers is imported."""
    with pytest.raises(WorkloadError) as e:
        get_model(str(path))
    assert fragment in str(e.value) and "\n" not in str(e.value)
    code, out, err = run(capsys, "simulate", "-w", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and fragment in err


@pytest.mark.parametrize("model_type", ["qwen2_moe", "qwen3_moe", "deepseek_v3", "mixtral"])
def test_moe_model_types_are_refused(tmp_path, model_type):
    with pytest.raises(WorkloadError, match="mixture of experts"):
        get_model(str(write(tmp_path, model_type=model_type, hidden_size=64)))


@pytest.mark.parametrize("name,fragment", [
    ("kv-heads-do-not-divide", "num_attention_heads = 4 is not divisible by "
                               "num_key_value_heads = 3"),
    ("hidden-not-divisible", "hidden_size = 66 is not divisible by num_attention_heads = 4"),
    ("zero-layers", "num_hidden_layers must be a positive integer, got 0"),
    ("negative-vocab", "vocab_size must be a positive integer, got -5"),
    ("relu-mlp", "hidden_act 'relu' is not supported"),
])
def test_contradictory_or_missing_sizes_exit_2_with_one_line(hf, capsys, name, fragment):
    code, out, err = run(capsys, "simulate", "-w", str(BAD / f"{name}.json"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and fragment in err


def test_gpt2_field_names_are_checked(hf, tmp_path):
    base = json.loads((FIXTURES / "gpt2" / "config.json").read_text())
    with pytest.raises(WorkloadError, match="n_embd = 770 is not divisible by n_head = 12"):
        get_model(str(write(tmp_path, **{**base, "n_embd": 770})))
    with pytest.raises(WorkloadError, match="n_head must be a positive integer, got 'x'"):
        get_model(str(write(tmp_path, **{**base, "n_head": "x"})))


def test_missing_transformers_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    with pytest.raises(WorkloadError, match=r"pip install -e '\.\[hf\]'"):
        get_model(str(LLAMA))
    code, out, err = run(capsys, "simulate", "-w", str(LLAMA))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "transformers" in err and "pip install -e '.[hf]'" in err
    assert get_model("llama3.2-3b") is MODELS["llama3.2-3b"]  # built-ins never need it


# ------------------------------------------------------------------ kareus workloads --show


def test_show_a_config_as_json(hf, capsys):
    code, out, err = run(capsys, "workloads", "--show", str(LLAMA), "--json")
    assert code == 0 and err == ""
    obj = json.loads(out)
    assert obj["name"] == "llama3.2-3b-hf" and obj["source"] == str(LLAMA / "config.json")
    assert {k: v for k, v in obj["model"].items() if k != "name"} == \
        {k: v for k, v in asdict(MODELS["llama3.2-3b"]).items() if k != "name"}
    assert obj["params"] == MODELS["llama3.2-3b"].total_params()
    assert obj["default_parallel"]["tp"] == 8 and obj["default_parallel"]["seq"] == 4096
    assert obj["num_gpus"] == 16 and obj["stage_layers"] == [15, 13]


def test_show_text_and_a_builtin_name(hf, capsys):
    code, out, _ = run(capsys, "workloads", "--show", str(FIXTURES / "gpt2"))
    assert code == 0 and "gpt2" in out and "layernorm" in out and "TP4 PP2" in out
    code, out, _ = run(capsys, "workloads", "--show", "qwen3-1.7b", "--json")
    assert code == 0 and json.loads(out)["source"] is None
    code, out, err = run(capsys, "workloads", "--show", "gpt5")
    assert code == 2 and out == "" and "choose one of" in err


# ------------------------------------------------------------------ --strict


TOO_BIG = ["--tp", "1", "--pp", "1", "--mbs", "32"]


def test_strict_refuses_what_does_not_fit(hf, capsys):
    code, out, err = run(capsys, "simulate", "-w", str(LLAMA), *TOO_BIG)
    assert code == 0 and "warning: stage 0 needs about" in out
    code, out, err = run(capsys, "simulate", "-w", str(LLAMA), *TOO_BIG, "--strict")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "does not fit in GPU memory (--strict): stage 0 needs about" in err and "GiB" in err
    code, out, err = run(capsys, "frontier", "-w", "llama3.2-3b", "-o", "megatron", *TOO_BIG,
                         "--strict")
    assert code == 2 and out == "" and "does not fit" in err
    assert run(capsys, "simulate", "-w", str(LLAMA), "--strict")[0] == 0  # the default fits


def test_reproduce_strict_writes_nothing(hf, tmp_path, capsys):
    out = tmp_path / "res"
    code = reproduce.main(["-w", str(LLAMA), *TOO_BIG, "--strict", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "GiB" in err
    assert not out.exists()


@pytest.mark.parametrize("path", [BAD / "kv-heads-do-not-divide.json", FIXTURES / "mixtral-tiny",
                                  BAD / "missing.json"])
def test_reproduce_bad_config_exits_2_and_writes_nothing(hf, tmp_path, capsys, path):
    out = tmp_path / "res"
    code = reproduce.main(["-w", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out.exists()


# ------------------------------------------------------------------ the suite machinery


def test_reproduce_writes_results_under_the_model_name(hf, tmp_path, capsys, monkeypatch):
    """A relative path is stored absolute in every cell (and with the model's fields); a rerun
    from elsewhere rebuilds the workload from it and reuses the cells."""
    from kareus import reproduction

    monkeypatch.setattr(reproduction, "default_results_root", lambda: tmp_path / "results")
    monkeypatch.chdir(FIXTURES)
    args = ["-w", "./gpt2", "--optimizers", "megatron,perseus", "--microbatches", "4"]
    assert reproduce.main(args) == 0
    out = tmp_path / "results" / "gpt2"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "gpt2" and summary["parallel"]["tp"] == 4
    cell = json.loads((out / "cells" / "megatron.json").read_text())
    assert cell["key"]["workload"] == str(FIXTURES / "gpt2" / "config.json")
    assert cell["key"]["model"] == asdict(get_model(str(FIXTURES / "gpt2")))
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert reproduce.main(["-w", str(FIXTURES / "gpt2" / "config.json"),
                           *args[2:]]) == 0
    err = capsys.readouterr().err
    assert "reusing 2 cell(s) made by kareus-suite" in err and "computing" not in err
    assert json.loads((out / "summary.json").read_text()) == summary


def test_cells_rebuild_a_config_workload_in_another_process(hf, tmp_path):
    from kareus.suite.executors import CellTask, execute
    from kareus.suite.sweep import cell_key, model_fields

    ref = workload_ref(str(FIXTURES / "qwen3-tiny"))
    assert ref == str(FIXTURES / "qwen3-tiny" / "config.json")
    assert workload_ref("qwen3-1.7b") == "qwen3-1.7b" and model_fields("qwen3-1.7b") is None
    tasks = [CellTask(config="qwen3-tiny", workload=ref, optimizer=name, gpu=DEFAULT_GPU,
                      backend="sim", seed=0, store_root=str(tmp_path),
                      key=cell_key(ref, DEFAULT_GPU, "sim", name, 0, {}, {},
                                   model=model_fields(ref)))
             for name in ("megatron", "nanobatch")]
    records = {}
    execute(tasks, executor="local", jobs=2, on_done=lambda t, r: records.update({t.optimizer: r}))
    assert {n: r["status"] for n, r in records.items()} == {"megatron": "ok", "nanobatch": "ok"}


def test_gpu_backend_runs_a_config_workload(hf, monkeypatch):
    """make_problem binds the workload to a backend that can take it, and the GPU serializer
    carries the full model, so a worker never looks the name up."""
    from kareus.backends.gpu import GPUBackend
    from kareus.backends.gpu.serialize import (
        reduced_workload,
        workload_from_graph,
    )
    from kareus.suite import problem as problem_mod

    w = reduced_workload(str(FIXTURES / "qwen3-tiny"), 2, tp=1, pp=1, mbs=2, seq=32,
                         microbatches=2)
    assert w.name == "qwen3-tiny" and w.model.layers == 2
    assert Workload.from_dict(json.loads(json.dumps(w.to_dict()))) == w
    graph = build_iteration_graph(w)
    assert workload_from_graph(graph) == w  # the graph records the config's model itself

    backend = GPUBackend(get_preset("h200"), device="cpu", dtype="float32", fake_device=True)
    monkeypatch.setattr(problem_mod, "make_backend", lambda name, gpu, **kw: backend)
    p = problem_mod.make_problem(str(FIXTURES / "qwen3-tiny"), gpu="h200", backend="gpu", tp=1,
                                 pp=1, mbs=2, seq=32, microbatches=2)
    assert backend.workload_for(p.graph) is p.workload
    assert backend.workload_for(build_iteration_graph(p.workload)) == p.workload


def test_bloom_config_is_bloom_176b(tmp_path):
    pytest.importorskip("transformers")
    from workloads.hf_config import load_model

    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "bloom", "n_embed": 14336, "n_head": 112,
                             "n_layer": 70, "vocab_size": 250880}))
    m = load_model(f)
    assert (m.hidden, m.heads, m.layers, m.vocab, m.ffn) == (14336, 112, 70, 250880, 57344)
    assert m.alibi and m.embedding_norm and not m.rope and m.mlp == "gelu"
    assert m.native_seq == 2048
    assert m.total_params() == 176_247_271_424  # BigScience's count
    g = build_iteration_graph(make_workload(str(f), tp=8, pp=8))
    names = [op.name for seg in g.instruction_graphs[(0, "forward")].extra for op in seg.compute]
    assert names == ["embedding", "norm"]
    assert not any(op.name == "rope" for seg in g.instruction_graphs[(0, "forward")].sequential
                   for op in seg.compute)


def test_bloom_config_can_untie_its_output_layer(tmp_path):
    """Bloom ties its embedding and output layer unless the file says otherwise, as
    transformers reads it."""
    pytest.importorskip("transformers")
    from workloads.hf_config import load_model

    raw = {"model_type": "bloom", "n_embed": 1024, "n_head": 16, "n_layer": 4, "vocab_size": 50880}
    for tie in (None, True, False):
        f = tmp_path / f"bloom_{tie}.json"
        f.write_text(json.dumps(raw if tie is None else {**raw, "tie_word_embeddings": tie}))
        assert load_model(f).tied_embeddings is (tie is not False)


@pytest.mark.parametrize("drop", ["n_embed", "n_head", "n_layer", "vocab_size"])
def test_bloom_config_missing_a_size_is_refused(tmp_path, drop):
    pytest.importorskip("transformers")
    from workloads.hf_config import load_model

    raw = {"model_type": "bloom", "n_embed": 1024, "n_head": 16, "n_layer": 4,
           "vocab_size": 1000}
    del raw[drop]
    f = tmp_path / "config.json"
    f.write_text(json.dumps(raw))
    alias = {"n_embed": " or hidden_size", "n_head": " or num_attention_heads",
             "n_layer": " or num_hidden_layers"}.get(drop, "")
    with pytest.raises(WorkloadError, match=f"must give {drop}{alias}$"):
        load_model(f)


@pytest.mark.parametrize("fields,missing", [
    ({}, "hidden_size, num_attention_heads, num_hidden_layers, vocab_size, intermediate_size"),
    ({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128},
     "intermediate_size"),
])
def test_a_config_without_its_sizes_is_refused_not_filled_with_defaults(hf, tmp_path, capsys,
                                                                        fields, missing):
    """transformers' AutoConfig would fill the sizes a file lacks from the family's defaults
    ({"model_type": "llama"} would be a 6.7B model): the file must give them itself."""
    path = write(tmp_path, model_type="llama", **fields)
    code, out, err = run(capsys, "simulate", "-w", str(path), "--json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"missing size field(s) {missing};" in err


def test_gpt2_sizes_are_named_by_its_own_keys(hf, tmp_path):
    """gpt2 names its sizes n_embd, n_head, n_layer; its n_inner may be absent (4 x n_embd)."""
    with pytest.raises(WorkloadError, match=r"missing size field\(s\) n_layer;"):
        get_model(str(write(tmp_path, model_type="gpt2", n_embd=64, n_head=4, vocab_size=128)))
    m = get_model(str(write(tmp_path, model_type="gpt2", n_embd=64, n_head=4, n_layer=2,
                            vocab_size=128)))
    assert m.ffn == 256 and m.layers == 2


def test_a_qwen3_config_without_head_dim_gets_transformers_default(hf, tmp_path):
    """Qwen3's config class defaults ``head_dim`` to 128 whatever the hidden size (Qwen3-32B:
    5,120 wide, 64 heads of 128); Llama's derives it from the hidden size."""
    sizes = dict(hidden_size=5120, num_attention_heads=64, num_key_value_heads=8,
                 num_hidden_layers=64, vocab_size=151936, intermediate_size=25600,
                 tie_word_embeddings=False)
    qwen3 = get_model(str(write(tmp_path, model_type="qwen3", _folder="q", **sizes)))
    llama = get_model(str(write(tmp_path, model_type="llama", _folder="l", **sizes)))
    assert (qwen3.head_dim, llama.head_dim) == (128, 80)
    assert round(qwen3.total_params() / 1e9, 1) == 32.8  # Qwen3-32B


@pytest.mark.parametrize("field,value", [("vocab_size", 10**400), ("hidden_size", 10**30),
                                         ("intermediate_size", 8 * 10**300)])
def test_absurd_sizes_are_refused_in_one_line(hf, capsys, tmp_path, field, value):
    sizes = dict(model_type="llama", hidden_size=4096, num_attention_heads=32,
                 num_hidden_layers=32, vocab_size=32000, intermediate_size=11008)
    folder = tmp_path / "m"
    folder.mkdir()
    # json.dumps writes the huge integer exactly; the reader must refuse it, not overflow on it
    (folder / "config.json").write_text(json.dumps({**sizes, field: value}))
    code, out, err = run(capsys, "simulate", "-w", str(folder))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{field} (" in err and "larger than any model's" in err


def test_learned_positions_keep_the_models_whole_table(hf, tmp_path):
    """The default sequence is capped at 4,096 tokens, the learned position table is not: a
    GPT-2 of 8,192 positions holds 8,192 rows and runs 6,144 tokens without a warning."""
    base = json.loads((FIXTURES / "gpt2" / "config.json").read_text())
    folder = write(tmp_path, **{**base, "n_positions": 8192})
    m = get_model(str(folder))
    assert (m.native_seq, m.positions) == (4096, 8192)
    assert m.embedding_params() == (m.vocab + 8192) * m.hidden
    assert make_workload(str(folder), tp=1, seq=6144).position_warnings() == []
    assert make_workload(str(folder), tp=1, seq=8193).position_warnings()


def test_contradicting_aliases_are_refused(hf, capsys, tmp_path):
    base = json.loads((FIXTURES / "gpt2" / "config.json").read_text())
    folder = write(tmp_path, **{**base, "num_hidden_layers": base["n_layer"] * 2})
    code, out, err = run(capsys, "simulate", "-w", str(folder))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "n_layer = 12 and num_hidden_layers = 24 contradict each other" in err
    same = write(tmp_path, _folder="same", **{**base, "num_hidden_layers": base["n_layer"]})
    assert get_model(str(same)).layers == base["n_layer"]


def test_an_integer_too_long_to_parse_is_refused_in_one_line(capsys, tmp_path):
    """Python refuses to convert integers of more than 4,300 digits (a ValueError, not a
    JSONDecodeError): the reader still says the file is not valid JSON, exit 2."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "vocab_size": 1' + "0" * 5000
                                        + "}")
    code, out, err = run(capsys, "simulate", "-w", str(folder))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "is not valid JSON" in err and "4300 digits" in err


def test_a_config_without_its_context_runs_at_the_documented_default(tmp_path):
    """``min(max_position_embeddings, 4096)``: a RoPE model whose file gives no context runs at
    4096, not at the class default transformers fills in (Llama's 2048); a model with learned
    positions keeps the table transformers builds (GPT-2: 1024), and warns past it."""
    pytest.importorskip("transformers")
    from workloads.hf_config import load_model

    llama = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
             "num_hidden_layers": 2, "vocab_size": 1000, "intermediate_size": 512}
    gpt2 = {"model_type": "gpt2", "n_embd": 256, "n_head": 4, "n_layer": 2, "vocab_size": 1000}
    for raw, seq, positions in ((llama, 4096, None), ({**llama, "max_position_embeddings": 1024},
                                                      1024, None), (gpt2, 1024, 1024)):
        f = tmp_path / "config.json"
        f.write_text(json.dumps(raw))
        m = load_model(f)
        assert (m.native_seq, m.max_positions) == (seq, positions)
