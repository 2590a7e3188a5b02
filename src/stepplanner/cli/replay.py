"""``stepplanner replay``: re-plan every recorded step and diff it against the recording."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .._policy import SchedulingOptions, resolve_scheduling_policy
from ..simulator import policy_to_dict, read_record_header, replay
from .config import parse_config, parse_config_text
from .errors import library_errors
from .inputs import read_text
from .render import print_replay, stdout_console


@click.command("replay")
@click.argument("record_file", type=click.File("r"))
@click.option("--config", "config_text", default="",
              help="Re-plan under other options than the recorded ones, e.g. "
                   "'policy=priority,preemption=pause'.")
@click.option("--show", type=click.IntRange(min=0), default=5, show_default=True,
              help="How many differing steps to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@library_errors
def replay_command(record_file: Any, config_text: str, show: int, as_json: bool) -> None:
    """Re-plan every recorded step; print a diff where a plan differs (exit status 1)."""
    lines = read_text(record_file).splitlines()
    policy = limits = None
    if config_text:
        limits, recorded = read_record_header(lines)
        base = SchedulingOptions(
            scheduling_policy=recorded.scheduling_policy, preemption=recorded.preemption,
            priority_reserved_slots=recorded.priority_reserved_slots,
            max_pause_steps=recorded.max_pause_steps)
        config = parse_config(parse_config_text(config_text), limits, base)
        limits = config.limits
        policy = resolve_scheduling_policy(config.options, limits)
    result = replay(lines, policy, limits)
    if as_json:
        click.echo(json.dumps({"steps": result.steps, "policy": policy_to_dict(result.policy),
                               "differing_steps": len(result.diffs), "diffs": result.diffs},
                              indent=2))
    else:
        print_replay(stdout_console(), result, show)
    if result.diffs:
        sys.exit(1)
