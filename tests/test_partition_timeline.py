"""The partition timeline's semantics on small hand-computed cases, and the simulator's wave law
beside a collective."""

from __future__ import annotations

import numpy as np
import pytest

from kareus.backends.partition_timeline import (
    TimelineCollective,
    TimelineOp,
    partition_timeline,
)
from kareus.backends.sim import SimulatorBackend
from kareus.graph import CommOp, ComputeOp
from kareus.hardware.presets import get_preset
from workloads.graph_builder import CAUSAL_TAIL_FWD


def _op(t_alone: float, t_beside: float, rate_beside: float, host_s: float = 0.01,
        wave_s: float = 0.0, resident_grid: bool = False) -> TimelineOp:
    return TimelineOp(t_alone=np.array([t_alone]), p_alone=np.array([100.0]), host_s=host_s,
                      wave_s=np.array([wave_s]), t_beside=np.array([t_beside]),
                      p_beside=np.array([150.0]), rate_beside=np.array([rate_beside]),
                      resident_grid=resident_grid)


def _run(ops: list[TimelineOp], window: tuple[int, int], wave_loss: float = 0.0,
         launch_s: float = 0.0):
    comm = TimelineCollective(bus_bytes=1.0, rate=np.array([1.0]), power=np.array([50.0]))
    t, e = partition_timeline(ops, comm, np.array([window[0]]), np.array([window[1]]),
                              launch_s=launch_s, latency_s=0.0, partial_wave_loss=wave_loss)
    return float(t[0]), float(e[0])


def test_a_collective_launched_while_the_previous_op_runs_is_beside_it():
    # The host issues op 0 at 0.01 s and launches the collective right after, while op 0 runs
    # (0.01-1.01 s alone): the collective is beside op 0 from its start. Op 0 takes 1.5 s beside
    # it and the collective moves 0.5 x 1.5 = 0.75 of its 1.0 bytes; the rest (0.25) takes 0.5 s
    # beside op 1, which then finishes alone: 1 - 0.5 / 1.5 of it, 0.667 s.
    ops = [_op(1.0, 1.5, 0.5), _op(1.0, 1.5, 0.5)]
    t, e = _run(ops, (1, 1))
    assert t == pytest.approx(0.01 + 1.5 + 0.5 + 2.0 / 3.0)
    assert e == pytest.approx(150.0 * 2.0 + 100.0 * 2.0 / 3.0)


def test_a_collective_joins_an_op_mid_way_when_launched_after_it_starts():
    # The GPU starts op 0 at its issue (0.01 s); launching the collective takes the host 0.2 s
    # more, so it joins op 0 at 0.21 s, 5 % into it. Beside it op 0 runs at 1/6 per s while the
    # collective moves 0.5 per s: done after 2 s, a third of op 0; the remaining 61.7 % of op 0
    # runs alone (2.467 s), then op 1 (1 s). A collective that ran on its own SMs until op 0
    # ended would have finished at 1.21 s and cost op 0 nothing (5.01 s in all).
    ops = [_op(4.0, 6.0, 0.5), _op(1.0, 1.5, 0.5)]
    t, e = _run(ops, (1, 1), launch_s=0.2)
    alone0 = (1.0 - 0.05 - 2.0 / 6.0) * 4.0
    assert t == pytest.approx(0.01 + 0.2 + 2.0 + alone0 + 1.0)
    assert e == pytest.approx(100.0 * (0.2 + alone0 + 1.0) + 150.0 * 2.0)


def test_a_grid_that_fills_the_gpu_makes_a_collective_launched_inside_it_wait():
    # The same case with op 0 a kernel whose blocks hold every SM (a norm, a dropout): the
    # collective launched at 0.21 s finds no SM and starts when op 0 ends (4.01 s), beside op 1
    # (1.5 s beside it, moving 0.75), and the compute stream then waits 0.25 s for the rest.
    ops = [_op(4.0, 6.0, 0.5, resident_grid=True), _op(1.0, 1.5, 0.5)]
    t, e = _run(ops, (1, 1), launch_s=0.2)
    assert t == pytest.approx(0.01 + 4.0 + 1.5 + 0.25)
    assert e == pytest.approx(100.0 * 4.0 + 150.0 * 1.5 + 50.0 * 0.25)
    # launched before it starts, the collective holds its SMs first: op 0 runs beside it
    t0, _ = _run(ops, (0, 1), launch_s=0.0)
    t0_plain, _ = _run([_op(4.0, 6.0, 0.5), _op(1.0, 1.5, 0.5)], (0, 1), launch_s=0.0)
    assert t0 == pytest.approx(t0_plain)


