"""Every problem tools/fuzz_plan.py found, replayed as a test.

Each case is written out twice: as plain Python that states the input and the expected outcome
(the durable form), and as the raw fuzzer input, replayed through the harness when the harness
and atheris are present (the bytes decode the same way only while the harness's decoding is
unchanged). Cases that crashed the interpreter run in a subprocess, so a regression fails one
test instead of killing the whole run.
"""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import stepplanner as sp
from stepplanner import RESIDENT_DTYPE

ALLOWED = (TypeError, ValueError, OverflowError)
LIMITS = sp.StepPlannerLimits(4, 64, 16)
POLICY = sp.resolve_scheduling_policy(sp.SchedulingOptions(), LIMITS)
ROWS = [(0, 0, 40, 41, True, 0), (0, 1, 60, 0, False, 0), (0, 2, 20, 0, False, 0)]


def outcome(fn, *args):
    try:
        result = fn(*args)
    except ALLOWED as exc:
        return ("err", type(exc).__name__, str(exc))
    return ("ok", result.to_dict())


# --- empty-reasons: a zero-length reasons array (numpy gives it stride 0) --------------------


@pytest.mark.parametrize(
    "residents",
    [[], np.zeros(0, RESIDENT_DTYPE), np.array(ROWS, RESIDENT_DTYPE)],
    ids=["list", "empty_array", "count_0"],
)
def test_empty_reasons_for_zero_residents(core, residents):
    """fuzz: count=0 with reasons=np.zeros(0, uint8) -> compiled said "reasons is not
    contiguous" (the check read strides[0] != 1; numpy 2.x gives an empty array stride 0)."""
    reasons = np.zeros(0, dtype=np.uint8)
    assert reasons.strides == (0,) or reasons.strides == (1,)
    plan = core.StepPlanner(POLICY, LIMITS).plan(residents, 0, reasons)
    assert plan.num_residents == 0 and len(plan.sequences) == 0


def test_a_one_element_reasons_view_with_a_long_stride(core):
    """A 1-element view is contiguous whatever its stride (numpy flags it C-contiguous)."""
    reasons = np.zeros(8, dtype=np.uint8)[::4][:1]
    assert reasons.flags.c_contiguous and reasons.strides == (4,)
    core.StepPlanner(POLICY, LIMITS).plan(np.array(ROWS[:1], RESIDENT_DTYPE), 1, reasons)
    assert reasons[0] == sp.Reason.DECODE


# --- noncontiguous-reasons: the two implementations must agree -------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.zeros(8, np.uint8)[::2],
        lambda: np.zeros(4, np.uint8)[::-1],
        lambda: np.zeros(6, np.uint8)[1::2],
    ],
    ids=["every_other", "reversed", "odd_offset"],
)
def test_strided_reasons_parity(compiled, reference, make):
    """fuzz: reasons=base[:2n:2] -> compiled refused ("not contiguous"), reference filled it."""
    results = []
    for impl in (compiled, reference):
        reasons = make()
        got = outcome(
            impl.StepPlanner(POLICY, LIMITS).plan,
            [impl.ResidentState(*r) for r in ROWS],
            None,
            reasons,
        )
        results.append((got, reasons.tolist()))
    assert results[0] == results[1]


# --- mutating-count / shifty-list: Python code that runs while the core reads the input ------


