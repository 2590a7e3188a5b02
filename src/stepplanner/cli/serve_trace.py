"""``stepplanner serve-trace``: serve a trace through transformers' continuous batching, for real.

The command behind the simulator's fidelity figures (docs/simulator.md, "Fidelity"): it writes
the per-request results (vLLM's ``--save-result --save-detailed`` layout plus stepplanner's keys)
and the per-step timings that ``calibrate`` reads. ``--profile`` times a grid of step shapes
instead of a trace. Needs the ``transformers`` extra; nothing is imported from it until the
command runs, so the rest of the CLI works without it.
"""

from __future__ import annotations

import math
from typing import Any

import click

from ..fidelity.model_checks import check_attn_implementation, check_model_dir, check_seed
from ..planner._policy import resolve_scheduling_policy
from ..planner._slo import SLO
from ..sim.simulator import policy_to_dict
from ..sim.traces import read_trace
from ..sim.workloads import Workload
from .errors import InputError, library_errors
from .files import check_files
from .notices import warn_no_op_options
from .options import (
    compose,
    objective_options,
    options_from,
    scheduling_options,
    with_objectives_from,
)

SCHEDULERS = ("stepplanner", "fifo", "prefill_first")

engine_options = compose(
    click.option(
        "--max-batch-size",
        "-B",
        "max_batch_size",
        type=int,
        default=8,
        show_default=True,
        help="B: the runtime's max_requests_per_batch.",
    ),
    click.option(
        "--kv-page-size",
        type=int,
        default=16,
        show_default=True,
        help="P: the runtime's page_size.",
    ),
    click.option(
        "--max-step-tokens",
        type=int,
        default=256,
        show_default=True,
        help="The runtime's max_batch_tokens.",
    ),
    click.option(
        "--max-input-length",
        type=int,
        default=512,
        show_default=True,
        help="S_in: a longer prompt in the trace is an error before anything runs.",
    ),
    click.option(
        "--num-blocks",
        type=int,
        default=512,
        show_default=True,
        help="The runtime's KV cache, in pages.",
    ),
)

model_options = compose(
    click.option(
        "--model",
        "model_path",
        type=click.Path(exists=True, file_okay=False),
        default=None,
        help="A local model directory (nothing is downloaded); default: a random Llama "
        "of the sizes below.",
    ),
    click.option("--hidden-size", type=int, default=256, show_default=True),
    click.option("--intermediate-size", type=int, default=688, show_default=True),
    click.option("--layers", "num_hidden_layers", type=int, default=4, show_default=True),
    click.option("--heads", "num_attention_heads", type=int, default=4, show_default=True),
    click.option("--kv-heads", "num_key_value_heads", type=int, default=2, show_default=True),
    click.option("--vocab-size", type=int, default=512, show_default=True),
    click.option(
        "--model-seed", type=int, default=0, show_default=True, help="Seed of the random weights."
    ),
    click.option(
        "--attn-implementation",
        default="sdpa",
        show_default=True,
        help="sdpa or paged|eager (or a flash implementation where installed): a name "
        "transformers' AttentionInterface holds, or eager.",
    ),
)


