"""The resident ledger a serving loop keeps between steps (SPEC §6): waiting queue, admission,
output accounting and retirement, in C (``_ledger.pyx``; ``STEPPLANNER_IMPL=python`` selects the
pure-Python twin ``_ledger_py.py``, which behaves the same; ``_shared.py`` holds the checks both
run).

A ``Ledger`` owns a dense ``RESIDENT_DTYPE`` table of ``max_batch_size`` rows and one int64
request id per row; rows ``0..count-1`` are the residents, always dense. ``ledger.residents`` is
a view of those rows that ``StepPlanner.plan()`` reads in place. A serving loop is::

    ledger.submit(request_id, prompt_length, priority, max_new_tokens=256)  # per arrival
    plan = ledger.step(planner)                # admit -> plan, in one call
    while serving:
        finished = run_model(plan)            # the sampler's bool per plan row (EOS, stop)
        plan = ledger.step(planner, finished) # apply -> count tokens -> retire -> admit -> plan
        for rid in ledger.finished_ids: ...   # what that call finished and retired

or, with the pieces apart: ``admit()``, ``planner.plan(ledger.residents)``,
``apply(plan, finished, retire=True)`` (or ``apply`` then ``retire_finished()``).

The surface (both implementations):

* ``Ledger(limits, policy=None, *, max_waiting=None, page_table=None)``: ``policy`` supplies the
  queue order and ``priority_reserved_slots`` (none: FCFS, no reserved slots); ``max_waiting``
  bounds the queue (``None``: 16 x ``max_batch_size``); ``page_table``, an empty
  ``KVPageTable`` (the compiled ledger takes the compiled one), makes the ledger keep slot ``i``
  = row ``i``: ``submit`` then needs ``max_new_tokens``, admission (in queue order) stops at the
  first request whose worst case does not fit the free pool and reserves it at its row, every
  swap-remove releases and moves pages with the rows, ``apply``/``step`` refuse a plan row
  beyond its row's pages, and ``load`` is refused (docs/kv_pages.md). ``page_table``,
  ``reserved_pages``, ``held_back`` and ``kv_pages_in_use()`` read it. Every check reads the
  table's sizes from its storage (``geometry``), never from properties a subclass may override,
  and the twin drives it through its class's own methods.
* ``submit(request_id, prompt_length, priority=0, max_new_tokens=None)`` -> arrival stamp;
  O(log n). Past ``max_waiting`` it raises ``QueueFullError`` (a ``RuntimeError``): the
  backpressure signal a server turns into HTTP 429.
* LoRA (docs/decisions.md, "LoRA adapters"): ``Ledger(..., max_loras=N)`` and ``submit(...,
  lora_id=k)`` (0, the default: the base model). The residents hold at most N distinct
  adapters; admission passes over a request whose adapter cannot join (it keeps its place) and
  admits the requests behind it whose adapters can. ``max_loras=None``: no limit.
* ``cancel(request_id)``: out of the queue (O(log n)) or out of its row, wherever it is; a
  resident of the pending ``step`` plan leaves with that plan (see Threads below).
* ``admit()`` -> the admitted ids (a list); ``admitted_ids`` is the same as a view.
* ``apply(plan, finished=None, *, retire=False)`` -> ``finished_ids``: SPEC §6 on the rows,
  then output accounting: each plan row with ``select_last_token_logits`` emitted one token
  (the chunk completing a prompt emits the first, each decode row one more); a request is
  finished when it has emitted ``max_new_tokens`` or when the sampler's ``finished`` mask (a 1-D
  numpy bool array, one flag per plan row) says so. With neither, nothing finishes by itself.
  Speculative decoding (SPEC §8): ``accepted`` (a 1-D int32 array, one count per plan row) says
  how many of the drafts a decode row verified the runtime accepted; that row commits and emits
  ``1 + accepted`` tokens, and the rejected positions are taken back. Without it every verified
  draft counts. A row that would emit past ``max_new_tokens`` is refused before anything changes.
* ``retire_finished()``, ``retire(request_ids)``, ``retire_rows(rows)``: swap-remove.
* ``step(planner, finished=None, *, accepted=None, drafts=None, reasons=None)`` -> the plan: see
  above. ``drafts``: an int (each decoding request proposes that many) or a mapping from request
  id to int (an entry for a request that is not decoding in this step's plan, whether waiting,
  prefilling or no longer resident, is passed over; a value that is bad in itself is refused,
  naming the request id, before anything changes); each is capped so that the row cannot
  emit past its request's ``max_new_tokens``, then planned by ``plan(..., drafts=...)``.
  ``accepted`` must be native int32 (another byte order is a ``TypeError``, never read as
  native); it and ``finished`` are read once, before the plan is applied, into the ledger's own
  buffers, so a view of memory the step writes (``residents``) cannot change them midway.
* Views, each valid until the next call that changes it: ``residents`` (writable),
  ``request_ids``, ``output_tokens``, ``finished_ids``, ``admitted_ids`` (read-only, and so is
  every array down their ``.base`` chain: the compiled ledger's are over memory Python cannot
  write, the twin's are copies). The compiled ledger makes each view once per length and keeps
  it, so a steady loop allocates nothing; a kept view whose holder set its dtype, shape, strides
  or flags is replaced, never handed out again. Views are made from the memory itself, which
  NumPy cannot resize (no ``.base`` of one is an array the ledger keeps), and the ledger reads
  its own state in C or through views of its own, never through one it handed out.
* ``apply``/``step`` take a ``StepPlan`` of either implementation (a duck-typed object is a
  ``TypeError``), and refuse a plan naming a row or pause outside the table, or one resident
  twice (two rows, a row and a pause, two pauses: an edited pickle), with ``ValueError``
  before anything changes.
* ``Ledger.__init__`` runs once: called again it raises "already initialised", as
  ``KVPageTable``, ``StepInputs`` and ``StepPlanner`` do.
* ``load(records)`` / ``to_records()``: snapshots (explain, record/replay); a record carries
  ``lora_id`` when its row has an adapter; ``waiting_ids()``.
* Deadlines (docs/scheduling.md): ``Ledger(..., slo_classes={priority: SLO}, step_time=(base,
  per_token) or None)``, ``submit(..., arrival_time=, slo=)``; under ``SchedulingPolicy.EDF`` and
  ``DEADLINE`` the ledger ranks the rows before each plan from the runtime's clock (``step(...,
  now=)``; apart: ``admit(now=)``, ``rank(now)``, ``apply(..., now=)``, ``measure(now)``), and
  ``relegated_ids`` lists what the last call gave up on. ``Ranker`` is the same rank pass over
  rows a runtime keeps itself.

Decisions where SPEC §6 is silent (the package-wide ones: docs/decisions.md):

* Request ids are int64. A C table of int64 keys keeps admission and retirement in C and hands
  finished ids back as a numpy view with no allocation; a runtime whose ids are strings keeps
  one ``dict`` from its id to a counter, touched once per arrival and once per finish, never
  per step.
* Retiring swap-removes: the last rows move into the holes. Rows carry no order; the planner
  orders by (priority, arrival) keys, and a swap disturbs its previous order by one key per
  retired row, where shifting would renumber every later row.
* Arrival stamps are the ledger's own submission counter (0, 1, 2, ...), so they are monotonic
  and unique by construction; ``load()`` refuses arrivals that a waiting request holds, and once
  a loaded arrival is 2**64 - 1 no stamp is left and ``submit`` says so.
* ``priority < 0`` marks an urgent request: it may take the ``priority_reserved_slots`` that
  requests with ``priority >= 0`` may not. Under ``FCFS`` the queue is otherwise in arrival
  order, but when its head is held back by the reservation an urgent request behind it may still
  take a reserved slot (that is what the reservation is for). Under ``PRIORITY`` urgent requests
  sort first anyway.
* A finished request that is not retired stays resident (and planned): ``retire=False`` is for
  runtimes that must flush its last token first. ``finished`` may be True only on rows that
  emitted a token; anything else is a ``ValueError`` naming the row.
* ``step(planner, finished)`` applies the plan of this ledger's previous ``step``; any change to
  the residents in between (``apply``, ``admit``, ``retire*``, ``load``) drops that plan, and
  ``finished`` is then refused (a ``cancel`` does not: see Threads). Between two ``step`` calls the
  planner must not plan anything else: its one ``StepPlan`` is the pending plan. ``step``
  keeps the plan's version (``StepPlan._version``, changed by every ``plan()``) and refuses
  (``ValueError``, nothing changed) a pending plan whose version changed: one planner shared by
  two ledgers would otherwise apply one ledger's plan to the other. ``admit()`` drops it.
* Threads and re-entry (docs/threading.md): one serving loop per ledger; ``submit`` and
  ``cancel`` from any thread. Every call holds the ledger's lock for its whole run (caller code
  included) and records its thread. ``submit``/``cancel`` from another thread wait for it (the
  compiled ledger waits with the GIL released) and raise their own errors (``QueueFullError``, a
  duplicate id) to their own thread; the loop's other calls wait for a call that runs no caller
  code and are refused while one that does (an argument's ``__index__`` or ``__array__``, a
  record's ``__getitem__``, an iterator, a plan subclass, the planner's ``plan()``) runs on
  another thread; any call from the caller code a call runs, on its own thread, is refused
  (waiting would deadlock). A refused call raises ``StepPlannerRuntimeError`` ("Ledger
  re-entered") and changes nothing, and the outer call goes on from the state it read (both
  ledgers alike). Rows move only in the loop's calls: a resident cancelled while a ``step`` plan
  is pending (the engine may be running it) keeps its row, is never reported finished, and
  leaves in the same pass as the loop's next removal (``step``/``apply`` after applying that
  plan, ``admit``, ``retire*``); its id stays taken until then. With the C state private (the
  read-only views are over memory Python cannot write), every plan row checked against the table
  before it is used, and only a real ``StepPlan`` accepted, sharing a ledger never corrupts memory.
* Every operation checks everything first; one that raises leaves the ledger unchanged
  (``step`` checks the rows before it admits when no plan is pending). The one exception is a
  row the caller writes through ``residents`` while a ``step`` plan is pending: when planning it
  raises, that plan has already been applied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import QueueFullError
from .._select import implementation
from ..planner._types import RESIDENT_FIELDS
from ._shared import AdmissionOrder

__all__ = ["AdmissionOrder", "Ledger", "QueueFullError", "RESIDENT_FIELDS", "Ranker"]

if TYPE_CHECKING:
    from ._ledger_py import Ledger, Ranker
else:
    _impl = implementation("stepplanner.ledger._ledger", "stepplanner.ledger._ledger_py")
    Ledger = _impl.Ledger
    Ranker = _impl.Ranker
