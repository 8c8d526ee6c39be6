"""Where an iteration's time goes (kareus.backends.breakdown): the parts add up to what the
simulator charges, and each part answers to the knob that should move it."""

import json

import pytest

from kareus.backends.breakdown import time_breakdown
from kareus.backends.sim import SimulatorBackend
from kareus.cli import main
from kareus.hardware.presets import get_preset
from kareus.plan import IterationPlan
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph


def _simulated(name: str, nanobatched: bool = False, **shape):
    w = make_workload(name, **shape)
    graph, gpu = build_iteration_graph(w), get_preset("a100-sxm4-40gb")
    sim = SimulatorBackend(gpu)
    plan = IterationPlan.uniform(graph, gpu.clock_max_mhz, nanobatched=nanobatched)
    result = sim.evaluate_plan(graph, plan)
    return sim, graph, plan, result, time_breakdown(sim, graph, plan, result,
                                                    tuple(w.stage_layers()))


@pytest.mark.parametrize("nanobatched", [False, True])
def test_parts_add_up_to_the_instructions_and_the_iteration(nanobatched):
    sim, graph, plan, result, stages = _simulated(
        "llama3.2-3b", nanobatched, tp=8, pp=2, mbs=8, microbatches=8, seq=4096)
    for ins in list(result.instruction_times)[:4]:
        cost = sim.evaluate_instruction(graph, ins.type_key, plan.instructions[ins])
        parts = sim.instruction_breakdown(graph, ins.type_key, plan.instructions[ins])
        assert sum(t for t, _ in parts.values()) == pytest.approx(cost.time_s, rel=1e-12)
        assert sum(e for _, e in parts.values()) == pytest.approx(cost.dynamic_energy_j,
                                                                 rel=1e-12)
        assert ("overlapped" in parts) == nanobatched and parts["host_wait"][1] == 0.0
    for sb in stages:
        assert sb.iteration_s == pytest.approx(result.time_s, rel=1e-12)
        assert min(sb.instructions_s, sb.waiting_s, sb.tail_s, sb.after_s) >= -1e-9
        # the parts of one micro-batch are the instructions' durations, split
        per_microbatch = sum(sb.forward_s.values()) + sum(sb.backward_s.values())
        assert 8 * per_microbatch == pytest.approx(sb.instructions_s, rel=1e-12)
    # in 1F1B the first stage ends last and waits for one micro-batch of the second (fill and
    # drain) and for transfers, at most two a micro-batch; the second stage's drain follows
    assert stages[0].after_s == pytest.approx(0.0, abs=1e-9)
    assert stages[1].after_s > 0.01
    one = sum(stages[1].forward_s.values()) + sum(stages[1].backward_s.values())
    (p2p,) = sim.p2p_times(graph)
    assert p2p > 0 and one < stages[0].waiting_s <= one + 2 * 8 * p2p + 1e-9


def test_the_collectives_vanish_without_tensor_parallelism_and_the_host_shows_at_small_batches():
    *_, tp8 = _simulated("gpt3-xl", tp=8, pp=1, dp=2, mbs=1, microbatches=16)
    *_, tp1 = _simulated("gpt3-xl", tp=1, pp=1, dp=16, mbs=1, microbatches=16)
    *_, big = _simulated("gpt3-xl", tp=8, pp=1, dp=2, mbs=16, microbatches=1)
    assert "collective" in tp8[0].forward_s and "collective" not in tp1[0].forward_s
    host_share = {name: s[0].backward_s["host_wait"] / sum(s[0].backward_s.values())
                  for name, s in (("mbs1", tp8), ("mbs16", big))}
    assert host_share["mbs1"] > 0.1 > 100 * host_share["mbs16"]
    # without stages the host issues ahead across micro-batches: the gain is the iteration's
    assert tp8[0].run_ahead_s > 0 and tp8[0].waiting_s == pytest.approx(0.0, abs=1e-9)


