"""Fill the generated blocks of README.md and docs/*.md from the files the project writes.

A block is written in the markdown as::

    <!-- generated: NAME -->
    ...rendered text...
    <!-- end generated -->

and NAME is one of :data:`RENDERERS`. Every number a block shows is read from a committed output
(``results/paper/tables.md``, ``results/paper/*.csv``, ``results/paper/metadata.json``,
``results/fidelity/summary.json``, ``results/whatif/summary.json``), so that a rerun after new
results needs no manual edit::

    python -m kareus.suite.docs_render          # rewrite the blocks
    python -m kareus.suite.docs_render --check  # exit 1 and name the blocks that differ

``tests/test_docs.py`` runs the check.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import SupportsFloat, SupportsIndex

import click
import pandas as pd

from kareus.atomic import atomic_write_text
from kareus.frontier import change_pct
from kareus.suite.tables import signed

REPO = Path(__file__).resolve().parents[2]

BLOCK = re.compile(r"(<!-- generated: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.DOTALL)

#: The markdown files that may hold generated blocks, relative to the repository root.
DOC_GLOBS = ("README.md", "docs/*.md")


# --- reading the outputs -------------------------------------------------------------------------

def _sections(markdown: str) -> dict[str, str]:
    """``## heading`` -> the text under it (stripped), of a markdown file."""
    out: dict[str, str] = {}
    for part in re.split(r"^## ", markdown, flags=re.MULTILINE)[1:]:
        head, _, body = part.partition("\n")
        out[head.strip()] = body.strip()
    return out


