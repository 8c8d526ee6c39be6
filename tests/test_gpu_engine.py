"""The GPU backend's execution engine on CPU (float32): op-by-op, nanobatched, recomputed
execution equals the reference :class:`GPTStage` forward + autograd; launch slots and SM counts
route collectives as planned; the op lists equal the graph builder's; and with two processes
(gloo) tensor parallelism reproduces the unsharded model while a PP=2 / TP=2 plan runs the 1F1B
pipeline with identical results for sequential and nanobatched schedules."""

from __future__ import annotations

import copy
import json
import os
import socket

import pytest
import torch
import torch.nn.functional as F

from kareus.backends.gpu.engine import LocalComm, Schedule, StageEngine
from kareus.backends.gpu.runner import check_against_graph, partition_keys
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph
from workloads.models import ModelSpec
from workloads.parallel import ParallelConfig, Workload
from workloads.torch_model import GPTStage

SPECS = {
    "llama": ModelSpec("tiny-llama", hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128,
                       layers=3, vocab=96, native_seq=32, mlp="swiglu", norm="rmsnorm",
                       tied_embeddings=True),
    "qwen": ModelSpec("tiny-qwen", hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=96,
                      layers=3, vocab=96, native_seq=32, mlp="swiglu", norm="rmsnorm",
                      qk_norm=True, tied_embeddings=True),
    "gpt3": ModelSpec("tiny-gpt3", hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=256,
                      layers=3, vocab=96, native_seq=32, mlp="gelu", norm="layernorm",
                      rope=False, tied_embeddings=True),
}
MBS, SEQ = 4, 32


pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(spec: ModelSpec, seed: int = 0):
    torch.manual_seed(seed)
    ref = GPTStage(spec, spec.layers, first=True, last=True)
    with torch.no_grad():  # non-trivial norms and biases
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    g = torch.Generator().manual_seed(seed + 1)
    tok = torch.randint(0, spec.vocab, (MBS, SEQ), generator=g)
    tgt = torch.randint(0, spec.vocab, (MBS, SEQ), generator=g)
    loss = F.cross_entropy(ref(tok).float().flatten(0, 1), tgt.flatten())
    loss.backward()
    return ref, tok, tgt, loss.detach(), {n: p.grad.clone() for n, p in ref.named_parameters()}


def _run(ref, tok, tgt, sched, comm=None):
    m = copy.deepcopy(ref)
    m.zero_grad(set_to_none=True)
    eng = StageEngine(m, comm)
    st = eng.forward(tok, sched, tgt)
    assert st.output is None and st.loss is not None
    eng.backward(st, sched)
    return st.loss.detach(), {n: p.grad for n, p in m.named_parameters()}


def _close(grads, ref_grads):
    for n, g in ref_grads.items():
        assert grads[n] is not None, n
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("family", sorted(SPECS))
def test_engine_equals_reference(family):
    ref, tok, tgt, loss, ref_grads = _reference(SPECS[family])
    for sched in (Schedule(False), Schedule(True)):
        got_loss, grads = _run(ref, tok, tgt, sched)
        torch.testing.assert_close(got_loss, loss, rtol=1e-6, atol=1e-6)
        _close(grads, ref_grads)


def test_side_stream_schedules_do_not_change_results():
    """Cutting at the collectives (a one-rank group), any launch slot and SM count gives the
    sequential result; every collective is issued with the planned SM count."""
    spec = SPECS["qwen"]
    ref, tok, tgt, loss, ref_grads = _reference(spec)
    comm = LocalComm(1)
    base_loss, base = _run(ref, tok, tgt, Schedule(False), comm)
    eng = StageEngine(copy.deepcopy(ref), comm)
    keys = {}
    for d in ("forward", "backward"):
        names = eng.op_names(d, True)
        keys[d] = [f"{d}-{i}" for i in range(len(names))]
    # windows: sequential (-1), launched before op 0..2 and waited for right away or at the end
    parts = tuple((k, (3 + i, i % 4 - 1, (i % 4 - 1) if i % 2 and i % 4 else None))
                  for d in keys for i, k in enumerate(keys[d]))
    eng.partition_keys = keys
    comm.log.clear()
    st = eng.forward(tok, Schedule(True, parts), tgt)
    eng.backward(st, Schedule(True, parts))
    torch.testing.assert_close(st.loss.detach(), base_loss)
    _close({n: p.grad for n, p in eng.stage.named_parameters()}, base)
    _close(base, ref_grads)
    used = {sms for sms, _ in comm.log}
    assert used - {None} == {3 + i for i in range(len(keys["forward"]))} | \
        {3 + i for i in range(len(keys["backward"]))}


