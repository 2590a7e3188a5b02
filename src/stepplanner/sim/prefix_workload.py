"""A prefix-heavy synthetic workload: chat on shared system prompts, multi-turn sessions and
cold documents, with the prefixes they share (``sim.prefixes``).

Three kinds of request, their roots arriving as one Poisson stream (shares by count of roots):

* **chat** (``chat_share``): one of ``len(system_prompts)`` system prompts (drawn uniformly),
  then a user message (lognormal, median 200 tokens); it reuses the system prompt and leaves
  it cached; the system prompts are cached before the first arrival (a server's steady state).
  Output lognormal, median 150.
* **sessions** (the rest of the roots but the documents): a first turn of 300..800 tokens,
  then 1..5 more turns, each ``think`` seconds (uniform 20..60 s) after the one before arrives;
  a turn's prompt is the previous turn's prompt and answer and a new message of 50..400
  tokens, so its prefix is everything before its new message, left cached when the previous
  turn finished (a turn that arrives before that finds less: the hit is looked up at arrival).
  A session ends before a turn would pass ``max_prompt`` tokens. Output lognormal, median 120.
* **documents** (``document_share``): 1,000..6,000 tokens sharing nothing; output 100..300.

Objectives per request: chat and session turns ``SLO(1.5 s, 80 ms)`` (interactive), documents
``SLO(6 s, 100 ms)``. Every request is priority 0: the orders compared on it are the queue's.
"""

from __future__ import annotations

import numpy as np

from .prefixes import SharedPrefixes
from .workloads import Workload

__all__ = ["SYSTEM_PROMPTS", "prefix_heavy", "prefix_heavy_requests"]

SYSTEM_PROMPTS = (1024, 1536, 2048, 2560, 3072, 4096)
CHAT_SHARE, DOCUMENT_SHARE, MAX_PROMPT, THINK = 0.5, 0.2, 8192, (20.0, 60.0)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, low: int, high: int) -> int:
    return int(np.clip(round(median * np.exp(sigma * rng.standard_normal())), low, high))


def prefix_heavy(
    roots: int = 2000,
    rate: float = 10.0,
    seed: int = 0,
    *,
    chat_share: float = CHAT_SHARE,
    document_share: float = DOCUMENT_SHARE,
    system_prompts: tuple[int, ...] = SYSTEM_PROMPTS,
    max_prompt: int = MAX_PROMPT,
    think: tuple[float, float] = THINK,
) -> tuple[Workload, SharedPrefixes]:
    """The workload (sorted by arrival) and its shared prefixes, aligned with it."""
    rows = _rows(
        roots, rate, seed, chat_share, document_share, system_prompts, max_prompt, think, None
    )
    cols = np.array(rows, dtype=np.float64)
    order = np.argsort(cols[:, 0], kind="stable")
    cols = cols[order]
    ints = cols[:, 1:6].astype(np.int64)
    workload = Workload(
        cols[:, 0],
        ints[:, 0],
        ints[:, 1],
        np.zeros(len(cols), dtype=np.int64),
        f"prefix-heavy(roots={roots}, seed={seed})",
        ttft_slo=cols[:, 6],
        tpot_slo=cols[:, 7],
    )
    preloaded = dict(enumerate(system_prompts))  # a server's hot system prompts
    return workload, SharedPrefixes(ints[:, 2], ints[:, 3], ints[:, 4], preloaded)


def prefix_heavy_requests(
    requests: int, rate: float, seed: int = 0
) -> tuple[Workload, SharedPrefixes]:
    """``prefix_heavy`` with at least ``requests`` requests (the fewest roots that make them,
    so at most 5 more: a root's session has up to 6 turns) offered at ``rate`` requests/s: its
    roots arrive at ``rate`` x roots / requests per second, so that the requests over the
    roots' span come at ``rate`` (a session's later turns keep their gaps in seconds). Which
    requests a seed draws does not depend on the rate, so every rate offers the same ones: the
    way ``tools/prefix_experiments.py`` draws the workload per load."""
    shape = (CHAT_SHARE, DOCUMENT_SHARE, SYSTEM_PROMPTS, MAX_PROMPT, THINK)
    rows = _rows(requests, 1.0, seed, *shape, stop_at=requests)
    roots = int(rows[-1][8]) + 1
    workload, prefixes = prefix_heavy(roots, rate * roots / len(rows), seed)
    source = f"prefix-heavy(requests={len(workload)}, rate={rate:g}/s, seed={seed}; {roots} roots)"
    return workload.with_arrivals(workload.arrival_time, source), prefixes


def _rows(
    roots: int,
    rate: float,
    seed: int,
    chat_share: float,
    document_share: float,
    system_prompts: tuple[int, ...],
    max_prompt: int,
    think: tuple[float, float],
    stop_at: int | None,
) -> list[tuple[float, int, int, int, int, int, float, float, int]]:
    """The requests of ``roots`` roots in the order drawn, each with its root's index last;
    with ``stop_at``, no more roots once that many requests are drawn."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, int, int, int, int, float, float, int]] = []
    # (arrival, prompt, output, prefix_id, prefix_tokens, shares_tokens, ttft, tpot, root)
    arrival = 0.0
    n_system = len(system_prompts)
    session = n_system  # prefix ids: the system prompts first, then one per session
    for root in range(roots):
        if stop_at is not None and len(rows) >= stop_at:
            break
        arrival += rng.exponential(1.0 / rate)
        kind = rng.random()
        if kind < chat_share:
            k = int(rng.integers(n_system))
            system = system_prompts[k]
            prompt = system + _lognormal(rng, 200, 0.6, 16, 1024)
            rows.append(
                (
                    arrival,
                    prompt,
                    _lognormal(rng, 150, 0.6, 8, 512),
                    k,
                    system,
                    system,
                    1.5,
                    0.08,
                    root,
                )
            )
        elif kind < 1.0 - document_share:
            at, prefix = arrival, 0
            prompt = int(rng.integers(300, 801))
            for _turn in range(int(rng.integers(2, 7))):
                if prompt > max_prompt:
                    break
                output = _lognormal(rng, 120, 0.6, 8, 512)
                rows.append((at, prompt, output, session, prefix, prompt + output, 1.5, 0.08, root))
                prefix = prompt + output
                prompt = prefix + int(rng.integers(50, 401))
                at += float(rng.uniform(*think))
            session += 1
        else:
            prompt = int(rng.integers(1000, 6001))
            rows.append((arrival, prompt, int(rng.integers(100, 301)), -1, 0, 0, 6.0, 0.1, root))
    return rows
