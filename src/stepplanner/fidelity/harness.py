"""Serve a trace through transformers' continuous batching and record what the runtime timed.

``serve_trace`` submits each request of a :class:`~stepplanner.sim.workloads.Workload` to a
running ``ContinuousBatchingManager`` at the trace's own arrival time (``add_request(...,
record_timestamps=True)``), waits for every result and keeps, per request, the runtime's own
clock: ``created_time`` (set by ``add_request``: the arrival) and one ``perf_counter`` stamp per
output token. Per step it records, from inside the runtime's generation loop, the batch it ran
(every row's past and query length, whether it decodes) and the wall time from the step's start
(scheduling and batch preparation) to the end of its update (tokens stamped, outputs delivered):
the per-step timings file ``stepplanner calibrate`` reads (``STEP_TIMING_COLUMNS``).

``profile_engine`` runs closed-loop scenarios that sweep the step shapes the simulator must
price (decode-only steps at several batch sizes and contexts, chunk-only steps at several chunk
lengths and pasts, and mixed steps), as Vidur profiles operators on a grid.

The model is a Llama built from a config with seeded random weights (nothing is downloaded), or
a local model directory. Every request runs to exactly its ``output_tokens`` (EOS is disabled per
request), so the real run and its simulation produce the same tokens.

The scheduler is whatever ``scheduler_type`` names in transformers' table: ``fifo``,
``prefill_first``, or a stepplanner scheduler put there by
``stepplanner.integrations.transformers.register`` (the CLI command ``serve-trace`` does that).
This module reaches into two private parts of the runtime: the batch processor's three step
methods (wrapped on the instance, for timing) and its batch-tensor preparation (to read the rows
it ran); it supports the transformers releases the integration supports.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import json
import os
import pathlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .._errors import StepPlannerTypeError, StepPlannerValueError
from ..planner._policy import StepPlannerLimits
from ..sim.latency_models import STEP_TIMING_COLUMNS, step_timing_row
from ..sim.workloads import Workload
from ..tuning.metrics import series_stats
from .model_checks import check_attn_implementation, check_model_dir, check_seed
from .results import RESULTS_FORMAT, objective_lists

try:
    import torch
    import transformers
    from transformers import ContinuousBatchingConfig, GenerationConfig
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"stepplanner.fidelity.harness needs torch and transformers ({exc}); "
        'pip install "stepplanner[transformers]" (on a CPU-only machine install '
        "torch==2.13.0 first)"
    ) from exc

__all__ = [
    "EXTRA_STEP_COLUMNS",
    "RESULTS_FORMAT",
    "EngineSpec",
    "ModelSpec",
    "ServedRun",
    "StepTimer",
    "profile_engine",
    "serve_trace",
    "write_timings",
]

# Beside the contract: where in the run the step started, how its time splits, and the queue.
EXTRA_STEP_COLUMNS = (
    "step",
    "start",
    "schedule_seconds",
    "forward_seconds",
    "update_seconds",
    "waiting",
    "active",
)
# Token ids of the random prompts start above the ids models reserve (pad, bos, eos).
_FIRST_TOKEN_ID = 3


def _positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StepPlannerTypeError(
            f"{owner}.{name} must be an int, got {type(value).__name__} {value!r}"
        )
    if value < 1:
        raise StepPlannerValueError(f"{owner}.{name}={value!r} is out of range; allowed: >= 1")


# ModelSpec's size fields: each a positive int (serve-trace takes one option per field).
MODEL_SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The served model: a Llama of these sizes with random weights drawn with ``seed``, or the
    model in the local directory ``path`` (then the sizes are the directory's)."""

    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    seed: int = 0
    attn_implementation: str = "sdpa"
    path: str | None = None

    def __post_init__(self) -> None:
        for name in MODEL_SIZES:
            _positive_int("ModelSpec", name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise StepPlannerValueError(
                f"ModelSpec.hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}; allowed: a multiple"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise StepPlannerValueError(
                f"ModelSpec.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; allowed: a multiple"
            )
        if self.vocab_size <= _FIRST_TOKEN_ID:
            raise StepPlannerValueError(
                f"ModelSpec.vocab_size={self.vocab_size} is out of "
                f"range; allowed: > {_FIRST_TOKEN_ID}"
            )
        check_seed("ModelSpec.seed", self.seed)
        check_attn_implementation("ModelSpec.attn_implementation", self.attn_implementation)
        if self.path is not None:
            check_model_dir("ModelSpec.path", self.path)

    def build(self) -> Any:
        """The model, in float32 and eval mode, with EOS off (requests run to their length)."""
        if self.path is not None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                self.path,
                local_files_only=True,
                torch_dtype=torch.float32,
                attn_implementation=self.attn_implementation,
            )
        else:
            from transformers import LlamaConfig, LlamaForCausalLM

            torch.manual_seed(self.seed)
            config = LlamaConfig(
                vocab_size=self.vocab_size,
                hidden_size=self.hidden_size,
                intermediate_size=self.intermediate_size,
                num_hidden_layers=self.num_hidden_layers,
                num_attention_heads=self.num_attention_heads,
                num_key_value_heads=self.num_key_value_heads,
                max_position_embeddings=8192,
                eos_token_id=None,
                bos_token_id=None,
                pad_token_id=None,
            )
            config._attn_implementation = self.attn_implementation
            model = LlamaForCausalLM(config).to(torch.float32)
        model = model.eval()
        model.generation_config.eos_token_id = None
        return model

    def describe(self) -> dict[str, Any]:
        if self.path is not None:
            return {"path": self.path, "attn_implementation": self.attn_implementation}
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "path"}


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """The runtime's limits: B = ``max_requests_per_batch``, P = ``page_size``,
    ``max_step_tokens`` = ``max_batch_tokens``, the KV pool in pages and S_in."""

    max_batch_size: int = 8
    kv_page_size: int = 16
    max_step_tokens: int = 256
    num_blocks: int = 512
    max_input_length: int = 512
    # The runtime's prefix cache (allow_block_sharing): off by default, so every prompt is
    # computed whole, as the simulator's fidelity runs assume.
    prefix_sharing: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name != "prefix_sharing":
                _positive_int("EngineSpec", field.name, getattr(self, field.name))
        if not isinstance(self.prefix_sharing, bool):
            raise StepPlannerTypeError(
                "EngineSpec.prefix_sharing must be a bool, got "
                f"{type(self.prefix_sharing).__name__}"
            )
        self.limits()  # the planner's own checks, named by its fields

    def limits(self) -> StepPlannerLimits:
        return StepPlannerLimits(
            self.max_batch_size,
            self.max_input_length,
            self.kv_page_size,
            max_step_tokens=self.max_step_tokens,
        )

    def config(self, scheduler_type: str) -> Any:
        # Synchronous batching, no graphs, and by default no prefix sharing: one step at a time,
        # each timed whole, and every prompt computed (a shared prefix would be work the
        # simulator's fidelity runs do not skip).
        return ContinuousBatchingConfig(
            scheduler_type=scheduler_type,
            page_size=self.kv_page_size,
            num_blocks=self.num_blocks,
            max_batch_tokens=self.max_step_tokens,
            max_requests_per_batch=self.max_batch_size,
            allow_block_sharing=self.prefix_sharing,
            use_async_batching=False,
            use_cuda_graph=False,
        )

    def check_workload(self, workload: Workload) -> None:
        """Refuse, naming the row, a request the engine could never serve whole."""
        longest = int(np.argmax(workload.prompt_tokens))
        if workload.prompt_tokens[longest] > self.max_input_length:
            raise StepPlannerValueError(
                f"trace row {longest}: prompt_tokens={int(workload.prompt_tokens[longest])} "
                f"exceeds max_input_length={self.max_input_length}; allowed: <= it (raise "
                "--max-input-length)"
            )
        total = workload.prompt_tokens + workload.output_tokens
        biggest = int(np.argmax(total))
        if total[biggest] > self.num_blocks * self.kv_page_size:
            raise StepPlannerValueError(
                f"trace row {biggest}: prompt + output = {int(total[biggest])} tokens exceeds "
                f"the KV cache of num_blocks x kv_page_size = "
                f"{self.num_blocks * self.kv_page_size}; allowed: <= it (raise --num-blocks)"
            )


