"""stepplanner driving transformers' continuous batching, checked token for token against
generate().

A tiny Llama with seeded random weights runs on the CPU in float32; ``eos_token_id`` is None in
its config and its generation config, so every request runs to its ``max_new_tokens`` (a random
model emits token 2 early, and ``generate()`` would stop there while continuous batching runs on).
Every step of every run is checked: the plan passes ``check_plan``, the batch the runtime actually
ran (read from its own request states as it builds the forward) equals the plan's rows, and every
non-final chunk ends on a page boundary of the runtime's cache. At the end of each run all pages
are free again.

The runs go through both of the runtime's loops: synchronous, and ``use_async_batching=True``
(its overlap mode: batch N+1 is scheduled and prepared before batch N's tokens are read back,
and a decode row's input is the placeholder the device fills from batch N's output). That mode
asks for CUDA or XPU streams; here its streams are stand-ins that do nothing, which on the CPU,
where every operation completes before the next starts, keeps the loop's order and its token
carry-over exactly as they are.

Without torch/transformers this module skips, unless STEPPLANNER_REQUIRE_INTEGRATIONS=1 (CI), which
turns the missing runtime into an import error: a failure, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import stepplanner as sp

REQUIRED = os.environ.get("STEPPLANNER_REQUIRE_INTEGRATIONS") == "1"
try:
    import torch
    from transformers import (
        ContinuousBatchingConfig,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )
    from transformers.generation.continuous_batching import input_outputs
    from transformers.generation.continuous_batching.requests import TMP_TOKEN_ID, RequestStatus
    from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

    from stepplanner.integrations import transformers as tf_integration
except ImportError as exc:
    if REQUIRED:
        raise ImportError(f"STEPPLANNER_REQUIRE_INTEGRATIONS=1 but the transformers integration "
                          f"cannot be imported: {exc}") from exc
    pytest.skip(f"transformers integration not installed: {exc}", allow_module_level=True)

VOCAB = 97
S_IN = 32
FCFS, PRIORITY = sp.SchedulingPolicy.FCFS, sp.SchedulingPolicy.PRIORITY
MIXED, PREFILL_FIRST, AUTO = (sp.IfbSchedulingMode.MIXED, sp.IfbSchedulingMode.PREFILL_FIRST,
                              sp.IfbSchedulingMode.AUTO)
PAUSE = sp.PreemptionMode.PAUSE


# --- the model and its reference outputs -------------------------------------------------------

@pytest.fixture(scope="module")
def model() -> Any:
    # One intra-op thread: a model this small gains nothing from more, and on a shared machine
    # a busy second thread makes every forward ten times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, eos_token_id=None, bos_token_id=None,
                         pad_token_id=None)
    config._attn_implementation = "eager"
    net = LlamaForCausalLM(config).to(torch.float32).eval()
    net.generation_config.eos_token_id = None
    net.generation_config.pad_token_id = 0
    yield net
    torch.set_num_threads(threads)


_REFERENCE: dict[tuple[tuple[int, ...], int], list[int]] = {}


def greedy(net: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    key = (tuple(prompt), max_new_tokens)
    if key not in _REFERENCE:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = net.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
        _REFERENCE[key] = out[0, len(prompt):].tolist()
    return _REFERENCE[key]


# --- workloads -------------------------------------------------------------------------------

@dataclass
class Request:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    priority: int
    late: bool = False  # submitted from inside the loop after a few steps


def workload(seed: int, n: int = 18, shared_prefix: int = 0) -> list[Request]:
    """``n`` requests, prompt lengths 1..S_IN (both ends included), outputs 1..10 tokens, mixed
    priorities; the last third arrive late with better priorities (that is what makes pauses)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB) for _ in range(shared_prefix)]
    lengths = [1, S_IN] + [rng.randint(1, S_IN) for _ in range(n - 2)]
    rng.shuffle(lengths)
    out = []
    for i, length in enumerate(lengths):
        late = i >= n - n // 3
        body = [rng.randrange(3, VOCAB) for _ in range(length)]
        if shared_prefix and i % 2 == 0 and length > shared_prefix:
            body[:shared_prefix] = prefix
        out.append(Request(f"req{seed}_{i}", body, rng.randint(1, 10),
                           rng.choice([-1, 0]) if late else rng.choice([0, 1, 2]), late))
    return out


