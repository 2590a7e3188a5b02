"""The public surface: SPEC §4's names, enum values, dtype fields, the same surface on both
implementations, and the STEPPLANNER_IMPL switch."""

from __future__ import annotations

import ast
import enum
import importlib.resources
import inspect
import os
import subprocess
import sys

import pytest

import stepplanner

SPEC_NAMES = {
    "StepPlanner",
    "StepPlan",
    "PlannedSequence",
    "ResidentState",
    "StepPlannerLimits",
    "SchedulingOptions",
    "ResolvedSchedulingPolicy",
    "resolve_scheduling_policy",
    "SchedulingPolicy",
    "IfbSchedulingMode",
    "PreemptionMode",
    "SequenceWork",
    "RESIDENT_DTYPE",
}
IMPLEMENTATION_NAMES = {"IMPLEMENTATION", "StepPlanner", "StepPlan", "ResidentState"}
RESIDENT_FIELDS = (
    "priority",
    "arrival",
    "prompt_length",
    "committed",
    "context_committed",
    "consecutive_paused_steps",
)


def test_all_lists_spec_names_and_they_import():
    assert SPEC_NAMES <= set(stepplanner.__all__)
    for name in stepplanner.__all__:
        assert hasattr(stepplanner, name), name
    assert len(stepplanner.__all__) == len(set(stepplanner.__all__))


@pytest.mark.parametrize(
    ("enum_type", "members"),
    [
        (stepplanner.SchedulingPolicy, {"FCFS": 0, "PRIORITY": 1, "EDF": 2, "DEADLINE": 3}),
        (stepplanner.IfbSchedulingMode, {"AUTO": 0, "MIXED": 1, "PREFILL_FIRST": 2}),
        (stepplanner.PreemptionMode, {"NONE": 0, "PAUSE": 1}),
        (stepplanner.SequenceWork, {"CONTEXT": 0, "DECODE": 1}),
    ],
)
def test_enums(enum_type, members):
    assert issubclass(enum_type, enum.IntEnum)
    assert {m.name: int(m) for m in enum_type} == members


def test_dtype_and_record_fields():
    assert stepplanner.RESIDENT_DTYPE.names == RESIDENT_FIELDS
    assert stepplanner.PlannedSequence._fields == (
        "resident",
        "work",
        "past_length",
        "query_length",
        "select_last_token_logits",
    )
    assert [f.name for f in __import__("dataclasses").fields(stepplanner.StepPlannerLimits)] == [
        "max_batch_size",
        "max_input_length",
        "kv_page_size",
        "max_step_tokens",
    ]


def test_facade_uses_the_compiled_core_by_default(compiled):
    if os.environ.get("STEPPLANNER_IMPL", "").strip().lower() == "python":
        pytest.skip("this run selected the reference")
    assert stepplanner.IMPLEMENTATION == "compiled"
    assert stepplanner.StepPlanner is compiled.StepPlanner


def _public(obj):
    return {n for n in dir(obj) if not n.startswith("_")}


def test_implementations_export_the_contract(core):
    assert IMPLEMENTATION_NAMES <= _public(core)
    assert core.IMPLEMENTATION in ("compiled", "python")


def _instance_surface(obj):
    # The reference reaches ResidentState fields through __getattr__, so dir() misses them.
    return _public(obj) | {f for f in RESIDENT_FIELDS if hasattr(obj, f)}


def test_same_class_surface(compiled, reference):
    assert _public(compiled.StepPlanner) == _public(reference.StepPlanner)
    assert (
        _instance_surface(compiled.ResidentState())
        == _instance_surface(reference.ResidentState())
        >= set(RESIDENT_FIELDS)
    )
    from stepplanner import SchedulingOptions, StepPlannerLimits, resolve_scheduling_policy

    lim = StepPlannerLimits(2, 16, 16)
    policy = resolve_scheduling_policy(SchedulingOptions(), lim)
    plans = [m.StepPlanner(policy, lim).plan([]) for m in (compiled, reference)]
    assert _public(plans[0]) == _public(plans[1])  # plan attributes, however each defines them


def _comparable(signature):
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_same_method_signatures(compiled, reference):
    for cls in ("StepPlanner", "StepPlan", "ResidentState"):
        for name in sorted(_public(getattr(reference, cls))):
            ours, theirs = (
                getattr(getattr(reference, cls), name),
                getattr(getattr(compiled, cls), name),
            )
            if not callable(ours):
                continue
            assert _comparable(inspect.signature(ours)) == _comparable(inspect.signature(theirs)), (
                f"{cls}.{name}"
            )


def _stub_inits():
    """Constructor parameters as the compiled core's stub declares them (extension types
    do not expose ``__init__`` signatures to ``inspect``)."""
    text = importlib.resources.files("stepplanner").joinpath("_core.pyi").read_text("utf-8")
    inits = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    inits[node.name] = [a.arg for a in item.args.args[1:] + item.args.kwonlyargs]
    return inits


def test_constructors_match_the_stub(reference):
    stub = _stub_inits()
    for cls in ("StepPlanner", "ResidentState"):
        params = list(inspect.signature(getattr(reference, cls)).parameters)
        assert stub[cls] == params, cls
    assert list(inspect.signature(reference.ResidentState).parameters) == list(RESIDENT_FIELDS)


