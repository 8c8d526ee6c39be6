"""The reproduce command: every registered optimizer on a workload (or a suite), tables and
figures. One implementation behind both faces, ``python reproduce.py`` and ``kareus reproduce``:

    python reproduce.py --workload gpt3-xl          # = kareus reproduce --workload gpt3-xl
    python reproduce.py --workload llama3.2-3b --tp 4 --cp 2 --optimizers megatron,perseus
    python reproduce.py --workload path/to/config.json     # any dense decoder ('.[hf]' extra)
    python reproduce.py --suite paper [--gpu h100-sxm]      # the paper's configurations
    python reproduce.py --suite static-sweep | scale        # what-if studies

A single workload writes results/<workload>/ (for a config.json, the derived model's name; see
workloads/hf_config.py) (summary.json, frontiers.csv, comparison.md,
frontiers.png, energy_breakdown.png). A suite writes results/<suite>[-<gpu>]/ with one such folder
per configuration plus the cross-configuration tables and figures. The default folder is
``results/`` of the source checkout (beside ``reproduce.py``), else of the working directory.

A finished cell (one optimizer on one configuration) is reused on a rerun only when the code
that made it is unchanged: its key holds content hashes of the optimizer's module (plugins
included), the backend (the simulator) and the harness, with the preset and the settings
(:mod:`kareus.suite.provenance`); the run says how many cells it reuses, who made them, and why
it computes the others. ``--force`` recomputes the named optimizers. ``--optimizers a,b`` runs
those and adds them to the folder: its summary, tables and figures cover every optimizer with a
current cell there, so a subset run never replaces a full one (use a fresh ``--out`` to see the
subset alone). ``--strict`` refuses a configuration whose estimated
memory exceeds the GPU's (otherwise a warning). Exit status 0 on success, 2 on bad input (an
``--out`` folder that cannot be written is refused before any work; every optimizer refusing the
job, e.g. nanobatched ones on an odd micro-batch), 1 on internal failure and
when every optimizer failed (nothing came out; the failures are still written), 130 / 143 when
stopped by Ctrl-C / SIGTERM (finished cells are kept).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kareus.atomic import check_writable_dir
from kareus.errors import AllOptimizersFailed, InputError, JobRefused
from kareus.hardware.presets import DEFAULT_GPU
from kareus.suite.options import SET_OPTION, WORKLOAD_HELP, job_shape_options
from kareus.suite.console import make_console
from kareus.suite.sweep import run_configs, run_suite

if TYPE_CHECKING:
    from kareus.hardware.presets import GPUPreset
    from workloads import Workload

#: The source checkout (holding ``reproduce.py``), when this module runs from one.
CHECKOUT = Path(__file__).resolve().parents[1]


def default_results_root() -> Path:
    """``results/`` of the source checkout, or of the working directory for an installed copy."""
    return (CHECKOUT if (CHECKOUT / "reproduce.py").is_file() else Path.cwd()) / "results"


def _resolve_optimizers(optimizers: str | None) -> list[str]:
    from kareus.plugins import optimizer_names
    from kareus.suite.options import comma_list

    registered = optimizer_names()
    if optimizers is None:
        return registered
    # each name once, in the order given
    names = list(dict.fromkeys(comma_list(optimizers, "--optimizers")))
    unknown = [n for n in names if n not in registered]
    if unknown:
        raise InputError(f"unknown optimizer(s) {', '.join(unknown)}; "
                         f"registered: {', '.join(registered)}")
    return names


def _print_tables(summary: dict) -> None:
    from kareus.suite import report
    from kareus.suite.tables import frame_table

    console = make_console()
    for title, frame in (("Max-throughput plan vs Megatron-LM (positive = reduction)",
                          report.max_throughput_table(summary)),
                         ("Frontier vs Perseus", report.frontier_table(summary))):
        console.print(frame_table(frame, title, left=("optimizer", "status")))
    console.print(report.NA_NOTE[0].upper() + report.NA_NOTE[1:] + ".", highlight=False)
    for name, obj in summary["optimizers"].items():
        if obj["status"] != "ok":
            what = "refused the job" if obj.get("refused") else obj["status"]
            console.print(f"[red]{name} {what}:[/red] {obj['error']}")


@click.command("reproduce", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workload", "-w", default=None,
              help=WORKLOAD_HELP)
@click.option("--suite", default=None,
              help="A predefined suite instead of a workload: paper (the paper's "
                   "configurations), static-sweep or scale (what-if studies, docs/results.md), "
                   "smoke (two small configurations, seconds).")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True,
              help="GPU preset (`kareus gpus`; your own files in $KAREUS_GPU_DIR).")
@click.option("--backend", default="sim", show_default=True, metavar="[sim|gpu]",
              help="Where plans run: the simulator, or this machine's GPUs.")
@click.option("--optimizers", default=None, help="Comma-separated optimizer names [all].")
@click.option("--out", default=None,
              help="Output folder [results/<workload or suite>, beside reproduce.py in a source "
                   "checkout, else in the current folder].")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Random seed of the optimizers' searches (Kareus's nsga2 and surrogate).")
@click.option("--force", is_flag=True, help="Recompute cells that already finished.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Cells to run in parallel (local process pool, or Ray CPUs).")
@click.option("--executor", default="local", show_default=True, metavar="[local|ray]",
              help="Where cells run: processes on this machine, or a Ray cluster.")
@SET_OPTION
@click.option("--allow-clock-control", is_flag=True,
              help="GPU backend: lock SM clocks per instruction (needs admin rights; restored "
                   "on exit). Without it, plans run at the card's current clocks.")
@job_shape_options
@click.option("--strict", is_flag=True,
              help="Refuse (exit 2) a layout whose estimated memory exceeds the GPU's, instead "
                   "of warning.")
def command(workload: str | None, suite: str | None, gpu: str, backend: str,
            optimizers: str | None, out: str | None, seed: int, force: bool, jobs: int,
            executor: str, settings: tuple[str, ...], allow_clock_control: bool, strict: bool,
            **overrides: int | None) -> None:
    """Run every registered optimizer on a workload (or a suite) and print the comparison
    tables. SIGTERM stops it like Ctrl-C: finished cells are kept (exit 143; 130 for Ctrl-C)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm) if main_thread else None
    try:
        _reproduce(workload, suite, gpu, backend, optimizers, out, seed, force, jobs, executor,
                   allow_clock_control, strict, overrides, settings)
    except KeyboardInterrupt as e:
        click.echo("interrupted: finished cells are kept; rerun the same command to resume",
                   err=True)
        raise click.exceptions.Exit(143 if "SIGTERM" in str(e) else 130) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _reproduce(workload: str | None, suite: str | None, gpu: str, backend: str,
               optimizers: str | None, out: str | None, seed: int, force: bool, jobs: int,
               executor: str, allow_clock_control: bool, strict: bool,
               overrides: dict[str, int | None], settings: tuple[str, ...] = ()) -> None:
    from kareus.backends import make_backend
    from kareus.hardware.presets import get_preset
    from kareus.plugins import ignored_settings, own_settings
    from kareus.suite.executors import check_settings
    from kareus.suite.options import parse_settings
    from kareus.suite.store import hold_run_folder
    from kareus.suite.suites import get_suite
    from workloads import make_workload, workload_ref

    backend_options = {"allow_clock_control": True} if allow_clock_control else {}
    make_backend(backend, get_preset(gpu), **backend_options)  # validate before any work
    names = _resolve_optimizers(optimizers)
    check_settings(executor, jobs)
    options = parse_settings(settings, names)
    for name in names:  # every optimizer's settings, checked before any work; a plugin that
        own_settings(name, options)  # cannot be loaded fails alone, in its cells
        for key in ignored_settings(name, options):
            click.echo(f"warning: --set {key}: {name} does not use it with the other settings "
                       "given", err=True)
    if suite is not None:
        if workload is not None or any(v is not None for v in overrides.values()):
            raise InputError("--suite runs fixed configurations; drop --workload and the "
                             "parallelism overrides")
        default = default_results_root() / (suite if gpu == DEFAULT_GPU else f"{suite}-{gpu}")
        target = check_writable_dir(out, "--out") if out is not None else default
        _refuse_another_run_s_folder(target, suite, gpu, backend)
        for cfg in get_suite(suite):
            preset = get_preset(cfg.gpu or gpu)
            _check_job(make_workload(cfg.workload, **cfg.overrides),
                          preset.with_overrides(**cfg.gpu_overrides)
                          if cfg.gpu_overrides else preset, strict)
        with hold_run_folder(target):
            _refuse_another_run_s_folder(target, suite, gpu, backend)  # held: one finished since?
            run_suite(suite, gpu, backend, names, seed, target, force, jobs, executor,
                      backend_options, options)
        _fail_if_all_failed(_load_summaries(target, [c.label for c in get_suite(suite)]), target)
        return
    if workload is None:
        from kareus.suite.suites import SUITES

        raise InputError("give --workload NAME (see `kareus workloads`) or --suite "
                         f"{'|'.join(SUITES)}")
    from kareus.suite.suites import SuiteConfig

    ref = workload_ref(workload)  # a config path, absolute: cells rebuild it in any process
    clean = {k: v for k, v in overrides.items() if v is not None}
    w = make_workload(ref, **clean)  # validate before any work
    _refuse_if_none_can_plan(w, names)
    out_dir = (check_writable_dir(out, "--out") if out is not None
               else default_results_root() / w.name)
    _refuse_another_run_s_folder(out_dir, None, gpu, backend, w.name)
    _check_job(w, get_preset(gpu), strict)
    t0 = time.perf_counter()
    cfg = SuiteConfig(label=out_dir.name, workload=ref, overrides=clean)
    with hold_run_folder(out_dir):
        _refuse_another_run_s_folder(out_dir, None, gpu, backend, w.name)  # held: one finished?
        summary = run_configs([cfg], out_dir.parent, gpu, backend, names, seed, force=force,
                              jobs=jobs, executor=executor,
                              backend_options=backend_options, options=options)[cfg.label]
    _print_tables(summary)
    make_console().print(get_preset(gpu).provenance(), highlight=False)
    make_console().print(f"Results in {out_dir} ({time.perf_counter() - t0:.1f} s)")
    _fail_if_all_failed({cfg.label: summary}, out_dir)


