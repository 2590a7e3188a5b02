"""stepplanner as the per-step scheduler of Hugging Face transformers' continuous batching.

``register(options)`` puts a ``Scheduler`` subclass into transformers' scheduler table
(``transformers.generation.continuous_batching.scheduler.SCHEDULER_MAPPING``) and returns its
name; ``ContinuousBatchingConfig(scheduler_type=name)`` then makes ``generate_batch``,
``init_continuous_batching`` and ``transformers serve`` plan every step with stepplanner.

The adapter is glue, not a second policy. A resident leaves the :class:`stepplanner.Ledger` as
soon as the runtime lets it go (finished, cancelled, offloaded: ``finish_request`` and
``clear_cancelled_requests``). Every ``schedule_batch`` call:

1. admits waiting requests into free slots through the ledger (SPEC §6: queue order,
   ``priority_reserved_slots``);
2. derives each resident's ledger row afresh from the runtime's ``RequestState``: ``committed``
   is its KV length (prefix-cache hits included), ``prompt_length`` what it must prefill; only
   the pause count is kept between steps, per request, in the ledger row;
3. calls ``plan()`` once and hands back exactly its rows as ``FutureRequestState``s, chunks
   first, then decode rows, ``has_new_token == select_last_token_logits``.

A row whose KV pages cannot be allocated is withheld for this step (the request keeps its slot
and its pages) and reported to the runtime as starved; when no row can be allocated, the call
returns the runtime's "cache full" signal (``None``) and the runtime offloads. Limits come from
the runtime: B = ``max_requests_per_batch``, P = the cache's page size, ``max_step_tokens`` =
``max_batch_tokens``, S_in = ``max_input_length`` or what the whole cache holds.

Objectives (``SLO``) come per priority class (``register(..., slo_classes=)``) or per request
(``register(..., slo=)``, keyed by request id like ``priority``); under ``SchedulingPolicy.EDF`` and
``DEADLINE`` the ledger ranks the rows from them before each plan, at ``now`` = one read of
``time.perf_counter()``, the clock of the runtime's own ``RequestState.created_time`` (each
request's arrival), and measures the step time from those reads. A batch's tokens are counted
against their deadlines (``Ledger.apply``) at a time read once they came back: when the runtime
next calls in (the next ``schedule_batch``, or a request's exit if that comes first), not when
the batch was planned, which would see no token late by less than a step. In the overlapped loop
(``use_async_batching``) the next batch is scheduled while this one's tokens may still be on the
device, so there a token late by less than a step can still go unseen.

Overload (``DEADLINE``): ``register(..., relegated_wait=, never_relegate_below=)`` go to the
ledger as they are (docs/scheduling.md, Overload). The ledger hands a relegated waiting request
back (``Ledger.shed_ids``) in its admission pass, which the adapter therefore runs at every step
while requests wait, free slot or not (under FCFS/PRIORITY/EDF it still runs only when a slot is
free). A request handed back leaves the runtime's waiting queue and is answered at once, unserved:
``RequestStatus.FAILED`` with an ``error`` that says DEADLINE relegated it and how long it
waited, so a client or a router can retry it elsewhere (``scheduler.shed_requests`` counts them).
It is answered through the runtime's own output path, ``output_router.fail_and_deliver``, as
transformers answers a request that fails at admission. The scheduler holds no reference to the
batch processor, so :func:`register` wraps ``ContinuousBatchProcessor.prepare_next_batch`` once
(the one caller of ``schedule_batch``; the wrapper does nothing for any other scheduler): after
the step is scheduled, it answers the requests that step handed back. Chosen over reading the
caller's frame or wrapping the processor's constructor: the method and the two attributes it
uses (``scheduler``, ``output_router``) are the runtime's documented loop. If the runtime's shape
changes, it fails loudly, naming the transformers version: at ``register`` when the method or
``fail_and_deliver`` is missing, and in ``schedule_batch`` when a request is handed back outside
``prepare_next_batch`` (it could not be answered).

Step-time budget (docs/scheduling.md, "Step-time budget"): ``register(..., max_step_seconds=,
step_model=)`` plans every step through a :class:`~stepplanner.ledger.step_time.StepTimeBudget`
around the planner, which passes ``plan()`` the largest token budget whose time the step model
predicts within ``max_step_seconds`` (MIXED only: under another mode the start fails, naming
it). Its online fit is fed the runtime's measured step time: the time between two successive
``schedule_batch`` clock reads when the first handed back its whole plan (the ledger's
``measure`` under EDF/DEADLINE takes the same samples; the clock is read under every policy
while the budget is on). ``observe`` runs at that read, before the admission pass, because it
must see the plan just run before the next one replaces it: a ring write, and every
``refit_every`` steps a small solve. A step whose plan was not handed back whole (a row withheld
for its pages) is no sample: its measured time is not that plan's.

transformers' scheduler interface is private, so this module supports only the versions it is
tested with (``SUPPORTED_TRANSFORMERS``) and raises ``ImportError`` for any other.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from itertools import repeat
from typing import TYPE_CHECKING, Any

from .._errors import StepPlannerTypeError, StepPlannerValueError
from ..core import (
    IMPLEMENTATION,
    SLO,
    PreemptionMode,
    SchedulingOptions,
    SchedulingPolicy,
    StepPlanner,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from ..ledger import Ledger, QueueFullError
from ..ledger._shared import (
    NEVER_RELEGATE_BELOW,
    AdmissionOrder,
    check_admission_args,
    check_relegation_args,
)
from ..ledger.step_time import (
    COEFFICIENTS,
    StepTimeBudget,
    check_coefficients,
    check_max_step_seconds,
)
from ..planner._slo import check_slo_classes

if TYPE_CHECKING:
    from ..sim.latency import LatencyModel

__all__ = ["SUPPORTED_TRANSFORMERS", "StepPlannerScheduler", "register"]

SUPPORTED_TRANSFORMERS = ">=5.18,<5.25"
# transformers queues without bound; the ledger's queue is preallocated (about 80 bytes a
# request), so the adapter's default is deep enough for minutes of traffic, not 16 x B.
DEFAULT_MAX_WAITING = 65536
_LOWEST, _BEYOND = (5, 18), (5, 25)
_INSTALL_HINT = (
    'pip install "stepplanner[transformers]" (on a CPU-only machine install '
    "torch==2.13.0 first, so pip does not pull a CUDA build)"
)

try:
    import transformers
    from transformers.generation.continuous_batching import continuous_api as _loop
    from transformers.generation.continuous_batching import scheduler as _runtime
    from transformers.generation.continuous_batching.requests import (
        FutureRequestState,
        RequestState,
        RequestStatus,
    )
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"stepplanner.integrations.transformers needs transformers"
        f"{SUPPORTED_TRANSFORMERS} with torch: {exc}. {_INSTALL_HINT}"
    ) from exc


def _release(version: str) -> tuple[int, int]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return (parts + [0])[0], (parts + [0, 0])[1]


if not _LOWEST <= _release(transformers.__version__) < _BEYOND:
    raise ImportError(
        f"transformers {transformers.__version__} is installed, but "
        f"stepplanner.integrations.transformers supports transformers{SUPPORTED_TRANSFORMERS} "
        "only: the continuous-batching scheduler interface it plugs into is private and changes "
        f"between releases. {_INSTALL_HINT}"
    )

_DECODING = RequestStatus.DECODING
# The core's as_array() views the plan's one buffer, so column views made from it stay valid
# for every later plan of that length; the pure-Python twin's is a fresh copy each time.
_KEEP_PLAN_VIEWS = IMPLEMENTATION == "compiled"
_PENDING = RequestStatus.PENDING

PriorityOf = Mapping[str, int] | Callable[[str], int] | None
SloOf = Mapping[str, SLO | None] | Callable[[str], SLO | None] | None
_RANKED = (SchedulingPolicy.EDF, SchedulingPolicy.DEADLINE)


class StepPlannerScheduler(_runtime.Scheduler):
    """A transformers ``Scheduler`` whose every step is one stepplanner ``plan()``.

    Not built directly: :func:`register` makes a subclass bound to options and puts it in the
    runtime's table. ``on_step`` is a hook (a no-op here) that sees every plan with the ledger rows
    it was made from, their request states and the batch handed back; tests and monitoring
    override it.
    """

    options: SchedulingOptions = SchedulingOptions()
    priority_of: PriorityOf = None
    slo_of: SloOf = None
    slo_classes: Mapping[int, SLO] = {}
    max_input_length: int | None = None
    max_waiting: int = DEFAULT_MAX_WAITING
    relegated_wait: float | None = None
    never_relegate_below: int = NEVER_RELEGATE_BELOW
    admission: AdmissionOrder = AdmissionOrder.ARRIVAL
    starvation_steps: int | None = None
    starvation_seconds: float | None = None
    # The step-time budget: None, or a cap in seconds on a step's predicted time, and the step
    # model's coefficients a..f (seconds) it is predicted with (checked by register).
    max_step_seconds: float | None = None
    step_model: Mapping[str, float] | None = None
    # The clock of ``now`` under EDF/DEADLINE: the runtime stamps each request's arrival
    # (RequestState.created_time) with time.perf_counter, and the two must be one clock.
    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(
        self, cache: Any, safety_margin: float | None, max_requests_per_batch: int
    ) -> None:
        # Settings are checked before the runtime's own init, so a bad one fails the start with
        # a message that names it (the runtime fails every request with that message).
        self._configure(cache, max_requests_per_batch, cache.max_batch_tokens)
        # The runtime's safety margin throttles prefill admission, which is the planner's job
        # here; it is accepted for the constructor's contract and otherwise unused.
        super().__init__(
            cache, 0.0 if safety_margin is None else safety_margin, max_requests_per_batch
        )

    # --- settings -----------------------------------------------------------------------------

    def _configure(self, cache: Any, batch: int, step_tokens: int) -> None:
        self.limits, self.policy = self._resolve(cache, batch, step_tokens)
        planner = StepPlanner(self.policy, self.limits)
        # The step-time budget plans through the planner (SPEC §9); it refuses a policy that is
        # not MIXED in its own words, named here by the option that asked for it.
        self.step_budget: StepTimeBudget | None = None
        if self.max_step_seconds is not None:
            try:
                self.step_budget = StepTimeBudget(planner, self.step_model, self.max_step_seconds)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"max_step_seconds={self.max_step_seconds!r}: {exc}") from None
        self.planner: StepPlanner | StepTimeBudget = (
            planner if self.step_budget is None else self.step_budget
        )
        # Plain attributes for the per-step checks: reading them off limits and policy costs
        # a property call and an enum comparison every step.
        self._step_tokens = step_tokens
        self._pause = self.policy.preemption == PreemptionMode.PAUSE
        self._ranked = self.policy.scheduling_policy in _RANKED
        self._timed = self._ranked or self.step_budget is not None  # the clock read each step
        self._relegating = self.policy.scheduling_policy == SchedulingPolicy.DEADLINE
        # Uncached first orders by the prompt less what the runtime's prefix cache holds of it;
        # its bound in seconds reads the runtime's clock at each admission pass.
        self._uncached = self.admission == AdmissionOrder.UNCACHED_FIRST
        self._by_seconds = self.starvation_seconds is not None

    def _resolve(self, cache: Any, batch: int, step_tokens: int) -> tuple[Any, Any]:
        page = math.lcm(*(a.tokens_per_page for a in cache.cache_allocators.values()))
        if page > step_tokens:
            raise StepPlannerValueError(
                f"ContinuousBatchingConfig.page_size={page} exceeds max_batch_tokens="
                f"{step_tokens}: a non-final prompt chunk must end on a page boundary, so one "
                "step must hold at least one page (SPEC §2: max_step_tokens >= kv_page_size); "
                f"lower page_size to at most {step_tokens} or raise max_batch_tokens to at least "
                f"{page}"
            )
        if batch > step_tokens:  # the runtime clamps this itself today; say which if it ever won't
            raise StepPlannerValueError(
                f"ContinuousBatchingConfig.max_requests_per_batch={batch} exceeds "
                f"max_batch_tokens={step_tokens}: a step where every resident decodes holds one "
                f"token per request (SPEC §2: max_step_tokens >= max_batch_size); lower "
                f"max_requests_per_batch to at most {step_tokens} or raise max_batch_tokens to "
                f"at least {batch}"
            )
        s_in = self.max_input_length
        if s_in is None:
            s_in = cache.num_blocks * page  # what the whole cache holds for one request
        limits = StepPlannerLimits(batch, s_in, page, max_step_tokens=step_tokens)
        return limits, resolve_scheduling_policy(self.options, limits)

    def _cached_prefix(self, state: RequestState, length: int) -> int:
        """What the runtime's prefix cache holds of a request's prompt now: the whole blocks
        every cache allocator matches (its own lookup at admission, ``search_prefix_match``,
        without acquiring them). It orders the request; the runtime commits the hit it finds
        when it admits it."""
        cache = self.cache
        if not cache.use_prefix_sharing:
            return 0
        prompt = list(state.initial_tokens)
        hit = length
        for allocator in cache.cache_allocators.values():
            hit = min(hit, len(allocator.match_prefix_blocks(prompt)) * allocator.tokens_per_page)
        return hit

    def _priority(self, request_id: str) -> int:
        priority: int = _per_request(self.priority_of, request_id, 0)  # submit checks it
        return priority

    def _objectives(self, state: RequestState, priority: int) -> tuple[float | None, SLO | None]:
        """(arrival_time, slo) to submit: the request's own objectives, else its priority
        class's. A request the runtime re-queues after an offload keeps its arrival and has
        emitted tokens already; the ledger's token 0 is then its next one."""
        rid = state.request_id
        own = _per_request(self.slo_of, rid, None)
        slo = own if own is not None else self.slo_classes.get(priority)
        if slo is None:
            return None, None
        # An offloaded request is re-queued right after it left (finish_request); when reset it
        # is a new RequestState with a new created_time, so its arrival is the one it left with.
        arrival = self._departed.pop(rid, None)
        if arrival is None:
            arrival = state.created_time
        emitted = len(state.generated_tokens)
        if state._true_initial_tokens:  # reset: its output went into its prompt
            emitted += len(state.initial_tokens) - state._true_initial_tokens
        self._arrivals[rid] = arrival
        if not emitted or not isinstance(slo, SLO):  # (not an SLO: the ledger says so, naming it)
            return arrival, slo
        if slo.tpot is None:
            return None, None  # its one deadline was the first token's
        # Token `emitted` is due at arrival + ttft + emitted * tpot: an arrival that much later.
        return arrival + emitted * slo.tpot, slo

    # --- the runtime's hooks ----------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        # The objectives are resolved here (own, else the class's), so the ledger takes no
        # classes; step_time=None: it measures the step time from each step's now.
        self.ledger = Ledger(
            self.limits,
            self.policy,
            max_waiting=self.max_waiting,
            relegated_wait=self.relegated_wait,
            never_relegate_below=self.never_relegate_below,
            admission=self.admission,
            starvation_steps=self.starvation_steps,
            starvation_seconds=self.starvation_seconds,
        )
        self._arrivals: dict[str, float] = {}  # runtime id -> arrival, requests with objectives
        self._departed: dict[str, float] = {}  # the same, of requests that left since the last step
        self._ran = False  # the last step handed back a batch (a sample of the step time)
        self._whole = False  # step budget: the last step handed back its whole plan
        self._last_read = math.nan  # step budget: the clock at the last schedule_batch
        self._unapplied: Any = None  # EDF/DEADLINE: that batch's plan, until it has run
        self.relegated_requests = 0  # DEADLINE: requests relegated since the start
        self.shed_requests = 0  # DEADLINE: requests handed back unserved since the start
        self._handed_back: list[tuple[RequestState, str]] = []  # to answer, with their reason
        self._answering = False  # inside ContinuousBatchProcessor.prepare_next_batch (wrapped)
        self._states: dict[int, RequestState] = {}  # ledger id -> the runtime's state object
        self._resident: dict[str, int] = {}  # runtime id -> ledger id, residents only
        self._queued: dict[str, int] = {}  # runtime id -> ledger id, waiting requests only
        self._row_states: list[RequestState] | None = None  # per ledger row; None: re-read
        self._next_id = 0
        # The plan's column views, made once per length: numpy calls run cold between the
        # runtime's tensor work (several microseconds each), so each one saved is felt.
        self._plan: Any = None
        self._plan_columns: dict[int, tuple[Any, Any, Any]] = {}

    def finish_request(self, request_id: str) -> None:
        """The runtime's one exit for a resident (finished, failed, offloaded): free its slot."""
        super().finish_request(request_id)
        arrival = self._arrivals.pop(request_id, None)
        if arrival is not None:  # an offload re-queues it right after, keeping its arrival
            self._departed[request_id] = arrival
        departed = self._resident.pop(request_id, None)
        if departed is not None:
            self._retire([departed])

    def clear_cancelled_requests(self) -> list[RequestState]:
        cancelled: list[RequestState] = super().clear_cancelled_requests()
        departed = []
        for state in cancelled:
            self._arrivals.pop(state.request_id, None)
            i = self._resident.get(state.request_id)
            if i is not None and self._states[i] is state:
                del self._resident[state.request_id]
                departed.append(i)
            i = self._queued.get(state.request_id)
            if i is not None and self._states[i] is state:
                # Out of the ledger's queue now, as out of the runtime's: left there until its
                # turn it would hold a place under max_waiting and a slot for a step.
                del self._queued[state.request_id], self._states[i]
                self.ledger.cancel(i)
        if departed:
            self._retire(departed)
        return cancelled

    def _retire(self, ids: list[int]) -> None:
        # Right away, in the runtime's exit path (where it frees the request's pages too), so
        # schedule_batch only admits. By id: the ledger finds rows in its own id map (not
        # retire_rows, whose row list is checked through numpy, which runs cold here). The last
        # plan names rows by index: it is applied first, the runtime's exits coming after the
        # batch ran.
        self._count_tokens()
        self.ledger.retire(ids)
        states = self._states
        for i in ids:
            del states[i]
        self._row_states = None

    def add_waiting_request(self, state: RequestState) -> None:
        """Queue a request; a prompt longer than S_in is refused here, naming it.

        The runtime calls this for each new request inside its own error handling, so a refusal
        fails that request alone, with this message, and nothing else changes."""
        rid = state.request_id
        if state.num_children > 0:
            raise StepPlannerValueError(
                f"request {rid}: num_return_sequences > 1 (parallel sampling) is not supported by "
                "the stepplanner scheduler; allowed: 1"
            )
        length = (
            len(state.initial_tokens)
            if state.generated_tokens
            else state.position_offset + len(state.remaining_prefill_tokens)
        )
        s_in = self.limits.max_input_length
        if length > s_in:
            raise StepPlannerValueError(
                f"request {rid}: prompt of {length} tokens exceeds max_input_length (S_in)={s_in}; "
                "it is refused, never truncated (raise max_input_length, or the KV cache, to "
                "admit it)"
            )
        try:
            priority = self._priority(rid)
            arrival, slo = (
                (None, None)
                if self.slo_of is None and not self.slo_classes
                else (self._objectives(state, priority))
            )
            if arrival is None and self._by_seconds:  # the starvation bound counts from it
                arrival = self._departed.get(rid, state.created_time)
            cached = self._cached_prefix(state, length) if self._uncached else 0
            self.ledger.submit(
                self._next_id,
                length,
                priority,
                arrival_time=arrival,
                slo=slo,
                cached_tokens=cached,
            )
        except (TypeError, ValueError, OverflowError, QueueFullError) as exc:
            self._arrivals.pop(rid, None)
            raise type(exc)(f"request {rid}: {exc}") from None
        self._states[self._next_id] = state
        self._queued[rid] = self._next_id
        self._next_id += 1
        super().add_waiting_request(state)

    def schedule_batch(
        self, token_budget: int, cache_budget: int
    ) -> tuple[list[FutureRequestState] | None, bool, int, int]:
        if token_budget != self._step_tokens:
            self._configure(self.cache, self.max_requests_per_batch, token_budget)
        if self._departed:
            self._departed.clear()  # left for good: an offload re-queues in the same pause
        now = read = None
        if self._timed:
            # The runtime's clock as the previous batch's tokens came back: the step time is
            # measured from these reads (a step that ran nothing is no sample).
            read = self.clock()
            budget = self.step_budget
            if budget is not None:
                self._observe_step(budget, read)
            if self._ranked:
                now = read
                self.ledger.measure(now, self._ran)
                self._count_tokens(now)
        at = now
        if at is None and self._by_seconds:
            at = self.clock() if read is None else read
        self._sync_residents(at)
        self.starved_requests: list[tuple[Any, int]] = []
        ledger = self.ledger
        if ledger.count == 0:
            return [], False, 0, 0
        states = self._row_states
        if states is None:  # rows move only when residents come or go
            by_id = self._states
            states = self._row_states = [by_id[i] for i in ledger.request_ids.tolist()]
        rows = ledger.residents
        self._derive_rows(rows, states)
        if now is not None:
            ledger.rank(now)  # each row's priority and arrival from its deadlines, in C
            self._count_relegated()
        plan = self.planner.plan(rows)
        batch, full, tokens, reads = self._hand_back(plan, states, cache_budget)
        self.on_step(rows, states, plan, batch)
        self._ran = bool(batch)
        if self.step_budget is not None:  # the next read times this plan if it runs whole
            self._whole = self._ran and len(batch) == plan.num_prefill + plan.num_decode
        if now is not None and batch:
            # Applied once the batch ran (_count_tokens), before the rows move or plan again.
            self._unapplied = plan
        elif self._pause:
            plan.apply_to(rows)  # SPEC §6: pause counts, the one thing kept between steps
        if not batch and full:
            return None, False, 0, 0  # the runtime's "cache full": it offloads and retries
        fast = (
            self.cache.max_blocks_per_request > 0
            and plan.num_prefill == 0
            and all(f.state.position_offset < self.cache.max_decode_fast_path_length for f in batch)
        )
        return batch, fast, tokens, reads

    def on_step(
        self, residents: Any, states: list[RequestState], plan: Any, batch: list[FutureRequestState]
    ) -> None:
        """Called once per step with the ledger rows planned from, the runtime's state of each
        row, the plan and the batch handed back (before the runtime runs it; ``plan`` and
        ``residents`` are overwritten by the next step)."""

    # --- the step -------------------------------------------------------------------------------

    def _observe_step(self, budget: StepTimeBudget, now: float) -> None:
        """The step-time budget's sample: the time since the last read, when the step it
        planned was handed back whole (the plan ``observe`` reads is that step's)."""
        last, self._last_read = self._last_read, now
        if self._whole:
            self._whole = False
            seconds = now - last
            # Neither a clock that went back or stood still nor one that jumped to inf is a
            # sample (observe refuses them).
            if 0 < seconds < math.inf:
                budget.observe(seconds)

    def _count_relegated(self) -> None:
        if self._relegating:
            self.relegated_requests += len(self.ledger.relegated_ids)

    def _count_tokens(self, now: float | None = None) -> None:
        """Apply the last batch's plan, at ``now`` or the clock read here, once the runtime ran
        it: pause counts, and each emitting row's token counted (the next deadline is the next
        token's); DEADLINE relegates a request whose token came late. Read at planning time, the
        clock would be a step early, and a token late by less than that never seen."""
        plan, self._unapplied = self._unapplied, None
        if plan is not None:
            self.ledger.apply(plan, now=self.clock() if now is None else now)
            self._count_relegated()

    def _sync_residents(self, now: float | None = None) -> None:
        """Admit waiting requests into the free slots (residents leave in finish_request);
        ``now``: the step's clock under EDF/DEADLINE."""
        ledger, states = self.ledger, self._states
        # After an offload the runtime holds new work back until a request finishes; a step with
        # no resident at all admits anyway, or nothing would ever finish.
        if self.block_new_requests and ledger.count:
            return
        if self._relegating:
            # The admission pass is also where relegated waiting requests are handed back: every
            # step while any wait (or a submit handed one back since the last pass).
            if not (ledger.waiting or self._queued):
                return
        elif not (ledger.free_slots and ledger.waiting):
            return  # nothing to admit: spare the call (most steps, once the slots are full)
        taken: set[str] = set()
        while True:
            admitted = ledger.admit(now=now)
            self._count_relegated()
            if self._relegating:
                shed = ledger.shed_ids
                if len(shed):
                    self._hand_back_shed(shed.tolist(), now)
            if not admitted:
                break
            stale = []
            for i in admitted:
                state = states[i]
                rid = state.request_id
                if self._queued.get(rid) == i:
                    del self._queued[rid]
                if self.waiting_requests.get(rid) is not state:  # left the runtime unseen
                    stale.append(i)
                    continue
                # The runtime's own prefix lookup: a hit shares cached pages and moves the state
                # to PREFILLING with position_offset (our committed) past the shared prefix.
                self._infer_request_tokens(state, taken)
                self.waiting_requests.pop(rid, None)
                self.active_requests[rid] = state
                self._resident[rid] = i
                taken.add(rid)
            if not stale:
                break
            self._retire(stale)
        if taken:
            self._cleanup_waiting_queue(taken)
            self._row_states = None

    def _hand_back_shed(self, ids: list[int], now: float | None) -> None:
        """Take the requests the ledger handed back out of the runtime's queue; the wrapped
        ``prepare_next_batch`` answers them once this step is scheduled."""
        if not self._answering:
            raise RuntimeError(
                f"stepplanner handed back {len(ids)} relegated request(s), but transformers "
                f"{transformers.__version__} called schedule_batch outside "
                "ContinuousBatchProcessor.prepare_next_batch, where the adapter answers them: "
                "they could not be answered. The runtime's loop changed; stepplanner supports "
                f"transformers{SUPPORTED_TRANSFORMERS}"
            )
        states, gone = self._states, set()
        for i in ids:
            state = states.pop(i, None)
            if state is None:
                continue
            rid = state.request_id
            if self._queued.get(rid) == i:
                del self._queued[rid]
            arrival = self._arrivals.pop(rid, state.created_time)
            if self.waiting_requests.get(rid) is not state:
                continue  # left the runtime unseen (cancelled): nobody to answer
            del self.waiting_requests[rid]
            gone.add(rid)
            waited = "" if now is None else f" after waiting {max(now - arrival, 0.0):.3f} s"
            self._handed_back.append(
                (
                    state,
                    f"request {rid}: relegated by the DEADLINE policy (it could no longer meet "
                    f"its objectives) and handed back unserved{waited}; retry it elsewhere",
                )
            )
            self.shed_requests += 1
        if gone:
            self._cleanup_waiting_queue(gone)

    @staticmethod
    def _derive_rows(rows: Any, states: list[RequestState]) -> None:
        # committed is every row's KV length; a resident decodes once the runtime has marked it
        # DECODING (it does so when it schedules the final chunk). The few other rows are
        # prompt-incomplete, with prompt_length = KV length + tokens still to prefill, except a
        # request restored from the CPU with output already (PENDING, one token): it decodes.
        # A decoding row's prompt_length is never read nor checked (SPEC §3), so it is written
        # only in a step that has a prompt-incomplete row, with the same formula as the others.
        # (``_status``: the ``status`` property is a Python call per row, on the hot path.)
        # Each column is written in one assignment: every numpy call here runs cold.
        rows["committed"] = [s.position_offset for s in states]
        context = [s._status is _DECODING or len(s.generated_tokens) > 0 for s in states]
        rows["context_committed"] = context
        if not all(context):
            rows["prompt_length"] = [
                s.position_offset + len(s.remaining_prefill_tokens) for s in states
            ]

    def _hand_back(
        self, plan: Any, states: list[RequestState], cache_budget: int
    ) -> tuple[list[FutureRequestState], bool, int, int]:
        cache = self.cache
        read_limit = cache.read_cache_limit
        # A decode-only batch on the runtime's fast path reads through a block table, not the
        # bounded read index, so only a varlen batch spends the cache-read budget.
        chunks = plan.num_prefill
        varlen = chunks > 0 or cache.max_blocks_per_request <= 0
        batch: list[FutureRequestState] = []
        starved: list[tuple[RequestState, int]] = []
        full = False
        tokens = reads = 0
        s_in = self.limits.max_input_length
        unused: set[str] = set()
        sharing = cache.use_prefix_sharing
        can_store = cache.can_store_request_tokens
        append = batch.append
        size = chunks + plan.num_decode
        if plan is not self._plan:  # the planner's one plan, its buffers fixed for life
            self._plan, self._plan_columns = plan, {}
        columns = self._plan_columns.get(size)
        if columns is None:  # columns, not records: a record tolist() costs 10x more
            rows = plan.as_array()
            columns = (rows["resident"], rows["query_length"], rows["select_last_token_logits"])
            if _KEEP_PLAN_VIEWS:
                self._plan_columns[size] = columns
        resident, query_length, select_last = columns
        # Chunks come first in a plan (SPEC §3), so row k is a chunk exactly when k < chunks;
        # a decode row is one token that selects its logits, so a plan without chunks needs
        # only its resident column.
        if chunks:
            lengths, lasts = query_length.tolist(), select_last.tolist()
        else:
            lengths, lasts = repeat(1), repeat(True)
        for k, (index, length, last) in enumerate(zip(resident.tolist(), lengths, lasts)):
            state = states[index]
            need = state.position_offset
            if read_limit is not None and need > read_limit:
                need = read_limit
            if varlen and need > cache_budget:
                continue  # withheld: the step's read index cannot hold its KV this time
            if not can_store(state, length):
                full = True
                # The runtime may reset an offloaded request, folding its output into its prompt;
                # one that would then exceed S_in is never offered, so it can never be refused.
                if len(state.initial_tokens) + len(state.generated_tokens) <= s_in:
                    starved.append((state, length))
                continue
            # A decoding request's one token is already its tokens_to_process; anything else
            # moves through the runtime's own transition (status, token slices).
            if k < chunks or state._status is not _DECODING:
                self._schedule_request(state, state.remaining_prefill_tokens, length, unused)
                if len(state.tokens_to_process) != length:
                    raise RuntimeError(
                        f"request {state.request_id}: the runtime took "
                        f"{len(state.tokens_to_process)} tokens for a planned "
                        f"row of {length}"
                    )
            cache_budget -= need
            reads += need
            tokens += length
            append(
                FutureRequestState(
                    state,
                    last,
                    cache.count_new_complete_blocks(state, length) if sharing else {},
                    length,
                )
            )
        # The runtime offloads from the end of this list: the resident last in plan order first.
        self.starved_requests = starved
        return batch, full, tokens, reads


