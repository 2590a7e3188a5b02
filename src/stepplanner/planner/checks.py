"""Check a plan against SPEC §3's guarantees, independently of any planner.

``check_plan`` does not re-plan: it reads the plan and the ledger and tests each property a
runtime relies on (every planned resident once, budgets, page ends, layout, pause rules, a
prompt left out only when SPEC §3 step 5 trims its chunk to nothing...), so it
can judge either implementation, a future one, or a plan that came over the wire. It raises
:class:`PlanInvariantError` (an ``AssertionError``) naming the rule and the offending row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._policy import ResolvedSchedulingPolicy, StepPlannerLimits
from ._types import IfbSchedulingMode, PreemptionMode, SequenceWork, orders_by_priority
from ._types import ResidentRow as _Row

__all__ = ["PlanInvariantError", "check_plan"]


class PlanInvariantError(AssertionError):
    """A plan breaks one of SPEC §3's guarantees; the message says which and where."""


def _rows(residents: Any, count: int) -> list[_Row]:
    if isinstance(residents, np.ndarray):
        return [_Row(*r) for r in residents[:count].tolist()]
    out = []
    for r in list(residents)[:count]:
        if isinstance(r, tuple):
            out.append(_Row(*r))
        else:
            out.append(
                _Row(
                    r.priority,
                    r.arrival,
                    r.prompt_length,
                    r.committed,
                    bool(r.context_committed),
                    r.consecutive_paused_steps,
                )
            )
    return out


def _fail(message: str) -> None:
    raise PlanInvariantError(message)


def check_plan(
    policy: ResolvedSchedulingPolicy,
    limits: StepPlannerLimits,
    residents: Any,
    plan: Any,
    drafts: Any = None,
) -> None:
    """Raise :class:`PlanInvariantError` if ``plan`` breaks a guarantee for this input.

    ``residents``: the list of ``ResidentState`` (either implementation), ``RESIDENT_DTYPE``
    array or list of row tuples the plan was made from; ``plan.num_residents`` (when the plan has
    it) says how many leading rows it covered. ``drafts``: the per-resident draft counts the plan
    was given (SPEC §8), if any.
    """
    count = getattr(plan, "num_residents", None)
    rows = _rows(residents, len(residents) if count is None else count)
    seqs = list(plan.sequences)
    paused = [int(i) for i in plan.paused]
    proposed = [0] * len(rows) if drafts is None else [int(d) for d in drafts[: len(rows)]]
    _check_indices(rows, seqs, paused)
    _check_totals(plan, seqs)
    _check_layout(policy, rows, seqs)
    _check_chunks(policy, limits, rows, seqs)
    _check_decodes(limits, rows, seqs, proposed)
    _check_budget(policy, limits, plan, seqs)
    _check_pause(policy, rows, paused)
    _check_coverage(policy, rows, seqs, paused)
    _check_skips(policy, limits, rows, seqs, paused)


def _check_indices(rows: list[_Row], seqs: list[Any], paused: list[int]) -> None:
    n = len(rows)
    if n and not seqs:
        _fail(f"plan names no resident although {n} are resident")
    seen: set[int] = set()
    for k, s in enumerate(seqs):
        if not 0 <= s.resident < n:
            _fail(f"sequences[{k}].resident={s.resident} is not an index into {n} residents")
        if s.resident in seen:
            _fail(f"resident {s.resident} is planned more than once (again at sequences[{k}])")
        seen.add(s.resident)
    for k, i in enumerate(paused):
        if not 0 <= i < n:
            _fail(f"paused[{k}]={i} is not an index into {n} residents")
        if k and paused[k - 1] >= i:
            _fail(f"paused is not ascending and unique: {paused}")
        if i in seen:
            _fail(f"resident {i} is both paused and planned")


def _check_totals(plan: Any, seqs: list[Any]) -> None:
    chunks = [s for s in seqs if s.work == SequenceWork.CONTEXT]
    prefill_tokens = sum(s.query_length for s in chunks)
    want = {
        "num_prefill": len(chunks),
        "num_decode": len(seqs) - len(chunks),
        "prefill_tokens": prefill_tokens,
        "total_tokens": sum(s.query_length for s in seqs),
    }
    for name, value in want.items():
        if getattr(plan, name) != value:
            _fail(f"plan.{name}={getattr(plan, name)} but the sequences give {value}")


def _order_key(policy: ResolvedSchedulingPolicy, rows: list[_Row], i: int) -> tuple[int, int, int]:
    prio = rows[i].priority if orders_by_priority(policy.scheduling_policy) else 0
    return prio, rows[i].arrival, i