def test_simulate_breakdown_text_and_json(capsys):
    args = ["simulate", "-w", "gpt3-xl", "--pp", "2", "--breakdown"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "The mean micro-batch on one GPU of each stage" in text and "after its work" in text
    assert "the job's energy: the stages'" in text
    assert main(args + ["--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert [s["stage"] for s in obj["breakdown"]] == [0, 1]
    it = obj["breakdown"][1]["iteration"]
    assert (it["instructions_s"] + it["waiting_s"] - it["run_ahead_s"] + it["tail_s"]
            + it["after_s"]) == pytest.approx(obj["max_throughput"]["time_s"], rel=1e-9)
    assert main(args[:-1] + ["--json"]) == 0
    assert "breakdown" not in json.loads(capsys.readouterr().out)


def test_a_plan_under_its_own_power_limit_is_broken_down_under_that_limit():
    w = make_workload("gpt3-xl")
    graph, gpu = build_iteration_graph(w), get_preset("a100-sxm4-40gb")
    sim = SimulatorBackend(gpu)
    plan = IterationPlan.uniform(graph, gpu.clock_max_mhz, power_limit_w=250.0)
    result = sim.evaluate_plan(graph, plan)
    stages = time_breakdown(sim, graph, plan, result, tuple(w.stage_layers()))
    full = sim.evaluate_plan(graph, IterationPlan.uniform(graph, gpu.clock_max_mhz))
    assert result.time_s > 1.05 * full.time_s  # the limit throttles the GEMMs
    assert [sb.iteration_s for sb in stages] == pytest.approx([result.time_s] * 2, rel=1e-12)
    assert min(sb.waiting_s for sb in stages) >= -1e-9
    for sb in stages:  # the parts are the limited backend's instruction costs
        per_microbatch = sum(sb.forward_s.values()) + sum(sb.backward_s.values())
        assert graph.microbatches * per_microbatch == pytest.approx(sb.instructions_s, rel=1e-12)


def test_each_stage_s_energy_is_the_iteration_s_per_gpu_energy():
    _, graph, _, result, stages = _simulated("gpt3-xl", pp=2)
    assert [sb.energy_j for sb in stages] == [result.per_gpu_energy_j[s] for s in (0, 1)]
    total = sum(sb.energy_j for sb in stages) * graph.gpus_per_stage
    assert total == pytest.approx(result.energy.total_j, rel=1e-12)
    assert all(0 < sb.dynamic_j < sb.energy_j for sb in stages)


@pytest.mark.parametrize("optimizer", ["zeus-power-limit", "nanobatch-perseus"])
def test_frontier_breakdown_adds_up_under_a_power_limit_and_nanobatched(optimizer, capsys):
    assert main(["frontier", "-w", "gpt3-xl", "-o", optimizer, "--breakdown", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    fastest, stages = obj["points"][0], obj["breakdown"]["stages"]
    for stage in stages:
        it = stage["iteration"]
        assert (it["instructions_s"] + it["waiting_s"] - it["run_ahead_s"] + it["tail_s"]
                + it["after_s"]) == pytest.approx(fastest["time_s"], rel=1e-12)
    energy = sum(s["iteration"]["energy_j"] for s in stages) * obj["gpus_per_stage"]
    assert energy == pytest.approx(fastest["energy_j"], rel=1e-12)
    overlapped = any("overlapped" in s["microbatch"]["forward_s"] for s in stages)
    assert overlapped == (optimizer == "nanobatch-perseus")


def test_frontier_breakdown_of_the_chosen_plan(capsys):
    args = ["frontier", "-w", "gpt3-xl", "-o", "perseus", "--breakdown"]
    assert main(args + ["--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    fastest = obj["points"][0]
    budget = (fastest["time_s"] + obj["points"][-1]["time_s"]) / 2
    assert main(args + ["--json", "--time-budget-s", str(budget)]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert chosen["breakdown"]["plan_id"] == chosen["choice"]["plan_id"] != 0
    stages = chosen["breakdown"]["stages"]
    energy = sum(s["iteration"]["energy_j"] for s in stages) * chosen["gpus_per_stage"]
    assert energy == pytest.approx(chosen["choice"]["energy_j"], rel=1e-9)
    assert main(args + ["--time-budget-s", str(budget)]) == 0
    assert f"where plan {chosen['choice']['plan_id']}'s time and energy go (the choice)" in (
        capsys.readouterr().out)


def test_frontier_breakdown_needs_the_simulator(monkeypatch, capsys):
    import dataclasses

    from kareus.suite import problem as problem_module

    real = problem_module.make_problem

    class Elsewhere:  # a backend that is not the simulator
        name = "elsewhere"

    def elsewhere(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), backend=Elsewhere())

    # refused before any work where the command line names another backend
    assert main(["frontier", "-w", "gpt3-xl", "-o", "megatron", "--backend", "gpu",
                 "--breakdown"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --breakdown needs the simulator backend (--backend sim), not gpu")
    # and where a backend turns out not to be the simulator
    monkeypatch.setattr(problem_module, "make_problem", elsewhere)
    assert main(["frontier", "-w", "gpt3-xl", "-o", "megatron", "--breakdown"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --breakdown needs the simulator backend (--backend sim), not elsewhere"
