"""The job's whole shape: precision, recomputation, stage split, placement over nodes, data-
parallel synchronisation, odd micro-batch sizes, and the refusals of impossible settings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kareus.backends.sim import SimulatorBackend
from kareus.cli import main
from kareus.errors import PlanError
from kareus.graph import Instruction
from kareus.hardware.presets import BUILTIN_DIR, get_preset
from kareus.plan import LIBRARY_DEFAULT, InstructionPlan, IterationPlan
from workloads import WorkloadError, make_workload
from workloads.graph_builder import build_iteration_graph


def _time(w, gpu="a100-sxm4-80gb", **plan):
    g = build_iteration_graph(w)
    sim = SimulatorBackend(get_preset(gpu))
    return sim.evaluate_plan(g, IterationPlan.uniform(g, sim.gpu.clock_max_mhz, **plan))


def test_precision_sets_math_rate_and_bytes():
    # the same (unfused) attention on both sides: flash attention needs 16-bit tensors
    bf16 = _time(make_workload("gpt3-xl", tp=1, pp=1, mbs=4, microbatches=2,
                               attention="unfused")).energy.time_s
    tf32 = _time(make_workload("gpt3-xl", tp=1, pp=1, mbs=4, microbatches=2,
                               precision="tf32")).energy.time_s
    fp32 = _time(make_workload("gpt3-xl", tp=1, pp=1, mbs=4, microbatches=2,
                               precision="fp32")).energy.time_s
    # TF32 tensor cores run at half the 16-bit rate, fp32 CUDA cores at 1/16 of it
    assert 1.4 < tf32 / bf16 < 2.2
    assert fp32 / bf16 > 6
    g = build_iteration_graph(make_workload("gpt3-xl", precision="tf32"))
    op = g.instruction_graphs[(0, "forward")].sequential[0].compute[0]
    g16 = build_iteration_graph(make_workload("gpt3-xl"))
    assert op.bytes == 2 * g16.instruction_graphs[(0, "forward")].sequential[0].compute[0].bytes


def test_recompute_modes_order_the_backward():
    t = {m: _time(make_workload("llama3.2-3b", tp=8, recompute=m)).energy.time_s
         for m in ("none", "selective", "full")}
    assert t["none"] < t["selective"] < t["full"]
    def peak(mode: str, attention: str) -> float:
        w = make_workload("llama3.2-3b", recompute=mode, attention=attention)
        return max(w.memory_estimate_bytes().values())

    # selective recomputation drops the stored scores, which flash attention never stores
    assert peak("full", "unfused") < peak("selective", "unfused") < peak("none", "unfused")
    assert peak("full", "flash") < peak("selective", "flash") == peak("none", "flash")


def test_unfused_attention_and_the_loss_hold_what_megatron_allocates():
    """Unfused attention under full recomputation holds one layer's scores while it is
    recomputed and differentiated: its QK^T product (2 bytes each at 16 bits), softmax (2),
    dropout mask (1) and output (2). The vocab-parallel cross-entropy keeps an fp32 softmax of
    the logits and makes their gradient in the training precision: 4 + 2 bytes per logit in
    bf16."""
    def job(**kw):
        return make_workload("gpt3-xl", tp=2, pp=2, mbs=4, seq=2048, microbatches=4,
                             recompute="full", **kw)

    scores = job(attention="unfused")
    flash = job(attention="flash")
    p = scores.parallel
    one_score = scores.model.heads / p.tp * p.tokens_per_gpu * p.seq  # at 2 bytes: 1 unit
    for s in (0, 1):
        assert (scores.memory_estimate_bytes()[s] - flash.memory_estimate_bytes()[s]
                == pytest.approx(7 * one_score)), s

    short, padded = job(make_vocab_size_divisible_by=1), job(make_vocab_size_divisible_by=1024)
    rows = (padded.padded_vocab - short.padded_vocab) / p.tp
    params = padded.stage_params(1) - short.stage_params(1)
    assert (padded.memory_estimate_bytes()[1] - short.memory_estimate_bytes()[1]
            == pytest.approx(18 * params + (4 + 2) * p.tokens_per_gpu * rows))


def test_precision_sets_the_state_bytes_as_megatron_counts_them():
    """Megatron-core's distributed-optimizer guide: bf16 parameters with fp32 gradients take 18
    bytes per parameter (6 + 12/d sharded), fp16 parameters and gradients 20 (4 + 16/d: the
    optimizer step also makes fp32 gradients), fp32 16 (8 + 8/d). A job whose activations are
    small peaks at the step and shows exactly those counts."""
    def memory(precision: str, distributed: bool) -> float:
        return make_workload("gpt3-xl", tp=1, pp=1, dp=4, mbs=1, seq=128, microbatches=1,
                             recompute="full", precision=precision,
                             distributed_optimizer=distributed).memory_estimate_bytes()[0]

    params = make_workload("gpt3-xl", tp=1, pp=1, dp=4, seq=128).stage_params(0)
    for precision, sharded in (("bf16", 12), ("fp16", 16), ("fp32", 8)):
        saved = memory(precision, False) - memory(precision, True)
        assert saved == pytest.approx(params * sharded * (1 - 1 / 4)), precision
    # 20 against 18 bytes of state per parameter; bf16's peak, in the backward pass, also holds
    # the (few) activations that fp16's, at the step, has freed
    short_of_two = 2 * params - (memory("fp16", False) - memory("bf16", False))
    assert 0 < short_of_two < 0.1 * params


def test_fp16s_fp32_gradients_exist_only_during_the_step():
    """Megatron-LM's fp16 optimizer copies the 16-bit gradients into fp32 ones at the step
    (``main_param.grad = main_grad.float()``) and frees them at the next ``zero_grad``, so
    through the backward pass fp16 holds 16 bytes per parameter against bf16's 18 (its
    gradients are 16-bit). A job whose activations dominate peaks there; vTrain's 3.6B model at
    TP1 x DP64 with micro-batches of 8 ran on 80 GB A100s, and it fits."""
    def memory(precision: str) -> float:
        return make_workload("gpt3-xl", tp=1, pp=1, dp=4, mbs=16, seq=2048, microbatches=1,
                             recompute="full", precision=precision).memory_estimate_bytes()[0]

    params = make_workload("gpt3-xl", tp=1, pp=1, dp=4, seq=2048).stage_params(0)
    assert memory("fp16") - memory("bf16") == pytest.approx(-2 * params)

    from kareus.suite.datasets import vtrain_runs
    from kareus.suite.megatron_runs import VTRAIN_GPU, load_runs, run_workload

    multi = vtrain_runs("multi_node_3.6b.csv")
    if multi is None:
        pytest.skip("../shared/vtrain_megatron is not present")
    capacity = get_preset(VTRAIN_GPU).memory_bytes
    for run in load_runs(multi).to_dict("records"):
        assert run_workload(run).check_fits(capacity) == [], run


def test_model_flops_do_not_depend_on_the_precision():
    """MFU's numerator is the model's: causal attention counts half the scores whichever
    kernels run it (32-bit precisions always run the unfused path, which computes them all)."""
    from workloads.graph_builder import model_flops

    flops = {p: model_flops(make_workload("gpt3-xl", tp=1, pp=1, precision=p))
             for p in ("bf16", "tf32", "fp32")}
    assert flops["tf32"] == flops["fp32"] == pytest.approx(flops["bf16"], rel=1e-12)


def test_stage_layers_are_the_split():
    w = make_workload("gpt3-xl", tp=1, pp=4, layer_split=(6, 6, 7, 5))
    g = build_iteration_graph(w)
    assert [g.instruction_graphs[(s, "forward")].layers for s in range(4)] == [6, 6, 7, 5]


@pytest.mark.parametrize("split, needle", [((6, 6, 12), "3 stage(s)"), ((0, 12, 6, 6), "positive"),
                                           ((6, 6, 6, 5), "sums to 23")])
def test_stage_layers_refusals(split, needle):
    with pytest.raises(WorkloadError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        make_workload("gpt3-xl", tp=1, pp=4, layer_split=split)


def test_sequence_parallelism_shards_the_norms_and_splits_each_all_reduce():
    """Megatron-LM's --sequence-parallel: each TP all-reduce becomes a reduce-scatter after the
    row-parallel GEMM and an all-gather before the column-parallel one, over the same
    [tokens, hidden] bytes; the backward also gathers each column-parallel GEMM's input again
    for its weight gradient; the norms and residual adds run on 1/TP of the tokens; stored
    activations and the tensor sent between stages are 1/TP. With TP 1 nothing changes."""
    plain = make_workload("llama3.2-3b", tp=8, pp=2, recompute="selective")
    sp = make_workload("llama3.2-3b", tp=8, pp=2, recompute="selective", sequence_parallel=True)
    gp, gs = build_iteration_graph(plain), build_iteration_graph(sp)
    whole = plain.parallel.element_bytes * plain.parallel.tokens_per_gpu * plain.model.hidden

    def comms(g, direction):
        return [(s.comm.collective, s.comm.bytes)
                for s in g.instruction_graphs[(0, direction)].sequential if s.comm]

    assert comms(gp, "forward") == [("all_reduce", whole)] * 2
    assert comms(gs, "forward") == [("all_gather", whole), ("reduce_scatter", whole)] * 2
    assert comms(gs, "backward") == [("all_gather", whole), ("all_gather", whole),
                                     ("reduce_scatter", whole)] * 2

    def norm_bytes(g):
        return sorted(op.bytes for s in g.instruction_graphs[(0, "forward")].sequential
                      for op in s.compute if op.name in ("norm", "bda"))
    assert norm_bytes(gs) == pytest.approx([b / 8 for b in norm_bytes(gp)])
    assert gs.p2p.bytes == pytest.approx(gp.p2p.bytes / 8)
    # the GEMMs see every token either way
    gemms = [sorted(op.flops for s in g.instruction_graphs[(0, "forward")].sequential
                    for op in s.compute if op.kind == "gemm") for g in (gp, gs)]
    assert gemms[0] == gemms[1]
    # Korthikanti et al.: 34/t instead of 10 + 24/t per token and layer under selective
    # recomputation; the memory-bound kernels shrink, so the iteration is shorter
    assert sp.memory_estimate_bytes()[0] < plain.memory_estimate_bytes()[0]
    assert _time(sp).energy.time_s < _time(plain).energy.time_s
    one, off = (build_iteration_graph(make_workload("llama3.2-3b", tp=1, pp=2, **kw))
                for kw in ({"sequence_parallel": True}, {}))
    assert one.instruction_graphs == off.instruction_graphs and one.p2p == off.p2p


def test_sequence_parallel_embedding_output_layer_and_partitions():
    """The embedding reduce-scatters under sequence parallelism (RoPE models), but with a
    learned position table added after it Megatron-core keeps the all-reduce and takes its
    shard (GPT-3); the output layer gathers the final norm's shard, gathers its input again for
    the weight gradient and reduce-scatters its input gradient. With CP every nanobatch
    partition keeps a key of its own."""
    def extra(name, direction, stage, **kw):
        w = make_workload(name, tp=8, pp=2, sequence_parallel=True, **kw)
        ig = build_iteration_graph(w).instruction_graphs[(stage, direction)]
        return [s.comm.collective if s.comm else None for s in ig.extra]

    assert extra("llama3.2-3b", "forward", 0) == ["reduce_scatter"]
    assert extra("gpt3-xl", "forward", 0) == ["all_reduce"]
    assert extra("llama3.2-3b", "backward", 0) == ["all_gather", None]
    assert extra("llama3.2-3b", "forward", 1) == ["all_gather", "all_reduce"]
    assert extra("llama3.2-3b", "backward", 1) == ["all_gather", "reduce_scatter", None]
    g = build_iteration_graph(make_workload("llama3.2-3b", tp=4, cp=2, sequence_parallel=True))
    for ig in g.instruction_graphs.values():
        keys = [part.key for part in ig.partitions]
        assert keys and len(keys) == len(set(keys))


def test_norm_gradients_are_all_reduced_over_tp_when_ranks_see_part_of_them(tmp_path):
    """Megatron-core's ``_allreduce_layernorm_grads``: one flat all-reduce over TP after the
    backward, of the q/k norms' gradients (each rank sees its heads) and, under sequence
    parallelism, of every norm's and row-parallel bias's (each rank sees its tokens)."""
    def norm_sync(name: str, **job) -> list[tuple[float, int]]:
        g = build_iteration_graph(make_workload(name, pp=1, **job))
        return [(seg.comm.bytes, seg.comm.group) for seg in g.stage_tail[0]
                if seg.comm is not None and seg.comm.name == "tp_allreduce_norm_grads"]

    # Llama 3.2 3B: 28 layers x 2 RMSNorm scales of 3,072 + the final norm, fp32 main grads
    assert norm_sync("llama3.2-3b", tp=8, sequence_parallel=True) == [
        ((28 * 2 + 1) * 3072 * 4, 8)]
    # GPT-3 XL (2,048 wide): LayerNorm scale and shift twice, proj's and fc2's biases
    assert norm_sync("gpt3-xl", tp=4, sequence_parallel=True) == [
        ((24 * (2 * 2 + 2) + 2) * 2048 * 4, 4)]
    # Bloom (1,024 wide, 4 layers): the embedding's LayerNorm too, run on each rank's tokens
    bloom = tmp_path / "bloom.json"
    bloom.write_text(json.dumps({"model_type": "bloom", "n_embed": 1024, "n_head": 16,
                                 "n_layer": 4, "vocab_size": 50880}))
    assert norm_sync(str(bloom), tp=4, sequence_parallel=True) == [
        ((4 * (2 * 2 + 2) + 2 + 2) * 1024 * 4, 4)]
    # Qwen 3 1.7B without sequence parallelism: only the q and k norms (128 wide) per layer
    assert norm_sync("qwen3-1.7b", tp=8) == [(28 * 2 * 128 * 4, 8)]
    # nothing to synchronise: no TP, or whole norms without q/k norms
    assert norm_sync("qwen3-1.7b", tp=1) == norm_sync("llama3.2-3b", tp=8) == []
    # it follows the data-parallel reduction (Megatron-core's order), which stays first in the
    # tail, where --overlap-grad-reduce hides it under the last backward
    job = dict(tp=8, dp=2, pp=1, microbatches=4)
    overlapped = make_workload("qwen3-1.7b", overlap_grad_reduce=True, **job)
    tail = build_iteration_graph(overlapped).stage_tail[0]
    assert [seg.comm.name for seg in tail[:2]] == ["dp_allreduce_grads",
                                                   "tp_allreduce_norm_grads"]
    sim = SimulatorBackend(get_preset("a100-sxm4-40gb"))
    tails = []
    for w in (overlapped, make_workload("qwen3-1.7b", **job)):
        g = build_iteration_graph(w)
        tails.append(sim.evaluate_plan(g, IterationPlan.uniform(g, 1410.0)).stage_tail_s[0])
    assert tails[0] < 0.5 * tails[1]


def test_sequence_parallelism_refusals(capsys):
    status = main(["simulate", "-w", "llama3.2-3b", "--tp", "8", "--seq", "4100",
                   "--sequence-parallel"])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and "not divisible by 8" in err
    from kareus.backends.gpu.serialize import check_supported
    from kareus.errors import InputError
    with pytest.raises(InputError, match="--sequence-parallel is not implemented"):
        check_supported(make_workload("llama3.2-3b", tp=8, sequence_parallel=True))
    assert main(["simulate", "-w", "llama3.2-3b", "--tp", "8", "--sequence-parallel",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["parallel"]["sequence_parallel"] is True
    assert record["sequence_parallel_warnings"] == []
    # without TP it does nothing, and says so (Megatron-LM turns it off with a warning)
    assert main(["simulate", "-w", "llama3.2-3b", "--tp", "1", "--sequence-parallel"]) == 0
    assert "warning: --sequence-parallel does nothing with TP 1" in capsys.readouterr().out
    assert main(["simulate", "-w", "llama3.2-3b", "--tp", "1", "--sequence-parallel",
                 "--json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["sequence_parallel_warnings"]
    assert warning.startswith("--sequence-parallel does nothing with TP 1")
    assert main(["frontier", "-w", "llama3.2-3b", "--tp", "1", "--sequence-parallel",
                 "-o", "megatron", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "--sequence-parallel does nothing with TP 1" in err
    (warning,) = json.loads(out)["sequence_parallel_warnings"]
    assert warning.startswith("--sequence-parallel does nothing with TP 1")


def test_groups_spanning_nodes_use_the_network():
    inside = build_iteration_graph(make_workload("gpt3-2.7b", tp=8, pp=1, dp=2))
    across = build_iteration_graph(make_workload("gpt3-2.7b", tp=8, pp=1, dp=2, gpus_per_node=4))
    seg = inside.instruction_graphs[(0, "forward")].sequential[0]
    assert seg.comm.intra_node and seg.comm.nodes == 1
    seg = across.instruction_graphs[(0, "forward")].sequential[0]
    assert not seg.comm.intra_node and (seg.comm.nodes, seg.comm.ranks_per_node) == (2, 4)
    # DP groups of one rank per node: ranks 8 apart
    sync = inside.stage_tail[0][0].comm
    assert not sync.intra_node and sync.ranks_per_node == 1
    assert _time(make_workload("gpt3-2.7b", tp=8, pp=1, dp=2, gpus_per_node=4)).energy.time_s \
        > _time(make_workload("gpt3-2.7b", tp=8, pp=1, dp=2)).energy.time_s


def test_two_node_all_reduce_runs_nccls_tree():
    """On two nodes NCCL's tree sends each byte across the network once each way (the ring:
    ``2(n-1)/n`` times) while the chain inside a node carries twice the data: on a DGX A100 pair
    (8 NICs of 200 Gb/s at 80 %) the NVLink half binds, about 110-120 GB/s of algorithm
    bandwidth as NCCL's maintainers quote (NVIDIA/nccl#320). Rings elsewhere."""
    from kareus.graph import CommOp

    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    g = sim.gpu
    nvlink, nic = g.nvlink_bw * g.link_efficiency, g.network_bw * g.network_efficiency
    two = CommOp("ar", "all_reduce", 1e9, 16, False, nodes=2, ranks_per_node=8)
    assert sim.link_rate(two) * two.bytes / two.bus_bytes == pytest.approx(min(8 * nic, nvlink / 2))
    assert 100e9 < sim.link_rate(two) * two.bytes / two.bus_bytes < 130e9
    # the ring's rate where the tree has nothing to gain or does not run
    for ring in (CommOp("ar", "all_reduce", 1e9, 2, False, nodes=2, ranks_per_node=1),
                 CommOp("ar", "all_reduce", 1e9, 24, False, nodes=3, ranks_per_node=8),
                 CommOp("ag", "all_gather", 1e9, 16, False, nodes=2, ranks_per_node=8)):
        assert sim.link_rate(ring) == pytest.approx(min(nvlink, ring.ranks_per_node * nic))
    tp16 = make_workload("gpt3-2.7b", tp=16, pp=1, dp=1, gpus_per_node=8)
    seg = build_iteration_graph(tp16).instruction_graphs[(0, "forward")].sequential[0]
    assert (seg.comm.nodes, seg.comm.ranks_per_node) == (2, 8)