def _manager(model: Any, engine: EngineSpec, scheduler_type: str) -> Any:
    generation = GenerationConfig(
        do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=1
    )
    return model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=engine.config(scheduler_type)
    )


# --- per-step timings ------------------------------------------------------------------------


class StepTimer:
    """Times every step of a manager's generation loop, from inside it.

    A step is the loop's ``prepare_next_batch`` (new requests drained, the scheduler's plan, the
    batch tensors), ``_generation_step`` (the forward pass and sampling) and ``update_batch``
    (token stamps, outputs delivered); its ``seconds`` run from the first's start to the last's
    end, so back-to-back steps tile the busy time (the loop's own gap between them is tens of
    microseconds). Must be attached before ``manager.start()``.
    """

    def __init__(self, manager: Any) -> None:
        self.rows: list[dict[str, Any]] = []
        self.origin = time.perf_counter()
        self._lock = threading.Lock()
        self._current: dict[str, Any] = {}
        create = manager._create_batch_processor

        def create_and_time() -> Any:
            processor = create()
            self._wrap(processor)
            return processor

        manager._create_batch_processor = create_and_time

    def _wrap(self, processor: Any) -> None:
        prepare, forward, update = (
            processor.prepare_next_batch,
            processor._generation_step,
            processor.update_batch,
        )
        io = processor.inputs_and_outputs
        prepare_tensors = io.prepare_batch_tensors
        current = self._current
        scheduler = processor.scheduler

        def read_batch(requests_in_batch: Any, *args: Any, **kwargs: Any) -> Any:
            # Before the runtime advances position_offset: the past of each row. A row decodes
            # when its request has output already (the chunk completing a prompt has none).
            current["batch"] = [
                (f.state.position_offset, f.query_length, len(f.state.generated_tokens) > 0)
                for f in requests_in_batch
            ]
            return prepare_tensors(requests_in_batch, *args, **kwargs)

        def timed_prepare() -> bool:
            start = time.perf_counter()
            ready = prepare()
            if ready:
                current["start"] = start
                current["prepared"] = time.perf_counter()
                current["waiting"] = len(scheduler.waiting_requests)
                current["active"] = len(scheduler.active_requests)
            return bool(ready)

        def timed_forward(model: Any) -> None:
            current["forward"] = time.perf_counter()
            forward(model)
            current["forwarded"] = time.perf_counter()

        def timed_update() -> None:
            update()
            self._record(time.perf_counter())

        io.prepare_batch_tensors = read_batch
        processor.prepare_next_batch = timed_prepare
        processor._generation_step = timed_forward
        processor.update_batch = timed_update

    def _record(self, end: float) -> None:
        c = self._current
        row = {
            **step_timing_row(end - c["start"], c["batch"]),
            "schedule_seconds": c["prepared"] - c["start"],
            "forward_seconds": c["forwarded"] - c["forward"],
            "update_seconds": end - c["forwarded"],
            "waiting": c["waiting"],
            "active": c["active"],
        }
        with self._lock:
            # A step that began before restart() (the warm-up's last one: its outputs let the
            # caller restart while this thread still finishes it) is not part of the run.
            if c["start"] >= self.origin:
                self.rows.append({**row, "step": len(self.rows), "start": c["start"] - self.origin})

    def restart(self, origin: float) -> None:
        """Forget the steps so far (a warm-up); ``start`` is counted from ``origin`` on."""
        with self._lock:
            self.origin = origin
            self.rows.clear()


