"""Uncached work first over vLLM's waiting queue (docs/scheduling.md, "Uncached work first"): the
ledgers' ``AdmissionOrder.UNCACHED_FIRST`` with its starvation bound, each request's uncached
work read from vLLM's prefix cache (``get_computed_blocks``) when it arrives. vLLM keeps its own
queue (its other code reads it); this order only chooses which of its requests are candidates."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request

from ...ledger._shared import AdmissionArgs, AdmissionOrder

# A queue entry: (key, request). The key is the ledgers' (their twin's ``_to_policy_order``):
# (class under PRIORITY,) uncached work or -1 once starved, submission number; a request whose
# key has changed since (starved, preempted) or that no longer waits leaves its old entries dead.
_Key = tuple[int, ...]
_Entry = tuple[_Key, Request]


class UncachedQueue(AsyncScheduler):
    """``StepPlannerScheduler``'s waiting requests by uncached work; set up only with
    ``"admission": "uncached-first"``."""

    _uncached: bool

    def _init_uncached(self, args: AdmissionArgs) -> None:
        order, bound, by_seconds = args
        self._uncached = order == AdmissionOrder.UNCACHED_FIRST
        # A request is starved once since + bound <= clock: the clock is the schedule() calls so
        # far (bound = starvation_steps + 1) or vLLM's time.time() (starvation_seconds).
        self._starve_after = bound
        self._starve_by_seconds = by_seconds
        self._passes = 0
        self._latest_since = -math.inf
        self._submitted = 0
        self._work_heap: list[_Entry] = []
        self._work_keys: dict[str, _Key] = {}  # a request's current key
        # The requests not yet starved, in submission order, with the key they were queued with.
        self._aging: deque[tuple[float, _Key, Request]] = deque()
        self._taken: list[_Entry] = []  # entries this step took off the heap
        # Admitted rows are stamped in admission order, as the ledgers restamp them: the plan
        # gives the chunks of prompts resident together to the one admitted first.
        self._admitted_stamp = 0

    def _enqueue_uncached(self, request: Request) -> None:
        """A new request in the order, by its prompt less the prefix vLLM has cached for it now
        (the ledgers' ``cached_tokens``: it orders, and the hit is looked up again, and
        committed, when the request is admitted). A request holding KV blocks is in vLLM's other
        queue, which is read first."""
        if self._holds_kv_blocks(request):
            return
        hit = self._probe_prefix(request)[1] if self.kv_cache_manager.enable_caching else 0
        key = self._new_key(request, request.num_tokens - hit)
        self._work_keys[request.request_id] = key
        heapq.heappush(self._work_heap, (key, request))
        if self._starve_by_seconds:  # kept in submission order, as the ledgers keep it
            self._latest_since = max(self._latest_since, float(request.arrival_time))
            since = self._latest_since
        else:
            since = float(self._passes)
        self._aging.append((since, key, request))

    def _to_arrival_order(self, request: Request) -> None:
        """A starved request, or a preempted one (vLLM puts it at its queue's head): work -1,
        ahead of every request of its class not starved, among them by submission."""
        key = self._work_keys.get(request.request_id)
        if key is None:  # it arrived holding KV blocks: numbered now
            key = self._new_key(request, 0)
        starved = (*key[:-2], -1, key[-1])
        self._work_keys[request.request_id] = starved
        heapq.heappush(self._work_heap, (starved, request))

    def _new_key(self, request: Request, work: int) -> _Key:
        """The key of a request submitted now with ``work`` uncached tokens."""
        self._submitted += 1
        if self._priority_order:
            return (request.priority, work, self._submitted)
        return (work, self._submitted)

    def _live(self, key: _Key, request: Request) -> bool:
        """An entry still stands: its request waits and has not been given another key."""
        return self._work_keys.get(request.request_id) == key and self._waits(request)

    def _starve_uncached(self) -> None:
        """One admission pass: every request that has waited past the bound goes back to
        arrival order."""
        self._passes += 1
        clock = self.clock() if self._starve_by_seconds else float(self._passes)
        aging = self._aging
        while aging:
            since, key, request = aging[0]
            if not self._live(key, request):
                aging.popleft()  # admitted, gone, or already moved
                continue
            if since + self._starve_after > clock:
                break
            aging.popleft()
            self._to_arrival_order(request)

    def _uncached_order(self, free: int, out: list[object]) -> Iterator[Request]:
        """Waiting requests by key, taken off the heap one at a time (``out``: the candidates
        so far); ``priority >= 0`` only while more than the reserved slots are free, as in
        vLLM's queue order."""
        heap, taken = self._work_heap, self._taken
        while heap:
            entry = heapq.heappop(heap)
            if not self._live(*entry):
                continue
            request = entry[1]
            taken.append(entry)
            if self._held_for_urgent(request, free, out):
                if self._priority_order:
                    return  # urgent requests sort first: none follows
                continue
            if self._admissible(request):
                yield request

    def _requeue_uncached(self, admitted: list[Request]) -> None:
        """The entries this step took and did not admit go back; the admitted rows' stamps
        raise the floor the next admissions are stamped above."""
        done = set(admitted)
        for entry in self._taken:
            if entry[1] not in done:
                heapq.heappush(self._work_heap, entry)
        self._taken = []
        rows = self._rows
        for request in admitted:
            self._admitted_stamp = max(self._admitted_stamp, rows[request.request_id].arrival)
        if len(self._work_heap) > 2 * len(self.requests) + 64:
            self._work_heap = [e for e in self._work_heap if self._live(*e)]
            heapq.heapify(self._work_heap)