def test_gpus_per_node_must_divide_the_job():
    with pytest.raises(WorkloadError, match="whole nodes"):
        make_workload("gpt3-xl", tp=2, pp=3, dp=1, gpus_per_node=4)
    with pytest.raises(WorkloadError, match="positive"):
        make_workload("gpt3-xl", gpus_per_node=0)


def test_overlapped_grad_reduction_hides_most_of_it():
    kw = dict(tp=1, pp=1, dp=8, mbs=2, microbatches=2, seq=1024)
    end = _time(make_workload("gpt3-xl", **kw)).energy.time_s
    overlapped = _time(make_workload("gpt3-xl", overlap_grad_reduce=True, **kw)).energy.time_s
    assert overlapped < end
    dist = build_iteration_graph(make_workload("gpt3-xl", distributed_optimizer=True, **kw))
    assert [s.comm.collective for s in dist.stage_tail[0]] == ["reduce_scatter", "all_gather"]


def test_overlapped_param_gather_waits_under_the_first_forward():
    """``--overlap-param-gather`` moves the distributed optimizer's all-gather from the stage
    tail to the next iteration's first forward, which waits for at least the bucket it needs
    first (the embedding's) and at most for all of them. A later pipeline stage gathers its one
    bucket only once its first activation has arrived, on the pipeline's filling path."""
    kw = dict(tp=1, pp=1, dp=8, mbs=2, microbatches=2, seq=1024, distributed_optimizer=True,
              overlap_grad_reduce=True)
    at_end = _time(make_workload("gpt3-xl", **kw))
    w = make_workload("gpt3-xl", overlap_param_gather=True, **kw)
    g = build_iteration_graph(w)
    assert [s.comm.collective for s in g.stage_tail[0] if s.comm] == ["reduce_scatter"]
    assert g.param_gather[0].collective == "all_gather" and len(g.grad_buckets[0]) > 1
    moved = _time(w)
    assert moved.energy.time_s < at_end.energy.time_s
    assert moved.stage_tail_s[0] < at_end.stage_tail_s[0]
    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    buckets, _ = sim._bucket_costs(g.param_gather[0], g.grad_buckets[0], sim._scalar_index(1410.0))
    wait = moved.instruction_times[Instruction(0, 0, "forward")][0]
    assert buckets[-1] <= wait <= sum(buckets)
    two = dict(tp=8, pp=2, dp=8, mbs=8, microbatches=8, distributed_optimizer=True,
               overlap_grad_reduce=True)
    late = _time(make_workload("llama3.2-3b", overlap_param_gather=True, **two))
    before = _time(make_workload("llama3.2-3b", **two))
    first = Instruction(1, 0, "forward")
    assert late.instruction_times[first][0] > before.instruction_times[first][0]


