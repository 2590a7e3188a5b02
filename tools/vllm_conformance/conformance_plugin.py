"""pytest plugin: vLLM's own tests/v1/core scheduler tests, run against chosen schedulers.

Loaded by ``tools/vllm_conformance/conformance.py`` as ``-p conformance_plugin`` in a pytest
run over the tests extracted from vLLM's source distribution; never edits a test body. It

- makes the models the tests name resolvable offline: a Hugging Face cache holding only a
  hand-written ``config.json`` (and a tokenizer, and a multimodal model's processor config) per
  model (``stand_ins.py``), with ``HF_HUB_OFFLINE=1``;
- supplies the one fixture the tests take from vLLM's top-level ``tests/conftest.py`` (which is
  not extracted: it imports most of vLLM's test dependencies);
- runs every test once per mode (``$VLLM_CONFORMANCE_MODES``, JSON: ``{mode: [scheduler,
  policy, options]}``, baselines first), as a parameter ``conformance-MODE`` appended to its id,
  so vLLM is imported and the tests collected once for all modes;
- substitutes the scheduler inside the tests' own construction helpers (``HELPERS``): while a
  helper runs, the names ``Scheduler`` and ``AsyncScheduler`` in its module stand for a factory
  that builds the mode's scheduler. A test that passes its own ``scheduler_cls``, or builds a
  ``Scheduler(...)`` in its body, keeps vLLM's class there;
- writes one JSON record per test and mode to ``$VLLM_CONFORMANCE_REPORT``: its outcome, how
  many schedulers the helpers built, and the start-up refusal StepPlannerScheduler raised, if any.

A mode is (scheduler, policy, options): scheduler ``vllm`` (vLLM's own class, as the helper
chooses it) or ``stepplanner`` (``StepPlannerScheduler``); policy ``as-written`` (vLLM's
``--scheduling-policy`` as the test sets it) or ``priority`` (every helper-built scheduler under
PRIORITY); options ``additional_config["stepplanner"]``. A StepPlannerScheduler mode's baseline
is the ``vllm`` mode of the same policy; the StepPlannerScheduler modes run first, so that a
baseline that would tell nothing can be skipped (``_conformance_mode``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stand_ins  # noqa: E402

# The helpers that build a scheduler, by module (relative to the extracted tests' root) and name.
# A name absent from a version's tests is passed over; conformance.py selects the test files that
# define or call one of them.
HELPERS = {
    "tests.v1.core.utils": ("create_scheduler",),
    "tests.v1.core.test_scheduler": ("create_scheduler_with_priority",),
    "tests.v1.core.test_priority_preemption_bug": ("build_scheduler",),
    "tests.v1.core.test_prefix_replay": ("_replay_scheduler",),
}
SWAPPED = ("Scheduler", "AsyncScheduler")  # the names a helper builds its scheduler from
PREFIX = "conformance-"  # a mode's id in a test's node id
REFUSED = "StepPlannerScheduler refused it at start-up in every mode of this policy"
SAME_AS_WRITTEN = "its helpers build under PRIORITY as written: the as-written baseline ran it"

MODES: dict[str, tuple[str, str, dict[str, Any]]] = {
    mode: (scheduler, policy, options)
    for mode, (scheduler, policy, options) in json.loads(
        os.environ.get("VLLM_CONFORMANCE_MODES") or '{"vllm": ["vllm", "as-written", {}]}'
    ).items()
}
BASELINE = {policy: mode for mode, (scheduler, policy, _) in MODES.items() if scheduler == "vllm"}
REPORT = os.environ.get("VLLM_CONFORMANCE_REPORT")
for _mode, (_scheduler, _policy, _) in MODES.items():
    if _scheduler not in ("vllm", "stepplanner") or _policy not in ("as-written", "priority"):
        raise pytest.UsageError(
            f"conformance_plugin: mode {_mode}: scheduler {_scheduler!r} (vllm or stepplanner), "
            f"policy {_policy!r} (as-written or priority)"
        )


class _Test:
    """The mode of the test running now, and what the factory saw during it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.built = 0  # schedulers built through a helper
        self.refusal: str | None = None  # StepPlannerScheduler's start-up refusal
        self.policies: list[str] = []  # the policy of each scheduler built, as the test set it


_current = _Test(next(iter(MODES)))
_records: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    # Before vLLM is imported by any test module: no hub access, the CPU platform.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    cache = Path(tempfile.mkdtemp(prefix="vllm-conformance-hf-"))
    stand_ins.write_hub_cache(cache)
    os.environ["HF_HUB_CACHE"] = str(cache)
    os.environ["HF_HOME"] = str(cache)


@pytest.fixture(autouse=True, scope="session")
def _config_on_cpu() -> Any:
    """Configs built on vLLM's CPU platform as the adapter builds a scheduler-only one: where a
    release's CPU platform refuses x86 without triton-cpu (0.34), Triton counts as present (the
    refusal guards kernels no scheduler test runs; ``_compat.config_on_cpu``). Without the
    package (``--baseline-only``) the platform decides alone."""
    try:
        from stepplanner.integrations.vllm import _compat
    except ImportError:
        yield
        return
    with _compat.config_on_cpu():
        yield


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # trylast: after the tests' own parametrize marks, so the mode is the id's last part.
    if "_conformance_mode" in metafunc.fixturenames:
        metafunc.parametrize(
            "_conformance_mode", list(MODES), ids=[PREFIX + m for m in MODES], indirect=True
        )


