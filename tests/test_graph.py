import pytest

from kareus.graph import ComputeOp, dag_dependencies, one_f_one_b, topological_order
from workloads import make_workload
from workloads.graph_builder import (
    CAUSAL_TAIL_BWD,
    CAUSAL_TAIL_FWD,
    TE_CP_ATTENTION_HOST_CALLS,
    attention_op,
    build_iteration_graph,
    model_flops,
)


def _names(graph, key):
    return [p.key.split("/")[0] for p in graph.instruction_graphs[key].partitions]


def test_tp_only_partition_keys_follow_the_paper(llama_tp8):
    assert _names(llama_tp8, (0, "forward")) == ["fwd_attn", "fwd_attn", "fwd_mlp", "fwd_mlp"]
    bwd = _names(llama_tp8, (0, "backward"))
    assert bwd[4:] == ["bwd_mlp", "bwd_mlp", "bwd_attn", "bwd_attn"]
    assert bwd[:4] == ["rcp_fwd_attn", "rcp_fwd_attn", "rcp_fwd_mlp", "rcp_fwd_mlp"]


def test_cp_tp_partition_keys_follow_the_paper(llama_cp2):
    assert _names(llama_cp2, (1, "forward")) == [
        "fwd_qkv_ar", "fwd_qkv_ag", "fwd_ao_ag", "fwd_ao_ar", "fwd_mlp", "fwd_mlp"]
    assert _names(llama_cp2, (1, "backward"))[6:] == [
        "bwd_mlp", "bwd_mlp", "bwd_o_ar", "bwd_o_ag", "bwd_a_ag", "bwd_a_rs", "bwd_qkv_rs",
        "bwd_qkv_ar"]


def test_only_context_parallel_attention_makes_framework_host_calls(llama_tp8, llama_cp2):
    """Transformer Engine's all-gather CP attention issues dozens of host calls around its kernels
    (counted from its source); a TP-only layer's attention and every other op issue one each."""
    def calls(graph):
        out = {}
        for key, ig in graph.instruction_graphs.items():
            for part in ig.partitions:
                for op in part.compute:
                    out.setdefault((op.kind, op.backward), set()).add(op.host_calls)
        return out

    assert all(c == {0} for c in calls(llama_tp8).values())
    cp = calls(llama_cp2)
    assert cp[("attention", False)] == {TE_CP_ATTENTION_HOST_CALLS[False]}
    assert cp[("attention", True)] == {TE_CP_ATTENTION_HOST_CALLS[True]}
    assert all(c == {0} for (kind, _), c in cp.items() if kind != "attention")


def test_each_compute_overlaps_the_other_nanobatchs_collective(llama_tp8):
    parts = llama_tp8.instruction_graphs[(0, "forward")].partitions
    assert [p.key for p in parts] == ["fwd_attn/0", "fwd_attn/1", "fwd_mlp/0", "fwd_mlp/1"]
    # fwd_attn/1 (nanobatch 1's attention) hides nanobatch 0's attention all-reduce
    assert parts[1].comm.name == "tp_allreduce_attn"
    assert parts[0].comm.name == "tp_allreduce_mlp"  # previous layer's last collective
    assert parts[0].slots == ("bda_0", "norm_0", "linear_0", "rope_0", "attn_0", "linear_1")


def test_message_sizes_and_groups(llama_tp8, llama_cp2):
    h, seq = 3072, 4096
    seg = llama_tp8.instruction_graphs[(0, "forward")].sequential[0]
    assert seg.comm.collective == "all_reduce" and seg.comm.group == 8
    assert seg.comm.bytes == 2 * 8 * seq * h  # bf16 [mbs*seq, hidden]
    half = llama_tp8.instruction_graphs[(0, "forward")].partitions[1].comm
    assert half.bytes == seg.comm.bytes / 2
    ag = llama_cp2.instruction_graphs[(0, "forward")].sequential[0].comm
    assert ag.collective == "all_gather" and ag.group == 2
    kv_local = 8 // 4  # kv heads per TP rank
    assert ag.bytes == 2 * 2 * 8 * seq * kv_local * 128  # K and V of the full sequence
    assert llama_tp8.p2p.bytes == 2 * 8 * seq * h and not llama_tp8.p2p.intra_node


def test_forward_flops_match_the_dense_parameter_rule():
    w = make_workload("llama3.2-3b", tp=1, pp=1, mbs=2, seq=1024)
    g = build_iteration_graph(w)
    ig = g.instruction_graphs[(0, "forward")]
    gemm = sum(op.flops for s in ig.sequential for op in s.compute if op.kind == "gemm")
    tokens = 2 * 1024
    m = w.model
    dense = m.layer_params() - 2 * m.hidden  # matmul weights only (no norm scales)
    assert gemm == pytest.approx(2 * tokens * dense, rel=1e-9)  # one layer
    attn = sum(op.flops for s in ig.sequential for op in s.compute if op.kind == "attention")
    # causal: QK^T and PV over half the score matrix, per sequence
    assert attn == pytest.approx(2 * 2 * 2 * 1024 * 1024 * m.q_width / 2, rel=1e-9)
    assert model_flops(w) == g.model_flops > 3 * ig.layers * (gemm + attn)