def test_the_all_gather_after_the_step_runs_bucket_by_bucket():
    """Without ``--overlap-param-gather`` the distributed optimizer all-gathers each bucket in
    turn after its step (Megatron-core's synchronous ``start_param_sync`` per bucket group): the
    tail is the gradients' overhang, the step and every bucket's all-gather with its latency."""
    from kareus.graph import Segment

    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    g = build_iteration_graph(make_workload("gpt3-xl", tp=1, pp=1, dp=8, mbs=2, microbatches=2,
                                            seq=1024, distributed_optimizer=True,
                                            overlap_grad_reduce=True))
    res = sim.evaluate_plan(g, IterationPlan.uniform(g, 1410.0))
    f = sim._scalar_index(1410.0)
    reduce_scatter, step = g.stage_tail[0]
    start, end = res.instruction_times[Instruction(0, 1, "backward")]
    overhang = sim.overlapped_grad_sync(g, 0, reduce_scatter.comm, start, end, f)[0]
    gathers, _ = sim._bucket_costs(step.comm, g.grad_buckets[0], f)
    whole = sim._segment_cost(Segment((), step.comm), f)[0]
    assert len(gathers) > 1 and sum(gathers) > whole
    assert res.stage_tail_s[0] == pytest.approx(
        overhang + sim._segment_cost(Segment(step.compute, None), f)[0] + sum(gathers))


def test_param_gather_buckets_hide_behind_the_forward():
    """The exposed part of a bucketed all-gather under a forward: the first bucket the forward
    needs always; the rest where a bucket gathers longer than the forward computes the bucket
    before, and otherwise only what the forward's kernels lose beside them (NCCL's SMs and
    part of HBM), less than gathering them after it; everything under an empty forward."""
    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    g = build_iteration_graph(make_workload(
        "gpt3-xl", tp=1, pp=1, dp=8, distributed_optimizer=True, overlap_grad_reduce=True,
        overlap_param_gather=True))
    comm, f = g.param_gather[0], sim._scalar_index(1410.0)
    times, energy = sim._bucket_costs(comm, g.grad_buckets[0], f)
    assert energy > 0 and len(times) == len(g.grad_buckets[0])
    long = sim.overlapped_param_gather(g, 0, comm, 1e3, f)[0]
    assert times[-1] < long < times[-1] + 0.5 * sum(times[:-1])
    assert sim.overlapped_param_gather(g, 0, comm, 0.0, f)[0] == pytest.approx(sum(times))
    middle = sim.overlapped_param_gather(g, 0, comm, sum(times), f)[0]
    assert long < middle < sum(times)


def test_a_reduction_beside_the_backward_slows_it():
    """A bucketed gradient reduction under a backward far longer than it runs entirely beside
    it, yet the stage ends later than the backward alone: while a bucket reduces, the
    backward's kernels run on the SMs NCCL's channels leave (the partition law). It still ends
    sooner than the reduction run after the backward, and its energy exceeds the reduction's
    alone by what the kernels draw beside it."""
    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    g = build_iteration_graph(make_workload("gpt3-xl", tp=1, pp=1, dp=8, mbs=2, microbatches=2,
                                            seq=1024, overlap_grad_reduce=True))
    f = sim._scalar_index(1410.0)
    reduction = g.stage_tail[0][0].comm
    times, alone_j = sim._bucket_costs(reduction, g.grad_buckets[0], f)
    kernels = sim._kernels_beside(g, (0, "backward"), reduction, f)
    assert kernels.stretch > 1.0
    backward = sim.evaluate_instruction(g, (0, "backward"), IterationPlan.uniform(
        g, 1410.0).instructions[Instruction(0, 0, "backward")]).time_s
    exposed, energy = sim.overlapped_grad_sync(g, 0, reduction, 0.0, backward, f)
    assert 0.0 < exposed < times[-1] + 0.5 * sum(times[:-1])
    assert energy > alone_j


def test_overlap_param_gather_needs_the_distributed_optimizer_and_bucketing():
    for flags in (dict(overlap_grad_reduce=True), dict(distributed_optimizer=True)):
        with pytest.raises(WorkloadError, match="needs --distributed-optimizer and "
                                                "--overlap-grad-reduce"):
            make_workload("gpt3-xl", dp=2, overlap_param_gather=True, **flags)


