"""stepplanner scheduling Hugging Face transformers' continuous batching, on the CPU in seconds.

A tiny Llama with random weights (nothing is downloaded) serves twelve prompts through
``generate_batch`` with stepplanner's PRIORITY + PAUSE policy as the runtime's scheduler; every
output is then checked against ``model.generate()`` (greedy), token for token.
Needs the ``transformers`` extra: pip install torch==2.13.0 "stepplanner[transformers]".
Run: python examples/transformers_continuous_batching.py
"""

from __future__ import annotations

import random

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

import stepplanner as sp
from stepplanner.integrations.transformers import register


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # a random model would stop at its first EOS
    return model


def main() -> None:
    torch.set_num_threads(1)  # a model this small gains nothing from more threads
    model = tiny_llama()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 128) for _ in range(rng.randint(4, 48))] for _ in range(12)]

    # Requests req_0..req_11 in that order; every third one is urgent (priority -1).
    priority = {f"req_{i}": -1 if i % 3 == 2 else 1 for i in range(len(prompts))}
    options = sp.SchedulingOptions(
        scheduling_policy=sp.SchedulingPolicy.PRIORITY,
        preemption=sp.PreemptionMode.PAUSE,
        max_pause_steps=4,
        max_num_tokens=24,
        max_chunk_tokens=16,
    )
    name = register(options, priority=priority)
    config = ContinuousBatchingConfig(
        scheduler_type=name,
        page_size=8,
        num_blocks=64,
        max_batch_tokens=64,
        max_requests_per_batch=4,
    )
    generation = GenerationConfig(
        do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0
    )
    outputs = model.generate_batch(
        prompts, generation_config=generation, continuous_batching_config=config, warmup=False
    )

    matched = 0
    for i, prompt in enumerate(prompts):
        out = outputs[f"req_{i}"]
        ids = torch.tensor([prompt])
        want = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=8,
            eos_token_id=None,
            pad_token_id=0,
        )
        matched += out.generated_tokens == want[0, len(prompt) :].tolist()
    print(
        f"{len(outputs)} requests served by scheduler {name!r}; {matched} equal "
        f"model.generate() token for token"
    )
    if matched != len(prompts):
        raise SystemExit("outputs differ from generate()")


if __name__ == "__main__":
    main()
