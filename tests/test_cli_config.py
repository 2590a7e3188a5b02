"""The configuration vocabulary the CLI and the simulator's records share."""

from __future__ import annotations

import dataclasses
import json

import pytest

import stepplanner as sp
from stepplanner.planner import _config_keys
from stepplanner.planner._fields import enum_fields

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import config as cli_config  # noqa: E402
from stepplanner.cli import main  # noqa: E402
from stepplanner.tuning.grid import parse_grid  # noqa: E402


def test_enum_fields_come_from_the_dataclasses() -> None:
    enums = {"scheduling_policy": sp.SchedulingPolicy, "preemption": sp.PreemptionMode}
    assert enum_fields(sp.SchedulingOptions) == {
        "ifb_scheduling_mode": sp.IfbSchedulingMode,
        **enums,
    }
    assert enum_fields(sp.ResolvedSchedulingPolicy) == {"mode": sp.IfbSchedulingMode, **enums}


def test_the_cli_and_the_simulator_read_enums_from_one_place() -> None:
    from stepplanner.sim import simulator

    assert _config_keys.ENUMS == enum_fields(sp.SchedulingOptions)
    assert simulator._ENUMS == enum_fields(sp.ResolvedSchedulingPolicy)


@pytest.mark.parametrize(
    ("alias", "field", "value"),
    [
        ("b", "max_batch_size", 8),
        ("max_num_seqs", "max_batch_size", 8),
        ("p", "kv_page_size", 32),
        ("block_size", "kv_page_size", 32),
        ("s_in", "max_input_length", 2048),
        ("max_num_batched_tokens", "max_step_tokens", 512),
        ("Reserved-Slots", "priority_reserved_slots", 1),
    ],
)
def test_config_keys_take_every_grid_alias(alias: str, field: str, value: int) -> None:
    assert list(parse_grid([f"{alias}={value}"])) == [field]
    config = cli_config.parse_config(
        {alias: str(value)}, sp.StepPlannerLimits(16, 4096, 16), sp.SchedulingOptions()
    )
    limits, options = dataclasses.asdict(config.limits), dataclasses.asdict(config.options)
    assert {**limits, **options}[field] == value


def test_compare_config_accepts_the_grid_aliases() -> None:
    result = CliRunner().invoke(
        main,
        [
            "compare",
            "--requests",
            "100",
            "--rate",
            "40",
            "-B",
            "32",
            "--max-input-length",
            "4096",
            "--no-progress",
            "--json",
            "--config",
            "max_num_seqs=8,block_size=32",
            "--config",
            "b=4",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)
    assert reports[0]["limits"]["max_batch_size"] == 8
    assert reports[0]["limits"]["kv_page_size"] == 32
    assert reports[1]["limits"]["max_batch_size"] == 4


def test_an_unknown_key_names_itself_and_lists_the_aliases() -> None:
    with pytest.raises(
        sp.StepPlannerError, match=r"config key 'blok_size' is not known.*block_size.*max_num_seqs"
    ):
        cli_config.parse_config(
            {"blok_size": "32"}, sp.StepPlannerLimits(16, 4096, 16), sp.SchedulingOptions()
        )