# --- one run, observed at every step ----------------------------------------------------------

@dataclass
class Run:
    results: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    steps: int = 0
    chunks: int = 0
    non_final_chunks: int = 0
    decodes: int = 0
    paused: int = 0
    skipped: int = 0
    withheld: int = 0
    cache_full: int = 0
    resets: set[str] = field(default_factory=set)
    prefix_hits: int = 0
    off_page_starts: int = 0
    cancelled: dict[str, str] = field(default_factory=dict)  # request id -> phase
    queue_at_cancel: int = 0  # waiting requests when the last-waiting one was cancelled
    handed: list[list[tuple[str, int, int, bool]]] = field(default_factory=list)
    ran: list[list[tuple[str, int, int, bool]]] = field(default_factory=list)
    page_size: int = 0
    free_at_end: tuple[int, int] = (0, 0)
    ahead: int = 0  # decode rows planned while the token they feed was still in flight
    mode: Any = None
    limits: Any = None


_names = iter(range(10**6))


class _HostStream:
    """A device stream for the CPU: its work is done when the call returns, so there is nothing
    to order or wait for."""

    def record_event(self, event: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def allow_async_batching_on_the_cpu(monkeypatch: Any) -> list[Any]:
    """Let ``use_async_batching=True`` run on the CPU; returns the list of async IOs it builds."""
    built: list[Any] = []
    io_class = input_outputs.ContinuousBatchingAsyncIOs
    original_init = io_class.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(io_class, "_supported_device_types", ("cpu",))
    monkeypatch.setattr(io_class, "__init__", init)
    monkeypatch.setattr(input_outputs, "create_device_stream", lambda device: _HostStream())
    return built


def run(net: Any, monkeypatch: Any, requests: list[Request], options: sp.SchedulingOptions, *,
        page_size: int, max_batch_tokens: int, batch: int = 4, num_blocks: int = 256,
        prefix_sharing: bool = False, max_input_length: int | None = S_IN,
        late_at_step: int = 3, cancel_phases: tuple[str, ...] = (),
        max_waiting: int = tf_integration.DEFAULT_MAX_WAITING, overlap: bool = False) -> Run:
    record = Run()
    async_ios = allow_async_batching_on_the_cpu(monkeypatch) if overlap else []
    priorities = {r.rid: r.priority for r in requests}
    name = tf_integration.register(options, name=f"stepplanner-test-{next(_names)}",
                                   priority=priorities, max_input_length=max_input_length,
                                   max_waiting=max_waiting)
    base = SCHEDULER_MAPPING[name]
    late = [r for r in requests if r.late]
    holder: dict[str, Any] = {}

    class Observed(base):  # type: ignore[misc, valid-type]
        def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
            out = super().schedule_batch(token_budget, cache_budget)
            record.cache_full += out[0] is None
            return out

        def on_step(self, residents: Any, states: Any, plan: Any, handed: Any) -> None:
            try:
                observe(self, record, residents, states, plan, handed, holder, late,
                        late_at_step, cancel_phases)
            except Exception as exc:  # the loop thread must not die: report it to the test
                record.errors.append(f"step {record.steps}: {type(exc).__name__}: {exc}")

    SCHEDULER_MAPPING[name] = Observed

    def ran(io: Any, requests_in_batch: Any, *args: Any, **kwargs: Any) -> Any:
        record.ran.append([(f.state.request_id, f.state.position_offset, f.query_length,
                            bool(f.has_new_token)) for f in requests_in_batch])
        for f in requests_in_batch:
            if len(f.state.tokens_to_process) != f.query_length:
                record.errors.append(f"{f.state.request_id}: {len(f.state.tokens_to_process)} "
                                     f"tokens to process for a row of {f.query_length}")
        return original(io, requests_in_batch, *args, **kwargs)

    original = input_outputs.ContinuousBatchingIOs.prepare_batch_tensors
    monkeypatch.setattr(input_outputs.ContinuousBatchingIOs, "prepare_batch_tensors", ran)

    config = ContinuousBatchingConfig(
        scheduler_type=name, page_size=page_size, num_blocks=num_blocks,
        max_batch_tokens=max_batch_tokens, max_requests_per_batch=batch,
        allow_block_sharing=prefix_sharing, use_async_batching=overlap, use_cuda_graph=False,
        max_blocks_per_request=0)
    generation = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0,
                                  max_new_tokens=10)
    manager = net.init_continuous_batching(generation_config=generation,
                                           continuous_batching_config=config)
    holder["manager"] = manager
    for r in requests:
        if not r.late:
            manager.add_request(r.prompt, request_id=r.rid, max_new_tokens=r.max_new_tokens)
    manager.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            expected = {r.rid for r in requests} - set(record.cancelled)
            if expected <= set(record.results) or not manager.is_running():
                break
            result = manager.get_result(timeout=0.5)
            if result is not None and result.is_finished():
                record.results[result.request_id] = result
        while (result := manager.get_result(timeout=0.1)) is not None:  # a stopped loop's last
            record.results[result.request_id] = result
        processor = manager.batch_processor
        if processor is not None and not record.errors:
            # The loop is idle once every request is out; give a cancellation a step to land.
            time.sleep(0.3)
            record.free_at_end = free_pages(processor.scheduler)
    finally:
        manager.stop(block=True, timeout=30)
        SCHEDULER_MAPPING.pop(name, None)
    # The loop ran in the mode asked for, and in async mode rows really ran ahead of tokens.
    assert len(async_ios) == overlap
    if record.steps and not record.errors:
        assert (record.ahead > 0) == overlap, record.ahead
    return record


