"""The simulator's step-time budget (``Engine(max_step_seconds=...)``): every mixed step fits
its time on the run's own latency model, the option is refused where it cannot apply, and it
changes the run only when it binds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepplanner import IfbSchedulingMode, SchedulingOptions, StepPlannerLimits
from stepplanner.sim.engine import Engine, RunSpec
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.simulator import simulate_run
from stepplanner.sim.workloads import Workload

LIMITS = StepPlannerLimits(max_batch_size=16, max_input_length=16384, kv_page_size=32)
OPTIONS = SchedulingOptions(max_num_tokens=2048, max_chunk_tokens=1024)
MODEL = LatencyModel(2e-3, 2e-5, 1e-7, "test")


def deep_workload(n: int = 120) -> Workload:
    rng = np.random.default_rng(3)
    return Workload(
        np.sort(rng.uniform(0, 20, n)),
        rng.integers(4000, 16000, n),
        rng.integers(32, 300, n),
        np.zeros(n, dtype=np.int64),
        "deep",
    )


def test_every_mixed_step_fits_its_time():
    target = 0.035
    engine = Engine(LIMITS, OPTIONS, MODEL, max_step_seconds=target)
    result = simulate_run(RunSpec(deep_workload(), engine))
    st = result.steps
    mixed = (st["num_decode"] > 0) & (st["num_prefill"] > 0)
    over_floor = st["tokens"] > LIMITS.max_batch_size + LIMITS.kv_page_size
    assert np.count_nonzero(mixed & over_floor) > 100
    assert st["seconds"][mixed & over_floor].max() <= target * (1 + 1e-9)
    plain = simulate_run(RunSpec(deep_workload(), engine.replace(max_step_seconds=None)))
    pst = plain.steps
    pmixed = (pst["num_decode"] > 0) & (pst["num_prefill"] > 0)
    assert pst["seconds"][pmixed].max() > target * 1.2  # without it, deep steps run long
    assert (~np.isnan(result.finish_time)).all()  # every request still served


def test_a_loose_budget_changes_nothing():
    engine = Engine(LIMITS, OPTIONS, MODEL)
    plain = simulate_run(RunSpec(deep_workload(40), engine))
    loose = simulate_run(RunSpec(deep_workload(40), engine.replace(max_step_seconds=10.0)))
    assert np.array_equal(plain.finish_time, loose.finish_time)
    assert np.array_equal(plain.steps["tokens"], loose.steps["tokens"])


@pytest.mark.parametrize("bad", [0, -0.5, math.nan, math.inf, True, "0.1"])
def test_bad_values_are_refused_naming_them(bad):
    with pytest.raises(ValueError, match="max_step_seconds="):
        Engine(LIMITS, OPTIONS, MODEL, max_step_seconds=bad)


def test_prefill_first_is_refused():
    options = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.PREFILL_FIRST)
    with pytest.raises(ValueError, match="max_step_seconds=0.1 needs the MIXED mode"):
        Engine(LIMITS, options, MODEL, max_step_seconds=0.1)