def _per_request(source: Any, request_id: str, default: Any) -> Any:
    """A request's value from ``register``'s mapping or callable (``default``: none given, or
    an id the mapping lacks)."""
    if source is None:
        return default
    return source(request_id) if callable(source) else source.get(request_id, default)


def _check_per_request(field: str, value: object, returns: str) -> None:
    if value is not None and not (callable(value) or isinstance(value, Mapping)):
        raise StepPlannerTypeError(
            f"{field} must be a mapping or a callable request_id -> {returns}, got "
            f"{type(value).__name__}"
        )


def _check_step_budget(
    max_step_seconds: object, step_model: object
) -> tuple[float | None, dict[str, float] | None]:
    """``register``'s ``max_step_seconds`` and ``step_model``, checked as ``StepTimeBudget``
    checks them; returns the seconds and the model's coefficients (None, None: no budget)."""
    if max_step_seconds is None:
        if step_model is not None:
            raise StepPlannerValueError(
                "step_model is given but max_step_seconds is None, so no step is priced with "
                "it; allowed: step_model=None, or a max_step_seconds"
            )
        return None, None
    seconds = check_max_step_seconds(max_step_seconds)
    if step_model is None:
        raise StepPlannerValueError(
            f"max_step_seconds={max_step_seconds!r} needs step_model, the step-time model it "
            'prices a step with; allowed: its coefficients in seconds, {"a": .., "b": .., '
            '"c": ..}, or a LatencyModel (stepplanner calibrate fits one)'
        )
    if not isinstance(step_model, Mapping) and not any(
        hasattr(step_model, k) for k in COEFFICIENTS
    ):
        raise StepPlannerTypeError(
            "step_model must be a mapping of the coefficients "
            + ", ".join(COEFFICIENTS)
            + f" (seconds) or a LatencyModel, got {type(step_model).__name__}"
        )
    return seconds, dict(zip(COEFFICIENTS, check_coefficients(step_model, "step_model")))