def observe(sched: Any, record: Run, residents: Any, states: Any, plan: Any, handed: Any,
            holder: dict[str, Any], late: list[Request], late_at_step: int,
            cancel_phases: tuple[str, ...]) -> None:
    record.steps += 1
    # The ledger's queue is the runtime's waiting queue: a request that left it (cancelled,
    # failed) has left the ledger's too, at once, not when its turn for admission came.
    if sched.ledger.waiting != len(sched.waiting_requests):
        record.errors.append(f"step {record.steps}: the ledger queues {sched.ledger.waiting} "
                             f"requests, the runtime {len(sched.waiting_requests)}")
    record.mode = sched.policy.mode
    record.limits = sched.limits
    page = sched.limits.kv_page_size
    record.page_size = page
    sp.check_plan(sched.policy, sched.limits, residents, plan)
    # The same rows through a second planner, asking why: the adapter's plan is the planner's.
    twin = holder.setdefault("twin", sp.StepPlanner(sched.policy, sched.limits))
    reasons = np.zeros(sched.limits.max_batch_size, dtype=np.uint8)
    twin_plan = twin.plan(residents.copy(), reasons=reasons)
    assert twin_plan.to_dict() == plan.to_dict(), "the adapter's plan differs from plan()"
    codes = [sp.split_reason(int(c))[0] for c in reasons[:len(residents)]]
    record.skipped += sum(c in (sp.Reason.SKIPPED_BUDGET, sp.Reason.SKIPPED_PAGE_TRIM)
                          for c in codes)
    record.paused += len(plan.paused)
    planned = []
    for row in plan.as_array().tolist():
        index, work, past, length, last = row
        state = states[index]
        assert past == state.position_offset, f"{state.request_id}: past {past} != KV length"
        seen = holder.setdefault("seen", set())
        if work == int(sp.SequenceWork.CONTEXT):
            record.chunks += 1
            if past and state.request_id not in seen:
                record.prefix_hits += 1  # its first chunk starts past pages it shares
            if past % page:
                record.off_page_starts += 1
            if not last:
                record.non_final_chunks += 1
                assert (past + length) % page == 0, (
                    f"{state.request_id}: non-final chunk {past}+{length} off a page of {page}")
        else:
            record.decodes += 1
            record.ahead += state.tokens_to_process == [TMP_TOKEN_ID]
        seen.add(state.request_id)
        planned.append((state.request_id, past, length, bool(last)))
    got = [(f.state.request_id, f.state.position_offset, f.query_length, bool(f.has_new_token))
           for f in handed]
    record.withheld += len(planned) - len(got)
    record.resets.update(s.request_id for s in states if s._true_initial_tokens)
    kept = [p for p in planned if p[0] in {g[0] for g in got}]
    assert got == kept, f"handed back {got}, plan rows {planned}"
    if got:
        record.handed.append(got)
    if record.steps == late_at_step:
        for r in late:
            holder["manager"].add_request(r.prompt, request_id=r.rid,
                                          max_new_tokens=r.max_new_tokens)
    if cancel_phases:
        cancel_one_per_phase(sched, record, states, plan, holder, cancel_phases)