def test_a_grid_that_fills_the_gpu_runs_its_homeless_blocks_in_a_second_round():
    # A norm-like kernel (one round of blocks, looping over rows) beside a collective on k SMs:
    # (S-k)/S of the work on S-k SMs, then k/S of it on the blocks of k SMs, which stream at the
    # rate a block reaches when HBM is not the limit (mem_sat: half the SMs saturate it).
    g = get_preset("a100-sxm4-40gb")
    sim = SimulatorBackend(g)
    norm = ComputeOp("norm", "memory", flops=0.0, bytes=64e6, resident_grid=True)
    plain = ComputeOp("norm", "memory", flops=0.0, bytes=64e6)
    comm = CommOp("ar", "all_reduce", 32e6, 2)
    j = int(sim.clock_index(g.clock_max_mhz)[0])
    t_res = sim._overlapped(norm, comm, (10,), 1024)[0].time[0, j]
    t_plain = sim._overlapped(plain, comm, (10,), 1024)[0].time[0, j]
    core = t_plain - g.kernel_overhead_s  # HBM-bound on 98 SMs: the whole op at full rate
    second = core * g.mem_sat_sm_fraction * g.sms / 10 * (10 / g.sms)  # k/S of it, k SMs' blocks
    assert t_res == pytest.approx(core * (g.sms - 10) / g.sms + second + g.kernel_overhead_s)
    assert t_res > 1.3 * t_plain


def test_a_kernel_getting_the_collectives_sms_back_mid_way_loses_part_of_a_wave():
    ops = [_op(1.0, 1.5, 0.5, wave_s=0.1), _op(1.0, 1.5, 0.5, wave_s=0.1)]
    t0, _ = _run(ops, (1, 1))
    t1, e1 = _run(ops, (1, 1), wave_loss=0.5)
    assert t1 - t0 == pytest.approx(0.05)  # op 1 is where the collective ends
    # a collective that outlasts every op it is beside costs no wave
    long = [_op(1.0, 1.5, 0.1, wave_s=0.1), _op(1.0, 1.5, 0.1, wave_s=0.1)]
    assert _run(long, (0, 1), wave_loss=0.5)[0] == pytest.approx(_run(long, (0, 1))[0])


def test_sequential_window_runs_the_collective_alone_first():
    ops = [_op(1.0, 1.5, 0.5), _op(1.0, 1.5, 0.5)]
    t, e = _run(ops, (-1, -1))
    assert t == pytest.approx(1.0 + 0.01 + 1.0 + 1.0)  # collective, then both ops alone
    assert e == pytest.approx(50.0 + 200.0)


def test_a_kernel_beside_a_collective_shares_its_sms_without_whole_waves():
    """1024 tiles on 108 SMs run in 10 waves; on 102 (six SMs lent to a collective) whole waves
    would need 11, a 10 % step between 5 and 6 SMs lent. Beside a collective the kernel shares
    the SMs fluidly (the collective holds them for part of the kernel only), so each lent SM costs
    about 1/100 of the kernel and there is no step."""
    gpu = get_preset("a100-sxm4-40gb")
    sim = SimulatorBackend(gpu, power_limit_w=5000.0)
    op = ComputeOp("g", "gemm", 2.0 * 8192 * 4096 * 2048, 1e6, tiles=1024, depth=4096)
    comm = CommOp("ar", "all_reduce", 32 * 2**20, 2)
    j = sim.clock_index(1410.0)[0]
    beside = sim._overlapped(op, comm, (5, 6, 7), 1024)[0].time[:, j]
    steps = np.diff(beside) / beside[:-1]
    assert np.all(steps > 0) and np.all(steps < 0.02)
    # alone on the same SM counts, whole waves do step
    alone = [sim.kernel_time(op, 1410.0, gpu.sms - k) for k in (5, 6)]
    assert alone[1] / alone[0] > 1.08


