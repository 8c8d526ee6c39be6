"""``kareus calibrate`` (a preset's curves from a profile, a partition sweep or a GPU run) and
``kareus partition`` (a calibrated partition law's predictions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kareus.cli.common import STRICT_OPTION, build_workload, emit, render, warn
from kareus.hardware.presets import fitted_value, get_preset
from kareus.suite.options import comma_list

if TYPE_CHECKING:
    from kareus.hardware.presets import GPUPreset
    from kareus.json_types import JsonObject


def recorded_path(path: str) -> str:
    """``path`` as a preset's source records it, the same from any working directory:
    ``shared/...`` inside the shared measurement folder, else absolute."""
    from kareus.suite.datasets import shared_dir

    full, shared = Path(path).resolve(), shared_dir()
    if shared is not None and full.is_relative_to(shared.resolve()):
        return f"shared/{full.relative_to(shared.resolve()).as_posix()}"
    return str(full)


@click.command()
@click.option("--profile", "profile_path", default=None, type=click.Path(dir_okay=False),
              help="Zeus-format CSV: stage,instruction,frequency,time,energy.")
@click.option("--partition-sweep", "sweep_path", default=None, type=click.Path(dir_okay=False),
              help="Measured partition sweep (the Kareus artifact's format); needs --spec, --out.")
@click.option("--spec", "spec_path", default=None, type=click.Path(dir_okay=False),
              help="--partition-sweep: the partition's spec.json.")
@click.option("--gpu", required=True, help="Preset whose curves are fitted.")
@click.option("--static-power", type=float, default=None,
              help="Static (blocked-on-P2P) power of the measured GPUs, W [preset's].")
@click.option("--power-limit", type=float, default=None,
              help="Power limit of the measured GPUs, W [preset's].")
@click.option("--gpu-measure", is_flag=True,
              help="Measure a profile on this machine's GPU first (GPU backend), then fit.")
@click.option("--workload", "-w", default="qwen3-1.7b", show_default=True,
              help="--gpu-measure: workload to profile (a name, or a Hugging Face config.json "
                   "or its folder).")
@STRICT_OPTION
@click.option("--layers", type=int, default=None, help="--gpu-measure: layers to run per stage.")
@click.option("--tp", type=int, default=None, help="--gpu-measure: tensor-parallel degree.")
@click.option("--pp", type=int, default=None, help="--gpu-measure: pipeline stages.")
@click.option("--dp", type=int, default=None, help="--gpu-measure: data-parallel replicas.")
@click.option("--mbs", type=int, default=None, help="--gpu-measure: micro-batch size.")
@click.option("--seq", type=int, default=None, help="--gpu-measure: sequence length (tokens).")
@click.option("--microbatches", type=int, default=None,
              help="--gpu-measure: microbatches per iteration.")
@click.option("--clocks", default=None, help="--gpu-measure: comma-separated clocks, MHz.")
@click.option("--out", "out_path", default=None,
              help="--gpu-measure: output folder [results/calibration]; --partition-sweep: the "
                   "calibration JSON to write.")
@click.option("--partitions/--no-partitions", default=False,
              help="--gpu-measure: also profile partition configurations.")
@click.option("--figure", "figure_path", default=None, type=click.Path(dir_okay=False),
              help="--partition-sweep: also plot measured against predicted time (PNG).")
@click.option("--allow-clock-control", is_flag=True,
              help="--gpu-measure: lock each clock (admin rights; restored on exit).")
@click.option("--write-preset", is_flag=True,
              help="--profile, --partition-sweep: also write the fitted values, with their "
                   "source, into the GPU's preset file (kareus/hardware/gpus/GPU.json or "
                   "$KAREUS_GPU_DIR's) and print the diff.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def calibrate(profile_path: str | None, sweep_path: str | None, spec_path: str | None, gpu: str,
              static_power: float | None, power_limit: float | None, gpu_measure: bool,
              workload: str, layers: int | None, tp: int | None, pp: int | None,
              dp: int | None, mbs: int | None, seq: int | None, microbatches: int | None,
              clocks: str | None, out_path: str | None,
              partitions: bool, figure_path: str | None, allow_clock_control: bool,
              write_preset: bool, strict: bool, as_json: bool) -> None:
    """Fit a preset's clock->time and clock->power curves to a measured profile (or measure one
    on this machine's GPU with --gpu-measure), or fit the partition law to a measured partition
    sweep (--partition-sweep)."""
    from kareus.errors import InputError
    from kareus.hardware.profile import power_problem

    for label, v in (("--static-power", static_power), ("--power-limit", power_limit)):
        why = None if v is None else power_problem(label, v)
        if why:
            raise InputError(why)
    modes = [m for m, on in (("--profile", profile_path), ("--partition-sweep", sweep_path),
                             ("--gpu-measure", gpu_measure)) if on]
    if len(modes) > 1:
        raise InputError(f"give one of --profile, --partition-sweep, --gpu-measure, not "
                         f"{' and '.join(modes)}")
    preset = get_preset(gpu)
    if static_power is not None:
        preset = preset.with_overrides(static_power_w=static_power)
    if power_limit is not None:
        preset = preset.with_overrides(power_limit_w=power_limit)
    from kareus.hardware.presets import physical_problem

    why = physical_problem(preset)
    if why:
        raise InputError(f"{preset.name} with --static-power / --power-limit: {why}")
    if write_preset and not (sweep_path or profile_path):
        raise InputError("--write-preset applies to --profile and --partition-sweep only")
    mode = modes[0] if modes else None
    for name, applies in _CALIBRATE_OPTION_MODES.items():
        if mode is not None and mode not in applies and _given(name):
            raise InputError(f"{_flag(name)} applies to {' and '.join(applies)} only, not {mode}")
    if write_preset:
        from kareus.atomic import check_writable_dir
        from kareus.hardware.presets import SHARED_FILE, preset_path

        for folder in {preset_path(preset.name).parent, SHARED_FILE.parent}:
            check_writable_dir(folder, "--write-preset's preset folder")
    if sweep_path is not None:
        _calibrate_partition(sweep_path, spec_path, preset, out_path, figure_path, as_json,
                             write_preset)
        return
    layout = {k: v for k, v in (("tp", tp), ("pp", pp), ("dp", dp), ("mbs", mbs), ("seq", seq),
                                 ("microbatches", microbatches)) if v is not None}
    if gpu_measure:
        from kareus.atomic import check_writable_dir

        out_dir = "results/calibration" if out_path is None else out_path
        out_dir = str(check_writable_dir(out_dir, "--out"))
        report = _gpu_measure(preset, workload, layers, clocks, out_dir, partitions,
                              allow_clock_control, static_power, strict, layout)
        emit(report, as_json, lambda: json.dumps(report, indent=2))
        return
    if profile_path is None:
        raise InputError("give --profile CSV, --partition-sweep CSV, or --gpu-measure")
    _calibrate_profile(profile_path, gpu, preset, static_power, power_limit, as_json,
                       write_preset)


#: The largest fit error (time or energy MAPE, %) ``kareus calibrate --profile --write-preset``
#: writes into a preset; the published profiles fit within 3 %.
MAX_WRITTEN_FIT_MAPE_PCT = 10.0


def _calibrate_profile(profile_path: str, gpu: str, preset: GPUPreset,
                       static_power: float | None, power_limit: float | None, as_json: bool,
                       write_preset: bool) -> None:
    """``kareus calibrate --profile``: fit the clock -> time and clock -> power curves of
    ``gpu`` (``preset`` is it with the command's overrides) to a Zeus-format profile; report the
    fit, and with ``write_preset`` write it into the preset file."""
    from dataclasses import asdict

    from kareus.hardware.calibration import FITTED_FIELDS, MIN_CLOCKS_BELOW_KNEE
    from kareus.hardware.calibration import calibrate as fit
    from kareus.hardware.profile import load_profile

    df = load_profile(profile_path)
    res = fit(df, get_preset(gpu), static_power_w=static_power, power_limit_w=power_limit)
    fitted = res.fitted_preset(get_preset(gpu))
    obj = {
        "gpu": preset.name, "profile": profile_path, "rows": res.points,
        "static_power_w": res.static_power_w, "power_limit_w": res.power_limit_w,
        "fit": {**asdict(res.law), "sm_dyn_power_w": res.sm_dyn_power_w,
                "hbm_dyn_power_w": res.hbm_dyn_power_w,
                "kept_from_preset": list(res.kept_from_preset)},
        "error": {"time_mape_pct": res.time_mape_pct, "energy_mape_pct": res.energy_mape_pct},
        "fitted_preset": {k: fitted.__dict__[k] for k in
                          ("sm_dyn_power_w", "hbm_dyn_power_w", "knee_mhz", "v_ratio")},
    }
    if write_preset:
        worst = max(res.time_mape_pct, res.energy_mape_pct)
        if not (res.time_mape_pct <= MAX_WRITTEN_FIT_MAPE_PCT
                and res.energy_mape_pct <= MAX_WRITTEN_FIT_MAPE_PCT):  # a NaN is no fit either
            from kareus.errors import InputError

            raise InputError(f"--write-preset: the fit misses {profile_path} by {worst:.1f} % "
                             f"(time {res.time_mape_pct:.1f} %, energy "
                             f"{res.energy_mape_pct:.1f} % MAPE; at most "
                             f"{MAX_WRITTEN_FIT_MAPE_PCT:g} % is written): the profile does not "
                             "follow a GPU's clock law (check its columns and units)")
        source = f"fitted: `kareus calibrate --profile {recorded_path(profile_path)}`"
        written = {"sm_dyn_power_w": round(fitted.sm_dyn_power_w, 1),
                   "knee_mhz": round(fitted.knee_mhz, 1), "v_ratio": fitted_value(fitted.v_ratio)}
        changes = {k: (written[k], source) for k in FITTED_FIELDS}
        # what the profile could not identify keeps the preset's value and source
        obj.update(_write_fit(gpu, {k: v for k, v in changes.items()
                                    if k not in res.kept_from_preset}))

    def text() -> str:
        law = res.law
        return "\n".join([
            f"{preset.name}: fitted {res.points} rows of {profile_path}",
            f"  knee {law.knee_mhz:.0f} MHz, V(max)/V(knee) {law.v_ratio:.3f}, "
            f"clock-insensitive share {law.insensitive_share:.3f}",
            f"  SM dynamic power at max clock {res.sm_dyn_power_w:.1f} W "
            f"(HBM {res.hbm_dyn_power_w:.1f} W, static {res.static_power_w:.2f} W, "
            f"cap {res.power_limit_w:.0f} W)",
            f"  fit error: time MAPE {res.time_mape_pct:.2f} %, energy MAPE "
            f"{res.energy_mape_pct:.2f} %",
        ] + ([f"  kept from the preset, not fitted: {', '.join(res.kept_from_preset)} (fewer "
              f"than {MIN_CLOCKS_BELOW_KNEE} of the profile's clocks lie below the knee, "
              f"{preset.knee_mhz:.0f} MHz)"] if res.kept_from_preset else [])
            + _preset_diff_lines(obj))

    top = float(df["frequency"].max())
    if top != preset.clock_max_mhz:  # a profile tops out at its card's own top clock
        click.echo(f"warning: {profile_path}'s clocks reach {top:.0f} MHz, {preset.name}'s top "
                   f"clock is {preset.clock_max_mhz:.0f} MHz: is it this GPU's profile?",
                   err=True)
    emit(obj, as_json, text)


#: ``kareus calibrate``'s options that only one or two of its modes read (a click parameter name:
#: those modes); given with another mode they are refused, not silently dropped.
_CALIBRATE_OPTION_MODES: dict[str, tuple[str, ...]] = {
    "spec_path": ("--partition-sweep",),
    "figure_path": ("--partition-sweep",),
    "out_path": ("--gpu-measure", "--partition-sweep"),
    **{name: ("--gpu-measure",) for name in (
        "workload", "layers", "tp", "pp", "dp", "mbs", "seq", "microbatches", "clocks",
        "partitions", "allow_clock_control", "strict")},
}


def _flag(name: str) -> str:
    """The running command's long option for its parameter ``name`` (``out_path`` -> ``--out``,
    ``partitions`` -> ``--partitions/--no-partitions``)."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == name)
    return "/".join(max(opts, key=len) for opts in (param.opts, param.secondary_opts) if opts)


