"""The real-engine harness (``stepplanner serve-trace``) on transformers' continuous batching.

A tiny random Llama serves short traces on the CPU, scheduled by stepplanner (FCFS and
PRIORITY+PAUSE) and by transformers' own ``fifo``. Every run is checked against the trace and
against itself: every request comes back with exactly its output tokens, its timestamps run
forward from its arrival, the per-step timings file has every contract column, and the steps add
up to the work the trace asked for (every prompt token prefilled once, every later token decoded
once). ``calibrate`` then reads that timings file and ``simulate`` runs with the model it fits.

Without torch/transformers this module skips, unless STEPPLANNER_REQUIRE_INTEGRATIONS=1 (CI), which
turns the missing runtime into an import error: a failure, never a skip.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import time
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import stepplanner as sp
from stepplanner.cli import main
from stepplanner.sim.latency_models import STEP_TIMING_COLUMNS, read_step_timings
from stepplanner.sim.simulator import policy_to_dict
from stepplanner.sim.workloads import Workload

REQUIRED = os.environ.get("STEPPLANNER_REQUIRE_INTEGRATIONS") == "1"
try:
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from stepplanner.fidelity import harness
    from stepplanner.integrations.transformers import register
except ImportError as exc:
    if REQUIRED:
        raise ImportError(
            f"STEPPLANNER_REQUIRE_INTEGRATIONS=1 but the transformers harness "
            f"cannot be imported: {exc}"
        ) from exc
    pytest.skip(f"transformers harness not installed: {exc}", allow_module_level=True)

TINY = harness.ModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=97,
    seed=7,
)
ENGINE = harness.EngineSpec(
    max_batch_size=4, kv_page_size=8, max_step_tokens=64, num_blocks=128, max_input_length=96
)
VLLM_LISTS = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "errors",
    "generated_texts",
)
OURS = ("request_ids", "arrival_times", "priorities", "e2els")


def short_trace(n: int = 12, seed: int = 3) -> Workload:
    """``n`` requests over about half a second: prompts long enough to be chunked (> 64 tokens)
    and short, outputs 1..9 tokens (one-token outputs included), three priority classes."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 0.5, n))
    arrivals[0] = 0.0
    prompts = rng.integers(1, 97, n)
    prompts[:2] = (96, 1)
    outputs = rng.integers(1, 10, n)
    outputs[2] = 1
    return Workload(
        arrivals,
        prompts,
        outputs,
        rng.choice([-1, 0, 1], n).astype(np.int32),
        source="short test trace",
    )


def stepplanner_scheduler(options: sp.SchedulingOptions, workload: Workload) -> tuple[str, Any]:
    ids = [f"req_{i}" for i in range(len(workload))]
    name = register(
        options,
        name="harness-test",
        priority=dict(zip(ids, workload.priority.tolist())),
        max_input_length=ENGINE.max_input_length,
    )
    return name, sp.resolve_scheduling_policy(options, ENGINE.limits())