def test_gradient_buckets_fill_as_megatron_core_fills_them():
    """Megatron-core fills buckets of ``max(40 M, 1 M x DP)`` of the rank's (TP-sharded)
    parameters, DP without CP, on the first pipeline stage only (the others reduce in one
    piece): the weights in reverse order, a bucket closed once it holds that many, so the last
    holds the remainder with the input embedding, which the distributed optimizer puts in a
    bucket of its own when a tied embedding is shared across stages. Llama 3.2 3B at TP8 PP2
    holds 189 M of layers and 49 M of embedding a GPU on its first stage."""
    w = make_workload("llama3.2-3b", tp=8, pp=2, dp=2, overlap_grad_reduce=True)
    params, embedding = w.stage_params(0), w.embedding_params() / 8
    biggest = max(n for _, n in w.model.layer_tensors()) / 8
    g = build_iteration_graph(w)
    assert [len(g.grad_buckets[s]) for s in (0, 1)] == [5, 1]
    assert sum(b.share for b in g.grad_buckets[0]) == pytest.approx(1.0)
    assert sum(b.layers for b in g.grad_buckets[0]) == pytest.approx(w.stage_layers()[0])
    for b in g.grad_buckets[0][:-1]:
        assert 40e6 <= b.share * params < 40e6 + biggest
    assert g.grad_buckets[0][-1].share * params > embedding
    assert len(build_iteration_graph(make_workload(
        "llama3.2-3b", tp=8, pp=2, dp=128, overlap_grad_reduce=True)).grad_buckets[0]) == 2
    assert build_iteration_graph(make_workload(
        "llama3.2-3b", tp=4, cp=2, pp=2, dp=2, overlap_grad_reduce=True)).grad_buckets[0] == \
        build_iteration_graph(make_workload(
            "llama3.2-3b", tp=4, cp=1, pp=2, dp=2, overlap_grad_reduce=True)).grad_buckets[0]
    own = build_iteration_graph(make_workload("llama3.2-3b", tp=8, pp=2, dp=2,
                                              overlap_grad_reduce=True,
                                              distributed_optimizer=True)).grad_buckets[0]
    assert len(own) == 6 and own[-1].layers == 0
    assert own[-1].share == pytest.approx(embedding / params)


def test_context_parallel_ranks_reduce_their_gradients_with_the_data_parallel_ones():
    """Megatron-LM reduces gradients over DP x CP (each CP rank's come from its share of the
    sequence): CP4 alone syncs as DP4 does, over the same 4 ranks two nodes apart, and the
    distributed optimizer shards its step over all of them."""
    cp = build_iteration_graph(make_workload("llama3.2-3b", tp=4, cp=4, pp=1, dp=1))
    dp = build_iteration_graph(make_workload("llama3.2-3b", tp=4, cp=1, pp=1, dp=4, mbs=2))
    a, b = cp.stage_tail[0][0].comm, dp.stage_tail[0][0].comm
    assert (a.name, a.group, a.nodes, a.ranks_per_node, a.bytes) == \
        (b.name, b.group, b.nodes, b.ranks_per_node, b.bytes) == \
        ("dp_allreduce_grads", 4, 2, 2, a.bytes)
    both = make_workload("llama3.2-3b", tp=4, cp=2, pp=1, dp=2, distributed_optimizer=True)
    alone = make_workload("llama3.2-3b", tp=4, cp=1, pp=1, dp=4, mbs=2, distributed_optimizer=True)
    step = [build_iteration_graph(w).stage_tail[0][1].compute[0] for w in (both, alone)]
    assert step[0].bytes == pytest.approx(step[1].bytes)
    assert both.memory_estimate_bytes()[0] < make_workload(
        "llama3.2-3b", tp=4, cp=2, pp=1, dp=1, distributed_optimizer=True
    ).memory_estimate_bytes()[0]


@pytest.mark.parametrize("model", ["qwen3-1.7b", "llama3.2-3b", "gpt3-xl"])
def test_tied_embeddings_on_one_stage_are_one_matrix(model):
    """With the embedding and the output layer on one stage, a tied model holds, synchronises
    and steps its vocabulary matrix once: the stage's parameters times TP are the model's."""
    w = make_workload(model, tp=8 if model != "gpt3-xl" else 4, pp=1, dp=2)
    m = w.model
    assert m.tied_embeddings
    # the model's count adds the final norm, which the layers' share leaves out, and the
    # stage holds the padded vocabulary's rows
    final_norm = (2 if m.norm == "layernorm" else 1) * m.hidden
    padding = (w.padded_vocab - m.vocab) * m.hidden
    assert w.stage_params(0) * w.parallel.tp == pytest.approx(m.total_params() - final_norm
                                                              + padding)


def test_tied_embeddings_across_stages_all_reduce_their_gradient():
    """With PP > 1 a tied model's first and last stages each hold the vocabulary matrix, and each
    pair of ranks holding it all-reduces its gradient after the data-parallel reduction
    (Megatron-LM's embedding group): GPT-3 2.7B at TP2 DP8 PP2 puts the pair 16 ranks apart, on
    two nodes, and only those two stages pay; an untied model (Llama 3.3 70B) and one stage do
    not."""
    w = make_workload("gpt3-2.7b", tp=2, pp=2, dp=8, mbs=1, microbatches=4)
    g = build_iteration_graph(w)
    m = w.model
    for stage in (0, 1):
        names = [seg.comm.name for seg in g.stage_tail[stage] if seg.comm is not None]
        assert names == ["dp_allreduce_grads", "pp_allreduce_embedding_grads"]
        emb = g.stage_tail[stage][1].comm
        assert (emb.collective, emb.group, emb.nodes, emb.ranks_per_node) == ("all_reduce", 2, 2, 1)
        # bf16's fp32 gradients, TP2, of the vocabulary Megatron-LM pads to 50,432 (128 x 2)
        assert w.padded_vocab == 50432
        assert emb.bytes == pytest.approx(4 * w.padded_vocab * m.hidden / 2)
    four = build_iteration_graph(make_workload("gpt3-2.7b", tp=2, pp=4, dp=4, mbs=1,
                                               microbatches=4))
    assert [len(four.stage_tail[s]) for s in range(4)] == [3, 2, 2, 3]
    for untied in (make_workload("llama3.3-70b", tp=8, pp=2, dp=1),
                   make_workload("gpt3-2.7b", tp=2, pp=1, dp=8)):
        assert not any(seg.comm is not None and "embedding" in seg.comm.name
                       for tail in build_iteration_graph(untied).stage_tail.values() for seg in tail)


def test_each_stage_synchronises_over_its_own_groups():
    """GPT-3 2.7B at TP2 DP3 PP4 on nodes of 8: stage 0's gradient groups (ranks 0, 2, 4) sit in
    one node, stage 1's (6, 8, 10) straddle two; TP4 on nodes of 6 puts ranks 4-7 two and two on
    two nodes, so every TP all-reduce pays for the network, as with nodes of 3."""
    g = build_iteration_graph(make_workload("gpt3-2.7b", tp=2, dp=3, pp=4, mbs=1,
                                            microbatches=4))
    shapes = [(g.stage_tail[s][0].comm.nodes, g.stage_tail[s][0].comm.ranks_per_node)
              for s in range(4)]
    assert shapes == [(1, 3), (2, 1), (2, 1), (1, 3)]

    def tp_comm(gpus_per_node):
        w = make_workload("gpt3-xl", tp=4, dp=3, pp=2, gpus_per_node=gpus_per_node)
        return build_iteration_graph(w).instruction_graphs[(0, "forward")].sequential[0].comm

    # each stage's own TP groups: with nodes of 6, TP4 over three stages puts stage 1's group
    # (ranks 4-7) on two nodes and stages 0 and 2 inside one
    g3 = build_iteration_graph(make_workload("gpt3-xl", tp=4, pp=3, dp=1, gpus_per_node=6))
    assert [g3.instruction_graphs[(s, "forward")].sequential[0].comm.intra_node
            for s in range(3)] == [True, False, True]
    assert tp_comm(12).intra_node
    assert (tp_comm(6).nodes, tp_comm(6).ranks_per_node) == (2, 2)
    assert (tp_comm(3).nodes, tp_comm(3).ranks_per_node) == (2, 1)
    t12, t6, t3 = (_time(make_workload("gpt3-xl", tp=4, dp=3, pp=2, gpus_per_node=n)).energy.time_s
                   for n in (12, 6, 3))
    assert 1.4 * t12 < t6 < t3  # two NICs carry a 2 + 2 group, one a 3 + 1 group


@pytest.mark.parametrize("precision, per_param", [("bf16", 4 + 8 + 2 + 16),
                                                   ("fp16", 2 + 4 + 4 + 8 + 2 + 16),
                                                   ("tf32", 4 + 8 + 16), ("fp32", 4 + 8 + 16)])
def test_adam_step_reads_and_writes_the_master_weight(precision, per_param):
    """Adam's HBM bytes per parameter: the gradient, the fp32 master weight read and written,
    the two fp32 moments read and written, and with 16-bit training the working copy written;
    in fp32 / tf32 the weight is the master; fp16 first copies its 16-bit gradients into fp32
    main gradients (read 2, write 4), which the step reads (4)."""
    w = make_workload("gpt3-xl", tp=1, pp=1, dp=1, precision=precision)
    step = build_iteration_graph(w).stage_tail[0][-1].compute[0]
    assert step.bytes == pytest.approx(per_param * w.stage_params(0))


