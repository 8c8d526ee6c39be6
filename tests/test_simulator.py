"""Physics of the simulator: each test states the law it checks."""

import numpy as np
import pytest

from kareus.backends.sim import SimulatorBackend
from kareus.errors import PlanError
from kareus.graph import CommOp, ComputeOp, Partition
from kareus.hardware.presets import get_preset
from kareus.plan import InstructionPlan, IterationPlan, PartitionSchedule

BIG_GEMM = ComputeOp("gemm", "gemm", flops=2 * 8192**3, bytes=3 * 2 * 8192**2, tiles=64 * 64)
STREAM = ComputeOp("add", "memory", flops=1e8, bytes=2e9)
AR = CommOp("ar", "all_reduce", bytes=256e6, group=8)


@pytest.fixture()
def uncapped(a100):
    return SimulatorBackend(a100, power_limit_w=2000)


def test_compute_bound_time_scales_as_one_over_clock(uncapped):
    times = [uncapped.kernel_time(BIG_GEMM, f, 108) for f in (900, 1050, 1200, 1410)]
    assert all(a > b for a, b in zip(times, times[1:]))
    assert times[0] / times[-1] == pytest.approx(1410 / 900, rel=0.03)


def test_memory_bound_time_is_flat_in_clock(uncapped):
    t_lo, t_hi = (uncapped.kernel_time(STREAM, f, 108) for f in (900, 1410))
    assert t_lo / t_hi == pytest.approx(1.0, abs=0.01)


def test_wave_quantization_steps(uncapped):
    op = ComputeOp("g", "gemm", flops=216 * 2 * 128 * 128 * 4096, bytes=1e6, tiles=216)
    t = {n: uncapped.kernel_time(op, 1410, n) for n in (108, 107, 90, 72, 71)}
    assert t[107] / t[108] == pytest.approx(1.5, rel=0.02)  # 2 waves -> 3 waves
    assert t[72] == pytest.approx(t[90]) == pytest.approx(t[107])  # flat within the step
    assert t[71] / t[72] == pytest.approx(4 / 3, rel=0.02)  # 3 waves -> 4 waves


def test_collective_speed_grows_with_sms_and_clock_until_the_link_saturates(uncapped, a100):
    # A tuned kernel: the soft minimum of its SMs' path (SMs x clock x per-SM rate) and its
    # link path, never faster than either.
    few = [uncapped.collective_time(AR, 1410, k) for k in (3, 6, 12, 24, 32)]
    assert all(a > b for a, b in zip(few, few[1:]))
    assert uncapped.collective_time(AR, 900, 6) > uncapped.collective_time(AR, 1410, 6)
    link_rate = a100.tuned_link_fraction * a100.nvlink_bw
    sm_rate = 32 * a100.tuned_bw_per_sm_mhz * 1410
    p = a100.tuned_pipelining
    rate = (sm_rate ** -p + link_rate ** -p) ** (-1 / p)
    assert few[-1] == pytest.approx(a100.tuned_latency_s + AR.bus_bytes / rate)
    assert rate < min(sm_rate, link_rate)
    # p = 1 is store and forward: the two paths' times add
    sf = SimulatorBackend(a100.with_overrides(tuned_pipelining=1.0), power_limit_w=1e9)
    assert sf.collective_time(AR, 1410, 32) == pytest.approx(
        a100.tuned_latency_s + AR.bus_bytes / sm_rate + AR.bus_bytes / link_rate)
    # fewer threads per block move less per SM
    assert uncapped.collective_time(AR, 1410, 6, 512) > uncapped.collective_time(AR, 1410, 6)
    # The library's kernel (NCCL) reaches the link's bandwidth with its default channels.
    link_time = AR.bus_bytes / (a100.nvlink_bw * a100.link_efficiency)
    assert uncapped.collective_time(AR, 1410, None) == pytest.approx(
        link_time + a100.comm_latency_s)


def test_beside_a_memory_kernel_only_the_collectives_sm_path_slows(uncapped, a100):
    """The tuned collective's latency-bound loads queue behind a memory-bound kernel's: on one
    SM (SM-bound) it keeps ``comm_rate_beside_memory`` of its rate alone; on many, where its link
    path binds and that kernel does not touch the link, nearly all of it. Beside a GEMM it keeps
    ``comm_rate_beside_gemm`` of its rate, capped at ``tuned_link_fraction_beside_compute`` of
    the link."""
    ks = (1, 64)
    j = int(uncapped.clock_index(np.array([1410.0]))[0])
    alone, _ = uncapped._comm_uncapped(AR, ks, 1024)
    share = {op.kind: uncapped._overlapped(op, AR, ks, 1024)[1][:, j] / alone[:, j]
             for op in (STREAM, BIG_GEMM)}
    assert share["memory"][0] == pytest.approx(a100.comm_rate_beside_memory, rel=0.02)
    assert a100.comm_rate_beside_memory + 0.05 < share["memory"][1] < 1.0
    cap = a100.tuned_link_fraction_beside_compute * a100.nvlink_bw
    gemm = np.minimum(a100.comm_rate_beside_gemm * alone[:, j], cap) / alone[:, j]
    np.testing.assert_allclose(share["gemm"], gemm)