def _given(name: str) -> bool:
    """Whether the running command's parameter ``name`` was given (command line or environment),
    not left at its default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _write_fit(gpu: str, changes: dict[str, tuple[float, str]],
               op_factors: dict | None = None) -> dict[str, str]:
    """``--write-preset``: write fitted values into the GPU's preset file; the file and the diff
    (``preset_file``, ``preset_diff``) for the command's output."""
    from kareus.hardware.presets import preset_path, update_preset_file

    path = preset_path(gpu)
    diff = update_preset_file(gpu, changes, op_factors=op_factors, path=path)
    return {"preset_file": str(path), "preset_diff": diff}


def _preset_diff_lines(obj: dict) -> list[str]:
    if "preset_file" not in obj:
        return []
    if not obj["preset_diff"]:
        return [f"  preset file {obj['preset_file']} unchanged"]
    return [f"  written to {obj['preset_file']}:", obj["preset_diff"].rstrip("\n")]


def _load_spec(spec_path: str | None, option: str):  # noqa: ANN202
    from kareus.errors import InputError
    from workloads.partition_spec import PartitionSpec

    if spec_path is None:
        raise InputError(f"{option} needs --spec SPEC (the partition's spec.json)")
    return PartitionSpec.load(spec_path)


def _calibrate_partition(sweep_path: str, spec_path: str | None, preset: GPUPreset,
                         out_path: str | None, figure_path: str | None, as_json: bool,
                         write_preset: bool = False) -> None:
    """``kareus calibrate --partition-sweep``: fit, report, write the calibration atomically."""
    from kareus.atomic import atomic_write_text
    from kareus.backends.partition_calibration import fit_partition
    from kareus.errors import InputError
    from kareus.hardware.partition_sweep import load_sweep

    spec = _load_spec(spec_path, "--partition-sweep")
    if out_path is None:
        raise InputError("--partition-sweep needs --out CALIB.json (where the fit is written)")
    from kareus.atomic import check_writable_file

    read = {"--partition-sweep": sweep_path, "--spec": spec_path}
    out_path = str(check_writable_file(out_path, "--out", read))
    if figure_path is not None:
        figure_path = str(check_writable_file(figure_path, "--figure", {**read, "--out": out_path}))
    if figure_path is not None:
        from kareus.suite.report import check_figure_path

        check_figure_path(figure_path, "--figure")
    part = spec.partition()
    sweep = load_sweep(sweep_path, len(part.compute), preset.comm_max_sms,
                       op_names=[op.name for op in part.compute])
    from kareus.suite.progress import terminal_progress

    with terminal_progress(not as_json) as progress:
        cal = fit_partition(part, sweep, preset, spec.sha256, progress=progress)
    fit_lines = cal.fit.lines() if cal.fit is not None else []
    obj = {**cal.to_dict(), "sweep": sweep_path, "spec": spec_path, "out": out_path}
    atomic_write_text(Path(out_path), json.dumps(cal.to_dict(), indent=2) + "\n")
    if write_preset:
        from kareus.hardware.presets import PartitionOpFactors, fitted_value

        source = (f"fitted: `kareus calibrate --partition-sweep {sweep_path} --spec {spec_path}` "
                  f"({preset.name}, {'default clock' if cal.clock_mhz is None else f'{cal.clock_mhz:.0f} MHz'})")
        obj.update(_write_fit(preset.name, {k: (fitted_value(v), source)
                                            for k, v in cal.law.items()},
                              {spec.sha256: PartitionOpFactors(
                                  tuple(fitted_value(v) for v in cal.op_work),
                                  tuple(fitted_value(v) for v in cal.op_host), source)}))
    if figure_path is not None:
        import numpy as np
        import pandas as pd

        from kareus.backends.partition_calibration import predict
        from kareus.frontier import mape_pct
        from kareus.suite.report import plot_partition_fit

        t, _ = predict(part, sweep.configs, cal.apply(preset), cal.clock_mhz,
                       np.array(cal.op_work), np.array(cal.op_host))
        c = sweep.configs
        frame = pd.DataFrame({"overlap_start": c.start, "overlap_end": c.end,
                              "comm_sm_number": c.sms, "comm_block_size": c.threads,
                              "measured_s": sweep.time_s, "predicted_s": t})
        plot_partition_fit(frame, Path(figure_path),
                           f"{Path(sweep_path).name} on {preset.name}: time MAPE "
                           f"{mape_pct(sweep.time_s, t):.2f} %")
        obj["figure"] = figure_path

    def text() -> str:
        return "\n".join([
            f"{preset.name}: partition law fitted to {len(sweep.configs)} configurations of "
            f"{sweep_path} (mean of {sweep.repeats} repeats); written to {out_path}",
            *("  " + line for line in fit_lines),
            "  law: " + ", ".join(f"{k}={v:.4g}" for k, v in cal.law.items()),
        ] + _preset_diff_lines(obj))

    emit(obj, as_json, text)


