"""Coverage-guided fuzzing of stepplanner's public entry points with atheris (libFuzzer).

Each input is decoded into a short engine episode: limits and scheduling options (valid or not),
a policy (resolved, or hand-built), then up to ``MAX_STEPS`` calls of ``plan()`` on one compiled
and one reference planner, each over the same ledger rows in a randomly chosen container (list,
tuple, strided/reversed/unaligned/read-only array, wrong dtype, foreign elements, ...), with a
fuzzed ``count`` and ``reasons`` array, followed by ``apply_to`` on both. The harness fails when

* the two implementations disagree: on the plan, on the reasons codes, on the ledger rows after
  ``apply_to``, or on ``(type, message)`` of an error;
* any call raises something other than TypeError/ValueError/OverflowError (RuntimeError only
  for an unresolved mode in the planner constructor, MemoryError only there and only for a
  max_batch_size of ``UNHOLDABLE_BATCH`` or more);
* a call that raised changed the previous plan (``to_dict`` before vs after);
* an accepted plan breaks an invariant (``stepplanner.planner.checks.check_plan``);
* the process dies (a segfault in the compiled core is reported by libFuzzer as a crash).

An input starting with ``LEDGER_MARKER`` is a ``Ledger`` episode instead: fuzzed submit / cancel /
admit / apply with a sampler's mask / fused step / retire / load sequences on the compiled ledger
and its pure-Python twin side by side, checked against each other, the live ids, the queue bound
and the reserved-slot rule (see ``ledger_episode``). After ``LEDGER_MARKER``, ``PAGES_MARKER``
gives both ledgers a KV page table (compiled and reference) over a fuzzed pool. After those,
``TAMPER_MARKER`` adds the object-protocol moves (issue 20): page tables of a subclass whose
properties lie about the table (or whose methods do nothing), and handed-out views whose dtype,
shape, strides or flags are set, or whose ``.base`` chain is resized. Last, ``ADAPTERS_MARKER``
gives both ledgers a fuzzed ``max_loras`` and each submit a fuzzed ``lora_id`` (issue 34): the
compiled ledger parks the requests whose adapter cannot join, the twin walks past them, and
the two must still agree on every admission and on ``waiting_ids()``. Before either kind,
``STEP_CAP_MARKER`` gives the limits a fuzzed ``max_step_tokens`` (SPEC §1). Markers are
bytes, not decoded choices, so that every earlier input decodes as it did.

The Python modules of stepplanner are coverage-instrumented (``atheris.instrument_imports``);
the compiled core is not, unless it is rebuilt with ``-fsanitize=fuzzer-no-link`` (see
docs/reliability.md), so coverage guidance reaches the core only through the Python around it.

Run (libFuzzer flags pass through):
    python tools/fuzz_plan.py -max_total_time=45             # CI smoke
    python tools/fuzz_plan.py -max_total_time=900 corpus/    # longer, keeps a corpus
    python tools/fuzz_plan.py crash-<sha1>                   # replay one input
Inputs that hit an already reported problem (``KNOWN_ISSUES``, each with a failing test in
tests/test_fuzz_regressions.py) are not generated, so the fuzzer explores past them;
``-known=1`` generates them all, ``-known=NAME,NAME`` some. Remove an entry once its problem
is fixed.
"""

from __future__ import annotations

import sys
import warnings

import atheris
import numpy as np

with atheris.instrument_imports(include=["stepplanner"]):
    import stepplanner
    from stepplanner import _core
    from stepplanner import _core_py as _reference
    from stepplanner.kv import _kv
    from stepplanner.kv import _kv_py as _kv_reference
    from stepplanner.ledger import Ledger
    from stepplanner.ledger import _ledger as _ledger_core
    from stepplanner.ledger import _ledger_py as _ledger_reference
    from stepplanner.planner.checks import check_plan

ALLOWED = (TypeError, ValueError, OverflowError)
IMPLS = (_core, _reference)
MAX_ROWS = 12
MAX_STEPS = 6
LEDGER_MARKER = b"L"  # an input starting with it is a ledger episode
PAGES_MARKER = b"P"  # right after LEDGER_MARKER: the ledgers own KV page tables
TAMPER_MARKER = b"T"  # after those: subclassed tables and tampered views (object protocol)
STEP_CAP_MARKER = b"S"  # before either kind: the limits carry a fuzzed max_step_tokens
ADAPTERS_MARKER = b"A"  # after those: LoRA adapters (max_loras, lora_id)
LEDGER_DRAFTS_MARKER = (
    b"V"  # last of a ledger's markers: steps that verify drafts (drafts, accepted)
)
PLANNER_DRAFTS_MARKER = b"D"  # a planner episode (after S, if any) whose plans are given drafts
UNHOLDABLE_BATCH = 2**24  # slots; ~1.7 GiB of planner buffers, which any test machine holds
INT32_MIN, INT32_MAX, UINT64_MAX = -(2**31), 2**31 - 1, 2**64 - 1
FIELDS = stepplanner.RESIDENT_DTYPE.names
# Input kinds that hit a reported, not yet fixed problem: not generated unless -known=NAME (see
# the module doc). Found and fixed so far (each replayed by tests/test_fuzz_regressions.py):
# mutating-count, shifty-list, empty-reasons, noncontiguous-reasons, error-order,
# unholdable-batch, none-request-id.
KNOWN_ISSUES: dict[str, str] = {}
INCLUDE_KNOWN: set[str] = set()


def generates(kind: str) -> bool:
    """Whether inputs of ``kind`` are generated: always, unless it is a known open issue."""
    return kind not in KNOWN_ISSUES or kind in INCLUDE_KNOWN


class Disagreement(AssertionError):
    """The two implementations (or an implementation and the contract) disagree."""


# --- decoding bytes into values ------------------------------------------------------------


INTERESTING = (
    0,
    1,
    -1,
    2,
    16,
    32,
    64,
    INT32_MAX,
    INT32_MIN,
    INT32_MAX + 1,
    INT32_MIN - 1,
    UINT64_MAX,
    UINT64_MAX + 1,
    2**63,
    2**100,
)


def hostile_scalar(fdp: atheris.FuzzedDataProvider) -> object:
    """A value of a type a caller should not pass for an integer field, or a boundary int."""
    kind = fdp.ConsumeIntInRange(0, 11)
    return [
        None,
        1.5,
        "3",
        b"\x01",
        True,
        np.int64(3),
        np.uint64(2**63),
        np.float64(2.0),
        np.bool_(True),
        [1],
        fdp.PickValueInList(list(INTERESTING)),
        np.int8(-1),
    ][kind]


