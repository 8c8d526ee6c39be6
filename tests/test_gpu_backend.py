"""GPUBackend on CPU with a fake NVML device: the Backend protocol end to end (plan, instruction,
partition), per-instruction clock locking and restore through a whole plan, the energy
accounting of measured windows, plan/workload (de)serialisation, the torchrun launcher's error
paths, and the calibration profiler."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kareus.backends.base import Backend
from kareus.backends.gpu import GPUBackend
from kareus.backends.gpu.backend import aggregate_iteration
from kareus.backends.gpu.device import FakeDevice
from kareus.backends.gpu.measure import MeasureConfig, WindowResult
from kareus.backends.gpu.results import (
    InstructionSpan,
    PartitionResult,
    PlanResult,
    RankInfo,
    StaticPowerResult,
    result_from_dict,
)
from kareus.backends.gpu.runner import modes as runner_modes
from kareus.backends.gpu.serialize import (
    NCCL_MAX_CTAS,
    Job,
    reduced_workload,
    workload_from_graph,
)
from kareus.energy import dynamic_from_measured
from kareus.errors import InputError, PlanError
from kareus.graph import Instruction
from kareus.hardware.presets import get_preset
from kareus.plan import InstructionPlan, IterationPlan, PartitionSchedule
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph
from workloads.models import ModelSpec
from workloads.parallel import ParallelConfig, Workload

H200 = get_preset("h200")
TINY = ModelSpec("tiny", hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, layers=2,
                 vocab=96, native_seq=32, mlp="swiglu", norm="rmsnorm", qk_norm=True,
                 tied_embeddings=True)
QUICK = MeasureConfig(warmup_s=0, warmup_steps=1, window_s=0, min_steps=2)


pytestmark = pytest.mark.usefixtures("one_thread")


def cpu_backend(**kw) -> GPUBackend:
    return GPUBackend(H200, device="cpu", dtype="float32", fake_device=True, measure=QUICK, **kw)


@pytest.fixture(scope="module")
def tiny():
    return Workload(TINY, ParallelConfig(tp=1, pp=1, mbs=4, seq=32, microbatches=2))


@pytest.fixture()
def shared_fake(monkeypatch):
    """Every device the runner opens is this one fake (300 W constant)."""
    dev = FakeDevice(power_w=300.0)
    monkeypatch.setattr(runner_modes, "open_device", lambda i, fake=False: dev)
    return dev


def test_plan_end_to_end_on_cpu(tiny, ticking_fake):
    b = cpu_backend()
    assert isinstance(b, Backend)
    g = b.bind(tiny)
    res = b.evaluate_plan(g, IterationPlan.uniform(g, 1980.0))
    rank = b.last_run[0]
    assert isinstance(rank, PlanResult)
    t = rank.window.time_s / rank.window.steps
    assert res.time_s == pytest.approx(t) and rank.window.steps >= 2
    # the fake draws 300 W: total = measured, dynamic = measured - P_s * t (kareus.energy)
    assert res.energy.total_j == pytest.approx(rank.window.energy_j / rank.window.steps)
    assert res.energy.total_j == pytest.approx(300.0 * t, rel=1e-9)
    assert res.energy.dynamic_j == pytest.approx((300.0 - 110.0) * t, rel=1e-9)
    assert res.energy.static_j == pytest.approx(110.0 * t)
    assert set(res.instruction_times) == {Instruction(0, m, d) for m in range(2)
                                          for d in ("forward", "backward")}
    assert not rank.info.clocks_locked and "current clocks" in rank.info.clock_control
    assert ticking_fake.calls == []  # clock control off: nothing touched
    assert len(rank.losses) == 2 and all(3.0 < x < 6.0 for x in rank.losses)


def test_plan_locks_clock_per_instruction_and_restores(tiny, shared_fake):
    b = cpu_backend(allow_clock_control=True)
    g = b.bind(tiny)
    ins = {i: InstructionPlan.make(1500.0 if i.direction == "forward" else 1200.0,
                                   i.microbatch == 1)
           for seq in g.schedule().values() for i in seq}
    b.evaluate_plan(g, IterationPlan(ins, power_limit_w=500.0))
    calls = shared_fake.calls
    assert calls[0] == "power_limit 500"
    # per iteration: F0 1500, B0 1200, F1 1500, B1 1200, tail at the max clock
    one = ["lock 1500", "lock 1200", "lock 1500", "lock 1200", "lock 1980"]
    body = calls[1:-2]
    assert len(body) % len(one) == 0 and body == one * (len(body) // len(one))
    assert calls[-2:] == ["reset_clock", "power_limit 700"]
    rank = b.last_run[0]
    assert isinstance(rank, PlanResult)
    assert rank.info.clocks_locked and rank.power_limit_applied


@pytest.fixture()
def ticking_fake(monkeypatch):
    """The 300 W fake device, its energy counter and the runner's meter on one clock that
    advances a millisecond at every read: the meter reads the time, then the counter, at each
    end of a window, so both see the same span, however busy the machine (on the wall clock,
    a few milliseconds between the two reads made windows of ten disagree by half)."""
    import itertools
    import threading

    from kareus.backends.gpu.measure import CounterMeter

    ticks, lock = itertools.count(1), threading.Lock()

    def clock() -> float:
        with lock:
            return next(ticks) * 1e-3

    dev = FakeDevice(power_w=300.0, time_fn=clock)
    monkeypatch.setattr(runner_modes, "open_device", lambda i, fake=False: dev)
    monkeypatch.setattr("kareus.backends.gpu.device.zeus_available", lambda: False)
    monkeypatch.setattr(runner_modes, "CounterMeter",
                        lambda devices, sync=None: CounterMeter(devices, sync, time_fn=clock))
    return dev


def test_instruction_and_partition_on_cpu(tiny, ticking_fake):
    b = cpu_backend()
    g = b.bind(tiny)
    for key in sorted(g.instruction_graphs):
        parts = g.instruction_graphs[key].partitions
        sched = {p.key: PartitionSchedule(6, i % len(p.compute), len(p.compute) - 1 - i % 2
                                          if i % len(p.compute) < len(p.compute) - 1 else None)
                 for i, p in enumerate(parts)}
        cost = b.evaluate_instruction(g, key, InstructionPlan.make(1980.0, True, sched))
        assert cost.time_s > 0
        assert cost.dynamic_energy_j == pytest.approx((300.0 - 110.0) * cost.time_s, rel=1e-9)
    part = g.instruction_graphs[(0, "backward")].partitions[2]
    grid = b.evaluate_partition(part, np.array([1980.0, 1500.0]), np.array([6, 12]),
                                np.array([[0, 0], [1, 2], [-1, -1]]))
    assert grid.time_s.shape == (2, 2, 3) and np.all(grid.time_s > 0)
    assert grid.key == part.key
    t, e = b.measure_partition_op(part, 1, 1980.0)
    # the op's window is tens of µs, where the meter's and the wall clock's reads differ by a
    # good share of it on a loaded machine (1.3x the fake's 300 W seen under a parallel test
    # run): hold the accounting on what each rank read; test_plan_end_to_end_on_cpu holds the
    # 300 W over long windows
    rows = [r.rows[0].window for r in b.last_run if isinstance(r, PartitionResult)]
    assert len(rows) == len(b.last_run)
    assert t == max(r.time_s / r.steps for r in rows) > 0
    measured = float(np.mean([r.energy_j / r.steps for r in rows]))
    assert measured > 0 and e == pytest.approx(dynamic_from_measured(measured, 110.0, t))
    with pytest.raises(PlanError, match="window"):
        b.evaluate_partition(part, np.array([1980.0]), np.array([6]), np.array([[99, 99]]))
    with pytest.raises(PlanError, match="threads per block"):
        b.evaluate_partition(part, np.array([1980.0]), np.array([6]), np.array([[0, 0]]), 512)
    other = build_iteration_graph(make_workload("qwen3-1.7b")).instruction_graphs[
        (0, "forward")].partitions[0]
    with pytest.raises(InputError, match="bind"):
        b.evaluate_partition(other, np.array([1980.0]), np.array([6]), np.array([[0, 0]]))


def test_unsupported_and_invalid_plans(tiny):
    b = cpu_backend()
    g = build_iteration_graph(make_workload("llama3.2-3b", tp=4, cp=2))
    with pytest.raises(InputError, match="context parallelism"):
        b.evaluate_plan(g, IterationPlan.uniform(g, 1980.0))
    for shape in ({"elementwise": "eager"}, {"attention": "unfused"}, {"cross_entropy": "unfused"},
                  {"dp": 2, "distributed_optimizer": True},
                  {"dp": 2, "overlap_grad_reduce": True}):
        w = make_workload("llama3.2-3b", tp=4, **shape)
        with pytest.raises(InputError, match="simulator-only"):  # told the job, or not
            b.evaluate_plan(b.bind(w), IterationPlan.uniform(b.bind(w), 1980.0))
        with pytest.raises(InputError, match="simulator-only"):
            g = build_iteration_graph(w)
            cpu_backend().evaluate_plan(g, IterationPlan.uniform(g, 1980.0))
    g = b.bind(tiny)
    plan = IterationPlan.uniform(g, 1980.0, True, {"nope/0": PartitionSchedule(6, 0)})
    with pytest.raises(PlanError, match="unknown partition"):
        b.evaluate_plan(g, plan)
    key = g.instruction_graphs[(0, "forward")].partitions[0].key
    with pytest.raises(PlanError, match="communication SMs"):
        b.evaluate_plan(g, IterationPlan.uniform(g, 1980.0, True,
                                                 {key: PartitionSchedule(200, 0)}))
    with pytest.raises(PlanError, match="threads per block"):
        b.evaluate_instruction(g, (0, "forward"), InstructionPlan.make(
            1980.0, True, {key: PartitionSchedule(6, 0, None, 512)}))
    with pytest.raises(PlanError, match="no entry"):
        b.evaluate_plan(g, IterationPlan({}))
    # more SMs than NCCL gives a communicator: refused before anything runs (NCCL would cap it)
    assert b.comm_sms_limit == NCCL_MAX_CTAS + 1 < H200.sms
    with pytest.raises(PlanError, match=f"outside 1..{NCCL_MAX_CTAS}"):
        b.evaluate_plan(g, IterationPlan.uniform(g, 1980.0, True,
                                                 {key: PartitionSchedule(NCCL_MAX_CTAS + 1, 0)}))
    big = b.bind(Workload(TINY, ParallelConfig(tp=2, pp=2, mbs=4, seq=32, microbatches=2)))
    with pytest.raises(InputError, match="needs 4 GPUs but 1"):
        b.evaluate_plan(big, IterationPlan.uniform(big, 1980.0))
    part = next(p for p in big.instruction_graphs[(0, "forward")].partitions
                if p.comm is not None)
    with pytest.raises(PlanError, match="NCCL runs at most"):
        b.evaluate_partition(part, np.array([1980.0]), np.array([40]), np.array([[0, 0]]))


def test_aggregate_iteration_time_max_energy_sum():
    g = build_iteration_graph(make_workload("qwen3-1.7b", tp=2, pp=2, mbs=2, seq=512,
                                            microbatches=2))
    ranks = []
    for r in range(4):
        info = RankInfo(rank=r, world=4, stage=r // 2, tp_rank=r % 2, dp_rank=0, gpu_index=r,
                        gpu_name="fake", clocks_locked=False, clock_control="off")
        ranks.append(PlanResult(info, WindowResult(10.0 + r, 4000.0 + 100 * r, 10),
                                power_limit_applied=False,
                                instruction_times=(InstructionSpan(0, "forward", 0.0, 0.1),),
                                losses=()))
    res = aggregate_iteration(g, ranks, static_power_w=100.0)
    assert res.time_s == pytest.approx(1.3)  # max over ranks of window / iterations
    assert res.energy.total_j == pytest.approx(sum(r.window.energy_j / 10 for r in ranks))
    assert res.energy.static_j == pytest.approx(4 * 100.0 * 1.3)
    assert res.per_gpu_energy_j == {0: pytest.approx(405.0), 1: pytest.approx(425.0)}
    assert res.per_gpu_dynamic_j[0] == pytest.approx(405.0 - 130.0)
    assert set(res.instruction_times) == {Instruction(0, 0, "forward"),
                                          Instruction(1, 0, "forward")}
    with pytest.raises(RuntimeError):
        aggregate_iteration(g, ranks[:3], 100.0)
    # the rank<r>.json form: flat, in the order the worker always wrote it
    d = ranks[1].to_dict()
    assert list(d) == ["rank", "world", "stage", "tp_rank", "dp_rank", "gpu_index", "gpu_name",
                       "clocks_locked", "clock_control", "time_s", "energy_j", "steps",
                       "sm_clock_mhz", "power_limit_applied", "instruction_times", "losses",
                       "job_mode"]
    assert d["instruction_times"] == [[0, "forward", 0.0, 0.1]] and d["job_mode"] == "plan"
    assert result_from_dict(json.loads(json.dumps(d)), PlanResult) == ranks[1]


@pytest.mark.parametrize("name,kw", [("qwen3-1.7b", {}), ("gpt3-xl", dict(tp=2, dp=2, pp=4)),
                                     ("llama3.2-3b", dict(tp=1, pp=1, mbs=2, seq=1024,
                                                          microbatches=3))])
def test_workload_and_plan_round_trips(name, kw):
    w = make_workload(name, **kw)
    g = build_iteration_graph(w)
    assert build_iteration_graph(workload_from_graph(g)) == g
    assert Workload.from_dict(json.loads(json.dumps(w.to_dict()))) == w
    key = g.instruction_graphs[(0, "forward")].partitions[0].key
    plan = IterationPlan.uniform(g, 1410.0, True, {key: PartitionSchedule(9, 2, 3)},
                                 power_limit_w=300.0, label="x")
    back = IterationPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.instructions == plan.instructions and back.power_limit_w == 300.0
    job = Job("plan", workload=w, plan=plan, measure=QUICK)
    again = Job.from_dict(json.loads(json.dumps(job.to_dict())))
    assert again.workload == w and again.plan.instructions == plan.instructions
    assert again.measure == QUICK


def test_reduced_workload_is_recovered_from_its_graph():
    w = reduced_workload("qwen3-1.7b", 2, tp=1, pp=1, mbs=2, seq=1024, microbatches=2)
    assert w.model.layers == 2 and w.name == "qwen3-1.7b"
    g = build_iteration_graph(w)
    assert workload_from_graph(g) == w
    with pytest.raises(InputError):
        reduced_workload("qwen3-1.7b", 1, pp=2)
    custom = Workload(TINY, ParallelConfig(tp=1, pp=1, mbs=2, seq=32))
    assert workload_from_graph(build_iteration_graph(custom)) == custom  # the graph records it
    with pytest.raises(InputError, match="bind"):  # a graph built otherwise records no job
        workload_from_graph(replace(build_iteration_graph(custom), job={}))


class _FakeLauncher(GPUBackend):
    """Runs a small script instead of torchrun (what the workers would leave behind)."""

    script = ""

    def launch_command(self, nprocs, job_path, out):
        return [sys.executable, "-c", self.script, str(out)]


#: A static-power rank record (rank filled in by the script).
_STATIC_REC = {"world": 2, "stage": 0, "tp_rank": 0, "dp_rank": 0, "gpu_index": 0,
               "gpu_name": "fake", "clocks_locked": False, "clock_control": "off",
               "role": "blocked_recv", "trials": [{"time_s": 1.0, "energy_j": 100.0,
                                                   "power_w": 100.0}],
               "power_w": 100.0, "job_mode": "static_power"}


@pytest.mark.parametrize("script,error", [
    ("import sys,json,os; o=sys.argv[1]; os.makedirs(o); "
     f"[json.dump({{**{_STATIC_REC!r}, 'rank': r}}, open(f'{{o}}/rank{{r}}.json','w')) "
     "for r in range(2)]", None),
    ("print('[rank1]: error: GPU 1 is busy'); raise SystemExit(1)", InputError),
    ("print('Traceback: boom'); raise SystemExit(1)", RuntimeError),
    ("import sys,json,os; o=sys.argv[1]; os.makedirs(o); "
     "json.dump({'rank': 0}, open(f'{o}/rank0.json','w'))", RuntimeError),
    ("import sys,json,os; o=sys.argv[1]; os.makedirs(o); "
     "[json.dump({'rank': r, 'job_mode': 'plan'}, open(f'{o}/rank{r}.json','w')) "
     "for r in range(2)]", ValueError),
])
def test_launcher_results_and_errors(script, error):
    b = _FakeLauncher(H200, visible_gpus=2, device="cpu")
    b.script = script
    job = Job("static_power")
    if error is None:
        ranks = b.run_job(job, 2, StaticPowerResult)
        assert [r.info.rank for r in ranks] == [0, 1]
        assert json.dumps(ranks[0].to_dict()) == json.dumps({"rank": 0, **_STATIC_REC})
    else:
        with pytest.raises(error) as e:
            b.run_job(job, 2, StaticPowerResult)
        if error is InputError:
            assert str(e.value) == "GPU 1 is busy"


def test_static_power_needs_two_gpus():
    with pytest.raises(InputError, match="2 GPUs"):
        cpu_backend().measure_static_power()


def test_a_given_static_power_is_the_one_the_optimizers_add_back():
    """The static power that splits a measurement into dynamic energy is the backend's preset's,
    which the optimizers use to add it back: one value, however it is set."""
    be = cpu_backend(static_power_w=61.5)
    assert be.static_power_w == be.gpu.static_power_w == 61.5
    be.static_power_w = 70.0  # e.g. measured with measure_static_power
    assert be.gpu.static_power_w == 70.0 and be.gpu.name == H200.name
    assert cpu_backend().static_power_w == H200.static_power_w


class _SimMeasured(GPUBackend):
    """'Measures' instructions with a perturbed simulator (a stand-in for real GPUs)."""

    def evaluate_instruction(self, graph, key, plan):
        from kareus.backends.sim import SimulatorBackend

        c = SimulatorBackend(self.gpu).evaluate_instruction(graph, key, plan)
        return replace(c, time_s=c.time_s * 1.05, dynamic_energy_j=c.dynamic_energy_j * 1.1)


def test_gpu_measure_writes_profile_fit_and_errors(tmp_path):
    from kareus.backends.gpu.calibrate import gpu_measure
    from kareus.hardware.profile import load_profile

    b = _SimMeasured(H200, allow_clock_control=True)
    w = reduced_workload("qwen3-1.7b", 4, tp=1, pp=2, mbs=2, seq=1024, microbatches=4)
    rep = gpu_measure(b, w, tmp_path, clocks_mhz=[1980, 1800, 1605, 1410, 1200], ops=False)
    df = load_profile(tmp_path / "profile.csv")
    assert len(df) == 2 * 2 * 5 and sorted(df.frequency.unique()) == [1200, 1410, 1605, 1800,
                                                                      1980]
    assert rep["fit"] is not None and (tmp_path / "fitted_preset.json").exists()
    err = rep["simulator_error"]
    assert err["preset"]["time_mape_pct"] == pytest.approx(100 * (1 - 1 / 1.05), rel=2e-3)
    assert 0 < err["preset"]["energy_mape_pct"] < 15
    assert err["fitted"]["energy_mape_pct"] < err["preset"]["energy_mape_pct"]
    assert json.loads((tmp_path / "report.json").read_text())["gpu"] == "h200"


def test_gpu_measure_single_clock_reports_without_fit(tmp_path):
    from kareus.backends.gpu.calibrate import gpu_measure

    b = _SimMeasured(H200)  # no clock control: one clock, no fit
    w = reduced_workload("gpt3-xl", 2, tp=1, pp=1, mbs=2, seq=512, microbatches=2)
    rep = gpu_measure(b, w, tmp_path, ops=False)
    assert rep["fit"] is None and ">= 4" in rep["fit_skipped"]
    assert rep["clocks_profiled_mhz"] == [1980]
    assert not (tmp_path / "fitted_preset.json").exists()
    assert Path(rep["profile"]).exists()