def run_isolated(impl_name: str, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` with ``impl`` bound to the named implementation, in a fresh interpreter."""
    script = textwrap.dedent("""
        import importlib, numpy as np, stepplanner as sp
        impl = importlib.import_module({impl!r})
        limits = sp.StepPlannerLimits(64, 64, 16)
        policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
        planner = impl.StepPlanner(policy, limits)
    """).format(impl=impl_name) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


def impl_name(core) -> str:
    return core.__name__


def test_a_count_whose_index_shrinks_the_list(core):
    """fuzz (-known=mutating-count): a count whose __index__ clears the residents list.
    Compiled measured len() first, then ran __index__, then read the list without bounds
    checks: a segfault (SIGSEGV, exit -11). Expected: the count is checked against the list as
    it is after __index__ ran, so this is ValueError "count=40 exceeds len(residents)=0"."""
    proc = run_isolated(
        impl_name(core),
        """
        rows = [impl.ResidentState(arrival=i, prompt_length=10) for i in range(40)]
        class ShrinkingCount:
            def __index__(self):
                rows.clear()
                return 40
        try:
            planner.plan(rows, ShrinkingCount())
        except (TypeError, ValueError, OverflowError) as exc:
            print("refused", type(exc).__name__.removeprefix("StepPlanner"), exc)
        else:
            print("planned")
    """,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("refused ValueError count=40 exceeds len(residents)=0"), (
        proc.stdout + proc.stderr[-2000:]
    )


def test_a_count_whose_index_grows_the_list_plans_the_rows_it_names(core):
    proc = run_isolated(
        impl_name(core),
        """
        rows = [impl.ResidentState(arrival=0, prompt_length=10)]
        class GrowingCount:
            def __index__(self):
                rows.append(impl.ResidentState(arrival=1, prompt_length=20))
                return 2
        try:
            plan = planner.plan(rows, GrowingCount())
        except (TypeError, ValueError, OverflowError) as exc:
            print("refused", type(exc).__name__.removeprefix("StepPlanner"), exc)
        else:
            print("planned", [(s.resident, s.query_length) for s in plan.sequences])
    """,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.strip() in (
        "planned [(0, 10), (1, 20)]",
        "refused ValueError count=2 exceeds len(residents)=1; allowed: 0..1",
    ), proc.stdout + proc.stderr


def test_apply_to_reads_each_element_once(core):
    """fuzz (-known=shifty-list): apply_to over a list subclass whose __getitem__ answers a
    ResidentState the first time and a bytes object afterwards. Compiled checked the types on
    one read and cast the result of a second read unchecked, so it added the chunk length into
    the bytes object's buffer (heap memory it does not own). Expected: either the check and the
    write see the same objects (the step applies), or an allowed error; the bytes are intact."""
    proc = run_isolated(
        impl_name(core),
        """
        good = impl.ResidentState(arrival=0, prompt_length=10)
        victim = bytes(bytearray(64))
        class ShiftyList(list):
            reads = set()
            def __getitem__(self, i):
                if i in self.reads:
                    return victim
                self.reads.add(i)
                return list.__getitem__(self, i)
        plan = planner.plan([good])
        try:
            plan.apply_to(ShiftyList([good]))
        except (TypeError, ValueError, OverflowError) as exc:
            print("refused", type(exc).__name__.removeprefix("StepPlanner"))
        else:
            print("applied", good.committed)
        print("victim intact" if victim == bytes(64) else "victim CHANGED " + victim.hex())
    """,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    lines = proc.stdout.splitlines()
    assert lines[-1] == "victim intact", proc.stdout
    assert lines[0] in ("applied 10", "refused TypeError"), proc.stdout + proc.stderr[-2000:]


# --- error order: a bad container and a bad count together ---------------------------------


@pytest.mark.parametrize(
    "residents",
    [
        np.zeros(3, RESIDENT_DTYPE.newbyteorder(">")),
        np.zeros((2, 2), RESIDENT_DTYPE),
        None,
        {0: 1},
        np.zeros(3, np.float64),
    ],
    ids=["big_endian", "2d", "None", "dict", "float64"],
)
@pytest.mark.parametrize("count", ["3", 1.5, None, 2], ids=repr)
def test_bad_container_and_bad_count_give_one_error(compiled, reference, residents, count):
    """fuzz (after the mutating-count fix): a big-endian array with count='3' -> compiled
    reported the count ("count must be an integer, got str '3'"), the reference the dtype:
    the compiled core now converts count before it checks the container."""
    results = [
        outcome(impl.StepPlanner(POLICY, LIMITS).plan, residents, count)
        for impl in (compiled, reference)
    ]
    assert results[0] == results[1]


# --- unholdable-batch: a valid max_batch_size too large for the machine --------------------


@pytest.mark.limits_address_space
def test_a_batch_too_large_to_hold_is_a_clear_memory_error(compiled):
    """fuzz: StepPlannerLimits(2**31 - 1, 1, 1) is valid, and the compiled planner sizes its
    buffers for B up front (SPEC §3), so it needs ~218 GiB; it raised a bare MemoryError that
    the harness took for a crash. Expected: MemoryError naming B and the size, with nothing
    left half-made: the same object can then be initialised with a B that fits. The address
    space is capped so the allocation fails on any machine, overcommitting or not."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import resource
        import stepplanner as sp
        from stepplanner import _core
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))
        big = sp.StepPlannerLimits(2**26, 16, 16)
        planner = _core.StepPlanner.__new__(_core.StepPlanner)
        try:
            planner.__init__(sp.resolve_scheduling_policy(sp.SchedulingOptions(), big), big)
        except MemoryError as exc:
            print("MemoryError", exc)
        else:
            raise SystemExit("a 6.8 GiB planner was built under a 3 GiB address-space cap")
        small = sp.StepPlannerLimits(4, 64, 16)
        planner.__init__(sp.resolve_scheduling_policy(sp.SchedulingOptions(), small), small)
        plan = planner.plan([_core.ResidentState(prompt_length=20)])
        print("then", [(s.resident, s.query_length) for s in plan.sequences])
    """),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, then = proc.stdout.splitlines()
    assert first.startswith("MemoryError max_batch_size=67108864 needs 7.3 GiB"), first
    assert "sizes its buffers for max_batch_size up front" in first
    assert then == "then [(0, 20)]"


# --- raw fuzzer inputs, replayed through the harness -----------------------------------------


HARNESS = Path(__file__).resolve().parents[1] / "tools" / "fuzz_plan.py"
FOUND = {  # name: (KNOWN_ISSUES entries to switch on, base64 of the libFuzzer crash input)
    # mutating-count is left out: it kills the interpreter (see the subprocess test above).
    "empty-reasons": (
        {"empty-reasons"},
        "AMXFxcXoxXd3PgAAAAAAAAAAAAAAAAAAAMXFxcXFxcV6/hkZGf9h//f39/f3fhkZ/z0KfHx7"
        "fHx8fCvFxcXFxcXFxcXFxcXFxT4+GP//AAAAAAA+PgIAAAAALj4+AgAAAA==",
    ),
    "noncontiguous-reasons": (
        {"noncontiguous-reasons"},
        "AAAAxcXFxcXFxcXFxcXFxcXFxcXFxTvFxcXFxcXFxcXFAACA/////3chIXc+q6ur"
        "L6urqz4+PlHFxcX//////////2f//5j/AAAAAAAAAAD////////////F////////"
        "/////8X//9AYPv//GD4+Pj4CAAAA",
    ),
    "error-order": (
        {"error-order"},
        "/x3//3od/hkZWSEhISE6ISEhHR0dHR0dHR0dHR0dIR0dHR0dHR0dHR0dHYGBgYGBgYGBgYEd"
        "HR0dHf4ZgYGBgYGBgYGBPYGBgYGBAAAAAP//HR0dHR0dHR0dHR0dHR3+GQCsHR0dHR0dHaqq"
        "qqqBgYGBgYGBgYGBgYGBgT4+GD7Bw8HBwd//DR3///8dHR0dHR0dHR3+GQCsHR0dHR0dHaqq"
        "qqoAAAD/Nf//dwDFxcUAxcXFxcXFxcUAAAAAAAAAAAAAAADFxcXFxcXFxcXFxcWFxTvFxcXF"
        "xdXFxcWkAAAnAAAAAAB3d3d3d3d3d3d3d3d3d3d3dzscCgoA+AoS/yEh/gp3d3d3d3d3d3d3"
        "d3d3hoiIiHd3d3d3d3d3d3d3d3d3d3d3wsJ3d3d3d3d3QXd3d3d3d3d3d3d3d3d3d3d3d3d3"
        "dzo+Pj4+Pj49KioqKioqKioqKioqKioqKioqKioqKioqKiAh/go+qqqqqkE+PkFBQUE+Pry+"
        "QXe/vj53d3d3d3d3d3d3d/v7////d3c+vg==",
    ),
    "unholdable-batch": (
        set(),
        "O8bG1tYh1i7U0f////9+////1tbmAMbGCv//1kD/xsbGACjGAQEAxtHR0dHR0dHR09EC"
        "0dHR8dHR0dHR0dHR0dHR0dHRJycnJycnJyf//wgAAAD//8YAKADGAQEAxv7//38AAAEA"
        "0dHR0RUVFRUVFRUVIdYu1NH////W//8Ifv/W0fHR0QAAAAAAAAAH1g==",
    ),
    "none-request-id": (
        set(),  # a ledger episode: see tests/test_ledger.py for the plain test
        "TE1MTILzgkwA/4KCgpKCgoKCggAAAJKCgubmvubm5v80NLozMzMzgoKCgt/fi9/f39/f39/f"
        "39/f39/f39/f39/f39/f39/f39/f39/fi9/f39/f39/f398739/f35/f39/f3zI3ODAwNTHM"
        "//8AAAB2dt8yNzgwMDUxzP//AAAAdnYJdnZ2dgSsdvs3",
    ),
    "held-back-passed-over": (
        set(),  # issue 34: held_back read a head admission passes over for its adapter
        "TFBBCxPgHpiQnuQSbtW2sd7Bv2C/lFvGk00fQx6nLaQkgnc3iPlMNJG3GTThm76acwh+jzkh"
        "WY46khnvBwVpDyfI3FZ2p9KvbJZLi4i+3CHvMYmNxIfjltelTy3dGMj8742LNv0+5qPr1H5b"
        "qFdXfQeFWI10u0NGaIsDGJCslAeb/yV1Ef+tDQ/H/WOiOfaOa04thR+5O0pnV852Pklg27/Q"
        "eZqRxKBv29zzP8dZz+TEJL3yv/dtts489OS+0Se/aBsWSD12C7XoSPj40JOPNVub3YUSVTHP"
        "IRnBXsvq4DlPfUCH5evneu3gXw349xyIbP1TCGQk/hiZ0M/6ymW0z7aUifAPrunei1NQAnOv"
        "UQ==",
    ),
    "lying-table-inputs": (
        set(),  # issue 20 A.1: a KVPageTable subclass's properties
        "TFBUPFQNDQ0NDQ0NDQ0NDQ0NDQ0NDQ0NPA0NLnEvf71ZEuJ8fKgnJDw03FZQLqdi8dRlUPMJ"
        "8VFRnGSOSAkhrFrhEaMsKKBS9SPl3GBgl4shXuqaD+LeO59M0k/rWC6nYvHUZVAsRTbzCfFR"
        "UZxkAAAJEaMsKKCeAI7jOsg84BvbLNYijvTgULI2jgEAAAAAYg==",
    ),
    "lying-table-rows": (
        set(),  # issue 20 A.1 (the twin sized by the lies)
        "TFBUPJeLf39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/"
        "f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/f39/"
        "f39/f39/f39/f39/f39/f39/f38hXurHoNpNTFQ8l4shPV7qmnmglBCbA+jW",
    ),
    "resized-view-base": (
        set(),  # issue 20 A.2: .base resized, refcheck=False
        "TFQ8l4shXgAAAACUEEgJIaxa4RGjLCigngZy1iKO9OBQsgAAAAAAAAAAAAA2jjBs7wZLNZu0simy3FY=",
    ),
    "re-dtyped-view": (
        set(),  # issue 20 A.3: a handed-out view's dtype set
        "TFBUPJf//////////3mYuMeg2k1rgdVeklmIlWiVO+dWrurtB9tH/S5xPxawWRLifICoJyQ8"
        "TFQ8lzmkfEdn46wP4t47n0zST+tYLqdi8dRlUCyLRTbzCfFRUZxkjkgJIaxa4SFe6pp5oA==",
    ),
    "shifty-list": (
        {"shifty-list"},
        "AD4+PjE+Pj4YPn4+AAAAAAAAAAD///93/4D/dz4+Pj4AAAAAAAD///93/4D/oaGhoaGhoaGh"
        "oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaF3Pj4+Pj4+Pj4HLi4uLi4A"
        "LmA+PiU+PwAA",
    ),
}


def load_harness():
    if not HARNESS.exists():
        pytest.skip("tools/fuzz_plan.py is not beside this tests/ (e.g. a wheel test run)")
    pytest.importorskip("atheris", reason="the fuzz extra is not installed")
    spec = importlib.util.spec_from_file_location("fuzz_plan", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(FOUND))
def test_fuzzer_input_replays_clean(name):
    harness = load_harness()
    known, data = FOUND[name]
    harness.INCLUDE_KNOWN.clear()
    harness.INCLUDE_KNOWN.update(known)
    try:
        harness.one_input(base64.b64decode(data))
    finally:
        harness.INCLUDE_KNOWN.clear()


SEEDS = HARNESS.parent / "fuzz_seeds"


def test_marker_seeds_reach_what_they_mark(monkeypatch):
    """The seeds .ci/run starts its fuzz smoke from: each reaches the episode its marker bytes
    select (a capped T_max; ledgers with page tables that hold rows; subclassed tables and
    tampered views; LoRA adapters, with a request passed over for its adapter while a slot was
    free, paged and not), so the 45 s smoke covers max_step_tokens, the paged ledger, the object
    protocol moves and adapter admission from its first input."""
    harness = load_harness()
    seen = {"capped": 0, "rows": 0, "tables": 0}
    make_limits, check_pages = harness.make_limits, harness.check_pages

    def limits_seen(fdp, capped=False):
        limits = make_limits(fdp, capped)
        seen["capped"] += limits.max_step_tokens != 0 and limits.t_max < (
            limits.max_batch_size * limits.max_input_length
        )
        return limits

    from stepplanner.kv import _kv as kv_compiled
    from stepplanner.kv import _kv_py as kv_reference

    def pages_seen(ledger, table, model):
        seen["tables"] += isinstance(table, (kv_compiled.KVPageTable, kv_reference.KVPageTable))
        seen["rows"] = max(seen["rows"], ledger.count)
        if type(table).__name__ == "Liar":  # a subclass the ledgers took: its lies were harmless
            seen["liar_rows"] = max(seen["liar_rows"], ledger.count)
        check_pages(ledger, table, model)

    monkeypatch.setattr(harness, "make_limits", limits_seen)
    monkeypatch.setattr(harness, "check_pages", pages_seen)
    lying_tables, tamper_view = harness.lying_tables, harness.tamper_view

    def lies_seen(*args):
        seen["liars"] += 1
        return lying_tables(*args)

    def tamper_seen(view, move):
        seen["tampered"] += 1
        tamper_view(view, move)

    check_after = harness.check_after

    def passed_over_seen(op, ok, ledger, model):
        check_after(op, ok, ledger, model)
        if ledger.free_slots and harness.cannot_join(ledger, model):
            seen["paged_passed_over" if ledger.page_table is not None else "passed_over"] += 1

    some_drafts = harness.some_drafts

    def drafts_seen(fdp, ledger, model):
        proposed = some_drafts(fdp, ledger, model)
        if isinstance(proposed, dict):  # an entry for a request that does not decode this step
            ids = ledger.request_ids.tolist()
            decoding = ledger.residents["context_committed"].astype(bool).tolist()
            seen["not_decoding"] += any(
                rid not in ids or not decoding[ids.index(rid)] for rid in proposed
            )
        return proposed

    seen.update(liars=0, liar_rows=0, tampered=0, passed_over=0, paged_passed_over=0)
    seen.update(not_decoding=0)
    monkeypatch.setattr(harness, "some_drafts", drafts_seen)
    monkeypatch.setattr(harness, "lying_tables", lies_seen)
    monkeypatch.setattr(harness, "tamper_view", tamper_seen)
    monkeypatch.setattr(harness, "check_after", passed_over_seen)
    names = sorted(p.name for p in SEEDS.iterdir())
    assert names == [
        "adapters-ledger",
        "capped-paged-ledger",
        "capped-planner",
        "drafts-ledger",
        "drafts-planner",
        "paged-adapters-ledger",
        "paged-ledger",
        "tampered-ledger",
        "tampered-paged-ledger",
    ]
    for name in names:
        harness.one_input((SEEDS / name).read_bytes())
    assert seen["capped"] >= 1 and seen["tables"] >= 2 and seen["rows"] >= 2, seen
    assert seen["liars"] >= 1 and seen["liar_rows"] >= 2 and seen["tampered"] >= 2, seen
    assert seen["passed_over"] >= 1 and seen["paged_passed_over"] >= 1, seen
    assert seen["not_decoding"] >= 1, seen


def test_the_drafts_seed_plans_drafts_and_meddling_reads(monkeypatch):
    """tools/fuzz_seeds/drafts-planner (marker D) reaches plans that grant drafts and a plan
    whose drafts list changed the residents while it was read (issue 41), so the CI smoke
    compares the two cores there from its first input."""
    harness = load_harness()
    seen = {"granted": 0, "meddled": 0}
    plan_outcome = harness.Lane.plan_outcome

    def outcome_seen(lane, count, reasons, drafts=None):
        result = plan_outcome(lane, count, reasons, drafts)
        if result[0] == "ok":
            seen["granted"] += result[2] > 0
            seen["meddled"] += isinstance(drafts, harness._MeddlingDrafts)
        return result

    monkeypatch.setattr(harness.Lane, "plan_outcome", outcome_seen)
    harness.one_input((SEEDS / "drafts-planner").read_bytes())
    assert seen["granted"] >= 1 and seen["meddled"] >= 1, seen
