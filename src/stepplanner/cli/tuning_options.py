"""The flags of the tuning commands (``sweep``, ``capacity``), some of which ``simulate`` and
``compare`` take too: ``--slo``, ``--latency-model``, ``--metric-percentiles``, the backends and
the output files.

Parsing happens in click callbacks, so a bad ``--slo`` fails before anything runs; output paths
are checked up front for the same reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from ..sim.latency import LatencyModel, parse_coefficients
from ..sim.latency_models import PRESETS, load_latency_model
from ..tuning.backends import BACKENDS
from ..tuning.metrics import parse_percentiles
from ..tuning.slo import STABILITY, parse_queue_delay, parse_slos
from .options import compose

# Where --latency-model's callback leaves the file it read (not a preset): an input of the
# command, which no output may overwrite (files.check_files).
_LATENCY_MODEL_FILE = "stepplanner.latency_model_file"


def _bad_parameter(parse: Callable[[Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def callback(ctx: Any, param: Any, value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except (TypeError, ValueError) as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


slo_option = click.option(
    "--slo",
    "slos",
    multiple=True,
    callback=_bad_parameter(parse_slos),
    help="Service-level objective METRIC_pN[@CLASS]=VALUE, repeatable; METRIC is ttft, tpot, "
    "e2e, queue or max_itl; VALUE in ms, s or us (e.g. ttft_p99=500ms, tpot_p99@-1=20ms).",
)

stability_options = compose(
    click.option(
        "--max-queue-delay",
        "stability",
        default=f"p{STABILITY.percentile:g}={STABILITY.seconds:g}s",
        show_default=True,
        callback=_bad_parameter(parse_queue_delay),
        help="Stability condition: this percentile of queueing delay (arrival to admission) "
        "must hold too, pN=VALUE (Sarathi-Serve: p50=2s; Vidur: p99=5s).",
    ),
    click.option(
        "--no-stability",
        is_flag=True,
        default=False,
        help="Drop the stability condition: capacity under the --slo objectives alone (a "
        "TPOT-only objective may then hold at any rate).",
    ),
)


def stability_of(stability: Any, no_stability: bool) -> Any:
    """The condition capacity applies, or None with --no-stability (not with both flags)."""
    if not no_stability:
        return stability
    ctx = click.get_current_context()
    if ctx.get_parameter_source("stability") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError(
            "--no-stability drops the condition --max-queue-delay sets; give one of them", ctx=ctx
        )
    return None


def _latency_model(ctx: click.Context, param: Any, value: str | None) -> LatencyModel | None:
    model: LatencyModel | None = _bad_parameter(load_latency_model)(ctx, param, value)
    if value is not None and value.strip().lower() not in PRESETS:
        ctx.meta[_LATENCY_MODEL_FILE] = value.strip()
    return model


def latency_model_file() -> str | None:
    """The file ``--latency-model`` read, or None (a preset, or not given)."""
    return click.get_current_context().meta.get(_LATENCY_MODEL_FILE)


latency_model_option = click.option(
    "--latency-model",
    "latency_model",
    default=None,
    callback=_latency_model,
    help=f"Step-latency preset ({', '.join(PRESETS)}) or a JSON file from 'stepplanner "
    "calibrate'; default: the first preset.",
)

percentiles_option = click.option(
    "--metric-percentiles",
    "metric_percentiles",
    default="99",
    show_default=True,
    callback=_bad_parameter(parse_percentiles),
    help="Percentiles of TTFT, TPOT, ITL and E2EL to report, as vLLM's benchmark does "
    "(e.g. 50,90,99).",
)

backend_options = compose(
    click.option(
        "--backend",
        type=click.Choice(BACKENDS),
        default="process",
        show_default=True,
        help="Where configurations run: one process, all local cores, or Ray.",
    ),
    click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        help="Parallel configurations (default: every core this process may use).",
    ),
    click.option(
        "--ray-address",
        default=None,
        help="A Ray cluster to join (with --backend ray); default: a local instance.",
    ),
)


def latency_of(model: LatencyModel | None, overrides: str) -> LatencyModel:
    """``--latency-model`` (or the default), with ``--latency a=..,b=..`` items on top."""
    base = model if model is not None else LatencyModel()
    if not overrides.strip():
        return base
    return dataclasses.replace(
        base, name=f"{base.name}, overridden", **parse_coefficients(overrides)
    )


def output_options(what: str) -> Callable[[Any], Any]:
    """--latency, the backends, --save-result/--csv files and --progress for a command over
    many configurations (``--format``/``--json`` come from ``options.format_options``)."""
    return compose(
        click.option(
            "--latency",
            "latency_text",
            default="",
            help="Override coefficients of the latency model: 'a=SECONDS,b=..,c=..'.",
        ),
        backend_options,
        click.option(
            "--save-result",
            type=click.Path(dir_okay=False),
            default=None,
            help=f"Write the JSON document (--json) to this file: 'results' has {what}.",
        ),
        click.option(
            "--csv",
            "csv_path",
            type=click.Path(dir_okay=False),
            default=None,
            help="Write one CSV row per configuration, every metric.",
        ),
        click.option(
            "--progress/--no-progress",
            default=True,
            show_default=True,
            help="Progress bar across configurations on stderr.",
        ),
    )