def _answer_handed_back(processor: Any, scheduler: StepPlannerScheduler) -> None:
    handed, scheduler._handed_back = scheduler._handed_back, []
    router, offloading = processor.output_router, processor.offloading_manager
    for state, reason in handed:
        offloading.free_request_cpu_cache(state)  # an offloaded request re-queued keeps a copy
        router.fail_and_deliver(state, RuntimeError(reason))


def _wrap_prepare_next_batch() -> None:
    """Answer what each step handed back, through the runtime's own output path (once)."""
    processor = getattr(_loop, "ContinuousBatchProcessor", None)
    original = getattr(processor, "prepare_next_batch", None)
    router = getattr(_loop, "OutputRouter", None)
    if original is None or not callable(getattr(router, "fail_and_deliver", None)):
        raise ImportError(
            f"transformers {transformers.__version__} has no ContinuousBatchProcessor."
            "prepare_next_batch or OutputRouter.fail_and_deliver, through which "
            "stepplanner.integrations.transformers answers the requests DEADLINE hands back; "
            f"it supports transformers{SUPPORTED_TRANSFORMERS}. {_INSTALL_HINT}"
        )
    if getattr(original, "_stepplanner_answers", False):
        return

    @functools.wraps(original)
    def prepare_next_batch(self: Any) -> bool:
        scheduler = getattr(self, "scheduler", None)
        if not isinstance(scheduler, StepPlannerScheduler):
            return bool(original(self))
        scheduler._answering = True
        try:
            return bool(original(self))
        finally:  # a step that fails still answers what it handed back (they are in no queue)
            scheduler._answering = False
            if scheduler._handed_back:
                _answer_handed_back(self, scheduler)

    prepare_next_batch._stepplanner_answers = True  # type: ignore[attr-defined]
    processor.prepare_next_batch = prepare_next_batch  # type: ignore[union-attr]


