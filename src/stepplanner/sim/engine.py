"""One description of a simulated run: the engine and the workload it serves.

``Engine`` is what the run's engine is: its limits, its scheduling options, the latency model of
its steps, its KV page pool (0: unlimited), its serving front (``ServingQueue``), speculative
decoding (``Speculation``) and, as a diagnostic, a real run's pace (``EnginePace``). ``RunSpec``
is one run: a workload on an engine, how many steps at most, and whether every token's time is
kept. The simulator, the paged simulator, the saturation measurement and the command line pass
these whole instead of a dozen loose values, each checked once, where it is made.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from .._errors import INT32_MAX, StepPlannerTypeError, StepPlannerValueError
from ..ledger._shared import (
    NEVER_RELEGATE_BELOW,
    AdmissionOrder,
    check_admission_args,
    check_relegation_args,
)
from ..planner._policy import (
    ResolvedSchedulingPolicy,
    SchedulingOptions,
    StepPlannerLimits,
    resolve_scheduling_policy,
)
from ..planner._types import IfbSchedulingMode, SchedulingPolicy
from .latency import DEFAULT_LATENCY, EnginePace, LatencyModel
from .prefixes import SharedPrefixes
from .workloads import Workload

__all__ = [
    "DEFAULT_LIMITS",
    "Engine",
    "PEER_ORDERS",
    "RunSpec",
    "ServingQueue",
    "Speculation",
    "VICTIM_RULES",
    "resolve_options",
]

# How a run that preempts for KV pages picks its victim (sim.preemption): vLLM's rule (the
# resident admitted last; under a priority policy the lowest priority, then the latest arrival),
# or the least computed work lost, never a protected class while another will do.
VICTIM_RULES = ("vllm", "least-work")

# Admission orders other engines ship, applied by the simulator in front of the ledger (which
# then admits in arrival order): vLLM 0.34's cache-aware admission window and SGLang's HRRN
# (sim.prefix_front has both rules as their code has them).
PEER_ORDERS = ("vllm-cache-window", "sglang-hrrn")

DEFAULT_LIMITS = StepPlannerLimits(max_batch_size=256, max_input_length=4096, kv_page_size=32)


@dataclasses.dataclass(frozen=True)
class ServingQueue:
    """The serving front a run's ledger keeps: how many requests may wait (``None``: the whole
    workload, nothing is pushed back), how long a relegated one may still wait (``None``: its
    own TTFT objective; 0: handed back at once) and the classes never relegated (priority below
    ``never_relegate_below``). The last two are the ledger's ``relegated_wait`` and
    ``never_relegate_below``, checked by it; so are the order it admits in (``admission``) and
    that order's starvation bound (docs/scheduling.md, "Uncached work first")."""

    max_waiting: int | None = None
    relegated_wait: float | None = None
    never_relegate_below: int = NEVER_RELEGATE_BELOW
    admission: AdmissionOrder = AdmissionOrder.ARRIVAL
    starvation_steps: int | None = None
    starvation_seconds: float | None = None
    # A peer engine's admission order instead of the ledger's (one of PEER_ORDERS), and the
    # look-ahead of vLLM's window (its cache_aware_admission_window; 0 there means off).
    peer_order: str | None = None
    cache_window: int = 64

    def __post_init__(self) -> None:
        if self.max_waiting is not None and (
            isinstance(self.max_waiting, bool)
            or not isinstance(self.max_waiting, int)
            or not 1 <= self.max_waiting <= INT32_MAX
        ):
            raise StepPlannerValueError(
                f"max_waiting={self.max_waiting!r} is out of range; allowed: 1..{INT32_MAX}, or "
                "None (every request may wait)"
            )
        check_relegation_args(self.relegated_wait, self.never_relegate_below)
        check_admission_args(self.admission, self.starvation_steps, self.starvation_seconds)
        object.__setattr__(self, "admission", AdmissionOrder(self.admission))  # 1 -> its member
        if self.peer_order is not None:
            if self.peer_order not in PEER_ORDERS:
                raise StepPlannerValueError(
                    f"peer_order={self.peer_order!r} is not a peer's admission order; allowed: "
                    + ", ".join(repr(r) for r in PEER_ORDERS)
                    + ", or None (the ledger's own order)"
                )
            if self.admission != AdmissionOrder.ARRIVAL:
                raise StepPlannerValueError(
                    f"peer_order={self.peer_order!r} with admission={self.admission.name}: the "
                    "peer orders the queue, the ledger admits what it is given in arrival order; "
                    "allowed: one of the two"
                )
            if self.max_waiting is not None:
                raise StepPlannerValueError(
                    f"peer_order={self.peer_order!r} with max_waiting={self.max_waiting}: the "
                    "peer's queue is in front of the ledger's, so the cap would bound nothing; "
                    "allowed: max_waiting=None"
                )
        w = self.cache_window
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= INT32_MAX:
            raise StepPlannerValueError(
                f"cache_window={w!r} is out of range; allowed: 1..{INT32_MAX} (vLLM's window of "
                "0 is arrival order: peer_order=None)"
            )

    def ledger_options(self, requests: int) -> dict[str, Any]:
        """The ``Ledger`` keywords for a run of ``requests``."""
        return {
            "max_waiting": max(requests, 1) if self.max_waiting is None else self.max_waiting,
            "relegated_wait": self.relegated_wait,
            "never_relegate_below": self.never_relegate_below,
            "admission": self.admission,
            "starvation_steps": self.starvation_steps,
            "starvation_seconds": self.starvation_seconds,
        }


