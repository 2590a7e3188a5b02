"""Every engine step's time and contents, written from inside vLLM's running engine.

``--scheduler-cls vllm_step_timings.TimedScheduler`` is vLLM's own ``Scheduler``,
``--scheduler-cls vllm_step_timings.TimedStepPlannerScheduler`` is ``StepPlannerScheduler``; with
this directory on the engine's ``PYTHONPATH`` and ``STEP_TIMINGS=FILE.csv`` in its environment,
each appends one CSV row per engine step (line-buffered, so a reader sees the steps of a run as
soon as it is over). Both schedulers are timed the same way, so the timing's own cost (one row
write after the step) falls on both alike.

A step is timed from the start of ``schedule()`` to the end of ``update_from_output()``: in the
synchronous engine (vLLM's CPU platform turns async scheduling off) the forward pass and sampling
run between the two, so ``seconds`` is the engine's step. The columns are those ``stepplanner
calibrate`` reads (``tokens``, ``context``, ``rows``, ``decode_rows``, ``prefill_tokens``,
``prefill_context``, ``attention``: docs/simulator.md) and the split: ``schedule_seconds`` and
``update_seconds`` (the scheduler's two calls; the rest of the step is the forward pass,
sampling and the engine's glue), with ``at`` (wall-clock seconds, ``time.time()``) to cut a
file into runs, and the queue lengths after scheduling.
"""

from __future__ import annotations

import csv
import os
import time

from vllm.v1.core.sched.scheduler import Scheduler

from stepplanner.integrations.vllm import StepPlannerScheduler
from stepplanner.sim.latency_models import STEP_TIMING_COLUMNS, step_timing_row

# The timings contract's columns (docs/simulator.md, "The timings file"), then this file's own.
COLUMNS = (
    "at",
    *STEP_TIMING_COLUMNS,
    "schedule_seconds",
    "update_seconds",
    "waiting",
    "running",
)


class _StepTimings:
    """The timing, over whichever scheduler it is mixed into."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ["STEP_TIMINGS"]
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._timings_file = open(path, "a", buffering=1, newline="")  # noqa: SIM115
        self._timings = csv.DictWriter(self._timings_file, fieldnames=COLUMNS)
        if new:
            self._timings.writeheader()
        self._step: tuple | None = None

    def schedule(self, *args, **kwargs):
        at, started = time.time(), time.perf_counter()
        output = super().schedule(*args, **kwargs)
        scheduled = time.perf_counter()
        # schedule() has advanced num_computed_tokens past this step's tokens (vLLM's
        # _update_after_schedule), so what was computed before the step is that minus them.
        batch = []
        for req_id, query in output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            past = request.num_computed_tokens - query
            batch.append((past, query, past >= request.num_prompt_tokens))
        self._step = (at, started, scheduled, batch, len(self.waiting), len(self.running))
        return output

    def update_from_output(self, *args, **kwargs):
        updating = time.perf_counter()
        outputs = super().update_from_output(*args, **kwargs)
        end = time.perf_counter()
        if self._step is not None and self._step[3]:
            at, started, scheduled, batch, waiting, running = self._step
            row = step_timing_row(end - started, batch)
            self._timings.writerow(
                {
                    **row,
                    "at": f"{at:.6f}",
                    "seconds": f"{row['seconds']:.6f}",
                    "schedule_seconds": f"{scheduled - started:.6f}",
                    "update_seconds": f"{end - updating:.6f}",
                    "waiting": waiting,
                    "running": running,
                }
            )
        self._step = None
        return outputs


class TimedScheduler(_StepTimings, Scheduler):
    """vLLM's own scheduler, timed."""


class TimedStepPlannerScheduler(_StepTimings, StepPlannerScheduler):
    """``StepPlannerScheduler``, timed."""