def test_odd_micro_batches_run_sequential_plans_only():
    w = make_workload("llama3.2-3b", mbs=3)
    assert _time(w).energy.time_s > 0
    with pytest.raises(PlanError, match="cannot be split into 2 nanobatches"):
        _time(w, nanobatched=True)


def test_host_floor_binds_at_tiny_micro_batches():
    """An instruction's cost starts from an empty queue (a pipeline stage: Megatron-LM
    synchronises at every transfer) and waits for its kernels' issue; a single stage's host runs
    ahead across the iteration, which the iteration credits, never beyond the host's own time."""
    plan = InstructionPlan.make(1410.0, False)
    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    fast = SimulatorBackend(replace(get_preset("a100-sxm4-80gb"), host_eager_op_s=1e-9,
                                    host_issue_call_s=1e-9))
    for pp in (2, 1):
        g = build_iteration_graph(make_workload("gpt3-xl", tp=8, pp=pp, mbs=1, seq=256,
                                                microbatches=4))
        ig = g.instruction_graphs[(0, "backward")]
        cost = sim.evaluate_instruction(g, (0, "backward"), plan).time_s
        host, a, b = sim.issue_map(ig, sim._scalar_index(1410.0))
        assert host == pytest.approx(sim.host_time(ig)) and cost == pytest.approx(host + max(a, b))
        assert cost > host > fast.evaluate_instruction(g, (0, "backward"), plan).time_s
    t = sim.evaluate_plan(g, IterationPlan.uniform(g, 1410.0))  # the single stage
    costs = sum(t.instruction_times[i][1] - t.instruction_times[i][0] for i in t.instruction_times)
    issue = 4 * sum(sim.host_time(g.instruction_graphs[(0, d)]) for d in ("forward", "backward"))
    tail = sum(sim._segment_cost(seg, sim._scalar_index(1410.0))[0] for seg in g.stage_tail[0])
    assert issue <= t.energy.time_s - tail < costs
    assert t.energy.time_s > fast.evaluate_plan(g, IterationPlan.uniform(g, 1410.0)).energy.time_s


def _queue(steps, lead=0.0):
    """The issue queue kernel by kernel: each starts once issued and once the one before ended;
    ``lead``: how far the GPU is already ahead of the host. Returns (host time, GPU end)."""
    issued, end = 0.0, lead
    for h, t in steps:
        issued += h
        end = max(end, issued) + t
    return issued, end


def _steps(sim, ig, f):
    gpu, steps = sim.gpu, []
    for segs, times in ((ig.sequential, ig.layers), (ig.extra, 1)):
        for _ in range(times):
            for seg in segs:
                steps += [(gpu.host_eager_op_s, float(sim._alone(op).time[f]))
                          for op in seg.compute]
                if seg.comm is not None and seg.comm.group > 1:
                    ph, _ = sim._comm_alone(seg.comm, (LIBRARY_DEFAULT,), gpu.comm_block_default)
                    steps.append((gpu.host_issue_call_s, float(ph.time[0, f])))
    return steps


@pytest.mark.parametrize("mbs, host_scale", [(2, 1.0), (8, 1.0), (8, 0.01), (1, 30.0)])
def test_issue_map_is_the_op_by_op_queue(mbs, host_scale):
    """The closed form of :meth:`SimulatorBackend.issue_map` against the queue run kernel by
    kernel, from an empty queue and from a lead, with host-bound layers (A < 0) and GPU-bound
    ones (A >= 0); and a single stage's iteration against one queue through all of it."""
    preset = get_preset("a100-sxm4-80gb")
    sim = SimulatorBackend(replace(preset, host_eager_op_s=preset.host_eager_op_s * host_scale,
                                   host_issue_call_s=preset.host_issue_call_s * host_scale))
    f = sim._scalar_index(1410.0)
    signs = set()
    for pp in (2, 1):
        g = build_iteration_graph(make_workload("gpt3-xl", tp=8, pp=pp, mbs=mbs, seq=512,
                                                microbatches=2))
        for key, ig in g.instruction_graphs.items():
            host, a, b = sim.issue_map(ig, f)
            signs.add(a >= 0)
            for lead in (0.0, 1e-4, 1.0):
                issued, end = _queue(_steps(sim, ig, f), lead)
                assert host == pytest.approx(issued) and host == pytest.approx(sim.host_time(ig))
                assert host + max(lead + a, b) == pytest.approx(end), (key, lead)
    order = [ins for seq in g.schedule().values() for ins in seq]  # the single stage
    issued, end = _queue([s for ins in order
                          for s in _steps(sim, g.instruction_graphs[ins.type_key], f)])
    r = sim.evaluate_plan(g, IterationPlan.uniform(g, 1410.0))
    tail = sum(sim._segment_cost(seg, f)[0] for seg in g.stage_tail.get(0, ()))
    assert r.energy.time_s == pytest.approx(end + tail)
    if host_scale != 1:  # a host faster (slower) than the GPU leads (trails) it everywhere
        assert signs == ({True} if host_scale < 1 else {False})


def test_single_stage_optimizers_plan_with_the_host():
    """On a host-bound single stage the optimizers plan with instruction costs that include the
    host's issue: Perseus still finds its steps, and Kareus is at least as fast as Nanobatching."""
    from pathlib import Path

    from kareus.suite.harness import run_all
    from kareus.suite.problem import make_problem

    fixture = str(Path(__file__).parent / "fixtures" / "pythia-70m")
    assert main(["frontier", "-w", fixture, "--tp", "1", "--pp", "1", "--mbs", "1", "--seq", "256",
                 "--microbatches", "2", "-o", "perseus"]) == 0
    problem = make_problem(fixture, gpu="a100-sxm4-40gb", tp=1, pp=1, mbs=2, seq=256,
                           microbatches=2)
    runs = run_all(problem, ["megatron", "nanobatch", "kareus"])
    fastest = {n: min(p.time_s for p in r.points) for n, r in runs.items()}
    assert fastest["nanobatch"] < fastest["megatron"]
    assert fastest["kareus"] <= fastest["nanobatch"] * (1 + 1e-9)


def test_unfused_attention_materialises_the_scores():
    flash = build_iteration_graph(make_workload("gpt3-xl", tp=1, pp=1))
    unfused = build_iteration_graph(make_workload("gpt3-xl", tp=1, pp=1, attention="unfused"))
    names = {op.name for seg in unfused.instruction_graphs[(0, "forward")].sequential
             for op in seg.compute}
    assert {"attention_scores", "attention_softmax", "attention_dropout",
            "attention_context"} <= names
    assert _time(make_workload("gpt3-xl", tp=1, pp=1, attention="unfused")).energy.time_s > \
        _time(make_workload("gpt3-xl", tp=1, pp=1)).energy.time_s
    assert flash.model_flops == unfused.model_flops


def test_megatron_softmax_falls_back_to_pytorch_where_its_fused_kernel_cannot_run():
    """Megatron-LM's fused causal softmax needs b x local heads to be a multiple of 4 (and half
    precision); otherwise its four PyTorch kernels run, forward and backward."""
    from workloads.graph_builder import megatron_fused_softmax

    assert megatron_fused_softmax(2, 2, 1024, 1024, "fp16")
    assert not megatron_fused_softmax(1, 2, 1024, 1024, "fp16")  # 16 heads over TP8, mbs 1
    assert not megatron_fused_softmax(4, 4, 1024, 1024, "tf32")  # not half precision
    assert not megatron_fused_softmax(4, 4, 8192, 8192, "bf16")  # too many keys
    assert not megatron_fused_softmax(2, 2, 64, 64, "fp16")  # 4 batches, 8 to a block
    job = dict(tp=8, pp=1, microbatches=2, seq=1024, attention="unfused")
    fused, fallback = (make_workload("gpt3-xl", mbs=mbs, **job) for mbs in (4, 1))
    for key in ((0, "forward"), (0, "backward")):
        f_names = [op.name for op in _kernels(fused, key)]
        names = [op.name for op in _kernels(fallback, key)]
        softmax = [n for n in names if n.startswith(("attention_softmax", "attention_mask"))]
        assert len(softmax) == 4 * len([n for n in f_names if n.startswith("attention_softmax")])
    eager = make_workload("gpt3-xl", mbs=1, elementwise="eager", **job)  # Hugging Face's own
    assert not any(op.name.startswith("attention_softmax_cast") for op in _kernels(eager))
    fp32 = [op.name for op in _kernels(make_workload("gpt3-xl", mbs=4, precision="fp32", **job))]
    assert "attention_mask" in fp32 and "attention_softmax_cast" not in fp32  # nothing to cast


def _kernels(w, key=(0, "forward")):
    ig = build_iteration_graph(w).instruction_graphs[key]
    return [op for seg in ig.sequential for op in seg.compute]


