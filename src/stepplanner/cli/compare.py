"""``stepplanner compare``: several configurations on one workload, side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from .._errors import StepPlannerValueError
from ..cli import tuning_extras
from ..planner._policy import SchedulingOptions, resolve_scheduling_policy
from .config import canonical_key, parse_config, parse_config_text
from .errors import library_errors
from .files import read_json
from .notices import warn_no_op_options, warn_refused
from .options import (
    format_options,
    limit_options,
    limits_from,
    output_format,
    run_options,
    workload_from,
    workload_options,
)
from .render import comparison_blocks, emit, with_page_columns
from .running import check_num_pages, run, run_paged
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
                   "limits fields, aliases mode/policy/reserved, name, and num_pages: a pool "
                   "of KV pages, as simulate --num-pages).")
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
    pools = [_take_num_pages(item) for item in items]
    runs = [parse_config(rest, limits, SchedulingOptions(), _label(item))
            for item, (rest, _) in zip(items, pools)]
    # Every configuration is resolved (and so checked) before the first one runs.
    policies = [resolve_scheduling_policy(r.options, r.limits) for r in runs]
    for config, policy, (_, pool) in zip(runs, policies, pools):
        warn_no_op_options(config.options, policy, config.name)
        check_num_pages(pool, workload, config.limits, f"config {config.name!r}: num_pages")
    latency = latency_of(latency_model, latency_text)
    reports = []
    for k, (config, policy, (_, pool)) in enumerate(zip(runs, policies, pools), start=1):
        show, label = progress and fmt == "table", f"{k}/{len(runs)} {config.name}"
        pages = {}
        if pool:
            result, occupancy = run_paged(workload, config.limits, policy, latency, max_steps,
                                          show, label, pool)
            pages = {"pages": occupancy.report()}
        else:
            result = run(workload, config.limits, policy, latency, max_steps, show, label)
        warn_refused(result, config.name)
        reports.append({"name": config.name, **result.report(), **pages,
                        **tuning_extras.section(result, slos)})
    if fmt == "json":
        click.echo(write_json(None, reports))
    else:
        emit([*with_page_columns(comparison_blocks(reports), reports),
              *(b for r in reports for b in tuning_extras.slo_blocks(r, r["name"]))], fmt)


def _config_file(handle: Any) -> list[dict[str, Any]]:
    data = read_json(handle)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise StepPlannerValueError(f"--config-file {handle.name}: expected a JSON list of objects")
    return data


def _take_num_pages(item: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A configuration without its ``num_pages`` key (a run's KV page pool, not a planner
    field), and that key's value (0, unlimited pages, when absent)."""
    rest = {k: v for k, v in item.items() if canonical_key(k) != "num_pages"}
    values = [v for k, v in item.items() if canonical_key(k) == "num_pages"]
    if not values:
        return rest, 0
    value = values[-1]
    try:
        return rest, int(str(value).strip())   # str first: a JSON true or 2.5 is no integer
    except ValueError:
        raise StepPlannerValueError(f"num_pages={value!r} is not an integer") from None


def _label(item: dict[str, Any]) -> str:
    """What ``parse_config`` names a configuration without a ``name`` key, ``num_pages`` kept."""
    return ", ".join(f"{k}={v}" for k, v in item.items()) or "default"