def _import_in_subprocess(impl):
    env = dict(os.environ)
    env.pop("STEPPLANNER_IMPL", None)
    if impl is not None:
        env["STEPPLANNER_IMPL"] = impl
    code = (
        "import stepplanner; print(stepplanner.IMPLEMENTATION, stepplanner.StepPlanner.__module__)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("impl", ["python", " Python "])
def test_impl_switch_selects_the_reference(impl):
    result = _import_in_subprocess(impl)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["python", "stepplanner._core_py"]


def test_impl_switch_default_is_compiled(compiled):
    result = _import_in_subprocess(None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["compiled", "stepplanner._core"]


def test_unknown_impl_is_an_import_error():
    result = _import_in_subprocess("pypy")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "STEPPLANNER_IMPL='pypy'" in result.stderr and "'compiled' or 'python'" in result.stderr


_BLOCKED_CORE_RUN = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "stepplanner._core":
            raise ImportError("blocked: no compiled core in this run")
sys.meta_path.insert(0, Block())
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rfEs", sys.argv[1], "-k", "defaults"]))
"""


@pytest.mark.parametrize(("require", "outcome"), [("1", "error"), ("0", "skipped")])
def test_missing_compiled_core_fails_only_when_required(require, outcome):
    """The ``core`` fixture: a missing compiled core is a skip, or a failure under
    STEPPLANNER_REQUIRE_COMPILED=1 (CI and cibuildwheel must never pass on the reference alone)."""
    from pathlib import Path

    env = dict(os.environ, STEPPLANNER_IMPL="python", STEPPLANNER_REQUIRE_COMPILED=require)
    target = str(Path(__file__).with_name("test_resident_state.py"))
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_CORE_RUN, target],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert "1 passed" in summary and f"1 {outcome}" in summary, result.stdout[-2000:]
    if outcome == "error":
        assert "STEPPLANNER_REQUIRE_COMPILED=1 but the compiled core is missing" in result.stdout


def test_kv_implementations_have_the_same_surface(compiled_kv, reference_kv):
    assert compiled_kv.IMPLEMENTATION == "compiled" and reference_kv.IMPLEMENTATION == "python"
    for cls in ("KVPageTable", "StepInputs"):
        ours, theirs = getattr(reference_kv, cls), getattr(compiled_kv, cls)
        assert _public(ours) == _public(theirs), cls
        for name in sorted(_public(ours)):
            if callable(getattr(ours, name)):
                assert _comparable(inspect.signature(getattr(ours, name))) == _comparable(
                    inspect.signature(getattr(theirs, name))
                ), f"{cls}.{name}"
    text = importlib.resources.files("stepplanner").joinpath("kv", "_kv.pyi").read_text("utf-8")
    stub = {
        node.name: [a.arg for a in item.args.args[1:]]
        for node in ast.parse(text).body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "__init__"
    }
    for cls in ("KVPageTable", "StepInputs"):
        assert stub[cls] == list(inspect.signature(getattr(reference_kv, cls)).parameters), cls


def test_facade_takes_the_kv_module_from_the_same_side(compiled_kv):
    if os.environ.get("STEPPLANNER_IMPL", "").strip().lower() == "python":
        pytest.skip("this run selected the reference")
    assert stepplanner.KVPageTable is compiled_kv.KVPageTable
    assert stepplanner.StepInputs is compiled_kv.StepInputs


def test_ledger_implementations_have_the_same_surface(compiled):
    """Both ledgers (the page table is the ledger's own, so there is no wrapper to export),
    and the compiled constructor as its stub declares it."""
    from stepplanner.ledger import _ledger as _ledger_core
    from stepplanner.ledger import _ledger_py as _ledger_reference

    assert "PagedLedger" not in stepplanner.__all__ and not hasattr(stepplanner, "PagedLedger")
    ours, theirs = _ledger_reference.Ledger, _ledger_core.Ledger
    limits = stepplanner.StepPlannerLimits(2, 16, 16)
    assert _public(ours(limits)) == _public(theirs(limits))  # the twin's fields are per instance
    assert {"page_table", "reserved_pages", "held_back", "kv_pages_in_use"} <= _public(ours)
    for name in sorted(_public(ours)):
        if callable(getattr(ours, name)):
            assert _comparable(inspect.signature(getattr(ours, name))) == _comparable(
                inspect.signature(getattr(theirs, name))
            ), name
    text = (
        importlib.resources.files("stepplanner")
        .joinpath("ledger", "_ledger.pyi")
        .read_text("utf-8")
    )
    (init,) = [
        item
        for node in ast.parse(text).body
        if isinstance(node, ast.ClassDef) and node.name == "Ledger"
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "__init__"
    ]
    stub = [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]
    assert (
        stub
        == list(inspect.signature(ours).parameters)
        == [
            "limits",
            "policy",
            "max_waiting",
            "page_table",
            "slo_classes",
            "step_time",
            "relegated_wait",
            "never_relegate_below",
            "max_loras",
            "admission",
            "starvation_steps",
            "starvation_seconds",
        ]
    )
    ranker, compiled_ranker = _ledger_reference.Ranker, _ledger_core.Ranker
    for name in sorted(_public(ranker)):
        if callable(getattr(ranker, name)):
            assert _comparable(inspect.signature(getattr(ranker, name))) == _comparable(
                inspect.signature(getattr(compiled_ranker, name))
            ), name