@pytest.mark.parametrize("name,tp", [("qwen3-1.7b", 1), ("qwen3-1.7b", 2), ("gpt3-xl", 2),
                                     ("llama3.2-3b", 4)])
def test_engine_op_lists_equal_the_graph(name, tp):
    w = make_workload(name, tp=tp, pp=2, mbs=2, seq=256, microbatches=2)
    w = Workload(w.model.__class__(**{**w.model.__dict__, "layers": 4}),
                 ParallelConfig(tp=tp, pp=2, mbs=2, seq=256, microbatches=2), name=w.name)
    g = build_iteration_graph(w)
    small = w.model.__class__(**{**w.model.__dict__, "hidden": 64, "heads": w.model.heads,
                                 "head_dim": 8, "ffn": 64 * tp, "vocab": 64})
    for stage in range(2):
        m = GPTStage(small, 2, first=stage == 0, last=stage == 1, tp=tp)
        eng = StageEngine(m, LocalComm(tp) if tp > 1 else None,
                          partition_keys=partition_keys(g, stage))
        check_against_graph(eng, g, stage)


# ---------------------------------------------------------------------- two processes (gloo)


def _shard(ref: GPTStage, m: GPTStage, tp: int, r: int) -> None:
    """Copy the unsharded reference into TP rank ``r``'s shard (Megatron layout)."""
    spec = ref.layers[0].spec
    d, hq, hkv = spec.head_dim, spec.heads // tp, spec.kv_heads // tp
    f = spec.ffn // tp
    with torch.no_grad():
        for a, b in zip(ref.layers, m.layers):
            wq, wk, wv = a.attn.qkv.weight.split([spec.heads * d, spec.kv_heads * d,
                                                  spec.kv_heads * d])
            b.attn.qkv.weight.copy_(torch.cat([wq[r * hq * d:(r + 1) * hq * d],
                                               wk[r * hkv * d:(r + 1) * hkv * d],
                                               wv[r * hkv * d:(r + 1) * hkv * d]]))
            b.attn.proj.weight.copy_(a.attn.proj.weight[:, r * hq * d:(r + 1) * hq * d])
            gate, up = a.mlp.fc1.weight.chunk(2)
            b.mlp.fc1.weight.copy_(torch.cat([gate[r * f:(r + 1) * f], up[r * f:(r + 1) * f]]))
            b.mlp.fc2.weight.copy_(a.mlp.fc2.weight[:, r * f:(r + 1) * f])
            for name in ("norm1", "norm2", "attn.q_norm", "attn.k_norm"):
                src, dst = a.get_submodule(name), b.get_submodule(name)
                dst.weight.copy_(src.weight)
        v = m.vocab_local
        m.wte.weight.copy_(ref.wte.weight[r * v:(r + 1) * v])
        m.norm.weight.copy_(ref.norm.weight)


def _grad_shard(name: str, g: torch.Tensor, spec: ModelSpec, tp: int, r: int) -> torch.Tensor:
    d, hq, hkv, f = spec.head_dim, spec.heads // tp, spec.kv_heads // tp, spec.ffn // tp
    if name.endswith("attn.qkv.weight"):
        q, k, v = g.split([spec.heads * d, spec.kv_heads * d, spec.kv_heads * d])
        return torch.cat([q[r * hq * d:(r + 1) * hq * d], k[r * hkv * d:(r + 1) * hkv * d],
                          v[r * hkv * d:(r + 1) * hkv * d]])
    if name.endswith("attn.proj.weight"):
        return g[:, r * hq * d:(r + 1) * hq * d]
    if name.endswith("mlp.fc1.weight"):
        a, b = g.chunk(2)
        return torch.cat([a[r * f:(r + 1) * f], b[r * f:(r + 1) * f]])
    if name.endswith("mlp.fc2.weight"):
        return g[:, r * f:(r + 1) * f]
    if name == "wte.weight":
        v = spec.vocab // tp
        return g[r * v:(r + 1) * v]
    return g


