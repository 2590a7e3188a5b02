"""Simulator accounting on small seeded workloads, the latency model, and record/replay."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from stepplanner import (
    IfbSchedulingMode,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
)
from stepplanner.latency import TRTLLM_H100_LLAMA31_8B_FP8, LatencyModel
from stepplanner.simulator import StepRecorder, replay, simulate
from stepplanner.workloads import Workload, synthetic

LIMITS = StepPlannerLimits(max_batch_size=16, max_input_length=512, kv_page_size=16)
CONFIGS = {
    "fcfs": SchedulingOptions(),
    "priority_pause": SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY,
                                        preemption=PreemptionMode.PAUSE, max_pause_steps=4),
    "pause_forever": SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY,
                                       preemption=PreemptionMode.PAUSE),
    "prefill_first": SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.PREFILL_FIRST,
                                       scheduling_policy=SchedulingPolicy.PRIORITY),
    "reserved": SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY,
                                  priority_reserved_slots=4, max_num_tokens=96),
}


def _workload(seed: int = 0, requests: int = 150) -> Workload:
    return synthetic(requests=requests, rate=40.0, seed=seed, max_prompt=512, max_output=64)


class _Checker:
    """An on_step hook asserting per-step invariants and logging residency."""

    def __init__(self) -> None:
        self.seen: dict[int, list[int]] = {}
        self.context: list[int] = []
        self.starts: list[float] = []

    def __call__(self, step: int, start: float, ledger, plan) -> None:
        ids = ledger.request_ids.tolist()
        assert len(set(ids)) == len(ids) == ledger.count
        rows = plan.as_array()
        assert rows["resident"].size == 0 or rows["resident"].max() < ledger.count
        assert not set(rows["resident"].tolist()) & set(plan.paused_array().tolist())
        assert ledger.count == 0 or rows.size > 0
        for rid in ids:
            self.seen.setdefault(rid, []).append(step)
        self.context.append(int((rows["past_length"] + rows["query_length"]).sum()))
        self.starts.append(start)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_request_is_admitted_once_served_fully_and_retired_once(name: str) -> None:
    w = _workload()
    checker = _Checker()
    r = simulate(w, LIMITS, CONFIGS[name], on_step=checker)
    assert not r.truncated and not r.refused.any()
    assert not np.isnan(r.admit_time).any() and not np.isnan(r.finish_time).any()
    assert r.generated.tolist() == w.output_tokens.tolist()
    # Every prompt token and every decode token went through some step.
    assert r.steps["tokens"].sum() == w.prompt_tokens.sum() + (w.output_tokens - 1).sum()
    # Resident in one contiguous run of steps: admitted once, retired once, never re-admitted.
    for steps in checker.seen.values():
        assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert len(checker.seen) == len(w)
    lat = r.latencies()
    assert np.all(lat["ttft"] >= lat["queue"]) and np.all(lat["queue"] >= 0)
    assert np.all(r.finish_time >= r.first_token_time)
    assert np.all(np.diff(r.steps["end_time"]) > 0)
    assert np.all(np.array(checker.starts[1:]) >= r.steps["end_time"][:-1])
    assert r.steps["context"].tolist() == checker.context
    assert r.report()["requests"]["completed"] == len(w)


def test_step_time_is_the_latency_model() -> None:
    model = LatencyModel(a=1e-3, b=2e-5, c=3e-8)
    r = simulate(_workload(requests=40), LIMITS, latency=model)
    expected = 1e-3 + 2e-5 * r.steps["tokens"] + 3e-8 * r.steps["context"]
    assert np.allclose(r.steps["seconds"], expected, rtol=1e-12)


def test_pause_counts_and_releases_are_reported() -> None:
    w = synthetic(requests=300, rate=80.0, seed=5, max_prompt=512, max_output=64)
    forever = simulate(w, LIMITS, CONFIGS["pause_forever"]).report()
    capped = simulate(w, LIMITS, SchedulingOptions(
        scheduling_policy=SchedulingPolicy.PRIORITY, preemption=PreemptionMode.PAUSE,
        max_pause_steps=1)).report()
    assert forever["pauses"]["paused_resident_steps"] > 0
    assert forever["pauses"]["max_consecutive_paused_steps"] > 1
    assert forever["pauses"]["released_by_max_pause_steps"] == 0
    assert capped["pauses"]["max_consecutive_paused_steps"] == 1
    assert capped["pauses"]["released_by_max_pause_steps"] > 0
    assert forever["reasons"]["PAUSED"] == forever["pauses"]["paused_resident_steps"]


def test_priority_serves_the_urgent_class_first_under_load() -> None:
    w = synthetic(requests=300, rate=80.0, seed=1, max_prompt=512, max_output=64)
    fcfs = simulate(w, LIMITS, CONFIGS["fcfs"]).report()["latency_s"]
    prio = simulate(w, LIMITS, CONFIGS["priority_pause"]).report()["latency_s"]
    assert prio["-1"]["ttft"]["p90"] < fcfs["-1"]["ttft"]["p90"]
    assert prio["1"]["ttft"]["p90"] > prio["-1"]["ttft"]["p90"]


def test_too_long_prompts_are_refused_and_counted_never_dropped_silently() -> None:
    w = Workload(np.array([0.0, 0.1, 0.2]), np.array([100, 513, 50]), np.array([3, 3, 3]),
                 np.array([0, 0, 0]))
    r = simulate(w, LIMITS)
    assert r.refused.tolist() == [False, True, False]
    rep = r.report()["requests"]
    assert rep == {"submitted": 3, "refused": 1, "admitted": 2, "completed": 2}
    assert np.isnan(r.finish_time[1]) and not np.isnan(r.finish_time[[0, 2]]).any()


def test_max_steps_truncates_and_says_so() -> None:
    r = simulate(_workload(), LIMITS, max_steps=25)
    assert r.num_steps == 25 and r.truncated
    assert r.report()["steps"]["truncated_by_max_steps"]


def test_one_token_outputs_finish_on_their_final_chunk() -> None:
    w = Workload(np.array([0.0]), np.array([40]), np.array([1]), np.array([0]))
    r = simulate(w, LIMITS)
    assert r.num_steps == 1 and r.finish_time[0] == r.first_token_time[0]
    assert np.isnan(r.latencies()["tpot"][0])


def test_report_is_json_ready_and_has_per_class_percentiles() -> None:
    rep = simulate(_workload(), LIMITS).report()
    json.dumps(rep)
    assert set(rep["latency_s"]) == {"all", "-1", "0", "1"}
    assert set(rep["latency_s"]["0"]["ttft"]) == {"p50", "p90", "p99"}
    assert rep["planner"]["mean_step_us"] > 0 and rep["planner"]["steps_per_s"] > 0


def test_record_then_replay_matches_and_a_tampered_record_differs() -> None:
    out = io.StringIO()
    policy_options = CONFIGS["priority_pause"]
    from stepplanner import resolve_scheduling_policy
    policy = resolve_scheduling_policy(policy_options, LIMITS)
    recorder = StepRecorder(out, LIMITS, policy)
    simulate(_workload(), LIMITS, policy, on_step=recorder, max_steps=80)
    lines = out.getvalue().splitlines()
    assert len(lines) == 81 and recorder.steps == 80
    clean = replay(lines)
    assert clean.steps == 80 and clean.diffs == []
    step = json.loads(lines[10])
    step["plan"]["sequences"][0]["query_length"] += 1
    lines[10] = json.dumps(step)
    tampered = replay(lines)
    assert [d["step"] for d in tampered.diffs] == [9]
    assert any("sequences[0]" in text for text in tampered.diffs[0]["differences"])


@pytest.mark.parametrize(("lines", "match"), [
    ([], "expected the header"),
    (['{"type": "header", "format": "other/9"}'], "format='other/9' is not known"),
    (['{"type": "header", "format": "stepplanner-steps/1", "limits": {}, "policy": {}}'],
     "bad limits/policy"),
])
def test_replay_rejects_bad_records(lines: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replay(lines)


def test_latency_model_parse_validation_and_source_fit() -> None:
    assert LatencyModel.parse("a=0.001, c=1e-9") == LatencyModel(a=0.001, c=1e-9, name="custom")
    with pytest.raises(ValueError, match="latency item 'd=1' is not known"):
        LatencyModel.parse("d=1")
    with pytest.raises(ValueError, match=r"LatencyModel.b=-1"):
        LatencyModel(b=-1)
    with pytest.raises(TypeError, match="LatencyModel.a must be a number"):
        LatencyModel(a="1")  # type: ignore[arg-type]
    # The default b, c reproduce the published rows they were fitted to within 6%.
    m = LatencyModel()
    for isl, osl, tok_s in TRTLLM_H100_LLAMA31_8B_FP8:
        per_request = m.b * (isl + osl) + m.c * (isl + osl * isl + osl * osl / 2)
        assert abs(per_request / (osl / tok_s) - 1) < 0.065


def test_simulate_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="workload must be a Workload"):
        simulate([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps=0"):
        simulate(_workload(), LIMITS, max_steps=0)
    with pytest.raises(ValueError, match="priority_reserved_slots=16"):
        simulate(_workload(), LIMITS, SchedulingOptions(priority_reserved_slots=16))
