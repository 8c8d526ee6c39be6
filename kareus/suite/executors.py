"""Running independent cells: serially, in a local process pool, or on a Ray cluster.

A :class:`CellTask` is one (configuration, optimizer) pair; :func:`run_task` builds the problem,
runs the optimizer through the harness and saves the cell in the results store, in whatever
process or machine executes it. The executors only differ in where that happens; the records,
and so the summaries, are the same as a serial run's.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kareus.errors import InputError

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class CellTask:
    """One optimizer on one configuration, and where its record goes."""

    config: str
    workload: str
    optimizer: str
    gpu: str
    backend: str
    seed: int
    key: dict
    store_root: str
    made_by: dict | None = None
    overrides: dict = field(default_factory=dict)
    gpu_overrides: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    backend_options: dict = field(default_factory=dict)


def run_task(task: CellTask) -> dict:
    """Run one cell and save its record (also returned). Plugin failures are recorded, not
    raised; a problem that cannot be built raises InputError."""
    from kareus.suite.harness import load_and_run
    from kareus.suite.problem import make_problem
    from kareus.suite.store import ResultsStore, run_to_record

    problem = make_problem(task.workload, gpu=task.gpu, backend=task.backend, seed=task.seed,
                           options=dict(task.options), gpu_overrides=dict(task.gpu_overrides),
                           backend_options=dict(task.backend_options),
                           **{k: (tuple(v) if isinstance(v, list) else v)
                              for k, v in task.overrides.items() if v is not None})
    run = load_and_run(task.optimizer, problem)
    record = run_to_record(run, task.key, task.made_by)
    ResultsStore(task.store_root).save(task.config, task.optimizer, record)
    return record


def check_settings(executor: str, jobs: int) -> None:
    """Raise :class:`InputError` unless ``jobs`` is a positive integer and ``executor`` one of
    :data:`EXECUTORS`. The one check of these settings (``reproduce.py`` calls it before any work,
    :func:`execute` again)."""
    if not isinstance(jobs, int) or jobs < 1:
        raise InputError(f"--jobs must be a positive integer, got {jobs!r}")
    if executor not in EXECUTORS:
        raise InputError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")


def execute(tasks: Sequence[CellTask], *, executor: str = "local", jobs: int = 1,
            on_done: Callable[[CellTask, dict], None] | None = None) -> None:
    """Run ``tasks``; ``on_done(task, record)`` is called as each finishes. ``jobs`` > 1 runs a
    local process pool; ``executor="ray"`` submits to Ray (a running cluster if ``ray.init`` can
    find one, else a local instance with ``jobs`` CPUs). KeyboardInterrupt (SIGINT, or SIGTERM
    mapped to it by the caller) cancels what has not finished; finished cells are already saved."""
    check_settings(executor, jobs)
    if executor == "ray":
        _execute_ray(tasks, jobs, on_done)
    elif jobs == 1 or len(tasks) <= 1:
        for task in tasks:
            record = run_task(task)
            if on_done is not None:
                on_done(task, record)
    else:
        _execute_pool(tasks, jobs, on_done)


def _execute_pool(tasks: Sequence[CellTask], jobs: int,
                  on_done: Callable[[CellTask, dict], None] | None) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                               initializer=_leave_sigint_to_the_parent)
    # submitting starts the workers: they inherit an ignored SIGINT, so a Ctrl-C while one is
    # still starting (before its initializer runs) does not reach it either
    import threading

    main = threading.current_thread() is threading.main_thread()  # signals are the main's
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        futures = {pool.submit(run_task, t): t for t in tasks}
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                record = fut.result()
                if on_done is not None:
                    on_done(futures[fut], record)
    except BaseException:
        # the workers, taken before shutdown forgets them (it sets the private map to None)
        workers = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.join(timeout=10)
        raise
    pool.shutdown(wait=True)


def _leave_sigint_to_the_parent() -> None:
    """A pool worker ignores SIGINT: Ctrl-C reaches the whole process group, and the parent,
    which keeps the finished cells and writes the summaries, stops the workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _execute_ray(tasks: Sequence[CellTask], jobs: int,
                 on_done: Callable[[CellTask, dict], None] | None) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'kareus-suite[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
        started = True
    remote = ray.remote(num_cpus=1)(run_task)
    refs = {remote.remote(t): t for t in tasks}
    try:
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                record = ray.get(ref)
                if on_done is not None:
                    on_done(refs[ref], record)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
