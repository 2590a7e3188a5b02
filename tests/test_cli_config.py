"""The configuration vocabulary the CLI and the simulator's records share."""

from __future__ import annotations

import pytest

import stepplanner as sp
from stepplanner._fields import enum_fields

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from stepplanner.cli import config as cli_config  # noqa: E402


def test_enum_fields_come_from_the_dataclasses() -> None:
    enums = {"scheduling_policy": sp.SchedulingPolicy, "preemption": sp.PreemptionMode}
    assert enum_fields(sp.SchedulingOptions) == {"ifb_scheduling_mode": sp.IfbSchedulingMode,
                                                 **enums}
    assert enum_fields(sp.ResolvedSchedulingPolicy) == {"mode": sp.IfbSchedulingMode, **enums}


def test_the_cli_and_the_simulator_read_enums_from_one_place() -> None:
    from stepplanner import simulator

    assert cli_config._ENUMS == enum_fields(sp.SchedulingOptions)
    assert simulator._ENUMS == enum_fields(sp.ResolvedSchedulingPolicy)
