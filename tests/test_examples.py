"""SPEC §5's worked examples, kept as data, on both implementations and both input kinds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stepplanner import (
    IfbSchedulingMode,
    PreemptionMode,
    Reason,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlannerLimits,
    resolve_scheduling_policy,
    split_reason,
)
from stepplanner.planner.checks import check_plan
from stepplanner.testing import as_resident_array

DATA = json.loads((Path(__file__).parent / "data" / "worked_examples.json").read_text("utf-8"))
FIELDS = (
    "priority",
    "arrival",
    "prompt_length",
    "committed",
    "context_committed",
    "consecutive_paused_steps",
)
ENUMS = {
    "ifb_scheduling_mode": IfbSchedulingMode,
    "scheduling_policy": SchedulingPolicy,
    "preemption": PreemptionMode,
}


def _options(spec: dict) -> SchedulingOptions:
    return SchedulingOptions(**{k: ENUMS[k][v] if k in ENUMS else v for k, v in spec.items()})


def _rows(example: dict) -> list[tuple]:
    return [tuple(r.get(f, 0) for f in FIELDS) for r in example["residents"]]


@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize("example", DATA["plans"], ids=lambda e: e["name"])
def test_worked_example(core, example, kind):
    limits = StepPlannerLimits(**example["limits"])
    policy = resolve_scheduling_policy(_options(example["options"]), limits)
    rows = _rows(example)
    residents = (
        as_resident_array(rows) if kind == "array" else [core.ResidentState(*r) for r in rows]
    )
    reasons = np.zeros(len(rows), dtype=np.uint8)

    plan = core.StepPlanner(policy, limits).plan(residents, reasons=reasons)

    assert plan.to_dict() == example["plan"]
    assert [split_reason(c) for c in reasons] == [(Reason[n], rel) for n, rel in example["reasons"]]
    check_plan(policy, limits, residents, plan)


@pytest.mark.parametrize("example", DATA["defaults"], ids=lambda e: str(e["limits"]))
def test_default_resolution(example):
    limits = StepPlannerLimits(**example["limits"])
    policy = resolve_scheduling_policy(SchedulingOptions(), limits)
    want = example["resolved"]
    assert policy.mode == IfbSchedulingMode[want["mode"]]
    assert (policy.max_num_tokens, policy.max_chunk_tokens) == (
        want["max_num_tokens"],
        want["max_chunk_tokens"],
    )


DRAFTS = json.loads((Path(__file__).parent / "data" / "draft_examples.json").read_text("utf-8"))


@pytest.mark.parametrize("drafts_kind", ["list", "array"])
@pytest.mark.parametrize("kind", ["list", "array"])
@pytest.mark.parametrize("example", DRAFTS["plans"], ids=lambda e: e["name"])
def test_draft_example(core, example, kind, drafts_kind):
    """SPEC §8's worked examples: decode rows that verify drafts."""
    limits = StepPlannerLimits(**example["limits"])
    policy = resolve_scheduling_policy(_options(example["options"]), limits)
    rows = _rows(example)
    residents = (
        as_resident_array(rows) if kind == "array" else [core.ResidentState(*r) for r in rows]
    )
    drafts = example["drafts"]
    given = np.array(drafts, dtype=np.int32) if drafts_kind == "array" else list(drafts)
    reasons = np.zeros(len(rows), dtype=np.uint8)

    plan = core.StepPlanner(policy, limits).plan(residents, reasons=reasons, drafts=given)

    assert plan.to_dict() == example["plan"]
    assert plan.draft_tokens == example["draft_tokens"]
    assert [split_reason(c) for c in reasons] == [(Reason[n], rel) for n, rel in example["reasons"]]
    check_plan(policy, limits, residents, plan, drafts=drafts)
