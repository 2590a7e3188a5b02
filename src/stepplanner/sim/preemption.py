"""The simulator with a finite KV page pool taken as it is used, and preemption when it runs out.

``sim.paged`` reserves each request's worst case at admission, so no step ever runs out of
pages, at the cost of admitting fewer requests. Serving engines (vLLM) instead give a request
pages as its KV grows and, when a step's rows would outgrow the pool, **preempt** a running
request: its KV is dropped and it goes back to the front of the waiting queue, to be computed
again from its prompt and the tokens it has output (vLLM's recompute preemption). This run
does that (``Engine(num_pages=N, kv_preemption=RULE)``):

* **Admission** by pages: a request is passed to the ledger (in arrival order, a preempted one
  first) only while the pool, less the pages the residents hold after the step running and the
  pages promised to requests passed but not yet admitted, holds its prompt's pages (vLLM stops
  at the first waiting request whose blocks it cannot allocate). The ledger then admits and
  ranks them by its own rules; a request whose prompt and output exceed the whole pool is
  refused at arrival (counted in ``refused``).
* **Each step**, after the ledger has planned it: every resident holds
  ``ceil(tokens / P)`` pages, its committed tokens plus what the plan writes for it. While that
  is over the pool, a victim is preempted by the run's rule: the ledger cancels it (its rows of
  the plan are not run: their tokens and time are not the step's), its computed tokens are
  counted as recomputed, and it waits at the front of the arrivals to be passed again (after
  the ledger has let it go) as a prompt of its prompt and output so far, with its remaining
  output and its original deadlines (its next token's is its TTFT deadline then).
* **Victim rules** (``engine.VICTIM_RULES``):

  - ``"vllm"``: vLLM's (``Scheduler._preempt_request``'s caller, v1): under FCFS the running
    request admitted last (``running[-1]``); under a priority policy the largest
    ``(priority, arrival_time)`` (the lowest priority, then the latest arrival). Classes are
    not protected.
  - ``"least-work"``: the resident whose preemption throws away the fewest computed tokens
    (``committed``), never one of a protected class (priority below the serving queue's
    ``never_relegate_below``, the classes DEADLINE never gives up on) while another will do;
    ties go to the one admitted last. Under every policy.

  A request whose prompt and output so far exceed S_in cannot be recomputed as one prompt, so
  it is never a victim. When no resident is left to preempt (all protected, or too long), a
  protected one is preempted after all (``protected_preemptions``), and failing that the step
  runs over the pool (``overcommitted_steps``): both are counted, never silent.

The report's ``preemption`` section counts preemptions, requests preempted, recomputed tokens
(and ``pages`` the pool's occupancy, as ``sim.paged``'s).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from .._errors import QueueFullError
from ..core import StepPlanner
from ..ledger._shared import least_work_victim
from ..planner._types import SchedulingPolicy
from .engine import RunSpec
from .occupancy import PageOccupancy
from .simulator import NO_GAP, Progress, SimulationResult, SimulationRun

__all__ = ["PreemptingRun", "simulate_preempting_run"]


class PreemptingRun(SimulationRun):
    """``SimulationRun`` on a page pool taken as KV grows, preempting by ``kv_preemption``."""

    def __init__(self, spec: RunSpec, planner: Any) -> None:
        super().__init__(spec, planner)
        engine, w = spec.engine, spec.workload
        n = len(w)
        self.rule = engine.kv_preemption
        self.num_pages = engine.num_pages
        self.page = self.limits.kv_page_size
        self.by_priority = self.policy.scheduling_policy != SchedulingPolicy.FCFS
        self.never_below = engine.queue.never_relegate_below
        self.outer: collections.deque[int] = collections.deque()  # not yet passed to the ledger
        self.length = w.prompt_tokens.astype(np.int64).copy()  # the prompt to compute next
        self.promised: dict[int, int] = {}  # passed, not yet admitted: their prompts' pages
        self.promised_pages = 0
        self.held = 0  # pages the residents hold once the step running has run
        self.leaving: set[int] = set()  # preempted, still in the ledger until its next step
        self.victim_rows: set[int] = set()  # this step's plan rows not run
        self.admitted_at = np.zeros(n, dtype=np.int64)  # admission order (vLLM's running list)
        self.admissions = 0
        self.preempted = np.zeros(n, dtype=np.int64)
        self.recomputed = np.zeros(n, dtype=np.int64)
        self.counts = {"protected_preemptions": 0, "overcommitted_steps": 0}
        # Refused before it waits: a request that could never run in the whole pool.
        worst = w.prompt_tokens.astype(np.int64) + np.maximum(w.output_tokens, 1)
        self.too_big = -(-worst // self.page) > self.num_pages

    # --- arrivals and admission by pages --------------------------------------------------

    def _arrivals(self) -> None:
        w = self.w
        stop = int(np.searchsorted(w.arrival_time, self.now, side="right"))
        for i in range(self.next_request, stop):
            if self.too_big[i]:
                self.refused[i] = True
            else:
                self.outer.append(i)
        self.next_request = max(self.next_request, stop)

    def _release(self) -> None:
        """Pass waiting requests to the ledger, in order, while their prompts' pages fit."""
        free = self.num_pages - self.held - self.promised_pages
        while self.outer:
            i = self.outer[0]
            if i in self.leaving:
                return  # preempted this step: the ledger lets it go at its next step
            need = -(-int(self.length[i]) // self.page)
            if need > free:
                return
            self.outer.popleft()
            if self._submit(i):
                self.promised[i] = need
                self.promised_pages += need
                free -= need

    def _submit(self, i: int) -> bool:
        w, g = self.w, int(self.generated[i])
        gap = float(self.gap[i])
        # Resumed after g tokens: its next token is its first, due when token g was.
        shift = g * gap if g and gap != NO_GAP else 0.0
        try:
            self.ledger.submit(
                i,
                int(self.length[i]),
                int(w.priority[i]),
                max_new_tokens=max(1, int(w.output_tokens[i]) - g),
                arrival_time=float(w.arrival_time[i]) + shift,
                slo=self.own_slo.get(i),
            )
        except QueueFullError:
            self.refused[i] = self.queue_full[i] = True  # the server's 429
            if self.ledger.relegated_waiting:
                self.refused_beside_relegated += 1
            return False
        except ValueError:
            self.refused[i] = True  # counted in the report, never silently dropped
            return False
        return True

    # --- the step -----------------------------------------------------------------------------

    def _fused_step(self) -> tuple[Any, np.ndarray, np.ndarray]:
        self._release()
        plan, finished, admitted = super()._fused_step()
        self.leaving.clear()
        self.victim_rows = set()
        if self.ledger.count == 0 and self.outer:
            # Everyone left with that step: the pool is empty, so the head fits now.
            self.held = 0
            self._release()
            if self.promised:
                done = finished.copy()
                plan, finished, admitted = super()._fused_step()
                finished = np.concatenate([done, finished])
        for rid in admitted.tolist():
            self.promised_pages -= self.promised.pop(rid, 0)
            self.admissions += 1
            self.admitted_at[rid] = self.admissions
        self._fit(plan)
        return plan, finished, admitted

    def _fit(self, plan: Any) -> None:
        """Preempt residents until the pages the plan's step needs fit the pool."""
        ledger = self.ledger
        count = ledger.count
        if count == 0:
            self.held = 0
            return
        committed = ledger.residents["committed"].astype(np.int64)
        seq = plan.as_array()
        after = committed.copy()
        np.add.at(after, seq["resident"], seq["query_length"])
        pages = -(-after // self.page)
        need = int(pages.sum())
        if need > self.num_pages:
            ids = ledger.request_ids
            alive = np.ones(count, dtype=bool)
            while need > self.num_pages:
                row = self._victim(ids, committed, alive)
                if row is None:
                    self.counts["overcommitted_steps"] += 1
                    break
                alive[row] = False
                need -= int(pages[row])
                self._preempt(int(ids[row]), row, int(committed[row]))
        self.held = need

    def _victim(self, ids: np.ndarray, committed: np.ndarray, alive: np.ndarray) -> int | None:
        w = self.w
        req = ids[: len(alive)]
        # Recomputed as one prompt of its prompt and output so far: it must fit S_in.
        again = self.w.prompt_tokens[req] + self.generated[req]
        movable = alive & (again <= self.limits.max_input_length)
        if self.rule == "vllm":
            if not movable.any():
                return None
            rows = np.flatnonzero(movable)
            if self.by_priority:  # max (priority, arrival_time): lowest priority, latest arrival
                key = np.lexsort((w.arrival_time[req[rows]], w.priority[req[rows]]))
                return int(rows[key[-1]])
            return int(rows[np.argmax(self.admitted_at[req[rows]])])
        rows = np.flatnonzero(movable)
        if not rows.size:
            return None
        # Least committed first, never a protected class while another will do; among equals
        # the one admitted last (the ledgers' rule, shared with the vLLM adapter).
        pick, protected = least_work_victim(
            committed[rows].tolist(),
            (w.priority[req[rows]] < self.never_below).tolist(),
            self.admitted_at[req[rows]].tolist(),
        )
        if protected:
            self.counts["protected_preemptions"] += 1
        return int(rows[pick])

    def _preempt(self, rid: int, row: int, lost: int) -> None:
        self.ledger.cancel(rid)  # its plan rows are not run; the ledger lets it go next step
        self.victim_rows.add(row)
        self.leaving.add(rid)
        self.preempted[rid] += 1
        self.recomputed[rid] += lost
        self.length[rid] = int(self.w.prompt_tokens[rid]) + int(self.generated[rid])
        self.outer.appendleft(rid)

    def _rows_run(self, plan: Any) -> tuple[np.ndarray, int]:
        seq = plan.as_array()
        if not self.victim_rows:
            return seq, plan.total_tokens
        ran = seq[~np.isin(seq["resident"], list(self.victim_rows))]
        return ran, int(ran["query_length"].sum())

    def result(self, wall: float, truncated: bool) -> SimulationResult:
        result = super().result(wall, truncated)
        result.kv_preemption = self.rule
        result.preempted = self.preempted
        result.recomputed_tokens = self.recomputed
        result.preemption_counts = dict(self.counts)
        return result


def simulate_preempting_run(
    spec: RunSpec, *, progress: Progress | None = None, progress_every: int = 2048
) -> tuple[SimulationResult, PageOccupancy]:
    """The run ``spec`` describes, its engine's ``num_pages`` taken as KV grows and residents
    preempted by its ``kv_preemption`` rule when they run out (see the module doc)."""
    engine = spec.engine
    run = PreemptingRun(spec, StepPlanner(engine.policy, engine.limits))
    in_use: list[int] = []
    held_back: list[int] = []

    def record(step: int, start: float, ledger: Any, plan: Any) -> None:
        in_use.append(run.held)  # pages held once this step has run (victims let go)
        held_back.append(len(run.outer))

    result = run.run(spec.max_steps, record, progress, progress_every)
    held = np.array(in_use, dtype=np.int64)
    occupancy = PageOccupancy(
        engine.num_pages, held, held, np.array(held_back, dtype=np.int64), run.too_big.copy()
    )
    return result, occupancy