def test_backward_gemms_are_twice_the_forward(llama_tp8):
    def gemm(key, prefix):
        ig = llama_tp8.instruction_graphs[key]
        return sum(op.flops for p in ig.partitions if p.key.startswith(prefix)
                   for op in p.compute if op.kind == "gemm")
    assert gemm((0, "backward"), "bwd") == pytest.approx(2 * gemm((0, "forward"), "fwd"))
    assert gemm((0, "backward"), "rcp") == pytest.approx(gemm((0, "forward"), "fwd"))


def test_one_f_one_b_order():
    order = one_f_one_b(4, 6)
    for s, seq in order.items():
        assert sum(i.direction == "forward" for i in seq) == 6
        assert sum(i.direction == "backward" for i in seq) == 6
        warm = 0
        while seq[warm].direction == "forward":
            warm += 1
        assert warm == min(4 - s - 1, 6) + 1  # warm-up forwards, then the first steady forward
    assert [i.direction[0] for i in order[3]][:4] == ["f", "b", "f", "b"]


def test_the_1f1b_order_is_built_once_and_handed_out_fresh():
    """Callers get their own dict and lists (a caller that edits them changes no one else's);
    the instructions are the same objects each time, the dependencies' too."""
    first, second = one_f_one_b(3, 4), one_f_one_b(3, 4)
    assert first == second and first[0] is not second[0]
    first[0].clear()
    assert one_f_one_b(3, 4) == second
    assert all(a is b for a, b in zip(second[1], one_f_one_b(3, 4)[1]))
    deps = dag_dependencies(3, 4)
    stage_of = {ins: ins for seq in second.values() for ins in seq}
    assert all(stage_of[p] is p for preds in deps.values() for p in preds)
    deps[second[1][0]].append(second[2][0])
    assert second[2][0] not in dag_dependencies(3, 4)[second[1][0]]


def test_dag_is_acyclic_and_respects_dependencies():
    deps = dag_dependencies(3, 5)
    topo = topological_order(3, 5)
    pos = {ins: i for i, ins in enumerate(topo)}
    assert len(topo) == 3 * 5 * 2
    for ins, pred in deps.items():
        assert all(pos[p] < pos[ins] for p in pred)


def test_uneven_split_reaches_instructions(llama_tp8):
    assert llama_tp8.instruction_graphs[(0, "forward")].layers == 15
    assert llama_tp8.instruction_graphs[(1, "forward")].layers == 13
    assert any(op.name == "linear_output" for s in llama_tp8.instruction_graphs[(1, "forward")].extra
               for op in s.compute)
    assert any(op.name == "embedding" for s in llama_tp8.instruction_graphs[(0, "forward")].extra
               for op in s.compute)


def test_tp1_has_no_collectives_but_still_partitions():
    g = build_iteration_graph(make_workload("gpt3-xl", tp=1, pp=1, mbs=2))
    ig = g.instruction_graphs[(0, "forward")]
    assert all(p.comm is None for p in ig.partitions)
    assert all(isinstance(op, ComputeOp) for p in ig.partitions for op in p.compute)


def test_causal_attention_carries_the_tail_of_its_uneven_tiles():
    fwd = attention_op("a", 2, 16, 16, 64, 4096, 4096)
    bwd = attention_op("a", 2, 16, 16, 64, 4096, 4096, backward=True)
    full = attention_op("a", 2, 16, 16, 64, 4096, 4096, causal=False)
    assert (fwd.uneven_tail, bwd.uneven_tail, full.uneven_tail) == \
        (CAUSAL_TAIL_FWD, CAUSAL_TAIL_BWD, None)


def test_the_causal_tails_are_what_list_scheduling_of_the_grid_gives():
    """The constants are the means ``benchmarks/attention_tail.py`` derives (greedy dispatch of
    FlashAttention-2's grid in order); a change to either side shows here."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "attention_tail.py")],
                         capture_output=True, text=True, check=True, cwd=root).stdout
    means = dict(re.findall(r"^(forward|backward)\s*: mean ([0-9.]+)", out, re.M))
    assert float(means["forward"]) == pytest.approx(CAUSAL_TAIL_FWD, abs=0.01)
    assert float(means["backward"]) == pytest.approx(CAUSAL_TAIL_BWD, abs=0.01)