def register(
    options: SchedulingOptions,
    *,
    name: str = "stepplanner",
    priority: PriorityOf = None,
    max_input_length: int | None = None,
    max_waiting: int = DEFAULT_MAX_WAITING,
    slo: SloOf = None,
    slo_classes: Mapping[int, SLO] | None = None,
    relegated_wait: float | None = None,
    never_relegate_below: int = NEVER_RELEGATE_BELOW,
    admission: AdmissionOrder = AdmissionOrder.ARRIVAL,
    starvation_steps: int | None = None,
    starvation_seconds: float | None = None,
    max_step_seconds: float | None = None,
    step_model: Mapping[str, float] | LatencyModel | None = None,
) -> str:
    """Put a stepplanner scheduler into transformers' scheduler table under ``name``.

    ``options``: the :class:`SchedulingOptions` every step is planned with (checked against the
    runtime's limits when the runtime starts; a bad value fails the start, naming it).
    ``priority``: a mapping or a callable ``request_id -> int`` (lower is served first under
    ``PRIORITY``; below 0 may use ``priority_reserved_slots``); default 0 for every request, and
    0 for an id a mapping lacks. ``max_input_length``: S_in; default what the whole KV cache
    holds. ``max_waiting``: how many requests may wait for a slot (the runtime's own queue is
    unbounded; past this bound a new request fails alone, naming the bound). ``slo``: a
    mapping or a callable ``request_id -> SLO | None``, a request's own objectives;
    ``slo_classes``: ``{priority: SLO}``, the objectives of every request of that priority that
    has none of its own. They rank the rows under ``SchedulingPolicy.EDF``/``DEADLINE`` (checked
    under every policy); a request whose objective is not an ``SLO`` fails alone, naming it.
    ``relegated_wait``, ``never_relegate_below``: the ledger's (``DEADLINE``): how long a
    relegated waiting request may still wait before it is answered unserved (``FAILED``, with
    the reason; ``None``: its own TTFT objective, ``0``: at once), and the priority class below
    which no request is relegated.
    ``admission``, ``starvation_steps``, ``starvation_seconds``: the ledger's admission order
    (docs/scheduling.md, "Uncached work first"); under ``UNCACHED_FIRST`` a request's uncached
    work is its prompt less what the runtime's prefix cache holds of it when it arrives, and a
    bound in seconds counts from its ``created_time`` on the runtime's clock.
    ``max_step_seconds``, ``step_model``: the step-time budget (docs/scheduling.md, "Step-time
    budget"; MIXED only, checked when the runtime starts): each step with decode rows gets the
    largest token budget whose time ``step_model`` predicts within ``max_step_seconds``;
    ``step_model`` is the model's coefficients in seconds, ``{"a": .., "b": .., "c": ..}``
    (``d``, ``e``, ``f`` too; a missing one is 0) or a ``LatencyModel`` (``stepplanner
    calibrate`` fits one), and ``a``, ``b``, ``c`` are refitted online from the runtime's
    measured step times. Both or neither.
    Returns ``name``, for ``ContinuousBatchingConfig(scheduler_type=name)``.
    """
    if not isinstance(options, SchedulingOptions):
        raise StepPlannerTypeError(
            f"options must be a SchedulingOptions, got {type(options).__name__}"
        )
    if not isinstance(name, str) or not name:
        raise StepPlannerValueError(
            f"name={name!r} is not a scheduler name; allowed: a non-empty str"
        )
    _check_per_request("priority", priority, "int")
    if max_input_length is not None and (
        isinstance(max_input_length, bool)
        or not isinstance(max_input_length, int)
        or max_input_length < 1
    ):
        raise StepPlannerValueError(
            f"max_input_length={max_input_length!r} is out of range; allowed: an "
            "int >= 1, or None for what the KV cache holds"
        )
    if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 1:
        raise StepPlannerValueError(
            f"max_waiting={max_waiting!r} is out of range; allowed: an int >= 1"
        )
    _check_per_request("slo", slo, "SLO | None")
    classes = check_slo_classes(slo_classes)
    check_relegation_args(relegated_wait, never_relegate_below)
    check_admission_args(admission, starvation_steps, starvation_seconds)
    seconds, model = _check_step_budget(max_step_seconds, step_model)
    _wrap_prepare_next_batch()
    bound = type(
        f"StepPlannerScheduler_{name}",
        (StepPlannerScheduler,),
        {
            "options": options,
            "priority_of": staticmethod(priority) if callable(priority) else priority,
            "slo_of": staticmethod(slo) if callable(slo) else slo,
            "slo_classes": classes,
            "max_input_length": max_input_length,
            "max_waiting": max_waiting,
            "relegated_wait": relegated_wait,
            "never_relegate_below": never_relegate_below,
            "admission": AdmissionOrder(admission),
            "starvation_steps": starvation_steps,
            "starvation_seconds": starvation_seconds,
            "max_step_seconds": seconds,
            "step_model": model,
            "__module__": __name__,
        },
    )
    _runtime.SCHEDULER_MAPPING[name] = bound
    return name