def write_timings(rows: Sequence[dict[str, Any]], path: str | pathlib.Path) -> None:
    """The per-step timings CSV: the contract columns first, then ``EXTRA_STEP_COLUMNS``."""
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=[*STEP_TIMING_COLUMNS, *EXTRA_STEP_COLUMNS])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})


# --- serving a trace -------------------------------------------------------------------------


@dataclasses.dataclass
class ServedRun:
    """One real run: per request the runtime's ``GenerationOutput`` (trace row order), the
    clock's origin (t=0 is the first arrival) and the timed steps."""

    workload: Workload
    request_ids: list[str]
    outputs: list[Any]
    origin: float
    steps: list[dict[str, Any]]
    run: dict[str, Any]  # the "stepplanner" object of the results file

    def results(self) -> dict[str, Any]:
        """The results file's content: vLLM's ``--save-result --save-detailed`` layout plus
        ``request_ids``, ``arrival_times``, ``priorities``, ``e2els``, the requests' objectives
        (``ttft_slos``, ``tpot_slos``) and ``stepplanner``."""
        w = self.workload
        ttfts, itls, latencies, output_lens, errors, arrivals = [], [], [], [], [], []
        last = self.origin
        for out in self.outputs:
            stamps = list(out.timestamps or [])
            arrivals.append(out.created_time - self.origin)
            if out.error is None and stamps and len(stamps) == len(out.generated_tokens):
                ttfts.append(stamps[0] - out.created_time)
                itls.append([b - a for a, b in zip(stamps, stamps[1:])])
                latencies.append(stamps[-1] - out.created_time)
                output_lens.append(len(stamps))
                errors.append("")
                last = max(last, stamps[-1])
            else:  # as vLLM writes a failed request
                ttfts.append(0.0)
                itls.append([])
                latencies.append(0.0)
                output_lens.append(0)
                errors.append(
                    out.error
                    or f"{len(stamps)} token stamps for {len(out.generated_tokens)} tokens"
                )
        duration = max(last - self.origin, 1e-12)
        completed = sum(not e for e in errors)
        ok = [i for i, e in enumerate(errors) if not e]
        tpots = [(latencies[i] - ttfts[i]) / (output_lens[i] - 1) for i in ok if output_lens[i] > 1]
        span = float(w.arrival_time[-1] - w.arrival_time[0])
        data: dict[str, Any] = {
            "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
            "endpoint_type": "transformers-cb",
            "backend": "transformers-cb",
            "label": None,
            "model_id": self.run["model"].get("path", "random-llama"),
            "tokenizer_id": None,
            "num_prompts": len(w),
            "request_rate": len(w) / span if span > 0 else "inf",
            "burstiness": None,
            "max_concurrency": None,
            "duration": duration,
            "completed": completed,
            "failed": len(w) - completed,
            "total_input_tokens": int(w.prompt_tokens.sum()),
            "total_output_tokens": int(sum(output_lens)),
            "request_throughput": completed / duration,
            "output_throughput": sum(output_lens) / duration,
            "total_token_throughput": (int(w.prompt_tokens[ok].sum()) + sum(output_lens))
            / duration,
            "max_concurrent_requests": max((s["active"] for s in self.steps), default=0),
            "input_lens": [int(x) for x in w.prompt_tokens],
            "output_lens": output_lens,
            "ttfts": ttfts,
            "itls": itls,
            "latencies": latencies,
            "start_times": [out.created_time for out in self.outputs],
            "errors": errors,
            "generated_texts": [""] * len(w),
            "request_ids": self.request_ids,
            "arrival_times": arrivals,
            "priorities": [int(p) for p in w.priority],
            "e2els": latencies,
            **objective_lists(w),
        }
        for metric, values in (
            ("ttft", [ttfts[i] for i in ok]),
            ("tpot", tpots),
            ("itl", [g for i in ok for g in itls[i]]),
            ("e2el", [latencies[i] for i in ok]),
        ):
            data.update(
                series_stats(metric, np.asarray(values, dtype=np.float64), (50.0, 90.0, 99.0))
            )
        data["stepplanner"] = self.run
        return data

    def write_results(self, path: str | pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps(self.results()) + "\n", encoding="utf-8")

    def write_timings(self, path: str | pathlib.Path) -> None:
        write_timings(self.steps, path)


