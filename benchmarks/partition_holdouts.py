"""Hold-outs of the partition law along the sweep's other axes (issue 30, item 2).

    python benchmarks/partition_holdouts.py [--only many-sms,few-sms,block-size]

`kareus calibrate --partition-sweep` reports one hold-out: fit on half of the windows, predict
the other half. This script fits the same law (`fit_partition`, the preset's starting point) on
part of the shared sweep along another axis and predicts the rest:

- **many-sms**: fit on 1 to 14 communication SMs, predict 15 to 20 (extrapolating up);
- **few-sms**: fit on 7 to 20 SMs, predict 1 to 6 (extrapolating down, where the collective
  dominates);
- **block-size**: fit on the 1024-thread rows, predict the 512-thread ones. One block size cannot
  identify the collective's dependence on threads per block (``tuned_block_exponent``), so the fit
  keeps the preset's, which the fit on both block sizes chose: predicting with it is not a
  hold-out of the exponent. The honest prior is 1 (the SM path's remote loads in flight grow with
  the threads), and since the exponent does not touch the fitted rows, the held-out rows are
  also predicted with it at 1.

Each prints the fit's and the prediction's time / energy MAPE, the prediction's largest error and
signed mean, and where the law ranks the held-out rows' measured fastest configuration. About a
minute per fit on 2 idle cores, three fits. Needs ``../shared/kareus_artifact``. Units: %.
"""

from __future__ import annotations

import time

import click
import numpy as np
from numpy.typing import NDArray

from kareus.frontier import change_pct, mape_pct
from kareus.hardware.presets import DEFAULT_GPU, get_preset

#: The hold-outs: name -> what is fitted and what predicted.
AXES = {
    "many-sms": "fit on 1-14 SMs, predict 15-20",
    "few-sms": "fit on 7-20 SMs, predict 1-6",
    "block-size": "fit on 1024-thread blocks, predict 512",
}


def fitted_rows(axis: str, sms: NDArray[np.int64], threads: NDArray[np.int64]) -> NDArray[np.bool_]:
    """The sweep rows ``axis`` fits on (the others are predicted)."""
    if axis == "many-sms":
        return sms <= 14
    if axis == "few-sms":
        return sms >= 7
    if axis == "block-size":
        return threads == 1024
    raise click.BadParameter(f"unknown hold-out {axis!r}; choose from {', '.join(AXES)}")


def holdout(axis: str, gpu_name: str = DEFAULT_GPU,
            block_exponents: tuple[float | None, ...] = (None,)) -> list[dict[str, float]] | None:
    """Fit once on the rows ``axis`` keeps and predict the others, once per entry of
    ``block_exponents``: ``tuned_block_exponent`` set to it for the prediction (``None``: the
    fit's; meaningful only where the fitted rows cannot identify it). ``None`` without the shared
    sweep."""
    from kareus.backends.partition_calibration import fit_partition
    from kareus.suite.datasets import artifact_partition_sweep

    gpu = get_preset(gpu_name)
    shared = artifact_partition_sweep(gpu.comm_max_sms)
    if shared is None:
        return None
    spec, part, sweep = shared
    train = fitted_rows(axis, sweep.configs.sms, sweep.configs.threads)
    t0 = time.perf_counter()
    cal = fit_partition(part, sweep.subset(train), gpu, spec.sha256, holdout=False)
    fit_s = time.perf_counter() - t0
    return [_report(cal.apply(gpu) if exponent is None else
                    cal.apply(gpu).with_overrides(tuned_block_exponent=exponent),
                    part, sweep, train, cal, fit_s) for exponent in block_exponents]


def _report(law, part, sweep, train: NDArray[np.bool_], cal, fit_s: float  # noqa: ANN001
            ) -> dict[str, float]:
    """The fit's and the prediction's errors of one law (see :func:`holdout`)."""
    from kareus.backends.partition_calibration import predict

    t, e = predict(part, sweep.configs, law, None, np.array(cal.op_work), np.array(cal.op_host))

    def mape(pred: NDArray, meas: NDArray, rows: NDArray[np.bool_]) -> float:
        return mape_pct(meas[rows], pred[rows])

    test = ~train
    held = np.flatnonzero(test)
    best = held[np.argmin(sweep.time_s[held])]
    err = change_pct(sweep.time_s[test], t[test])
    return {"fit_s": fit_s,
            "fit_time_pct": mape(t, sweep.time_s, train),
            "fit_energy_pct": mape(e, sweep.energy_j, train),
            "time_pct": mape(t, sweep.time_s, test), "energy_pct": mape(e, sweep.energy_j, test),
            "max_pct": float(np.max(np.abs(err))), "signed_pct": float(np.mean(err)),
            "rows": int(test.sum()), "block_exponent": float(law.tuned_block_exponent),
            "best_rank": 1 + int(np.sum(t[held] < t[best]))}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--only", default=",".join(AXES), show_default=True,
              help="Comma-separated hold-outs to run.")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True)
def main(only: str, gpu: str) -> None:
    from kareus.suite.options import comma_list
    from kareus.suite.progress import terminal_progress

    axes = comma_list(only, "--only")
    for axis in axes:  # every name checked before the first fit
        fitted_rows(axis, np.zeros(0, np.int64), np.zeros(0, np.int64))
    with terminal_progress() as progress:
        task = progress.start("hold-outs (a fit each, ~1-2 min)", len(axes))
        for axis in axes:
            # one block size cannot identify the thread exponent: also predict with its prior, 1
            reports = holdout(axis, gpu, (None, 1.0) if axis == "block-size" else (None,))
            task.advance()
            if reports is None:
                click.echo("../shared/kareus_artifact absent: nothing to hold out")
                return
            for r in reports:
                label = AXES[axis] + (f", thread exponent {r['block_exponent']:.3g}"
                                      if axis == "block-size" else "")
                click.echo(f"{axis} ({label}; {r['fit_s']:.0f} s): fit {r['fit_time_pct']:.2f} / "
                           f"{r['fit_energy_pct']:.2f} %, predicted {r['rows']} rows "
                           f"{r['time_pct']:.2f} / {r['energy_pct']:.2f} % (max "
                           f"{r['max_pct']:.2f} %, signed {r['signed_pct']:+.2f} %), their "
                           f"measured fastest ranked {r['best_rank']}")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "partition_holdouts.py"))