def _refuse_another_run_s_folder(folder: Path, suite: str | None, gpu: str,
                                 backend: str, workload: str | None = None) -> None:
    """Refuse (:class:`InputError`) to write a run into ``folder`` when it holds results this run
    would mix with and partly replace: a suite's (its ``metadata.json``) for one workload's run
    (``suite`` None, ``workload`` its model's name), for another suite or for the same suite on
    another GPU preset or backend; one of a suite's configuration folders for one workload's
    run; one workload's results (its ``summary.json``) for a suite or for another workload; a
    ``summary.json`` that holds no run (a record such as ``results/whatif/``). A rerun of the
    same run reuses its cells; one with other settings recomputes those they change."""
    import json

    mine = f"suite {suite!r} on {gpu} ({backend})" if suite else "one workload's run"

    def record(name: str, key: str, what: str) -> dict | None:
        """The JSON object in ``folder / name`` (``None``: no such file); refused unless it
        holds ``key``, as ``what`` does."""
        path = folder / name
        if not path.is_file():
            return None
        try:
            obj = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise InputError(f"{path} cannot be read as JSON; {mine} would write over it: give "
                             f"another --out, or, if it is this run's own, damaged, delete it "
                             f"and rerun (the finished cells are kept)") from None
        if not isinstance(obj, dict) or key not in obj:
            raise InputError(f"{path} holds no {what}; {mine} would write over it: give "
                             f"another --out")
        return obj

    meta = record("metadata.json", "suite", "suite's metadata")
    if meta is not None:
        held = (meta["suite"], meta.get("gpu", gpu), meta.get("backend", backend))
        if held != (suite, gpu, backend):
            raise InputError(f"{folder} holds the results of suite {held[0]!r} on {held[1]} "
                             f"({held[2]}); {mine} would mix with and overwrite them: give "
                             f"another --out")
    if suite is None and (folder.parent / "metadata.json").is_file():
        raise InputError(f"{folder} is a configuration of the suite in {folder.parent}; one "
                         f"workload's run would overwrite it: give another --out")
    summary = record("summary.json", "optimizers", "run's results")
    if summary is not None and suite is not None:
        raise InputError(f"{folder} holds one workload's results; {mine} would mix with and "
                         f"overwrite them: give another --out")
    if summary is not None and summary.get("workload", workload) != workload:
        raise InputError(f"{folder} holds the results of {summary['workload']}; a run of "
                         f"{workload} would mix with and overwrite them: give another --out")


