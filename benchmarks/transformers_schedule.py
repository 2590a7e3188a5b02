"""Per-step scheduling cost inside transformers' continuous batching: its ``fifo`` and
``prefill_first`` schedulers against stepplanner's, on the same request stream.

    python benchmarks/transformers_schedule.py [--rounds 300] [--batches 16 64 256]

Needs the ``transformers`` extra. For each B, three runtimes (the manager's real batch processor,
paged cache and request states, one per scheduler) are driven step by step with no forward: the
model is not the subject, and its output tokens do not matter (EOS is off). Each step the waiting
queue is topped up to B/2 requests from one seeded stream (prompts 32..512 tokens, outputs
16..128), so every scheduler sees the same requests; a warm-up fills the B slots first. Then the
three take turns, one step each, so a noisy machine slows them alike: each ``schedule_batch``
call is timed alone (wall clock and the thread's CPU time), and between calls the runtime builds
the batch's tensors and updates the requests as after a forward, untimed. Medians, ratios to
``fifo`` and stepplanner's share of time inside ``plan()`` come from this one run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.continuous_batching.requests import RequestState

import stepplanner as sp
from stepplanner.integrations.transformers import register

SCHEDULERS = ("fifo", "prefill_first", "stepplanner")
PAGE = 32
STEP_TOKENS = 2048
S_IN = 512


class TimedPlanner:
    """Forwards ``plan`` to the real planner and adds up the time spent in it."""

    def __init__(self, planner: Any) -> None:
        self.planner = planner
        self.ns = 0

    def plan(self, residents: Any, *args: Any) -> Any:
        start = time.perf_counter_ns()
        out = self.planner.plan(residents, *args)
        self.ns += time.perf_counter_ns() - start
        return out


def tiny_model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=None,
    )
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


class Engine:
    """One runtime (manager + batch processor) driven step by step without a forward."""

    def __init__(self, scheduler: str, batch: int) -> None:
        config = ContinuousBatchingConfig(
            scheduler_type=scheduler,
            page_size=PAGE,
            max_batch_tokens=STEP_TOKENS,
            max_requests_per_batch=batch,
            num_blocks=batch * 1024 // PAGE,
            allow_block_sharing=False,
            use_async_batching=False,
            use_cuda_graph=False,
            max_blocks_per_request=0,
        )
        generation = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0)
        self.manager = tiny_model().init_continuous_batching(
            generation_config=generation, continuous_batching_config=config
        )
        self.processor = self.manager._create_batch_processor()
        self.scheduler = self.processor.scheduler
        self.batch = batch
        self.stream = random.Random(20261130)
        self.next_id = 0
        self.pending: Any = None
        self.wall: list[int] = []
        self.cpu: list[int] = []
        self.admitting: list[bool] = []  # per timed step: did a waiting request get a slot
        self.timed_planner: TimedPlanner | None = None
        if hasattr(self.scheduler, "planner"):
            self.timed_planner = TimedPlanner(self.scheduler.planner)
            self.scheduler.planner = self.timed_planner

    def arrivals(self) -> None:
        while len(self.scheduler.waiting_requests) < self.batch // 2:
            rng = self.stream
            prompt = [rng.randrange(1, 64) for _ in range(rng.randint(32, S_IN))]
            self.scheduler.add_waiting_request(
                RequestState(
                    request_id=f"r{self.next_id}",
                    initial_tokens=prompt,
                    max_new_tokens=rng.randint(16, 128),
                    eos_token_id=-1,
                )
            )
            self.next_id += 1

    def schedule(self, timed: bool) -> None:
        waiting = len(self.scheduler.waiting_requests)
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        self.pending = self.scheduler.schedule_batch(
            self.processor.max_batch_tokens, self.processor.cache.max_tokens_read
        )
        if timed:
            self.admitting.append(len(self.scheduler.waiting_requests) < waiting)
            self.cpu.append(time.thread_time_ns() - cpu)
            self.wall.append(time.perf_counter_ns() - wall)

    def finish_step(self) -> None:
        """What the runtime does with a scheduled batch, minus the forward."""
        if self.pending is not None:
            batch, fast, q_tokens, kv_read = self.pending
            if batch is None:
                raise RuntimeError("the benchmark's cache filled up; give it more blocks")
            if batch:
                self.processor.inputs_and_outputs.prepare_batch_tensors(
                    requests_in_batch=batch,
                    logits_processors=self.processor.logit_processor,
                    use_decode_fast_path=fast,
                    num_q_tokens=q_tokens,
                    max_kv_read=kv_read,
                    use_padding=self.processor.model_runner.pad_inputs,
                )
                self.processor.update_batch()
            self.pending = None
        self.arrivals()


def measure(batch: int, rounds: int, warmup: int) -> dict[str, Engine]:
    # The step budget fifo uses (the whole max_batch_tokens), so the three do the same work.
    options = sp.SchedulingOptions(
        ifb_scheduling_mode=sp.IfbSchedulingMode.MIXED,
        max_num_tokens=STEP_TOKENS,
        max_chunk_tokens=S_IN,
    )
    name = register(options, name="stepplanner-bench", max_input_length=S_IN)
    engines = {s: Engine(name if s == "stepplanner" else s, batch) for s in SCHEDULERS}
    for step in range(warmup + rounds):
        timed = step >= warmup
        if step == warmup:
            engines["stepplanner"].timed_planner.ns = 0  # type: ignore[union-attr]
        order = SCHEDULERS[step % 3 :] + SCHEDULERS[: step % 3]  # nobody always goes first
        for s in order:
            engines[s].finish_step()
            engines[s].schedule(timed)
    for e in engines.values():
        e.finish_step()
        held = len(e.scheduler.active_requests)
        if held < batch // 2:
            raise RuntimeError(f"only {held} of {batch} slots held: not a steady state")
    return engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, transformers "
        f"{__import__('transformers').__version__}, stepplanner {sp.__version__} "
        f"({sp.IMPLEMENTATION}); page {PAGE}, max_batch_tokens {STEP_TOKENS}, "
        f"{args.rounds} timed steps per scheduler after {args.warmup}"
    )
    print(
        "| B | steps | fifo µs | prefill_first µs | stepplanner µs | stepplanner / fifo "
        "| share in plan() |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for batch in args.batches:
        engines = measure(batch, args.rounds, args.warmup)
        ours = engines["stepplanner"]
        share = ours.timed_planner.ns / sum(ours.wall)  # type: ignore[union-attr]
        for label, keep in (
            ("all, wall clock", None),
            ("all, thread CPU", None),
            ("with an admission", True),
            ("without", False),
        ):
            clock = "cpu" if label.endswith("CPU") else "wall"
            med = {
                s: statistics.median(
                    t for t, a in zip(getattr(e, clock), e.admitting) if keep is None or a == keep
                )
                / 1e3
                for s, e in engines.items()
            }
            plan_share = f"{share:.1%}" if label == "all, wall clock" else ""
            print(
                f"| {batch} | {label} | {med['fifo']:,.1f} | {med['prefill_first']:,.1f} | "
                f"{med['stepplanner']:,.1f} | {med['stepplanner'] / med['fifo']:.2f} | "
                f"{plan_share} |",
                flush=True,
            )
        for e in engines.values():
            e.manager.stop(block=False)


if __name__ == "__main__":
    main()