def int_or_hostile(fdp: atheris.FuzzedDataProvider, lo: int, hi: int) -> object:
    if fdp.ConsumeProbability() < 0.9:
        return fdp.ConsumeIntInRange(lo, hi)
    return hostile_scalar(fdp)


def make_limits(fdp: atheris.FuzzedDataProvider, capped: bool = False) -> object:
    b = int_or_hostile(fdp, 1, MAX_ROWS)
    s_in = int_or_hostile(fdp, 1, 80)
    page = int_or_hostile(fdp, 1, 40)
    if not capped:
        return stepplanner.StepPlannerLimits(b, s_in, page)
    # Up to past B × S_in (MAX_ROWS × 80 = 960): below max(P, B) it must be refused, above
    # B × S_in it caps nothing.
    step = int_or_hostile(fdp, 0, MAX_ROWS * 80 + 40)
    return stepplanner.StepPlannerLimits(b, s_in, page, step)


def make_options(fdp: atheris.FuzzedDataProvider, limits: object) -> object:
    t_max = limits.t_max
    page = limits.kv_page_size
    mnt = 0 if fdp.ConsumeBool() else int_or_hostile(fdp, 0, t_max + 2)
    mct = 0 if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 8) * page
    if fdp.ConsumeProbability() < 0.05:
        mct = hostile_scalar(fdp)
    return stepplanner.SchedulingOptions(
        ifb_scheduling_mode=int_or_hostile(fdp, 0, 2),
        max_num_tokens=mnt,
        max_chunk_tokens=mct,
        scheduling_policy=int_or_hostile(fdp, 0, 1),
        preemption=int_or_hostile(fdp, 0, 1),
        priority_reserved_slots=int_or_hostile(fdp, 0, limits.max_batch_size),
        max_pause_steps=int_or_hostile(fdp, 0, 4),
    )


def make_policy(fdp: atheris.FuzzedDataProvider, limits: object) -> object:
    """Usually a resolved policy; sometimes a hand-built one the planner must check."""
    if fdp.ConsumeProbability() < 0.85:
        return stepplanner.resolve_scheduling_policy(make_options(fdp, limits), limits)
    return stepplanner.ResolvedSchedulingPolicy(
        mode=fdp.ConsumeIntInRange(0, 2),
        max_num_tokens=fdp.ConsumeIntInRange(-1, limits.t_max + 2),
        max_chunk_tokens=fdp.ConsumeIntInRange(-1, limits.t_max + 2),
        scheduling_policy=fdp.ConsumeIntInRange(0, 1),
        preemption=fdp.ConsumeIntInRange(0, 1),
        priority_reserved_slots=fdp.ConsumeIntInRange(0, limits.max_batch_size),
        max_pause_steps=fdp.ConsumeIntInRange(0, 3),
    )


def make_row(fdp: atheris.FuzzedDataProvider, s_in: int, arrival: int) -> tuple:
    """One ledger row that fits RESIDENT_DTYPE; mostly plannable, sometimes not."""
    decoding = fdp.ConsumeBool()
    # min(.., INT32_MAX): with max_step_tokens, S_in itself may be INT32_MAX (T_max is capped).
    prompt = fdp.ConsumeIntInRange(1, min(s_in + 1, INT32_MAX))
    committed = (
        fdp.ConsumeIntInRange(prompt, min(prompt + 8, INT32_MAX))
        if decoding
        else fdp.ConsumeIntInRange(0, prompt - 1)
    )
    row = [
        fdp.ConsumeIntInRange(-2, 3),
        arrival,
        prompt,
        committed,
        decoding,
        fdp.ConsumeIntInRange(0, 5),
    ]
    if fdp.ConsumeProbability() < 0.08:  # a boundary value in one field
        field = fdp.ConsumeIntInRange(0, 5)
        row[field] = fdp.PickValueInList(
            [0, UINT64_MAX]
            if field == 1
            else [False, True]
            if field == 4
            else [INT32_MIN, -1, 0, INT32_MAX, INT32_MAX - 1]
        )
    return tuple(row)


# --- running one call on both implementations ----------------------------------------------


def outcome(fn, *args) -> tuple:
    """("ok", value) or ("err", type name, message); other exception types are failures."""
    try:
        return ("ok", fn(*args))
    except ALLOWED as exc:
        return ("err", type(exc).__name__, str(exc))


def same(what: str, a: tuple, b: tuple, context: object) -> None:
    if a != b:
        raise Disagreement(f"{what}: compiled={a!r}\nreference={b!r}\ncontext={context!r}")


class Lane:
    """One implementation's planner and its copy of the ledger rows."""

    def __init__(self, impl, policy, limits) -> None:
        self.impl = impl
        self.planner = impl.StepPlanner(policy, limits)
        self.container: object = None
        self.plan = None  # the planner's one StepPlan, once a call has returned it

    def plan_outcome(self, count: object, reasons: object, drafts: object = None) -> tuple:
        before = None if self.plan is None else self.plan.to_dict()
        result = outcome(self.planner.plan, self.container, count, reasons, drafts)
        if result[0] == "ok":
            self.plan = result[1]
            return (
                "ok",
                self.plan.to_dict(),
                self.plan.draft_tokens,
                None if reasons is None else reasons.tolist(),
            )
        after = None if self.plan is None else self.plan.to_dict()
        if before != after:
            raise Disagreement(
                f"{self.impl.IMPLEMENTATION}: a call that raised {result} "
                f"changed the previous plan {before} -> {after}"
            )
        return result


def rows_of(container: object) -> list[tuple]:
    if isinstance(container, np.ndarray):
        return [tuple(r) for r in container.tolist()]
    items = list.__iter__(container) if isinstance(container, list) else container
    return [r._astuple() for r in items if hasattr(r, "_astuple")]  # drop a stray element