def _load_summaries(root: Path, labels: list[str]) -> dict[str, dict]:
    """The summary.json of each configuration ``label`` under ``root`` that has one."""
    import json

    out = {}
    for label in labels:
        path = root / label / "summary.json"
        if path.is_file():
            out[label] = json.loads(path.read_text())
    return out


def _fail_if_all_failed(summaries: dict[str, dict], where: Path) -> None:
    """Raise :class:`AllOptimizersFailed` (exit status 1) when no optimizer of any
    configuration finished: a run that produced nothing must not exit 0; :class:`JobRefused`
    (exit status 2) when each of them refused its job (the input's fault)."""
    # a suite's configurations by their labels; one workload's run by the workload, not its folder
    statuses = [(label if len(summaries) > 1 else s.get("workload", label), name,
                 obj.get("status"), obj.get("error"))
                for label, s in summaries.items() for name, obj in s["optimizers"].items()]
    if statuses and all(status != "ok" for _, _, status, _ in statuses):
        label, name, _, error = statuses[0]
        first = str(error or "no error recorded").splitlines()[0] if error else "no error recorded"
        if all(obj.get("refused") for s in summaries.values() for obj in s["optimizers"].values()):
            raise JobRefused(f"every optimizer refused the job ({name} on {label}: {first})")
        raise AllOptimizersFailed(
            f"every optimizer failed ({len(statuses)} run{'s' if len(statuses) != 1 else ''}; "
            f"first: {name} on {label}: {first}); "
            f"the failures are recorded in {where}")


