"""Drive a vLLM v1 scheduler on the CPU with fake model outputs, no GPU and no model weights.

What vLLM's own scheduler tests do, as a library: a model directory holding only a tiny Llama
``config.json`` (no tokenizer, no weights; ``HF_HUB_OFFLINE=1`` is enough), a ``KVCacheConfig``
with a fixed block count, and a fake ``ModelRunnerOutput`` per step that samples one token for
every request whose prompt is complete. ``run`` steps a scheduler the way vLLM's ``EngineCore``
does: with async scheduling, through its batch queue (step N+1 is scheduled before step N's
output is processed). With speculative decoding (``num_speculative_tokens``) a ``Drafting``
proposes each request's drafts and accepts a seeded share of those a step verifies. The tests
and benchmarks of ``stepplanner.integrations.vllm`` use it; so can a runtime author checking a
configuration.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch  # noqa: E402  (vLLM's dependency)
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from .vllm import _compat  # the version check runs on import

SAMPLED_TOKEN = 7
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


# A hybrid model for the scheduler (its config is all a scheduler reads): one Mamba layer, then one
# attention layer (vLLM's JambaForCausalLM, no experts). vLLM's CPU build cannot run its Mamba-1
# layers; tools/vllm_hybrid_engine.py runs a gated-delta-net hybrid in the real engine instead.
TINY_JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 1,
    "num_experts_per_tok": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 8,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def write_model_dir(path: str | os.PathLike[str], *, hybrid: bool = False) -> Path:
    """A model directory holding only a hand-written tiny Llama ``config.json`` (with
    ``hybrid``, a tiny Jamba: Mamba and attention layers)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(TINY_JAMBA if hybrid else TINY_LLAMA))
    return out


def make_scheduler(
    scheduler_cls: type[Scheduler],
    model_dir: str | os.PathLike[str],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_blocks: int,
    block_size: int = 16,
    max_model_len: int = 1024,
    enable_prefix_caching: bool = False,
    policy: str = "fcfs",
    stepplanner: dict[str, Any] | None = None,
    log_stats: bool = False,
    async_scheduling: bool = False,
    pipeline_parallel_size: int = 1,
    max_loras: int = 0,
    num_speculative_tokens: int = 0,
    kv_transfer: dict[str, Any] | None = None,
    **scheduler_kwargs: Any,
) -> Scheduler:
    """A scheduler over a CPU ``VllmConfig`` and a KV cache of exactly ``num_blocks`` blocks.

    ``async_scheduling`` is set on the finished config, as a GPU engine runs it: vLLM's CPU
    platform turns it off while the config is built (it has no device work to overlap).
    ``pipeline_parallel_size`` > 1 makes the config's ``max_concurrent_batches`` that deep, so
    ``run`` keeps that many steps in flight, as ``EngineCore``'s batch queue does under pipeline
    parallelism. ``max_loras`` > 0 enables LoRA (``--enable-lora --max-loras N``): a step may
    hold requests of at most that many distinct adapters. ``num_speculative_tokens`` > 0 turns on
    n-gram speculative decoding with that many drafts per step (``run`` then proposes and
    accepts them through a ``Drafting``). ``kv_transfer``: a ``KVTransferConfig``'s fields (a KV
    connector: its scheduler side runs here, ``run(..., kv_worker=)`` stands in for its workers)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32"
    )
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        policy=policy,
        async_scheduling=False,
        **scheduler_kwargs,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    additional = {} if stepplanner is None else {"stepplanner": stepplanner}
    with _compat.config_on_cpu():
        config = VllmConfig(
            model_config=model,
            scheduler_config=sched,
            cache_config=cache,
            device_config=DeviceConfig(device="cpu"),
            parallel_config=ParallelConfig(pipeline_parallel_size=pipeline_parallel_size),
            lora_config=LoRAConfig(max_loras=max_loras) if max_loras else None,
            speculative_config=(
                SpeculativeConfig(method="ngram", num_speculative_tokens=num_speculative_tokens)
                if num_speculative_tokens
                else None
            ),
            additional_config=additional,
            kv_transfer_config=None if kv_transfer is None else KVTransferConfig(**kv_transfer),
        )
    cache.num_gpu_blocks = num_blocks
    sched.async_scheduling = async_scheduling
    return scheduler_cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config(
            num_blocks,
            block_size,
            mamba=config.cache_config.mamba_cache_mode if model.is_hybrid else None,
        ),
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        log_stats=log_stats,
    )


def kv_cache_config(num_blocks: int, block_size: int, mamba: str | None = None) -> KVCacheConfig:
    """One full-attention group of exactly ``num_blocks`` blocks (no tensors: nothing runs); with
    ``mamba`` (a hybrid model's ``mamba_cache_mode``) a Mamba state group beside it, as vLLM
    lays out a hybrid model's KV cache."""
    groups = [
        KVCacheGroupSpec(
            ["layer"],
            FullAttentionSpec(
                block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
            ),
        )
    ]
    if mamba is not None:
        state = MambaSpec(
            block_size=block_size, shapes=((2, 4),), dtypes=(torch.float32,), mamba_cache_mode=mamba
        )
        groups.append(KVCacheGroupSpec(["mamba"], state))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


_hasher: dict[int, Callable[[Request], Any]] = {}


def make_request(
    request_id: str,
    prompt: list[int],
    max_tokens: int,
    *,
    priority: int = 0,
    arrival_time: float,
    block_size: int = 16,
    lora: int = 0,
) -> Request:
    """A request that samples exactly ``max_tokens`` tokens (EOS ignored); ``lora`` > 0 names
    the LoRA adapter it runs with (its ``lora_int_id``; nothing is loaded)."""
    if not _hasher:
        init_none_hash(sha256)
    hasher = _hasher.get(block_size)
    if hasher is None:
        hasher = _hasher[block_size] = get_request_block_hasher(block_size, sha256)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        priority=priority,
        arrival_time=arrival_time,
        block_hasher=hasher,
        lora_request=LoRARequest(f"lora{lora}", lora, "/nonexistent") if lora else None,
    )