def test_eager_elementwise_runs_the_kernels_eager_code_launches():
    from workloads.graph_builder import GELU_EAGER_BWD, GELU_EAGER_FWD

    job = dict(tp=1, pp=1, mbs=2, microbatches=1, seq=1024, attention="unfused")
    fused, eager = (make_workload("gpt3-xl", elementwise=e, **job) for e in ("fused", "eager"))
    f_ops, e_ops = _kernels(fused), _kernels(eager)
    names = [op.name for op in e_ops]
    # one layer's kernels: GPT-2's tanh GELU is eight where the fused path has one
    assert names.count("activation") == len(GELU_EAGER_FWD)
    assert [op.name for op in f_ops].count("activation") == 1
    assert {"attention_scale", "attention_mask", "attention_merge", "residual_dropout",
            "residual_add"} <= set(names)
    # the same GEMMs and FLOP-bound work; only HBM traffic is added
    assert sorted(op.flops for op in e_ops if op.kind != "memory") == \
        sorted(op.flops for op in f_ops if op.kind != "memory")
    t = 2 * 1024
    ffn_tensor = fused.parallel.element_bytes * t * fused.model.ffn
    gelu = sum(op.bytes for op in e_ops if op.name == "activation")
    assert gelu == pytest.approx(ffn_tensor * sum(r + w for r, w in GELU_EAGER_FWD))
    bwd = [op for op in _kernels(eager, (0, "backward")) if op.name == "activation_bwd"]
    assert len(bwd) == len(GELU_EAGER_BWD)
    assert _time(eager).energy.time_s > _time(fused).energy.time_s
    assert build_iteration_graph(eager).model_flops == build_iteration_graph(fused).model_flops


def test_eager_bloom_uses_its_own_gelu_and_fused_scale():
    from workloads.graph_builder import BLOOM_GELU_EAGER_FWD
    from workloads.parallel import Workload

    gpt = make_workload("gpt3-xl", tp=1, pp=1, mbs=2, microbatches=1, seq=1024,
                        attention="unfused", elementwise="eager")
    bloom = Workload(model=replace(gpt.model, name="bloom-like", alibi=True, gelu="bloom"),
                     parallel=gpt.parallel,
                     name="bloom-like")
    names = [op.name for op in _kernels(bloom)]
    assert names.count("activation") == len(BLOOM_GELU_EAGER_FWD)
    assert "attention_mask" in names and "attention_scale" not in names  # baddbmm scales
    assert "attention_alibi" in names
    torch_gelu = Workload(model=replace(gpt.model, gelu="torch"), parallel=gpt.parallel,
                          name="gelu")
    assert [op.name for op in _kernels(torch_gelu)].count("activation") == 1


def test_eager_swiglu_and_flash_attention():
    from workloads.graph_builder import SWIGLU_EAGER_FWD

    w = make_workload("llama3.2-3b", tp=1, pp=1, mbs=2, microbatches=1, elementwise="eager")
    names = [op.name for op in _kernels(w)]
    assert names.count("activation") == len(SWIGLU_EAGER_FWD)
    assert "attention_scale" not in names  # flash attention scales and masks inside its kernel


