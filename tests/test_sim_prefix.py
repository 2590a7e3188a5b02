"""The simulator's prefix cache and the peers' admission orders (sim.prefixes, sim.prefix_front,
sim.prefix_workload): hits as vLLM's lookup gives them, the hit's tokens never computed but
counted as context, and vLLM 0.34's cache-aware window and SGLang's HRRN as their code orders."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from stepplanner import AdmissionOrder, StepPlannerLimits
from stepplanner.sim.engine import Engine, RunSpec, ServingQueue
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.load import saturation_throughput
from stepplanner.sim.prefix_front import PrefixFront
from stepplanner.sim.prefix_workload import SYSTEM_PROMPTS, prefix_heavy, prefix_heavy_requests
from stepplanner.sim.prefixes import PrefixCache, SharedPrefixes, nominal_hits
from stepplanner.sim.simulator import simulate_run
from stepplanner.sim.workloads import Workload

LIMITS = StepPlannerLimits(max_batch_size=2, max_input_length=4096, kv_page_size=16)
FLAT = LatencyModel(a=0.01, b=1e-4, c=0.0)  # a step's time grows with its tokens only


def workload(prompts: list[int], outputs: int = 2, arrival: list[float] | None = None) -> Workload:
    n = len(prompts)
    return Workload(
        np.zeros(n) if arrival is None else np.array(arrival),
        np.array(prompts),
        np.full(n, outputs),
        np.zeros(n, dtype=np.int64),
    )


def prefixes(ids: list[int], tokens: list[int], preloaded: dict[int, int]) -> SharedPrefixes:
    return SharedPrefixes(np.array(ids), np.array(tokens), np.array(tokens), preloaded)


# --- the cache -------------------------------------------------------------------------------


def test_a_hit_is_whole_pages_of_the_prefix_and_never_the_last_token():
    cache = PrefixCache(16, {0: 100})
    assert cache.hit(0, 100, 500) == 96  # 100 cached: 6 whole pages
    assert cache.hit(0, 40, 500) == 32  # only the request's own prefix counts
    assert cache.hit(0, 100, 65) == 64  # never the last token: 64 of a 65-token prompt
    assert cache.hit(0, 100, 64) == 48  # 63 usable: 3 pages
    assert cache.hit(1, 100, 500) == 0  # nothing cached under id 1
    assert cache.hit(-1, 0, 500) == 0
    cache.store(1, 50)
    cache.store(1, 20)  # the longest length stays
    assert cache.hit(1, 100, 500) == 48


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prefix_id": [-2]}, "prefix_id=-2"),
        ({"prefix_tokens": [-1]}, "prefix_tokens=-1"),
        ({"prefix_id": [-1], "prefix_tokens": [5]}, "without a prefix"),
        ({"prefix_id": [0.5]}, "prefix_id must be 1 integers"),
        ({"prefix_id": 3}, "prefix_id must be a 1-D array of integers"),
        ({"preloaded": {0: -3}}, "preloaded[0]=-3"),
    ],
)
def test_bad_prefixes_are_refused_naming_the_field(kwargs, message):
    args = {"prefix_id": [0], "prefix_tokens": [0], "shares_tokens": [0], "preloaded": {}}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SharedPrefixes(**args)


def test_a_prefix_longer_than_its_prompt_and_a_pool_beside_it_are_refused():
    w = workload([100])
    with pytest.raises(ValueError, match="prefix_tokens=200 exceeds its prompt of 100"):
        RunSpec(w, Engine(LIMITS), prefixes=prefixes([0], [200], {}))
    with pytest.raises(ValueError, match="num_pages=64"):
        RunSpec(w, Engine(LIMITS, num_pages=64), prefixes=prefixes([0], [50], {}))
    with pytest.raises(ValueError, match="prefixes describe 2 requests"):
        RunSpec(w, Engine(LIMITS), prefixes=SharedPrefixes.none(2))


def test_nominal_hits_count_every_earlier_share():
    p = SharedPrefixes(np.array([0, 0, 1, 1]), np.array([64, 64, 0, 70]), np.array([64, 64, 70, 0]))
    assert nominal_hits(np.array([100, 100, 50, 200]), p, 16).tolist() == [0, 64, 0, 64]


# --- the serving front ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "queue, message",
    [
        ({"peer_order": "lpm"}, "peer_order='lpm' is not a peer's admission order"),
        (
            {
                "peer_order": "sglang-hrrn",
                "admission": AdmissionOrder.UNCACHED_FIRST,
                "starvation_steps": 4,
            },
            "admission=UNCACHED_FIRST",
        ),
        ({"peer_order": "sglang-hrrn", "max_waiting": 10}, "max_waiting=10"),
        ({"cache_window": 0}, "cache_window=0"),
    ],
)
def test_bad_peer_orders_are_refused_naming_the_field(queue, message):
    with pytest.raises(ValueError, match=message):
        ServingQueue(**queue)


def test_a_peer_order_needs_fcfs_and_no_pool():
    from stepplanner import SchedulingOptions, SchedulingPolicy

    peer = ServingQueue(peer_order="vllm-cache-window")
    with pytest.raises(ValueError, match="allowed: FCFS"):
        Engine(LIMITS, SchedulingOptions(scheduling_policy=SchedulingPolicy.PRIORITY), queue=peer)
    with pytest.raises(ValueError, match="num_pages=8: not simulated"):
        Engine(LIMITS, num_pages=8, queue=peer)


def front(order: str, prompts: list[int], hits: list[int], window: int = 64) -> PrefixFront:
    w = workload(prompts)
    f = PrefixFront(w, LIMITS, ServingQueue(peer_order=order, cache_window=window), None)
    f.waiting = list(range(len(prompts)))
    f.hit[:] = hits
    return f


def test_vllm_window_puts_the_deepest_cached_prefix_first_within_the_window_only():
    released: list[int] = []
    f = front("vllm-cache-window", [500] * 5, [0, 32, 0, 64, 96], window=4)
    f.release(1, lambda i, n: released.append(i))
    # Within the first 4: 64, 32, then the uncached in queue order; request 4 is beyond it.
    assert released == [3]
    assert f.waiting == [1, 0, 2, 4]
    f.release(4, lambda i, n: released.append(i))
    assert released == [3, 4, 1, 0, 2]  # the window moves on: 96 first


def test_sglang_hrrn_orders_by_prompt_tokens_computed_since_arrival_over_uncached_work():
    f = front("sglang-hrrn", [100, 10, 30], [0, 0, 0])
    f.computed_at_arrival[:] = [0, 1000, 0]  # request 1 arrived after 1,000 tokens were computed
    f.computed(1000)
    taken: list[tuple[int, int]] = []
    f.release(3, lambda i, n: taken.append((i, n)))
    # Ratios: 1000/100 = 10, 0/10 = 0, 1000/30 = 33: the aged short one, the aged long one,
    # then the fresh one however short.
    assert taken == [(2, 30), (0, 100), (1, 10)]


def test_hrrn_with_nothing_computed_keeps_arrival_order_and_a_hit_lowers_the_work_sent():
    f = front("sglang-hrrn", [100, 10], [64, 0])
    taken: list[tuple[int, int]] = []
    f.release(2, lambda i, n: taken.append((i, n)))
    assert taken == [(0, 36), (1, 10)]


# --- runs ------------------------------------------------------------------------------------


def test_a_hit_is_not_computed_but_is_context_of_every_step():
    w = workload([1000, 1000], outputs=3)
    shared = prefixes([0, -1], [960, 0], {0: 960})
    with_cache = simulate_run(RunSpec(w, Engine(LIMITS, latency=FLAT), prefixes=shared))
    without = simulate_run(RunSpec(w, Engine(LIMITS, latency=FLAT)))
    assert with_cache.cached_tokens.tolist() == [960, 0]
    assert with_cache.steps["tokens"].sum() == without.steps["tokens"].sum() - 960
    # The same context every step (the hit is context), fewer tokens computed.
    assert with_cache.steps["context"][-1] == without.steps["context"][-1]
    assert with_cache.first_token_time[0] < without.first_token_time[0]
    assert with_cache.late_hits == 0


def test_a_peer_order_admits_exactly_what_it_releases_in_its_order():
    # Two slots, four requests at t=0: vLLM's window admits the two deepest hits first.
    w = workload([500, 500, 500, 500], outputs=4)
    p = prefixes([-1, 0, -1, 1], [0, 320, 0, 480], {0: 320, 1: 480})
    window = Engine(LIMITS, latency=FLAT, queue=ServingQueue(peer_order="vllm-cache-window"))
    r = simulate_run(RunSpec(w, window, prefixes=p))
    first = np.argsort(r.admit_time, kind="stable")
    assert first[:2].tolist() == [1, 3] and r.admit_time[1] == r.admit_time[3] == 0.0
    assert r.admit_time[0] > 0 and r.admit_time[2] > 0
    fcfs = simulate_run(RunSpec(w, Engine(LIMITS, latency=FLAT), prefixes=p))
    assert fcfs.admit_time[0] == fcfs.admit_time[1] == 0.0 and fcfs.admit_time[3] > 0


def test_uncached_first_orders_by_the_prompt_less_its_hit():
    # The longest prompt has the smallest uncached part: uncached first admits it first.
    w = workload([2000, 600, 700], outputs=2)
    p = prefixes([0, -1, -1], [1920, 0, 0], {0: 1920})
    one = StepPlannerLimits(max_batch_size=1, max_input_length=4096, kv_page_size=16)
    queue = ServingQueue(admission=AdmissionOrder.UNCACHED_FIRST, starvation_steps=100)
    r = simulate_run(RunSpec(w, Engine(one, latency=FLAT, queue=queue), prefixes=p))
    assert np.argsort(r.admit_time).tolist() == [0, 1, 2]
    plain = simulate_run(RunSpec(w, Engine(one, latency=FLAT, queue=queue)))
    assert np.argsort(plain.admit_time).tolist() == [1, 2, 0]


def test_a_session_turn_finds_its_previous_turn_cached_once_that_turn_finished():
    # Turn 2 (prefix: turn 1's prompt and answer) arrives after turn 1 finished; a third
    # request on the same session arriving at once finds only what was there then.
    w = workload([200, 300, 300], outputs=40, arrival=[0.0, 30.0, 0.0])
    p = SharedPrefixes(np.array([5, 5, 5]), np.array([0, 240, 240]), np.array([240, 0, 0]))
    r = simulate_run(RunSpec(w, Engine(LIMITS, latency=FLAT), prefixes=p))
    order = np.argsort(w.arrival_time, kind="stable")  # the workload sorts by arrival
    hits = dict(zip(order.tolist(), r.cached_tokens.tolist()))
    assert sorted(hits.values()) == [0, 0, 240]


def test_prefix_heavy_is_deterministic_and_consistent():
    w, p = prefix_heavy(200, 5.0, seed=3)
    w2, p2 = prefix_heavy(200, 5.0, seed=3)
    assert np.array_equal(w.prompt_tokens, w2.prompt_tokens)
    assert np.array_equal(p.prefix_id, p2.prefix_id)
    assert (p.prefix_tokens <= w.prompt_tokens).all()
    assert dict(p.preloaded) == dict(enumerate(SYSTEM_PROMPTS))
    chat = p.prefix_id < len(SYSTEM_PROMPTS)
    chat &= p.prefix_id >= 0
    assert (p.prefix_tokens[chat] == np.array(SYSTEM_PROMPTS)[p.prefix_id[chat]]).all()
    # A session's turns: each one's prefix is the one before's prompt and answer.
    for sid in np.unique(p.prefix_id[p.prefix_id >= len(SYSTEM_PROMPTS)])[:20].tolist():
        turns = np.flatnonzero(p.prefix_id == sid)
        assert p.prefix_tokens[turns[0]] == 0
        for a, b in zip(turns[:-1], turns[1:]):
            assert p.prefix_tokens[b] == w.prompt_tokens[a] + w.output_tokens[a]
            assert p.shares_tokens[a] == p.prefix_tokens[b]


@pytest.mark.parametrize("order", [None, "sglang-hrrn"])
def test_a_prompt_past_s_in_is_refused_however_much_of_it_is_cached(order):
    w = workload([5000, 100])
    p = prefixes([0, -1], [4992, 0], {0: 4992})
    engine = Engine(LIMITS, latency=FLAT, queue=ServingQueue(peer_order=order))
    r = simulate_run(RunSpec(w, engine, prefixes=p))
    assert r.refused.tolist() == [True, False]
    assert np.isnan(r.first_token_time[0]) and not np.isnan(r.first_token_time[1])


def test_prefix_heavy_requests_draws_the_same_requests_at_any_rate():
    """At least the requests asked for (the fewest roots that make them), the same ones at
    every rate, the roots arriving at rate x roots / requests."""
    slow, p_slow = prefix_heavy_requests(200, 5.0, seed=3)
    fast, p_fast = prefix_heavy_requests(200, 50.0, seed=3)
    assert 200 <= len(slow) <= 205 and len(fast) == len(slow)
    assert sorted(slow.prompt_tokens.tolist()) == sorted(fast.prompt_tokens.tolist())
    assert int(p_slow.prefix_tokens.sum()) == int(p_fast.prefix_tokens.sum())
    roots = int(slow.source.rsplit("; ", 1)[1].split()[0])
    assert len(prefix_heavy(roots - 1, 1.0, seed=3)[0]) < 200 <= len(prefix_heavy(roots, seed=3)[0])


def test_shared_prefixes_pickle_for_process_workers():
    _, p = prefix_heavy(20, 5.0, seed=1)
    q = pickle.loads(pickle.dumps(p))
    assert np.array_equal(q.prefix_id, p.prefix_id) and dict(q.preloaded) == dict(p.preloaded)


def test_saturation_counts_each_prompt_less_its_nominal_hit():
    w, p = prefix_heavy(60, 5.0, seed=0)
    engine = Engine(StepPlannerLimits(max_batch_size=16, max_input_length=8192, kv_page_size=16))
    assert saturation_throughput(w, engine, prefixes=p) > saturation_throughput(w, engine)
