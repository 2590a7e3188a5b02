"""The tuning commands of the ``stepplanner`` CLI, one module each: ``sweep``, ``capacity``,
``calibrate``; ``options`` holds what they share with each other and with ``simulate`` and
``compare`` (``--slo``, ``--latency-model``, backends, vLLM-style metrics); ``render`` draws
their tables, CSV files and plots."""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(group: Any) -> None:
    """Add the tuning commands to the ``stepplanner`` click group."""
    from . import calibrate, capacity, sweep

    for module in (sweep, capacity, calibrate):
        group.add_command(module.command)
