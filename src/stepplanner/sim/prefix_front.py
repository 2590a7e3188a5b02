"""The serving front of a simulated engine with a prefix cache, and the admission orders other
engines ship for one.

With ``RunSpec(prefixes=...)`` each arriving request looks up its shared prefix in the run's
``PrefixCache`` (``sim.prefixes``): the hit is what the engine does not compute, so the request
goes to the ledger with the rest of its prompt (``submit(prompt_length=prompt - hit)``, as a
runtime commits a hit before planning: the chunks still end on pages, the hit being whole
pages) and the hit is counted as context in every step's time. A prompt done (its first token)
stores its share of the prefix, a request finished its whole share (a session turn's answer is
the next turn's prefix). The hit is looked up once, at arrival (``late_hits`` counts the
admissions that would have found more by then: what that simplification leaves out).

The ledger's own orders (arrival, uncached first with its starvation bound, under any policy)
get the request at once and order it themselves. A *peer's* order (``ServingQueue.peer_order``)
keeps the queue here, in front of the ledger, and gives the ledger, each step, as many requests
as it will have free slots, in the peer's order (so the ledger, admitting in arrival order,
admits exactly those):

* ``"vllm-cache-window"`` — vLLM 0.34's ``Scheduler._reorder_waiting_by_cached_prefix``: within
  the first ``cache_window`` waiting requests, deepest cached prefix first, queue position
  breaking ties; the queue keeps the new order (vLLM re-inserts the window). vLLM applies it only
  while its KV cache is at least ``cache_aware_admission_threshold`` (0.5) used; the simulator
  has no pool here, so it applies it every step (vLLM's behaviour with the threshold at 0, or with
  a busy cache).
* ``"sglang-hrrn"`` — SGLang's HRRN (``SchedulePolicy._sort_by_hrrn``): the queue sorted by the
  response ratio ``waited / uncached``, highest first, where ``waited`` is the prompt tokens the
  engine has computed since the request arrived (SGLang's processed-tokens counter) and
  ``uncached`` its prompt less its hit; a request with nothing uncached first; ties by queue
  position.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..planner._policy import StepPlannerLimits
from .engine import ServingQueue
from .prefixes import PrefixCache, SharedPrefixes
from .workloads import Workload

__all__ = ["PrefixFront"]

Submit = Callable[[int, int], None]


class PrefixFront:
    """One run's prefix cache, its hits, and (with a peer's order) its own waiting queue."""

    def __init__(
        self,
        workload: Workload,
        limits: StepPlannerLimits,
        queue: ServingQueue,
        prefixes: SharedPrefixes | None,
    ) -> None:
        n = len(workload)
        self.w = workload
        self.prefixes = SharedPrefixes.none(n) if prefixes is None else prefixes
        self.cache = PrefixCache(limits.kv_page_size, self.prefixes.preloaded)
        self.max_input_length = limits.max_input_length
        self.hit = np.zeros(n, dtype=np.int64)  # tokens of its prompt each did not compute
        self.order = queue.peer_order
        self.window = queue.cache_window
        self.waiting: list[int] = []  # the peer's queue, in its order
        self.prompt_tokens_computed = 0  # SGLang's processed-tokens counter
        self.computed_at_arrival = np.zeros(n, dtype=np.int64)
        self.late_hits = 0

    # --- arrivals and the peer's queue -----------------------------------------------------

    def arrive(self, i: int, submit: Submit) -> None:
        p = self.prefixes
        prompt = int(self.w.prompt_tokens[i])
        if prompt > self.max_input_length:  # the whole prompt must fit, however much is cached
            submit(i, prompt)  # the ledger refuses it, and the run counts it refused
            return
        hit = self.cache.hit(int(p.prefix_id[i]), int(p.prefix_tokens[i]), prompt)
        self.hit[i] = hit
        if self.order is None:
            submit(i, prompt - hit)
        else:
            self.computed_at_arrival[i] = self.prompt_tokens_computed
            self.waiting.append(i)

    def release(self, room: int, submit: Submit) -> None:
        """Pass the ``room`` requests the peer's order takes next to the ledger."""
        if room <= 0 or not self.waiting:
            return
        if self.order == "vllm-cache-window":
            self._vllm_cache_window()
        else:
            self._sglang_hrrn()
        taken = self.waiting[:room]
        del self.waiting[:room]
        for i in taken:
            submit(i, int(self.w.prompt_tokens[i]) - int(self.hit[i]))

    def _vllm_cache_window(self) -> None:
        # Every request here is plain WAITING with nothing computed (no preemption in these
        # runs), so every slot of the window takes part; the hit is get_num_cached_tokens'.
        # Reordering only before a release is the same as every step: the sort is stable
        # and the keys fixed, so sorting a sorted window again changes nothing.
        head = self.waiting[: self.window]
        if len(head) < 2:
            return
        hit = self.hit
        head.sort(key=lambda i: -int(hit[i]))  # stable: queue position breaks ties
        self.waiting[: self.window] = head

    def _sglang_hrrn(self) -> None:
        prompt, hit = self.w.prompt_tokens, self.hit
        done, since = self.prompt_tokens_computed, self.computed_at_arrival

        def ratio(i: int) -> float:
            uncached = int(prompt[i]) - int(hit[i])
            return np.inf if uncached == 0 else (done - int(since[i])) / uncached

        self.waiting.sort(key=lambda i: -ratio(i))  # stable: queue position breaks ties

    # --- what a step leaves in the cache ---------------------------------------------------

    def computed(self, prompt_tokens: int) -> None:
        """A step computed ``prompt_tokens`` tokens of prompts (HRRN's clock)."""
        self.prompt_tokens_computed += prompt_tokens

    def prompts_done(self, requests: np.ndarray) -> None:
        """``requests`` emitted their first token: their prompts' shares are cached."""
        p = self.prefixes
        for i in requests[p.prefix_id[requests] >= 0].tolist():
            self.cache.store(
                int(p.prefix_id[i]), min(int(p.shares_tokens[i]), int(self.w.prompt_tokens[i]))
            )

    def finished(self, requests: np.ndarray) -> None:
        """``requests`` finished: their whole shares (prompt and answer) are cached."""
        p = self.prefixes
        for i in requests[p.prefix_id[requests] >= 0].tolist():
            self.cache.store(int(p.prefix_id[i]), int(p.shares_tokens[i]))

    def admitted(self, requests: np.ndarray) -> None:
        """Count the admissions whose prefix grew in the cache while they waited."""
        p, w = self.prefixes, self.w
        for i in requests[p.prefix_id[requests] >= 0].tolist():
            hit = self.cache.hit(
                int(p.prefix_id[i]), int(p.prefix_tokens[i]), int(w.prompt_tokens[i])
            )
            self.late_hits += hit > int(self.hit[i])
