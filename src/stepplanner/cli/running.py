"""One simulation run from the command line: the simulator with a progress bar on stderr."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from ..planner._policy import StepPlannerLimits
from ..sim.latency import EnginePace, LatencyModel
from ..sim.paged import PageOccupancy, row_pages, simulate_paged
from ..sim.simulator import ServingQueue, SimulationResult, Speculation, simulate
from ..sim.workloads import Workload
from .errors import InputError


class ProgressBar:
    """A rich progress bar on stderr that appears only once a run has taken a second."""

    def __init__(self, total: int, enabled: bool, label: str) -> None:
        self.total, self.enabled, self.label = total, enabled, label
        self.start = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, steps: int, sim_time: float, completed: int) -> None:
        if not self.enabled or time.perf_counter() - self.start < 1.0:
            return
        if self.bar is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[steps]} steps"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total, steps=0)
        self.bar.update(self.task, completed=completed, steps=steps)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run(
    workload: Workload,
    limits: StepPlannerLimits,
    options: Any,
    latency: LatencyModel,
    max_steps: int | None,
    progress: bool,
    label: str,
    *,
    num_pages: int = 0,
    on_step: Any = None,
    pace: EnginePace | None = None,
    detailed: bool = False,
    queue: ServingQueue | None = None,
    speculation: Speculation | None = None,
) -> tuple[SimulationResult, PageOccupancy | None]:
    """``simulate`` with a progress bar labelled ``label`` when ``progress`` is on; with
    ``num_pages`` (checked by ``check_num_pages``) ``simulate_paged`` over a pool of that many
    pages, which also returns the pool's occupancy (``on_step`` is the unpaged run's)."""
    with ProgressBar(len(workload), progress, label) as bar:
        common: dict[str, Any] = {
            "max_steps": max_steps,
            "progress": bar,
            "progress_every": 1024,
            "pace": pace,
            "detailed": detailed,
            "queue": queue,
            "speculation": speculation,
        }
        if num_pages:
            return simulate_paged(workload, limits, options, latency, num_pages=num_pages, **common)
        return simulate(workload, limits, options, latency, on_step=on_step, **common), None


def check_num_pages(
    num_pages: int, workload: Workload, limits: StepPlannerLimits, option: str = "--num-pages"
) -> None:
    """``option``: 0 (unlimited) or a pool that holds the workload's largest request, the way a
    serving engine refuses to start with a KV cache too small for one longest sequence."""
    if num_pages < 0:
        raise InputError(
            f"{option}={num_pages} is negative; allowed: 0 (unlimited pages) or a pool size >= 1"
        )
    need = row_pages(workload, limits) if num_pages else 0
    if num_pages < need:
        raise InputError(
            f"{option}={num_pages} cannot hold the workload's largest request: its prompt "
            f"(at most S_in={limits.max_input_length}) + output tokens need {need} pages of "
            f"{limits.kv_page_size} tokens; allowed: 0 (unlimited) or >= {need}"
        )