def build_container(impl, rows: list[tuple], shape: int, foreign: object) -> object:
    """The rows in the container kind ``shape`` (chosen once per step for both lanes)."""
    if shape <= 2:  # list / tuple / list subclass of ResidentState
        objs = [impl.ResidentState(*r) for r in rows]
        if foreign is not None and objs:
            objs[len(objs) // 2] = foreign
        if shape == 2 and generates("shifty-list"):
            return _ShiftyList(objs)
        return tuple(objs) if shape == 1 else (_ListSub(objs) if shape == 2 else objs)
    arr = np.array(rows, dtype=stepplanner.RESIDENT_DTYPE)
    if shape == 3:
        return arr
    if shape == 4:
        return every_other(arr)
    if shape == 5:  # reversed view, negative stride
        return arr[::-1].copy()[::-1]
    if shape == 6:  # unaligned rows inside a bytearray
        raw = bytearray(1 + arr.nbytes)
        view = np.frombuffer(raw, dtype=stepplanner.RESIDENT_DTYPE, offset=1, count=len(rows))
        view[:] = arr
        return view
    if shape == 7:
        arr.flags.writeable = False
        return arr
    if shape == 8:  # a wrong dtype must be refused, never reinterpreted
        return arr.astype(stepplanner.RESIDENT_DTYPE.newbyteorder(">"))
    if shape == 9:
        return arr.view(np.uint8)
    if shape == 10:
        return arr.reshape(1, -1) if len(rows) else arr.reshape(0, 1)
    return foreign  # not a container at all


def every_other(arr: np.ndarray) -> np.ndarray:
    """``arr``'s values as every other entry of an array twice as long: a strided view."""
    big = np.zeros(2 * len(arr), dtype=arr.dtype)
    big[::2] = arr
    return big[::2]


class _ListSub(list):
    """A list subclass: accepted as a list, read through the generic sequence protocol."""


class _ShiftyList(list):
    """Answers each index truthfully once, then with an immutable bytes object: a reader that
    checks one read and uses another writes into memory it does not own."""

    def __init__(self, items: list) -> None:
        super().__init__(items)
        self.reads: set[int] = set()
        self.victim = bytes(bytearray(64))  # a fresh object, not the interned constant

    def __getitem__(self, index):
        if isinstance(index, int) and index in self.reads:
            return self.victim
        if isinstance(index, int):
            self.reads.add(index)
        return super().__getitem__(index)


def make_count(
    fdp: atheris.FuzzedDataProvider, n: int, lanes: list[Lane], bad_container: bool
) -> list[object]:
    """One count per lane (a mutator needs each lane's own container)."""
    roll = fdp.ConsumeProbability()
    if bad_container and not generates("error-order"):
        roll = min(roll, 0.84)
    if roll < 0.5:
        return [None] * len(lanes)
    if roll < 0.85:
        c = fdp.ConsumeIntInRange(-1, n + 1)
        return [c] * len(lanes)
    if roll < 0.97 or not generates("mutating-count"):
        c = hostile_scalar(fdp)
        return [c] * len(lanes)
    cut = fdp.ConsumeIntInRange(0, n)
    return [_MutatingCount(lane.container, cut, n) for lane in lanes]


class _MutatingCount:
    """A count whose __index__ shrinks the residents list it is about to bound."""

    def __init__(self, container: object, cut: int, value: int) -> None:
        self.container, self.cut, self.value = container, cut, value

    def __index__(self) -> int:
        if isinstance(self.container, list):
            del self.container[self.cut :]
        return self.value

    def __repr__(self) -> str:
        return f"_MutatingCount(cut={self.cut}, value={self.value})"


def make_reasons(fdp: atheris.FuzzedDataProvider, n: int) -> tuple | None:
    """A recipe for the reasons array (each lane gets a fresh array made from it)."""
    roll = fdp.ConsumeProbability()
    if roll < 0.55:
        return None
    if roll < 0.85:
        length = n + fdp.ConsumeIntInRange(0, 2)
        return ("ok", length if generates("empty-reasons") else max(length, 1))
    bad = fdp.ConsumeIntInRange(0, 5 if generates("noncontiguous-reasons") else 3)
    return ("bad", bad, max(0, n + fdp.ConsumeIntInRange(-2, 1)))


def reasons_from(recipe: tuple | None) -> object:
    if recipe is None:
        return None
    kind, *rest = recipe
    if kind == "ok":
        return np.full(rest[0], 0xEE, dtype=np.uint8)
    bad, length = rest
    base = np.full(max(length, 1) * 2, 0xEE, dtype=np.uint8)
    return [
        base[:length].astype(np.int8),
        base[:length].reshape(1, -1),
        _readonly(base[:length]),
        list(base[:length]),
        base[: 2 * length : 2],  # noncontiguous-reasons
        base[:length][::-1],  # noncontiguous-reasons
    ][bad]


def make_drafts(fdp: atheris.FuzzedDataProvider, n: int) -> tuple | None:
    """A recipe for drafts (SPEC §8; each lane gets its own made from it): values valid for the
    rows or hostile, in a list, tuple, int32 array (contiguous or strided) or a container the
    planner must refuse (masked, big-endian, int64), or a list whose reads change the lane's
    residents (issue 41: what the planner checked must be what it plans)."""
    roll = fdp.ConsumeProbability()
    if roll < 0.25:
        return None
    length = max(0, n + (fdp.ConsumeIntInRange(-1, 1) if fdp.ConsumeProbability() < 0.1 else 0))
    values: list[object] = [fdp.ConsumeIntInRange(0, 6) for _ in range(length)]
    if values and fdp.ConsumeProbability() < 0.15:
        values[fdp.ConsumeIntInRange(0, length - 1)] = hostile_scalar(fdp)
    kind = fdp.ConsumeIntInRange(0, 7)
    meddle = None
    if kind == 7:  # the list's reads change one row of the residents to a fuzzed field value
        meddle = (
            fdp.ConsumeIntInRange(0, max(n - 1, 0)),
            fdp.PickValueInList(["committed", "prompt_length", "context_committed"]),
            fdp.ConsumeIntInRange(-8, 80),
        )
    return (kind, values, meddle)


def drafts_from(recipe: tuple | None, container: object) -> object:
    if recipe is None:
        return None
    kind, values, meddle = recipe
    if meddle is not None:
        return _MeddlingDrafts(values, container, meddle)
    if kind >= 2 and not all(type(v) is int and INT32_MIN <= v <= INT32_MAX for v in values):
        kind = 0  # an array cannot hold a hostile value: the list carries it
    if kind == 0:
        return list(values)
    if kind == 1:
        return tuple(values)
    arr = np.array(values, dtype=np.int32)
    if kind == 2:
        return arr
    if kind == 3:
        return every_other(arr)
    if kind == 4:
        return np.ma.masked_array(arr, mask=[i % 2 == 0 for i in range(len(values))])
    if kind == 5:
        return arr.astype(">i4")
    return arr.astype(np.int64)


class _MeddlingDrafts(list):
    """Drafts whose every read first sets one field of one resident in the lane's container."""

    def __init__(self, items: list, container: object, meddle: tuple) -> None:
        super().__init__(items)
        self.container, self.meddle = container, meddle

    def __getitem__(self, index):
        row, field, value = self.meddle
        try:
            if isinstance(self.container, np.ndarray) and self.container.flags.writeable:
                if row < self.container.shape[0] and self.container.dtype.names:
                    self.container[field][row] = value
            elif isinstance(self.container, list | tuple) and row < len(self.container):
                target = (
                    list.__getitem__(self.container, row)
                    if isinstance(self.container, list)
                    else self.container[row]
                )
                if hasattr(target, "_astuple"):
                    setattr(target, field, value)
        except ALLOWED:
            pass  # a value the field cannot take: both lanes refuse it alike
        return super().__getitem__(index)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def resident_state_parity(fdp: atheris.FuzzedDataProvider) -> None:
    """Constructor and setters of ResidentState: same value or same error on both."""
    values = [
        hostile_scalar(fdp) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-3, 3) for _ in FIELDS
    ]
    field = fdp.PickValueInList(list(FIELDS))
    late = hostile_scalar(fdp)
    results = []
    for impl in IMPLS:
        made = outcome(impl.ResidentState, *values)
        if made[0] == "ok":
            obj = made[1]
            before = obj._astuple()
            set_result = outcome(setattr, obj, field, late)
            if set_result[0] == "err" and obj._astuple() != before:
                raise Disagreement(f"{impl.IMPLEMENTATION}: failed setter changed {before}")
            made = ("ok", set_result[1:], obj._astuple())
        results.append(made)
    same("ResidentState", results[0], results[1], (values, field, late))


