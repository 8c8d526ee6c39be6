"""EnvPipe as the Perseus authors emulated it: one algorithm on a profile and on the simulator."""

import json

import pandas as pd
import pytest

from baselines.envpipe import envelope_time, envpipe_clocks, in_envelope
from kareus.cli import main
from kareus.graph import Instruction, schedule_times
from kareus.methods.tradeoff import Option
from tests.conftest import profile_or_skip

CLOCKS = (1200, 1215, 1230, 1245, 1260)


@pytest.fixture(scope="module")
def small():
    from kareus.suite.problem import make_problem

    return make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=8, pp=2, mbs=8, microbatches=4,
                        seq=2048)


def _options(stages: int, slow_stage: int | None = None) -> dict:
    """Time falls with the clock, energy has its minimum at 1215 MHz."""
    out = {}
    for s in range(stages):
        for d, base in (("forward", 0.05), ("backward", 0.10)):
            scale = 1.3 if s == slow_stage else 1.0
            out[(s, d)] = [Option(base * scale * 1260 / c, 20.0 + 0.01 * (c - 1215) ** 2 / 15, c)
                           for c in CLOCKS]
    return out


def test_envelope_is_the_last_stage_and_each_stages_first_forward_and_last_backward():
    s, m = 4, 6
    env = {(i.stage, i.microbatch, i.direction) for i in
           (Instruction(st, mb, d) for st in range(s) for mb in range(m)
            for d in ("forward", "backward")) if in_envelope(i, s, m)}
    assert len(env) == 2 * m + 2 * (s - 1)
    assert (3, 2, "forward") in env and (0, 0, "forward") in env and (1, 5, "backward") in env
    assert (0, 1, "forward") not in env and (2, 0, "backward") not in env


def test_envpipe_keeps_the_envelope_at_the_top_clock_and_raises_until_it_is_critical():
    stages, micro = 3, 6
    options = _options(stages)
    clock = envpipe_clocks(options, stages, micro)
    assert all(c == 1260 for i, c in clock.items() if in_envelope(i, stages, micro))
    rest = [c for i, c in clock.items() if not in_envelope(i, stages, micro)]
    assert rest and min(rest) >= 1215  # never below the minimum-energy clock
    dur = {i: next(o.time_s for o in options[i.type_key] if o.knob == c) for i, c in clock.items()}
    total = max(e for _, e in schedule_times(stages, micro, dur).values())
    assert total == pytest.approx(envelope_time(dur, stages, micro))
    # and not every instruction was raised: EnvPipe saves energy off the envelope
    assert min(rest) < 1260


def test_a_slow_middle_stage_is_raised_to_the_top():
    """When a non-last stage bounds the iteration even at the top clock, EnvPipe raises its
    critical instructions all the way and stops."""
    clock = envpipe_clocks(_options(3, slow_stage=1), 3, 6)
    steady = [c for i, c in clock.items() if i.stage == 1 and (
        (i.direction == "forward" and i.microbatch >= 2)
        or (i.direction == "backward" and i.microbatch <= 3))]
    assert len(steady) == 8 and all(c == 1260 for c in steady)


def test_the_simulator_optimizer_runs_the_same_algorithm(small):
    from baselines.envpipe import EnvPipe
    from kareus.methods.profiling import profile_instructions
    from kareus.plan import InstructionPlan

    plan = EnvPipe().optimize(small)[0]
    g, be = small.graph, small.backend
    options = profile_instructions(be, g, small.knobs.clocks_mhz,
                                   lambda c: InstructionPlan.make(float(c)))
    expected = envpipe_clocks(options, g.stages, g.microbatches, be.p2p_time(g))
    assert {i: p.clock_mhz for i, p in plan.instructions.items()} == expected


def test_envpipe_command_on_the_published_profile(capsys):
    path = profile_or_skip("gpt3-175b+a100_sxm_bf16.csv")
    args = ["--profile", str(path), "--stages", "8", "--microbatches", "12", "--p-static",
            "83.64", "--json"]
    assert main(["envpipe", *args]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["optimizer"] == "envpipe" and len(env["points"]) == 1
    point = env["points"][0]
    assert len(point["frequencies"]) == 8 and all(len(f) == 24 for f in point["frequencies"])
    assert all(f == 1410 for f in point["frequencies"][7])
    assert main(["perseus", *args]) == 0
    perseus = json.loads(capsys.readouterr().out)
    fast = perseus["max_throughput"]
    # EnvPipe sits near Perseus's fastest point: no faster, and not much slower
    assert fast["time_s"] - 1e-9 <= point["time_s"] <= 1.02 * fast["time_s"]
    assert set(env) == set(perseus) - {"prefilter", "all_iterations"}


def _write(tmp_path, rows, name="p.csv"):
    path = tmp_path / name
    pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"]).to_csv(
        path, index=False)
    return path


def _good_rows():
    return [(s, d, f, 0.1 * 1410 / f, 30.0) for s in (0, 1) for d in ("forward", "backward")
            for f in (1380, 1395, 1410)]


@pytest.mark.parametrize("command", ["perseus", "envpipe"])
@pytest.mark.parametrize("mutate,args,fragment", [
    (lambda r: [x for x in r if not (x[0] == 1 and x[1] == "backward")], [], "no rows for stage 1"),
    (lambda r: [x for x in r if not (x[0] == 0 and x[1] == "forward" and x[2] != 1410)], [],
     "one clock only"),
    (lambda r: r[:-1] + [(1, "backward", 1403, 0.1, 30.0)], [], "common step grid"),
    (lambda r: r, ["--stages", "3"], "profile has 2 stages"),
    (lambda r: r, ["--microbatches", "0"], "positive integers"),
    (lambda r: r, ["--p-static", "0"], "--p-static"),
    (lambda r: r, ["--p-static", "-5"], "--p-static"),
    (lambda r: r, ["--unit-ms", "0"], "--unit-ms"),
])
def test_profile_commands_refuse_bad_input(tmp_path, capsys, command, mutate, args, fragment):
    path = _write(tmp_path, mutate(_good_rows()))
    base = {"--stages": "2", "--microbatches": "4", "--p-static": "80"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    code = main([command, "--profile", str(path), *[x for kv in base.items() for x in kv],
                 "--json"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and fragment in out.err
    assert len(out.err.strip().splitlines()) == 1
