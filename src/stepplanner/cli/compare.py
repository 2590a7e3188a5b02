"""``stepplanner compare``: several configurations on one workload, side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from .._errors import StepPlannerValueError
from .._policy import SchedulingOptions, resolve_scheduling_policy
from . import tuning_extras
from .config import parse_config, parse_config_text
from .errors import library_errors
from .files import read_json
from .notices import warn_no_op_options, warn_refused
from .options import (format_options, limit_options, limits_from, output_format, run_options,
                      workload_from, workload_options)
from .render import comparison_blocks, emit
from .running import run
from .tuning_options import latency_of
from .tuning_render import write_json

DEFAULT_COMPARE = ("name=fcfs,policy=fcfs", "name=priority,policy=priority",
                   "name=priority+pause,policy=priority,preemption=pause,max_pause_steps=64")


@click.command("compare")
@workload_options
@limit_options
@run_options
@click.option("--config", "configs", multiple=True,
              help="One configuration as KEY=VALUE,... e.g. 'policy=priority,preemption=pause,"
                   "max_num_tokens=1024' (repeat for each; keys are SchedulingOptions and "
                   "limits fields, aliases mode/policy/reserved, and name).")
@click.option("--config-file", type=click.File("r"),
              help="A JSON list of configuration objects (same keys as --config).")
@format_options
@tuning_extras.compare_options
@library_errors
def compare_command(latency_text: str, max_steps: int | None, progress: bool,
                    configs: Sequence[str], config_file: Any, fmt: str, as_json: bool,
                    slos: Any, latency_model: Any, **kw: Any) -> None:
    """Run several configurations on one workload and show them side by side."""
    fmt = output_format(fmt, as_json)
    limits, workload = limits_from(kw), workload_from(kw)
    items: list[dict[str, Any]] = [parse_config_text(text) for text in configs]
    if config_file is not None:
        items.extend(_config_file(config_file))
    if not items:
        items = [parse_config_text(text) for text in DEFAULT_COMPARE]
    runs = [parse_config(item, limits, SchedulingOptions()) for item in items]
    # Every configuration is resolved (and so checked) before the first one runs.
    policies = [resolve_scheduling_policy(r.options, r.limits) for r in runs]
    for config, policy in zip(runs, policies):
        warn_no_op_options(config.options, policy, config.name)
    latency = latency_of(latency_model, latency_text)
    reports = []
    for k, (config, policy) in enumerate(zip(runs, policies), start=1):
        result = run(workload, config.limits, policy, latency, max_steps,
                     progress and fmt == "table", f"{k}/{len(runs)} {config.name}")
        warn_refused(result, config.name)
        reports.append({"name": config.name, **result.report(),
                        **tuning_extras.section(result, slos)})
    if fmt == "json":
        click.echo(write_json(None, reports))
    else:
        emit([*comparison_blocks(reports),
              *(b for r in reports for b in tuning_extras.slo_blocks(r, r["name"]))], fmt)


def _config_file(handle: Any) -> list[dict[str, Any]]:
    data = read_json(handle)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise StepPlannerValueError(f"--config-file {handle.name}: expected a JSON list of objects")
    return data
