"""Energy across clocks, grounded in measurement: fit each GPU's clock laws on one model's Perseus
profile, predict the other model's per-clock time and energy relative to its top clock (GPT-3
175B -> Bloom 176B and Bloom -> GPT-3, A100 SXM4 80 GB and A40), report MAPE and max per
instruction, for the earlier law (``before``: no sustained-clock ceiling, the cap at the board
limit) and the current one (``after``: ceiling and held cap fitted).

    python benchmarks/calibration.py [--detail] [--plot calibration.png] [--json] [--top-window 150]
                                     [--cross-gpu] [--write results/fidelity/summary.json]

``--cross-gpu`` adds a table: each GPU's voltage curve (knee and voltage ratio) carried from the
other measured GPU, its knee at the same fraction of the top clock or at the same MHz, the rest
fitted on one model's profile and the other model predicted; the rule that carries better is the
one the presets without measurements (H100, H200) use.

``--top-window W`` adds a table: each profile fitted on its clocks within ``W`` MHz of its top
clock only, predicting its lower clocks (relative to each instruction's top clock), with the knee
and voltage ratio kept from the preset when the window does not reach below the knee (the
calibration's default) and fitted freely.

Data: shared/perseus_sosp24/stage_profile (Perseus SOSP '24 artifact; A100 SXM4 80 GB 500 W and
A40 300 W measurements). The A100 GPT-3 fit is what the a100-sxm4-* presets carry; the 40 GB 400 W
part shares the die and V-f curve and differs in HBM power, static power (85 W, published) and cap.
"""

from __future__ import annotations

import json
import sys

import click
import pandas as pd

from kareus.errors import InputError
from kareus.frontier import mape_pct
from kareus.hardware.calibration import (
    MIN_CLOCKS_BELOW_KNEE,
    calibrate,
    predict_relative,
    transfer_table,
)
from kareus.hardware.presets import GPUPreset, get_preset
from kareus.hardware.profile import load_profile
from kareus.progress import SILENT, Progress
from kareus.suite.datasets import perseus_profile

CASES = [("a100-sxm4-80gb", "a100_sxm"), ("a40", "a40")]
DIRECTIONS = [("gpt3-175b", "bloom"), ("bloom", "gpt3-175b")]
LAWS = {"before": False, "after": True}


def run(progress: Progress = SILENT) -> tuple[list[dict], pd.DataFrame, pd.DataFrame]:
    """Every (GPU, direction, law): the fit, the hold-out summary, per-instruction errors, rows."""
    report, tables, frames = [], [], []
    task = progress.start("profile fits", len(CASES) * len(DIRECTIONS) * len(LAWS))
    for gpu, tag in CASES:
        preset = get_preset(gpu)
        for fit_model, test_model in DIRECTIONS:
            fit_path = perseus_profile(f"{fit_model}+{tag}_bf16.csv")
            test_path = perseus_profile(f"{test_model}+{tag}_bf16.csv")
            if fit_path is None or test_path is None:
                raise InputError("shared/perseus_sosp24 not found; set KAREUS_SHARED_DIR")
            test = load_profile(test_path)
            for law_name, limits in LAWS.items():
                res = calibrate(load_profile(fit_path), preset, clock_limits=limits)
                task.advance()
                rows, tr = predict_relative(res, preset, test)
                key = dict(gpu=gpu, fit=fit_model, test=test_model, law=law_name)
                tables.append(transfer_table(rows).assign(**key))
                frames.append(rows.assign(**key))
                report.append({
                    **key, "knee_mhz": res.law.knee_mhz, "v_ratio": res.law.v_ratio,
                    "insensitive_share": res.law.insensitive_share,
                    "ceiling_mhz": res.law.ceiling_mhz, "cap_w": res.law.cap_w,
                    "sm_dyn_power_w": res.sm_dyn_power_w,
                    "fit_time_mape_pct": res.time_mape_pct,
                    "fit_energy_mape_pct": res.energy_mape_pct,
                    "hold_time_mape_pct": tr.time_mape_pct, "hold_time_max_pct": tr.time_max_pct,
                    "hold_energy_mape_pct": tr.energy_mape_pct,
                    "hold_energy_max_pct": tr.energy_max_pct, "hold_points": tr.points,
                })
    task.done()
    return report, pd.concat(tables, ignore_index=True), pd.concat(frames, ignore_index=True)


