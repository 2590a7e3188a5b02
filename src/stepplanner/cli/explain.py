"""``stepplanner explain``: one ledger -> its plan, every resident's reason, and the SPEC §2 rule
behind each resolved budget."""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np

from .._errors import StepPlannerValueError
from ..core import StepPlanner
from ..ledger import Ledger
from ..planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_with_rules,
    t_max_text,
)
from ..planner._types import IfbSchedulingMode, split_reason
from ..sim.simulator import DEFAULT_LIMITS
from .config import parse_config
from .errors import library_errors
from .files import read_json
from .options import format_options, output_format
from .render import emit, explanation_blocks


@click.command("explain")
@click.argument("ledger_file", type=click.File("r"))
@format_options
@library_errors
def explain_command(ledger_file: Any, fmt: str, as_json: bool) -> None:
    """Plan one ledger (JSON: limits, options, residents) and explain every decision.

    LEDGER_FILE ('-' for stdin) holds {"limits": {max_batch_size, max_input_length,
    kv_page_size}, "options": {SchedulingOptions fields}, "residents": [{priority, arrival,
    prompt_length, committed, context_committed, consecutive_paused_steps[, request_id]}]}.
    """
    data = read_json(ledger_file)
    if not isinstance(data, dict) or not isinstance(data.get("residents"), list):
        raise StepPlannerValueError(
            f'{ledger_file.name}: expected an object with a "residents" list'
        )
    unknown = set(data) - {"limits", "options", "residents"}
    if unknown:
        raise StepPlannerValueError(
            f"{ledger_file.name}: unknown key(s) {sorted(unknown)}; allowed: "
            "limits, options, residents"
        )
    for key in ("limits", "options"):
        if not isinstance(data.get(key, {}), dict):
            raise StepPlannerValueError(
                f'{ledger_file.name}: "{key}" must be an object, got {type(data[key]).__name__}'
            )
    config = parse_config(
        {**data.get("options", {}), **data.get("limits", {})}, DEFAULT_LIMITS, SchedulingOptions()
    )
    policy, rules = resolve_with_rules(config.options, config.limits)
    ledger = Ledger(config.limits, policy)
    ledger.load(data["residents"])
    reasons = np.zeros(max(ledger.count, 1), dtype=np.uint8)
    plan = StepPlanner(policy, config.limits).plan(ledger.residents, reasons=reasons)
    explanation = {
        "policy": explain_policy(config.options, policy, rules),
        "step_budget": step_budget(policy, config.limits, plan),
        "plan": plan.to_dict(),
        "residents": _resident_reasons(ledger, plan, reasons),
    }
    if output_format(fmt, as_json) == "json":
        click.echo(json.dumps(explanation, indent=2))
    else:
        emit(explanation_blocks(explanation), fmt)


def explain_policy(
    options: SchedulingOptions, policy: ResolvedSchedulingPolicy, rules: dict[str, str]
) -> list[dict[str, Any]]:
    """Each field of ``policy`` with the SPEC §2 rule behind it (``rules`` from
    ``resolve_with_rules``, which set the budgets; the other fields are given or default)."""
    defaults = SchedulingOptions()
    rows = [
        ("mode", policy.mode.name, rules["mode"]),
        ("max_num_tokens", policy.max_num_tokens, rules["max_num_tokens"]),
        ("max_chunk_tokens", policy.max_chunk_tokens, rules["max_chunk_tokens"]),
    ]
    for name in ("scheduling_policy", "preemption", "priority_reserved_slots", "max_pause_steps"):
        value = getattr(policy, name)
        given = value != getattr(defaults, name)
        rows.append(
            (name, getattr(value, "name", value), "given (rule 1 range)" if given else "default")
        )
    return [{"field": f, "value": v, "rule": r} for f, v, r in rows]


def step_budget(
    policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits, plan: Any
) -> dict[str, Any]:
    """The token budget the planned step had (SPEC §3 steps 3-4): ``max_num_tokens`` only for
    a MIXED step with decode rows; a step without them may take T_max."""
    t_max = f"T_max = {t_max_text(limits)}"
    if policy.mode == IfbSchedulingMode.MIXED and plan.num_decode:
        return {
            "tokens": policy.max_num_tokens,
            "rule": f"max_num_tokens: a MIXED step with decode rows ({plan.num_decode}), "
            f"leaving {policy.max_num_tokens - plan.num_decode} for prompt chunks "
            "(SPEC §3 step 3)",
        }
    if policy.mode == IfbSchedulingMode.MIXED:
        return {
            "tokens": limits.t_max,
            "rule": f"{t_max}: a MIXED step without decode rows (SPEC §3 step 3)",
        }
    if plan.num_prefill or not plan.num_decode:
        return {
            "tokens": limits.t_max,
            "rule": f"{t_max}: a PREFILL_FIRST prefill step (SPEC §3 step 4)",
        }
    return {
        "tokens": plan.num_decode,
        "rule": "no prompt pending: a PREFILL_FIRST step decodes every resident (SPEC §3 step 4)",
    }


def _resident_reasons(ledger: Ledger, plan: Any, reasons: Any) -> list[dict[str, Any]]:
    planned = {s.resident: s for s in plan.sequences}
    out = []
    for i, (record, code) in enumerate(zip(ledger.to_records(), reasons.tolist())):
        outcome, released = split_reason(code) if code else (None, False)
        row = planned.get(i)
        out.append(
            {
                "index": i,
                **record,
                "reason": outcome.name if outcome else None,
                "released_from_pause": released,
                "planned": None
                if row is None
                else {
                    "work": row.work.name,
                    "past_length": row.past_length,
                    "query_length": row.query_length,
                },
            }
        )
    return out
