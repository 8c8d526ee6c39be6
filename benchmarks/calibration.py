"""Calibration fidelity: fit each GPU's clock laws on the GPT-3 175B profile, predict the Bloom
176B profile's per-clock time and energy relative to its 1410 MHz point, report MAPE.

    python benchmarks/calibration.py [--plot calibration.png] [--json]

Data: shared/perseus_sosp24/stage_profile (Perseus SOSP '24 artifact; A100 SXM4 80 GB 500 W and
A40 300 W measurements). The A100 fit is what the a100-sxm4-* presets carry; the 40 GB 400 W part
shares the die and V-f curve and differs in HBM power, static power (85 W, published) and cap.
"""

from __future__ import annotations

import json
import sys

import click

from kareus.hardware.calibration import calibrate, predict_relative
from kareus.hardware.presets import get_preset
from kareus.hardware.profile import load_profile
from kareus.suite.datasets import perseus_profile

CASES = [("a100-sxm4-80gb", "a100_sxm"), ("a40", "a40")]


@click.command()
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG.")
@click.option("--json", "as_json", is_flag=True)
def main(plot: str | None, as_json: bool) -> None:
    report, frames = [], []
    for gpu, tag in CASES:
        fit_path = perseus_profile(f"gpt3-175b+{tag}_bf16.csv")
        test_path = perseus_profile(f"bloom+{tag}_bf16.csv")
        if fit_path is None or test_path is None:
            sys.exit("shared/perseus_sosp24 not found; set KAREUS_SHARED_DIR")
        preset = get_preset(gpu)
        res = calibrate(load_profile(fit_path), preset)
        rows, tr = predict_relative(res, preset, load_profile(test_path), 1410)
        frames.append(rows.assign(gpu=gpu))
        report.append({
            "gpu": gpu, "knee_mhz": res.law.knee_mhz, "v_ratio": res.law.v_ratio,
            "insensitive_share": res.law.insensitive_share, "sm_dyn_power_w": res.sm_dyn_power_w,
            "fit_time_mape_pct": res.time_mape_pct, "fit_energy_mape_pct": res.energy_mape_pct,
            "bloom_time_mape_pct": tr.time_mape_pct, "bloom_energy_mape_pct": tr.energy_mape_pct,
            "bloom_points": tr.points,
        })
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(f"{'gpu':16s} {'knee':>6s} {'Vratio':>6s} {'m':>5s} {'P_sm W':>7s} "
                   f"{'fit T%':>6s} {'fit E%':>6s} {'Bloom T%':>8s} {'Bloom E%':>8s}")
        for r in report:
            click.echo(f"{r['gpu']:16s} {r['knee_mhz']:6.0f} {r['v_ratio']:6.3f} "
                       f"{r['insensitive_share']:5.3f} {r['sm_dyn_power_w']:7.1f} "
                       f"{r['fit_time_mape_pct']:6.2f} {r['fit_energy_mape_pct']:6.2f} "
                       f"{r['bloom_time_mape_pct']:8.2f} {r['bloom_energy_mape_pct']:8.2f}")
    if plot:
        _plot(frames, plot)


def _plot(frames, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    df = pd.concat(frames)
    df = df.assign(
        time_meas=df.time / df.time_ref, time_pred=df.time_pred / df.time_ref,
        energy_meas=df.energy / df.energy_ref, energy_pred=df.energy_pred / df.energy_ref,
        stage_ins=df.stage.astype(str) + " " + df.instruction,
    )
    sns.set_theme(style="whitegrid")
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex="col")
    for col, gpu in enumerate(df.gpu.unique()):
        d = df[df.gpu == gpu]
        for row, q in enumerate(("time", "energy")):
            ax = axes[row, col]
            sns.scatterplot(data=d, x="frequency", y=f"{q}_meas", hue="instruction", s=12,
                            ax=ax, alpha=0.6, legend=(row == 0 and col == 0))
            mean = d.groupby(["instruction", "frequency"])[f"{q}_pred"].mean().reset_index()
            sns.lineplot(data=mean, x="frequency", y=f"{q}_pred", hue="instruction", ax=ax,
                         legend=False, linewidth=2)
            ax.set_title(f"{gpu}: Bloom {q} / {q} at 1410 MHz (dots measured, lines predicted)",
                         fontsize=9)
            ax.set_xlabel("SM clock (MHz)")
            ax.set_ylabel(f"relative {q}")
    fig.suptitle("Clock laws fitted on GPT-3 175B, predicting Bloom 176B (Perseus profiles)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
