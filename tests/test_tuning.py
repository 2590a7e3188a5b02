"""SLOs, goodput, grids, the Pareto front, capacity bisection and the serial/process backends."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from stepplanner import SchedulingOptions, StepPlannerLimits, Workload, synthetic
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.simulator import DEFAULT_LIMITS, simulate
from stepplanner.tuning import (
    STABILITY,
    ScaledTrace,
    SloTarget,
    find_capacity,
    good_requests,
    goodput,
    pareto_front,
    parse_grid,
    parse_percentiles,
    parse_queue_delay,
    parse_slo,
    parse_slos,
    run_tasks,
    slo_report,
    sweep,
)
from stepplanner.tuning.capacity import capacity
from stepplanner.tuning.grid import expand_grid, grid_size
from stepplanner.tuning.metrics import vllm_metrics

# --- SLO parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ttft_p99=200ms", SloTarget("ttft", 99.0, 0.2)),
        ("TPOT_P90 = 0.05s", SloTarget("tpot", 90.0, 0.05)),
        ("e2e_p50@-1=2s", SloTarget("e2e", 50.0, 2.0, -1)),
        ("queue_p99.9@1=1500us", SloTarget("queue", 99.9, 1.5e-3, 1)),
        ("max_itl_p99=1e2ms", SloTarget("max_itl", 99.0, 0.1)),
    ],
)
def test_parse_slo(text: str, expected: SloTarget) -> None:
    got = parse_slo(text)
    assert (got.metric, got.percentile, got.priority) == (
        expected.metric,
        expected.percentile,
        expected.priority,
    )
    assert got.seconds == pytest.approx(expected.seconds)


def test_slo_key_round_trips() -> None:
    slo = parse_slo("ttft_p99@-1=200ms")
    assert slo.key == "ttft_p99@-1"
    assert str(slo) == "ttft_p99@-1=200ms"
    assert parse_slo(str(slo)) == slo


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("ttft=200ms", "METRIC_pN"),
        ("ttft_p99", "METRIC_pN"),
        ("latency_p99=1s", "metric 'latency' is not known"),
        ("ttft_p99=200", "ms, s or us"),
        ("ttft_p99=fast", "ms, s or us"),
        ("ttft_p0=1s", "0 < p <= 100"),
        ("ttft_p101=1s", "0 < p <= 100"),
        ("ttft_p99@x=1s", "METRIC_pN"),
    ],
)
def test_parse_slo_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")) as info:
        parse_slo(text)
    assert text.split("=")[0].strip() in str(info.value) or "METRIC" in str(info.value)


def test_parse_slos_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="ttft_p99 is given twice"):
        parse_slos(["ttft_p99=1s", "ttft_p99=2s"])
    assert len(parse_slos(["ttft_p99=1s", "ttft_p99@-1=2s"])) == 2


def test_parse_percentiles() -> None:
    assert parse_percentiles("50,90,99") == (50.0, 90.0, 99.0)
    assert parse_percentiles("99.9") == (99.9,)
    for bad in ("", "0", "101", "x"):
        with pytest.raises(ValueError, match="percentile"):
            parse_percentiles(bad)


# --- goodput and SLO checks on hand-built results ------------------------------------------


def _hand_built() -> dict[str, np.ndarray]:
    # five requests: priorities, completion, and their own latencies (seconds)
    return {
        "priority": np.array([-1, -1, 0, 0, 0]),
        "completed": np.array([True, True, True, True, False]),
        "output_tokens": np.array([10, 1, 10, 10, 10]),
        "ttft": np.array([0.1, 0.3, 0.2, 0.5, np.nan]),
        "tpot": np.array([0.01, np.nan, 0.03, 0.01, np.nan]),
        "e2e": np.array([1.0, 0.3, 2.0, 3.0, np.nan]),
        "queue": np.array([0.0, 0.0, 0.1, 0.2, 0.5]),
        "max_itl": np.array([0.02, np.nan, 0.05, 0.02, np.nan]),
    }


def test_goodput_counts_requests_within_every_threshold() -> None:
    h = _hand_built()
    slos = parse_slos(["ttft_p99=250ms", "tpot_p99=20ms"])
    good = good_requests(slos, h, h["priority"], h["completed"])
    # 0: ok; 1: ttft 0.3 > 0.25; 2: tpot 0.03 > 0.02; 3: ttft 0.5; 4: not completed
    assert good.tolist() == [True, False, False, False, False]
    assert goodput(slos, h, h["priority"], h["completed"], 2.0) == pytest.approx(0.5)


def test_goodput_class_restricted_threshold_and_one_token_output() -> None:
    h = _hand_built()
    # Only class -1 is held to TTFT 350 ms; request 1 has one output token, so its missing TPOT
    # passes the TPOT threshold (vLLM counts it as 0).
    slos = parse_slos(["ttft_p99@-1=350ms", "tpot_p50=15ms"])
    good = good_requests(slos, h, h["priority"], h["completed"])
    assert good.tolist() == [True, True, False, True, False]
    assert goodput(slos, h, h["priority"], h["completed"], 4.0) == pytest.approx(0.75)


def test_goodput_without_slos_is_completed_per_second() -> None:
    h = _hand_built()
    assert goodput((), h, h["priority"], h["completed"], 2.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="simulated_seconds"):
        goodput((), h, h["priority"], h["completed"], 0.0)


def test_slo_report_counts_unfinished_requests_as_infinitely_late() -> None:
    h = _hand_built()
    rows = slo_report(
        parse_slos(["ttft_p50=10s", "ttft_p50@-1=10s", "ttft_p99@0=10s", "tpot_p50=20ms"]),
        h,
        h["priority"],
        h["completed"],
        h["output_tokens"],
    )
    by_key = {r["slo"]: r for r in rows}
    # all five: [0.1, 0.3, 0.2, 0.5, inf] -> median 0.3
    assert by_key["ttft_p50"]["observed_s"] == pytest.approx(0.3)
    assert by_key["ttft_p50@-1"]["observed_s"] == pytest.approx(0.2)
    # class 0: [0.2, 0.5, inf]; p99 interpolates towards the infinite one
    assert math.isinf(by_key["ttft_p99@0"]["observed_s"])
    assert by_key["ttft_p99@0"]["met"] is False
    # tpot over outputs > 1 token: [0.01, 0.03, 0.01, inf] -> median 0.02
    assert by_key["tpot_p50"]["observed_s"] == pytest.approx(0.02)
    assert by_key["tpot_p50"]["met"] is True


def test_slo_for_an_absent_class_is_met_and_says_so() -> None:
    h = _hand_built()
    rows = slo_report(
        parse_slos(["ttft_p99@7=1ms"]), h, h["priority"], h["completed"], h["output_tokens"]
    )
    assert rows == [{"slo": "ttft_p99@7", "threshold_s": 0.001, "observed_s": None, "met": True}]


# --- vLLM-dialect metrics -------------------------------------------------------------------


def test_itl_pools_every_gap_and_tpot_excludes_the_first_token() -> None:
    # one request at a time (B=1), constant 10 ms steps: every gap is exactly one step
    w = Workload(np.array([0.0, 0.0]), np.array([16, 16]), np.array([4, 2]), np.array([0, 0]))
    result = simulate(
        w, StepPlannerLimits(1, 64, 16), SchedulingOptions(), LatencyModel(0.01, 0.0, 0.0)
    )
    m = vllm_metrics(result, (50, 99.9))
    assert m["completed"] == 2
    assert m["mean_ttft_ms"] == pytest.approx((10 + 50) / 2)  # second waits 4 steps, then 1
    assert m["median_tpot_ms"] == pytest.approx(10.0)
    assert m["mean_itl_ms"] == pytest.approx(10.0) and m["std_itl_ms"] == pytest.approx(0.0)
    assert m["p99.9_itl_ms"] == pytest.approx(10.0)
    assert m["p50_e2el_ms"] == pytest.approx((40 + 60) / 2)
    assert {"std_ttft_ms", "p50_tpot_ms", "mean_itl_ms", "median_e2el_ms"} <= set(m)


def test_itl_matches_every_gap_of_a_run_with_pauses() -> None:
    """The pooled ITL equals the gaps between consecutive token times of every request,
    computed here the slow way (pauses make gaps of several steps)."""
    w = synthetic(requests=120, rate=40.0, seed=11)
    opts = SchedulingOptions(scheduling_policy=1, preemption=1, max_pause_steps=8)
    emitted: dict[int, list[int]] = {}

    def note(step: int, start: float, ledger, plan) -> None:
        seq = plan.as_array()
        for req in ledger.request_ids[seq["resident"][seq["select_last_token_logits"]]]:
            emitted.setdefault(int(req), []).append(step)

    result = simulate(w, StepPlannerLimits(16, 4096, 32), opts, LatencyModel(), on_step=note)
    end = result.steps["end_time"]
    gaps = np.concatenate([np.diff(end[steps]) for steps in emitted.values()])
    m = vllm_metrics(result, (50, 90, 99))
    assert m["mean_itl_ms"] == pytest.approx(gaps.mean() * 1e3)
    assert m["std_itl_ms"] == pytest.approx(gaps.std() * 1e3)
    for p in (50, 90, 99):
        assert m[f"p{p}_itl_ms"] == pytest.approx(np.percentile(gaps, p) * 1e3)
    assert m["median_itl_ms"] == pytest.approx(np.median(gaps) * 1e3)


# --- grids ----------------------------------------------------------------------------------


def test_parse_grid_accepts_cli_and_vllm_spellings() -> None:
    grid = parse_grid(
        ["mode=mixed,prefill_first", "max-num-tokens=320,768", "max_num_seqs=8", "block_size=16"]
    )
    assert grid == {
        "ifb_scheduling_mode": ["mixed", "prefill_first"],
        "max_num_tokens": ["320", "768"],
        "max_batch_size": ["8"],
        "kv_page_size": ["16"],
    }


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("colour=red", "not a SchedulingOptions or limits field"),
        ("mode=sideways", "is not a IfbSchedulingMode"),
        ("max_num_tokens=lots", "is not an integer"),
        ("max_num_tokens=", "has no values"),
        ("max_num_tokens", "NAME=V1,V2"),
    ],
)
def test_parse_grid_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_grid([text])


def test_expand_grid_keeps_points_that_do_not_resolve() -> None:
    grid = parse_grid(["max_num_tokens=320,100", "max_chunk_tokens=64"])
    points = expand_grid(grid, DEFAULT_LIMITS, SchedulingOptions())
    assert [p.values for p in points] == [
        {"max_num_tokens": "320", "max_chunk_tokens": "64"},
        {"max_num_tokens": "100", "max_chunk_tokens": "64"},
    ]
    assert points[0].error is None and points[0].policy.max_num_tokens == 320
    assert points[1].policy is None and "max_num_tokens=100 is out of range" in points[1].error


@pytest.mark.parametrize(
    "texts",
    [[], ["mode=mixed,prefill_first"], ["max_num_tokens=320,100,768", "mode=mixed,prefill_first"]],
)
def test_grid_size_counts_the_points_expand_grid_makes(texts: list[str]) -> None:
    grid = parse_grid(texts)
    assert grid_size(grid) == len(expand_grid(grid, DEFAULT_LIMITS, SchedulingOptions()))


def test_pareto_front() -> None:
    def rec(i: int, ttft: float, tpot: float, tput: float) -> dict:
        return {
            "index": i,
            "error": None,
            "metrics": {"p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "request_throughput": tput},
        }

    records = [
        rec(0, 100, 10, 5),
        rec(1, 50, 20, 5),
        rec(2, 100, 10, 4),
        rec(3, 100, 10, 5),
        rec(4, 200, 30, 6),
        {"index": 5, "error": "bad"},
    ]
    # 2 is beaten by 0 on throughput; 0 and 3 tie (neither dominates the other)
    assert pareto_front(records) == {0, 1, 3, 4}


# --- sweeps and backends --------------------------------------------------------------------

SMALL = synthetic(requests=300, rate=30.0, seed=3)
SMALL_LIMITS = StepPlannerLimits(64, 4096, 32)
SLOS = parse_slos(["ttft_p99=300ms", "tpot_p99=25ms"])


def _small_sweep(backend: str, workers: int | None = None) -> list[dict]:
    grid = parse_grid(["mode=mixed,prefill_first", "max_num_tokens=128,320", "max_chunk_tokens=64"])
    records, outcome = sweep(
        SMALL,
        grid,
        SMALL_LIMITS,
        SchedulingOptions(),
        LatencyModel(),
        SLOS,
        (50, 90, 99),
        backend=backend,
        workers=workers,
    )
    assert not outcome.interrupted
    return records


def test_sweep_records() -> None:
    records = _small_sweep("serial")
    assert len(records) == 4
    ok = [r for r in records if r["error"] is None]
    errors = [r for r in records if r["error"] is not None]
    assert not errors  # every point is within SPEC §2's ranges for B=64, P=32
    assert [r["goodput"] for r in ok] == sorted((r["goodput"] for r in ok), reverse=True)
    for r in ok:
        assert {"options", "goodput", "throughput", "meets_slo", "metrics", "pareto"} <= set(r)
        assert r["goodput"] <= r["throughput"] + 1e-12
        assert r["meets_slo"] == all(c["met"] for c in r["slo"])
        assert {"p50_ttft_ms", "p90_tpot_ms", "p99_itl_ms", "mean_e2el_ms"} <= set(r["metrics"])
    assert any(r["pareto"] for r in ok)


def test_sweep_lists_configurations_that_do_not_resolve() -> None:
    grid = parse_grid(["max_num_tokens=50,320"])
    records, _ = sweep(
        SMALL, grid, SMALL_LIMITS, SchedulingOptions(), LatencyModel(), SLOS, backend="serial"
    )
    assert len(records) == 2
    assert records[-1]["options"] == {"max_num_tokens": "50"}
    assert "max_num_tokens=50 is out of range" in records[-1]["error"]


def test_serial_and_process_backends_give_identical_results() -> None:
    assert _small_sweep("serial") == _small_sweep("process", workers=2)


def test_run_tasks_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="backend='threads' is not known"):
        run_tasks(abs, [1], backend="threads")
    with pytest.raises(ValueError, match="workers=0"):
        run_tasks(abs, [1], backend="serial", workers=0)
    with pytest.raises(ValueError, match="needs backend='ray'"):
        run_tasks(abs, [1], backend="process", ray_address="auto")


def _interrupt_on_third(x: int) -> int:
    if x == 3:
        raise KeyboardInterrupt
    return x * 10


def test_interrupt_keeps_the_finished_results() -> None:
    outcome = run_tasks(_interrupt_on_third, [1, 2, 3, 4], backend="serial")
    assert outcome.interrupted
    assert outcome.results == [10, 20, None, None]
    assert outcome.finished == [10, 20]


def test_interrupt_in_the_parent_keeps_what_the_workers_finished() -> None:
    """Ctrl-C reaches the parent (workers ignore SIGINT): pending work is dropped, finished
    results stay, whatever finished first."""

    def tick(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    outcome = run_tasks(abs, list(range(-1, -9, -1)), backend="process", workers=2, progress=tick)
    assert outcome.interrupted
    assert len(outcome.finished) == 2
    assert all(r is None or r == k + 1 for k, r in enumerate(outcome.results))


def test_progress_is_reported_per_task() -> None:
    seen: list[tuple[int, int]] = []
    run_tasks(
        abs,
        [-1, -2, -3],
        backend="process",
        workers=2,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(1, 3), (2, 3), (3, 3)]


# --- capacity --------------------------------------------------------------------------------


@pytest.mark.parametrize("true_capacity", [0.37, 3.0, 28.0, 37.3, 500.0])
def test_find_capacity_brackets_and_bisects(true_capacity: float) -> None:
    found = find_capacity(lambda r: r <= true_capacity, start=28.0, tolerance=0.05)
    assert true_capacity - 0.05 <= found.capacity <= true_capacity
    assert found.upper is not None and found.upper > true_capacity
    assert found.upper - found.capacity <= 0.05
    assert all(ok == (r <= true_capacity) for r, ok in found.probes)


def test_find_capacity_edges() -> None:
    assert find_capacity(lambda r: False, 28.0, 0.1).capacity == 0.0
    unbounded = find_capacity(lambda r: True, 28.0, 0.1, max_rate=100.0)
    assert unbounded.capacity == 100.0 and not unbounded.bounded
    with pytest.raises(ValueError, match="tolerance=0"):
        find_capacity(lambda r: True, 28.0, 0)


def _uniform(requests: int, rate: float) -> Workload:
    n = np.arange(requests)
    return Workload(
        n / rate,
        np.full(requests, 16),
        np.ones(requests, dtype=np.int32),
        np.zeros(requests, dtype=np.int32),
        source="uniform",
    )


def test_capacity_of_a_deterministic_single_server_queue() -> None:
    """B=1, every request one 10 ms step, arrivals every 1/r s: a D/D/1 queue.

    Up to 100 req/s nobody waits (TTFT = 10 ms). Above, request k waits k(a - 1/r), so the
    TTFT p99 over 200 requests (linear interpolation at rank 197.01) is about
    a + 197.01(a - 1/r); it reaches 15 ms at r = 1 / (a - 0.005/197.01) = 100.2544 req/s.
    """
    a, n = 0.01, 200
    rank = 0.99 * (n - 1)
    known = 1 / (a - 0.005 / rank)
    records, _ = capacity(
        ScaledTrace(_uniform(n, 10.0)),
        {},
        StepPlannerLimits(1, 64, 16),
        SchedulingOptions(),
        LatencyModel(a, 0.0, 0.0),
        parse_slos(["ttft_p99=15ms"]),
        tolerance=0.02,
        backend="serial",
    )
    (record,) = records
    assert known - 0.02 - 1e-6 <= record["capacity"] <= known + 1e-6
    assert not record["unbounded"] and record["upper"] - record["capacity"] <= 0.02
    assert record["at_capacity"]["p99_ttft_ms"] <= 15.0


def test_capacity_has_a_stability_condition_by_default() -> None:
    """A TPOT-only objective holds at any rate (here: one-token outputs have no TPOT, so it holds
    trivially), so without a stability condition capacity ran to its ceiling and reported it as
    a number. With the default, median queueing delay <= 2 s, it is the D/D/1 queue's: request k
    waits k(a - 1/r), the median over 2,000 (rank 999.5) reaches 2 s at r = 1 / (a - 2/999.5)."""
    a, n = 0.01, 2000
    known = 1 / (a - 2.0 / (0.5 * (n - 1)))
    tpot_only = parse_slos(["tpot_p99=10ms"])
    args = (
        ScaledTrace(_uniform(n, 10.0)),
        {},
        StepPlannerLimits(1, 64, 16),
        SchedulingOptions(),
        LatencyModel(a, 0.0, 0.0),
        tpot_only,
    )
    (record,), _ = capacity(*args, tolerance=0.05, backend="serial")
    assert STABILITY == SloTarget("queue", 50.0, 2.0)
    assert not record["unbounded"]
    assert known - 0.05 - 1e-6 <= record["capacity"] <= known + 1e-6
    stable = record["at_capacity"]["stability"]
    assert stable["slo"] == "queue_p50" and stable["met"] and stable["observed_s"] <= 2.0
    assert record["probes"][-1]["stable"] is not None

    # Changed: Vidur's p99 <= 5 s; the p99 (rank 1979.01) of k(a - 1/r) reaches 5 s lower down.
    vidur = 1 / (a - 5.0 / (0.99 * (n - 1)))
    (record,), _ = capacity(
        *args, tolerance=0.05, backend="serial", stability=parse_queue_delay("p99=5s")
    )
    assert vidur - 0.05 - 1e-6 <= record["capacity"] <= vidur + 1e-6

    # Dropped: nothing bounds the rate; the ceiling is reported as a bound, never a capacity.
    (record,), _ = capacity(*args, max_rate=1000.0, backend="serial", stability=None)
    assert record["unbounded"] and record["capacity"] is None and record["upper"] is None
    assert record["max_rate"] == 1000.0 and record["at_capacity"]["rate"] == 1000.0
    assert record["at_capacity"]["stability"] is None
    assert all(p["meets"] and p["stable"] is None for p in record["probes"])


def test_capacity_sorts_unbounded_first() -> None:
    records, _ = capacity(
        ScaledTrace(_uniform(50, 10.0)),
        {"max_batch_size": ["1", "2"]},
        StepPlannerLimits(1, 64, 16),
        SchedulingOptions(),
        LatencyModel(0.01, 0.0, 0.0),
        parse_slos(["ttft_p99=30ms"]),
        tolerance=0.5,
        max_rate=150.0,
        backend="serial",
    )
    # B=1 queues past 100 req/s; B=2 serves 150 req/s within 20 ms (a step plus a step's wait).
    assert [r["unbounded"] for r in records] == [True, False]
    assert records[0]["options"] == {"max_batch_size": "2"}


@pytest.mark.parametrize(
    "stability, error, fragment",
    [
        (SloTarget("ttft", 50.0, 2.0), ValueError, "a bound on queueing delay over all requests"),
        (SloTarget("queue", 50.0, 2.0, -1), ValueError, "a bound on queueing delay over all"),
        ("p50=2s", TypeError, "stability must be a SloTarget on queueing delay or None, got str"),
    ],
)
def test_capacity_refuses_a_stability_condition_that_is_not_one(stability, error, fragment) -> None:
    with pytest.raises(error, match=fragment):
        capacity(
            ScaledTrace(_uniform(5, 1.0)),
            {},
            DEFAULT_LIMITS,
            SchedulingOptions(),
            LatencyModel(),
            parse_slos(["ttft_p99=1s"]),
            backend="serial",
            stability=stability,
        )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("p50=2s", SloTarget("queue", 50.0, 2.0)),
        (" P99 = 5000ms ", SloTarget("queue", 99.0, 5.0)),
        ("p99.9=1.5s", SloTarget("queue", 99.9, 1.5)),
    ],
)
def test_parse_queue_delay(text: str, expected: SloTarget) -> None:
    assert parse_queue_delay(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("50=2s", "is not pN=VALUE; e.g. p50=2s (Sarathi-Serve), p99=5s (Vidur)"),
        ("p50@-1=2s", "is not pN=VALUE"),
        ("queue_p50=2s", "is not pN=VALUE"),
        ("p50=2", "value '2' is not a duration"),
        ("p150=1s", "percentile 150.0 is out of range"),
    ],
)
def test_parse_queue_delay_refuses(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_queue_delay(text)


def test_scaled_trace_keeps_requests_and_scales_time() -> None:
    base = _uniform(11, 10.0)
    scaled = ScaledTrace(base).at(20.0)
    assert ScaledTrace(base).rate == pytest.approx(10.0)
    assert np.allclose(scaled.arrival_time, base.arrival_time / 2)
    assert np.array_equal(scaled.prompt_tokens, base.prompt_tokens)


def test_capacity_needs_an_slo_or_the_stability_condition() -> None:
    with pytest.raises(ValueError, match="at least one SLO .* or a stability condition"):
        capacity(
            ScaledTrace(_uniform(5, 1.0)),
            {},
            DEFAULT_LIMITS,
            SchedulingOptions(),
            LatencyModel(),
            (),
            backend="serial",
            stability=None,
        )
    # The stability condition alone is a capacity: the highest rate the queue stays bounded at.
    # D/D/1 as above, 1,000 requests: the median wait 499.5(a - 1/r) reaches 2 s at 166.8 req/s.
    (record,), _ = capacity(
        ScaledTrace(_uniform(1000, 10.0)),
        {},
        StepPlannerLimits(1, 64, 16),
        SchedulingOptions(),
        LatencyModel(0.01, 0.0, 0.0),
        (),
        tolerance=0.5,
        backend="serial",
    )
    known = 1 / (0.01 - 2.0 / 499.5)
    assert not record["unbounded"] and known - 0.5 - 1e-6 <= record["capacity"] <= known + 1e-6