def _table_rows(table: str) -> list[list[str]]:
    """The cells of a markdown table's data rows."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.strip().startswith("|")]
    return rows[2:]


def _paper(root: Path) -> Path:
    return root / "results" / "paper"


def _read(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run the command that writes it")
    return path.read_text()


def _pct_range(values: list[float], digits: int = 1) -> str:
    lo, hi = min(values), max(values)
    f = f"{{:.{digits}f}}"
    return f"{f.format(lo)} %" if f.format(lo) == f.format(hi) else f"{f.format(lo)}–{f.format(hi)} %"


def _num(x: object) -> float:
    if not isinstance(x, (str, bytes, SupportsFloat, SupportsIndex)):
        return math.nan  # what float() refuses with a TypeError
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _metadata(root: Path) -> dict:
    return json.loads(_read(_paper(root) / "metadata.json"))


# --- renderers -----------------------------------------------------------------------------------

def render_paper_run(root: Path) -> str:
    """One line: what produced results/paper, and how long it took."""
    m = _metadata(root)
    wall = m.get("wall_s_this_run")
    took = f", {wall:.0f} s of wall time for that run" if isinstance(wall, (int, float)) else ""
    return (f"`results/paper/` was written by `python reproduce.py --suite paper` at commit "
            f"`{str(m.get('git_commit', '?'))[:10]}` ({m.get('gpu')}, {m.get('backend')} backend, "
            f"Python {m.get('python')}{took}; each configuration's `timings.json`, written by a run and not committed, has its own).\n")


def render_headline(root: Path) -> str:
    """The paper's headline numbers beside the suite's, and the ranges over the ten configurations."""
    tables = _sections(_read(_paper(root) / "tables.md"))
    head = tables.get("Beside the paper's headline numbers")
    if head is None:
        raise ValueError("results/paper/tables.md has no \"Beside the paper's headline numbers\"")
    return head + "\n\n" + render_paper_summary(root)


def _nanobatch_clause(slower: list[float], faster: list[float]) -> str:
    """What nanobatching does to the fastest iteration of the configurations where the order
    fails: ``slower`` and ``faster`` are its time changes (%, both positive)."""
    if not slower:
        return ""
    clause = f": nanobatching makes the fastest iteration {_pct_range(slower)} slower"
    if faster:
        clause += (f" on {len(slower)} of them and {_pct_range(faster)} faster on "
                   f"{'the other' if len(faster) == 1 else f'the other {len(faster)}'}")
    return clause


def render_paper_summary(root: Path) -> str:
    """A paragraph of ranges over the paper suite, computed from its CSVs and the order column."""
    paper = _paper(root)
    mt = pd.read_csv(paper / "max_throughput.csv").set_index("config")
    fr = pd.read_csv(paper / "frontier.csv").set_index("config")
    tables = _sections(_read(paper / "tables.md"))
    order = {}
    for key, body in tables.items():
        if key.startswith("Frontier vs Perseus"):
            order = {r[0]: r[-1] for r in _table_rows(body)}
    yes = [c for c, v in order.items() if v == "yes"]
    no = [c for c, v in order.items() if v != "yes"]
    k_it, k_ie = fr["kareus iso-time ΔE %"], fr["kareus iso-energy ΔT %"]
    n_it, n_ie = fr["nanobatch-perseus iso-time ΔE %"], fr["nanobatch-perseus iso-energy ΔT %"]
    lead = [min(k_it[c] - n_it[c], k_ie[c] - n_ie[c]) for c in yes]
    lead_max = [max(k_it[c] - n_it[c], k_ie[c] - n_ie[c]) for c in yes]
    nb_gain = {c: mt.loc[c, "nanobatch ΔT %"] for c in no}
    nb_slower = [-v for v in nb_gain.values() if v < 0]
    nb_faster = [v for v in nb_gain.values() if v >= 0]
    lines = [
        f"Over the {len(fr)} configurations of `--suite paper`: Perseus's fastest plan is as fast "
        f"as Megatron-LM's ({_pct_range(list(mt['perseus ΔT %']))} time saved) and saves "
        f"{_pct_range(list(mt['perseus ΔE %']))} energy.",
    ]
    if yes:
        lines.append(
            f"On the {len(yes)} where Kareus ≥ nanobatch-perseus ≥ Perseus holds, Kareus's fastest "
            f"plan is {_pct_range([mt.loc[c, 'kareus ΔT %'] for c in yes])} faster than "
            f"Megatron-LM's and uses {_pct_range([mt.loc[c, 'kareus ΔE %'] for c in yes])} less "
            f"energy; against Perseus's frontier it saves {_pct_range([k_it[c] for c in yes])} "
            f"energy at iso-time and {_pct_range([k_ie[c] for c in yes])} time at iso-energy, "
            f"leading nanobatch-perseus by {min(lead):.1f} to {max(lead_max):.1f} points.")
    if no:
        lines.append(
            f"On the other {len(no)} ({', '.join(f'`{c}`' for c in no)}) the order column says no"
            + _nanobatch_clause(nb_slower, nb_faster)
            + f", and Kareus saves {_pct_range([_num(k_it[c]) for c in no])} at iso-time and "
            f"{_pct_range([_num(k_ie[c]) for c in no])} at iso-energy.")
    return textwrap.fill(" ".join(lines), width=99, break_on_hyphens=False,
                         break_long_words=False) + "\n"


def render_paper_tables(root: Path) -> str:
    """results/paper/tables.md, its title dropped and its headings one level down."""
    text = _read(_paper(root) / "tables.md")
    body = text.split("\n", 1)[1].strip() if text.startswith("# ") else text.strip()
    body = re.sub(r"^## ", "### ", body, flags=re.MULTILINE)
    return body + "\n"


def _fidelity(root: Path) -> dict:
    path = root / "results" / "fidelity" / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def render_fidelity(root: Path) -> str:
    """The simulator's accuracy per measured data set, from results/fidelity/summary.json."""
    f = _fidelity(root)
    rows = ["| data set | what is compared | accuracy | measured on, by |", "|---|---|---|---|"]

    def when(e: dict) -> str:
        return f"{e['date']}, `{e['command']}`"

    if "partition" in f:
        p = f["partition"]
        alone = p.get("collective_alone", {})
        alone_txt = "; ".join(f"{k} law {v['time_mape_pct']:.2f} %" for k, v in alone.items())
        rows.append(
            f"| Kareus artifact, attention-partition sweep (2 × A100) | {p['rows']} "
            f"configurations (window × SMs × block size) | fit {p['time_mape_pct']:.2f} % time / "
            f"{p['energy_mape_pct']:.2f} % energy MAPE (max {p['time_max_ape_pct']:.2f} %); "
            f"hold-out {p['holdout_time_mape_pct']:.2f} % / {p['holdout_energy_mape_pct']:.2f} %; "
            f"measured best ranks {p['measured_best_predicted_rank']}; the collective alone, "
            f"1–10 SMs → 11–20: {alone_txt} | {when(p)} |")
    if "nccl" in f:
        v = f["nccl"]

        def gpus(groups: list[int] | None) -> str:
            if not groups:
                return "some GPU counts"
            return ", ".join(map(str, groups[:-1])) + f" and {groups[-1]} GPUs"
        rows.append(
            f"| NCCL all-reduce inside vTrain's A100 node, 1–256 MiB (fitted on "
            f"{gpus(v.get('fit_groups'))}) | {v['rows']} collective times | {v['mape_pct']:.2f} % "
            f"MAPE, max {v['max_pct']:.2f} %, signed {v['signed_mean_pct']:+.2f} %; hold-out "
            f"{gpus(v.get('holdout_groups'))} {v['holdout_mape_pct']:.2f} % | {when(v)} |")
    if "artifact" in f:
        a = f["artifact"]
        ratios = "; ".join(f"{k}: {v['simulated']:.3f} simulated, {v['measured']:.3f} measured"
                           for k, v in a.get("nanobatching_ratio", {}).items())
        rows.append(
            f"| Kareus artifact, iteration frontiers (16 × A100 40 GB) | the {a['endpoints']} "
            f"endpoints of Perseus's and Nanobatching + Perseus's frontiers | "
            f"{a['endpoint_mape_pct']:.2f} % MAPE, max {a['endpoint_max_pct']:.2f} %; "
            f"nanobatching's fastest-time ratio {ratios} | {when(a)} |")
    for key, label in (("vtrain-single", "vTrain, Megatron-LM on one node (fitted)"),
                       ("vtrain-multi", "vTrain, 3.6B on 64 GPUs (network share fitted)")):
        if key in f:
            v = f[key]
            rows.append(
                f"| {label} | {int(v['runs'])} iteration times | {v['mape_pct']:.2f} % MAPE, max "
                f"{v['max_pct']:.2f} %, signed {v['signed_mean_pct']:+.2f} %; Spearman "
                f"{v['spearman_mean']:.3f} | {when(v)} |")
    if "megatron-sc21" in f:
        v = f["megatron-sc21"]
        by = ", ".join(f"{a['mape_pct']:.2f} % at {m}" for m, a in v["by_micro_batch"].items())
        rows.append(
            f"| Megatron-LM paper's weak scaling, 32–3,072 × A100 80 GB (predicted) | "
            f"{v['runs']} published throughputs as iteration times | at the authors' settings "
            f"{v['mape_pct']:.2f} % MAPE, max {v['max_pct']:.2f} %, signed "
            f"{v['signed_mean_pct']:+.2f} %; every model at one micro-batch size: {by} | "
            f"{when(v)} |")
    if "perseus-measured" in f:
        v = f["perseus-measured"]
        saved = "; ".join(
            f"{r['method']} {r['measured_saved_least_energy_pct']:.1f} / "
            f"{r['simulated_saved_least_energy_pct']:.1f} %" for r in v["rows"])
        rows.append(
            f"| Perseus's measured GPT-3 XL job (4 × A100 PCIe) | energy saved at the least-energy "
            f"plan against the default, measured / simulated | {saved} | {when(v)} |")
    if len(rows) == 2:
        return ("No accuracy recorded yet: run `python benchmarks/fidelity.py --write "
                "results/fidelity/summary.json` (needs the measurement data, "
                "docs/getting-started.md).\n")
    return "\n".join(rows) + "\n"