def top_window_extrapolation(window_mhz: float, progress: Progress = SILENT) -> list[dict]:
    """Each profile fitted on its clocks within ``window_mhz`` of its top clock, predicting the
    clocks below: time and energy MAPE (%) there, by the calibration's default (``kept``: the
    knee and voltage ratio kept from the preset, when the window lies above the knee; else
    ``free``) and with them always fitted (``free``). A window that leaves fewer than 4 clocks to
    fit or none to predict is refused (:class:`click.BadParameter`)."""
    out = []
    task = progress.start("top-window fits", len(CASES) * len(DIRECTIONS) * 2)
    for gpu, tag in CASES:
        preset = get_preset(gpu)
        for model, _ in DIRECTIONS:
            path = perseus_profile(f"{model}+{tag}_bf16.csv")
            if path is None:
                raise InputError("shared/perseus_sosp24 not found; set KAREUS_SHARED_DIR")
            profile = load_profile(path)
            cut = profile.frequency.max() - window_mhz
            inside, below = (profile.frequency >= cut), (profile.frequency < cut)
            if profile.frequency[inside].nunique() < 4 or not below.any():
                raise click.BadParameter(
                    f"{window_mhz:g} MHz leaves {profile.frequency[inside].nunique()} clock(s) of "
                    f"{path.name} to fit (at least 4) and {profile.frequency[below].nunique()} "
                    "below it to predict (at least 1)", param_hint="--top-window")
            for min_below in (MIN_CLOCKS_BELOW_KNEE, 0):
                res = calibrate(profile[inside], preset, min_clocks_below_knee=min_below)
                task.advance()
                rows, _ = predict_relative(res, preset, profile)
                low = rows[rows.frequency < cut]
                label = "kept" if res.kept_from_preset else "free"
                out.append({"gpu": gpu, "profile": model, "window_from_mhz": float(cut),
                            "voltage_curve": label, "knee_mhz": res.law.knee_mhz,
                            "v_ratio": res.law.v_ratio,
                            "time_mape_pct": mape_pct(low.time, low.time_pred),
                            "energy_mape_pct": mape_pct(low.energy, low.energy_pred)})
    task.done()
    return out


#: (target GPU, the GPU whose fitted voltage curve is carried to it)
CROSS = [("a40", "a100-sxm4-80gb"), ("a100-sxm4-80gb", "a40")]


def knee_rules(source: GPUPreset, target: GPUPreset) -> dict[str, float | None]:
    """The knees (MHz) ``target`` would get from ``source``'s fitted curve: ``own`` (None: fitted
    on the target's profile), ``same fraction`` of the top clock, or the ``same MHz``."""
    return {"own": None,
            "same fraction": source.knee_mhz / source.clock_max_mhz * target.clock_max_mhz,
            "same MHz": source.knee_mhz}