class Drafting:
    """The fake model runner's speculative decoding, deterministic per request.

    Without async scheduling, after each step every request it ran proposes 0..K drafts (as
    ``EngineCore.post_step`` hands the drafter's output to ``update_draft_token_ids``); with it,
    vLLM's scheduler holds K placeholders per request and the drafts stay on the device. A row
    that verifies g drafts accepts each with probability ``acceptance``, in order, up to the first
    rejection. Every draw is seeded by (seed, request, its count of such draws), so a request sees
    the same proposals and acceptances under any scheduler, whatever order its rows take.
    """

    def __init__(self, acceptance: float = 0.6, seed: int = 0) -> None:
        self.acceptance = acceptance
        self.seed = seed
        self._draws: dict[tuple[str, str], int] = {}
        self.verified = 0  # drafts verified and accepted so far (the acceptance seen)
        self.accepted = 0

    def _rng(self, kind: str, rid: str) -> random.Random:
        j = self._draws.get((kind, rid), 0)
        self._draws[kind, rid] = j + 1
        return random.Random(f"{self.seed}/{kind}/{rid}/{j}")

    def propose(self, rid: str, k: int) -> int:
        return self._rng("propose", rid).randint(0, k)

    def accept(self, rid: str, verified: int) -> int:
        rng = self._rng("accept", rid)
        a = 0
        while a < verified and rng.random() < self.acceptance:
            a += 1
        self.verified += verified
        self.accepted += a
        return a


def fake_output(
    scheduler: Scheduler, output: SchedulerOutput, drafting: Drafting | None = None
) -> ModelRunnerOutput:
    """One sampled token for each scheduled request whose row is not a non-final prompt chunk,
    and with ``drafting`` one more per draft it accepts of those its row verifies.

    Call it right after ``schedule()`` (that is when the model runner sees the step): under async
    scheduling the next ``schedule()`` moves the requests on before this output is processed."""
    ids = list(output.num_scheduled_tokens)
    requests = scheduler.requests
    spec = output.scheduled_spec_decode_tokens
    sampled = []
    for rid in ids:
        request = requests.get(rid)
        samples = request is not None and not request.is_prefill_chunk
        verified = len(spec.get(rid, ()))
        accepted = drafting.accept(rid, verified) if drafting is not None and verified else 0
        sampled.append([SAMPLED_TOKEN] * (1 + accepted) if samples else [])
    return _compat.model_runner_output(ids, sampled)


