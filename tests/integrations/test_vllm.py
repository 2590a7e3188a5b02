"""StepPlannerScheduler inside vLLM's v1 scheduler, driven on the CPU with fake model outputs.

Every stream runs in both of vLLM's modes: async scheduling on (the default: ``vllm_cpu.run``
schedules step N+1 before it processes step N's output, as ``EngineCore``'s batch queue does)
and off.

Needs the pinned vLLM (the ``vllm`` extra). Without it the module is skipped, unless
STEPPLANNER_REQUIRE_INTEGRATIONS=1 (CI: .ci/integration_vllm.sh), which makes that a failure.
"""

from __future__ import annotations

import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's CPU platform: no GPU needed
try:
    from stepplanner.integrations import vllm as sp_vllm
    from stepplanner.integrations import vllm_cpu
except ImportError as exc:
    if os.environ.get("STEPPLANNER_REQUIRE_INTEGRATIONS") == "1":
        raise
    pytest.skip(f"vLLM integration unavailable: {exc}", allow_module_level=True)

from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from stepplanner import SequenceWork, check_plan  # noqa: E402

StepPlannerScheduler = sp_vllm.StepPlannerScheduler
P = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vllm_cpu.write_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def overlap(request):
    """vLLM's async scheduling off and on (the same class, as --scheduler-cls gives it)."""
    return request.param


def make(model_dir, *, num_seqs=16, batched=512, num_blocks=600, caching=False, policy="fcfs",
         cls=StepPlannerScheduler, overlap=False, **stepplanner):
    return vllm_cpu.make_scheduler(cls, model_dir, max_num_seqs=num_seqs,
                                   max_num_batched_tokens=batched, num_blocks=num_blocks,
                                   block_size=P, enable_prefix_caching=caching, policy=policy,
                                   async_scheduling=overlap,
                                   stepplanner=stepplanner if cls is StepPlannerScheduler else None)


