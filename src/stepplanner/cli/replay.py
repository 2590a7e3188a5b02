"""``stepplanner replay``: re-plan every recorded step and diff it against the recording."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..planner._policy import ResolvedSchedulingPolicy, SchedulingOptions, resolve_scheduling_policy
from ..planner._types import IfbSchedulingMode
from ..sim.simulator import policy_to_dict, read_record_header, replay
from .config import canonical_key, parse_config, parse_config_text
from .errors import library_errors
from .files import read_text
from .notices import warn_no_op_options
from .render import print_replay, stdout_console


@click.command("replay")
@click.argument("record_file", type=click.File("r"))
@click.option(
    "--config",
    "config_text",
    default="",
    help="Re-plan with these fields changed, e.g. 'policy=priority,preemption=pause'; "
    "every field not named keeps its recorded value (naming max_num_tokens "
    "re-derives an unnamed max_chunk_tokens, naming mode both budgets; give "
    "a budget as 0 for its SPEC §2 default).",
)
@click.option(
    "--show",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many differing steps to print.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@library_errors
def replay_command(record_file: Any, config_text: str, show: int, as_json: bool) -> None:
    """Re-plan every recorded step; print a diff where a plan differs (exit status 1)."""
    lines = read_text(record_file).splitlines()
    policy = limits = None
    if config_text:
        limits, recorded = read_record_header(lines)
        items = parse_config_text(config_text)
        base = recorded_options(recorded, {canonical_key(key) for key in items})
        config = parse_config(items, limits, base)
        limits = config.limits
        policy = resolve_scheduling_policy(config.options, limits)
        warn_no_op_options(config.options, policy)
    result = replay(lines, policy, limits)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "steps": result.steps,
                    "policy": policy_to_dict(result.policy),
                    "differing_steps": len(result.diffs),
                    "diffs": result.diffs,
                },
                indent=2,
            )
        )
    else:
        print_replay(stdout_console(), result, show)
    if result.diffs:
        sys.exit(1)


def recorded_options(recorded: ResolvedSchedulingPolicy, named: set[str]) -> SchedulingOptions:
    """Options that resolve to the recorded policy again, so that a ``--config`` changes only
    the fields it names.

    The budgets follow from others where the SPEC derives them: PREFILL_FIRST's are T_max and
    S_in of the limits in force (so they are left to resolution), a named ``max_num_tokens``
    re-derives an unnamed chunk size (whose default and range depend on it), and a named mode
    re-derives both.
    """
    mixed = recorded.mode == IfbSchedulingMode.MIXED and "ifb_scheduling_mode" not in named
    budget = recorded.max_num_tokens if mixed else 0
    chunk = recorded.max_chunk_tokens if mixed and "max_num_tokens" not in named else 0
    return SchedulingOptions(
        ifb_scheduling_mode=recorded.mode,
        max_num_tokens=budget,
        max_chunk_tokens=chunk,
        scheduling_policy=recorded.scheduling_policy,
        preemption=recorded.preemption,
        priority_reserved_slots=recorded.priority_reserved_slots,
        max_pause_steps=recorded.max_pause_steps,
    )