@click.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False),
              help="The partition's spec.json.")
@click.option("--configs", "configs_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with overlap_start, overlap_end, comm_sm_number, comm_block_size; "
                   "the window counts ops from 0 as the fuser runs them (a linear's bias is an "
                   "op of its own).")
@click.option("--clock", type=float, default=None,
              help="Locked SM clock, MHz [the default, unlocked clock].")
@click.option("--calibration", "calibration_path", default=None,
              type=click.Path(dir_okay=False),
              help="A fit from `kareus calibrate --partition-sweep` [the preset's parameters].")
@click.option("--gpu", required=True,
              help="GPU preset (`kareus gpus`; your own files in $KAREUS_GPU_DIR).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def partition(spec_path: str, configs_path: str, clock: float | None,
              calibration_path: str | None, gpu: str, as_json: bool) -> None:
    """Predict the time and energy of a spec partition's configurations."""
    import numpy as np

    from kareus.backends.partition_calibration import PartitionCalibration, predict
    from kareus.errors import InputError
    from kareus.hardware.partition_sweep import CONFIG_COLUMNS, load_configs
    from kareus.hardware.presets import partition_op_factors

    preset = get_preset(gpu)
    spec = _load_spec(spec_path, "kareus partition")
    part = spec.partition()
    n = len(part.compute)
    if clock is not None and not (np.isfinite(clock) and preset.clock_min_mhz <= clock
                                  <= preset.clock_max_mhz):
        raise InputError(f"--clock {clock} MHz outside {preset.name}'s "
                         f"{preset.clock_min_mhz:.0f}-{preset.clock_max_mhz:.0f} MHz")
    asked = clock
    if clock is not None:  # the clock the prediction runs at: the preset's grid, snapped down
        grid = preset.clock_grid()
        clock = float(grid[max(0, int(np.searchsorted(grid, clock + 1e-6)) - 1)])
    work = host = None
    source = calibration_path
    if calibration_path is not None:
        cal = PartitionCalibration.load(calibration_path, preset.name, spec.sha256, n)
        preset = cal.apply(preset)
        work, host = np.array(cal.op_work), np.array(cal.op_host)
    elif (own := partition_op_factors(preset.name, spec.sha256)) is not None:
        work, host = np.array(own.op_work), np.array(own.op_host)
        source = f"preset (its law and the per-op factors of the fit it came from: {own.source})"
    else:
        source = "preset (its law; counted per-op work, no partition fit for this spec)"
    configs = load_configs(configs_path, n, preset.comm_max_sms,
                           op_names=[op.name for op in part.compute])
    t, e = predict(part, configs, preset, clock, work, host)
    points = [{CONFIG_COLUMNS[0]: int(s), CONFIG_COLUMNS[1]: int(e_), CONFIG_COLUMNS[2]: int(k),
               CONFIG_COLUMNS[3]: int(b), "time_s": float(ti), "energy_j": float(ei)}
              for s, e_, k, b, ti, ei in zip(configs.start, configs.end, configs.sms,
                                              configs.threads, t, e)]
    obj = {"gpu": gpu, "spec": spec_path, "clock_mhz": clock,  # the clock it ran at
           "calibration": calibration_path, "parameters": source, "points": points}

    def text() -> str:
        return render(["start", "end", "SMs", "block", "time ms", "energy J"],
                      ([p["overlap_start"], p["overlap_end"], p["comm_sm_number"],
                        p["comm_block_size"], f"{p['time_s'] * 1e3:.3f}",
                        f"{p['energy_j']:.4f}"] for p in points),
                      title=f"{len(points)} configurations of {spec_path} on {gpu} at "
                            f"{'the default clock' if clock is None else f'{clock:.0f} MHz'}"
                            + ("" if asked == clock else
                               f" ({asked:g} MHz, snapped down to the preset's "
                               f"{preset.clock_step_mhz:g} MHz grid)"))

    emit(obj, as_json, text)