# --- one episode ---------------------------------------------------------------------------


def step(
    fdp: atheris.FuzzedDataProvider,
    lanes: list[Lane],
    rows: list[tuple],
    limits: object,
    drafts: bool = False,
) -> list[tuple]:
    """Plan (and apply) one step on both lanes; return the ledger rows for the next step."""
    shape = fdp.ConsumeIntInRange(0, 11)
    foreign = None  # a stray element in a list, or the whole non-container argument
    if shape == 11 or (shape <= 2 and fdp.ConsumeProbability() < 0.1):
        foreign = fdp.PickValueInList(
            [None, 7, "r", (0, 0, 1, 0, False, 0), {0: 1}, np.float64(1.0), range(3)]
        )
    for lane in lanes:
        lane.container = build_container(lane.impl, rows, shape, foreign)
    counts = make_count(fdp, len(rows), lanes, bad_container=shape >= 8)
    recipe = make_reasons(fdp, len(rows))
    proposal = make_drafts(fdp, len(rows)) if drafts else None
    results = [
        lane.plan_outcome(c, reasons_from(recipe), drafts_from(proposal, lane.container))
        for lane, c in zip(lanes, counts, strict=True)
    ]
    context = (rows, shape, counts[0], recipe, proposal)
    same("plan", results[0], results[1], context)
    if results[0][0] != "ok":
        return rows
    if proposal is not None and proposal[2] is not None:  # the rows as the drafts' reads left them
        rows = rows_of(lanes[1].container)
        same("meddled rows", rows_of(lanes[0].container), rows, context)
    planned = lanes[1].plan.num_residents
    given = None if proposal is None else [int(v) for v in proposal[1][:planned]]
    check_plan(lanes[1].planner.policy, limits, rows[:planned], lanes[1].plan, drafts=given)
    return apply_both(lanes, rows, context)


def apply_both(lanes: list[Lane], rows: list[tuple], context: object) -> list[tuple]:
    applied = []
    for lane in lanes:
        if isinstance(lane.container, _ShiftyList):
            lane.container.reads.clear()
        res = outcome(lane.plan.apply_to, lane.container)
        if isinstance(lane.container, _ShiftyList) and lane.container.victim != bytes(64):
            raise Disagreement(
                f"{lane.impl.IMPLEMENTATION}: apply_to wrote into an immutable "
                f"bytes object: {lane.container.victim!r}"
            )
        after = rows_of(lane.container) if res[0] == "ok" else None
        applied.append((res[0], res[1:] if res[0] == "err" else None, after))
    same("apply_to", applied[0], applied[1], context)
    return applied[1][2] if applied[1][0] == "ok" else rows


def evolve(
    fdp: atheris.FuzzedDataProvider, rows: list[tuple], s_in: int, next_arrival: int
) -> list[tuple]:
    """Between steps: retire finished decoders, admit new rows, as a runtime would."""
    out = [r for r in rows if not (r[4] and fdp.ConsumeProbability() < 0.3)]
    while len(out) < MAX_ROWS and fdp.ConsumeProbability() < 0.3:
        out.append(make_row(fdp, s_in, next_arrival + len(out)))
    if out and fdp.ConsumeProbability() < 0.2:
        i = fdp.ConsumeIntInRange(0, len(out) - 1)
        out.insert(0, out.pop(i))  # residents may be reordered; order must not care
    return out


# --- a ledger episode ------------------------------------------------------------------------


class LedgerModel:
    """What the ledger must hold, kept by the harness: every id submitted and not yet retired
    is waiting or resident, exactly once; nothing else is."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.leaving: set[int] = set()  # cancelled while a step() plan was pending: still rows
        self.priority: dict[int, int] = {}
        self.max_new: dict[int, int] = {}
        self.lora: dict[int, int] = {}  # a submitted request's adapter (0: the base model)
        self.step_plans: dict[int, object] = {}  # id(ledger) -> what its last step() returned

    def check(self, ledger: Ledger) -> None:
        resident = ledger.request_ids.tolist()
        waiting = ledger.waiting_ids()
        if len(set(resident)) != len(resident) or set(resident) & set(waiting):
            raise Disagreement(f"ledger holds an id twice: resident {resident}, waiting {waiting}")
        self.leaving &= set(resident)  # they leave with the loop's next call, and only then
        expected = self.live | self.leaving
        if set(resident) | set(waiting) != expected or len(waiting) != ledger.waiting:
            raise Disagreement(
                f"ledger lost or invented ids: resident {resident}, waiting "
                f"{waiting}, expected {sorted(map(int, expected))}"
            )
        if len(ledger.residents) != ledger.count or ledger.count > ledger.capacity:
            raise Disagreement(f"ledger count {ledger.count} vs {len(ledger.residents)} rows")
        if ledger.waiting > ledger.max_waiting:
            raise Disagreement(f"{ledger.waiting} waiting past max_waiting={ledger.max_waiting}")
        arrivals = ledger.residents["arrival"].tolist()
        if len(set(arrivals)) != len(arrivals):
            raise Disagreement(f"ledger residents repeat an arrival: {arrivals}")


def table_module(table: object) -> object:
    """The KV module whose ``KVPageTable`` ``table`` is (or subclasses)."""
    return _kv if isinstance(table, _kv.KVPageTable) else _kv_reference


def real_table(table: object) -> tuple:
    """(rows, page counts, Geometry) of ``table`` as its storage holds them: read through its
    module and class, past whatever a subclass's properties say."""
    module = table_module(table)
    rows = module.KVPageTable.rows.__get__(table)
    return rows, module.counts(table), module.geometry(table)