@pytest.mark.parametrize("args, needle", [
    (["--elementwise", "jit"], "jit"),
    (["--stage-layers", "6,6,7"], "stage(s)"),
    (["--stage-layers", "6,x"], "comma-separated"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be a positive integer"),
    (["--precision", "fp8"], "fp8"),
    (["--recompute", "some"], "some"),
])
def test_bad_job_shape_exits_2_with_one_line(args, needle, capsys):
    status = main(["simulate", "-w", "gpt3-xl", "--tp", "1", "--pp", "4", *args])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_a_precision_the_gpu_cannot_run_is_refused(monkeypatch, capsys, tmp_path):
    raw = json.loads((BUILTIN_DIR / "a40.json").read_text())
    raw["name"] = "no-bf16"
    raw["compute"]["precisions"]["value"] = ["fp16", "fp32"]
    (tmp_path / "no-bf16.json").write_text(json.dumps(raw))
    monkeypatch.setenv("KAREUS_GPU_DIR", str(tmp_path))
    assert main(["simulate", "-w", "gpt3-xl", "--gpu", "no-bf16"]) == 2
    assert "cannot run bf16" in capsys.readouterr().err


def test_perseus_job_runs_on_the_pcie_card(capsys):
    status = main(["simulate", "-w", "gpt3-xl", "--tp", "1", "--pp", "4", "--mbs", "8",
                   "--microbatches", "8", "--seq", "1024", "--stage-layers", "6,6,7,5",
                   "--precision", "tf32", "--gpu", "a100-pcie-80gb", "--gpus-per-node", "4",
                   "--json"])
    assert status == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["stage_layers"] == [6, 6, 7, 5] and obj["parallel"]["precision"] == "tf32"


def test_power_limit_curve_follows_every_measured_limit():
    """Zeus's power limits on the Perseus GPT-3 XL job: every measured limit gets its simulated
    point, the simulated time only grows as the limit falls, and the cap holds on average."""
    from kareus.suite.datasets import perseus_measured
    from kareus.suite.megatron_runs import power_limit_curve

    path = perseus_measured("gpt3-xl_a100-pcie_pp4.csv")
    if path is None:
        pytest.skip("shared/perseus_sosp24/measured not found")
    curve = power_limit_curve(path)
    assert list(curve.power_limit_w) == [300.0, 275.0, 250.0, 225.0, 200.0, 175.0]
    assert curve.simulated_time_pct.iloc[0] == pytest.approx(0.0, abs=1e-9)
    assert (curve.simulated_time_pct.diff().iloc[1:] > 0).all()
    assert (curve.simulated_power_per_gpu_w <= curve.power_limit_w).all()
    assert (curve.measured_time_pct.diff().iloc[1:] > 0).all()


def test_locked_clock_plans_follow_the_measured_clock_law():
    """The Perseus GPT-3 XL job's 37 measured plans that lock clocks, simulated at their clocks:
    each one's change against its default plan within 3 points of the measured change, and the
    plans in the same order of time."""
    from scipy.stats import spearmanr

    from kareus.suite.datasets import perseus_measured
    from kareus.suite.megatron_runs import locked_clock_points

    path = perseus_measured("gpt3-xl_a100-pcie_pp4.csv")
    if path is None:
        pytest.skip("shared/perseus_sosp24/measured not found")
    pts = locked_clock_points(path)
    assert len(pts) == 37 and set(pts.method) == {"perseus", "envpipe"}
    assert (abs(pts.simulated_time_pct - pts.measured_time_pct) < 3).all()
    assert (abs(pts.simulated_energy_pct - pts.measured_energy_pct) < 3).all()
    assert spearmanr(pts.measured_time_s, pts.simulated_time_s).statistic > 0.9


def test_fidelity_records_the_perseus_job(tmp_path):
    """``benchmarks/fidelity.py --only perseus-measured --write`` records the savings, the
    locked-clock plans and Zeus's limits, the three things the docs render from it."""
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from kareus.suite.datasets import perseus_measured

    if perseus_measured("gpt3-xl_a100-pcie_pp4.csv") is None:
        pytest.skip("shared/perseus_sosp24/measured not found")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fidelity

    out = tmp_path / "summary.json"
    res = CliRunner().invoke(fidelity.main, ["--only", "perseus-measured", "--write", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())["perseus-measured"]
    assert [r["method"] for r in rec["rows"]] == ["perseus", "zeus_global", "envpipe"]
    assert rec["locked_clocks"]["plans"] == 37
    assert [r["power_limit_w"] for r in rec["power_limits"]] == [300, 275, 250, 225, 200, 175]


def test_unfused_cross_entropy_is_megatron_lms_passes_on_the_last_stage():
    fused = make_workload("gpt3-xl", tp=2, pp=2, mbs=4, microbatches=4, precision="fp16")
    unfused = replace(fused, parallel=replace(fused.parallel, cross_entropy="unfused"))
    gf, gu = build_iteration_graph(fused), build_iteration_graph(unfused)
    t, v = 4 * 2048, 50432 // 2  # tokens; a TP rank's share of the padded vocabulary

    def loss_bytes(g, stage, direction):
        return [op.bytes for seg in g.instruction_graphs[(stage, direction)].extra
                for op in seg.compute if op.name.startswith("cross_entropy")]

    assert loss_bytes(gu, 0, "forward") == loss_bytes(gf, 0, "forward") == []
    assert loss_bytes(gf, 1, "forward") == [10 * t * v]  # one fused kernel
    assert loss_bytes(gu, 1, "forward") == [6 * t * v, 4 * t * v, 8 * t * v, 8 * t * v,
                                            4 * t * v, 8 * t * v]  # cast, max, sub, exp, sum, div
    assert sum(loss_bytes(gu, 1, "backward")) == 14 * t * v == sum(loss_bytes(gf, 1, "backward")) + 8 * t * v
    assert _time(unfused).energy.time_s > _time(fused).energy.time_s
    fp32 = replace(unfused, parallel=replace(unfused.parallel, precision="fp32"))
    assert len(loss_bytes(build_iteration_graph(fp32), 1, "forward")) == 5  # no cast


def test_cross_entropy_option_reaches_the_job(capsys):
    assert main(["simulate", "-w", "gpt3-xl", "--cross-entropy", "unfused", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["cross_entropy"] == "unfused"
    assert main(["simulate", "-w", "gpt3-xl", "--cross-entropy", "nope"]) == 2


def test_flash_attention_falls_back_to_unfused_without_16_bit_tensors():
    """Transformer Engine's flash and fused attention run fp16 / bf16 only; with tf32 or fp32
    the core attention is the unfused path whatever --attention says, as Megatron-LM runs it."""
    for precision in ("tf32", "fp32"):
        asked = make_workload("gpt3-xl", tp=1, pp=1, precision=precision)
        unfused = make_workload("gpt3-xl", tp=1, pp=1, precision=precision, attention="unfused")
        assert asked.parallel.core_attention == "unfused"
        assert _time(asked).energy.time_s == _time(unfused).energy.time_s
    assert make_workload("gpt3-xl", precision="fp16").parallel.core_attention == "flash"


@pytest.mark.parametrize("extra, needle", [
    (["--attention", "unfused"], "not with --attention unfused"),
    (["--precision", "fp32"], "not with --precision fp32, whose attention falls back"),
])
def test_context_parallelism_needs_the_fused_attention(extra, needle, capsys):
    status = main(["simulate", "-w", "llama3.2-3b", "--cp", "2", "--tp", "4", *extra])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and needle in err


def test_flash_attention_stores_no_score_matrix():
    """Without recomputation the unfused path keeps the 5·a·s²·b score bytes per layer (Korthikanti
    et al.), and the layer being computed its 2·a·s²·b QK^T product; flash attention keeps O(s)
    per head, so its estimate has no s² term."""
    flash = make_workload("llama3.2-3b", tp=8, recompute="none")
    unfused = make_workload("llama3.2-3b", tp=8, recompute="none", attention="unfused")
    m, p = flash.model, flash.parallel
    tokens = p.mbs * p.seq
    scores = 5 * m.heads / p.tp * tokens * p.seq * p.element_bytes / 2
    stored = flash.stage_layers()[0] * min(p.pp, p.microbatches) * scores
    assert unfused.memory_estimate_bytes()[0] - flash.memory_estimate_bytes()[0] == \
        pytest.approx(stored + scores * 2 / 5, rel=1e-9)
    # a CP2 x TP4 layout fits a 40 GB card once the scores are not counted (66 GiB before)
    cp = make_workload("llama3.2-3b", tp=4, cp=2, recompute="none")
    assert cp.memory_warnings(get_preset("a100-sxm4-40gb").memory_bytes) == []


def test_mfu_is_against_the_peak_of_the_job_s_precision(capsys):
    from kareus.suite.records import iteration_details

    a100 = get_preset("a100-sxm4-40gb")
    assert a100.peak_flops_in("bf16") == a100.peak_flops == pytest.approx(312e12, rel=0.01)
    assert a100.peak_flops_in("tf32") == pytest.approx(156e12, rel=0.01)
    assert a100.peak_flops_in("fp32") == pytest.approx(19.5e12, rel=0.01)
    w = make_workload("gpt3-xl", precision="tf32")
    res = _time(w)
    details = iteration_details(res, a100, "tf32")
    e = res.energy
    assert details["mfu"] == pytest.approx(
        res.model_flops / (e.time_s * res.num_gpus * a100.peak_flops_in("tf32")))


@pytest.mark.parametrize("tp,dp,pp,mbs,microbatches", [(8, 8, 1, 8, 8), (16, 4, 1, 2, 64),
                                                       (1, 32, 2, 4, 4)])
def test_the_command_line_simulates_a_measured_run_as_the_fidelity_check_does(
        tmp_path, monkeypatch, capsys, tp, dp, pp, mbs, microbatches):
    """A user's own Megatron-LM job through the front door (a GPT-2 style config.json, the job's
    flags, a GPU file with the cluster's network; docs/getting-started.md, "Your own cluster")
    gets the very iteration time that benchmarks/fidelity.py gives the same vTrain run."""
    from kareus.suite.megatron_runs import VTRAIN_GPU, VTRAIN_NETWORK, run_workload

    pytest.importorskip("transformers")
    model = tmp_path / "gpt-3.6b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({  # the tokenizer's vocabulary: both pad it
        "model_type": "gpt2", "n_embd": 3072, "n_head": 32, "n_layer": 30,
        "n_positions": 2048, "vocab_size": 50257}))
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    raw = json.loads((BUILTIN_DIR / f"{VTRAIN_GPU}.json").read_text())
    raw["name"] = "my-cluster"
    raw["links_collectives"]["network_bw"]["value"] = VTRAIN_NETWORK["network_bw"]
    raw["links_collectives"]["network_efficiency"]["value"] = VTRAIN_NETWORK["network_efficiency"]
    (gpus / "my-cluster.json").write_text(json.dumps(raw))
    monkeypatch.setenv("KAREUS_GPU_DIR", str(gpus))
    layers = ",".join([str(30 // pp)] * pp)
    assert main(["simulate", "-w", str(model), "--tp", str(tp), "--dp", str(dp), "--pp", str(pp),
                 "--mbs", str(mbs), "--microbatches", str(microbatches), "--seq", "2048",
                 "--stage-layers", layers, "--precision", "fp16", "--recompute", "full",
                 "--attention", "unfused", "--cross-entropy", "unfused",
                 "--gpu", "my-cluster", "--json"]) == 0
    cli_s = json.loads(capsys.readouterr().out)["max_throughput"]["time_s"]
    row = {"hidden": 3072, "heads": 32, "layers": 30, "seq": 2048, "tp": tp, "dp": dp, "pp": pp,
           "mbs": mbs, "microbatches": microbatches}
    g = build_iteration_graph(run_workload(row))
    sim = SimulatorBackend(get_preset(VTRAIN_GPU).with_overrides(**VTRAIN_NETWORK))
    fidelity_s = sim.evaluate_plan(g, IterationPlan.uniform(g, sim.gpu.clock_max_mhz)).energy.time_s
    assert cli_s == pytest.approx(fidelity_s, rel=1e-9)


@pytest.mark.parametrize("tp,dp,pp,across", [(4, 1, 8, 3), (2, 2, 8, 3), (2, 1, 8, 1), (8, 1, 4, 3),
                                             (1, 2, 4, 0), (4, 3, 2, 1), (1, 1, 8, 0)])
def test_stage_boundaries_cross_nodes_where_megatron_lm_places_them(tp, dp, pp, across):
    """Each boundary's ranks, enumerated under Megatron-LM's order (TP, DP, then PP; eight GPUs
    a node): a boundary crosses nodes when any rank and its peer a stage on sit apart."""
    from workloads.parallel import ParallelConfig

    p = ParallelConfig(tp=tp, dp=dp, pp=pp, gpus_per_node=8)
    g = p.gpus_per_stage
    enumerated = tuple(any(r // 8 != (r + g) // 8 for r in range(b * g, (b + 1) * g))
                       for b in range(pp - 1))
    assert p.stage_boundaries_across_nodes() == enumerated and sum(enumerated) == across


def test_each_stage_boundary_delays_by_its_own_transfer():
    """One microbatch through three stages of unit work: the forward wave crosses each boundary
    once and the backward wave once more, so the iteration takes 6 + 2 (d0 + d1)."""
    from kareus.graph import Instruction, schedule_times

    durations = {Instruction(s, 0, d): 1.0 for s in range(3) for d in ("forward", "backward")}
    times = schedule_times(3, 1, durations, (0.1, 0.3))
    assert max(end for _, end in times.values()) == pytest.approx(6.8)
    assert times[Instruction(2, 0, "forward")][0] == pytest.approx(2.4)
    with pytest.raises(ValueError, match="3 transfer times for 2 stage boundaries"):
        schedule_times(3, 1, durations, (0.1, 0.2, 0.3))


def test_stages_sharing_a_node_send_over_nvlink():
    """TP4 over eight stages puts two stages on a node: boundaries 1, 3 and 5 cross nodes and
    take the network's time, the others NVLink's; the iteration is faster than with every
    boundary on the network; the solvers take each boundary's own."""
    w = make_workload("gpt3-xl", tp=4, pp=8, dp=1, microbatches=16)
    g = build_iteration_graph(w)
    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    times = sim.p2p_times(g)
    inside, across = times[0], times[1]
    assert inside < across and times == (inside, across) * 3 + (inside,)
    faster = sim.evaluate_plan(g, IterationPlan.uniform(g, 1410)).energy.time_s
    slowest = replace(g, p2p_across_nodes=())
    assert sim.p2p_times(slowest) == (across,) * 7
    assert faster < sim.evaluate_plan(slowest, IterationPlan.uniform(slowest, 1410)).energy.time_s


def test_the_vocabulary_is_padded_as_megatron_lm_pads_it(capsys):
    """``_vocab_size_with_padding``: a multiple of ``--make-vocab-size-divisible-by`` (128) x TP;
    GPT-2's 50,257 tokens become 50,304 at TP1 and 51,200 at TP8; 1 keeps them (Merak)."""
    assert [make_workload("gpt3-xl", tp=tp, pp=1).padded_vocab for tp in (1, 8)] == [50304, 51200]
    kept = make_workload("gpt3-xl", tp=1, pp=1, make_vocab_size_divisible_by=1)
    assert kept.padded_vocab == 50257
    w = make_workload("gpt3-xl", tp=8, pp=1)
    g = build_iteration_graph(w)
    out = next(op for seg in g.instruction_graphs[(0, "forward")].extra for op in seg.compute
               if op.name == "linear_output")
    assert out.flops == pytest.approx(2 * w.parallel.tokens_per_gpu * 2048 * 51200 / 8)
    assert main(["simulate", "-w", "gpt3-xl", "--make-vocab-size-divisible-by", "1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["make_vocab_size_divisible_by"] == 1
    assert main(["simulate", "-w", "gpt3-xl", "--make-vocab-size-divisible-by", "0"]) == 2
    assert "--make-vocab-size-divisible-by must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--mbs", "--make-vocab-size-divisible-by", "--microbatches"])
def test_an_absurd_job_integer_is_refused_in_one_line(capsys, flag):
    assert main(["simulate", "-w", "gpt3-xl", flag, "1" + "0" * 400]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "larger than any job's" in err


def test_scatter_gather_sends_one_tp_share_and_the_receiver_gathers_it(capsys):
    """Megatron-LM's scatter/gather (its default before Megatron Core): with TP > 1 each TP rank
    sends 1/TP of the activation over its own NIC and the receiving TP group all-gathers the
    pieces over NVLink; the transfer is the send and the gather. Under sequence parallelism
    the activation is already 1/TP and nothing changes; the GPU backend refuses it."""
    from kareus.backends.gpu.serialize import check_supported
    from kareus.errors import InputError

    shape = dict(tp=8, pp=2, dp=1, mbs=1, microbatches=4, seq=2048)
    whole, scattered = (build_iteration_graph(make_workload("gpt3-xl", **shape, **kw))
                        for kw in ({}, {"scatter_gather_p2p": True}))
    assert scattered.p2p.bytes == pytest.approx(whole.p2p.bytes / 8)
    gather = scattered.p2p_gather
    assert whole.p2p_gather is None
    assert (gather.collective, gather.group, gather.bytes) == ("all_gather", 8, whole.p2p.bytes)
    sim = SimulatorBackend(get_preset("a100-sxm4-80gb"))
    (t_whole,), (t_scattered,) = sim.p2p_times(whole), sim.p2p_times(scattered)
    send_only = sim.p2p_times(replace(scattered, p2p_gather=None))[0]
    gather_s = sim.collective_time(gather, sim.gpu.clock_max_mhz, None)
    assert t_scattered == pytest.approx(send_only + gather_s)
    assert send_only < t_scattered < t_whole  # across nodes: 1/8 of the bytes on the NIC
    sp = build_iteration_graph(make_workload("gpt3-xl", **shape, sequence_parallel=True,
                                             recompute="selective", scatter_gather_p2p=True))
    assert sp.p2p_gather is None and sp.p2p.bytes == pytest.approx(whole.p2p.bytes / 8)
    with pytest.raises(InputError, match="scatter-gather-p2p"):
        check_supported(make_workload("gpt3-xl", **shape, scatter_gather_p2p=True))
    assert main(["simulate", "-w", "gpt3-xl", "--tp", "8", "--pp", "2", "--mbs", "1",
                 "--microbatches", "4", "--scatter-gather-p2p", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["scatter_gather_p2p"] is True


def test_tp_gradient_collectives_beside_the_gemms(capsys):
    """``--overlap-tp-grad``: each column-parallel linear's input-gradient all-reduce runs
    beside its weight-gradient GEMM (with sequence parallelism the reduce-scatter beside it and
    the input's all-gather beside the input-gradient GEMM). Each such pair takes at least the
    longer of the two alone and at most both one after the other; the iteration gets shorter;
    an instruction's breakdown still adds up to its cost; the GPU backend refuses it."""
    from kareus.backends.gpu.serialize import check_supported
    from kareus.errors import InputError

    sim = SimulatorBackend(get_preset("a100-sxm4-40gb"))
    f_top = sim._scalar_index(sim.gpu.clock_max_mhz)
    for sp in (False, True):
        shape = dict(tp=8, pp=2, sequence_parallel=sp)
        off = build_iteration_graph(make_workload("llama3.2-3b", **shape))
        on = build_iteration_graph(make_workload("llama3.2-3b", **shape, overlap_tp_grad=True))
        bwd = on.instruction_graphs[(0, "backward")]
        beside = [seg for seg in (*bwd.sequential, *on.instruction_graphs[(1, "backward")].extra)
                  if seg.comm_beside_last]
        names = {(seg.compute[-1].name, seg.comm.name) for seg in beside}
        if sp:
            assert {("linear_fc1_dgrad", "tp_allgather_fc1_input"),
                    ("linear_fc1_wgrad", "tp_reducescatter_fc1_dgrad"),
                    ("linear_qkv_wgrad", "tp_reducescatter_qkv_dgrad"),
                    ("linear_output_wgrad", "tp_reducescatter_output_dgrad")} <= names
        else:
            assert names == {("linear_fc1_wgrad", "tp_allreduce_fc1_dgrad"),
                             ("linear_qkv_wgrad", "tp_allreduce_qkv_dgrad"),
                             ("linear_output_wgrad", "tp_allreduce_output_dgrad")}
        assert not any(seg.comm_beside_last for ig in off.instruction_graphs.values()
                       for seg in (*ig.sequential, *ig.extra))
        hidden = 0.0
        for seg in beside:
            op_t = float(sim._alone(seg.compute[-1]).time[f_top])
            comm_t = sim.collective_time(seg.comm, sim.gpu.clock_max_mhz, None)
            pair = float(sim._beside(seg.compute[-1], seg.comm)[0][f_top])
            assert max(op_t, comm_t) <= pair <= op_t + comm_t
            hidden += op_t + comm_t - pair
        assert hidden > 0
        t_off = _time(make_workload("llama3.2-3b", **shape), "a100-sxm4-40gb").energy.time_s
        t_on = _time(make_workload("llama3.2-3b", **shape, overlap_tp_grad=True),
                     "a100-sxm4-40gb").energy.time_s
        assert t_on < t_off
        ip = InstructionPlan.make(sim.gpu.clock_max_mhz)
        for key in ((0, "backward"), (1, "backward")):  # the layers; the output layer's too
            parts = sim.instruction_breakdown(on, key, ip)
            cost = sim.evaluate_instruction(on, key, ip)
            assert sum(t for t, _ in parts.values()) == pytest.approx(cost.time_s)
            assert sum(e for _, e in parts.values()) == pytest.approx(cost.dynamic_energy_j)
            assert cost.time_s < sim.evaluate_instruction(off, key, ip).time_s
    with pytest.raises(InputError, match="overlap-tp-grad"):
        check_supported(make_workload("llama3.2-3b", overlap_tp_grad=True))
    assert main(["simulate", "-w", "llama3.2-3b", "--overlap-tp-grad", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["overlap_tp_grad"] is True


def test_a_tp_group_across_nodes_is_warned_of(capsys):
    """TP spanning nodes runs every layer's collectives over the network: the commands say so
    (``placement_warnings``); TP inside a node, or DP and PP across nodes, say nothing."""
    assert make_workload("llama3.2-3b", tp=8, gpus_per_node=8).placement_warnings() == []
    assert make_workload("llama3.2-3b", tp=4, pp=2, dp=2,
                         gpus_per_node=4).placement_warnings() == []
    assert make_workload("llama3.2-3b", tp=1, dp=8, gpus_per_node=4).placement_warnings() == []
    (msg,) = make_workload("llama3.2-3b", tp=8, gpus_per_node=4).placement_warnings()
    assert msg.startswith("a TP group of 8 spans 2 nodes of --gpus-per-node 4")
    (msg6,) = make_workload("llama3.2-3b", tp=4, pp=2, dp=3, gpus_per_node=6).placement_warnings()
    assert msg6.startswith("a TP group of 4 spans 2 nodes")
    assert main(["simulate", "-w", "llama3.2-3b", "--gpus-per-node", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["placement_warnings"] == [msg]
    assert main(["simulate", "-w", "llama3.2-3b", "--gpus-per-node", "4"]) == 0
    assert f"warning: {msg}" in capsys.readouterr().out