def _gpu_measure(preset: GPUPreset, workload: str, layers: int | None, clocks: str | None,
                 out_dir: str, partitions: bool, allow: bool, static_power: float | None,
                 strict: bool = False, layout: dict[str, int] | None = None) -> JsonObject:
    """``kareus calibrate --gpu-measure``: profile on the GPU backend, fit, report the error.
    ``layout``: the job's parallelism and shape (``tp``, ``pp``, ``dp``, ``mbs``, ``seq``,
    ``microbatches``; the workload's defaults otherwise, e.g. TP 8)."""
    from kareus.errors import InputError

    clock_list: list[float] | None = None
    if clocks:
        items = comma_list(clocks, "--clocks")
        try:
            clock_list = [float(c) for c in items]
        except ValueError:
            raise InputError(f"--clocks must be comma-separated numbers, got {clocks!r}") from None
    if layers is not None and layers < 1:
        raise InputError(f"--layers must be a positive integer, got {layers}")
    from kareus.backends.gpu import GPUBackend
    from kareus.backends.gpu.calibrate import gpu_measure
    from kareus.backends.gpu.measure import MeasureConfig
    from kareus.backends.gpu.serialize import reduced_workload

    layout = layout or {}
    w = reduced_workload(workload, layers, **layout) if layers else \
        build_workload(workload, **layout)
    warn(w.job_warnings(preset.memory_bytes, strict))
    backend = GPUBackend.create(preset, allow_clock_control=allow, static_power_w=static_power,
                                measure=MeasureConfig(window_s=5, cooldown_s=5),
                                hint="or fit a profile measured on a GPU machine with "
                                     "`kareus calibrate --profile CSV`")
    return gpu_measure(backend, w, out_dir, clocks_mhz=clock_list, nanobatched=False, ops=True,
                       partitions=partitions)
