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
    """Run ``tasks`` in a pool of ``jobs`` processes. A worker that dies (a plugin's native
    crash, ``os._exit``) breaks the pool and every cell still in it; those cells then run one
    by one, each in a process of its own (:func:`_run_alone`), so that only the one that kills
    its process fails, with a record that says so."""
    from concurrent.futures.process import BrokenProcessPool

    pool = _new_pool(jobs)
    futures = _submit(pool, tasks)
    orphans: list[CellTask] = []
    try:
        for fut in _as_finished(futures):
            try:
                record = fut.result()
            except BrokenProcessPool:
                orphans.append(futures[fut])
                continue
            if on_done is not None:
                on_done(futures[fut], record)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    for task in sorted(orphans, key=tasks.index):
        record = _run_alone(task)
        if on_done is not None:
            on_done(task, record)


def _new_pool(jobs: int):  # noqa: ANN202 - concurrent.futures is imported where used
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                               initializer=_leave_sigint_to_the_parent)


def _submit(pool, tasks: Sequence[CellTask]) -> dict:  # noqa: ANN001
    """Submit ``tasks`` to ``pool``: future -> task. Submitting starts the workers: they
    inherit an ignored SIGINT, so a Ctrl-C while one is still starting (before its initializer
    runs) does not reach it either."""
    import threading

    main = threading.current_thread() is threading.main_thread()  # signals are the main's
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        return {pool.submit(run_task, t): t for t in tasks}
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def _as_finished(futures: dict):  # noqa: ANN001, ANN202
    """The futures as they finish."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending = set(futures)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        yield from done


def _stop(pool) -> None:  # noqa: ANN001
    """Stop ``pool`` now: cancel what has not started, terminate the workers."""
    # the workers, taken before shutdown forgets them (it sets the private map to None)
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(timeout=10)


def _run_alone(task: CellTask) -> dict:
    """Run one cell in a process of its own; when that process dies, save and return a failed
    record naming its exit status (a failed cell is computed again on the next run)."""
    from concurrent.futures.process import BrokenProcessPool

    from kareus.suite.harness import OptimizerRun
    from kareus.suite.store import ResultsStore, run_to_record

    pool = _new_pool(1)
    fut = next(iter(_submit(pool, [task])))
    workers = list((getattr(pool, "_processes", None) or {}).values())
    try:
        return fut.result()
    except BrokenProcessPool:
        for proc in workers:
            proc.join(timeout=10)
        codes = [proc.exitcode for proc in workers]
        run = OptimizerRun(name=task.optimizer, status="failed",
                           error=f"its process died (exit status {codes[0] if codes else '?'}) "
                                 f"while it ran")
        record = run_to_record(run, task.key, task.made_by)
        ResultsStore(task.store_root).save(task.config, task.optimizer, record)
        return record
    except BaseException:
        _stop(pool)
        raise
    finally:
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