def test_a_sequential_instruction_pays_an_eager_op_per_kernel_and_a_call_per_collective(
        a100, llama_tp8):
    """The host floor of a sequential instruction: ``host_eager_op_s`` per compute op and
    ``host_issue_call_s`` per collective (one call into the communication library)."""
    ig = llama_tp8.instruction_graphs[(0, "forward")]
    segs = [(ig.sequential, ig.layers), (ig.extra, 1)]
    ops = sum(len(seg.compute) * n for group, n in segs for seg in group)
    colls = sum((seg.comm is not None and seg.comm.group > 1) * n for group, n in segs
                for seg in group)
    assert colls > 0
    g = a100.with_overrides(host_eager_op_s=80e-6, host_issue_call_s=5e-6)
    assert SimulatorBackend(g).host_time(ig) == pytest.approx(80e-6 * ops + 5e-6 * colls)


def test_overlap_slows_compute_but_beats_running_in_sequence(sim):
    part = Partition("p/0", (BIG_GEMM,), AR)
    alone = sim.evaluate_partition(Partition("c/0", (BIG_GEMM,), None), np.array([1410.0]),
                                   np.array([24]), np.array([[0, 0]])).time_s.item()
    comm_alone = sim.collective_time(AR, 1410, 24)
    grid = sim.evaluate_partition(part, np.array([1410.0]), np.array([24]),
                                  np.array([[0, 0], [-1, -1]]))
    overlapped, sequential = grid.time_s[0, 0]
    assert max(alone, comm_alone) < overlapped < alone + comm_alone
    assert sequential > overlapped


def test_host_issue_reaches_the_gpu_inside_partitions_only(a100):
    """A partition's first op waits for the host: all of its issue time in a partition sweep (the
    harness starts every execution from an idle GPU), ``iteration_host_fraction`` of it inside an
    iteration; framework calls (``host_calls``) add ``host_issue_call_s`` each. Sequential
    instructions never wait for the host."""
    sim = SimulatorBackend(a100.with_overrides(iteration_host_fraction=0.4,
                                               host_issue_call_s=10e-6))
    f, k, w = np.array([1410.0]), np.array([24]), np.array([[0, 0]])
    calls = 50
    plain = Partition("p/0", (STREAM,), None)
    chatty = Partition("p/0", (ComputeOp("add", "memory", flops=1e8, bytes=2e9,
                                         host_calls=calls),), None)

    def time(part, harness):
        return sim.evaluate_partition(part, f, k, w, harness=harness).time_s.item()

    memory_issue = sim.gpu.host_issue_memory_s
    gpu_time = time(plain, False) - 0.4 * memory_issue
    assert time(plain, True) - sim.gpu.partition_harness_s == pytest.approx(gpu_time + memory_issue)
    assert time(chatty, False) == pytest.approx(gpu_time + 0.4 * (memory_issue + calls * 10e-6))
    assert time(chatty, True) - sim.gpu.partition_harness_s == pytest.approx(
        gpu_time + memory_issue + calls * 10e-6)


def test_the_host_costs_nanobatched_instructions_only(a100, llama_cp2):
    """Under CP2+TP4 a nanobatched instruction waits for the host (the per-op issue and the CP
    attention's framework calls); a sequential one, far from its host floor at this micro-batch
    (where ``host_issue_call_s`` prices only its collectives' issue), does not."""
    quiet = a100.with_overrides(iteration_host_fraction=0.05, host_issue_call_s=1e-6)
    busy = a100.with_overrides(iteration_host_fraction=1.0, host_issue_call_s=40e-6)
    key = (0, "backward")
    for nanobatched in (False, True):
        plan = InstructionPlan.make(1410, nanobatched)
        t_quiet, t_busy = (SimulatorBackend(g).evaluate_instruction(llama_cp2, key, plan).time_s
                           for g in (quiet, busy))
        if nanobatched:
            assert t_busy > 1.05 * t_quiet
        else:
            assert t_busy == pytest.approx(t_quiet, rel=1e-12)


