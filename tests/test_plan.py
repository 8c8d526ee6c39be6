"""The plan's one JSON form and its one validation (kareus/plan.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from kareus.errors import PlanError
from kareus.graph import Instruction
from kareus.plan import InstructionPlan, IterationPlan, PartitionSchedule
from kareus.suite.export import partition_schedules
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph


@pytest.fixture(scope="module")
def graph():
    """Two stages, four microbatches, nanobatched partitions (TP 2, MBS 2)."""
    return build_iteration_graph(make_workload("llama3.2-3b", tp=2, pp=2, mbs=2, seq=1024,
                                               microbatches=4))


def _keys(graph, key=(0, "forward")):
    return [p.key for p in graph.instruction_graphs[key].partitions]


def _round_trip(plan: IterationPlan) -> IterationPlan:
    return IterationPlan.from_json(json.loads(json.dumps(plan.to_json())))


def _nanobatched(graph) -> IterationPlan:
    """Every instruction nanobatched, clocks and schedules varying by instruction, every kind
    of schedule (library kernel, tuned SMs, sequential, explicit window, threads per block)."""
    ins = {}
    for s, seq in graph.schedule().items():
        for i, x in enumerate(seq):
            keys = _keys(graph, x.type_key)
            scheds = {keys[0]: PartitionSchedule(None, 0, None),
                      keys[1]: PartitionSchedule(6 + i % 3, 1, 2, 512),
                      keys[2]: PartitionSchedule(4, -1, -1)}
            ins[x] = InstructionPlan.make(1410.0 - 15 * i, True, scheds)
    return IterationPlan(ins, label="nanobatched")


def test_round_trips_every_plan_kind(graph, a100):
    plans = [IterationPlan.uniform(graph, 1410.0, label="megatron"),
             _nanobatched(graph),
             IterationPlan.uniform(graph, 1410.0, power_limit_w=250.0, label="zeus 250 W")]
    for plan in plans:
        plan.validate(graph, a100)
        back = _round_trip(plan)
        assert back == plan and back.to_json() == plan.to_json()
        assert back.power_limit_w == plan.power_limit_w and back.label == plan.label


def test_the_form_is_per_stage_in_1f1b_order(graph):
    form = _nanobatched(graph).to_json()
    assert list(form) == ["label", "power_limit_w", "stages"]
    order = graph.schedule()
    for st in form["stages"]:
        assert [(r["instruction"], r["microbatch"]) for r in st["instructions"]] == \
            [(i.direction, i.microbatch) for i in order[st["stage"]]]
    row = form["stages"][0]["instructions"][0]
    assert list(row) == ["instruction", "microbatch", "clock_mhz", "nanobatched", "partitions"]
    assert list(next(iter(row["partitions"].values()))) == ["comm_sms", "block_size",
                                                            "launch_slot", "wait_after"]


def test_a_partial_plan_still_serialises(graph):
    """Plans that cover no whole schedule (one instruction, a job's test plan) keep a stable
    order: by stage, microbatch and direction."""
    one = {Instruction(1, 2, "backward"): InstructionPlan.make(1200.0),
           Instruction(1, 0, "forward"): InstructionPlan.make(1300.0)}
    plan = IterationPlan(one)
    assert [r["microbatch"] for r in plan.to_json()["stages"][0]["instructions"]] == [0, 2]
    assert _round_trip(plan) == plan


def test_export_is_the_form_with_windows_resolved(graph):
    plan = _nanobatched(graph)
    form, js = plan.to_json(), partition_schedules(graph, plan)
    assert list(js) == ["workload", "label", "stages"]
    assert [[(r["instruction"], r["microbatch"], r["clock_mhz"], r["nanobatched"])
             for r in st["instructions"]] for st in js["stages"]] == \
        [[(r["instruction"], r["microbatch"], r["clock_mhz"], r["nanobatched"])
          for r in st["instructions"]] for st in form["stages"]]
    parts = js["stages"][0]["instructions"][0]["partitions"]
    a, b, c = _keys(graph)[:3]
    n = len(graph.instruction_graphs[(0, "forward")].partitions[0].compute)
    assert parts[a]["wait_after"] == n - 1 and parts[a]["launch_before"] is not None
    assert parts[b]["block_size"] == 512 and (parts[b]["launch_slot"], parts[b]["wait_after"]) \
        == (1, 2)
    assert parts[c]["launch_before"] is None and parts[c]["wait_after_op"] is None
    assert list(parts[a]) == ["comm_sms", "block_size", "launch_slot", "wait_after",
                              "launch_before", "wait_after_op"]


@pytest.mark.parametrize("mutate,fragment", [
    (lambda d: d.pop("stages"), "lacks stages"),
    (lambda d: d.update(extra=1), "unknown field(s) extra"),
    (lambda d: d.update(power_limit_w="high"), "power_limit_w"),
    (lambda d: d["stages"][0]["instructions"][0].pop("clock_mhz"), "lacks clock_mhz"),
    (lambda d: d["stages"][0]["instructions"][0].update(instruction="sideways"), "sideways"),
    (lambda d: d["stages"][0]["instructions"][0].update(clock_mhz="fast"), "fast"),
    (lambda d: d["stages"][0]["instructions"][0]["partitions"].update(x={"sms": 3}),
     "unknown field(s) sms"),
    (lambda d: d["stages"][0]["instructions"].append(d["stages"][0]["instructions"][0]),
     "appears twice"),
    (lambda d: d.update(stages={}), "stages must be a list"),
])
def test_malformed_json_is_one_line(graph, mutate, fragment):
    d = _nanobatched(graph).to_json()
    mutate(d)
    with pytest.raises(PlanError, match="plan JSON") as e:
        IterationPlan.from_json(d)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def _with(plan: IterationPlan, ins: Instruction, ip: InstructionPlan) -> IterationPlan:
    return IterationPlan({**plan.instructions, ins: ip}, plan.power_limit_w, plan.label)


def _cases(graph):
    base = IterationPlan.uniform(graph, 1410.0)
    first = Instruction(0, 0, "forward")
    key = _keys(graph)[0]
    n = len(graph.instruction_graphs[(0, "forward")].partitions[0].compute)
    nano = lambda s: _with(base, first, InstructionPlan.make(1410.0, True, {key: s}))  # noqa: E731
    return [
        ("missing", IterationPlan({first: base.instructions[first]}), "no entry for"),
        ("unknown instruction", _with(base, Instruction(0, 9, "forward"),
                                      base.instructions[first]), "the graph does not run"),
        ("unknown stage", _with(base, Instruction(5, 0, "forward"),
                                base.instructions[first]), "the graph does not run"),
        ("clock too high", _with(base, first, InstructionPlan.make(5000.0)), "outside"),
        ("clock too low", _with(base, first, InstructionPlan.make(100.0)), "outside"),
        ("clock nan", _with(base, first, InstructionPlan.make(math.nan)), "invalid clock"),
        ("clock negative", _with(base, first, InstructionPlan.make(-5.0)), "invalid clock"),
        ("clock between steps", _with(base, first, InstructionPlan.make(1234.0)),
         "not one of a100-sxm4-40gb's lockable clocks (15 MHz steps): 1230 or 1245"),
        ("unknown partition", _with(base, first, InstructionPlan.make(
            1410.0, True, {"nope/0": PartitionSchedule()})), "unknown partition 'nope/0'"),
        ("window past the ops", nano(PartitionSchedule(4, 0, n)), "window"),
        ("window backwards", nano(PartitionSchedule(4, 2, 1)), "window"),
        ("half sequential", nano(PartitionSchedule(4, -1, 0)), "-1 must be on both sides"),
        ("too many SMs", nano(PartitionSchedule(99, 0)), "communication SMs 99 outside"),
        ("zero SMs", nano(PartitionSchedule(0, 0)), "communication SMs 0 outside"),
        ("odd block", nano(PartitionSchedule(4, 0, None, 100)), "threads per block"),
        ("float slot", nano(PartitionSchedule(4, 1.5)), "not an integer"),
        ("power limit at static", replace(base, power_limit_w=50.0), "invalid power limit"),
        ("power limit nan", replace(base, power_limit_w=math.nan), "invalid power limit"),
        ("power limit above the board's", replace(base, power_limit_w=450.0),
         "at most its board limit 400 W"),
    ]


def test_each_validation_error_is_one_plan_error(graph, a100):
    for name, plan, fragment in _cases(graph):
        with pytest.raises(PlanError) as e:
            plan.validate(graph, a100)
        assert fragment in str(e.value), (name, str(e.value))
        assert "\n" not in str(e.value)


def test_backend_limits_and_nanobatch_refusal(graph, a100):
    key = _keys(graph)[0]
    plan = _with(IterationPlan.uniform(graph, 1410.0), Instruction(0, 0, "forward"),
                 InstructionPlan.make(1410.0, True, {key: PartitionSchedule(20, 0, None, 512)}))
    plan.validate(graph, a100)
    with pytest.raises(PlanError, match="communication SMs 20 outside 1..8"):
        plan.validate(graph, a100, max_comm_sms=8)
    library = _with(IterationPlan.uniform(graph, 1410.0), Instruction(0, 0, "forward"),
                    InstructionPlan.make(1410.0, True, {key: PartitionSchedule(0, 0, None)}))
    with pytest.raises(PlanError, match=r"SMs 0 outside .*comm_sms=None in a schedule"):
        library.validate(graph, a100)  # the knob space's 0 is a schedule's None
    with pytest.raises(PlanError, match="threads per block cannot be set"):
        plan.validate(graph, a100, block_size_settable=False)
    odd = build_iteration_graph(make_workload("llama3.2-3b", tp=2, pp=2, mbs=1, seq=1024,
                                              microbatches=4))
    with pytest.raises(PlanError, match="cannot be split into 2 nanobatches"):
        IterationPlan.uniform(odd, 1410.0, True).validate(odd, a100)
    with pytest.raises(PlanError, match="unknown instruction"):
        InstructionPlan.make(1410.0).validate(graph, (7, "forward"), a100)


def test_everyone_calls_the_one_validation(graph, a100, sim):
    """The simulator, the GPU backend's check and the harness refuse the same plans with the
    same message."""
    from kareus.suite.harness import validate_plans

    class _Problem:
        pass

    problem = _Problem()
    problem.graph, problem.gpu = graph, a100
    for name, plan, fragment in _cases(graph):
        with pytest.raises(PlanError, match="plan 0: ") as e:
            validate_plans([plan], problem)  # type: ignore[arg-type]
        assert fragment in str(e.value)
        with pytest.raises(PlanError) as e2:
            sim.evaluate_plan(graph, plan)
        assert fragment in str(e2.value), name


def test_keys_of_the_wrong_kind_are_named_in_one_line(graph, a100):
    """A plugin author's likely slips: partitions, not their key strings, as schedule keys; an
    instruction type (stage, direction), not an Instruction, as a plan key."""
    parts = graph.instruction_graphs[(0, "forward")].partitions
    with pytest.raises(PlanError, match="Partition.key"):
        InstructionPlan.make(1410.0, True, {p: PartitionSchedule() for p in parts})
    plan = IterationPlan({(0, "forward"): InstructionPlan.make(1410.0)})
    with pytest.raises(PlanError, match=r"must be kareus.graph.Instruction .*\(0, 'forward'\)"):
        plan.validate(graph, a100)


@pytest.mark.parametrize("label,meta", [(object(), {}), ("x", None), ("x", ["choice"])])
def test_a_plugin_plan_with_a_bad_label_or_meta_fails_alone(graph, a100, label, meta):
    """The harness reads a plan's label and meta after evaluating it (the chosen plan, the
    results' records): a plan whose label is not a str or meta not a mapping is the plugin's
    failure, caught with the others, not a crash of the whole run."""
    from kareus.errors import PluginError
    from kareus.suite.harness import validate_plans

    class _Problem:
        pass

    problem = _Problem()
    problem.graph, problem.gpu = graph, a100
    plan = replace(IterationPlan.uniform(graph, 1410.0), label=label, meta=meta)
    with pytest.raises(PluginError, match="plan 0: label must be a str and meta a mapping"):
        validate_plans([plan], problem)  # type: ignore[arg-type]