def _worker(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: TP engine vs reference, then PP=2 and TP=2 plan jobs."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from kareus.backends.gpu.engine import GroupComm
    from kareus.backends.gpu.measure import MeasureConfig
    from kareus.backends.gpu.runner import execute
    from kareus.backends.gpu.serialize import Job
    from kareus.plan import InstructionPlan, IterationPlan

    dist.init_process_group("gloo")
    result: dict = {}
    # 1. TP=2 engine against the unsharded reference, sequential and nanobatched
    spec = SPECS["qwen"]
    ref, tok, tgt, loss, ref_grads = _reference(spec)
    comm = GroupComm({None: dist.group.WORLD, 5: dist.new_group([0, 1])}, 2)
    m = GPTStage(spec, spec.layers, first=True, last=True, tp=2, tp_rank=rank)
    _shard(ref, m, 2, rank)
    errs = []
    for sched in (Schedule(False), Schedule(True, (("x", (5, 1, None)),))):
        m.zero_grad(set_to_none=True)
        eng = StageEngine(m, comm, partition_keys={"forward": ["x"] * 4, "backward": ["x"] * 8})
        st = eng.forward(tok, sched, tgt)
        eng.backward(st, sched)
        eng.sync_replicated_grads()
        errs.append(abs(float(st.loss.detach()) - float(loss)))
        for n, p in m.named_parameters():
            want = _grad_shard(n, ref_grads[n], spec, 2, rank)
            errs.append(float((p.grad - want).abs().max() / (want.abs().max() + 1e-12)))
    result["tp_max_err"] = max(errs)
    # 2. plan jobs through the runner: PP=2 (1F1B + P2P), then TP=2 (CTA-limited groups)
    cfg = MeasureConfig(warmup_s=0, warmup_steps=1, window_s=0, min_steps=1)
    for tag, tp, pp in (("pp2", 1, 2), ("tp2", 2, 1)):
        w = Workload(SPECS["llama"].__class__(**{**SPECS["llama"].__dict__, "layers": 4}),
                     ParallelConfig(tp=tp, pp=pp, mbs=4, seq=32, microbatches=3))
        g = build_iteration_graph(w)
        for nano in (False, True):
            ins = {}
            for i in (i for seq in g.schedule().values() for i in seq):
                parts = g.instruction_graphs[i.type_key].partitions
                ins[i] = InstructionPlan.make(1980, nano, {
                    p.key: _window_schedule(3 + j % 4, j, len(p.compute))
                    for j, p in enumerate(parts)} if nano else None)
            job = Job("plan", workload=w, plan=IterationPlan(ins), measure=cfg, device="cpu",
                      dtype="float32", fake_device=True)
            r = execute(job, os.path.join(out, f"{tag}-{nano}"))
            d = r.to_dict()
            result[f"{tag}-{nano}"] = {"losses": d["losses"], "times": d["instruction_times"],
                                       "steps": d["steps"], "stage": d["stage"]}
    dist.destroy_process_group()
    with open(os.path.join(out, f"worker{rank}.json"), "w") as fh:
        json.dump(result, fh)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_tp_and_pipeline(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2,
                       start_method="fork", join=True)
    res = [json.loads((tmp_path / f"worker{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert r["tp_max_err"] < 1e-4
    # PP=2: the last stage computes all microbatches' losses; order is 1F1B per stage
    assert res[0]["pp2-False"]["losses"] == [] and len(res[1]["pp2-False"]["losses"]) == 3
    for nano in (False, True):
        assert [t[:2] for t in res[0][f"pp2-{nano}"]["times"]] == [
            [0, "forward"], [1, "forward"], [0, "backward"], [2, "forward"], [1, "backward"],
            [2, "backward"]]
    # sequential and nanobatched schedules (any slots, any SMs) compute the same
    for tag in ("pp2", "tp2"):
        a, b = res[1][f"{tag}-False"]["losses"], res[1][f"{tag}-True"]["losses"]
        assert a == pytest.approx(b, rel=1e-5)
    # TP ranks of one stage agree on the loss
    assert res[0]["tp2-True"]["losses"] == pytest.approx(res[1]["tp2-True"]["losses"], rel=1e-6)


def _window_schedule(sms: int, j: int, n: int):
    """A valid schedule of partition ``j`` of ``n`` ops: sequential, or launched before op
    ``j % n`` and waited for right after it or at the end."""
    from kareus.plan import PartitionSchedule

    if j % 3 == 2:
        return PartitionSchedule(sms, -1, -1)
    return PartitionSchedule(sms, j % n, None if j % 2 else j % n)