def prompts_for(workload: Workload, vocab_size: int, seed: int) -> list[list[int]]:
    """One prompt of random token ids per request, of the trace's length (seeded)."""
    rng = random.Random(seed)
    return [
        [rng.randrange(_FIRST_TOKEN_ID, vocab_size) for _ in range(int(n))]
        for n in workload.prompt_tokens
    ]


class _Collector:
    """Gathers every finished output of a manager on a thread of its own (one per manager: a
    second reader would take results the first waits for), so the submitting thread is never
    late for an arrival while a result is being read."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.outputs: dict[str, Any] = {}
        self.arrived = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="serve-trace-results", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped:
            out = self.manager.get_result(timeout=0.2)
            if out is None:
                if not self.manager.is_running():
                    break  # the loop died: wait() reports what is missing
                continue
            if out.is_finished():
                with self.arrived:
                    self.outputs[out.request_id] = out
                    self.arrived.notify_all()
        with self.arrived:
            self.stopped = True
            self.arrived.notify_all()

    def wait(self, ids: Sequence[str], timeout: float) -> list[Any]:
        """The outputs of ``ids``, in that order, once all have finished."""
        deadline = time.perf_counter() + timeout
        with self.arrived:
            while missing := [i for i in ids if i not in self.outputs]:
                left = deadline - time.perf_counter()
                if left <= 0 or self.stopped:
                    raise RuntimeError(
                        f"{len(missing)} request(s) never came back from the runtime within "
                        f"{timeout:g} s (first: {missing[:5]}); the generation loop stopped or "
                        "is far slower than the trace"
                    )
                self.arrived.wait(min(left, 0.5))
            return [self.outputs[i] for i in ids]

    def close(self) -> None:
        self.stopped = True
        self.thread.join(timeout=5)


def _run_description(
    workload: Workload,
    model: ModelSpec,
    engine: EngineSpec,
    scheduler_type: str,
    policy: dict[str, Any] | None,
    trace: str | None,
    timings: str | None,
    threads: int,
) -> dict[str, Any]:
    return {
        "format": RESULTS_FORMAT,
        "trace": trace,
        "source": workload.source,
        "scheduler": scheduler_type,
        "options": policy,
        "limits": dataclasses.asdict(engine.limits()),
        "num_blocks": engine.num_blocks,
        "model": model.describe(),
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "timings": timings,
        "loadavg_before": list(os.getloadavg()),
    }


def _warm_up(manager: Any, collector: _Collector, engine: EngineSpec, vocab: int) -> None:
    # The first forward passes allocate and pick kernels; those steps are not the engine's.
    ids = []
    for k, length in enumerate((16, engine.max_step_tokens, 1 + engine.max_step_tokens // 2)):
        rid = f"warmup_{k}"
        manager.add_request(
            [_FIRST_TOKEN_ID + k % (vocab - _FIRST_TOKEN_ID)]
            * min(length, engine.max_input_length),
            request_id=rid,
            max_new_tokens=4,
            eos_token_id=-1,
        )
        ids.append(rid)
    collector.wait(ids, 600)


def serve_trace(
    workload: Workload,
    model: ModelSpec,
    engine: EngineSpec,
    scheduler_type: str,
    *,
    policy: dict[str, Any] | None = None,
    request_ids: Sequence[str] | None = None,
    seed: int = 0,
    threads: int = 1,
    trace: str | None = None,
    timings: str | None = None,
    timeout: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
) -> ServedRun:
    """Serve ``workload`` at its own arrival times and return what the runtime timed.

    ``scheduler_type``: a name in transformers' scheduler table (register a stepplanner one first
    with ``stepplanner.integrations.transformers.register``, with the same ``request_ids`` the
    priorities are keyed by: default ``req_<row>``). ``policy``: the resolved stepplanner policy
    as ``policy_to_dict`` gives it (written to the results file; None for the runtime's own
    schedulers). ``threads``: torch's intra-op threads for the run (restored after).
    ``trace``/``timings``: the paths recorded in the results file. ``timeout``: seconds to wait
    for the last result after the last arrival (default: 600 + 10 x the trace's span).
    ``progress(submitted, total)`` is called after each submission. ``prompts``: each request's
    token ids (of its ``prompt_tokens``; shared prefixes for a prefix cache to find), instead of
    seeded random ones.
    """
    if not isinstance(workload, Workload):
        raise StepPlannerTypeError(f"workload must be a Workload, got {type(workload).__name__}")
    _positive_int("serve_trace", "threads", threads)
    engine.check_workload(workload)
    ids = (
        list(request_ids) if request_ids is not None else [f"req_{i}" for i in range(len(workload))]
    )
    if len(ids) != len(workload) or len(set(ids)) != len(ids):
        raise StepPlannerValueError(
            f"request_ids: {len(ids)} ids ({len(set(ids))} distinct) for "
            f"{len(workload)} requests; allowed: one distinct id each"
        )
    if prompts is not None:
        given = [len(p) for p in prompts]
        if given != workload.prompt_tokens.tolist():
            raise StepPlannerValueError(
                "prompts: their lengths differ from the workload's prompt_tokens; allowed: one "
                "prompt of its prompt_tokens ids per request"
            )
    with _running(model, engine, scheduler_type, threads) as live:
        if prompts is None:
            prompts = prompts_for(workload, live.vocab, seed)
        run = _run_description(
            workload, model, engine, scheduler_type, policy, trace, timings, threads
        )
        arrivals = workload.arrival_time - workload.arrival_time[0]
        origin = time.perf_counter()
        live.timer.restart(origin)
        outputs = [int(n) for n in workload.output_tokens]
        for i, at in enumerate(arrivals.tolist()):
            _sleep_until(origin + at)
            live.manager.add_request(
                list(prompts[i]),
                request_id=ids[i],
                max_new_tokens=outputs[i],
                record_timestamps=True,
                eos_token_id=-1,
            )
            if progress is not None:
                progress(i + 1, len(ids))
        span = float(arrivals[-1])
        back = live.collector.wait(ids, timeout if timeout is not None else 600 + 10 * span)
        live.clean = True
        run["loadavg_after"] = list(os.getloadavg())
        return ServedRun(workload, ids, back, origin, list(live.timer.rows), run)


@dataclasses.dataclass
class _Live:
    """A started runtime: its manager, the step timer and the result collector on it."""

    vocab: int
    manager: Any
    timer: StepTimer
    collector: _Collector
    clean: bool = False  # every request came back: the loop can flush and stop


@contextlib.contextmanager
def _running(
    model: ModelSpec, engine: EngineSpec, scheduler_type: str, threads: int
) -> Iterator[_Live]:
    """The model built and served by a started, warmed-up manager, with ``threads`` torch
    threads; on exit the manager stops (at once, if requests were left behind) and torch's
    thread count is restored."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        net = model.build()
        manager = _manager(net, engine, scheduler_type)
        timer = StepTimer(manager)
        manager.start()
        live = _Live(int(net.config.vocab_size), manager, timer, _Collector(manager))
        try:
            _warm_up(manager, live.collector, engine, live.vocab)
            yield live
        finally:
            live.collector.close()
            manager.stop(block=True, timeout=60, hard_stop=not live.clean)
    finally:
        torch.set_num_threads(previous_threads)


def _drained(manager: Any, timeout: float = 600) -> None:
    # A cancelled request delivers no output: wait until the runtime holds no request at all.
    deadline = time.perf_counter() + timeout
    while manager.batch_processor is not None and manager.batch_processor.has_pending_requests():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"profile: cancelled requests still held after {timeout:g} s")
        time.sleep(0.005)


