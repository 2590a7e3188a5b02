"""Engine limits, scheduling options and their resolution into a plannable policy (SPEC §2).

Resolution runs once per engine, not per step, so it is plain Python shared by both planner
implementations; ``check_policy`` is what a ``StepPlanner`` constructor runs on a hand-built policy.

``rd(x)``/``ru(x)`` round down/up to a multiple of the page size P; T_max = B × S_in, or
``min(B × S_in, max_step_tokens)`` when the runtime's step buffer is smaller (SPEC §1, §2).
"""

from __future__ import annotations

import dataclasses
import operator

from .. import _errors
from ._fields import as_enum, as_int, as_int32_in, out_of_field_range
from ._types import IfbSchedulingMode, PreemptionMode, SchedulingPolicy

__all__ = [
    "ResolvedSchedulingPolicy",
    "SchedulingOptions",
    "StepPlannerLimits",
    "check_policy",
    "resolve_scheduling_policy",
    "step_budget",
]

DEFAULT_TOKEN_TARGET = 512  # the seed's default scheduling target, in tokens per step


def rd(x: int, p: int) -> int:
    """x rounded down to a multiple of p."""
    return (x // p) * p


def ru(x: int, p: int) -> int:
    """x rounded up to a multiple of p."""
    return -(-x // p) * p


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)  # frozen dataclasses normalise in __post_init__


@dataclasses.dataclass(frozen=True, slots=True)
class StepPlannerLimits:
    """Engine build limits: B resident slots, S_in prefill tokens per sequence, page size P, and
    the runtime's token capacity per step.

    ``max_step_tokens`` is the step buffer a runtime has (transformers' ``max_batch_tokens``,
    vLLM's ``max_num_batched_tokens``): 0 (the default) keeps T_max = B × S_in; a given value must
    be >= P (SPEC §2) and >= B (one decode token per slot must fit, as vLLM also requires), and
    T_max = min(B × S_in, max_step_tokens) then bounds every step.
    B, S_in and P must be >= 1, and T_max must fit int32 (every token count of a plan is int32).
    """

    max_batch_size: int
    max_input_length: int
    kv_page_size: int
    max_step_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_input_length", "kv_page_size"):
            _set(self, name, as_int32_in(name, getattr(self, name), 1))
        step = as_int("max_step_tokens", self.max_step_tokens)
        floor = max(self.kv_page_size, self.max_batch_size)
        if step != 0 and not floor <= step <= _errors.INT32_MAX:
            # Below one page, a non-final chunk could never reach a page boundary (the first
            # prompt in order would stall); below B, a step of B decode rows would not fit.
            raise out_of_field_range(
                "max_step_tokens",
                step,
                "0 (= max_batch_size * max_input_length) or max(kv_page_size, max_batch_size) "
                f"= {floor}..{_errors.INT32_MAX}",
            )
        _set(self, "max_step_tokens", step)
        full = self._uncapped_t_max
        if step == 0 and full > _errors.INT32_MAX:
            raise _errors.out_of_range(
                "max_batch_size * max_input_length (T_max)",
                full,
                f"<= {_errors.INT32_MAX}, so that token counts fit int32 "
                "(or give max_step_tokens, the runtime's tokens per step)",
            )

    @property
    def _uncapped_t_max(self) -> int:
        """B × S_in: T_max before ``max_step_tokens`` caps it (the one place it is computed)."""
        return self.max_batch_size * self.max_input_length

    @property
    def t_max(self) -> int:
        """T_max: the most tokens one step may hold, B × S_in capped by ``max_step_tokens``."""
        full = self._uncapped_t_max
        return min(full, self.max_step_tokens) if self.max_step_tokens else full


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulingOptions:
    """What the user asks for; ``resolve_scheduling_policy`` turns it into budgets. 0 = default."""

    ifb_scheduling_mode: IfbSchedulingMode = IfbSchedulingMode.AUTO
    max_num_tokens: int = 0
    max_chunk_tokens: int = 0
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS
    preemption: PreemptionMode = PreemptionMode.NONE
    priority_reserved_slots: int = 0
    max_pause_steps: int = 0

    def __post_init__(self) -> None:
        _normalise(self, "ifb_scheduling_mode")


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedSchedulingPolicy:
    """A policy a ``StepPlanner`` can run: mode is ``MIXED`` or ``PREFILL_FIRST``, budgets set.

    Build it with :func:`resolve_scheduling_policy`; a hand-built one is checked by the planner.
    """

    mode: IfbSchedulingMode
    max_num_tokens: int
    max_chunk_tokens: int
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS
    preemption: PreemptionMode = PreemptionMode.NONE
    priority_reserved_slots: int = 0
    max_pause_steps: int = 0

    def __post_init__(self) -> None:
        _normalise(self, "mode")


def _normalise(obj: SchedulingOptions | ResolvedSchedulingPolicy, mode_field: str) -> None:
    """Convert field types (TypeError/OverflowError) and check the ranges that need no limits."""
    _set(obj, mode_field, as_enum(mode_field, getattr(obj, mode_field), IfbSchedulingMode))
    _set(
        obj,
        "scheduling_policy",
        as_enum("scheduling_policy", obj.scheduling_policy, SchedulingPolicy),
    )
    _set(obj, "preemption", as_enum("preemption", obj.preemption, PreemptionMode))
    for name in (
        "max_num_tokens",
        "max_chunk_tokens",
        "priority_reserved_slots",
        "max_pause_steps",
    ):
        _set(obj, name, as_int32_in(name, getattr(obj, name), 0))


def check_reserved_slots(value: int, limits: StepPlannerLimits) -> None:
    b = limits.max_batch_size
    if not 0 <= value < b:
        raise out_of_field_range(
            "priority_reserved_slots", value, f"0..{b - 1} (fewer than max_batch_size={b})"
        )


def step_budget(value: object, policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits) -> int:
    """One plan's ``max_num_tokens`` (SPEC §9), checked: an int in ``[B + P,
    policy.max_num_tokens]`` under MIXED; under PREFILL_FIRST no value but None is allowed."""
    if isinstance(value, bool):
        raise _errors.not_integer("max_num_tokens", value)
    try:
        budget = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise _errors.not_integer("max_num_tokens", value) from None
    if policy.mode != IfbSchedulingMode.MIXED:
        raise _errors.out_of_range(
            "max_num_tokens",
            budget,
            f"None under {policy.mode.name} (a per-step budget is MIXED's, SPEC §9)",
        )
    low = limits.max_batch_size + limits.kv_page_size
    if not low <= budget <= policy.max_num_tokens:
        raise _errors.out_of_range(
            "max_num_tokens",
            budget,
            f"[{low}, {policy.max_num_tokens}] (B + P to the policy's max_num_tokens, SPEC §9)",
        )
    return budget


def mixed_feasible(limits: StepPlannerLimits) -> bool:
    b, p = limits.max_batch_size, limits.kv_page_size
    return rd(limits.t_max, p) >= b + p


def default_target(limits: StepPlannerLimits) -> int:
    """The tokens beside B decode rows that the default budget aims for: 512, or P if larger.

    SPEC's default is min(ru(512 + B), rd(T_max)); with pages over 512 tokens that falls below
    its own range [B + P, T_max] and breaks the guarantee that the first prompt always gets a
    chunk beside B decode rows, so the target never drops below one page.
    """
    return max(DEFAULT_TOKEN_TARGET, limits.kv_page_size)


def default_max_num_tokens(limits: StepPlannerLimits) -> int:
    """min(ru(B + target), rd(T_max)); only meaningful when mixed batching is feasible."""
    p = limits.kv_page_size
    return min(ru(limits.max_batch_size + default_target(limits), p), rd(limits.t_max, p))


def default_max_chunk_tokens(max_num_tokens: int, limits: StepPlannerLimits) -> int:
    """max(P, rd(min(512, max_num_tokens - B))), before the cap."""
    p = limits.kv_page_size
    return max(p, rd(min(DEFAULT_TOKEN_TARGET, max_num_tokens - limits.max_batch_size), p))


def chunk_cap(limits: StepPlannerLimits) -> int:
    """max(P, rd(S_in)): the most one prompt chunk holds."""
    return max(limits.kv_page_size, rd(limits.max_input_length, limits.kv_page_size))


def t_max_text(limits: StepPlannerLimits) -> str:
    """How T_max came about, for messages: ``B*S_in = 2400`` or ``min(B*S_in, ...) = 64``."""
    full = limits._uncapped_t_max
    if limits.max_step_tokens:
        return (
            f"min(B*S_in, max_step_tokens) = min({full}, {limits.max_step_tokens}) = {limits.t_max}"
        )
    return f"B*S_in = {full}"


def _resolve_budgets(
    max_num_tokens: int, max_chunk_tokens: int, limits: StepPlannerLimits
) -> tuple[int, int, str, str]:
    """SPEC §2 rule 3: defaults, ranges and the per-chunk cap for a mixed step; with the rule
    that set each value, in words."""
    b, p, t_max = limits.max_batch_size, limits.kv_page_size, limits.t_max
    if max_num_tokens == 0:
        if not mixed_feasible(limits):
            raise _errors.StepPlannerValueError(
                f"max_num_tokens=0 (default) needs mixed batching to be feasible, but "
                f"rd(T_max)={rd(t_max, p)} < max_batch_size + kv_page_size={b + p}; allowed: "
                f"give max_num_tokens in [{b + p}, {t_max}] or use PREFILL_FIRST"
            )
        max_num_tokens = default_max_num_tokens(limits)
        target = default_target(limits)
        mnt_rule = (
            f"rule 3: default min(ru({target}+B), rd(T_max)) = "
            f"min({ru(target + b, p)}, {rd(t_max, p)})"
        )
    elif not b + p <= max_num_tokens <= t_max:
        raise _errors.out_of_range(
            "max_num_tokens",
            max_num_tokens,
            f"[max_batch_size + kv_page_size, T_max] = [{b + p}, {t_max}]",
        )
    else:
        mnt_rule = f"rule 3: given, within [B+P, T_max] = [{b + p}, {t_max}]"
    if max_chunk_tokens == 0:
        max_chunk_tokens = default_max_chunk_tokens(max_num_tokens, limits)
        mct_rule = f"rule 3: default max(P, rd(min(512, max_num_tokens-B))) = {max_chunk_tokens}"
    elif not (p <= max_chunk_tokens <= max_num_tokens - b and max_chunk_tokens % p == 0):
        raise _errors.out_of_range(
            "max_chunk_tokens",
            max_chunk_tokens,
            f"a multiple of kv_page_size={p} in [kv_page_size, max_num_tokens - max_batch_size]"
            f" = [{p}, {max_num_tokens - b}]",
        )
    else:
        mct_rule = f"rule 3: given {max_chunk_tokens}, a multiple of P in [P, max_num_tokens-B]"
    cap = chunk_cap(limits)
    if max_chunk_tokens > cap:
        mct_rule += f", capped at max(P, rd(S_in)) = {cap}"
    return max_num_tokens, min(max_chunk_tokens, cap), mnt_rule, mct_rule


def resolve_scheduling_policy(
    options: SchedulingOptions, limits: StepPlannerLimits
) -> ResolvedSchedulingPolicy:
    """Resolve ``options`` for an engine built with ``limits`` (SPEC §2).

    Raises ``ValueError`` naming the field, the value and the allowed range.
    """
    return resolve_with_rules(options, limits)[0]


def resolve_with_rules(
    options: SchedulingOptions, limits: StepPlannerLimits
) -> tuple[ResolvedSchedulingPolicy, dict[str, str]]:
    """``resolve_scheduling_policy``, and for ``mode``, ``max_num_tokens`` and
    ``max_chunk_tokens`` the SPEC §2 rule that set each, in words (what ``stepplanner explain``
    prints): the one resolution, so the explanation cannot drift from what was resolved."""
    if not isinstance(options, SchedulingOptions):
        raise _errors.wrong_type("options", "SchedulingOptions", options)
    if not isinstance(limits, StepPlannerLimits):
        raise _errors.wrong_type("limits", "StepPlannerLimits", limits)
    check_reserved_slots(options.priority_reserved_slots, limits)

    mode = options.ifb_scheduling_mode
    given = options.max_num_tokens != 0 or options.max_chunk_tokens != 0
    rules = {"mode": "given"}
    if mode == IfbSchedulingMode.AUTO:
        b, p = limits.max_batch_size, limits.kv_page_size
        feasible = mixed_feasible(limits)
        mode = (
            IfbSchedulingMode.MIXED
            if feasible or options.max_num_tokens != 0
            else IfbSchedulingMode.PREFILL_FIRST
        )
        relation = ">=" if feasible else "<"
        rules["mode"] = (
            f"rule 2: AUTO -> {mode.name} because rd(T_max)="
            f"{rd(limits.t_max, p)} {relation} B+P={b + p}"
        )
        if not feasible and mode == IfbSchedulingMode.MIXED:
            rules["mode"] += " but max_num_tokens was given"
    if mode == IfbSchedulingMode.MIXED or given:
        max_num_tokens, max_chunk_tokens, rules["max_num_tokens"], rules["max_chunk_tokens"] = (
            _resolve_budgets(options.max_num_tokens, options.max_chunk_tokens, limits)
        )
    if mode == IfbSchedulingMode.PREFILL_FIRST:
        max_num_tokens, max_chunk_tokens = limits.t_max, limits.max_input_length
        replaced = " (the given value passed rule 3, then was replaced)"
        rules["max_num_tokens"] = f"rule 4: PREFILL_FIRST uses T_max = {t_max_text(limits)}" + (
            replaced if options.max_num_tokens else ""
        )
        rules["max_chunk_tokens"] = f"rule 4: PREFILL_FIRST uses S_in = {max_chunk_tokens}" + (
            replaced if options.max_chunk_tokens else ""
        )
    policy = ResolvedSchedulingPolicy(
        mode=mode,
        max_num_tokens=max_num_tokens,
        max_chunk_tokens=max_chunk_tokens,
        scheduling_policy=options.scheduling_policy,
        preemption=options.preemption,
        priority_reserved_slots=options.priority_reserved_slots,
        max_pause_steps=options.max_pause_steps,
    )
    return policy, rules


def check_policy(policy: ResolvedSchedulingPolicy, limits: StepPlannerLimits) -> None:
    """What a planner constructor checks: a plannable mode, and §2's budgets for ``limits``."""
    if not isinstance(policy, ResolvedSchedulingPolicy):
        raise _errors.wrong_type("policy", "ResolvedSchedulingPolicy", policy)
    if not isinstance(limits, StepPlannerLimits):
        raise _errors.wrong_type("limits", "StepPlannerLimits", limits)
    if policy.mode not in (IfbSchedulingMode.MIXED, IfbSchedulingMode.PREFILL_FIRST):
        raise _errors.unresolved_mode(policy.mode)
    check_reserved_slots(policy.priority_reserved_slots, limits)
    if policy.mode == IfbSchedulingMode.PREFILL_FIRST:
        expected = (limits.t_max, limits.max_input_length)
        for name, want in zip(("max_num_tokens", "max_chunk_tokens"), expected):
            if getattr(policy, name) != want:
                raise _errors.out_of_range(
                    name,
                    getattr(policy, name),
                    f"{want} under PREFILL_FIRST (T_max and max_input_length)",
                )
        return
    b, p = limits.max_batch_size, limits.kv_page_size
    mnt, mct = policy.max_num_tokens, policy.max_chunk_tokens
    if not b + p <= mnt <= limits.t_max:
        raise _errors.out_of_range(
            "max_num_tokens",
            mnt,
            f"[max_batch_size + kv_page_size, T_max] = [{b + p}, {limits.t_max}]",
        )
    top = min(mnt - b, chunk_cap(limits))
    if not (p <= mct <= top and mct % p == 0):
        raise _errors.out_of_range(
            "max_chunk_tokens",
            mct,
            f"a multiple of kv_page_size={p} in [{p}, {top}] "
            "(at most max_num_tokens - max_batch_size and max(P, rd(max_input_length)))",
        )
