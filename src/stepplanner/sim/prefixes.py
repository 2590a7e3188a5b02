"""Shared prompt prefixes of a workload and the prefix cache a simulated engine keeps of them.

A serving engine with prefix caching computes only what its cache does not already hold of a
prompt: a chat request on a cached system prompt, the next turn of a session whose earlier
turns are cached. ``SharedPrefixes`` says, per request of a workload, which cached prefix it
can reuse and what it leaves in the cache for later requests; ``PrefixCache`` is the cache.

* ``prefix_id[i]`` (-1: none) names the prefix the prompt starts with, ``prefix_tokens[i]`` how
  many of its first tokens it is (a system prompt; a session's earlier turns and answers).
* ``shares_tokens[i]`` is what request ``i`` leaves cached under ``prefix_id[i]``: the system
  prompt's length, or a session turn's prompt and output (the next turn's prefix). The part
  within its prompt is cached when its prompt is done (its first token), the rest when it
  finishes (its answer).
* ``preloaded`` maps prefix ids to the tokens cached before the first arrival: a server in its
  steady state holds its hot system prompts.

The cache keeps, per prefix id, the longest length cached so far; nothing is evicted (the
runs it serves model an engine whose KV pool holds the shared prefixes: docs/scheduling.md,
"Measured: uncached work first beside the peers' rules", says what that leaves out). A lookup
returns what vLLM's ``get_computed_blocks`` would: whole pages only, and never the prompt's last
token, which is always computed (its logits give the first output token).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import StepPlannerValueError

__all__ = ["PrefixCache", "SharedPrefixes", "nominal_hits"]


def _column(name: str, values: object, n: int) -> np.ndarray:
    col = np.asarray(values)
    if col.shape != (n,) or not np.issubdtype(col.dtype, np.integer):
        raise StepPlannerValueError(
            f"{name} must be {n} integers (one per request of the workload), got shape "
            f"{col.shape} of {col.dtype}"
        )
    col = np.ascontiguousarray(col, dtype=np.int64)
    col.flags.writeable = False
    return col


@dataclasses.dataclass(frozen=True, eq=False)
class SharedPrefixes:
    """Per request (workload order): the cached prefix it can reuse and what it leaves."""

    prefix_id: np.ndarray
    prefix_tokens: np.ndarray
    shares_tokens: np.ndarray
    preloaded: Mapping[int, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = np.asarray(self.prefix_id)
        if ids.ndim != 1:
            raise StepPlannerValueError(
                f"prefix_id must be a 1-D array of integers, one per request; got shape {ids.shape}"
            )
        n = len(ids)
        for name in ("prefix_id", "prefix_tokens", "shares_tokens"):
            object.__setattr__(self, name, _column(name, getattr(self, name), n))
        preloaded = {}
        for pid, tokens in dict(self.preloaded).items():
            if not (isinstance(pid, int) and isinstance(tokens, int) and pid >= 0 and tokens >= 0):
                raise StepPlannerValueError(
                    f"preloaded[{pid!r}]={tokens!r} is out of range; allowed: prefix ids >= 0 "
                    "mapped to token counts >= 0"
                )
            preloaded[pid] = tokens
        object.__setattr__(self, "preloaded", types.MappingProxyType(preloaded))
        for name, col, low in (
            ("prefix_id", self.prefix_id, -1),
            ("prefix_tokens", self.prefix_tokens, 0),
            ("shares_tokens", self.shares_tokens, 0),
        ):
            bad = np.flatnonzero(col < low)
            if bad.size:
                i = int(bad[0])
                raise StepPlannerValueError(
                    f"request {i}: {name}={int(col[i])} is out of range; allowed: >= {low}"
                )
        none = self.prefix_id == -1
        stray = np.flatnonzero(none & ((self.prefix_tokens != 0) | (self.shares_tokens != 0)))
        if stray.size:
            i = int(stray[0])
            raise StepPlannerValueError(
                f"request {i}: prefix_tokens={int(self.prefix_tokens[i])}, shares_tokens="
                f"{int(self.shares_tokens[i])} without a prefix (prefix_id=-1); allowed: 0 and 0"
            )

    def __len__(self) -> int:
        return len(self.prefix_id)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled for sweep's process workers: ``preloaded`` as a dict (a mappingproxy is not
        # picklable), checked again on the other side.
        return (
            SharedPrefixes,
            (self.prefix_id, self.prefix_tokens, self.shares_tokens, dict(self.preloaded)),
        )

    @classmethod
    def none(cls, n: int) -> SharedPrefixes:
        """``n`` requests that share nothing: every prompt computed whole."""
        zeros = np.zeros(n, dtype=np.int64)
        return cls(np.full(n, -1, dtype=np.int64), zeros, zeros)

    def check_against(self, prompt_tokens: np.ndarray) -> None:
        """Refuse a prefix longer than its prompt (``prompt_tokens``: the workload's)."""
        if len(self) != len(prompt_tokens):
            raise StepPlannerValueError(
                f"prefixes describe {len(self)} requests, the workload has {len(prompt_tokens)}; "
                "allowed: one per request"
            )
        bad = np.flatnonzero(self.prefix_tokens > prompt_tokens)
        if bad.size:
            i = int(bad[0])
            raise StepPlannerValueError(
                f"request {i}: prefix_tokens={int(self.prefix_tokens[i])} exceeds its prompt of "
                f"{int(prompt_tokens[i])} tokens; allowed: 0..prompt_tokens"
            )


class PrefixCache:
    """Per prefix id, the longest length cached so far (tokens), looked up in whole pages."""

    def __init__(self, page_size: int, preloaded: Mapping[int, int] | None = None) -> None:
        self.page = page_size
        self.cached: dict[int, int] = dict(preloaded or {})

    def hit(self, prefix_id: int, prefix_tokens: int, prompt_tokens: int) -> int:
        """Tokens of a prompt the cache holds: of its prefix, whole pages, never its last."""
        if prefix_id < 0:
            return 0
        usable = min(self.cached.get(prefix_id, 0), prefix_tokens, prompt_tokens - 1)
        return usable - usable % self.page

    def store(self, prefix_id: int, tokens: int) -> None:
        if prefix_id >= 0 and tokens > self.cached.get(prefix_id, 0):
            self.cached[prefix_id] = tokens


def nominal_hits(prompt_tokens: np.ndarray, prefixes: SharedPrefixes, page_size: int) -> np.ndarray:
    """Per request (arrival order), the hit it would find if every earlier request's share
    were cached when it arrives: the most the workload's structure allows (the work a
    saturation measurement should count, ``sim.load``)."""
    cache = PrefixCache(page_size, prefixes.preloaded)
    hits = np.zeros(len(prefixes), dtype=np.int64)
    for i, (pid, tokens, shares) in enumerate(
        zip(
            prefixes.prefix_id.tolist(),
            prefixes.prefix_tokens.tolist(),
            prefixes.shares_tokens.tolist(),
        )
    ):
        hits[i] = cache.hit(pid, tokens, int(prompt_tokens[i]))
        cache.store(pid, shares)
    return hits