def stream(n, seed, *, max_prompt=700, max_tokens=24, priorities=(-1, 0, 1), shared_prefix=0,
           per_step=3):
    """``n`` requests, prompts 1..max_prompt, arriving ``per_step`` a step; {step: [requests]}."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1000) for _ in range(shared_prefix)]
    arrivals = {}
    for i in range(n):
        length = rng.randint(1, max_prompt)
        prompt = (prefix + [rng.randrange(1000) for _ in range(length)])[:max(length, 1)] \
            if shared_prefix else [rng.randrange(1000) for _ in range(length)]
        req = vllm_cpu.make_request(f"r{i}", prompt, rng.randint(1, max_tokens),
                                    priority=rng.choice(priorities), arrival_time=1000.0 + i,
                                    block_size=P)
        arrivals.setdefault(i // per_step, []).append(req)
    return arrivals


def all_requests(arrivals):
    return [r for step in sorted(arrivals) for r in arrivals[step]]


class Checker:
    """Holds every step of a StepPlannerScheduler to its plan (the module's central assertion)."""

    def __init__(self, sched):
        self.sched = sched
        self.overlap = sched.scheduler_config.async_scheduling
        self.ahead_rows = 0  # rows planned while a step sampling that request's token was running
        self.before = {}
        self.decoding = set()
        self.pause_run = {}
        self.max_pause_run = 0
        self.pauses = 0
        self.released = 0
        self.hits = []
        self.steps_with_withheld = 0
        sched.on_plan = self.on_plan

    def on_plan(self, residents, plan, requests):
        check_plan(self.sched.stepplanner_policy, self.sched.stepplanner_limits, residents, plan)
        self.before = {}
        for i, req in enumerate(requests):
            ahead = req.num_output_placeholders
            if req.status == RequestStatus.RUNNING:
                self.before[req.request_id] = req.num_computed_tokens
                assert residents[i].committed == req.num_computed_tokens
                # A request whose running step samples its last token has no row to plan.
                assert req.num_output_tokens + ahead < req.max_tokens, req.request_id
                assert req.num_tokens + ahead < self.sched.max_model_len, req.request_id
            else:
                self.before[req.request_id] = residents[i].committed
                if residents[i].committed:
                    self.hits.append((req.request_id, residents[i].committed))
            assert ahead == 0 or self.overlap, req.request_id  # placeholders: async only
        self.decoding = {requests[s.resident].request_id for s in plan.sequences
                         if s.work == SequenceWork.DECODE}
        self.ahead_rows += sum(requests[s.resident].num_output_placeholders > 0
                               for s in plan.sequences)

    def after(self, step, out):
        sched, last = self.sched, self.sched.last_step
        assert out.total_num_scheduled_tokens <= sched.scheduler_config.max_num_batched_tokens
        for rid, n in out.num_scheduled_tokens.items():
            assert last.planned[rid] == n, (step, rid)
            req = sched.requests[rid]
            if rid in self.decoding:
                assert n == 1
            elif req.num_computed_tokens < req.num_tokens:  # a non-final prompt chunk
                assert req.num_computed_tokens % P == 0, (step, rid, req.num_computed_tokens)
            assert self.before[rid] + n == req.num_computed_tokens
        unscheduled = set(last.planned) - set(out.num_scheduled_tokens)
        assert unscheduled == set(last.withheld) | set(last.preempted), step
        self.steps_with_withheld += bool(last.withheld)
        for rid in last.paused:
            assert rid not in out.num_scheduled_tokens
            assert sched.requests[rid].status == RequestStatus.RUNNING  # paused stays running
            self.pause_run[rid] = self.pause_run.get(rid, 0) + 1
            self.max_pause_run = max(self.max_pause_run, self.pause_run[rid])
            self.pauses += 1
        for rid in list(self.pause_run):
            if rid not in last.paused:
                if rid in last.planned:
                    self.released += 1
                del self.pause_run[rid]


def run_checked(sched, arrivals, **kw):
    checker = Checker(sched)
    steps = vllm_cpu.run(sched, arrivals, after_schedule=checker.after, **kw)
    # With async scheduling, requests really are planned before their last token is back.
    assert (checker.ahead_rows > 0) == checker.overlap, checker.ahead_rows
    return checker, steps


def assert_completed(sched, arrivals, num_blocks):
    for req in all_requests(arrivals):
        assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED, (req.request_id, req.status)
        assert req.num_output_tokens == req.max_tokens, req.request_id
    assert not sched.requests and not sched.running and not sched.waiting
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == num_blocks - 1  # null block


# --- whole streams ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_stream_completes_and_every_step_is_its_plan(model_dir, overlap, policy):
    sched = make(model_dir, overlap=overlap, policy=policy, priority_reserved_slots=2)
    arrivals = stream(300, seed=1)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert sched.stepplanner_stats.paused_rows == checker.pauses == 0  # PAUSE not asked for
    assert sched.stepplanner_stats.scheduled_rows > 300


def test_priority_pause_unschedules_and_releases_after_max_pause_steps(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, policy="priority", preemption="pause",
                 max_pause_steps=4)
    arrivals = stream(300, seed=2, per_step=2)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert checker.pauses > 50
    assert checker.max_pause_run == 4  # never longer than max_pause_steps, and reached
    assert checker.released > 0        # a request paused 4 steps running is planned on the 5th


def test_fcfs_never_pauses_even_when_pause_is_asked(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, policy="fcfs", preemption="pause", max_pause_steps=2)
    arrivals = stream(200, seed=3)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert checker.pauses == 0 and sched.stepplanner_stats.paused_rows == 0


def test_prefix_cache_hit_is_committed_and_first_chunk_ends_on_a_block(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, caching=True, batched=256)
    arrivals = stream(150, seed=4, shared_prefix=300, per_step=1)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert len(checker.hits) > 50
    assert all(hit % P == 0 and hit > 0 for _, hit in checker.hits)
    # The checker held every chunk after a hit to a block boundary or the prompt's end, and
    # each admission's computed tokens to hit + its planned chunk.


def test_kv_pressure_withholds_rows_and_recompute_preemption_keeps_moving(model_dir, overlap):
    num_blocks = 120  # 1,904 tokens of KV for up to 16 requests of up to ~300 tokens each
    sched = make(model_dir, overlap=overlap, num_blocks=num_blocks, num_seqs=16, batched=512,
                 policy="priority", preemption="pause", max_pause_steps=3)
    arrivals = stream(200, seed=5, max_prompt=300, max_tokens=60, per_step=4)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, num_blocks)
    stats = sched.stepplanner_stats
    assert stats.withheld_rows > 0 and checker.steps_with_withheld > 0
    assert stats.recompute_preemptions > 0