def test_power_cap_throttles_each_phase_and_holds(a100):
    capped, free = SimulatorBackend(a100), SimulatorBackend(a100, power_limit_w=2000)
    f_eff, watts = capped.kernel_power(BIG_GEMM, 1410)
    assert f_eff < 1410 and watts <= a100.power_limit_w
    assert free.kernel_power(BIG_GEMM, 1410)[1] > a100.power_limit_w  # it would exceed the cap
    # at a clock it ran at, the op's power is the law's there, cap or not (a card's calibration
    # compares a measurement at the observed clock with it)
    uncapped_w = capped.kernel_dynamic_power(BIG_GEMM, 1410) + a100.static_power_w
    assert uncapped_w == pytest.approx(free.kernel_power(BIG_GEMM, 1410)[1], rel=1e-12)
    assert capped.kernel_dynamic_power(BIG_GEMM, f_eff) + a100.static_power_w \
        == pytest.approx(watts, rel=1e-9)
    part = Partition("g/0", (BIG_GEMM,), None)
    clocks = a100.clock_grid(900, 1410)
    grid = capped.evaluate_partition(part, clocks, np.array([1]), np.array([[0, 0]]))
    power = grid.dynamic_energy_j / grid.time_s + a100.static_power_w
    assert np.all(power <= a100.power_limit_w + 1e-6)
    # asking for 1410 runs the GEMM at the clock it throttles to: the same as asking for that
    # clock on a card with no limit, and slower than the unlimited card at 1410
    raw = free.evaluate_partition(part, clocks, np.array([1]), np.array([[0, 0]]))
    j = int(np.flatnonzero(clocks == f_eff)[0])
    assert grid.time_s[-1].item() == pytest.approx(raw.time_s[j].item())
    assert grid.dynamic_energy_j[-1].item() == pytest.approx(raw.dynamic_energy_j[j].item())
    assert grid.time_s[-1].item() > raw.time_s[-1].item()
    assert grid.clocks_mhz[-1] == 1410  # the result is indexed by the requested clock


def test_the_cap_throttles_only_the_phases_above_it(a100, llama_tp8):
    """A GEMM alone exceeds the cap at 1410 MHz and runs throttled, but the memory-bound kernels
    and collectives of the same instruction keep the locked clock: the instruction is faster than
    the same instruction locked at the GEMM's throttled clock, and its average power fits."""
    sim = SimulatorBackend(a100)
    f_gemm, _ = sim.kernel_power(BIG_GEMM, 1410)
    plan = IterationPlan.uniform(llama_tp8, 1410).instructions
    ins = next(iter(plan))
    top = sim.evaluate_instruction(llama_tp8, ins.type_key, plan[ins])
    low = sim.evaluate_instruction(llama_tp8, ins.type_key, type(plan[ins]).make(f_gemm))
    assert f_gemm < 1410 and top.time_s < low.time_s
    assert a100.static_power_w + top.dynamic_energy_j / top.time_s <= a100.power_limit_w


def test_dynamic_power_is_convex_in_clock_above_the_knee(uncapped, a100):
    part = Partition("g/0", (BIG_GEMM,), None)
    clocks = a100.clock_grid(1110, 1410)
    g = uncapped.evaluate_partition(part, clocks, np.array([1]), np.array([[0, 0]]))
    p = (g.dynamic_energy_j / g.time_s).ravel()
    assert np.all(np.diff(p, 2) > -1e-6) and np.all(np.diff(p) > 0)


def test_static_energy_is_static_power_times_time_times_gpus(sim, llama_tp8, a100):
    r = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1410))
    e = r.energy
    assert e.static_j == pytest.approx(a100.static_power_w * e.time_s * 16)
    assert e.total_j == pytest.approx(e.dynamic_j + e.static_j)
    assert sum(r.per_gpu_energy_j.values()) * 8 == pytest.approx(e.total_j)


def test_lower_clock_trades_time_for_dynamic_energy(sim, llama_tp8):
    fast = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1410)).energy
    slow = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1050)).energy
    assert slow.time_s > fast.time_s and slow.static_j > fast.static_j
    assert slow.dynamic_j < fast.dynamic_j


def test_nanobatching_hides_tp_communication(sim, llama_tp8):
    seq = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1410)).time_s
    nano = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1410, True)).time_s
    assert nano < 0.95 * seq


