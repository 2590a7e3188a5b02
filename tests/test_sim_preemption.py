"""The simulator's KV-pressure preemption (``sim.preemption``): pages taken as KV grows, a
victim preempted by the run's rule when a step would outgrow the pool, its computed tokens
counted as recomputed; every request still gets exactly its output."""

from __future__ import annotations

import numpy as np
import pytest

from stepplanner import PreemptionMode, SchedulingOptions, SchedulingPolicy, StepPlannerLimits
from stepplanner.sim.engine import Engine, RunSpec, Speculation
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.paged import simulate_paged_run
from stepplanner.sim.workloads import Workload, synthetic

MODEL = LatencyModel(1e-3, 1e-5, 0.0, "test")
SMALL = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=4)


def two(first_prompt: int, second_prompt: int, priorities=(0, 0)) -> Workload:
    return Workload(
        np.array([0.0, 0.0005]),
        np.array([first_prompt, second_prompt]),
        np.array([30, 30]),
        np.array(priorities),
        "two",
    )


def run(workload, rule, pages=12, limits=SMALL, options=None):
    engine = Engine(limits, options, MODEL, num_pages=pages, kv_preemption=rule)
    return simulate_paged_run(RunSpec(workload, engine))


@pytest.mark.parametrize(
    ("rule", "victim"),
    [("vllm", 1), ("least-work", 0)],  # vLLM: the one admitted last; least-work: the shorter
)
def test_the_rules_pick_their_victims(rule, victim):
    # Both admitted (2 + 4 pages of 12), both decode until their 8 + 16 + 2k tokens outgrow
    # the 48 the pool holds: then one is preempted, and runs again once the other is done.
    result, occupancy = run(two(8, 16), rule)
    assert result.preempted[victim] >= 1
    assert result.preempted[1 - victim] == 0
    assert result.recomputed_tokens[1 - victim] == 0
    # It had computed its prompt and the tokens it fed back before the pool ran out.
    prompt = int(result.workload.prompt_tokens[victim])
    assert result.recomputed_tokens[victim] > prompt
    assert np.array_equal(result.generated, result.workload.output_tokens)
    assert occupancy.in_use.max() <= 12
    report = result.report()["preemption"]
    assert report["victim_rule"] == rule
    assert report["recomputed_tokens"] == int(result.recomputed_tokens.sum())
    assert report["overcommitted_steps"] == 0


def test_least_work_never_takes_a_protected_class_while_another_will_do():
    # The shorter one (less work lost) is of the urgent class (-1 < never_relegate_below 0).
    result, _ = run(two(8, 16, priorities=(-1, 0)), "least-work")
    assert result.preempted[0] == 0 and result.preempted[1] >= 1
    assert result.preemption_counts["protected_preemptions"] == 0
    # vLLM's rule under PRIORITY: the lowest priority (the larger value) whatever the work.
    prio = SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY)
    result, _ = run(two(16, 8, priorities=(1, 0)), "vllm", options=prio)
    assert result.preempted[0] >= 1 and result.preempted[1] == 0


def test_without_a_rule_nothing_is_preempted_and_worst_cases_are_reserved():
    result, occupancy = run(two(8, 16), None, pages=30)
    assert result.kv_preemption is None and "preemption" not in result.report()
    assert occupancy.reserved.max() <= 30


@pytest.mark.parametrize("policy", ["fcfs", "priority", "deadline"])
def test_under_pressure_least_work_recomputes_less_and_everyone_finishes(policy):
    limits = StepPlannerLimits(max_batch_size=32, max_input_length=4096, kv_page_size=32)
    w = synthetic(300, 20.0, seed=2, max_prompt=2048, max_output=1024)
    pause = policy != "fcfs"
    options = SchedulingOptions(
        scheduling_policy=SchedulingPolicy[policy.upper()],
        preemption=PreemptionMode.PAUSE if pause else PreemptionMode.NONE,
        max_pause_steps=8 if pause else 0,
    )
    recomputed = {}
    for rule in ("vllm", "least-work"):
        result, occupancy = run(w, rule, pages=300, limits=limits, options=options)
        assert not result.refused.any()
        assert np.array_equal(result.generated, w.output_tokens)
        assert occupancy.in_use.max() <= 300
        assert result.preemption_counts["overcommitted_steps"] == 0
        assert result.preempted.sum() > 10
        recomputed[rule] = int(result.recomputed_tokens.sum())
    assert recomputed["least-work"] < recomputed["vllm"]


def test_a_request_too_big_for_the_pool_is_refused_not_dropped():
    w = Workload(
        np.zeros(2), np.array([8, 60]), np.array([4, 30]), np.zeros(2, dtype=np.int64), "big"
    )
    result, occupancy = run(w, "least-work", pages=12)  # 60 + 30 tokens need 23 pages
    assert result.refused.tolist() == [False, True]
    assert occupancy.report()["refused_for_pages"] == 1
    assert result.generated[0] == 4


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"kv_preemption": "lru"}, "kv_preemption='lru' is not a victim rule"),
        ({"kv_preemption": "vllm", "num_pages": 0}, "needs a page pool"),
        (
            {"kv_preemption": "vllm", "num_pages": 10, "speculation": Speculation(2, 0.5)},
            "with speculation",
        ),
    ],
)
def test_bad_engines_are_refused_naming_the_field(changes, text):
    with pytest.raises(ValueError, match=text):
        Engine(SMALL, None, MODEL, **changes)