def check_run(run: Any, workload: Workload, tmp_path: pathlib.Path) -> dict[str, Any]:
    results_path, timings_path = tmp_path / "results.json", tmp_path / "steps.csv"
    run.write_results(results_path)
    run.write_timings(timings_path)
    data = json.loads(results_path.read_text())
    n = len(workload)
    # every request back, whole
    assert data["completed"] == n and data["failed"] == 0
    assert data["errors"] == [""] * n
    for key in VLLM_LISTS + OURS:
        assert len(data[key]) == n, key
    assert data["output_lens"] == workload.output_tokens.tolist()
    assert data["input_lens"] == workload.prompt_tokens.tolist()
    assert data["priorities"] == workload.priority.tolist()
    assert data["request_ids"] == [f"req_{i}" for i in range(n)]
    # timestamps monotone: arrivals in trace order, each request's tokens after its arrival
    arrivals = np.array(data["arrival_times"])
    assert arrivals[0] >= 0 and np.all(np.diff(arrivals) >= 0)
    assert np.all(arrivals >= workload.arrival_time - workload.arrival_time[0] - 1e-6)
    for i in range(n):
        ttft, itl, e2e = data["ttfts"][i], data["itls"][i], data["latencies"][i]
        assert ttft > 0 and len(itl) == data["output_lens"][i] - 1
        assert all(gap >= 0 for gap in itl)
        assert e2e == pytest.approx(ttft + sum(itl), abs=1e-9)
        assert data["e2els"][i] == e2e
    assert data["duration"] >= max(a + e for a, e in zip(arrivals, data["latencies"])) - 1e-9
    assert data["stepplanner"]["format"] == harness.RESULTS_FORMAT
    # the timings file: every contract column, one row per step, the work adds up
    with timings_path.open() as f:
        header = next(csv.reader(f))
    assert header[: len(STEP_TIMING_COLUMNS)] == list(STEP_TIMING_COLUMNS)
    steps = read_step_timings(timings_path)
    assert len(steps) == len(run.steps) > 0
    assert np.all(steps.seconds > 0)
    assert steps.prefill_tokens.sum() == workload.prompt_tokens.sum()
    assert steps.decode_rows.sum() == (workload.output_tokens - 1).sum()
    assert np.all(steps.tokens == steps.prefill_tokens + steps.decode_rows)
    assert np.all(steps.rows <= ENGINE.max_batch_size)
    assert np.all(steps.tokens <= ENGINE.max_step_tokens)
    assert np.all(steps.attention >= steps.tokens)
    starts = np.array([s["start"] for s in run.steps])
    assert np.all(np.diff(starts) > 0)  # the steps follow each other, never overlap
    assert np.all(starts[1:] >= starts[:-1] + steps.seconds[:-1] - 1e-9)
    return data


@pytest.mark.parametrize(
    "options",
    [
        sp.SchedulingOptions(ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED, max_num_tokens=64),
        sp.SchedulingOptions(
            ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
            max_num_tokens=64,
            scheduling_policy=sp.SchedulingPolicy.PRIORITY,
            preemption=sp.PreemptionMode.PAUSE,
            max_pause_steps=3,
            priority_reserved_slots=1,
        ),
    ],
    ids=["fcfs", "priority-pause"],
)
def test_stepplanner_serves_a_short_trace(
    options: sp.SchedulingOptions, tmp_path: pathlib.Path
) -> None:
    workload = short_trace()
    name, policy = stepplanner_scheduler(options, workload)
    run = harness.serve_trace(workload, TINY, ENGINE, name, policy=policy_to_dict(policy))
    data = check_run(run, workload, tmp_path)
    assert data["stepplanner"]["options"] == policy_to_dict(policy)
    assert data["stepplanner"]["limits"]["max_step_tokens"] == 64
    # a chunked prompt: the 96-token one cannot fit one 64-token step
    steps = read_step_timings(tmp_path / "steps.csv")
    assert np.any(steps.prefill_context > steps.prefill_tokens)


def test_transformers_fifo_serves_a_short_trace(tmp_path: pathlib.Path) -> None:
    workload = short_trace(seed=4)
    run = harness.serve_trace(workload, TINY, ENGINE, "fifo")
    data = check_run(run, workload, tmp_path)
    assert data["stepplanner"]["scheduler"] == "fifo" and data["stepplanner"]["options"] is None


def test_arrivals_follow_the_trace_clock(tmp_path: pathlib.Path) -> None:
    # Requests 0.3 s apart: each is submitted at its time, not in a burst at the start.
    workload = Workload(
        np.array([0.0, 0.3, 0.6]),
        np.array([5, 5, 5]),
        np.array([2, 2, 2]),
        np.zeros(3, dtype=np.int32),
    )
    run = harness.serve_trace(workload, TINY, ENGINE, "fifo")
    arrivals = np.array(run.results()["arrival_times"])
    assert arrivals == pytest.approx([0.0, 0.3, 0.6], abs=0.1)


