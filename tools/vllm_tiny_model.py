"""A tiny Llama made offline for vLLM's real engine: config, seeded random weights, a tokenizer.

``make_tiny_llama(path, seed=0)`` writes a model directory vLLM loads with no hub access
(``HF_HUB_OFFLINE=1``): ``config.json``, ``model.safetensors`` (float32 weights drawn from a
seeded generator) and a byte-level BPE tokenizer (``tokenizer.json`` and its config) trained
with the ``tokenizers`` library on seeded generated text, so ``vllm serve`` and ``vllm bench
serve`` can encode and decode. The same seed writes the same bytes.

Why not ``--load-format dummy``: vLLM's dummy weights are near-constant, so greedy outputs hardly
depend on the prompt and prove little when two schedulers are compared token for token. These
weights are scaled so that the logits spread widely (greedy choices are far from ties, so a
different batch composition does not flip them) and outputs vary with the context.

Used by tests/integrations/test_vllm_engine.py and the real-engine benchmarks; from the command
line: ``python tools/vllm_tiny_model.py DIR [--seed N] [--hidden 128 --layers 2]``.
Needs numpy, safetensors and tokenizers (all vLLM dependencies).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: Llama's unk, bos, eos
VOCAB_SIZE = 1024
_SYLLABLES = [
    "ka",
    "ri",
    "to",
    "mo",
    "na",
    "se",
    "lu",
    "pa",
    "di",
    "ve",
    "zo",
    "chi",
    "bra",
    "ten",
    "gol",
    "wi",
    "fu",
    "sha",
    "ne",
    "qui",
    "dor",
    "lam",
    "pe",
    "sto",
    "vin",
    "ar",
    "el",
    "is",
    "om",
    "un",
    "ry",
    "tha",
    "gre",
    "ple",
    "ju",
    "ko",
]


def training_text(seed: int, lines: int = 3000) -> list[str]:
    """Seeded sentences of made-up words (syllables), digits and punctuation: text whose BPE
    merges give a vocabulary of ``VOCAB_SIZE`` tokens."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(_SYLLABLES, size=int(rng.integers(1, 4)))) for _ in range(600)]
    out = []
    for _ in range(lines):
        n = int(rng.integers(4, 16))
        picked = [str(w) for w in rng.choice(words, size=n)]
        if rng.random() < 0.3:
            picked.insert(int(rng.integers(0, n)), str(int(rng.integers(0, 1000))))
        out.append(" ".join(picked).capitalize() + str(rng.choice([".", "!", "?", ","])))
    return out


def json_text(seed: int, lines: int = 1500) -> list[str]:
    """Seeded compact JSON (objects, arrays, strings, ints, booleans, null) and short codes such
    as ``abc-12``: with these in its training text the tokenizer merges JSON punctuation, keys and
    values into tokens (``{"``, ``":``, ``"},``), so a grammar constrains tokens that span several
    of its symbols, as real tokenizers' do."""
    rng = np.random.default_rng(seed + 1)
    words = ["".join(rng.choice(_SYLLABLES, size=int(rng.integers(1, 3)))) for _ in range(200)]
    words += ["n", "c", "ok", "tags", "red", "green", "blue", "yes", "no", "maybe"]

    def value(depth: int) -> object:
        kind = int(rng.integers(0, 7 if depth < 2 else 5))
        if kind == 0:
            return int(rng.integers(-100, 1000))
        if kind == 1:
            return str(rng.choice(words))
        if kind == 2:
            return bool(rng.integers(0, 2))
        if kind == 3:
            return None
        if kind == 4:
            letters = "".join(rng.choice(list("abc"), size=3))
            return f"{letters}-{int(rng.integers(0, 100)):02d}"
        if kind == 5:
            return [value(depth + 1) for _ in range(int(rng.integers(0, 4)))]
        return obj(depth + 1)

    def obj(depth: int) -> dict[str, object]:
        keys = rng.choice(words, size=int(rng.integers(1, 4)), replace=False)
        return {str(k): value(depth) for k in keys}

    return [json.dumps(obj(0), separators=(",", ":")) for _ in range(lines)]