@dataclasses.dataclass(frozen=True)
class Speculation:
    """Speculative decoding in a run: every decoding request proposes ``num_spec_tokens``
    drafts a step (capped by the ledger at what its max_new_tokens leaves), the plan grants what
    the budget holds (SPEC §8), and each verified draft is accepted with probability
    ``acceptance``, in order, up to the first rejection (the draft model agrees with the target
    token by token), from a generator seeded by ``seed``."""

    num_spec_tokens: int
    acceptance: float
    seed: int = 0

    def __post_init__(self) -> None:
        k = self.num_spec_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
            raise StepPlannerValueError(
                f"num_spec_tokens={k!r} is out of range; allowed: an int in 1..64"
            )
        a = self.acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise StepPlannerValueError(
                f"acceptance={a!r} is out of range; allowed: a number in [0, 1]"
            )

    def accepted(self, rng: np.random.Generator, verified: np.ndarray) -> np.ndarray:
        """How many of each row's ``verified`` drafts are accepted."""
        if self.acceptance >= 1.0:
            return verified.astype(np.int32)
        if self.acceptance <= 0.0:
            return np.zeros(len(verified), dtype=np.int32)
        # Trials to the first rejection, less that one: the accepted run before it.
        run = rng.geometric(1.0 - self.acceptance, size=len(verified)) - 1
        accepted: np.ndarray = np.minimum(run, verified).astype(np.int32)
        return accepted


def resolve_options(options: Any, limits: StepPlannerLimits) -> ResolvedSchedulingPolicy:
    """``options`` (SchedulingOptions, None for the defaults, or already resolved) under
    ``limits``; anything else is a ``TypeError``."""
    if isinstance(options, ResolvedSchedulingPolicy):
        return options
    if options is None:
        options = SchedulingOptions()
    if not isinstance(options, SchedulingOptions):
        raise StepPlannerTypeError(
            "options must be a SchedulingOptions or ResolvedSchedulingPolicy, got "
            f"{type(options).__name__}"
        )
    return resolve_scheduling_policy(options, limits)


