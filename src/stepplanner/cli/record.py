"""``stepplanner record``: simulate and write every step's ledger and plan (JSON Lines)."""

from __future__ import annotations

from typing import Any

import click
import numpy as np

from ..planner._policy import resolve_scheduling_policy
from ..sim.engine import Engine, RunSpec
from ..sim.latency import LatencyModel
from ..sim.simulator import StepRecorder
from .errors import library_errors
from .files import check_files
from .notices import warn_default_step_limit, warn_no_op_options, warn_refused
from .options import (
    given,
    limit_options,
    limits_from,
    options_from,
    run_options_stopping_at,
    scheduling_options,
    workload_from,
    workload_options,
)
from .running import run

DEFAULT_RECORD_STEPS = 2000  # about 10 MB of JSON Lines at the default B=256


@click.command("record")
@click.argument("out", type=click.File("w"))
@workload_options
@limit_options
@scheduling_options
@run_options_stopping_at(DEFAULT_RECORD_STEPS)
@library_errors
def record_command(
    out: Any, latency_text: str, max_steps: int | None, progress: bool, **kw: Any
) -> None:
    """Simulate and write every step's ledger and plan to OUT (JSON Lines)."""
    check_files({"OUT": out.name}, {"--trace": kw["trace"]})  # OUT is opened on first write
    limits = limits_from(kw)
    options, workload = options_from(kw, limits), workload_from(kw)
    policy = resolve_scheduling_policy(options, limits)
    warn_no_op_options(options, policy)
    recorder = StepRecorder(out, limits, policy)
    engine = Engine(limits, policy, LatencyModel.parse(latency_text))
    result, _ = run(RunSpec(workload, engine, max_steps), progress, "recording", on_step=recorder)
    warn_refused(result)
    warn_default_step_limit(
        result, DEFAULT_RECORD_STEPS, given(click.get_current_context(), "max_steps")
    )
    completed = int((~np.isnan(result.finish_time)).sum())
    click.echo(
        f"recorded {recorder.steps} steps ({completed} requests completed) to {out.name}",
        err=out.name == "<stdout>",
    )