def test_aborts_while_waiting_mid_prefill_mid_pause_and_in_flight(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, policy="priority", preemption="pause",
                 max_pause_steps=6, caching=True)
    arrivals = stream(150, seed=2, per_step=2)
    aborted = {}
    latest = {}

    def take(rid, kind):
        if rid is not None and rid not in aborted and list(aborted.values()).count(kind) < 3:
            sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            assert rid not in sched.requests  # its blocks are back at once
            aborted[rid] = kind

    def abort(step):  # before a schedule()
        last = sched.last_step
        take(next(iter(last.paused), None), "paused")
        if step % 3 == 0:
            take(next((r.request_id for r in sched.running
                       if 0 < r.num_computed_tokens < r.num_prompt_tokens - 1), None), "prefill")
            take(next((r.request_id for r in sched.waiting), None), "waiting")

    def abort_in_flight(step, out):  # before update_from_output(out): the engine's abort point
        if step % 4:
            return
        for rid, n in out.num_scheduled_tokens.items():
            if rid not in sched.requests:
                continue
            row = "decode" if n == 1 else "chunk"
            if latest["out"] is not out and rid in latest["out"].num_scheduled_tokens:
                take(rid, f"{row}, in two steps in flight")  # async: the next step has it too
            else:
                take(rid, f"{row}, in flight")

    checker = Checker(sched)

    def after(step, out):
        checker.after(step, out)
        latest["out"] = out

    vllm_cpu.run(sched, arrivals, after_schedule=after, before_step=abort,
                 before_update=abort_in_flight)
    kinds = {"paused", "prefill", "waiting", "chunk, in flight", "decode, in flight"}
    if overlap:
        kinds |= {"chunk, in two steps in flight", "decode, in two steps in flight"}
    assert set(aborted.values()) == kinds
    for req in all_requests(arrivals):
        if req.request_id in aborted:
            assert req.status == RequestStatus.FINISHED_ABORTED
        else:
            assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
            assert req.num_output_tokens == req.max_tokens
    assert not sched.requests and not sched.running and not sched.waiting
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 600 - 1


def test_requests_stop_at_max_model_len(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, num_seqs=8, batched=512)
    max_len = sched.max_model_len
    arrivals = stream(40, seed=7, max_prompt=max_len - 1, max_tokens=200, per_step=2)
    run_checked(sched, arrivals)
    capped = 0
    for req in all_requests(arrivals):
        room = max_len - req.num_prompt_tokens
        assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED, req.request_id
        assert req.num_output_tokens == min(req.max_tokens, room), req.request_id
        capped += room < req.max_tokens
    assert capped >= 3
    assert not sched.requests
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 600 - 1


def test_reserved_slots_hold_back_normal_requests(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, num_seqs=4, batched=512, priority_reserved_slots=2)
    reqs = [vllm_cpu.make_request(f"n{i}", [i + 1] * 40, 30, arrival_time=1.0 + i)
            for i in range(6)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert set(sched.last_step.admitted) == {"n0", "n1"}  # 4 slots, 2 reserved
    sched.update_from_output(out, vllm_cpu.fake_output(sched, out))
    sched.add_request(vllm_cpu.make_request("u", [99] * 40, 30, priority=-1, arrival_time=9.0))
    out = sched.schedule()
    assert sched.last_step.admitted == ["u"]  # an urgent request behind them takes a reserved one
    assert "u" in out.num_scheduled_tokens


# --- the same stream through vLLM's own scheduler (what the benchmark compares) -----------------


def test_vllm_own_scheduler_finishes_the_same_stream(model_dir, overlap):
    # Scheduler without async scheduling, AsyncScheduler with it: what vLLM itself would pick.
    sched = make(model_dir, overlap=overlap, cls=AsyncScheduler if overlap else Scheduler)
    arrivals = stream(100, seed=1)
    vllm_cpu.run(sched, arrivals)
    assert_completed(sched, arrivals, 600)


# --- start-up errors and refused features ----------------------------------------------------


@pytest.mark.parametrize(("options", "exc", "words"), [
    ({"max_pause_step": 8}, ValueError, "'max_pause_step' is not known"),
    ({"preemption": "swap"}, ValueError, "preemption='swap'"),
    ({"max_pause_steps": "8"}, TypeError, "max_pause_steps must be an integer"),
    ({"max_pause_steps": -1}, ValueError, "max_pause_steps"),
    ({"scheduling_policy": "priority"}, ValueError, "--scheduling-policy 'fcfs'"),
    ({"priority_reserved_slots": 16}, ValueError, "priority_reserved_slots"),
    ({"max_chunk_tokens": 24}, ValueError, "max_chunk_tokens"),
])
def test_bad_options_fail_at_start_up(model_dir, options, exc, words):
    with pytest.raises(exc) as info:
        make(model_dir, **options)
    assert str(info.value).startswith('additional_config["stepplanner"]: ')
    assert words in str(info.value)


def test_options_are_spelled_as_the_cli_spells_them(model_dir):
    sched = make(model_dir, policy="priority", scheduling_policy="priority", preemption="pause",
                 max_pause_steps=8, ifb_scheduling_mode="mixed", priority_reserved_slots=1)
    pol = sched.stepplanner_policy
    assert (pol.preemption.name, pol.max_pause_steps, pol.priority_reserved_slots) == (
        "PAUSE", 8, 1)
    assert pol.max_num_tokens == 512  # vLLM's max_num_batched_tokens is the step budget
    assert sched.stepplanner_limits.max_step_tokens == 512
    assert sched.stepplanner_limits.max_batch_size == 16
    assert sched.stepplanner_limits.kv_page_size == P


def test_vllm_limits_the_planner_cannot_hold_name_both_spellings(model_dir):
    # An 8-token step cannot end a prompt chunk on a 16-token block.
    with pytest.raises(ValueError, match="max_num_batched_tokens=8 .*max_step_tokens"):
        vllm_cpu.make_scheduler(StepPlannerScheduler, model_dir, max_num_seqs=4,
                                max_num_batched_tokens=1024, max_num_scheduled_tokens=8,
                                num_blocks=100)


@pytest.mark.parametrize(("kwargs", "feature"), [
    ({"long_prefill_token_threshold": 64}, "long_prefill_token_threshold"),
    ({"enable_chunked_prefill": False}, "chunked prefill"),
])
def test_unsupported_scheduler_features_are_refused_by_name(model_dir, kwargs, feature):
    with pytest.raises(ValueError, match=feature):
        vllm_cpu.make_scheduler(StepPlannerScheduler, model_dir, max_num_seqs=4,
                                max_num_batched_tokens=1024, num_blocks=100, **kwargs)


def test_unsupported_config_features_are_refused_by_name(model_dir):
    sched = make(model_dir)
    config = sched.vllm_config
    config.parallel_config.pipeline_parallel_size = 2
    assert any("pipeline parallel" in f for f in sp_vllm._unsupported_features(config))
    config.parallel_config.pipeline_parallel_size = 1
    for attr, feature in [("speculative_config", "speculative decoding"),
                          ("kv_transfer_config", "KV connectors"),
                          ("lora_config", "LoRA")]:
        setattr(config, attr, object())
        assert any(feature in f for f in sp_vllm._unsupported_features(config)), feature
        setattr(config, attr, None)
    assert sp_vllm._unsupported_features(config) == []


def test_structured_output_request_finishes_with_an_error(model_dir, overlap):
    sched = make(model_dir, overlap=overlap)
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(regex="a+"))
    req = Request(request_id="so", prompt_token_ids=[1, 2, 3], sampling_params=params,
                  pooling_params=None, arrival_time=1.0)
    sched.add_request(req)
    out = sched.schedule()
    assert out.total_num_scheduled_tokens == 0
    outputs = sched.update_from_output(out, vllm_cpu.fake_output(sched, out))
    (result,) = outputs[0].outputs
    assert req.status == RequestStatus.FINISHED_ERROR
    assert "structured output" in result.error.message


