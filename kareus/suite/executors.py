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
    crash, ``os._exit``) breaks the pool and every cell still in it; those cells then run again,
    each in a process of its own, ``jobs`` at a time (:func:`_run_each_alone`), so that only the
    one that kills its process fails, with a record that says so."""
    from concurrent.futures.process import BrokenProcessPool

    pool = _new_pool(jobs)
    orphans: list[CellTask] = []
    try:
        futures = _submit(pool, tasks)
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
    _run_each_alone(sorted(orphans, key=tasks.index), jobs, on_done)


def _run_each_alone(tasks: Sequence[CellTask], jobs: int,
                    on_done: Callable[[CellTask, dict], None] | None) -> None:
    """Run each of ``tasks`` in a process of its own (a one-worker pool per cell), ``jobs`` at a
    time. A cell whose process dies gets a failed record naming its exit status, saved as its
    cell (a failed cell is computed again on the next run)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    queue = list(tasks)
    running: dict = {}  # future -> (its pool, the pool's worker processes, its task)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                task = queue.pop(0)
                pool = _new_pool(1)
                fut = next(iter(_submit(pool, [task])))  # submitting starts its worker
                running[fut] = (pool, _workers(pool), task)
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                pool, workers, task = running.pop(fut)
                record = _record_or_death(fut, pool, workers, task)
                pool.shutdown(wait=True)
                if on_done is not None:
                    on_done(task, record)
    except BaseException:
        for pool, _, _ in running.values():
            _stop(pool)
        raise


def _record_or_death(fut, pool, workers: list, task: CellTask) -> dict:  # noqa: ANN001
    """The record a one-cell ``pool``'s future returned; when its process died, a failed record
    naming its exit status, saved as the cell."""
    import time
    from concurrent.futures.process import BrokenProcessPool

    from kareus.suite.harness import OptimizerRun
    from kareus.suite.store import ResultsStore, run_to_record

    try:
        return fut.result()
    except BrokenProcessPool:
        # the pool's own thread reaps the dead worker: wait for it, not beside it (two threads
        # waiting on one child race, and the loser sees no exit status yet)
        pool.shutdown(wait=True)
        deadline = time.monotonic() + 10
        code = workers[0].exitcode if workers else None
        while code is None and workers and time.monotonic() < deadline:
            workers[0].join(timeout=0.1)
            code = workers[0].exitcode
        run = OptimizerRun(name=task.optimizer, status="failed",
                           error=f"its process died (exit status "
                                 f"{'?' if code is None else code}) while it ran")
        record = run_to_record(run, task.key, task.made_by)
        ResultsStore(task.store_root).save(task.config, task.optimizer, record)
        return record


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


def _workers(pool) -> list:  # noqa: ANN001
    """The pool's worker processes (its private map: shutdown forgets them)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def _stop(pool) -> None:  # noqa: ANN001
    """Stop ``pool`` now: cancel what has not started, terminate the workers."""
    workers = _workers(pool)  # taken before shutdown forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        proc.terminate()
    for proc in workers:
        proc.join(timeout=10)


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
