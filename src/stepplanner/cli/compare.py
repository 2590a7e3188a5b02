"""``stepplanner compare``: several configurations on one workload, side by side."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from .._errors import StepPlannerValueError
from ..cli import tuning_extras
from ..planner._policy import SchedulingOptions, resolve_scheduling_policy
from ..sim.engine import Engine, RunSpec
from ..sim.load import saturation_throughput
from ..sim.workloads import Workload
from ..tuning.metrics import parse_number_list
from .compare_plot import plot_compare
from .config import canonical_key, parse_config, parse_config_text
from .engine_options import (
    engine_options,
    max_step_seconds,
    preemption_lines,
    take_engine_keys,
    with_preemption_columns,
)
from .errors import InputError, library_errors
from .files import check_files, read_json
from .notices import warn_no_op_options, warn_refused
from .options import (
    format_options,
    limit_options,
    limits_from,
    offered_from,
    output_format,
    queue_from,
    queue_options,
    run_options,
    speculation_from,
    speculation_options,
    workload_choice_option,
    workload_options,
)
from .plot import check_plot_path, require_matplotlib
from .render import Line, comparison_blocks, emit, with_page_columns, with_prefix_columns
from .running import ProgressBar, check_num_pages, run
from .slo_render import attainment_comparison
from .tuning_options import latency_of
from .tuning_render import write_json

DEFAULT_COMPARE = (
    "name=fcfs,policy=fcfs",
    "name=priority,policy=priority",
    "name=priority+pause,policy=priority,preemption=pause,max_pause_steps=64",
)
# When requests carry objectives: the baselines of a deadline policy, side by side (FCFS, static
# priority with pause, plain earliest-deadline-first with pause, and the deadline-aware policy).
DEFAULT_SLO_COMPARE = (
    "name=fcfs,policy=fcfs",
    "name=priority+pause,policy=priority,preemption=pause,max_pause_steps=64",
    "name=edf+pause,policy=edf,preemption=pause,max_pause_steps=64",
    "name=deadline+pause,policy=deadline,preemption=pause,max_pause_steps=64",
)


def parse_loads(text: str) -> tuple[float, ...]:
    """``"0.6,0.8,1.0"`` -> (0.6, 0.8, 1.0): multiples of saturation, each finite and > 0."""
    return parse_number_list(
        text, "load", lambda v: v > 0, "multiples of saturation > 0", "0.8,1.0,1.2"
    )


def _loads(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return parse_loads(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@click.command("compare")
@workload_choice_option
@workload_options
@limit_options
@run_options
@queue_options
@speculation_options
@engine_options
@click.option(
    "--config",
    "configs",
    multiple=True,
    help="One configuration as KEY=VALUE,... e.g. 'policy=priority,preemption=pause,"
    "max_num_tokens=1024' (repeat for each; keys are SchedulingOptions and "
    "limits fields, aliases mode/policy/reserved, name, num_pages: a pool "
    "of KV pages, as simulate --num-pages, and max_step_time, kv_preemption as "
    "the flags). Default: fcfs, priority, "
    "priority+pause; when requests carry objectives, fcfs, priority+pause, "
    "edf+pause and deadline+pause.",
)
@click.option(
    "--config-file",
    type=click.File("r"),
    help="A JSON list of configuration objects (same keys as --config).",
)
@click.option(
    "--load",
    "loads",
    default=None,
    callback=_loads,
    help="Multiples of the engine's saturation throughput, e.g. 0.6,0.8,1.0,1.2: "
    "the workload's arrival times are scaled so that it is offered at each "
    "(same requests, only the gaps change) and every configuration runs at "
    "each. Saturation = requests completed per second with every request at "
    "t=0 under FCFS on these limits. --workload prefix-heavy: drawn at each rate "
    "instead (same requests, sessions' turns still seconds apart), saturation "
    "counting each prompt less the hit its shared prefix allows.",
)
@format_options
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Write an image (.png, .svg, .pdf, ...): per configuration the TTFT CDF of "
    "each priority class, and the classes' TTFT p99 side by side (needs "
    "matplotlib).",
)
@tuning_extras.compare_options
@library_errors
def compare_command(
    latency_text: str,
    max_steps: int | None,
    progress: bool,
    configs: Sequence[str],
    config_file: Any,
    loads: tuple[float, ...] | None,
    fmt: str,
    as_json: bool,
    plot: str | None,
    slos: Any,
    latency_model: Any,
    **kw: Any,
) -> None:
    """Run several configurations on one workload and show them side by side."""
    if plot:
        require_matplotlib()
        check_files(
            {"--plot": plot},
            {"--trace": kw["trace"], "--config-file": config_file and config_file.name},
        )
        check_plot_path(plot)
    fmt = output_format(fmt, as_json)
    limits, offered = limits_from(kw), offered_from(kw)
    workload = offered.workload
    queue, speculation = queue_from(kw), speculation_from(kw)
    if loads is not None and not workload.has_objectives:
        raise InputError(
            "--load reports SLO attainment per load, and no request carries "
            "objectives (--no-slo, or a trace without ttft_slo_ms); give "
            "--slo-class PRIORITY=ttft:VALUE[,tpot:VALUE]"
        )
    items: list[dict[str, Any]] = [parse_config_text(text) for text in configs]
    if config_file is not None:
        items.extend(_config_file(config_file))
    if not items:
        defaults = DEFAULT_SLO_COMPARE if workload.has_objectives else DEFAULT_COMPARE
        items = [parse_config_text(text) for text in defaults]
    flags = {
        "max_step_seconds": max_step_seconds(kw.pop("max_step_time")),
        "kv_preemption": kw.pop("kv_preemption"),
    }
    pools = [_take_num_pages(item) for item in items]
    extras = [take_engine_keys(rest, flags, _label(item)) for item, (rest, _) in zip(items, pools)]
    runs = [
        parse_config(rest, limits, SchedulingOptions(), _label(item))
        for item, (rest, _) in zip(items, extras)
    ]
    # Every configuration is resolved (and so checked) before the first one runs.
    policies = [resolve_scheduling_policy(r.options, r.limits) for r in runs]
    for config, policy, (_, pool), (_, fields) in zip(runs, policies, pools, extras):
        warn_no_op_options(config.options, policy, config.name)
        check_num_pages(pool, workload, config.limits, f"config {config.name!r}: num_pages")
        offered.check_pool(pool, "num_pages", f"config {config.name!r}: ")
        if fields["kv_preemption"] is not None and not pool:
            raise InputError(
                f"config {config.name!r}: kv_preemption={fields['kv_preemption']} preempts "
                "when KV pages run out; give that configuration num_pages=N"
            )
    latency = latency_of(latency_model, latency_text)
    engine = Engine(limits, latency=latency, queue=queue, speculation=speculation)
    engines = [
        engine.replace(limits=config.limits, options=policy, num_pages=pool, **fields)
        for config, policy, (_, pool), (_, fields) in zip(runs, policies, pools, extras)
    ]
    show = progress and fmt == "table"
    at_loads: list[tuple[float, float] | None] = [None]
    workloads = [(workload, offered.prefixes)]
    saturation = None
    if loads is not None:
        with ProgressBar(len(workload), show, "saturation") as bar:
            saturation = saturation_throughput(
                workload, engine, max_steps=max_steps, progress=bar, prefixes=offered.prefixes
            )
        at_loads = [(load, load * saturation) for load in loads]
        workloads = [offered.at_load(load, saturation) for load in loads]
    reports, results = [], []
    for (w, prefixes), load in zip(workloads, at_loads):
        where = "" if load is None else f"{load[0]:g}x "
        for k, (config, config_engine) in enumerate(zip(runs, engines), start=1):
            label = f"{where}{k}/{len(runs)} {config.name}"
            spec = RunSpec(w, config_engine, max_steps, prefixes=prefixes)
            result, occupancy = run(spec, show, label)
            pages = {} if occupancy is None else {"pages": occupancy.report()}
            warn_refused(result, config.name)
            if plot and load == at_loads[0]:  # with --load, the figure is of the first load
                results.append((config.name, result))
            reports.append(
                {
                    "name": config.name,
                    **result.report(),
                    **pages,
                    **tuning_extras.section(result, slos),
                }
            )
    if plot:
        where = "" if at_loads[0] is None else f" at {at_loads[0][0]:g}x saturation"
        plot_compare(
            results, plot, f"TTFT by priority class: {workload.source}{where}; {latency.name}"
        )
    names = [config.name for config in runs]
    if loads is not None:
        assert saturation is not None
        _emit_loads(workload, reports, names, at_loads, saturation, fmt)
    elif fmt == "json":
        click.echo(write_json(None, reports))
    else:
        emit(
            [
                *with_preemption_columns(
                    with_prefix_columns(
                        with_page_columns(comparison_blocks(reports), reports), reports
                    ),
                    reports,
                ),
                *preemption_lines(reports, named=True),
                *attainment_comparison(reports, names),
                *(b for r in reports for b in tuning_extras.slo_blocks(r, r["name"])),
            ],
            fmt,
        )
    if plot:
        click.echo(f"plot written to {plot}", err=True)


def _emit_loads(
    workload: Workload,
    reports: list[dict[str, Any]],
    names: list[str],
    offered: list[Any],
    saturation: float,
    fmt: str,
) -> None:
    """``compare --load``: the saturation, then per load every configuration's SLO metrics
    (JSON: every report, grouped by load)."""
    told = (
        f"{saturation:.2f} req/s: all {len(workload):,} requests of {workload.source} at "
        "t=0 under FCFS, completed / simulated span"
    )
    if fmt == "json":
        per = len(names)
        click.echo(
            write_json(
                None,
                {
                    "saturation_rps": saturation,
                    "saturation": told,
                    "loads": [
                        {"load": load, "rate": rate, "reports": reports[k * per : (k + 1) * per]}
                        for k, (load, rate) in enumerate(offered)
                    ],
                },
            )
        )
        return
    emit(
        [
            Line("saturation", told),
            *attainment_comparison(reports, names, offered, main=True),
            *preemption_lines(reports, named=True),
            *(b for r in reports for b in tuning_extras.slo_blocks(r, r["name"])),
        ],
        fmt,
    )


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
        return rest, int(str(value).strip())  # str first: a JSON true or 2.5 is no integer
    except ValueError:
        raise StepPlannerValueError(f"num_pages={value!r} is not an integer") from None


def _label(item: dict[str, Any]) -> str:
    """What ``parse_config`` names a configuration without a ``name`` key, ``num_pages`` kept."""
    return ", ".join(f"{k}={v}" for k, v in item.items()) or "default"
