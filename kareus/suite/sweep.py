"""Running a comparison: every (configuration, optimizer) cell, reused from the results store
when it already finished, then each configuration's summary, tables and figures, and for a suite
the cross-configuration tables (``tables.md``) and metadata, with a progress bar on stderr.
``reproduce.py`` is the command line over this module.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kareus.suite.console import make_console

if TYPE_CHECKING:
    from kareus.suite.provenance import CodeHasher


def cell_key(workload: str, gpu: str, backend: str, optimizer: str, seed: int,
             overrides: dict, gpu_overrides: dict, options: dict | None = None,
             model: dict | None = None, hasher: "CodeHasher | None" = None) -> dict:
    """Everything that determines one cell's result. ``model``: the fields of a model read from a
    config file (``workload`` is then its path), so that editing the file invalidates the cell;
    built-in models leave it out (their name determines them). ``preset``: a hash of the GPU
    preset's parameters, so that a recalibrated preset invalidates the cells it computed.
    ``code``: content hashes of the optimizer's, the backend's and the harness's code
    (:mod:`kareus.suite.provenance`; ``hasher`` caches them across the cells of a run)."""
    from kareus import __version__
    from kareus.suite.provenance import CodeHasher, code_fields

    key = {"suite_version": __version__,
           "code": code_fields(hasher or CodeHasher(), optimizer, backend),
           "preset": preset_digest(gpu),
           "workload": workload, "gpu": gpu, "backend": backend,
           "optimizer": optimizer, "options": dict(sorted((options or {}).items())),
           "seed": seed,
           "overrides": {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in sorted(overrides.items()) if v is not None},
           "gpu_overrides": dict(sorted(gpu_overrides.items()))}
    if model is not None:
        key["model"] = model
    return key


def preset_digest(gpu: str) -> str:
    """First 16 hex digits of the SHA-256 of ``gpu``'s preset parameters (their sources left out:
    a reworded source changes no result)."""
    from dataclasses import fields

    from kareus.hardware.presets import get_preset
    from kareus.suite.provenance import json_digest

    preset = get_preset(gpu)
    return json_digest({f.name: getattr(preset, f.name) for f in fields(preset)
                        if f.name != "sources"})


def model_fields(workload: str) -> dict | None:
    """The fields of ``workload``'s model when it comes from a config file (``None``: built-in)."""
    from dataclasses import asdict

    from workloads import MODELS, get_model

    return None if workload in MODELS else asdict(get_model(workload))


def run_configs(configs: list, root: Path, gpu: str, backend: str, names: list[str], seed: int,
                *, force: bool = False, jobs: int = 1, executor: str = "local",
                backend_options: dict | None = None,
                options: Mapping[str, object] | None = None) -> dict[str, dict]:
    """Run (or reuse) every (configuration, optimizer) cell, then write each configuration's
    results; returns the summaries by configuration label.

    ``options``: the optimizers' settings (``--set``); each cell gets, and its key records, the
    ones its optimizer declares, typed (:func:`kareus.plugins.settings_view`), so a setting
    invalidates only the cells of optimizers that have it.

    A stored cell is reused only when its key (:func:`cell_key`, code hashes included) matches;
    the run says how many it reuses, who made them, and why the others are computed. The
    summary of a configuration covers ``names`` and every other optimizer with a current cell in
    its folder, so a run of a few optimizers adds to an earlier full run rather than replacing
    it; cells whose code changed since are left out of the summary (their files stay) and named.
    Interrupted runs (SIGINT/SIGTERM) write summaries of what finished, marking the rest, and
    re-raise."""
    from kareus.suite.store import ResultsStore

    store = ResultsStore(root)
    for cfg in configs:
        store.check_layout(cfg.label, names)
    cells = _plan_cells(configs, store, gpu, backend, names, seed, force=force,
                        backend_options=backend_options, options=options)
    console = make_console(stderr=True)
    for line in reuse_lines(cells.reused, cells.why_computed, cells.left_out,
                            sum(1 for k in cells.records if k[1] not in names)):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    interrupted = _execute_cells(cells.tasks, cells.records, console, executor=executor,
                                 jobs=jobs)
    summaries = {}
    for cfg in configs:
        summaries[cfg.label] = _write_config(cfg, root / cfg.label, gpu, backend,
                                             cells.shown[cfg.label], seed, cells.records, store)
    if interrupted is not None:
        raise interrupted
    return summaries


