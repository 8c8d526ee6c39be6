import json

import pytest

from kareus.cli import main
from tests.conftest import profile_or_skip


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_lists(capsys):
    code, out, _ = run(capsys, "workloads")
    assert code == 0 and "llama3.3-70b" in out and "qwen3-1.7b" in out
    code, out, _ = run(capsys, "gpus", "--json")
    data = json.loads(out)
    assert code == 0 and set(data) == {"a100-sxm4-40gb", "a100-sxm4-80gb", "a40", "a100-pcie-80gb",
                                        "a100-pcie-40gb", "h100-sxm", "h200"}
    assert all(v["source"] for p in data.values() for v in p.values())
    assert data["a100-sxm4-40gb"]["static_power_w"]["source"].startswith("published")


def test_simulate_json_has_the_contract_fields(capsys):
    code, out, _ = run(capsys, "simulate", "--workload", "llama3.2-3b", "--json")
    assert code == 0
    obj = json.loads(out)
    for field in ("workload", "optimizer", "backend", "gpu", "num_gpus", "gpus_per_stage",
                  "points", "max_throughput"):
        assert field in obj
    assert obj["num_gpus"] == 16 and obj["gpus_per_stage"] == 8 and obj["gpu"] == "a100-sxm4-40gb"
    p = obj["points"][0]
    assert p["energy_j"] == pytest.approx(p["dynamic_energy_j"] + p["static_energy_j"])
    assert obj["max_throughput"] == p


def test_simulate_overrides(capsys):
    code, out, _ = run(capsys, "simulate", "-w", "qwen3-1.7b", "--tp", "4", "--cp", "2",
                       "--seq", "8192", "--gpu", "h100-sxm", "--json")
    obj = json.loads(out)
    assert code == 0 and obj["parallel"]["cp"] == 2 and obj["parallel"]["seq"] == 8192


@pytest.mark.parametrize("args,fragment", [
    (["simulate", "-w", "gpt5"], "choose one of"),
    (["simulate", "-w", "gpt3-xl", "--tp", "3"], "valid TP"),
    (["simulate", "-w", "gpt3-xl", "--tp", "two"], "not a valid integer"),
    (["simulate", "-w", "gpt3-xl", "--seq", "-5"], "positive integer"),
    (["simulate", "-w", "gpt3-xl", "--gpu", "v100"], "choose one of"),
    (["calibrate", "--profile", "/no/such.csv", "--gpu", "a40"], "does not exist"),
    (["simulate"], "Missing option '-w' / '--workload': a model name (gpt3-xl, "),
    (["frontier", "-w", "gpt3-xl"], "Missing option '-o' / '--optimizer': one of megatron, "),
    (["frobnicate"], "no command 'frobnicate'; choose one of: calibrate, envpipe"),
])
def test_bad_input_exits_2_with_one_line(capsys, args, fragment):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and fragment in err


def test_kareus_alone_prints_its_whole_help(capsys):
    """No command: the help with every command (click's own status, 2), not its first line."""
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: kareus") and "Commands:" in err
    assert all(f"  {c} " in err for c in ("simulate", "frontier", "reproduce", "calibrate"))