def test_scheduler_cls_resolves_by_dotted_path(model_dir):
    sched = make(model_dir)
    config = sched.scheduler_config
    config.scheduler_cls = "stepplanner.integrations.vllm.StepPlannerScheduler"
    assert config.get_scheduler_cls() is StepPlannerScheduler


def test_the_readme_serve_line_builds_the_scheduler_with_async_scheduling(model_dir, monkeypatch):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = readme.split("<!-- vllm-serve -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    argv = shlex.split(line.strip())
    assert argv[:2] == ["vllm", "serve"]
    # The hub model of the example is swapped for the tiny local config (no network here).
    argv = ["--model", str(model_dir), "--skip-tokenizer-init", *argv[3:]]
    # vLLM's CPU platform turns async scheduling off while the config is built (it has no device
    # work to overlap); a GPU platform keeps what the line and vLLM's defaults chose, so this does.
    platform = type(current_platform)
    platform_hook = platform.check_and_update_config

    def keep_async_scheduling(cls, vllm_config):
        chosen = vllm_config.scheduler_config.async_scheduling
        platform_hook(vllm_config)
        vllm_config.scheduler_config.async_scheduling = chosen

    monkeypatch.setattr(platform, "check_and_update_config", classmethod(keep_async_scheduling))
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(argv)
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.scheduler_config.async_scheduling is True
    assert config.max_concurrent_batches == 2  # EngineCore's batch queue: step N+1 overlaps N
    assert config.scheduler_config.get_scheduler_cls() is StepPlannerScheduler
    config.cache_config.num_gpu_blocks = 64
    block = config.cache_config.block_size
    assert block == P
    kv = vllm_cpu.kv_cache_config(64, block)
    sched = StepPlannerScheduler(vllm_config=config, kv_cache_config=kv,
                                 structured_output_manager=StructuredOutputManager(config),
                                 block_size=block)
    pol = sched.stepplanner_policy
    assert (pol.scheduling_policy.name, pol.preemption.name, pol.max_pause_steps,
            pol.priority_reserved_slots) == ("PRIORITY", "PAUSE", 8, 4)
    arrivals = stream(24, seed=6, max_prompt=120, max_tokens=12)
    run_checked(sched, arrivals)  # asserts rows were planned ahead of their tokens' return
    assert_completed(sched, arrivals, 64)


def test_any_other_vllm_version_is_an_import_error_naming_the_supported_one(tmp_path):
    fake = tmp_path / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.32.1"\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", "import stepplanner.integrations.vllm"],
                            env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "vllm==0.33.0 only" in result.stderr and "found vllm 0.32.1" in result.stderr