@dataclass
class _Cells:
    """What a run does with each (configuration, optimizer) cell (:func:`_plan_cells`)."""

    records: dict[tuple[str, str], dict] = field(default_factory=dict)
    """Current records by (configuration, optimizer): reused, and filled as tasks finish."""
    reused: list[dict] = field(default_factory=list)
    """The records reused among the optimizers asked for."""
    why_computed: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> the optimizer of each cell computed for it."""
    left_out: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> ``"configuration: optimizer"`` of each stored cell not in the summaries."""
    shown: dict[str, list[str]] = field(default_factory=dict)
    """Configuration -> the optimizers its summary covers, in the registry's order."""
    tasks: list = field(default_factory=list)
    """The cells to compute (:class:`~kareus.suite.executors.CellTask`)."""


def _plan_cells(configs: list, store, gpu: str, backend: str, names: list[str],  # noqa: ANN001
                seed: int, *, force: bool, backend_options: dict | None,
                options: Mapping[str, object] | None) -> _Cells:
    """Decide, for every cell of ``configs`` (the optimizers ``names`` and every other one with
    a stored cell), whether to reuse its record, compute it (and why) or leave it out of the
    summaries (and why): :func:`run_configs`'s rules."""
    from kareus.errors import InputError
    from kareus.plugins import optimizer_names
    from kareus.suite.executors import CellTask
    from kareus.suite.provenance import CodeHasher, made_by

    hasher = CodeHasher()
    maker = made_by()
    registered = optimizer_names()
    out = _Cells()
    for cfg in configs:
        model = model_fields(cfg.workload)
        others = [n for n in store.optimizers(cfg.label) if n not in names]
        for name in [*names, *others]:
            own = _own_settings(name, options or {}) if name in registered else {}
            unresolved = False
            try:
                key = cell_key(cfg.workload, cfg.gpu or gpu, backend, name, seed, cfg.overrides,
                               cfg.gpu_overrides, own, model=model, hasher=hasher)
            except (InputError, ModuleNotFoundError) as e:  # a plugin not (or no longer) found
                if name not in names:
                    out.left_out.setdefault("optimizer not installed", []).append(
                        f"{cfg.label}: {name}")
                    continue
                # asked for: its cell runs without a code hash and fails alone, saying why
                key = {"optimizer": name, "unresolved": f"{type(e).__name__}: {e}"}
                unresolved = True
            old = store.read(cfg.label, name)
            reasons = (["its code cannot be found"] if unresolved
                       else _why_recompute(old, key, unreadable=store.exists(cfg.label, name)))
            if name not in names:
                if reasons:
                    out.left_out.setdefault(", ".join(reasons), []).append(f"{cfg.label}: {name}")
                else:
                    out.records[(cfg.label, name)] = old
                continue
            if force:
                reasons = ["--force"]
            if not reasons:
                out.records[(cfg.label, name)] = old
                out.reused.append(old)
                continue
            out.why_computed.setdefault(", ".join(reasons), []).append(name)
            out.tasks.append(CellTask(
                config=cfg.label, workload=cfg.workload, optimizer=name, gpu=cfg.gpu or gpu,
                backend=backend, seed=seed, key=key, made_by=maker, store_root=str(store.root),
                overrides={k: (list(v) if isinstance(v, tuple) else v)
                           for k, v in cfg.overrides.items()},
                gpu_overrides=dict(cfg.gpu_overrides), options=own,
                backend_options=dict(backend_options or {})))
        out.shown[cfg.label] = [n for n in registered
                                if n in names or (cfg.label, n) in out.records]
    return out