@pytest.mark.slow
def test_calibrate_bad_and_good(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,0.1,-3\n")
    code, _, err = run(capsys, "calibrate", "--profile", str(bad), "--gpu", "a40")
    assert code == 2 and "positive" in err
    path = profile_or_skip("gpt3-175b+a100_sxm_bf16.csv")
    code, out, _ = run(capsys, "calibrate", "--profile", str(path), "--gpu", "a100-sxm4-80gb",
                       "--json")
    obj = json.loads(out)
    assert code == 0 and obj["error"]["time_mape_pct"] < 2 and obj["fit"]["knee_mhz"] > 900


def test_calibrate_rejects_a_profile_from_another_gpu(capsys):
    path = profile_or_skip("gpt3-175b+a40_bf16.csv")  # clocks up to 1740 MHz
    code, _, err = run(capsys, "calibrate", "--profile", str(path), "--gpu", "a100-sxm4-40gb")
    assert code == 2 and "outside" in err
    # one that stops short of the GPU's top clock fits, and says it may be another GPU's
    path = profile_or_skip("gpt3-175b+a100_sxm_bf16.csv")  # clocks up to 1410 MHz
    code, _, err = run(capsys, "calibrate", "--profile", str(path), "--gpu", "a40")
    assert code == 0 and "clocks reach 1410 MHz, a40's top clock is 1740 MHz" in err
    code, _, err = run(capsys, "calibrate", "--profile", str(path), "--gpu", "a100-sxm4-80gb")
    assert code == 0 and "warning" not in err


def test_frontier_exports_a_deployable_plan(capsys, tmp_path):
    import ast
    out = tmp_path / "plan"
    code, text, _ = run(capsys, "frontier", "-w", "gpt3-xl", "--tp", "4", "--mbs", "2",
                        "--microbatches", "4", "-o", "perseus", "--time-budget-s", "10",
                        "--export", str(out), "--json")
    obj = json.loads(text)
    assert code == 0 and obj["exported"]["plan_id"] == obj["choice"]["plan_id"]
    assert obj["parallel"]["tp"] == 4 and obj["parallel"]["microbatches"] == 4
    assert obj["stage_layers"] == [13, 11]  # the suite's split: the head's stage lighter
    sched = ast.literal_eval((out / "freqs_pipeline.py").read_text())
    assert len(sched) == 2 and all(len(stage) == 8 for stage in sched)
    assert all(d in ("forward", "backward") and 900 <= f <= 1410 for st in sched for d, f in st)
    js = json.loads((out / "schedules.json").read_text())
    assert js["stages"][0]["instructions"][0]["clock_mhz"] == sched[0][0][1]
    from kareus.plan import IterationPlan  # the choice's plan is the plan's one JSON form
    plan = IterationPlan.from_json(obj["choice"]["plan"])
    assert plan.to_json() == obj["choice"]["plan"] and len(plan.instructions) == 16


def test_simulate_refuses_impossible_microbatch_counts(capsys):
    """Two million microbatches would build the graph for minutes past 3 GB: refused at once,
    with its estimate."""
    code = main(["simulate", "-w", "llama3.2-3b", "--microbatches", "2000000", "--json"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and len(out.err.strip().splitlines()) == 1
    assert "would need about 5.6 GiB of memory; at most 1,048,576" in out.err


def test_fewer_microbatches_than_stages_runs_with_a_warning(capsys):
    """Megatron-LM runs a pipeline that never fills (vTrain measured 96 such runs): the commands
    simulate it and say so, and its 1F1B takes (M + S - 1) stage slots, as a filled one does:
    each microbatch adds one stage's forward and backward, below S microbatches as above."""
    code = main(["simulate", "-w", "llama3.2-3b", "--pp", "4", "--microbatches", "2", "--json"])
    out = capsys.readouterr()
    obj = json.loads(out.out)
    assert code == 0 and obj["memory_warnings"] == []
    assert obj["pipeline_warnings"] == [
        "2 microbatches over 4 pipeline stages: the pipeline never fills, and each stage idles "
        "for 3 of its 5 microbatch slots (--microbatches >= 4 fills it)"]
    code = main(["simulate", "-w", "llama3.2-3b", "--pp", "4", "--microbatches", "2"])
    text = capsys.readouterr().out
    assert code == 0 and "warning: 2 microbatches over 4 pipeline stages" in text
    code = main(["frontier", "-w", "llama3.2-3b", "--pp", "4", "--microbatches", "2",
                 "-o", "perseus", "--json"])
    out = capsys.readouterr()
    assert code == 0 and json.loads(out.out)["points"]
    assert out.err.count("warning: 2 microbatches over 4 pipeline stages") == 1
    times = {}
    for m in (1, 2, 4, 8):
        code = main(["simulate", "-w", "llama3.2-3b", "--pp", "4", "--stage-layers", "7,7,7,7",
                     "--microbatches", str(m), "--json"])
        obj = json.loads(capsys.readouterr().out)
        assert code == 0 and (obj["pipeline_warnings"] == []) == (m >= 4)
        times[m] = obj["max_throughput"]["time_s"]
    slot = (times[8] - times[4]) / 4
    assert times[2] - times[1] == pytest.approx(slot, rel=0.1)
    assert times[1] == pytest.approx(4 * slot, rel=0.1)  # S slots and the stage tail


def test_shell_completion_parses_an_unknown_command_quietly():
    """click parses resiliently while completing: no error for a half-typed command."""
    from kareus.cli import cli

    with cli.make_context("kareus", ["frob", "x"], resilient_parsing=True) as ctx:
        assert cli.resolve_command(ctx, ["frob", "x"])[1] is None


def test_frontier_says_what_it_exported(capsys, tmp_path):
    code, text, _ = run(capsys, "frontier", "-w", "gpt3-xl", "--tp", "4", "--mbs", "2",
                        "--microbatches", "4", "-o", "megatron", "--export", str(tmp_path / "p"))
    assert code == 0 and text.strip().splitlines()[-1] == (
        f"exported plan_id 0 (\"megatron\", the fastest) to {tmp_path / 'p'}: freqs_pipeline.py "
        "(Zeus's per-instruction clocks), schedules.json (each partition's window and SMs)")


def test_workloads_show_lists_a_gelu_variant_only_for_a_gelu_mlp(capsys):
    code, text, _ = run(capsys, "workloads", "--show", "llama3.2-3b")
    assert code == 0 and "swiglu" in text and "gelu" not in text.replace("swiglu", "")
    code, text, _ = run(capsys, "workloads", "--show", "gpt3-xl")
    assert code == 0 and "gelu_new" in text


def test_gpus_labels_its_flops_as_the_peak_at_the_top_clock(capsys):
    code, text, _ = run(capsys, "gpus")
    assert code == 0 and "peak bf16 TF" in text
    assert "dense bf16 tensor FLOP/s at the top clock" in " ".join(text.split())


def test_sampled_rows_keep_both_ends_and_the_kept_ones_within_the_limit():
    from kareus.suite.tables import sampled_rows

    assert sampled_rows(5, 15) == [0, 1, 2, 3, 4]
    picked = sampled_rows(171, 15)
    assert len(picked) == 15 and picked[0] == 0 and picked[-1] == 170
    assert picked == sorted(set(picked))
    gaps = [b - a for a, b in zip(picked, picked[1:])]
    assert max(gaps) - min(gaps) <= 1  # evenly spread
    kept = sampled_rows(171, 15, keep=[37])
    assert 37 in kept and len(kept) == 15 and kept[0] == 0 and kept[-1] == 170
    assert sampled_rows(100, 3, keep=[50, 60]) == [0, 50, 60, 99]  # the ends and keep win


def test_signed_changes_never_print_minus_zero():
    from kareus.suite.tables import signed

    # 14 us slower over a 5 s iteration: a reduction of -0.0003 %, as fast to the digit shown
    assert signed(-0.0003) == "+0.0" and signed(-0.04) == "+0.0" and signed(0.0) == "+0.0"
    assert signed(-0.06) == "-0.1" and signed(12.345) == "+12.3" and signed(-1.5, 2) == "-1.50"


def test_frontier_text_shows_a_spread_with_the_choice_and_all_on_request(capsys):
    args = ("frontier", "-w", "gpt3-xl", "-o", "perseus")
    code, text, _ = run(capsys, *args, "--json")
    points = json.loads(text)["points"]
    assert code == 0 and len(points) > 15
    budget = (points[0]["time_s"] + points[-1]["time_s"]) / 2
    code, text, _ = run(capsys, *args, "--time-budget-s", str(budget))
    rows = [line for line in text.splitlines() if line.startswith("│")]
    chosen = [r for r in rows if "<-" in r]
    assert code == 0 and len(rows) == 15 and len(chosen) == 1
    assert rows[0].split("│")[5].strip() == "+0.0 %"  # the fastest point first
    assert f"{len(rows)} of the {len(points)} frontier points shown" in text
    code, text, _ = run(capsys, *args, "--all")
    assert code == 0 and sum(line.startswith("│") for line in text.splitlines()) == len(points)
    assert "frontier points shown" not in text


def test_frontier_without_a_budget_gives_the_optimizer_s_own_choice(capsys):
    """Zeus singles out its power limit: `frontier` reports it as `choice`, as summary.json does;
    an optimizer that picks nothing has none."""
    small = ("-w", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2", "--microbatches", "4")
    code, text, _ = run(capsys, "frontier", *small, "-o", "zeus-power-limit", "--json")
    obj = json.loads(text)
    choice = obj["choice"]
    assert code == 0 and "Zeus choice" in choice["label"] and choice["plan"]
    assert choice["plan_id"] in {p["plan_id"] for p in obj["points"]}
    code, text, _ = run(capsys, "frontier", *small, "-o", "megatron", "--json")
    assert code == 0 and "choice" not in json.loads(text)


def test_one_fastest_point_when_times_tie_within_rounding():
    """Two plans as fast within floating-point noise: the JSON's max_throughput and the table's
    'vs fastest' baseline are the same point, the one with less energy."""
    from kareus.backends.base import Point
    from kareus.cli.frontiers import _frontier_table
    from kareus.suite.records import frontier_object

    points = [Point(1.0, 10.0, 5.0, 5.0, 0), Point(1.0 + 2e-16, 9.0, 4.0, 5.0, 1),
              Point(1.2, 8.0, 2.0, 6.0, 2)]
    obj = frontier_object(workload="w", optimizer="o", backend="sim", gpu="g", num_gpus=1,
                          gpus_per_stage=1, points=points)
    assert obj["max_throughput"]["energy_j"] == 9.0
    rows = [r for r in _frontier_table(points, None, True).splitlines() if r.startswith("│")]
    assert "-0.0 %" not in rows[1] and rows[1].rstrip("│ ").endswith("+0.0 %")


def test_the_reported_parallel_fields_given_back_as_flags_are_the_same_job(capsys):
    """With 32-bit tensors attention runs unfused: `parallel.attention` says so (not the default
    `flash`, which, given as a flag with fp32, is refused)."""
    code, text, _ = run(capsys, "simulate", "-w", "gpt3-xl", "--precision", "fp32", "--json")
    par = json.loads(text)["parallel"]
    assert code == 0 and par["attention"] == "unfused"
    code, again, _ = run(capsys, "simulate", "-w", "gpt3-xl", "--precision", "fp32",
                         "--attention", par["attention"], "--json")
    assert code == 0 and json.loads(again)["points"] == json.loads(text)["points"]


def test_an_unknown_option_points_at_the_command_s_help(capsys):
    code, _, err = run(capsys, "simulate", "-w", "gpt3-xl", "--nosuch")
    assert code == 2 and err.strip() == ("error: No such option '--nosuch'. "
                                         "(`kareus simulate --help` lists its options)")
    code, _, err = run(capsys, "simulate", "-w", "gpt3-xl", "--tpp", "2")
    assert code == 2 and "Did you mean" in err and "--help" not in err


def test_the_cli_choices_are_the_methods_own():
    """The CLI lists its choices by hand (importing the solver's module would slow every
    command's start); they must stay the ones the methods accept."""
    from typing import get_args

    import click

    from kareus.cli.frontiers import frontier
    from kareus.cli.profiles import perseus
    from kareus.methods.profiling import Solver
    from kareus.methods.tradeoff import Prefilter

    def choices(command: click.Command, name: str) -> tuple[str, ...]:
        option = next(p for p in command.params if p.name == name)
        return tuple(option.type.choices)

    assert choices(perseus, "prefilter") == get_args(Prefilter)
    assert choices(frontier, "solver") == get_args(Solver)


def test_simulate_and_frontier_say_the_job_s_shape(capsys):
    """The headers name the shape that ran (a Hugging Face config's default sequence, say)."""
    code, out, _ = run(capsys, "simulate", "-w", "qwen3-1.7b", "--cp", "2", "--tp", "4")
    assert code == 0 and "(TP4 CP2 PP2, MBS 8 x 8, seq 4096; layers [16, 12])" in out
    code, out, _ = run(capsys, "frontier", "-w", "gpt3-xl", "--tp", "4", "--mbs", "2",
                       "--microbatches", "4", "-o", "megatron")
    assert code == 0 and "(8 x a100-sxm4-40gb, TP4 PP2, MBS 2 x 4, seq 2048, sim)" in out
