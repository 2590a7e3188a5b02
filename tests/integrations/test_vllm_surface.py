"""The installed vLLM's scheduler surface is the one the adapter was written against.

``stepplanner/integrations/vllm/surface/<minor>.json`` records, per supported release, the fields
of the dataclasses the adapter builds or reads, every method signature of ``Scheduler``,
``AsyncScheduler`` and ``KVCacheManager``, and the attributes a ``Scheduler`` sets up; a release
(a patch release included) that moved any of them fails here by name, before any stream runs.
docs/development.md ("A new vLLM release") says what to do with each name.

Runs in each vLLM lane (.ci/integration_vllm.sh); without vLLM the module is skipped, unless
STEPPLANNER_REQUIRE_INTEGRATIONS=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
try:
    from stepplanner.integrations import vllm_cpu
    from stepplanner.integrations.vllm import _compat, _surface
except ImportError as exc:
    if os.environ.get("STEPPLANNER_REQUIRE_INTEGRATIONS") == "1":
        raise
    pytest.skip(f"vLLM integration unavailable: {exc}", allow_module_level=True)

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402


def test_every_supported_release_has_a_record():
    assert sorted(p.stem for p in _surface.RECORDS.glob("*.json")) == sorted(_compat.RELEASES)


def test_the_installed_vllm_is_as_recorded():
    known = _surface.record(_compat.VLLM_VERSION)
    assert known is not None, f"no record for vLLM {_compat.VLLM_VERSION}"
    differences = _surface.differences(known, _surface.read())
    assert not differences, (
        f"vLLM {_compat.VLLM_VERSION} differs from the adapter's record of "
        f"{known['vllm']} (docs/development.md, 'A new vLLM release'):\n" + "\n".join(differences)
    )


def test_every_scheduler_attribute_the_adapter_reads_exists(tmp_path):
    scheduler = vllm_cpu.make_scheduler(
        AsyncScheduler,
        vllm_cpu.write_model_dir(tmp_path),
        max_num_seqs=8,
        max_num_batched_tokens=256,
        num_blocks=64,
        enable_prefix_caching=True,
    )
    reads = _surface.adapter_reads()
    assert {"running", "waiting", "kv_cache_manager", "requests"} <= set(reads)
    missing = {name: sorted(files) for name, files in reads.items() if not hasattr(scheduler, name)}
    assert not missing, f"read by the adapter, absent from vLLM {_compat.VLLM_VERSION}: {missing}"


def test_a_moved_field_method_or_attribute_is_named():
    known = _surface.record(_compat.VLLM_VERSION)
    assert known is not None
    found = {
        "vllm": known["vllm"],
        "dataclasses": {k: dict(v) for k, v in known["dataclasses"].items()},
        "methods": {k: dict(v) for k, v in known["methods"].items()},
        "scheduler_attributes": [*known["scheduler_attributes"], "new_queue"],
    }
    found["dataclasses"]["SchedulerOutput"]["new_field"] = "int"
    del found["dataclasses"]["NewRequestData"]["block_ids"]
    found["methods"]["Scheduler"]["schedule"] = "(self, budget: int) -> SchedulerOutput"
    assert _surface.differences(known, found) == [
        "NewRequestData.block_ids: the adapter knows this field; vLLM has none",
        "SchedulerOutput.new_field: a field the adapter does not know (int)",
        f"Scheduler.schedule: {known['methods']['Scheduler']['schedule']} known, "
        "(self, budget: int) -> SchedulerOutput found",
        "Scheduler().new_queue: an attribute the adapter does not know",
    ]