def ledger_snapshot(ledger: Ledger) -> tuple:
    state = (
        ledger.to_records(),
        ledger.waiting_ids(),
        ledger.count,
        ledger.output_tokens.tolist(),
        ledger.finished_ids.tolist(),
    )
    table = ledger.page_table
    if table is None:
        return state
    rows, counts, sizes = real_table(table)
    return state + (
        rows.tolist(),
        counts.tolist(),
        sizes.num_free_pages,
        ledger.reserved_pages,
        ledger.held_back,
        ledger.kv_pages_in_use(),
    )


LEDGER_ALLOWED = ALLOWED + (stepplanner.QueueFullError,)


def ledger_outcome(call, ledger, planner) -> tuple:
    """("ok", plain value) or ("err", type name, message), as ``outcome`` for the ledgers."""
    try:
        value = call(ledger, planner)
    except LEDGER_ALLOWED as exc:
        return ("err", type(exc).__name__, str(exc))
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif hasattr(value, "to_dict"):
        value = value.to_dict()
    return ("ok", value)


def ledger_episode(
    fdp: atheris.FuzzedDataProvider,
    capped: bool = False,
    paged: bool = False,
    tamper: bool = False,
    adapters: bool = False,
    drafts: bool = False,
) -> None:
    """Ledger operations in a fuzzed order with fuzzed (sometimes hostile) arguments, on the
    compiled ledger (with the compiled planner) and the pure-Python twin (with the reference
    planner) side by side. Fails when the two disagree on a result, an error or the state after
    an operation; when an operation raises anything but TypeError/ValueError/OverflowError/
    QueueFullError, or raised and changed the ledger; when the ledger loses, duplicates or
    invents a request, passes max_waiting, or breaks the reserved-slot rule; or when a plan
    breaks an invariant. With ``paged``, each ledger owns a page table (the compiled ledger the
    compiled one) over the same fuzzed pool; the tables must agree page for page and keep their
    invariants, and admission may hold requests back only for want of pages. With ``tamper``,
    the tables may be of a subclass that lies (``lying_tables``) and an operation may tamper
    with a view the ledger handed out (``tamper_op``). With ``adapters``, the ledgers take a
    fuzzed ``max_loras`` and requests a ``lora_id``; the residents must never hold more
    adapters than that, and admission may leave a request waiting for want of one. With
    ``drafts``, one more operation is the fused step with ``drafts`` (an int, or a mapping that
    names decoding, prefilling, waiting and unknown requests, with hostile values) and
    ``accepted`` counts (valid, out of range, big-endian, or a view of ``ledger.residents``
    itself) over the pending plan (``drafted_step``)."""
    b = fdp.ConsumeIntInRange(1, 8)
    s_in, page = fdp.ConsumeIntInRange(1, 40), fdp.ConsumeIntInRange(1, 16)
    floor = max(b, page)  # the least max_step_tokens allowed; at or past B × S_in it caps nothing
    step = fdp.ConsumeIntInRange(floor, max(floor, b * s_in)) if capped else 0
    limits = stepplanner.StepPlannerLimits(b, s_in, page, step)
    try:
        policy = stepplanner.resolve_scheduling_policy(
            stepplanner.SchedulingOptions(
                scheduling_policy=fdp.ConsumeIntInRange(0, 1),
                preemption=fdp.ConsumeIntInRange(0, 1),
                priority_reserved_slots=fdp.ConsumeIntInRange(0, b - 1),
                max_pause_steps=fdp.ConsumeIntInRange(0, 3),
            ),
            limits,
        )
    except ALLOWED:
        return  # e.g. rd(T_max) < B + P: no policy exists for these limits
    max_waiting = None if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 6)
    max_loras = int_or_hostile(fdp, 1, 3) if adapters else None
    tables: tuple = (None, None)
    if paged:  # a pool from a page short of one row's worst case to more than all rows hold
        max_pages = fdp.ConsumeIntInRange(1, 12)
        num_pages = fdp.ConsumeIntInRange(1, b * max_pages + 2)
        classes = (_kv.KVPageTable, _kv_reference.KVPageTable)
        slots = b
        if tamper and fdp.ConsumeProbability() < 0.5:
            classes, slots, page_real = lying_tables(fdp, b, max_pages, num_pages, page)
            tables = (
                classes[0](slots, max_pages, num_pages, page_real),
                classes[1](slots, max_pages, num_pages, page_real),
            )
            inputs = [
                plain_outcome(m.StepInputs, limits, t) for m, t in zip((_kv, _kv_reference), tables)
            ]
            same("StepInputs() over a subclassed table", inputs[0][:3], inputs[1][:3], classes)
        else:
            tables = (
                classes[0](b, max_pages, num_pages, page),
                classes[1](b, max_pages, num_pages, page),
            )
    made = [
        plain_outcome(
            cls, limits, policy, max_waiting=max_waiting, page_table=table, max_loras=max_loras
        )
        for cls, table in zip((_ledger_core.Ledger, _ledger_reference.Ledger), tables)
    ]
    same("Ledger()", made[0][:3], made[1][:3], (limits, tables, max_loras))
    if made[0][0] == "err":
        return
    ledgers = (made[0][3], made[1][3])
    planners = [impl.StepPlanner(policy, limits) for impl in IMPLS]
    model = LedgerModel()
    for _ in range(fdp.ConsumeIntInRange(1, 24)):
        if not fdp.remaining_bytes():
            break  # an exhausted provider answers 0 to everything: submits of nothing
        top = 10 if tamper else 9
        op = fdp.ConsumeIntInRange(0, top + 1 if drafts else top)
        if op == top + 1:  # (drafts only: every earlier input draws its ops as before)
            op = DRAFTED_STEP
        for _ in range(fdp.ConsumeIntInRange(1, 4) if op == 0 else 1):  # arrivals in bursts
            before = [ledger_snapshot(ledger) for ledger in ledgers]
            call, accepted = ledger_op(fdp, op, ledgers[0], model, limits, adapters)
            results = [
                ledger_outcome(call, ledger, planner) for ledger, planner in zip(ledgers, planners)
            ]
            after = [ledger_snapshot(ledger) for ledger in ledgers]
            same(f"ledger op {op}", results[0], results[1], before[0])
            same(f"ledger op {op} state", after[0], after[1], before[0])
            if results[0][0] == "err":
                if after[0] != before[0]:
                    raise Disagreement(
                        f"ledger op {op} raised but changed the ledger: {before[0]} -> {after[0]}"
                    )
            else:
                accepted(results[0][1])
            check_after(op, results[0][0] == "ok", ledgers[0], model)