@pytest.fixture(autouse=True)
def _conformance_mode(request: pytest.FixtureRequest) -> str:
    """The test's mode. A baseline that would tell nothing is skipped (``conformance.py`` reads
    the skip's reason): where StepPlannerScheduler refused the test's configuration at start-up
    in every mode of the baseline's policy, and, for the PRIORITY baseline, where the test's
    helpers built every scheduler under PRIORITY already (the as-written baseline ran it)."""
    global _current
    mode = request.param
    _current = _Test(mode)
    scheduler, policy, _ = MODES[mode]
    if scheduler == "vllm":
        ran = [
            _records.get(_sibling(request.node.nodeid, mode, other))
            for other, (s, p, _) in MODES.items()
            if s == "stepplanner" and p == policy
        ]
        if ran and all(r is not None and r["refusal"] for r in ran):
            pytest.skip(REFUSED)
        as_written = BASELINE.get("as-written")
        if policy == "priority" and as_written is not None:
            base = _records.get(_sibling(request.node.nodeid, mode, as_written))
            if base is not None and base["policies"] and set(base["policies"]) == {"priority"}:
                pytest.skip(SAME_AS_WRITTEN)
    return mode


def _sibling(nodeid: str, mode: str, other: str) -> str:
    head, tail = nodeid.rsplit(PREFIX + mode, 1)
    return head + PREFIX + other + tail


def _factory(original: type) -> Any:
    """What a helper builds in place of ``original``, vLLM's ``Scheduler`` or ``AsyncScheduler``."""

    def build(*args: Any, **kwargs: Any) -> Any:
        scheduler, policy, options = MODES[_current.mode]
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        _current.policies.append(str(vllm_config.scheduler_config.policy))
        if policy == "priority":
            vllm_config.scheduler_config.policy = "priority"
        if original.__name__ == "AsyncScheduler":
            # vLLM's CPU platform switches async scheduling off while the config is built; the
            # helper chose AsyncScheduler because the test asked for it, so it is set back on,
            # as a GPU engine runs it (vLLM's AsyncScheduler does not read the flag; the
            # adapter does: stepplanner.integrations.vllm_cpu.make_scheduler does the same).
            vllm_config.scheduler_config.async_scheduling = True
        _current.built += 1
        if scheduler == "vllm":
            return original(*args, **kwargs)
        from stepplanner.integrations.vllm import StepPlannerScheduler

        additional = vllm_config.additional_config
        if not isinstance(additional, dict):
            additional = vllm_config.additional_config = {}
        additional["stepplanner"] = dict(options)
        try:
            return StepPlannerScheduler(*args, **kwargs)
        except ValueError as exc:
            if "StepPlannerScheduler does not support" in str(exc):
                _current.refusal = str(exc)
            raise

    build.__name__ = build.__qualname__ = original.__name__
    return build


def _substituting(helper: Any) -> Any:
    """``helper``, with its module's ``Scheduler``/``AsyncScheduler`` swapped while it runs."""

    module_globals = helper.__globals__

    @functools.wraps(helper)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        saved = {name: module_globals[name] for name in SWAPPED if name in module_globals}
        for name, cls in saved.items():
            module_globals[name] = _factory(cls)
        try:
            return helper(*args, **kwargs)
        finally:
            module_globals.update(saved)

    wrapper.__conformance_original__ = helper  # type: ignore[attr-defined]
    return wrapper


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module is imported now: point each name bound to a helper at its wrapper."""
    wrappers = {}
    for module_name, names in HELPERS.items():
        module = sys.modules.get(module_name)
        for name in names:
            helper = getattr(module, name, None)
            if helper is not None and not hasattr(helper, "__conformance_original__"):
                wrappers[id(helper)] = _substituting(helper)
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("tests.") or module is None:
            continue
        for name, value in list(vars(module).items()):
            if id(value) in wrappers:
                setattr(module, name, wrappers[id(value)])


# --- the fixtures vLLM's tests/conftest.py would supply ------------------------------------------


@pytest.fixture()
def caplog_vllm(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Any:
    """vLLM's log records captured (its ``vllm`` logger propagates to the root while it runs)."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    monkeypatch.setitem(DEFAULT_LOGGING_CONFIG["loggers"]["vllm"], "propagate", True)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    with caplog.at_level(logging.INFO):
        yield caplog


# --- the report ---------------------------------------------------------------------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    record = _records.setdefault(
        item.nodeid,
        {
            "mode": item.nodeid.rsplit(PREFIX, 1)[1][:-1],
            "outcome": "passed",
            "built": 0,
            "refusal": None,
            "policies": [],
            "message": "",
            "seconds": 0.0,
        },
    )
    record["seconds"] = round(record["seconds"] + report.duration, 3)
    record["built"] = _current.built
    record["refusal"] = _current.refusal
    record["policies"] = list(_current.policies)
    if report.skipped and record["outcome"] == "passed":
        record["outcome"] = "skipped"
        record["message"] = _short(report)
    elif report.failed:
        record["outcome"] = "failed" if report.when == "call" else "error"
        record["message"] = _short(report)


def _short(report: pytest.TestReport) -> str:
    """The failure's last line (the exception), as pytest's short summary gives it."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REPORT:
        Path(REPORT).write_text(json.dumps(_records, indent=1, sort_keys=True))