def _sleep_until(deadline: float) -> None:
    # sleep() overshoots by up to a scheduler tick: sleep to 2 ms before, then yield until due.
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left - 0.002 if left > 0.003 else 0)


# --- profiling -------------------------------------------------------------------------------


def profile_engine(
    model: ModelSpec,
    engine: EngineSpec,
    scheduler_type: str,
    *,
    batches: Sequence[int] = (1, 2, 4, 8),
    contexts: Sequence[int] = (16, 64, 160, 320, 480),
    chunks: Sequence[int] = (16, 48, 96, 160, 240),
    decode_steps: int = 24,
    repeats: int = 1,
    seed: int = 0,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Closed-loop scenarios over the operating range; returns the timed steps.

    * decode-only: ``k`` requests (``batches``, capped at B) with prompts of each of
      ``contexts`` tokens (capped at S_in) decoding ``decode_steps`` tokens together;
    * chunk-only: one prompt of each of ``chunks`` tokens at past 0, and at past
      ``max_step_tokens`` (a prompt longer than one step: its second chunk);
    * mixed: ``k`` decoding requests (1, B/2, B-1) at a short and a long context, joined one at a
      time by a prompt of each chunk length.

    Use a stepplanner scheduler with a MIXED policy: the runtime's own schedulers do not
    interleave a chunk with decode rows the same way.
    """
    for name, value in (("decode_steps", decode_steps), ("repeats", repeats), ("threads", threads)):
        _positive_int("profile_engine", name, value)
    b, s_in, budget = engine.max_batch_size, engine.max_input_length, engine.max_step_tokens
    rng = random.Random(seed)
    with _running(model, engine, scheduler_type, threads) as live:
        manager, timer, collector = live.manager, live.timer, live.collector
        counter = iter(range(10**9))

        def submit(length: int, out: int) -> str:
            rid = f"profile_{next(counter)}"
            manager.add_request(
                [rng.randrange(_FIRST_TOKEN_ID, live.vocab) for _ in range(length)],
                request_id=rid,
                max_new_tokens=out,
                eos_token_id=-1,
            )
            return rid

        def served(specs: Sequence[tuple[int, int]]) -> None:
            collector.wait([submit(n, out) for n, out in specs], 600)

        def decoding(since: int) -> None:
            deadline = time.perf_counter() + 600
            while not (timer.rows[since:] and timer.rows[-1]["prefill_tokens"] == 0):
                if time.perf_counter() > deadline:
                    raise RuntimeError("profile: the decoding requests never decoded alone")
                time.sleep(0.001)

        timer.restart(time.perf_counter())
        pool = engine.num_blocks * engine.kv_page_size
        for _ in range(repeats):
            for k in sorted({min(k, b) for k in batches}):
                for length in sorted({min(n, s_in) for n in contexts}):
                    if k * (length + decode_steps) <= pool:
                        served([(length, decode_steps)] * k)
            for past in (0, budget):
                for q in chunks:
                    if 0 < past + q <= s_in:
                        served([(past + q, 1)])
            for k in sorted({1, max(1, b // 2), max(1, b - 1)}):
                for length in sorted({min(32, s_in), min(256, s_in)}):
                    since = len(timer.rows)
                    # long enough to outlast every chunk that joins them; cancelled after
                    residents = [submit(length, 10**6) for _ in range(k)]
                    decoding(since)
                    for q in chunks:
                        served([(max(1, min(q, budget - k, s_in)), 1)])
                    for rid in residents:
                        manager.cancel_request(rid)
                    _drained(manager)
        live.clean = True
        return list(timer.rows)