def test_best_schedule_moves_with_the_clock(sim, llama_tp8, a100):
    """For some partition, the fastest (SMs, window) at a low clock differs from a high clock's."""
    from kareus.optimizer.kareus import partition_windows

    ks, clocks = np.arange(3, 31, 3), np.array([900.0, 1410.0])
    moved = []
    for key in ((0, "forward"), (0, "backward")):
        for part in llama_tp8.instruction_graphs[key].partitions:
            if part.comm is None:
                continue
            g = sim.evaluate_partition(part, clocks, ks, partition_windows(len(part.compute)))
            lo = np.unravel_index(np.argmin(g.time_s[0]), g.time_s[0].shape)
            hi = np.unravel_index(np.argmin(g.time_s[1]), g.time_s[1].shape)
            if lo != hi:
                moved.append((part.key, ks[lo[0]], ks[hi[0]]))
    # the joint choice matters: the fastest schedule is not the same at every clock
    assert moved


def test_the_idle_critical_path_pays_static_only(sim, llama_tp8, a100):
    # Slowing stage 1 only: stage 0 waits longer, but its dynamic energy does not change.
    base = IterationPlan.uniform(llama_tp8, 1410)
    slow1 = IterationPlan({ins: (p if ins.stage == 0 else type(p).make(900))
                           for ins, p in base.instructions.items()})
    a, b = sim.evaluate_plan(llama_tp8, base), sim.evaluate_plan(llama_tp8, slow1)
    assert b.per_gpu_dynamic_j[0] == pytest.approx(a.per_gpu_dynamic_j[0])
    assert b.time_s > a.time_s


def test_bad_plans_are_rejected(sim, llama_tp8):
    part = llama_tp8.instruction_graphs[(0, "forward")].partitions[1]
    with pytest.raises(PlanError):
        sim.evaluate_partition(part, np.array([3000.0]), np.array([6]), np.array([[0, 0]]))
    for window in ([99, 99], [2, 1], [-1, 0]):
        with pytest.raises(PlanError, match="window"):
            sim.evaluate_partition(part, np.array([1410.0]), np.array([6]), np.array([window]))
    with pytest.raises(PlanError, match="SMs"):
        sim.evaluate_partition(part, np.array([1410.0]), np.array([99]), np.array([[0, 0]]))
    plan = IterationPlan.uniform(llama_tp8, 1410, True, {"nope/0": PartitionSchedule(6, 0)})
    with pytest.raises(PlanError, match="unknown partition"):
        sim.evaluate_plan(llama_tp8, plan)
    with pytest.raises(PlanError, match="no entry"):
        sim.evaluate_plan(llama_tp8, IterationPlan({}))


def test_power_limit_plan_slows_the_iteration(sim, llama_tp8):
    full = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1410))
    capped = sim.evaluate_plan(llama_tp8, IterationPlan.uniform(llama_tp8, 1410,
                                                                power_limit_w=200))
    assert capped.time_s > full.time_s
    assert capped.energy.dynamic_j < full.energy.dynamic_j


def test_every_preset_simulates(llama_tp8):
    from kareus.hardware.presets import PRESETS
    for name in PRESETS:
        gpu = get_preset(name)
        r = SimulatorBackend(gpu).evaluate_plan(llama_tp8, IterationPlan.uniform(
            llama_tp8, gpu.clock_max_mhz))
        assert 0 < r.time_s < 60 and r.energy.total_j > 0


def test_a_stage_tail_starts_after_its_last_send_and_overlaps_it_with_the_reduction():
    """A stage's last backward sends its input gradient on; the send holds the stage, and its
    overlapped gradient reduction runs on meanwhile: the stage's work ends the larger of the two
    after that backward, plus the rest of its tail, never the two in series."""
    from kareus.graph import Instruction, sender_hold
    from kareus.suite.problem import make_problem

    p = make_problem("gpt3-xl", gpu="a100-sxm4-80gb", pp=2, dp=8, mbs=2, microbatches=4,
                     overlap_grad_reduce=True)
    g, sim = p.graph, p.backend
    plan = IterationPlan.uniform(g, p.gpu.clock_max_mhz)
    result = sim.evaluate_plan(g, plan)
    delays = sim.p2p_times(g)
    last = Instruction(1, g.microbatches - 1, "backward")
    start, end = result.instruction_times[last]
    hold = sender_hold(last, g.stages, delays)
    f_top = int(sim.clock_index(p.gpu.clock_max_mhz)[0])
    overhang, _ = sim.overlapped_grad_sync(g, 1, g.stage_tail[1][0].comm, start, end, f_top)
    rest = sum(sim._segment_cost(seg, f_top)[0] for seg in g.stage_tail[1][1:])
    assert hold > 0 and overhang > 0
    assert result.stage_end_s[1] == pytest.approx(end + max(hold, overhang) + rest, rel=1e-9)