class EngineStep(NamedTuple):
    """One engine step: whether requests were waiting when it began, and the wall time of its
    ``schedule()`` and ``update_from_output()`` (0 for one it did not call)."""

    step: int
    saturated: bool
    schedule_ns: int
    update_ns: int


def engine_steps(
    scheduler: Scheduler,
    arrivals: dict[int, Iterable[Request]],
    *,
    max_steps: int = 100_000,
    after_schedule: Callable[[int, SchedulerOutput], None] | None = None,
    before_step: Callable[[int], None] | None = None,
    before_update: Callable[[int, SchedulerOutput], None] | None = None,
    drafting: Drafting | None = None,
    kv_worker: Callable[[SchedulerOutput], KVConnectorOutput | None] | None = None,
) -> Iterator[EngineStep]:
    """Step until every request has finished, yielding after each engine step.

    One engine step is ``EngineCore.step_with_batch_queue`` with a queue as deep as the config's
    ``max_concurrent_batches`` (2 with async scheduling, 1 without, which is ``EngineCore.step``):
    schedule a step when the scheduler has requests and run it at once (``fake_output``); while
    the queue has room and that step did work, return; else process the oldest step's output.
    ``arrivals[step]`` are added before that step's ``schedule()``; ``before_step(step)`` runs
    next; ``after_schedule(step, output)`` right after a ``schedule()``;
    ``before_update(step, output)`` just before ``update_from_output`` of ``output`` (where the
    engine processes aborts that came in while it ran). With speculative decoding on, ``drafting``
    (default ``Drafting()``) proposes and accepts the drafts. ``kv_worker(output)``: the KV
    connector's workers, what the step reports of them (loads and sends finished or failed).
    """
    depth = scheduler.vllm_config.max_concurrent_batches
    k = scheduler.num_spec_tokens
    if k and drafting is None:
        drafting = Drafting()
    proposes = k > 0 and not scheduler.scheduler_config.async_scheduling
    queue: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    clock = time.perf_counter_ns
    step = 0
    last_arrival = max(arrivals, default=-1)
    while step <= last_arrival or scheduler.has_requests() or queue:
        if step >= max_steps:
            raise RuntimeError(
                f"not finished after {max_steps} steps: "
                f"{scheduler.get_request_counts()} running/waiting"
            )
        for request in arrivals.get(step, ()):
            scheduler.add_request(request)
        if before_step is not None:
            before_step(step)
        saturated = bool(scheduler.waiting)
        in_schedule = in_update = 0
        wait = True
        if scheduler.has_requests():
            t0 = clock()
            output = scheduler.schedule()
            in_schedule = clock() - t0
            if after_schedule is not None:
                after_schedule(step, output)
            model_output = fake_output(scheduler, output, drafting)
            if kv_worker is not None:
                model_output.kv_connector_output = kv_worker(output)
            queue.appendleft((output, model_output))
            wait = len(queue) == depth or not (
                output.total_num_scheduled_tokens > 0 or scheduler.has_requests()
            )
        if wait and queue:
            output, model_output = queue.pop()
            if before_update is not None:
                before_update(step, output)
            t0 = clock()
            scheduler.update_from_output(output, model_output)
            in_update = clock() - t0
            if proposes and drafting is not None and output.total_num_scheduled_tokens:
                ids = list(output.num_scheduled_tokens)
                drafts = [[SAMPLED_TOKEN] * drafting.propose(rid, k) for rid in ids]
                scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))
        yield EngineStep(step, saturated, in_schedule, in_update)
        step += 1


def run(scheduler: Scheduler, arrivals: dict[int, Iterable[Request]], **kwargs: Any) -> int:
    """``engine_steps`` to the end (same arguments); returns the number of engine steps."""
    steps = 0
    for _ in engine_steps(scheduler, arrivals, **kwargs):
        steps += 1
    return steps
