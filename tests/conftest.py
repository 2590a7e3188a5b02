"""Shared fixtures: the ``core`` fixture runs a test on the compiled core and on the reference.

STEPPLANNER_REQUIRE_COMPILED=1 (CI, cibuildwheel) turns a missing compiled core into a failure;
STEPPLANNER_IMPL=python runs the reference only (platforms without a compiler).
HYPOTHESIS_PROFILE selects "default" (local), "ci" (more examples, derandomized) or "wheel"
(few examples, derandomized: .ci/run's second pass over the suite, on the wheel built from the
sdist, after the README's command ran it at "ci" on the same source).
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=300,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("wheel", parent=settings.get_profile("ci"), max_examples=30)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REQUIRE_COMPILED = os.environ.get("STEPPLANNER_REQUIRE_COMPILED") == "1"
REFERENCE_ONLY = os.environ.get("STEPPLANNER_IMPL", "").strip().lower() == "python"


def load_impl(
    name: str,
    compiled: str = "stepplanner._core",
    reference: str = "stepplanner._core_py",
    what: str = "the compiled core",
):
    """The ``compiled`` or ``reference`` module for a ``core`` param, or skip/fail as the
    environment says (one rule for the planner, the KV module and any later compiled twin)."""
    if name == "python":
        return importlib.import_module(reference)
    if REFERENCE_ONLY and not REQUIRE_COMPILED:
        pytest.skip("STEPPLANNER_IMPL=python: reference-only run")
    try:
        return importlib.import_module(compiled)
    except ImportError as exc:
        if REQUIRE_COMPILED:
            pytest.fail(f"STEPPLANNER_REQUIRE_COMPILED=1 but {what} is missing: {exc}")
        pytest.skip(f"{what} not built: {exc}")


def load_core(name: str):
    """stepplanner._core or stepplanner._core_py."""
    return load_impl(name)


@pytest.fixture(scope="session", params=["compiled", "python"])
def core(request):
    """stepplanner._core or stepplanner._core_py: StepPlanner, StepPlan, ResidentState."""
    return load_core(request.param)


@pytest.fixture(scope="session")
def compiled():
    """The compiled core alone (parity and allocation tests compare it with the reference)."""
    return load_core("compiled")


@pytest.fixture(scope="session")
def reference():
    return load_core("python")


def load_kv(name: str):
    """stepplanner.kv._kv or stepplanner.kv._kv_py."""
    return load_impl(name, "stepplanner.kv._kv", "stepplanner.kv._kv_py", "stepplanner.kv._kv")


@pytest.fixture(scope="session", params=["compiled", "python"])
def kv(request):
    """The KV page table and step inputs (KVPageTable, StepInputs) of either implementation."""
    return load_kv(request.param)


@pytest.fixture(scope="session")
def compiled_kv():
    return load_kv("compiled")


@pytest.fixture(scope="session")
def reference_kv():
    return load_kv("python")


@pytest.fixture(scope="session")
def ledger_impl(core):
    """(Ledger, StepPlanner) of one implementation: the compiled ledger with the compiled
    planner, the pure-Python twin with the reference planner."""
    import types

    if core.IMPLEMENTATION == "compiled":
        from stepplanner.ledger._ledger import Ledger
    else:
        from stepplanner.ledger._ledger_py import Ledger
    return types.SimpleNamespace(
        Ledger=Ledger, StepPlanner=core.StepPlanner, name=core.IMPLEMENTATION
    )


@pytest.fixture(scope="session")
def paged_impl(ledger_impl):
    """(Ledger, StepPlanner, KVPageTable, StepInputs) of one implementation: the compiled ledger
    takes the compiled page table (its C drives the table's C), the twin the reference one."""
    import types

    kv = load_kv(ledger_impl.name)
    return types.SimpleNamespace(
        Ledger=ledger_impl.Ledger,
        StepPlanner=ledger_impl.StepPlanner,
        KVPageTable=kv.KVPageTable,
        StepInputs=kv.StepInputs,
        name=ledger_impl.name,
    )


@pytest.fixture(scope="session")
def make_planner(core):
    """``make_planner(B, S_in, P, max_step_tokens=0, **options)``: a planner of ``core`` for
    resolved options."""
    from stepplanner import SchedulingOptions, StepPlannerLimits, resolve_scheduling_policy

    def build(b: int, s_in: int, p: int, max_step_tokens: int = 0, **options):
        limits = StepPlannerLimits(b, s_in, p, max_step_tokens)
        policy = resolve_scheduling_policy(SchedulingOptions(**options), limits)
        return core.StepPlanner(policy, limits)

    return build


# ASan reserves terabytes of address space up front and maps the rest lazily, so a test that
# makes an allocation fail by capping the address space (RLIMIT_AS) cannot run under
# tools/sanitize.sh, which preloads it.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def pytest_collection_modifyitems(config, items):
    if UNDER_ASAN:
        skip = pytest.mark.skip(reason="RLIMIT_AS cannot make an allocation fail under ASan")
        for item in items:
            if "limits_address_space" in item.keywords:
                item.add_marker(skip)


def _assert_unwritable(array: np.ndarray, compiled: bool) -> None:
    """Neither ``array`` nor any array it views can be made writable, and the memory at the end
    of its ``.base`` chain exports a read-only buffer. The compiled memory's exporter is read-only
    too; the pure-Python twin's is the array it writes (nothing in pure Python is private)."""
    assert not array.flags.writeable
    owner = array
    while isinstance(owner, np.ndarray):
        with pytest.raises(ValueError, match="WRITEABLE"):
            owner.flags.writeable = True
        with pytest.raises(ValueError, match="read-only"):
            owner[...] = 0
        with pytest.raises(ValueError, match="read-only"):
            np.asarray(owner)[...] = 0
        owner = owner.base
    assert owner is not None
    view = memoryview(owner)
    assert view.readonly
    with pytest.raises(TypeError):
        view.cast("B")[0] = 1
    if compiled:
        assert memoryview(owner.obj).readonly  # numpy keeps a memoryview of the exporter


@pytest.fixture(scope="session")
def assert_unwritable():
    """``assert_unwritable(array, compiled)``: the check that memory a kernel indexes by cannot be
    written from Python (the page table's and the ledger's views)."""
    return _assert_unwritable


def _write_run_files(folder, workload, limits, options, model) -> dict:
    """What a real run of ``workload`` leaves, its simulation standing in for the engine: the
    trace, a latency model file, the per-request results and the per-step timings (with each
    step's start), as ``serve-trace`` and ``calibrate`` write them."""
    import json

    from stepplanner.fidelity.simulated import simulated_results
    from stepplanner.sim.latency_models import save_latency_model
    from stepplanner.sim.simulator import simulate
    from stepplanner.sim.traces import read_trace

    trace = folder / "trace.csv"
    workload.to_csv(trace)
    served = read_trace(trace)
    model_path = folder / "model.json"
    save_latency_model(model, model_path)
    results = folder / "results.json"
    results.write_text(
        json.dumps(simulated_results(served, limits, options, model, trace=str(trace)))
    )
    steps = simulate(served, limits, options, model).steps
    timings = folder / "timings.csv"
    timings.write_text(
        "seconds,tokens,context,start\n"
        + "".join(
            f"{s!r},{t},{c},{e - s!r}\n"
            for s, t, c, e in zip(
                *(steps[k].tolist() for k in ("seconds", "tokens", "context", "end_time"))
            )
        )
    )
    return {"trace": trace, "model": model_path, "results": results, "timings": timings}


@pytest.fixture(scope="session")
def write_run_files():
    """``write_run_files(folder, workload, limits, options, model)``: the files of a run of
    ``workload`` (trace, model, results, timings) in ``folder``, for the tools' file tests."""
    return _write_run_files