#: What a Perseus-job block says before ``fidelity.py`` has recorded it.
_PERSEUS_NOT_RECORDED = ("Not recorded yet: run `python benchmarks/fidelity.py --only "
                         "perseus-measured --write results/fidelity/summary.json`.\n")


def render_power_limits(root: Path) -> str:
    """Zeus's global power limit on the Perseus GPT-3 XL job, limit by limit, measured against
    simulated, from results/fidelity/summary.json."""
    v = _fidelity(root).get("perseus-measured", {})
    if not v.get("power_limits"):
        return _PERSEUS_NOT_RECORDED
    rows = ["| power limit | time, measured / simulated | energy, measured / simulated | "
            "average power per GPU, measured / simulated |", "|---|---|---|---|"]
    for r in v["power_limits"]:
        rows.append(
            f"| {r['power_limit_w']:.0f} W | {r['measured_time_pct']:+.1f} / "
            f"{r['simulated_time_pct']:+.1f} % | {r['measured_energy_pct']:+.1f} / "
            f"{r['simulated_energy_pct']:+.1f} % | {r['measured_power_per_gpu_w']:.0f} / "
            f"{r['simulated_power_per_gpu_w']:.0f} W |")
    return "\n".join(rows) + "\n"


def render_locked_clocks(root: Path) -> str:
    """The Perseus GPT-3 XL job's measured plans that lock clocks, simulated at their clocks, from
    results/fidelity/summary.json."""
    v = _fidelity(root).get("perseus-measured", {}).get("locked_clocks")
    if not v:
        return _PERSEUS_NOT_RECORDED
    t, e = v["time_error_pct"], v["energy_error_pct"]
    dt, de = v["time_change_error_points"], v["energy_change_error_points"]
    return (f"| plans | time, simulated against measured | energy, simulated against measured | "
            f"change against each default plan, simulated minus measured |\n|---|---|---|---|\n"
            f"| {v['plans']} | {t[0]:+.1f} to {t[1]:+.1f} % | {e[0]:+.1f} to {e[1]:+.1f} % | "
            f"time {dt[0]:+.1f} to {dt[1]:+.1f} points, energy {de[0]:+.1f} to {de[1]:+.1f} "
            f"points |\n")