def _check_type(field: str, value: object, kind: type, optional: bool = False) -> None:
    if not (isinstance(value, kind) or (optional and value is None)):
        name = kind.__name__
        allowed = ("an " if name[0] in "AEIOU" else "a ") + name + (" or None" if optional else "")
        raise StepPlannerTypeError(f"{field} must be {allowed}, got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class Engine:
    """The engine of a simulated run. ``options`` resolve under ``limits`` (``policy``);
    ``num_pages`` > 0 gives the run a pool of that many KV pages (``simulate_paged``)."""

    limits: StepPlannerLimits = DEFAULT_LIMITS
    options: SchedulingOptions | ResolvedSchedulingPolicy | None = None
    latency: LatencyModel = DEFAULT_LATENCY
    num_pages: int = 0
    queue: ServingQueue = dataclasses.field(default_factory=ServingQueue)
    speculation: Speculation | None = None
    pace: EnginePace | None = None
    # A step-time budget (ledger.StepTimeBudget): each step with decode rows capped at this
    # many seconds as the latency model predicts it, and the model refitted online from the
    # steps' times. None: the policy's max_num_tokens every step.
    max_step_seconds: float | None = None
    # With a page pool: pages taken as KV grows (a prompt's at admission), and when a step's
    # would outgrow the pool a resident is preempted (its KV dropped, recomputed when it runs
    # again) by this rule, "vllm" or "least-work" (sim.preemption). None: every request's worst
    # case reserved at admission, so none is ever preempted (sim.paged).
    kv_preemption: str | None = None

    def __post_init__(self) -> None:
        _check_type("limits", self.limits, StepPlannerLimits)
        s = self.max_step_seconds
        if s is not None and (
            isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < math.inf
        ):
            raise StepPlannerValueError(
                f"max_step_seconds={s!r} is out of range; allowed: a finite number of seconds "
                "> 0, or None (no step-time budget)"
            )
        _check_type("latency", self.latency, LatencyModel)
        _check_type("queue", self.queue, ServingQueue)
        _check_type("speculation", self.speculation, Speculation, optional=True)
        _check_type("pace", self.pace, EnginePace, optional=True)
        n = self.num_pages
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise StepPlannerValueError(
                f"num_pages={n!r} is out of range; allowed: 0 (unlimited pages) or an int >= 1"
            )
        rule = self.kv_preemption
        if rule is not None:
            if rule not in VICTIM_RULES:
                raise StepPlannerValueError(
                    f"kv_preemption={rule!r} is not a victim rule; allowed: "
                    + ", ".join(repr(r) for r in VICTIM_RULES)
                    + ", or None (worst cases reserved, nothing preempted)"
                )
            if n == 0:
                raise StepPlannerValueError(
                    f"kv_preemption={rule!r} needs a page pool; allowed with num_pages >= 1"
                )
            if self.speculation is not None:
                raise StepPlannerValueError(
                    f"kv_preemption={rule!r} with speculation: not simulated (a preempted row's "
                    "drafts are not modelled); allowed: one of the two"
                )
        _ = self.policy  # options that do not resolve under these limits: refused here
        peer = self.queue.peer_order
        if peer is not None:
            if self.policy.scheduling_policy != SchedulingPolicy.FCFS:
                raise StepPlannerValueError(
                    f"queue.peer_order={peer!r} orders a FCFS queue (vLLM's window and SGLang's "
                    f"HRRN have no priority classes); the policy is "
                    f"{self.policy.scheduling_policy.name}; allowed: FCFS"
                )
            if n:
                raise StepPlannerValueError(
                    f"queue.peer_order={peer!r} with num_pages={n}: not simulated; allowed: "
                    "num_pages=0"
                )
        if s is not None and self.policy.mode != IfbSchedulingMode.MIXED:
            raise StepPlannerValueError(
                f"max_step_seconds={s!r} needs the MIXED mode (a per-step budget is MIXED's, "
                f"SPEC §9); the policy resolved to {self.policy.mode.name}"
            )

    @functools.cached_property
    def policy(self) -> ResolvedSchedulingPolicy:
        """The scheduling policy ``options`` resolve to under ``limits`` (resolved once)."""
        return resolve_options(self.options, self.limits)

    def replace(self, **changes: Any) -> Engine:
        """This engine with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One simulated run: ``workload`` on ``engine``, cut short after ``max_steps`` steps
    (None: to the end), keeping every token's time when ``detailed``; with ``prefixes`` the
    engine keeps a prefix cache of the prompts' shared prefixes (``sim.prefix_front``)."""

    workload: Workload
    engine: Engine = dataclasses.field(default_factory=Engine)
    max_steps: int | None = None
    detailed: bool = False
    prefixes: SharedPrefixes | None = None

    def __post_init__(self) -> None:
        _check_type("workload", self.workload, Workload)
        _check_type("engine", self.engine, Engine)
        m = self.max_steps
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise StepPlannerValueError(f"max_steps={m!r} is out of range; allowed: None or >= 1")
        _check_type("prefixes", self.prefixes, SharedPrefixes, optional=True)
        if self.prefixes is not None:
            self.prefixes.check_against(self.workload.prompt_tokens)
            if self.engine.num_pages:
                raise StepPlannerValueError(
                    f"prefixes with engine.num_pages={self.engine.num_pages}: a prefix cache "
                    "beside a page pool is not simulated; allowed: num_pages=0"
                )
