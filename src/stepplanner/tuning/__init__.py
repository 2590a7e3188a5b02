"""Answering "which budgets for my SLO?": SLOs and goodput, grid sweeps, capacity search, and the
backends that run them (serial, local processes, Ray). See docs/tuning.md."""

from __future__ import annotations

from .backends import BACKENDS, Outcome, run_tasks
from .capacity import (
    CapacityResult,
    ScaledTrace,
    SyntheticRates,
    capacity,
    find_capacity,
)
from .grid import GridPoint, expand_grid, parse_grid
from .metrics import parse_percentiles, vllm_metrics
from .slo import (
    STABILITY,
    SloTarget,
    good_requests,
    goodput,
    parse_queue_delay,
    parse_slo,
    parse_slos,
    slo_report,
)
from .sweep import assess, pareto_front, sweep

__all__ = [
    "BACKENDS",
    "CapacityResult",
    "GridPoint",
    "Outcome",
    "STABILITY",
    "ScaledTrace",
    "SloTarget",
    "SyntheticRates",
    "assess",
    "capacity",
    "expand_grid",
    "find_capacity",
    "good_requests",
    "goodput",
    "pareto_front",
    "parse_grid",
    "parse_percentiles",
    "parse_queue_delay",
    "parse_slo",
    "parse_slos",
    "run_tasks",
    "slo_report",
    "sweep",
    "vllm_metrics",
]