def render_first_principles(root: Path) -> str:
    """The first-principles check of one simulated iteration, each simulated figure beside the
    datasheet arithmetic that explains it, from results/fidelity/summary.json's
    ``first-principles`` entry (``benchmarks/sanity.py --write``)."""
    f = _fidelity(root).get("first-principles")
    if not f:
        return ("Not recorded yet: run `python benchmarks/sanity.py --write "
                "results/fidelity/summary.json`.\n")
    t, st = f["time_s"], max(f["stages"], key=lambda s: s["busy_ms"])
    share = {k: f"{100 * st[f'{k}_ms'] / st['busy_ms']:.0f} %" for k in ("gemm", "attention", "memory", "comm")}
    recompute = {"full": ", full recomputation", "selective": ", selective recomputation",
                 "none": ""}[f["recompute"]]
    watts = [i["avg_power_w"] for i in f["instructions"]]
    k = f["capped_kernel"]
    layers = " + ".join(map(str, f["stage_layers"]))
    activations = ("the sequence-parallel `[tokens / TP, hidden]` activations"
                   if f["sequence_parallel"] else
                   "the un-sharded `[tokens, hidden]` activations of TP without sequence "
                   "parallelism")
    extra = " (× 4/3)" if f["recompute"] == "full" else ""
    cp = f" CP{f['cp']}" if f["cp"] > 1 else ""
    lines = [
        f"`{f['command']}`, {f['date']}: {f['workload']} on {f['gpus']} × {f['gpu']} "
        f"(TP{f['tp']}{cp} PP{f['pp']}, MBS {f['mbs']} × "
        f"{f['microbatches']} microbatches, seq {f['seq']}{recompute}, layers {layers}), "
        f"Megatron-LM's plan ({f['clock_mhz']:.0f} MHz, no overlap):",
        "",
        "| figure | simulated | datasheet arithmetic |",
        "|---|---|---|",
        f"| iteration time | **{t:.3f} s** | model FLOPs {f['model_pflop']:.2f} PFLOP / "
        f"({f['gpus']} × {f['peak_tflops']:.0f} TFLOP/s) = {f['ideal_time_s']:.3f} s ideal"
        f"{'; recomputation adds a forward' + extra if f['recompute'] == 'full' else ''}. "
        f"Per microbatch F+B the slowest stage ({st['stage']}) spends {st['busy_ms']:.0f} ms at "
        f"the locked clock without the cap: GEMMs {st['gemm_ms']:.0f} ms "
        f"({share['gemm']}, {st['tensor_tflops']:.0f} TFLOP/s in tensor kernels: the "
        f"calibrated {100 * f['gemm_efficiency']:.0f} % efficiency, less for the narrow K of "
        f"TP{f['tp']}'s row-parallel GEMMs), attention {st['attention_ms']:.0f} ms "
        f"({share['attention']}), HBM-bound kernels {st['memory_ms']:.0f} ms "
        f"({share['memory']}, {activations} at the calibrated {100 * f['hbm_efficiency']:.0f} % of "
        f"HBM) and collectives {st['comm_ms']:.0f} ms ({share['comm']}). 1F1B: "
        f"(M + S − 1) × the slowest stage = {f['microbatches'] + f['pp'] - 1} × "
        f"{st['busy_ms']:.0f} ms = {f['one_f_one_b_s']:.2f} s, a bubble of "
        f"{f['bubble_pct']:.1f} %; the GEMMs throttled by the cap, the P2P transfers ({f['p2p_ms']:.0f} ms each "
        f"at most; {f['network_gb_s']:.2f} GB/s of network per GPU), the optimizer step and the "
        f"gradient synchronisation add the rest. |",
        f"| average power per GPU | **{f['avg_power_per_gpu_w']:.0f} W** | one GEMM "
        f"(`{k['name']}`) back to back, asked for {f['clock_mhz']:.0f} MHz, runs at "
        f"{k['runs_at_mhz']:.0f} MHz and {k['power_w']:.0f} W under the "
        f"{k['power_limit_w']:.0f} W cap, and so it does inside an instruction, while the "
        f"memory-bound kernels and all-reduces between the GEMMs keep the locked clock "
        f"(instructions average {min(watts):.0f}–{max(watts):.0f} W, NCCL's channels drawing "
        f"their own fitted power); bubbles at {f['static_power_w']:.0f} W. |",
        f"| MFU | **{f['mfu_pct']:.1f} %** | {f['ideal_time_s']:.3f} s / {t:.3f} s. |",
        f"| static share of energy | **{f['static_share_pct']:.1f} %** | "
        f"{f['static_power_w']:.0f} W × {f['gpus']} × {t:.3f} s = {f['static_kj']:.2f} kJ of "
        f"{f['energy_kj']:.2f} kJ. |",
    ]
    fastest = _fidelity(root).get("artifact", {}).get("fastest_time_s", {})
    if fastest:
        lines += ["", "Against measurement, the testbed's fastest Perseus iterations in the shared "
                  "data (`fidelity.py --only artifact`): " + "; ".join(
                      f"{name}: {v['measured']:.3f} s measured, {v['simulated']:.3f} s simulated"
                      for name, v in fastest.items()) + "."]
    return "\n".join(lines) + "\n"