def check_after(op: int, ok: bool, ledger: Ledger, model: LedgerModel) -> None:
    model.check(ledger)
    table = ledger.page_table
    if table is not None:
        check_pages(ledger, table, model)
    held = resident_adapters(ledger)
    if ledger.max_loras is not None and len(held) > ledger.max_loras:
        raise Disagreement(f"residents hold {sorted(held)}: max_loras={ledger.max_loras}")
    if ok and op in (1, 8) and not ledger.held_back:
        # An admission ran: nothing admissible may be left waiting (``held_back``: the next
        # request admission takes, the first whose adapter can join, does not fit the free
        # pages, and nothing may overtake it; with ``max_loras``: a request whose adapter would
        # be one too many may wait).
        blocked = cannot_join(ledger, model)
        waiting = [r for r in ledger.waiting_ids() if r not in blocked]
        normal = [r for r in waiting if model.priority[r] >= 0]
        urgent = [r for r in waiting if model.priority[r] < 0]
        if ledger.free_slots and (urgent or (normal and ledger.free_slots > ledger.reserved_slots)):
            raise Disagreement(
                f"admission left {waiting} waiting with {ledger.free_slots} free "
                f"slots ({ledger.reserved_slots} reserved)"
            )


def resident_adapters(ledger: Ledger) -> set[int]:
    """The distinct adapters the residents hold (the base model, 0, is none)."""
    return {r.get("lora_id", 0) for r in ledger.to_records()} - {0}


def cannot_join(ledger: Ledger, model: LedgerModel) -> set[int]:
    """Waiting requests whose adapter cannot join the residents' now: all ``max_loras`` adapter
    slots are held, and not by theirs."""
    held = resident_adapters(ledger)
    if ledger.max_loras is None or len(held) < ledger.max_loras:
        return set()
    return {r for r in ledger.waiting_ids() if model.lora.get(r, 0) not in held | {0}}