@click.command("serve-trace")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False), required=False)
@click.option(
    "--columns", default=None, help="Which trace columns hold what (as simulate --columns)."
)
@click.option(
    "--scheduler",
    type=click.Choice(SCHEDULERS),
    default="stepplanner",
    show_default=True,
    help="Who plans each step: stepplanner (with the scheduling options below) or "
    "transformers' own fifo / prefill_first.",
)
@scheduling_options
@objective_options
@engine_options
@model_options
@click.option(
    "--results",
    "results_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Per-request results (JSON, vLLM's --save-result --save-detailed layout plus "
    "request_ids, arrival_times, priorities, e2els and a 'stepplanner' object).",
)
@click.option(
    "--timings",
    "timings_path",
    type=click.Path(dir_okay=False),
    required=True,
    help="Per-step timings (CSV with the columns calibrate reads).",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Time a grid of step shapes (decode-only, chunk-only, mixed) instead of "
    "serving TRACE; writes --timings only.",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="--profile: times through the grid.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the prompts' random token ids."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="torch intra-op threads.",
)
@library_errors
def serve_trace_command(
    trace: str | None,
    columns: str | None,
    scheduler: str,
    results_path: str | None,
    timings_path: str,
    profile: bool,
    repeats: int,
    seed: int,
    threads: int,
    model_path: str | None,
    **kw: Any,
) -> None:
    """Serve TRACE through transformers' continuous batching at its own arrival times and write
    what the runtime timed (or, with --profile, time a grid of step shapes)."""
    if profile and trace:
        raise InputError("--profile times a grid of step shapes; it serves no TRACE (drop one)")
    if not profile and (not trace or not results_path):
        raise InputError("serving needs a TRACE and --results FILE (or --profile)")
    if profile and scheduler != "stepplanner":
        raise InputError(
            f"--profile runs under --scheduler stepplanner (its MIXED steps are the "
            f"shapes the grid needs); got --scheduler {scheduler}"
        )
    check_files({"--results": results_path, "--timings": timings_path}, {"TRACE": trace})
    # What torch and transformers would refuse with a traceback, checked without them.
    check_seed("--model-seed", kw["model_seed"])
    check_attn_implementation("--attn-implementation", kw["attn_implementation"])
    if model_path is not None:
        check_model_dir("--model", model_path)
    options = options_from(kw)
    # The trace and its objectives are checked before the runtime is imported or started. The
    # objectives travel with the workload into the results file (ttft_slos, tpot_slos); how the
    # runtime's scheduler takes them is the integration's.
    workload = (
        None
        if profile
        else with_objectives_from(kw, read_trace(str(trace), columns), embedded=False)
    )
    try:
        from ..fidelity import harness  # the transformers extra: only now
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None

    engine = harness.EngineSpec(
        *(
            kw.pop(k)
            for k in (
                "max_batch_size",
                "kv_page_size",
                "max_step_tokens",
                "num_blocks",
                "max_input_length",
            )
        )
    )
    model = harness.ModelSpec(
        **{k: kw.pop(k) for k in harness.MODEL_SIZES},
        seed=kw.pop("model_seed"),
        attn_implementation=kw.pop("attn_implementation"),
        path=model_path,
    )
    policy = resolve_scheduling_policy(options, engine.limits())  # checked before any run
    if profile:
        name = _register(options, {}, engine.max_input_length)
        steps = harness.profile_engine(
            model, engine, name, repeats=repeats, seed=seed, threads=threads
        )
        harness.write_timings(steps, timings_path)
        click.echo(f"{len(steps)} steps profiled; timings written to {timings_path}")
        return
    assert workload is not None
    ids = [f"req_{i}" for i in range(len(workload))]
    described: dict[str, Any] | None = None  # transformers' own schedulers: no policy
    name = scheduler
    if scheduler == "stepplanner":
        warn_no_op_options(options, policy)
        name = _register(
            options,
            dict(zip(ids, workload.priority.tolist())),
            engine.max_input_length,
            dict(zip(ids, _objectives(workload))),
        )
        described = policy_to_dict(policy)
    run = harness.serve_trace(
        workload,
        model,
        engine,
        name,
        policy=described,
        request_ids=ids,
        seed=seed,
        threads=threads,
        trace=trace,
        timings=timings_path,
    )
    run.write_results(str(results_path))
    run.write_timings(timings_path)
    _summary(run.results(), str(results_path), timings_path, len(run.steps))


def _register(
    options: Any,
    priority: dict[str, int],
    max_input_length: int,
    slo: dict[str, SLO | None] | None = None,
) -> str:
    from ..integrations.transformers import register  # the transformers extra: only now

    return register(
        options,
        name="stepplanner-serve-trace",
        priority=priority,
        max_input_length=max_input_length,
        slo=slo,
    )


def _objectives(workload: Workload) -> list[SLO | None]:
    """Each request's objectives as the runtime's scheduler takes them (its own, else its
    class's; None: none), so the engine ranks by the deadlines the results are judged by."""
    if not workload.has_objectives:
        return [None] * len(workload)
    ttft, tpot = workload.objectives()
    return [
        None if math.isnan(a) else SLO(a, None if math.isnan(b) else b)
        for a, b in zip(ttft.tolist(), tpot.tolist())
    ]


def _summary(data: dict[str, Any], results_path: str, timings_path: str, steps: int) -> None:
    click.echo(
        f"{data['completed']}/{data['num_prompts']} requests completed in "
        f"{data['duration']:.2f} s ({data['request_throughput']:.2f} req/s, "
        f"{data['output_throughput']:.1f} output tok/s) over {steps} steps"
    )
    ok = [i for i, e in enumerate(data["errors"]) if not e]
    # the results' own percentiles; a series with no request in it is not printed
    has_tpot = any(data["output_lens"][i] > 1 for i in ok)
    for label, key, shown in (
        ("TTFT", "ttft", ok),
        ("TPOT", "tpot", has_tpot),
        ("E2E", "e2el", ok),
    ):
        if shown:
            click.echo(
                f"{label} ms p50 {data[f'p50_{key}_ms']:.1f}  "
                f"p90 {data[f'p90_{key}_ms']:.1f}  p99 {data[f'p99_{key}_ms']:.1f}"
            )
    for e in sorted({e for e in data["errors"] if e})[:5]:
        click.echo(f"failed: {e}", err=True)
    click.echo(f"results written to {results_path}; timings to {timings_path}")