def test_causal_attention_runs_its_even_share_and_a_tail_not_whole_waves():
    """Causal attention's uneven tiles end ``uneven_tail`` average tiles past their even share
    ``tiles / SMs``: no step where whole waves would add one (1024 tiles: 10 waves on 103 SMs,
    11 on 102), and on all 108 SMs 9.48 + tail average tiles where uniform tiles take 10."""
    gpu = get_preset("a100-sxm4-40gb")
    sim = SimulatorBackend(gpu, power_limit_w=5000.0)
    uniform = ComputeOp("a", "attention", 4.0 * 32 * 64 * 4096 * 4096 / 2, 1e6, tiles=1024,
                        depth=64)
    causal = ComputeOp("a", "attention", uniform.flops, 1e6, tiles=1024, depth=64,
                       uneven_tail=CAUSAL_TAIL_FWD)
    t = {k: sim.kernel_time(causal, 1410.0, gpu.sms - k) for k in (0, 5, 6)}
    assert t[6] / t[5] - 1 == pytest.approx((1024 / 102 - 1024 / 103)
                                            / (1024 / 103 + CAUSAL_TAIL_FWD), rel=0.02)
    assert t[6] / t[5] < 1.02
    assert sim.kernel_time(uniform, 1410.0, 102) / sim.kernel_time(uniform, 1410.0, 103) == \
        pytest.approx(1.1, rel=0.01)
    assert t[0] / sim.kernel_time(uniform, 1410.0, gpu.sms) == \
        pytest.approx((1024 / 108 + CAUSAL_TAIL_FWD) / 10, rel=0.01)  # plus a launch gap


@pytest.mark.parametrize("kind,uneven_tail,loses", [("gemm", None, True),
                                                     ("attention", None, True),
                                                     ("attention", CAUSAL_TAIL_FWD, False)])
def test_only_uniform_tiles_lose_part_of_a_wave_when_the_collective_ends_inside_them(
        kind, uneven_tail, loses):
    """Uniform tiles (a GEMM, non-causal attention) run in lockstep waves, which the collective's
    SMs returning mid-way put out of step; causal attention's tiles differ in work and already end
    scattered. One op,
    the collective launched before it and long enough to end inside it but not to outlast it."""
    from kareus.graph import Partition

    op = ComputeOp("k", kind, 2.0 * 8192 * 4096 * 2048, 1e6, tiles=1024, depth=4096 if kind ==
                   "gemm" else 128, uneven_tail=uneven_tail)
    part = Partition("p/0", (op,), CommOp("ar", "all_reduce", 8 * 2**20, 2))
    times = []
    for loss in (0.0, 0.5):
        sim = SimulatorBackend(get_preset("a100-sxm4-40gb").with_overrides(partial_wave_loss=loss))
        grid = sim.evaluate_partition(part, np.array([1410.0]), np.array([16]), np.array([[0, 0]]))
        times.append(float(grid.time_s[0, 0, 0]))
        alone = sim.kernel_time(op, 1410.0, 108) + sim.collective_time(part.comm, 1410.0, 16)
        assert times[-1] < alone  # the collective ended inside the op (overlap paid)
    assert (times[1] > times[0]) == loses


def test_the_library_collective_has_its_own_sm_activity():
    """NCCL's channels switch as ``library_activity_comm`` says, a tuned collective's SMs as
    ``activity_comm`` (fitted on the MSCCL++ sweep): changing one leaves the other's power."""
    from kareus.plan import LIBRARY_DEFAULT

    comm = CommOp("ar", "all_reduce", 32 * 2**20, 8)
    base = get_preset("a100-sxm4-40gb")
    ks = np.array([[float(LIBRARY_DEFAULT)], [16.0]])
    _, p0 = SimulatorBackend(base)._comm_raw(comm, ks, 1024)
    _, p1 = SimulatorBackend(base.with_overrides(
        library_activity_comm=2 * base.library_activity_comm))._comm_raw(comm, ks, 1024)
    assert np.all(p1[0] > p0[0]) and np.allclose(p1[1], p0[1])