def _check_layout(policy: ResolvedSchedulingPolicy, rows: list[_Row], seqs: list[Any]) -> None:
    works = [s.work for s in seqs]
    first_decode = works.index(SequenceWork.DECODE) if SequenceWork.DECODE in works else len(works)
    if SequenceWork.CONTEXT in works[first_decode:]:
        _fail(f"a chunk follows a decode row: works are {[SequenceWork(w).name for w in works]}")
    for part in (seqs[:first_decode], seqs[first_decode:]):
        keys = [_order_key(policy, rows, s.resident) for s in part]
        if keys != sorted(keys):
            _fail(f"rows are not in order: residents {[s.resident for s in part]}")


def _check_chunks(
    policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits, rows: list[_Row], seqs: list[Any]
) -> None:
    has_decode = any(s.work == SequenceWork.DECODE for s in seqs)
    mixed_cap = policy.mode == IfbSchedulingMode.MIXED and has_decode
    cap = policy.max_chunk_tokens if mixed_cap else limits.max_input_length
    p = limits.kv_page_size
    for k, s in enumerate(seqs):
        if s.work != SequenceWork.CONTEXT:
            continue
        r = rows[s.resident]
        where = f"chunk sequences[{k}] (resident {s.resident})"
        if r.context_committed:
            _fail(f"{where} is for a decoding resident")
        rem = r.prompt_length - r.committed
        if s.past_length != r.committed:
            _fail(f"{where} has past_length={s.past_length} but committed={r.committed}")
        if not 1 <= s.query_length <= rem:
            _fail(f"{where} has query_length={s.query_length}; allowed 1..{rem} (remaining)")
        if s.query_length > min(cap, limits.max_input_length):
            _fail(
                f"{where} has query_length={s.query_length} over the cap "
                f"{min(cap, limits.max_input_length)}"
            )
        final = s.query_length == rem
        if bool(s.select_last_token_logits) != final:
            _fail(
                f"{where} has select_last_token_logits={bool(s.select_last_token_logits)} "
                f"but final={final}"
            )
        if not final and (r.committed + s.query_length) % p:
            _fail(
                f"{where} is non-final and ends at {r.committed + s.query_length}, "
                f"not a multiple of kv_page_size={p}"
            )


def _check_decodes(
    limits: StepPlannerLimits, rows: list[_Row], seqs: list[Any], proposed: list[int]
) -> None:
    short = None  # the first decode row granted fewer drafts than it could hold (SPEC §8)
    for k, s in enumerate(seqs):
        if s.work != SequenceWork.DECODE:
            continue
        r = rows[s.resident]
        where = f"decode sequences[{k}] (resident {s.resident})"
        if not r.context_committed:
            _fail(f"{where} is for a prompt-incomplete resident")
        most = 1 + min(proposed[s.resident], limits.max_input_length - 1)
        if not 1 <= s.query_length <= most or not s.select_last_token_logits:
            _fail(
                f"{where} must have query_length in 1..{most} (1 + its drafts) and "
                f"select_last_token_logits=True, got {s.query_length} and "
                f"{bool(s.select_last_token_logits)}"
            )
        if s.past_length != r.committed:
            _fail(f"{where} has past_length={s.past_length} but committed={r.committed}")
        if short is not None and s.query_length > 1:
            _fail(f"{where} verifies drafts although {short} was granted fewer than it could hold")
        if short is None and s.query_length < most:
            short = where


def _check_budget(
    policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits, plan: Any, seqs: list[Any]
) -> None:
    has_decode = any(s.work == SequenceWork.DECODE for s in seqs)
    if policy.mode == IfbSchedulingMode.MIXED and has_decode:
        budget, name = policy.max_num_tokens, "max_num_tokens"
    else:
        budget, name = limits.t_max, "T_max"
    if plan.total_tokens > budget:
        _fail(f"total_tokens={plan.total_tokens} exceeds the step budget {name}={budget}")


def _check_pause(policy: ResolvedSchedulingPolicy, rows: list[_Row], paused: list[int]) -> None:
    pausing = (
        policy.mode == IfbSchedulingMode.MIXED
        and orders_by_priority(policy.scheduling_policy)
        and policy.preemption == PreemptionMode.PAUSE
    )
    if not pausing:
        if paused:
            _fail(f"residents {paused} are paused, but only MIXED + PRIORITY + PAUSE pauses")
        return
    prompts = [r.priority for r in rows if not r.context_committed]
    limit = min(prompts) if prompts else None  # h's priority: h is first in (priority, ...) order
    mps = policy.max_pause_steps
    is_paused = set(paused)
    for i, r in enumerate(rows):
        worse = limit is not None and r.priority > limit
        released = mps > 0 and r.consecutive_paused_steps >= mps
        if i in is_paused and not worse:
            _fail(
                f"resident {i} (priority {r.priority}) is paused but the first pending prompt "
                f"has priority {limit}"
            )
        if i in is_paused and released:
            _fail(
                f"resident {i} is paused with consecutive_paused_steps="
                f"{r.consecutive_paused_steps} >= max_pause_steps={mps}"
            )
        if worse and not released and i not in is_paused:
            _fail(
                f"resident {i} (priority {r.priority}) is worse than the first pending prompt "
                f"(priority {limit}) but is not paused"
            )