def test_given_prompts_with_a_shared_prefix_are_served_and_the_cache_spares_it() -> None:
    # Two requests with the same 48-token prefix, the second arriving once the first is done:
    # with prefix sharing the engine computes the second's prefix pages once, not twice.
    prefix = list(range(3, 51))
    prompts = [prefix + [60, 61], prefix + [70, 71, 72]]
    workload = Workload(
        np.array([0.0, 1.0]), np.array([50, 51]), np.array([2, 2]), np.zeros(2, dtype=np.int32)
    )
    computed = {}
    for sharing in (False, True):
        engine = harness.EngineSpec(
            ENGINE.max_batch_size,
            ENGINE.kv_page_size,
            ENGINE.max_step_tokens,
            ENGINE.num_blocks,
            ENGINE.max_input_length,
            prefix_sharing=sharing,
        )
        run = harness.serve_trace(workload, TINY, engine, "fifo", prompts=prompts)
        assert run.results()["completed"] == 2
        computed[sharing] = sum(int(step["prefill_tokens"]) for step in run.steps)
    assert computed[False] == 101
    assert computed[True] <= 101 - 48  # the prefix's six whole pages of 8 reused
    with pytest.raises(ValueError, match="prompts: their lengths differ"):
        harness.serve_trace(workload, TINY, ENGINE, "fifo", prompts=[prefix, prefix])
    with pytest.raises(TypeError, match="EngineSpec.prefix_sharing must be a bool, got str"):
        harness.EngineSpec(prefix_sharing="yes")  # type: ignore[arg-type]


def test_serve_trace_refuses_what_the_engine_cannot_hold() -> None:
    long = Workload(np.zeros(1), np.array([97]), np.array([1]), np.zeros(1, dtype=np.int32))
    with pytest.raises(
        ValueError,
        match=r"trace row 0: prompt_tokens=97 exceeds "
        r"max_input_length=96",
    ):
        harness.serve_trace(long, TINY, ENGINE, "fifo")
    with pytest.raises(
        ValueError,
        match=r"ModelSpec.hidden_size=30 is not a multiple of "
        r"num_attention_heads=4",
    ):
        harness.ModelSpec(hidden_size=30)
    with pytest.raises(ValueError, match="EngineSpec.num_blocks=0 is out of range"):
        harness.EngineSpec(num_blocks=0)
    # what torch.manual_seed and the model's construction would refuse with a traceback
    with pytest.raises(ValueError, match=f"ModelSpec.seed={2**70} is out of range"):
        harness.ModelSpec(seed=2**70)
    with pytest.raises(
        ValueError,
        match="ModelSpec.attn_implementation='bogus' is not an "
        "attention implementation transformers accepts",
    ):
        harness.ModelSpec(attn_implementation="bogus")


def test_profile_covers_decode_chunk_and_mixed_steps() -> None:
    name, _ = stepplanner_scheduler(
        sp.SchedulingOptions(ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED, max_num_tokens=64),
        short_trace(),
    )
    rows = harness.profile_engine(
        TINY, ENGINE, name, batches=(1, 4), contexts=(8, 80), chunks=(8, 40), decode_steps=4
    )
    decode_only = {r["rows"] for r in rows if r["prefill_tokens"] == 0}
    assert {1, 4} <= decode_only
    chunk_pasts = {
        r["prefill_context"] - r["prefill_tokens"]
        for r in rows
        if r["decode_rows"] == 0 and r["prefill_tokens"]
    }
    assert 0 in chunk_pasts and max(chunk_pasts) >= 64  # a chunk at past 0 and one past a step
    mixed = [r for r in rows if r["decode_rows"] and r["prefill_tokens"]]
    assert {r["decode_rows"] for r in mixed} >= {1, 3}