def cancel_one_per_phase(sched: Any, record: Run, states: Any, plan: Any,
                         holder: dict[str, Any], phases: tuple[str, ...]) -> None:
    """Cancel the first request seen in each phase, through the manager's cancel_request."""
    paused = set(plan.paused)
    found: dict[str, str] = {}
    for index, state in enumerate(states):
        rid = state.request_id
        if index in paused:
            found.setdefault("paused", rid)
        elif state.status == RequestStatus.PREFILLING and state.remaining_prefill_tokens:
            found.setdefault("prefill", rid)
        elif (state.status == RequestStatus.DECODING
              and 1 <= len(state.generated_tokens) <= state.max_new_tokens - 2):
            found.setdefault("decoding", rid)  # and still decoding after this step's token
    for rid in sched.waiting_requests:
        found.setdefault("waiting", rid)
    if len(sched.waiting_requests) > 1:
        # The one the ledger would admit last (FCFS: the newest; PRIORITY: the newest of the
        # worst class), so that leaving the queue at its turn would take many steps.
        order = list(sched.waiting_requests)  # arrival order
        by_priority = sched.policy.scheduling_policy == PRIORITY  # (priority, arrival), lower first
        last = max(range(len(order)),
                   key=lambda k: (sched.priority_of.get(order[k], 0) if by_priority else 0, k))
        found["last-waiting"] = order[last]
    for phase in phases:
        rid = found.get(phase)
        if rid and phase not in record.cancelled.values() and rid not in record.cancelled:
            record.cancelled[rid] = phase
            if phase == "last-waiting":
                record.queue_at_cancel = len(sched.waiting_requests)
            holder["manager"].cancel_request(rid)


def free_pages(sched: Any) -> tuple[int, int]:
    """(free, total) pages of the runtime's cache once cached prefix pages are evicted."""
    cache = sched.cache
    for allocator in cache.cache_allocators.values():
        assert not allocator.block_table, f"pages still held: {list(allocator.block_table)}"
    cache.evict_cached_blocks()
    cache.pool.try_to_free_sectors()
    free = total = 0
    for allocator in cache.cache_allocators.values():
        per_sector = allocator.blocks_per_sector
        free += (cache.pool.num_free_sectors * per_sector
                 + cache.pool.count_free_blocks(allocator.index))
        total += cache.num_sectors * per_sector
    return free, total


def assert_matches_generate(net: Any, record: Run, requests: list[Request]) -> int:
    assert not record.errors, "\n".join(record.errors[:5])
    matched = 0
    for r in requests:
        if r.rid in record.cancelled:
            continue
        result = record.results.get(r.rid)
        assert result is not None, f"{r.rid} never finished"
        assert result.error is None, f"{r.rid}: {result.error}"
        assert result.generated_tokens == greedy(net, r.prompt, r.max_new_tokens), r.rid
        matched += 1
    assert record.ran == record.handed, "the runtime ran a batch other than the plan's rows"
    free, total = record.free_at_end
    assert total > 0 and free == total, f"{free} of {total} pages free at the end"
    return matched


# --- the configurations ----------------------------------------------------------------------