def _active_prompts(
    policy: ResolvedSchedulingPolicy, rows: list[_Row], paused: list[int]
) -> list[int]:
    """The active prompt-incomplete residents, in order (SPEC §3 steps 2-3)."""
    is_paused = set(paused)
    return sorted(
        (i for i in range(len(rows)) if i not in is_paused and not rows[i].context_committed),
        key=lambda i: _order_key(policy, rows, i),
    )


def _check_coverage(
    policy: ResolvedSchedulingPolicy, rows: list[_Row], seqs: list[Any], paused: list[int]
) -> None:
    """Who must be planned: decode rows per mode, and the first eligible prompt always."""
    planned = {s.resident: s.work for s in seqs}
    is_paused = set(paused)
    active = [i for i in range(len(rows)) if i not in is_paused]
    prompts = _active_prompts(policy, rows, paused)
    decoding = [i for i in active if rows[i].context_committed]
    prefill_first = policy.mode == IfbSchedulingMode.PREFILL_FIRST
    if prefill_first and prompts:
        if any(w == SequenceWork.DECODE for w in planned.values()):
            _fail("PREFILL_FIRST planned decode rows while a prompt is pending")
        best = prompts[0]
        for i in planned:
            if (
                orders_by_priority(policy.scheduling_policy)
                and rows[i].priority != rows[best].priority
            ):
                _fail(
                    f"PREFILL_FIRST + PRIORITY planned resident {i} (priority "
                    f"{rows[i].priority}) while priority {rows[best].priority} is pending"
                )
    else:
        for i in decoding:
            if planned.get(i) != SequenceWork.DECODE:
                _fail(f"active decoding resident {i} has no decode row")
    if prompts and prompts[0] not in planned:
        _fail(f"the first active prompt in order (resident {prompts[0]}) was skipped")


def _check_skips(
    policy: ResolvedSchedulingPolicy,
    limits: StepPlannerLimits,
    rows: list[_Row],
    seqs: list[Any],
    paused: list[int],
) -> None:
    """A prompt the plan leaves out must be one that SPEC §3 step 5 trims to nothing.

    Prompts are filled in order, so the budget a prompt meets is the step's prefill budget less
    the chunks planned for prompts before it; the skip is justified only when
    ``n = min(rem, cap, S_in, that budget)``, trimmed back to a page end when non-final, is 0.
    """
    prompts = _active_prompts(policy, rows, paused)
    if (
        policy.mode == IfbSchedulingMode.PREFILL_FIRST
        and prompts
        and orders_by_priority(policy.scheduling_policy)
    ):
        best = min(rows[i].priority for i in prompts)
        prompts = [i for i in prompts if rows[i].priority == best]
    num_decode = sum(1 for s in seqs if s.work == SequenceWork.DECODE)
    drafts = sum(s.query_length - 1 for s in seqs if s.work == SequenceWork.DECODE)
    if policy.mode == IfbSchedulingMode.MIXED and num_decode:
        budget, cap = policy.max_num_tokens - num_decode - drafts, policy.max_chunk_tokens
        source = f"max_num_tokens={policy.max_num_tokens} - {num_decode} decode rows"
        if drafts:
            source += f" - {drafts} draft tokens"
    else:
        budget, cap = limits.t_max, limits.max_input_length
        source = f"T_max={limits.t_max}"
    chunk = {s.resident: s.query_length for s in seqs if s.work == SequenceWork.CONTEXT}
    p, s_in = limits.kv_page_size, limits.max_input_length
    for i in prompts:
        if i in chunk:
            budget -= chunk[i]
            continue
        r = rows[i]
        rem = r.prompt_length - r.committed
        n = min(rem, cap, s_in, budget)
        if n < rem:
            n = (r.committed + n) // p * p - r.committed
        if n > 0:
            _fail(
                f"prompt resident {i} (remaining {rem}) was skipped, but {budget} of the "
                f"prefill budget ({source}) remained when its turn came: a chunk of {n} "
                f"tokens fits (cap {min(cap, s_in)}, kv_page_size={p})"
            )
