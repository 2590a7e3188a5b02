"""``stepplanner explain``: one ledger -> its plan, every resident's reason, and the SPEC §2 rule
behind each resolved budget."""

from __future__ import annotations

import json
from typing import Any

import click
import numpy as np

from .._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    chunk_cap,
    default_max_chunk_tokens,
    default_target,
    rd,
    resolve_scheduling_policy,
    ru,
)
from .._types import IfbSchedulingMode, split_reason
from ..ledger import Ledger
from ..simulator import DEFAULT_LIMITS
from .config import parse_config
from .errors import library_errors
from .inputs import read_json
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
    from .. import StepPlanner

    data = read_json(ledger_file)
    if not isinstance(data, dict) or not isinstance(data.get("residents"), list):
        raise ValueError(f'{ledger_file.name}: expected an object with a "residents" list')
    unknown = set(data) - {"limits", "options", "residents"}
    if unknown:
        raise ValueError(f"{ledger_file.name}: unknown key(s) {sorted(unknown)}; allowed: "
                         "limits, options, residents")
    for key in ("limits", "options"):
        if not isinstance(data.get(key, {}), dict):
            raise ValueError(f'{ledger_file.name}: "{key}" must be an object, got '
                             f"{type(data[key]).__name__}")
    config = parse_config({**data.get("options", {}), **data.get("limits", {})},
                          DEFAULT_LIMITS, SchedulingOptions())
    policy = resolve_scheduling_policy(config.options, config.limits)
    ledger = Ledger(config.limits, policy)
    ledger.load(data["residents"])
    reasons = np.zeros(max(ledger.count, 1), dtype=np.uint8)
    plan = StepPlanner(policy, config.limits).plan(ledger.residents, reasons=reasons)
    explanation = {
        "policy": explain_policy(config.options, policy, config.limits),
        "plan": plan.to_dict(),
        "residents": _resident_reasons(ledger, plan, reasons),
    }
    if output_format(fmt, as_json) == "json":
        click.echo(json.dumps(explanation, indent=2))
    else:
        emit(explanation_blocks(explanation), fmt)


def explain_policy(options: SchedulingOptions, policy: ResolvedSchedulingPolicy,
                   limits: StepPlannerLimits) -> list[dict[str, Any]]:
    """Each field of ``policy`` (resolved from ``options``) with the SPEC §2 rule behind it."""
    b, s_in, p, t_max = (limits.max_batch_size, limits.max_input_length, limits.kv_page_size,
                         limits.t_max)
    mixed = policy.mode == IfbSchedulingMode.MIXED
    if options.ifb_scheduling_mode != IfbSchedulingMode.AUTO:
        mode_rule = "given"
    elif options.max_num_tokens and mixed:
        mode_rule = "rule 2: AUTO -> MIXED because max_num_tokens was given"
    else:
        relation = ">=" if mixed else "<"
        mode_rule = (f"rule 2: AUTO -> {policy.mode.name} because rd(T_max)={rd(t_max, p)} "
                     f"{relation} B+P={b + p}")
    if not mixed:
        mnt_rule = f"rule 4: PREFILL_FIRST uses T_max = {_t_max_text(limits)}"
        mct_rule = f"rule 4: PREFILL_FIRST uses S_in = {s_in}"
    else:
        if options.max_num_tokens:
            mnt_rule = f"rule 3: given, within [B+P, T_max] = [{b + p}, {t_max}]"
        else:
            target = default_target(limits)
            mnt_rule = (f"rule 3: default min(ru({target}+B), rd(T_max)) = "
                        f"min({ru(target + b, p)}, {rd(t_max, p)})")
        mnt = policy.max_num_tokens
        if options.max_chunk_tokens:
            before = options.max_chunk_tokens
            mct_rule = f"rule 3: given {before}, a multiple of P in [P, max_num_tokens-B]"
        else:
            before = default_max_chunk_tokens(mnt, limits)
            mct_rule = f"rule 3: default max(P, rd(min(512, max_num_tokens-B))) = {before}"
        if before > chunk_cap(limits):
            mct_rule += f", capped at max(P, rd(S_in)) = {chunk_cap(limits)}"
    defaults = SchedulingOptions()
    rows = [("mode", policy.mode.name, mode_rule),
            ("max_num_tokens", policy.max_num_tokens, mnt_rule),
            ("max_chunk_tokens", policy.max_chunk_tokens, mct_rule)]
    for name in ("scheduling_policy", "preemption", "priority_reserved_slots",
                 "max_pause_steps"):
        value = getattr(policy, name)
        given = value != getattr(defaults, name)
        rows.append((name, getattr(value, "name", value),
                     "given (rule 1 range)" if given else "default"))
    return [{"field": f, "value": v, "rule": r} for f, v, r in rows]


def _t_max_text(limits: StepPlannerLimits) -> str:
    full = limits.max_batch_size * limits.max_input_length
    if limits.max_step_tokens:
        return f"min(B*S_in, max_step_tokens) = min({full}, {limits.max_step_tokens}) = {limits.t_max}"
    return f"B*S_in = {full}"


def _resident_reasons(ledger: Ledger, plan: Any, reasons: Any) -> list[dict[str, Any]]:
    planned = {s.resident: s for s in plan.sequences}
    out = []
    for i, (record, code) in enumerate(zip(ledger.to_records(), reasons.tolist())):
        outcome, released = split_reason(code) if code else (None, False)
        row = planned.get(i)
        out.append({
            "index": i, **record,
            "reason": outcome.name if outcome else None,
            "released_from_pause": released,
            "planned": None if row is None else {"work": row.work.name,
                                                 "past_length": row.past_length,
                                                 "query_length": row.query_length},
        })
    return out