#: How the power-curve table names the GPUs and the profiles' models.
_SHORT_NAMES = {"a100-sxm4-80gb": "A100", "a40": "A40", "gpt3-175b": "GPT-3", "bloom": "Bloom"}


def render_power_curves(root: Path) -> str:
    """The SM power curve fitted on one Perseus profile and its hold-out on the other model, for
    the earlier law (*before*) and the current one (*after*), from results/fidelity/summary.json's
    ``power-curves`` entry (``benchmarks/calibration.py --write``)."""
    v = _fidelity(root).get("power-curves")
    if not v:
        return ("Not recorded yet: run `python benchmarks/calibration.py --write "
                "results/fidelity/summary.json`.\n")
    by = {(r["gpu"], r["fit"], r["test"], r["law"]): r for r in v["rows"]}
    rows = ["| GPU | fit → predict | fitted (current law): knee, V ratio, ceiling, cap | time "
            "before | time after | energy before | energy after |",
            "|---|---|---|---|---|---|---|"]

    def pair(r: dict, what: str) -> str:
        return f"{r[f'hold_{what}_mape_pct']:.2f} / {r[f'hold_{what}_max_pct']:.2f}"

    for (gpu, fit, test, law), after in by.items():
        before = by.get((gpu, fit, test, "before"))
        if law != "after" or before is None:
            continue
        name = _SHORT_NAMES.get
        fitted = (f"{after['knee_mhz']:.0f} MHz, {after['v_ratio']:.3f}, "
                  f"{after['ceiling_mhz']:.0f} MHz, {after['cap_w']:.0f} W")
        rows.append(f"| {name(gpu, gpu)} | {name(fit, fit)} → {name(test, test)} | {fitted} | "
                    f"{pair(before, 'time')} | {pair(after, 'time')} | "
                    f"{pair(before, 'energy')} | {pair(after, 'energy')} |")
    return "\n".join(rows) + f"\n\nMeasured {v['date']}, `{v['command']}`.\n"