CONFIGS = [
    # id, options, page size, max_batch_tokens, prefix sharing, must pause
    ("fcfs-mixed-p4", sp.SchedulingOptions(ifb_scheduling_mode=MIXED, max_num_tokens=16,
                                           max_chunk_tokens=8), 4, 40, False, False),
    ("fcfs-prefill_first-p8", sp.SchedulingOptions(ifb_scheduling_mode=PREFILL_FIRST),
     8, 24, False, False),
    ("fcfs-auto-p16", sp.SchedulingOptions(), 16, 48, False, False),
    ("priority-pause0-p4", sp.SchedulingOptions(
        ifb_scheduling_mode=MIXED, scheduling_policy=PRIORITY, preemption=PAUSE,
        max_num_tokens=16, max_chunk_tokens=8, max_pause_steps=0), 4, 40, False, True),
    ("priority-pause1-p8", sp.SchedulingOptions(
        ifb_scheduling_mode=MIXED, scheduling_policy=PRIORITY, preemption=PAUSE,
        max_num_tokens=20, max_chunk_tokens=8, max_pause_steps=1), 8, 40, False, True),
    ("priority-pause3-p4-reserved", sp.SchedulingOptions(
        ifb_scheduling_mode=AUTO, scheduling_policy=PRIORITY, preemption=PAUSE,
        max_num_tokens=12, max_pause_steps=3, priority_reserved_slots=1), 4, 40, False, True),
    ("priority-prefill_first-p16", sp.SchedulingOptions(
        ifb_scheduling_mode=PREFILL_FIRST, scheduling_policy=PRIORITY), 16, 32, False, False),
    ("priority-auto-to-prefill_first-p16", sp.SchedulingOptions(scheduling_policy=PRIORITY),
     16, 16, False, False),
    ("fcfs-mixed-p8-prefix", sp.SchedulingOptions(ifb_scheduling_mode=MIXED, max_num_tokens=20,
                                                  max_chunk_tokens=8), 8, 40, True, False),
    ("priority-pause1-p4-prefix", sp.SchedulingOptions(
        ifb_scheduling_mode=MIXED, scheduling_policy=PRIORITY, preemption=PAUSE,
        max_num_tokens=12, max_chunk_tokens=4, max_pause_steps=1), 4, 24, True, True),
]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def overlap(request: Any) -> bool:
    """The runtime's loop without and with use_async_batching."""
    return bool(request.param)