def _refuse_if_none_can_plan(w: "Workload", names: list[str]) -> None:
    """Raise :class:`JobRefused` before any work when every optimizer of the run plans only
    nanobatched execution and ``w``'s micro-batch does not split into nanobatches."""
    from kareus.plugins import nanobatched_only

    refusal = w.parallel.nanobatch_refusal
    if refusal and all(nanobatched_only(n) for n in names):
        verb = "plans" if len(names) == 1 else "plan"
        raise JobRefused(f"{', '.join(names)} {verb} only nanobatched execution: {refusal}")


def _check_job(w: "Workload", gpu: "GPUPreset", strict: bool) -> None:
    """Before any work: refuse a precision ``gpu`` cannot run (one line, exit 2); warn on stderr
    when ``w`` does not fit ``gpu``'s memory (refuse it with ``strict``) or has fewer
    microbatches than pipeline stages."""
    from kareus.suite.problem import check_precision

    check_precision(w, gpu)
    for message in w.job_warnings(gpu.memory_bytes, strict):
        click.echo(f"warning: {w.name}: {message}", err=True)


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None, prog_name: str = "reproduce.py") -> int:
    """Run the command with ``argv`` and return the contract's exit status."""
    from kareus.exit_status import run_command

    return run_command(command, argv, prog_name)