def render_megatron_scaling(root: Path) -> str:
    """The Megatron-LM paper's published weak scaling against the simulator, model by model, from
    results/fidelity/summary.json."""
    v = _fidelity(root).get("megatron-sc21")
    if not v:
        return ("Not recorded yet: run `python benchmarks/fidelity.py --only megatron-sc21 "
                "--write results/fidelity/summary.json`.\n")
    mbs = list(v["by_micro_batch"])

    def err(x: float | None) -> str:
        return "–" if x is None else f"{x:+.1f} %"

    rows = ["| model | GPUs | TP × PP × DP | batch | micro-batch | schedule | gradient all-reduce | "
            "TFLOP/s per GPU, published | simulated (time error) | time error, every model at "
            f"micro-batch {' / '.join(mbs)} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in v["rows"]:
        schedule = ("1F1B" if r["virtual_chunks"] == 1
                    else f"interleaved, {r['virtual_chunks']} chunks")
        sweep = " / ".join(err(r[f"error_pct_mbs{m}"]) for m in mbs)
        rows.append(f"| {r['params_b']:g}B | {r['gpus']:,} | {r['tp']} × {r['pp']} × {r['dp']} | "
                    f"{r['global_batch']:,} | {r['mbs']} | {schedule} | "
                    f"{'overlapped (DDP)' if r['torch_ddp'] else 'after the backward'} | "
                    f"{r['tflops_per_gpu']:.0f} | {r['sim_tflops']:.0f} ({err(r['error_pct'])}) | "
                    f"{sweep} |")
    return "\n".join(rows) + "\n"


def render_parameters(root: Path, gpu: str = "a100-sxm4-40gb") -> str:
    """Every parameter of the paper testbed's preset with its source (``kareus gpus --json``)."""
    from dataclasses import fields

    from kareus.hardware.presets import get_preset

    p = get_preset(gpu)
    rows = ["| parameter | value | source |", "|---|---|---|"]
    for f in fields(p):
        if f.name in ("name", "sources"):
            continue
        v = getattr(p, f.name)
        val = f"{v:.4g}" if isinstance(v, float) else str(v)
        src = str(p.sources.get(f.name, "")).replace("|", "/")
        rows.append(f"| `{f.name}` | {val} | {src} |")
    return "\n".join(rows) + "\n"


#: The kinds of the paper testbed's parameters (docs/calibration.md, "Where every number came
#: from"): each ``{field}`` is the preset's value, ``{field_us}`` / ``{field_M}`` / ``{field_G}``
#: / ``{field_T}`` the value times 1e6 / over 1e6, 1e9, 1e12 (µs from s; MB/s, GB/s, TB/s from
#: B/s).
PARAMETER_KINDS = (
    ("datasheet", "SMs, FLOP/clk/SM, clocks, HBM {hbm_bw_T:.3f} TB/s, NVLink {nvlink_bw_G:.0f} "
     "GB/s, {power_limit_w:.0f} W limit, {comm_max_sms} channels at most"),
    ("published", "{static_power_w:.0f} W static power (Kareus paper); inter-node 4 × 100 Gb/s "
     "EFA per 8 GPUs = {network_bw_G:.2f} GB/s per GPU (`hardware.md`); {comm_block_default} "
     "threads/block for tuned collectives (the artifact sweep's faster block size)"),
    ("fitted: Perseus profiles", "the V–f knee ({knee_mhz:.0f} MHz) and voltage ratio "
     "({v_ratio:.3f}), from the GPT-3 175B A100 profile (`benchmarks/calibration.py`, below)"),
    ("fitted: partition sweep", "the tuned collective ({tuned_bw_per_sm_mhz_M:.2f} MB/s per SM "
     "per MHz, β = {tuned_block_exponent:.2f}, λ = {tuned_link_fraction:.2f} of NVLink alone and "
     "at most {tuned_link_fraction_beside_compute:.3f} of it beside a GEMM or attention kernel, "
     "pipelining p = {tuned_pipelining:.2f}, launch {comm_launch_s_us:.2f} µs), its SM path "
     "beside memory kernels ({comm_rate_beside_memory:.2f}) and its rate beside GEMM / attention "
     "kernels ({comm_rate_beside_gemm:.2f} / {comm_rate_beside_attention:.2f}), compute's "
     "slowdown beside it ({overlap_slowdown_memory:.2f} / {overlap_slowdown_gemm:.3f} / "
     "{overlap_slowdown_attention:.2f} per unit SM share), the wave a GEMM loses when the "
     "collective ends inside it ({partial_wave_loss:.2f}), host issue per op "
     "({host_issue_memory_s_us:.0f} / {host_issue_gemm_s_us:.0f} / "
     "{host_issue_attention_s_us:.0f} µs), the sweep harness's overhead "
     "({partition_harness_s_us:.0f} µs), the tuned collective's SM activity ({activity_comm:.2f}) "
     "and link power ({link_dyn_power_w:.0f} W), by `kareus calibrate --partition-sweep` (one "
     "round alternated with the frontier fit; see the partition section); with them, the per-op "
     "work and host factors of the sweep's own eight kernels (the fuser's basic ops), which "
     "`kareus partition` uses without `--calibration` on that spec"),
    ("fitted: iteration frontiers", "`gemm_efficiency` {gemm_efficiency:.3f}, `hbm_efficiency` "
     "{hbm_efficiency:.3f}, SM dynamic power {sm_dyn_power_w:.1f} W, NCCL's rate beside compute "
     "{library_rate_beside:.3f} and NCCL's channels' SM activity {library_activity_comm:.2f}, by "
     "`benchmarks/fidelity.py --fit` (its first stage) on the two shared calibration frontiers, "
     "refitted from the preset (first fitted from the textbook priors 0.80 / 0.85 / 438.1 W (the "
     "80 GB fit) / 0.80; from those priors, under the partition law's other basin, it stopped in "
     "a neighbouring minimum: 1.68 % MAPE, max 3.25 %)"),
    ("fitted: nanobatching ratios", "the share of the host issue time that reaches the GPU "
     "inside an iteration, {iteration_host_fraction:.3f}, and the host time per framework call, "
     "{host_issue_call_s_us:.1f} µs, by `benchmarks/fidelity.py --fit` (its second stage) on the "
     "two measured ratios of Nanobatching + Perseus's fastest time to Perseus's (see \"The host "
     "inside an iteration\")"),
    ("derived", "causal attention's tail past its even share, 1.14 average tiles forward and "
     "0.88 backward (list scheduling of FlashAttention-2's grid, `benchmarks/attention_tail.py`); "
     "Transformer Engine's all-gather CP attention's host calls besides its first kernel and its "
     "collectives, 52 forward and 83 backward (counted in `context_parallel.py`, "
     "NVIDIA/TransformerEngine 9c61cd7)"),
    ("assumed", "attention efficiency {attention_efficiency:.2f} forward / "
     "{attention_bwd_efficiency:.2f} backward, the {gemm_depth_half:.0f}-step GEMM depth half, "
     "link efficiency {link_efficiency:.2f}, NCCL's {comm_default_sms} channels and "
     "{comm_latency_s_us:.0f} µs latency, {kernel_overhead_s_us:.0f} µs per kernel, memory / "
     "attention activity, 3.9 pJ/bit HBM"),
)


def render_parameter_kinds(root: Path, gpu: str = "a100-sxm4-40gb") -> str:
    """The paper testbed's parameters by kind (:data:`PARAMETER_KINDS`), their values read from
    the preset."""
    from dataclasses import fields

    from kareus.hardware.presets import get_preset

    p = get_preset(gpu)
    values: dict[str, object] = {}
    for f in fields(p):
        v = getattr(p, f.name)
        values[f.name] = v
        if isinstance(v, float):
            values.update({f"{f.name}_us": v * 1e6, f"{f.name}_M": v / 1e6,
                           f"{f.name}_G": v / 1e9, f"{f.name}_T": v / 1e12})
    rows = [f"| kind | parameters ({p.name}, the paper's testbed) |", "|---|---|"]
    rows += [f"| {kind} | {text.format(**values)} |" for kind, text in PARAMETER_KINDS]
    return "\n".join(rows) + "\n"


def render_whatif(root: Path) -> str:
    """One table per what-if study, from results/whatif/summary.json (``benchmarks/whatif.py``):
    Kareus's and Nanobatching + Perseus's frontiers against Perseus's, Kareus's fastest plan
    against Megatron-LM's, Perseus's least-energy plan's time against its fastest, and a single
    power cap's (Zeus's) least energy against Perseus's and Kareus's least energy."""
    path = root / "results" / "whatif" / "summary.json"
    if not path.is_file():
        return ("Not recorded yet: run `python benchmarks/whatif.py --write "
                "results/whatif/summary.json`.\n")

    def pct(v: object) -> str:
        return "not attainable" if v is None else signed(_num(v))

    out = []
    for name, study in json.loads(path.read_text()).items():
        out.append(f"**{name}**: `{study['command']}` ({study['gpu']}; {study['wall_s']:.0f} s on "
                   f"{study['date']}, commit `{str(study.get('git_commit'))[:10]}`)\n")
        out.append("| config | Kareus iso-time ΔE % | Kareus iso-energy ΔT % | NB+Perseus iso-time "
                   "ΔE % | NB+Perseus iso-energy ΔT % | Kareus fastest vs Megatron-LM ΔT / ΔE % "
                   "| Perseus least-energy plan's time vs its fastest | Zeus least energy vs "
                   "Perseus's / Kareus's least % |")
        out.append("|---|---|---|---|---|---|---|---|")
        for config, r in study["configs"].items():
            stretch = (f"{r['perseus_least_energy_s']:.3g} s vs {r['perseus_fastest_s']:.3g} s "
                       f"({change_pct(r['perseus_fastest_s'], r['perseus_least_energy_s']):+.0f} %)"
                       if r.get("perseus_fastest_s") else "-")
            out.append(f"| {config} | {pct(r['kareus_iso_time_pct'])} | "
                       f"{pct(r['kareus_iso_energy_pct'])} | {pct(r['nb_perseus_iso_time_pct'])} | "
                       f"{pct(r['nb_perseus_iso_energy_pct'])} | "
                       f"{pct(r['kareus_fastest_time_pct'])} / "
                       f"{pct(r['kareus_fastest_energy_pct'])} | {stretch} | "
                       f"{pct(r.get('zeus_least_energy_vs_perseus_pct'))} / "
                       f"{pct(r.get('zeus_least_energy_vs_kareus_pct'))} |")
        out.append("")
    return "\n".join(out)


RENDERERS: dict[str, Callable[[Path], str]] = {
    "parameters": render_parameters,
    "parameter-kinds": render_parameter_kinds,
    "headline": render_headline,
    "paper-run": render_paper_run,
    "paper-summary": render_paper_summary,
    "paper-tables": render_paper_tables,
    "fidelity": render_fidelity,
    "power-limits": render_power_limits,
    "locked-clocks": render_locked_clocks,
    "megatron-scaling": render_megatron_scaling,
    "power-curves": render_power_curves,
    "first-principles": render_first_principles,
    "whatif": render_whatif,
}


# --- filling the blocks --------------------------------------------------------------------------

def doc_files(root: Path = REPO) -> list[Path]:
    return sorted({p for g in DOC_GLOBS for p in root.glob(g) if p.is_file()})


def fill(text: str, root: Path = REPO) -> tuple[str, list[str]]:
    """``text`` with every generated block rendered anew, and the names of the blocks that
    changed."""
    changed: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m["name"]
        if name not in RENDERERS:
            raise KeyError(f"unknown generated block {name!r}; known: {', '.join(RENDERERS)}")
        body = RENDERERS[name](root)
        if body != m["body"]:
            changed.append(name)
        return m[1] + body + m[4]

    return BLOCK.sub(sub, text), changed


def run(root: Path = REPO, check: bool = False) -> list[str]:
    """Render every block of every doc; write the files unless ``check``. Returns
    ``path: block`` for each block that differed."""
    stale: list[str] = []
    for path in doc_files(root):
        text = path.read_text()
        new, changed = fill(text, root)
        stale += [f"{path.relative_to(root)}: {name}" for name in changed]
        if changed and not check:
            atomic_write_text(path, new)
    return stale


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 and name the blocks that differ from the outputs.")
def cli(check: bool) -> None:
    """Fill the generated blocks of README.md and docs/*.md from the files the project writes."""
    stale = run(REPO, check=check)
    if check and stale:
        click.echo("generated blocks out of date (run `python -m kareus.suite.docs_render`):\n  "
                   + "\n  ".join(stale))
        raise SystemExit(1)
    click.echo(("rewrote: " + ", ".join(stale)) if stale and not check
               else "generated blocks up to date")


def main(argv: list[str] | None = None) -> int:
    """Run :func:`cli` on ``argv`` (default: the command line); returns the exit status (2 for
    an unknown option, with click's one-line usage error)."""
    try:
        cli.main(args=argv, prog_name="python -m kareus.suite.docs_render",
                 standalone_mode=False)
    except click.UsageError as e:
        click.echo(f"error: {e.format_message()}", err=True)
        return 2
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
