"""Where a sweep's independent simulations run: ``serial``, ``process`` (local cores) or ``ray``.

Every backend calls the same pure function on the same picklable tasks and returns the results
in task order, so the results are identical for the same seeds whichever backend ran them (the
simulated numbers depend only on the task; wall-clock measurements are not part of a result).

Ctrl-C (``KeyboardInterrupt``) stops a run cleanly: tasks not yet finished are cancelled, the
finished results are kept, and ``Outcome.interrupted`` says so. Worker processes ignore SIGINT so
that only the parent decides what to keep. An exception a task raises (a bug, not bad input:
tasks return their own validation errors as data) propagates.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import StepPlannerValueError

__all__ = ["BACKENDS", "Outcome", "default_workers", "run_tasks"]

BACKENDS = ("serial", "process", "ray")
Progress = Callable[[int, int], None]


@dataclasses.dataclass
class Outcome:
    """Results in task order; ``None`` where a task did not finish (only after an interrupt)."""

    results: list[Any]
    interrupted: bool
    backend: str
    workers: int
    cpu_seconds: float  # spent by the finished tasks, wherever they ran

    @property
    def finished(self) -> list[Any]:
        return [r for r in self.results if r is not None]


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    backend: str = "process",
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
) -> Outcome:
    """``[fn(t) for t in tasks]`` on ``backend``; ``progress(done, total)`` after each task."""
    if backend not in BACKENDS:
        raise StepPlannerValueError(
            f"backend={backend!r} is not known; allowed: {', '.join(BACKENDS)}"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise StepPlannerValueError(
            f"workers={workers!r} is out of range; allowed: an integer >= 1"
        )
    if ray_address is not None and backend != "ray":
        raise StepPlannerValueError(
            f"ray_address={ray_address!r} needs backend='ray', got {backend!r}"
        )
    n = workers or default_workers()
    timed: list[Any] = [None] * len(tasks)
    tick = progress or (lambda done, total: None)
    runner = {"serial": _serial, "process": _process, "ray": _ray}[backend]
    interrupted = False
    try:
        runner(_Timed(fn), tasks, timed, n, ray_address, tick)
    except KeyboardInterrupt:
        interrupted = True
    results = [None if t is None else t[0] for t in timed]
    cpu = sum(t[1] for t in timed if t is not None)
    return Outcome(results, interrupted, backend, n, cpu)


def _apply(fn: Callable[[Any], Any], task: Any) -> Any:
    return fn(task)


class _Timed:
    """``fn`` returning ``(result, CPU seconds it took)``: a wall clock on a shared machine
    measures the neighbours, CPU time measures the work (picklable for process and Ray)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, task: Any) -> tuple[Any, float]:
        start = time.process_time()
        result = self.fn(task)
        return result, time.process_time() - start


def _serial(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    results: list[Any],
    workers: int,
    ray_address: str | None,
    tick: Progress,
) -> None:
    for k, task in enumerate(tasks):
        results[k] = fn(task)
        tick(k + 1, len(tasks))


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _process(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    results: list[Any],
    workers: int,
    ray_address: str | None,
    tick: Progress,
) -> None:
    # Not fork: the CLI's progress bar runs a thread, and forking a threaded process can copy a
    # held lock into the child. forkserver forks from a clean single-threaded server instead.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=min(workers, max(1, len(tasks))), mp_context=context, initializer=_ignore_sigint
    )
    futures = {pool.submit(fn, task): k for k, task in enumerate(tasks)}
    try:
        for done, future in enumerate(concurrent.futures.as_completed(futures), start=1):
            results[futures[future]] = future.result()
            tick(done, len(tasks))
    except BaseException:
        # A running simulation is not worth waiting for once stopped. The executor has no
        # public way to stop its workers, and forgets them on shutdown: take them first.
        workers_running = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers_running:
            proc.terminate()
        raise
    pool.shutdown(wait=True)


def _ray(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    results: list[Any],
    workers: int,
    ray_address: str | None,
    tick: Progress,
) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "backend 'ray' needs Ray, which is not installed; install it with: "
            "pip install 'stepplanner[ray]'"
        ) from None
    started_here = not ray.is_initialized()
    if started_here:
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(_apply)  # Ray wants a function, not a callable object
        refs = {remote.remote(fn, task): k for k, task in enumerate(tasks)}
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    results[refs[ref]] = ray.get(ref)
                tick(len(tasks) - len(pending), len(tasks))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started_here:
            ray.shutdown()
