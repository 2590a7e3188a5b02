"""One simulation run from the command line: the simulator with a progress bar on stderr."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from .._errors import INT32_MAX
from ..planner._policy import StepPlannerLimits
from ..sim.engine import RunSpec
from ..sim.paged import PageOccupancy, row_pages, simulate_paged_run
from ..sim.simulator import SimulationResult, simulate_run
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
    spec: RunSpec, progress: bool, label: str, *, on_step: Any = None
) -> tuple[SimulationResult, PageOccupancy | None]:
    """The run ``spec`` describes, with a progress bar labelled ``label`` when ``progress`` is
    on; on an engine with a page pool (``num_pages``, checked by ``check_num_pages``) the paged
    simulator, which also returns the pool's occupancy (``on_step`` is the unpaged run's)."""
    with ProgressBar(len(spec.workload), progress, label) as bar:
        if spec.engine.num_pages:
            return simulate_paged_run(spec, progress=bar, progress_every=1024)
        return simulate_run(spec, on_step=on_step, progress=bar, progress_every=1024), None


def check_num_pages(
    num_pages: int, workload: Workload, limits: StepPlannerLimits, option: str = "--num-pages"
) -> None:
    """``option``: 0 (unlimited) or a pool from one that holds the workload's largest request
    (the way a serving engine refuses to start with a KV cache too small for one longest
    sequence) up to one that holds B of them, past which pages can never be in use at once (and
    a pool of billions only takes memory and time to set up)."""
    need = row_pages(workload, limits)
    most = min(limits.max_batch_size * need, INT32_MAX)
    if num_pages == 0 or need <= num_pages <= most:
        return
    raise InputError(
        f"{option}={num_pages} is out of range; allowed: 0 (unlimited) or {need}..{most} "
        f"(the workload's largest request, prompt at most S_in={limits.max_input_length} + "
        f"output tokens, needs {need} pages of {limits.kv_page_size} tokens; "
        f"B={limits.max_batch_size} of them at most {most})"
    )