@pytest.mark.parametrize("case", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_outputs_equal_generate_and_every_step_is_the_plan(model: Any, monkeypatch: Any,
                                                            case: Any, overlap: bool) -> None:
    case_id, options, page, step_tokens, prefix, must_pause = case
    assert step_tokens < 4 * S_IN  # the runtime's step buffer is below B x S_in
    requests = workload(seed=sum(map(ord, case_id)), shared_prefix=12 if prefix else 0)
    record = run(model, monkeypatch, requests, options, page_size=page,
                 max_batch_tokens=step_tokens, prefix_sharing=prefix, overlap=overlap)
    matched = assert_matches_generate(model, record, requests)
    assert matched == len(requests) >= 16
    assert record.non_final_chunks > 0, "no prompt took more than one chunk"
    assert record.decodes > 0
    if record.mode == MIXED and not must_pause and not overlap:
        # (under PAUSE only the best priority's prompts are active, often a single one; with
        # async batching the steps interleave differently, and in one configuration no prompt
        # happens to wait: the skip is this workload's coverage, not the mode's correctness)
        assert record.skipped > 0, "the budget never made a prompt wait"
    if must_pause:
        assert record.paused > 0, "no resident was ever paused"
    else:
        assert record.paused == 0
    if prefix:
        assert record.prefix_hits > 0, "no request started past a shared prefix"
    if case_id == "priority-auto-to-prefill_first-p16":
        assert record.mode == PREFILL_FIRST
    print(f"\n{case_id} {'async' if overlap else 'sync'}: {matched}/{len(requests)} equal "
          f"generate(); steps {record.steps}, "
          f"chunks {record.chunks} ({record.non_final_chunks} non-final), decodes "
          f"{record.decodes}, paused {record.paused}, skipped {record.skipped}, "
          f"prefix hits {record.prefix_hits}")


def test_cancellation_in_every_phase_frees_pages_and_slot(model: Any, monkeypatch: Any,
                                                          overlap: bool) -> None:
    options = sp.SchedulingOptions(ifb_scheduling_mode=MIXED, scheduling_policy=PRIORITY,
                                   preemption=PAUSE, max_num_tokens=12, max_chunk_tokens=4,
                                   max_pause_steps=2)
    requests = workload(seed=7, n=20)
    record = run(model, monkeypatch, requests, options, page_size=4, max_batch_tokens=24,
                 cancel_phases=("waiting", "prefill", "paused", "decoding"), overlap=overlap)
    assert sorted(record.cancelled.values()) == ["decoding", "paused", "prefill", "waiting"]
    for rid in record.cancelled:
        assert rid not in record.results, f"cancelled {rid} still produced an output"
    matched = assert_matches_generate(model, record, requests)
    assert matched == len(requests) - 4


@pytest.mark.parametrize("policy", [FCFS, PRIORITY], ids=["fcfs", "priority"])
def test_a_request_cancelled_while_waiting_leaves_the_ledger_queue_at_once(
        model: Any, monkeypatch: Any, policy: Any, overlap: bool) -> None:
    # 18 requests queued up front for 4 slots; at the first step the request the ledger would
    # admit last is cancelled. From the next step on the ledger's queue must not hold it: every
    # step checks that it queues exactly the runtime's waiting requests (observe).
    requests = workload(seed=13, n=18)
    for r in requests:
        r.late = False
    options = sp.SchedulingOptions(ifb_scheduling_mode=MIXED, scheduling_policy=policy,
                                   max_num_tokens=16, max_chunk_tokens=8)
    record = run(model, monkeypatch, requests, options, page_size=4, max_batch_tokens=40,
                 cancel_phases=("last-waiting",), overlap=overlap)
    assert list(record.cancelled.values()) == ["last-waiting"]
    assert record.queue_at_cancel >= 10  # far from its turn: leaving at it would take steps
    (rid,) = record.cancelled
    assert rid not in record.results, f"cancelled {rid} still produced an output"
    assert assert_matches_generate(model, record, requests) == len(requests) - 1
    print(f"\n{policy.name}: cancelled {rid} with {record.queue_at_cancel} waiting; "
          f"{len(requests) - 1} of {len(requests) - 1} others equal generate()")


def test_too_long_prompt_fails_alone(model: Any, monkeypatch: Any, overlap: bool) -> None:
    requests = workload(seed=11, n=16)
    rng = random.Random(3)
    long = Request("too-long", [rng.randrange(3, VOCAB) for _ in range(S_IN + 5)], 4, 0)
    requests.insert(5, long)
    options = sp.SchedulingOptions(ifb_scheduling_mode=MIXED, max_num_tokens=16,
                                   max_chunk_tokens=8)
    record = run(model, monkeypatch, requests, options, page_size=4, max_batch_tokens=40,
                 overlap=overlap)
    failed = record.results.pop("too-long")
    assert failed.status == RequestStatus.FAILED
    assert "too-long" in failed.error and f"{S_IN + 5} tokens" in failed.error
    assert f"S_in)={S_IN}" in failed.error
    requests.remove(long)
    assert assert_matches_generate(model, record, requests) == len(requests)


def test_waiting_requests_past_max_waiting_fail_alone(model: Any, monkeypatch: Any) -> None:
    # The runtime queues every request of generate_batch up front; past the ledger's bound a
    # request fails alone (the 429 of a server), naming the bound, and the rest complete.
    requests = workload(seed=5, n=12)
    for r in requests:
        r.late = False
    options = sp.SchedulingOptions(ifb_scheduling_mode=MIXED, max_num_tokens=16,
                                   max_chunk_tokens=8)
    record = run(model, monkeypatch, requests, options, page_size=4, max_batch_tokens=40,
                 max_waiting=8)
    refused = [rid for rid, res in record.results.items() if res.status == RequestStatus.FAILED]
    assert refused and all("max_waiting=8" in record.results[rid].error for rid in refused)
    served = [r for r in requests if r.rid not in refused]
    for rid in refused:
        record.results.pop(rid)
    assert len(served) >= 8
    assert assert_matches_generate(model, record, served) == len(served)
    assert tf_integration.StepPlannerScheduler.max_waiting == 65536  # default: not 16 x B


@pytest.mark.parametrize("mode", [MIXED, PREFILL_FIRST], ids=["mixed", "prefill_first"])
def test_cache_full_withholds_rows_and_the_runtime_offloads(model: Any, monkeypatch: Any,
                                                            mode: Any, overlap: bool) -> None:
    # 8 pages of 4 tokens for 4 residents of up to 20 tokens each: rows are withheld (the runtime
    # offloads some of them at once); a prefill-only step whose chunks all miss pages returns
    # "cache full". The runtime resets offloaded requests (their output folded into their prompt,
    # KV length 0), whose rows are then derived afresh. S_in is the default: what the cache holds.
    rng = random.Random(5)
    requests = [Request(f"full{i}", [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))],
                        rng.randint(1, 8), 0) for i in range(16)]
    budgets = {"max_num_tokens": 16, "max_chunk_tokens": 8} if mode == MIXED else {}
    options = sp.SchedulingOptions(ifb_scheduling_mode=mode, **budgets)
    record = run(model, monkeypatch, requests, options, page_size=4, max_batch_tokens=40,
                 num_blocks=8, max_input_length=None, prefix_sharing=True, overlap=overlap)
    assert assert_matches_generate(model, record, requests) == len(requests)
    assert record.withheld > 0, "no row was ever withheld"
    assert record.resets, "the runtime never reset an offloaded request"
    if mode == PREFILL_FIRST:
        assert record.cache_full > 0, "the runtime never heard 'cache full'"
    print(f"\ncache full: withheld {record.withheld} rows, {record.cache_full} cache-full "
          f"steps, {len(record.resets)} requests reset")