def cross_gpu_table(progress: Progress = SILENT) -> list[dict]:
    """Each (target, source) of :data:`CROSS` and knee rule (:func:`knee_rules`), both directions
    of models: the target's profile of one model fitted with the carried knee and voltage ratio
    held (``own``: fitted freely), the other model's per-clock time and energy relative to its top
    clock predicted (MAPE %)."""
    out = []
    task = progress.start("cross-GPU fits", len(CROSS) * 3 * len(DIRECTIONS))
    for gpu, source_gpu in CROSS:
        target, source = get_preset(gpu), get_preset(source_gpu)
        tag = dict(CASES)[gpu]
        for rule, knee in knee_rules(source, target).items():
            preset = target if knee is None else target.with_overrides(
                knee_mhz=knee, v_ratio=source.v_ratio)
            for fit_model, test_model in DIRECTIONS:
                fit_path = perseus_profile(f"{fit_model}+{tag}_bf16.csv")
                test_path = perseus_profile(f"{test_model}+{tag}_bf16.csv")
                if fit_path is None or test_path is None:
                    raise InputError("shared/perseus_sosp24 not found; set KAREUS_SHARED_DIR")
                res = calibrate(load_profile(fit_path), preset,
                                min_clocks_below_knee=0 if knee is None else sys.maxsize)
                task.advance()
                _, tr = predict_relative(res, preset, load_profile(test_path))
                out.append({"gpu": gpu, "curve_from": gpu if knee is None else source_gpu,
                            "rule": rule, "fit": fit_model, "test": test_model,
                            "knee_mhz": res.law.knee_mhz, "v_ratio": res.law.v_ratio,
                            "hold_time_mape_pct": tr.time_mape_pct,
                            "hold_energy_mape_pct": tr.energy_mape_pct})
    task.done()
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--detail", is_flag=True, help="Print every (stage, instruction).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the fits and hold-outs as JSON.")
@click.option("--top-window", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Also fit each profile on its top MHz only and predict the clocks below.")
@click.option("--cross-gpu", is_flag=True,
              help="Also carry each GPU's voltage curve to the other (knee at the same fraction "
                   "of the top clock or the same MHz) and predict its profiles.")
@click.option("--write", "write_json", default=None, type=click.Path(dir_okay=False),
              help="Also record the fits and hold-outs as the 'power-curves' entry of this JSON "
                   "file (results/fidelity/summary.json: the docs render them from it).")
def main(detail: bool, plot: str | None, as_json: bool, top_window: float | None,
         cross_gpu: bool, write_json: str | None) -> None:
    from kareus.atomic import check_json_record, check_writable_file

    check_json_record(write_json, "--write")
    if plot is not None:
        plot = str(check_writable_file(plot, "--plot"))
    from kareus.suite.progress import terminal_progress

    with terminal_progress() as progress:
        windows = None if top_window is None else top_window_extrapolation(top_window, progress)
        carried = cross_gpu_table(progress) if cross_gpu else None
        report, table, frames = run(progress)
    if write_json is not None:
        _write_record(write_json, report)
    if as_json:
        out = {"summary": report, "per_instruction": table.to_dict("records")}
        if windows is not None:
            out["top_window"] = windows
        if carried is not None:
            out["cross_gpu"] = carried
        click.echo(json.dumps(out, indent=2, default=float))
        return
    click.echo("Fit (all rows of the fit profile) and hold-out (the other model, relative to its "
               "top clock; %: MAPE / max over clocks and instructions)")
    click.echo(f"{'gpu':15s} {'fit -> test':20s} {'law':6s} {'knee':>5s} {'Vr':>5s} {'m':>5s} "
               f"{'ceil':>5s} {'cap':>4s} {'fit T%':>6s} {'fit E%':>6s} "
               f"{'hold T% mape/max':>17s} {'hold E% mape/max':>17s}")
    for r in report:
        ceil = f"{r['ceiling_mhz']:5.0f}" if r["ceiling_mhz"] else "    -"
        cap = f"{r['cap_w']:4.0f}" if r["cap_w"] else "   -"
        click.echo(
            f"{r['gpu']:15s} {r['fit'] + ' -> ' + r['test']:20s} {r['law']:6s} "
            f"{r['knee_mhz']:5.0f} {r['v_ratio']:5.3f} {r['insensitive_share']:5.3f} {ceil} {cap} "
            f"{r['fit_time_mape_pct']:6.2f} {r['fit_energy_mape_pct']:6.2f} "
            f"{r['hold_time_mape_pct']:8.2f} /{r['hold_time_max_pct']:6.2f} "
            f"{r['hold_energy_mape_pct']:8.2f} /{r['hold_energy_max_pct']:6.2f}")
    # stages 0-6 of these profiles hold identical layers; the last stage adds the output layer
    t = table.assign(stages=table.stage.map(lambda s: "7" if s == 7 else "0-6"))
    by = ["gpu", "fit", "test", "law", "instruction", "stages"] if not detail else \
        ["gpu", "fit", "test", "law", "instruction", "stage"]
    g = t.groupby(by, sort=False).agg(
        time_mape_pct=("time_mape_pct", "mean"), time_max_pct=("time_max_pct", "max"),
        energy_mape_pct=("energy_mape_pct", "mean"), energy_max_pct=("energy_max_pct", "max"))
    click.echo("\nPer instruction (%):")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        click.echo(g.round(2).to_string())
    if windows is not None:
        click.echo(f"\nFitted on the top {top_window:g} MHz of each profile, predicting the "
                   "clocks below (MAPE %; voltage curve kept from the preset or fitted freely):")
        for w in windows:
            click.echo(f"  {w['gpu']:15s} {w['profile']:10s} >= {w['window_from_mhz']:.0f} MHz "
                       f"{w['voltage_curve']:5s} knee {w['knee_mhz']:5.0f} Vr {w['v_ratio']:.3f}"
                       f"  time {w['time_mape_pct']:6.2f}  energy {w['energy_mape_pct']:6.2f}")
    if carried is not None:
        click.echo("\nThe voltage curve carried from the other GPU, the rest fitted on one model "
                   "and the other predicted (hold-out MAPE %, relative to the top clock):")
        for c in carried:
            click.echo(f"  {c['gpu']:15s} {c['rule']:13s} from {c['curve_from']:15s} "
                       f"knee {c['knee_mhz']:5.0f} Vr {c['v_ratio']:.3f} "
                       f"{c['fit'] + ' -> ' + c['test']:20s} time {c['hold_time_mape_pct']:5.2f}  "
                       f"energy {c['hold_energy_mape_pct']:5.2f}")
    if plot:
        _plot(frames, plot)


def _write_record(path: str, report: list[dict]) -> None:
    """Merge the fits and hold-outs into the JSON file ``path`` as its ``power-curves`` entry
    (with the date and the command); the file's other entries are kept."""
    import datetime

    from kareus.atomic import merge_json_record

    merge_json_record(path, {"power-curves": {
        "date": datetime.date.today().isoformat(),
        "command": f"python benchmarks/calibration.py --write {path}", "rows": report}})
    click.echo(f"(wrote power-curves to {path})", err=True)


def _plot(df: pd.DataFrame, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    df = df[df.stage.isin([0, 7])]
    df = df.assign(energy_meas=df.energy / df.energy_ref, energy_pred=df.energy_pred / df.energy_ref,
                   time_meas=df.time / df.time_ref, time_pred=df.time_pred / df.time_ref,
                   series=df.instruction + " s" + df.stage.astype(str))
    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(2, 4, figsize=(17, 8))
    for col, ((gpu, fit, test), d) in enumerate(df.groupby(["gpu", "fit", "test"], sort=False)):
        for row, q in enumerate(("time", "energy")):
            ax = axes[row, col]
            meas = d[d.law == "after"]
            sns.scatterplot(data=meas, x="frequency", y=f"{q}_meas", hue="series", s=10, ax=ax,
                            alpha=0.6, legend=(row == 0 and col == 0))
            for law, style in (("before", ":"), ("after", "-")):
                p = d[d.law == law]
                sns.lineplot(data=p, x="frequency", y=f"{q}_pred", hue="series", ax=ax,
                             legend=False, linewidth=1.4, linestyle=style)
            ax.set_title(f"{gpu}: {fit} -> {test}", fontsize=9)
            ax.set_xlabel("SM clock (MHz)")
            ax.set_ylabel(f"{q} / {q} at top clock")
    fig.suptitle("Hold-out: dots measured, lines predicted (dotted: before, solid: after)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "calibration.py"))