def test_cli_serve_calibrate_simulate(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "trace.csv"
    w = short_trace(8, seed=5)
    trace.write_text(
        "arrival_time,prompt_tokens,output_tokens,priority\n"
        + "\n".join(
            f"{a!r},{p},{o},{q}"
            for a, p, o, q in zip(
                w.arrival_time.tolist(), w.prompt_tokens, w.output_tokens, w.priority
            )
        )
        + "\n"
    )
    results, steps, model = tmp_path / "r.json", tmp_path / "s.csv", tmp_path / "m.json"
    runner = CliRunner()
    sizes = [
        "--hidden-size",
        "32",
        "--intermediate-size",
        "64",
        "--layers",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--vocab-size",
        "97",
        "-B",
        "4",
        "--kv-page-size",
        "8",
        "--max-step-tokens",
        "64",
        "--num-blocks",
        "128",
        "--max-input-length",
        "96",
    ]
    out = runner.invoke(
        main,
        [
            "serve-trace",
            str(trace),
            "--mode",
            "mixed",
            "--max-num-tokens",
            "64",
            "--policy",
            "priority",
            "--results",
            str(results),
            "--timings",
            str(steps),
            *sizes,
        ],
    )
    assert out.exit_code == 0, out.output
    assert "8/8 requests completed" in out.output
    data = json.loads(results.read_text())
    assert data["stepplanner"]["options"]["scheduling_policy"] == "PRIORITY"
    assert data["stepplanner"]["trace"] == str(trace)
    out = runner.invoke(main, ["calibrate", str(steps), "--out", str(model)])
    assert out.exit_code == 0, out.output
    assert "fitted a=" in out.output
    out = runner.invoke(
        main,
        [
            "simulate",
            "--trace",
            str(trace),
            "--latency-model",
            str(model),
            "-B",
            "4",
            "--kv-page-size",
            "8",
            "--max-step-tokens",
            "64",
            "--max-input-length",
            "96",
            "--mode",
            "mixed",
            "--max-num-tokens",
            "64",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["requests"]["completed"] == 8
    # fidelity reads the real run, and replays its pace from the timings' start column
    out = runner.invoke(
        main,
        [
            "fidelity",
            str(results),
            "--latency-model",
            str(model),
            "--pace-from",
            str(steps),
            "--format",
            "json",
            "--no-progress",
        ],
    )
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["results"]["compared"] == 8
    pace = report["pace"]
    assert pace["windows"] >= 1 and 0 < pace["min"] <= pace["median"] <= pace["max"]
    # the options are checked before anything runs
    out = runner.invoke(main, ["serve-trace", str(trace), "--timings", str(steps)])
    assert out.exit_code == 2 and "needs a TRACE and --results FILE" in out.output


def test_a_step_begun_before_restart_is_not_counted() -> None:
    # The warm-up's last step delivers its outputs inside update_batch, so the caller may restart
    # the timer while the loop thread is still finishing that step; it must not be recorded.
    class State:
        position_offset, generated_tokens = 5, [1]

    class Future:
        state, query_length = State(), 1

    class Processor:
        class inputs_and_outputs:  # noqa: N801 - stands in for the runtime's attribute
            @staticmethod
            def prepare_batch_tensors(batch: Any, *args: Any) -> None:
                return None

        class scheduler:  # noqa: N801
            waiting_requests: dict[str, Any] = {}
            active_requests = {"r": None}

        def prepare_next_batch(self) -> bool:
            self.inputs_and_outputs.prepare_batch_tensors([Future()])
            return True

        def _generation_step(self, model: Any) -> None:
            return None

        def update_batch(self) -> None:
            return None

    class Manager:
        def _create_batch_processor(self) -> Processor:
            return Processor()

    manager = Manager()
    timer = harness.StepTimer(manager)
    processor = manager._create_batch_processor()
    for restart_before_update in (True, False):
        assert processor.prepare_next_batch()
        processor._generation_step(None)
        if restart_before_update:
            timer.restart(time.perf_counter())
        processor.update_batch()
    assert len(timer.rows) == 1 and timer.rows[0]["step"] == 0 and timer.rows[0]["start"] >= 0
    assert timer.rows[0]["decode_rows"] == 1 and timer.rows[0]["context"] == 6