def test_page_size_above_the_step_capacity_is_refused_at_start(model: Any,
                                                               monkeypatch: Any) -> None:
    requests = [Request(f"early{i}", [5 + i] * (i + 1), 2, 0) for i in range(3)]
    record = run(model, monkeypatch, requests, sp.SchedulingOptions(), page_size=16,
                 max_batch_tokens=8)
    assert set(record.results) == {r.rid for r in requests}
    for result in record.results.values():
        assert result.status == RequestStatus.FAILED
        assert "page_size=16" in result.error and "max_batch_tokens=8" in result.error


def test_slots_follow_the_runtime_clamp_to_step_tokens(model: Any, monkeypatch: Any,
                                                       overlap: bool) -> None:
    # The runtime clamps max_requests_per_batch to max_batch_tokens (one decode token per slot),
    # which is SPEC §2's max_step_tokens >= B: B is what the runtime resolved.
    requests = workload(seed=4, n=16)
    record = run(model, monkeypatch, requests, sp.SchedulingOptions(), page_size=4,
                 max_batch_tokens=8, batch=16, overlap=overlap)
    assert record.limits.max_batch_size == 8 and record.limits.max_step_tokens == 8
    assert assert_matches_generate(model, record, requests) == len(requests)


def test_register_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="options must be a SchedulingOptions"):
        tf_integration.register({"scheduling_policy": "FCFS"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name=''"):
        tf_integration.register(sp.SchedulingOptions(), name="")
    with pytest.raises(TypeError, match="priority must be a mapping or a callable"):
        tf_integration.register(sp.SchedulingOptions(), priority=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_input_length=0"):
        tf_integration.register(sp.SchedulingOptions(), max_input_length=0)
    name = tf_integration.register(sp.SchedulingOptions(), name="stepplanner-register-test")
    try:
        assert issubclass(SCHEDULER_MAPPING[name], tf_integration.StepPlannerScheduler)
    finally:
        SCHEDULER_MAPPING.pop(name)


@pytest.mark.parametrize("version", ["5.17.2", "5.25.0", "6.0.0"])
def test_other_transformers_versions_are_refused(monkeypatch: Any, version: str) -> None:
    import transformers

    monkeypatch.setattr(transformers, "__version__", version)
    path = tf_integration.__file__
    spec = importlib.util.spec_from_file_location("stepplanner.integrations._version_probe", path)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match=r"supports transformers>=5\.18,<5\.25"):
        spec.loader.exec_module(probe)