def train_tokenizer(path: Path, seed: int, *, json_corpus: bool = False) -> int:
    """A byte-level BPE tokenizer trained on ``training_text(seed)`` (and ``json_text(seed)``
    with ``json_corpus``), saved where ``transformers.AutoTokenizer`` (vLLM's loader) finds it;
    returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = training_text(seed) + (json_text(seed) if json_corpus else [])
    tok.train_from_iterator(text, trainer=trainer)
    tok.save(str(path / "tokenizer.json"))
    unk, bos, eos = SPECIAL_TOKENS
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": unk,
                "bos_token": bos,
                "eos_token": eos,
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": 4096,
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    (path / "special_tokens_map.json").write_text(
        json.dumps({"unk_token": unk, "bos_token": bos, "eos_token": eos})
    )
    return tok.get_vocab_size()


def llama_config(vocab_size: int, hidden: int, layers: int, heads: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "num_hidden_layers": layers,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL_TOKENS.index("<s>"),
        "eos_token_id": SPECIAL_TOKENS.index("</s>"),
        "torch_dtype": "float32",
    }


def gaussian(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """A float32 matrix of normal draws times ``scale`` (the model's and the adapters' weights)."""
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)


def save_weights(weights: dict[str, np.ndarray], path: Path) -> None:
    """``weights`` as a safetensors file torch loads (vLLM reads both models and adapters so)."""
    from safetensors.numpy import save_file

    save_file(weights, str(path), {"format": "pt"})


def random_weights(config: dict[str, object], seed: int) -> dict[str, np.ndarray]:
    """Llama's tensors, seeded. Projections are scaled by 1/sqrt(fan-in) so activations keep their
    size through the layers; the output head by 8/sqrt(hidden), so logits spread over several
    units (the top two greedy choices rarely closer than float32's noise)."""
    rng = np.random.default_rng(seed)
    h = int(config["hidden_size"])  # type: ignore[call-overload]
    m = int(config["intermediate_size"])  # type: ignore[call-overload]
    v = int(config["vocab_size"])  # type: ignore[call-overload]

    def mat(rows: int, cols: int, scale: float) -> np.ndarray:
        return gaussian(rng, rows, cols, scale)

    out = {"model.embed_tokens.weight": mat(v, h, 1.0)}
    for i in range(int(config["num_hidden_layers"])):  # type: ignore[call-overload]
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{name}.weight"] = mat(h, h, h**-0.5)
        out[p + "mlp.gate_proj.weight"] = mat(m, h, h**-0.5)
        out[p + "mlp.up_proj.weight"] = mat(m, h, h**-0.5)
        out[p + "mlp.down_proj.weight"] = mat(h, m, m**-0.5)
        out[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        out[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
    out["model.norm.weight"] = np.ones(h, dtype=np.float32)
    out["lm_head.weight"] = mat(v, h, 8.0 * h**-0.5)
    return out


def make_tiny_llama(
    path: str | os.PathLike[str],
    seed: int = 0,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    json_corpus: bool = False,
) -> Path:
    """Write the tiny Llama's directory at ``path`` (created; files overwritten) and return it.

    ``hidden``/``heads`` is the head size, which vLLM's CPU attention must support (32, 64, 80,
    96, 112, 128 or 256). A bigger ``hidden`` and more ``layers`` make the forward pass heavier
    (benchmarks); the defaults keep the tests fast. ``json_corpus``: the tokenizer is trained
    on JSON too (``json_text``), for structured outputs (tests/integrations/
    test_vllm_structured.py); the vocabulary size stays ``VOCAB_SIZE``."""
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = train_tokenizer(out, seed, json_corpus=json_corpus)
    config = llama_config(vocab_size, hidden, layers, heads)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    )
    save_weights(random_weights(config, seed), out / "model.safetensors")
    return out


def make_tiny_lora(
    path: str | os.PathLike[str], model: str | os.PathLike[str], seed: int, *, rank: int = 8
) -> Path:
    """Write a LoRA adapter for the tiny Llama at ``model`` (PEFT's layout, which vLLM loads:
    ``adapter_config.json`` and ``adapter_model.safetensors``) and return its directory.

    Rank ``rank`` on every layer's ``q_proj`` and ``v_proj``, seeded; B is drawn, not zero (as a
    freshly initialised adapter's is), and scaled so the adapter moves the greedy outputs: each
    adapter, like each prompt, gives tokens of its own."""
    config = json.loads((Path(model) / "config.json").read_text())
    h, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    rng = np.random.default_rng(seed)
    weights = {}
    for i in range(layers):
        for name in ("q_proj", "v_proj"):
            key = f"base_model.model.model.layers.{i}.self_attn.{name}"
            weights[f"{key}.lora_A.weight"] = gaussian(rng, rank, h, h**-0.5)
            weights[f"{key}.lora_B.weight"] = gaussian(rng, h, rank, rank**-0.5)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model),
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter, indent=1))
    save_weights(weights, out / "adapter_model.safetensors")
    return out


# An offline engine's settings every tool's engine shares: eager float32 on the CPU, KV blocks of
# 32 tokens (vLLM's CPU attention takes multiples of 32), chunked prefill, seeded.
ENGINE_BASE: dict[str, Any] = {
    "enforce_eager": True,
    "dtype": "float32",
    "block_size": 32,
    "enable_chunked_prefill": True,
    "seed": 0,
}


def in_process_engine(kv_cache_gib: str = "1") -> None:
    """Set the environment for an offline engine whose EngineCore runs in this process (so its
    scheduler can be read), offline; call it before importing vLLM."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", kv_cache_gib)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


@contextlib.contextmanager
def offline_engine(model: str | os.PathLike[str], **kwargs: Any) -> Iterator[Any]:
    """An offline ``vllm.LLM`` over ``model``, its engine shut down and collected on exit (so
    the next run's scheduler and KV cache start afresh)."""
    from vllm import LLM  # the caller's vLLM: this module also runs without one

    llm = LLM(model=str(model), **kwargs)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--json-corpus", action="store_true", help="train the tokenizer on JSON")
    args = parser.parse_args(argv)
    print(
        make_tiny_llama(
            args.path,
            args.seed,
            hidden=args.hidden,
            layers=args.layers,
            heads=args.heads,
            json_corpus=args.json_corpus,
        )
    )


if __name__ == "__main__":
    main()