def check_pages(ledger: Ledger, table: object, model: LedgerModel) -> None:
    """The table's own invariants, plus what the ledger promises of it: row ``i`` is slot ``i``,
    a slot past the last row holds nothing, and every row holds its worst case (prompt +
    max_new_tokens), so its committed KV always fits."""
    _, counts_view, sizes = real_table(table)
    table_module(table).KVPageTable.check(table)  # the class's own check, not a subclass's
    counts = counts_view.tolist()
    if any(counts[ledger.count :]):
        raise Disagreement(f"slots past row {ledger.count} hold pages: {counts}")
    page = sizes.kv_page_size
    lengths, ids = ledger.residents["prompt_length"].tolist(), ledger.request_ids.tolist()
    for i in range(ledger.count):
        need = -(-(lengths[i] + model.max_new[ids[i]]) // page)
        if counts[i] < need:
            raise Disagreement(f"row {i} holds {counts[i]} pages, its worst case {need}")
    if ledger.reserved_pages != sizes.num_pages - sizes.num_free_pages:
        raise Disagreement(
            f"reserved_pages {ledger.reserved_pages} vs the table's "
            f"{sizes.num_pages - sizes.num_free_pages}"
        )
    if ledger.kv_pages_in_use() > ledger.reserved_pages:
        raise Disagreement(
            f"{ledger.kv_pages_in_use()} pages in use > {ledger.reserved_pages} reserved"
        )


def plain_outcome(make, *args, **kwargs) -> tuple:
    """``outcome`` of a constructor as (kind, what both sides must agree on..., the object):
    ("ok", a summary, None, object) or ("err", type name, message, None)."""
    result = outcome(lambda: make(*args, **kwargs))
    if result[0] == "err":
        return result + (None,)
    made = result[1]
    summary = (
        made.capacity
        if hasattr(made, "capacity")
        else {k: v.shape for k, v in made.buffers().items()}
    )
    return ("ok", summary, None, made)


TABLE_SIZES = (
    "max_batch_size",
    "max_pages_per_sequence",
    "num_pages",
    "kv_page_size",
    "num_free_pages",
)


def lying_tables(
    fdp: atheris.FuzzedDataProvider, b: int, max_pages: int, num_pages: int, page: int
) -> tuple:
    """(the two KVPageTable subclasses, real slots, real page size): the same lies on both, each
    property saying what the limits want, a boundary value or the truth; sometimes the table
    methods do nothing too. The real table may be shorter than the limits or use another page
    size: the lies would hide exactly that from a check that believed them (issue 20 A.1)."""
    slots = fdp.ConsumeIntInRange(1, b)
    page_real = page if fdp.ConsumeBool() else fdp.ConsumeIntInRange(1, 16)
    said = {
        "max_batch_size": b,
        "max_pages_per_sequence": 127,
        "num_pages": num_pages + 200,
        "kv_page_size": page,
        "num_free_pages": num_pages,
    }
    lies = {}
    for name in TABLE_SIZES:
        roll = fdp.ConsumeIntInRange(0, 3)
        if roll in (1, 2):
            lies[name] = said[name]
        elif roll == 3:
            lies[name] = fdp.PickValueInList([0, 1, 254, INT32_MAX, -1])
    if "num_pages" in lies and "num_free_pages" not in lies:
        lies["num_free_pages"] = lies["num_pages"]  # "every page free", as a new ledger wants
    lazy = fdp.ConsumeProbability() < 0.3

    def subclass(base: type) -> type:
        body = {name: property(lambda self, v=v: v) for name, v in lies.items()}
        if lazy:
            body.update(
                ensure=lambda self, slot, n: True,
                release=lambda self, slot: None,
                move=lambda self, src, dst: None,
            )
        return type("Liar", (base,), body)

    return (subclass(_kv.KVPageTable), subclass(_kv_reference.KVPageTable)), slots, page_real


VIEW_NAMES = ("residents", "request_ids", "output_tokens", "finished_ids", "admitted_ids")
VIEW_MOVES = ("dtype", "shape", "strides", "readonly", "resize", "resize-base")


def tamper_view(view: np.ndarray, move: str) -> None:
    """What a holder of a handed-out view may try on it; each move either works on that object
    alone or is refused (issue 20 A.2, A.3). The ledger must read its own state regardless."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy deprecates some of these setters
        try:
            if move == "dtype":
                view.dtype = np.dtype([("raw", np.uint8, (view.itemsize,))])
            elif move == "shape":
                view.shape = (len(view), 1)
            elif move == "strides":
                view.strides = (0,)
            elif move == "readonly":
                view.flags.writeable = False
            elif move == "resize":
                view.resize(2 * len(view) + 1, refcheck=False)
            else:  # every object down the .base chain, as the issue's reproducer did
                obj: object = view
                while obj is not None:
                    try:
                        if isinstance(obj, np.ndarray):
                            obj.resize(2 * obj.size + 64, refcheck=False)
                        elif isinstance(obj, bytearray):
                            obj.extend(bytes(4096))
                    except (ValueError, BufferError):
                        pass
                    obj = obj.base if isinstance(obj, np.ndarray) else getattr(obj, "obj", None)
        except (ValueError, TypeError, AttributeError, BufferError):
            pass


def tamper_op(fdp: atheris.FuzzedDataProvider) -> tuple:
    name = fdp.PickValueInList(list(VIEW_NAMES))
    move = fdp.PickValueInList(list(VIEW_MOVES))

    def tamper(led: Ledger, _planner: object) -> None:
        tamper_view(getattr(led, name), move)

    return tamper, lambda _: None


def some_id(fdp: atheris.FuzzedDataProvider, model: LedgerModel) -> object:
    roll = fdp.ConsumeProbability()
    if roll < 0.6 and model.live:
        return fdp.PickValueInList(sorted(model.live))
    return (
        int_or_hostile(fdp, -2, 40) if roll < 0.95 else fdp.PickValueInList([2**63, -(2**63) - 1])
    )


def pick_distinct(fdp: atheris.FuzzedDataProvider, pool: list) -> list:
    """Up to three different items of ``pool``, in a fuzzed order."""
    picked = []
    for _ in range(fdp.ConsumeIntInRange(0, min(3, len(pool)))):
        picked.append(pool.pop(fdp.ConsumeIntInRange(0, len(pool) - 1)))
    return picked


def some_mask(fdp: atheris.FuzzedDataProvider, plan: object) -> object:
    """The sampler's finished mask for ``plan``: None, a valid one, or a hostile one."""
    if plan is None or fdp.ConsumeProbability() < 0.3:
        return None
    rows = plan.as_array()["select_last_token_logits"].copy()
    mask = np.array([e and fdp.ConsumeBool() for e in rows.tolist()], dtype=bool)
    roll = fdp.ConsumeProbability()
    if roll < 0.05:
        return np.ones(len(rows) + 1, dtype=bool)
    if roll < 0.1:
        return mask.astype(np.uint8)
    if roll < 0.15:
        return mask.tolist()
    if roll < 0.2:
        return np.ones(len(rows), dtype=bool)  # True on rows that emitted nothing, maybe
    return mask


def ledger_op(
    fdp: atheris.FuzzedDataProvider,
    op: int,
    ledger: Ledger,
    model: LedgerModel,
    limits: object,
    adapters: bool = False,
) -> tuple:
    """(call(ledger, planner), accepted(result)): one operation with its arguments drawn once,
    for both ledgers; ``accepted`` updates the model after the ledgers took it."""

    def nothing(_: object) -> None:
        pass

    if op == 10:
        return tamper_op(fdp)
    if op == 0:
        rid = some_id(fdp, model) if fdp.ConsumeProbability() < 0.2 else fdp.ConsumeInt(2)
        prio = int_or_hostile(fdp, -2, 2)
        length = int_or_hostile(fdp, 1, limits.max_input_length + 1)
        if ledger.page_table is None:
            max_new = None if fdp.ConsumeBool() else int_or_hostile(fdp, 0, 4)
        else:  # a ledger with pages refuses a request without max_new_tokens: mostly give one
            max_new = None if fdp.ConsumeProbability() < 0.1 else int_or_hostile(fdp, 0, 6)
        lora = int_or_hostile(fdp, 0, 4) if adapters else 0

        def accepted(_: object) -> None:
            model.live.add(rid)  # accepted: rid and prio were ints in range
            model.priority[rid] = prio
            model.lora[rid] = int(lora)
            if max_new is not None:
                model.max_new[rid] = int(max_new)

        return (lambda led, _p: led.submit(rid, length, prio, max_new, lora_id=lora)), accepted
    if op == 1:
        return (lambda led, _p: led.admit()), nothing
    if op in (2, 3):  # a step by hand: plan on each side, then apply with a mask
        retire = fdp.ConsumeBool()
        draw = fdp.ConsumeBytes(8)
        masks: dict[int, object] = {}

        def plan_and_apply(led: Ledger, planner: object) -> object:
            plan = planner.plan(led.residents)
            check_plan(planner.policy, limits, led.residents, plan)
            key = len(masks)  # the same mask for both sides, drawn from the same bytes
            masks[key] = some_mask(atheris.FuzzedDataProvider(draw), plan)
            return led.apply(plan, masks[key], retire=retire)

        return plan_and_apply, lambda _: retire_gone(ledger, model)
    if op == 4:
        ids = pick_distinct(fdp, ledger.request_ids.tolist())
        if fdp.ConsumeProbability() < 0.2:  # a waiting, unknown, repeated or hostile id
            ids.append(some_id(fdp, model))
        return (lambda led, _p: led.retire(ids)), lambda _: model.live.difference_update(ids)
    if op == 5:
        rows = pick_distinct(fdp, list(range(ledger.count)))
        roll = fdp.ConsumeProbability()
        if roll < 0.15:
            rows.append(fdp.PickValueInList([-1, ledger.count, rows[0] if rows else 0]))
        elif roll < 0.2:
            rows = fdp.PickValueInList([[1.0], ["0"], [[0, 1], [2]], [True], np.array([0.5])])
        ids = ledger.request_ids.tolist()
        return (
            (lambda led, _p: led.retire_rows(rows)),
            lambda _: model.live.difference_update(ids[r] for r in rows),
        )
    if op == 6:  # a snapshot round trip must change nothing; a tampered one is checked in full
        records = ledger.to_records()
        untouched = True  # (comparing a hostile numpy scalar with an int may itself raise)
        if records and fdp.ConsumeProbability() < 0.5:
            i = fdp.ConsumeIntInRange(0, len(records) - 1)
            extra = ["lora_id"] if adapters else []  # (the pick's range as before without it)
            field = fdp.PickValueInList(list(FIELDS) + ["request_id", "extra"] + extra)
            records[i][field] = int_or_hostile(fdp, -1, 50)
            untouched = False
        elif fdp.ConsumeProbability() < 0.2:
            records.append(
                {
                    "arrival": fdp.PickValueInList([UINT64_MAX, 0, 1, 2]),
                    "prompt_length": 1,
                    "request_id": 10**6,
                }
            )
            untouched = False

        def loaded(_: object) -> None:
            model.live = set(ledger.waiting_ids()) | {
                r.get("request_id", k) for k, r in enumerate(records)
            }
            if untouched and ledger.to_records() != records:
                raise Disagreement(f"load(to_records()) changed the rows: {records}")

        return (lambda led, _p: led.load([dict(r) for r in records])), loaded
    if op == 7:
        rid = some_id(fdp, model)

        def cancelled(_: object) -> None:
            model.live.discard(rid)
            if rid in ledger.request_ids.tolist():
                model.leaving.add(rid)

        return (lambda led, _p: led.cancel(rid)), cancelled
    if op == 8:  # the fused step; its mask is over the previous step's plan on each side
        draw = fdp.ConsumeBytes(8)
        use_mask = fdp.ConsumeBool()

        def fused(led: Ledger, planner: object) -> object:
            # The mask is over the plan this ledger's last step returned (the planner's one plan:
            # planning again here would change it, and step() refuses a changed pending plan).
            plan = model.step_plans.get(id(led)) if use_mask and led.count else None
            mask = some_mask(atheris.FuzzedDataProvider(draw), plan)
            got = led.step(planner, mask)
            model.step_plans[id(led)] = got
            check_plan(planner.policy, limits, led.residents, got)
            return got

        return fused, lambda _: retire_gone(ledger, model)
    if op == DRAFTED_STEP:  # the fused step verifying drafts: both sides draw the same values
        draw = fdp.ConsumeBytes(24)

        def drafted(led: Ledger, planner: object) -> object:
            d = atheris.FuzzedDataProvider(draw)
            plan = model.step_plans.get(id(led)) if led.count else None
            mask = some_mask(d, plan)
            accepted = some_accepted(d, plan, led)
            proposed = some_drafts(d, led, model)
            got = led.step(planner, mask, accepted=accepted, drafts=proposed)
            model.step_plans[id(led)] = got  # (check_plan does not know the drafts it planned)
            return got

        return drafted, lambda _: retire_gone(ledger, model)
    return (lambda led, _p: led.retire_finished()), lambda _: retire_gone(ledger, model)


DRAFTED_STEP = 11  # ledger_op's fused step with drafts and accepted counts (the V marker)


def some_accepted(fdp: atheris.FuzzedDataProvider, plan: object, ledger: Ledger) -> object:
    """``accepted`` for ``plan``'s rows: None, valid counts, one out of range, the same counts
    big-endian, or the ledger's own rows seen as int32 (aliasing ``ledger.residents``)."""
    if plan is None or fdp.ConsumeProbability() < 0.2:
        return None
    seq = plan.as_array()
    most = np.where(
        seq["work"] == stepplanner.SequenceWork.DECODE, seq["query_length"].astype(np.int64) - 1, 0
    )
    counts = np.array([fdp.ConsumeIntInRange(0, int(m)) for m in most.tolist()], dtype=np.int32)
    roll = fdp.ConsumeProbability()
    if roll < 0.1 and len(counts):
        counts[fdp.ConsumeIntInRange(0, len(counts) - 1)] = fdp.PickValueInList([-1, 1, 2**24])
    elif roll < 0.3:
        return counts.astype(">i4")
    elif roll < 0.5:
        words = ledger.residents.view(np.int32)  # the rows apply() writes
        start = fdp.ConsumeIntInRange(0, max(len(words) - len(counts), 0))
        if start + len(counts) <= len(words):
            return words[start : start + len(counts)]
    return counts


def some_drafts(fdp: atheris.FuzzedDataProvider, ledger: Ledger, model: LedgerModel) -> object:
    """``step``'s ``drafts``: None, an int, or a mapping naming residents (decoding or
    prefilling), waiting requests and unknown ids, with counts that may be hostile."""
    roll = fdp.ConsumeProbability()
    if roll < 0.1:
        return None
    if roll < 0.3:
        return int_or_hostile(fdp, 0, 4)
    pool = ledger.request_ids.tolist() + ledger.waiting_ids() + [some_id(fdp, model)]
    return {rid: int_or_hostile(fdp, 0, 4) for rid in pick_distinct(fdp, pool)}


def retire_gone(ledger: Ledger, model: LedgerModel) -> None:
    """The model after a call that may have retired finished requests: they left the ledger."""
    model.live = set(ledger.waiting_ids()) | set(ledger.request_ids.tolist())


def one_input(data: bytes) -> None:
    # Marker bytes, not decoded choices, so that every earlier input (FOUND among them) decodes
    # as it did; coverage of the code each one reaches soon teaches the fuzzer the markers.
    capped = data[:1] == STEP_CAP_MARKER
    if capped:
        data = data[1:]
    if data[:1] == LEDGER_MARKER:
        data = data[1:]
        paged = data[:1] == PAGES_MARKER
        data = data[1:] if paged else data
        tamper = data[:1] == TAMPER_MARKER
        data = data[1:] if tamper else data
        adapters = data[:1] == ADAPTERS_MARKER
        data = data[1:] if adapters else data
        drafts = data[:1] == LEDGER_DRAFTS_MARKER
        data = data[1:] if drafts else data
        ledger_episode(atheris.FuzzedDataProvider(data), capped, paged, tamper, adapters, drafts)
    else:
        drafts = data[:1] == PLANNER_DRAFTS_MARKER
        data = data[1:] if drafts else data
        planner_episode(atheris.FuzzedDataProvider(data), capped, drafts)


def planner_episode(
    fdp: atheris.FuzzedDataProvider, capped: bool = False, drafts: bool = False
) -> None:
    if fdp.ConsumeProbability() < 0.1:
        resident_state_parity(fdp)
    try:
        limits = make_limits(fdp, capped)
        policy = make_policy(fdp, limits)
    except ALLOWED:
        return  # the config layer is shared by both implementations; it only had to refuse
    try:
        lanes_or_errors = [outcome(Lane, impl, policy, limits) for impl in IMPLS]
    except RuntimeError as exc:  # an unresolved mode: both must say so
        assert "cannot be planned" in str(exc), exc
        return
    except MemoryError:
        # The compiled planner sizes its buffers for B up front (SPEC §3): a B this machine
        # cannot hold is refused with MemoryError, which is no finding. For a B that fits, it is.
        if limits.max_batch_size < UNHOLDABLE_BATCH:
            raise
        return
    if any(r[0] == "err" for r in lanes_or_errors):
        same("StepPlanner()", lanes_or_errors[0], lanes_or_errors[1], policy)
        return
    lanes = [r[1] for r in lanes_or_errors]
    s_in = limits.max_input_length
    n = fdp.ConsumeIntInRange(0, min(MAX_ROWS, limits.max_batch_size + 1))
    rows = [make_row(fdp, s_in, i) for i in range(n)]
    arrival = n
    for _ in range(fdp.ConsumeIntInRange(1, MAX_STEPS)):
        rows = step(fdp, lanes, rows, limits, drafts)
        rows = evolve(fdp, rows, s_in, arrival)
        arrival += MAX_ROWS


def main(argv: list[str]) -> None:
    for arg in [a for a in argv if a.startswith("-known=")]:
        names = arg.split("=", 1)[1]
        INCLUDE_KNOWN.update(KNOWN_ISSUES if names == "1" else names.split(","))
        argv.remove(arg)
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