def _why_recompute(old: dict | None, key: dict, *, unreadable: bool) -> list[str]:
    """Why a cell must be computed again (none: its stored record ``old`` can be reused): never
    run, its file unreadable (``unreadable``: a file exists but gave no record), its inputs or
    code changed since (:func:`kareus.suite.provenance.stale_reasons` against ``key``), or it
    failed before."""
    from kareus.suite.provenance import stale_reasons

    if old is None:
        return ["unreadable cell"] if unreadable else ["not run before"]
    return stale_reasons(old.get("key"), key) or (
        [] if old.get("status") == "ok" else ["failed before"])


def _execute_cells(tasks: list, records: dict[tuple[str, str], dict], console,  # noqa: ANN001
                   *, executor: str, jobs: int) -> BaseException | None:
    """Compute ``tasks`` with a progress bar on ``console``, adding each finished record to
    ``records``; returns the interruption (Ctrl-C, SIGTERM) that stopped them, if one did."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kareus.suite.executors import execute
    from kareus.suite.progress import on_terminal

    with Progress(TextColumn("{task.description:<58}"), BarColumn(bar_width=24),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  disable=not on_terminal()) as progress:
        bar = progress.add_task("cells (configuration x optimizer)", total=len(tasks))

        def done(task, record: dict) -> None:  # noqa: ANN001
            records[(task.config, task.optimizer)] = record
            status = "ok" if record["status"] == "ok" else "FAILED"
            progress.update(bar, advance=1,
                            description=f"{task.config}: {task.optimizer} {status}")

        try:
            execute(tasks, executor=executor, jobs=jobs, on_done=done)
        except KeyboardInterrupt as e:
            return e
    return None


def _own_settings(name: str, options: Mapping[str, object]) -> dict[str, object]:
    """The settings of ``options`` optimizer ``name`` declares, typed
    (:func:`kareus.plugins.own_settings`; a bad value raises :class:`InputError`); ``{}`` for a
    plugin that cannot be imported (its cell fails alone, or is left out)."""
    from kareus.plugins import own_settings

    return own_settings(name, options)


def reuse_lines(reused: list[dict], why_computed: dict[str, list[str]],
                left_out: dict[str, list[str]], merged: int) -> list[str]:
    """What a run says about its cells, one line each: the cells it reuses, grouped by who made
    them (suite version, code hash of the group, git commit); the cells it computes and why; the
    finished cells of optimizers not asked for that it shows too; and those it leaves out."""
    from kareus.suite.provenance import json_digest

    lines = []
    groups: dict[tuple[str, str | None], list[dict]] = {}
    for rec in reused:
        by = rec.get("made_by") or {}
        groups.setdefault((by.get("suite", "an unknown version"), by.get("git_commit")),
                          []).append(rec)
    for (suite, commit), recs in groups.items():
        code = json_digest(sorted(json.dumps(r["key"]["code"], sort_keys=True) for r in recs))
        at = f" (git {commit[:10]})" if commit else ""
        lines.append(f"reusing {len(recs)} cell(s) made by {suite} at code {code}{at}; "
                     "code, preset and settings unchanged")
    computing = sum(len(v) for v in why_computed.values())
    if computing:
        parts = [f"{reason} ({_counted(opts)})" for reason, opts in why_computed.items()]
        lines.append(f"computing {computing} cell(s): {'; '.join(parts)}")
    if merged:
        lines.append(f"also showing {merged} current cell(s) of other optimizers already in the "
                     "folder")
    for reason, cells in left_out.items():
        lines.append(f"leaving out {len(cells)} cell(s) of optimizers not asked for ({reason}): "
                     f"{', '.join(cells)}; name them in --optimizers to recompute")
    return lines


def _counted(names: list[str]) -> str:
    """``["a", "a", "b"]`` as ``"a x2, b"``."""
    return ", ".join(n if k == 1 else f"{n} x{k}" for n, k in Counter(names).items())


def _write_config(cfg, out_dir: Path, gpu: str, backend: str, names: list[str], seed: int,  # noqa: ANN001
                  records: dict, store) -> dict:  # noqa: ANN001
    """Summary, tables and figures of one configuration from its cell records."""
    from kareus import __version__
    from kareus.suite import harness, report
    from kareus.suite.problem import make_problem
    from kareus.suite.store import record_to_run

    problem = make_problem(cfg.workload, gpu=cfg.gpu or gpu, backend=backend, seed=seed,
                           gpu_overrides=cfg.gpu_overrides,
                           **{k: v for k, v in cfg.overrides.items() if v is not None})
    runs, made = {}, {}
    for name in names:
        rec = records.get((cfg.label, name))
        runs[name] = record_to_run(rec) if rec is not None else harness.OptimizerRun(
            name=name, status="missing", error="not run (the sweep was interrupted)")
        if rec is not None:
            made[name] = {**(rec.get("made_by") or {}), "code": rec["key"].get("code")}
    complete = all(r.status != "missing" for r in runs.values())
    summary = report.summary_object(problem, runs, harness.compare(runs), made_by=made,
                                    suite_version=__version__, complete=complete)
    with store.lock(cfg.label):
        report.write_results(out_dir, summary, runs, report.timings_object(
            runs, sum(r.wall_s for r in runs.values())), gpu_overrides=cfg.gpu_overrides)
    return summary


def run_suite(suite: str, gpu: str, backend: str, names: list[str], seed: int, out: Path,
              force: bool, jobs: int = 1, executor: str = "local",
              backend_options: dict | None = None,
              options: Mapping[str, object] | None = None) -> Path:
    """Every configuration of a suite, then the suite's tables, figures and metadata
    (``options``: the optimizers' settings, :func:`run_configs`)."""
    from kareus.suite import report
    from kareus.suite.suites import PAPER_HEADLINES, get_suite

    configs = get_suite(suite)
    t0 = time.perf_counter()
    summaries = run_configs(configs, out, gpu, backend, names, seed, force=force, jobs=jobs,
                            executor=executor, backend_options=backend_options,
                            options=options)
    console = make_console(stderr=True)
    # what the folder now shows: the optimizers run, and those already there (run_configs)
    names = list(dict.fromkeys(n for sm in summaries.values() for n in sm["optimizers"]))
    report.write_suite_results(
        out, summaries, names, title=f"suite {suite}, {gpu} ({backend})",
        heading=f"Suite `{suite}` on {gpu} ({backend} backend)",
        own_gpus=[f"{c.label} on {c.gpu}" for c in configs if c.gpu and c.gpu != gpu],
        headlines=PAPER_HEADLINES if suite == "paper" else None)
    report.atomic_write_text(out / "metadata.json", json.dumps(
        _metadata(suite, gpu, backend, names, time.perf_counter() - t0, jobs), indent=2) + "\n")
    console.print(f"Suite {suite}: {len(configs)} configurations in "
                  f"{time.perf_counter() - t0:.1f} s -> {out}")
    make_console().print((out / "tables.md").read_text())
    return out


def _metadata(suite: str, gpu: str, backend: str, names: list[str], wall_s: float,
              jobs: int = 1) -> dict:
    """What ran the suite (code, packages) and how this run went: its wall time (s), ``--jobs``
    and its date (UTC), which a record of the folder quotes (``benchmarks/whatif.py``)."""
    import datetime
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from kareus import __version__
    from kareus.suite.provenance import git_commit

    commit = git_commit()
    packages = {}
    for pkg in ("numpy", "pandas", "scipy", "lowtime", "pymoo", "scikit-learn", "torch"):
        try:
            packages[pkg] = version(pkg)
        except PackageNotFoundError:
            packages[pkg] = None
    return {"suite": suite, "suite_version": __version__, "git_commit": commit, "gpu": gpu,
            "backend": backend, "optimizers": names, "python": platform.python_version(),
            "packages": packages, "wall_s_this_run": round(wall_s, 1), "jobs_this_run": jobs,
            "date_this_run": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}
