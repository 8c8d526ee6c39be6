"""Property-based tests (hypothesis): Pareto utilities, metric definitions, simulator invariants,
and a fuzz test of the profile-CSV parser."""

import io

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("hypothesis")  # the [test] extra; absent on some GPU images (pytest -m gpu)

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kareus import frontier as fr
from kareus.backends.sim import SimulatorBackend
from kareus.errors import ProfileError
from kareus.graph import CommOp, ComputeOp, Partition
from kareus.hardware.presets import get_preset
from kareus.hardware.profile import validate_profile
from kareus.optimizer.kareus import partition_windows
from kareus.plan import LIBRARY_DEFAULT

finite = st.floats(min_value=0.01, max_value=1e4, allow_nan=False, allow_infinity=False)
points = st.lists(st.tuples(finite, finite), min_size=1, max_size=40)


@given(points)
def test_pareto_front_is_exactly_the_non_dominated_set(pts):
    t = np.array([p[0] for p in pts])
    e = np.array([p[1] for p in pts])
    keep = fr.pareto_indices(t, e)
    assert list(t[keep]) == sorted(t[keep])
    for i in keep:  # nothing strictly dominates a kept point
        assert not np.any((t <= t[i]) & (e <= e[i]) & ((t < t[i]) | (e < e[i])))
    for j in range(len(pts)):  # every point is matched or dominated by a kept one
        assert np.any((t[keep] <= t[j]) & (e[keep] <= e[j]))


@given(points, st.floats(min_value=0.0, max_value=0.5))
def test_iso_metrics_scale_exactly(pts, x):
    t = [p[0] for p in pts]
    e = [p[1] for p in pts]
    assert fr.iso_time_energy_reduction(t, e, t, e) == pytest.approx(0.0, abs=1e-9)
    assert fr.iso_energy_time_reduction(t, e, t, e) == pytest.approx(0.0, abs=1e-9)
    cheaper = [v * (1 - x) for v in e]
    assert fr.iso_time_energy_reduction(t, e, t, cheaper) == pytest.approx(100 * x, abs=1e-6)
    faster = [v * (1 - x) for v in t]
    assert fr.iso_energy_time_reduction(t, e, faster, e) == pytest.approx(100 * x, abs=1e-6)
    slower = [v * 1.01 + 1 for v in t]
    assert fr.iso_time_energy_reduction(t, e, slower, e) is None


GPU = get_preset("a100-sxm4-40gb")


@st.composite
def partitions(draw):
    n = draw(st.integers(1, 5))
    ops = []
    for i in range(n):
        if draw(st.booleans()):
            m, k, nn = (draw(st.integers(1, 64)) * 128 for _ in range(3))
            ops.append(ComputeOp(f"g{i}", "gemm", 2.0 * m * k * nn, 2.0 * (m * k + k * nn + m * nn),
                                 tiles=(m // 128) * (nn // 128), slot=f"linear_{i}"))
        else:
            ops.append(ComputeOp(f"m{i}", "memory", 1e6, draw(st.floats(1e6, 1e9)),
                                 slot=f"norm_{i}"))
    comm = CommOp("ar", "all_reduce", draw(st.floats(1e5, 5e8)), draw(st.sampled_from([2, 4, 8])))
    return Partition("p/0", tuple(ops), comm)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partitions())
def test_simulator_invariants(part):
    sim = SimulatorBackend(GPU)
    clocks = GPU.clock_grid(900, 1410)
    ks = np.array([0, 3, 12, 30])  # the library's kernel and tuned ones
    windows = partition_windows(len(part.compute))
    g = sim.evaluate_partition(part, clocks, ks, windows)
    assert np.all(g.time_s > 0) and np.all(g.dynamic_energy_j >= 0)
    power = g.dynamic_energy_j / g.time_s + GPU.static_power_w
    # every phase fits the cap (at worst by throttling), so the average does: a collective that
    # starts while an op runs is beside that op, a capped phase (partition_timeline)
    assert np.all(power <= GPU.power_limit_w + 1e-6)
    # overlap never makes the compute itself faster than running alone on every SM
    alone = sim.evaluate_partition(Partition("c/0", part.compute, None), clocks, ks[:1],
                                   windows[:1]).time_s[:, 0, 0]
    assert np.all(g.time_s >= alone[:, None, None] * (1 - 1e-9))
    # running the collective alone first costs at least the compute plus the collective alone
    seq = int(np.flatnonzero((windows == [-1, -1]).all(axis=1))[0])
    for i, clock in enumerate(clocks):
        for j, k in enumerate(ks):
            collective = sim.collective_time(part.comm, clock, None if k == LIBRARY_DEFAULT
                                             else int(k))
            assert g.time_s[i, j, seq] >= (alone[i] + collective) * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64))
def test_compute_bound_time_is_monotone_in_clock(m, k, n):
    sim = SimulatorBackend(GPU, power_limit_w=5000)
    op = ComputeOp("g", "gemm", 2.0 * (m * 128) * (k * 512) * (n * 128), 1e3, tiles=m * n)
    times = [sim.kernel_time(op, f, GPU.sms) for f in GPU.clock_grid(600, 1410)]
    assert all(a >= b for a, b in zip(times, times[1:]))


VALID = ("stage,instruction,frequency,time,energy\n"
         "0,forward,1410,0.05,24\n0,backward,1410,0.1,47\n"
         "1,forward,1410,0.05,23\n1,backward,1410,0.1,46\n")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_profile_parser_fuzz(data):
    """Random edits of a valid CSV: the parser either accepts (and the result is valid) or raises
    ProfileError -- never anything else."""
    text = list(VALID)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["delete", "replace", "insert"]))
        ch = data.draw(st.sampled_from(list("0123456789,.-\nabe x\"") + ["nan", "inf", "1e9"]))
        if op == "delete":
            del text[pos]
        elif op == "replace":
            text[pos] = ch
        else:
            text.insert(pos, ch)
    blob = "".join(text)
    try:
        df = pd.read_csv(io.StringIO(blob))
    except Exception:  # what load_profile maps to ProfileError ("not a readable CSV")
        return
    try:
        out = validate_profile(df, "fuzz")
    except ProfileError:
        return
    assert (out.time > 0).all() and (out.energy > 0).all()
    assert not out.duplicated(["stage", "instruction", "frequency"]).any()
    assert set(out.instruction) <= {"forward", "backward"}
