"""Warnings on stderr, each at most once per command: options that change nothing, values the
SPEC replaces, runs cut short by a default and requests the engine refuses. Nothing here changes
what runs; it says what would otherwise happen without a word."""

from __future__ import annotations

from typing import Any

import click
import numpy as np

from ..planner._policy import ResolvedSchedulingPolicy, SchedulingOptions
from ..planner._types import IfbSchedulingMode, PreemptionMode, orders_by_priority
from ..sim.simulator import SimulationResult

SHOW_REFUSED = 5  # refused requests named before "and N more"


def warn(message: str) -> None:
    """``warning: message`` on stderr, unless this command already said it."""
    ctx = click.get_current_context(silent=True)
    said: set[str] = ctx.meta.setdefault("stepplanner.warned", set()) if ctx else set()
    if message not in said:
        said.add(message)
        click.echo(f"warning: {message}", err=True)


def no_op_options(
    options: SchedulingOptions, policy: ResolvedSchedulingPolicy, where: str = ""
) -> list[str]:
    """What in ``options`` the resolved ``policy`` does not act on (SPEC §2 rule 4, §3 step 2)."""
    prefix = f"{where}: " if where else ""
    notes = []
    mixed = policy.mode == IfbSchedulingMode.MIXED
    pausing = mixed and orders_by_priority(policy.scheduling_policy)
    if options.preemption == PreemptionMode.PAUSE and not pausing:
        notes.append(
            f"{prefix}preemption=PAUSE pauses nothing under {policy.mode.name} + "
            f"{policy.scheduling_policy.name}: it acts only with MIXED mode and the "
            "PRIORITY, EDF or DEADLINE policy (SPEC §3 step 2, §7)"
        )
    if options.max_pause_steps and not (pausing and policy.preemption == PreemptionMode.PAUSE):
        notes.append(
            f"{prefix}max_pause_steps={options.max_pause_steps} has no effect: nothing "
            "is paused without MIXED + PRIORITY + preemption=PAUSE"
        )
    if not mixed:
        for name, spec_value, rule in (
            ("max_num_tokens", policy.max_num_tokens, "T_max"),
            ("max_chunk_tokens", policy.max_chunk_tokens, "S_in"),
        ):
            given = getattr(options, name)
            if given and given != spec_value:
                notes.append(
                    f"{prefix}{name}={given} is replaced by {rule}={spec_value} under "
                    "PREFILL_FIRST (SPEC §2 rule 4)"
                )
    return notes


def warn_no_op_options(
    options: SchedulingOptions, policy: ResolvedSchedulingPolicy, where: str = ""
) -> None:
    for note in no_op_options(options, policy, where):
        warn(note)


def refused_requests(result: SimulationResult, where: str = "") -> str | None:
    """The refused requests, the first few by name, and why; ``None`` when there are none."""
    full = result.queue_full if result.queue_full.size else np.zeros_like(result.refused)
    refused = np.flatnonzero(result.refused & ~full)
    prefix = f"{where}: " if where else ""
    if full.any():
        queue = (
            f"{prefix}{int(full.sum()):,} of {len(result.workload):,} requests refused at "
            f"submission: the waiting queue was full (max_waiting={result.queue.max_waiting:,}; "
            "a server answers HTTP 429), counted as misses"
        )
        if refused.size == 0:
            return queue
        prefix = f"{queue}; and "
    if refused.size == 0:
        return None
    w, s_in = result.workload, result.limits.max_input_length
    named = ", ".join(
        f"#{i} ({int(w.prompt_tokens[i]):,}-token prompt at {float(w.arrival_time[i]):.2f} s)"
        for i in refused[:SHOW_REFUSED]
    )
    more = f" and {refused.size - SHOW_REFUSED:,} more" if refused.size > SHOW_REFUSED else ""
    return (
        f"{prefix}{refused.size:,} of {len(w):,} requests refused at submission: a prompt "
        f"longer than max_input_length (S_in={s_in:,}) can never be planned (SPEC §6); "
        f"requests by arrival order: {named}{more}"
    )


def warn_refused(result: SimulationResult, where: str = "") -> None:
    message = refused_requests(result, where)
    if message:
        warn(message)


def warn_default_step_limit(result: SimulationResult, default: int, given: Any) -> None:
    """A run cut by a command's own default step limit (not one the user gave) says so."""
    if given is None and result.truncated:
        unfinished = int(np.isnan(result.finish_time).sum() - result.refused.sum())
        warn(
            f"stopped at the default limit of {default:,} steps with {unfinished:,} requests "
            "unfinished; pass --max-steps to set another"
        )
