"""Config-only stand-ins for the models vLLM's tests/v1/core names, as an offline hub cache.

A scheduler reads a model's config (its context length, whether it is multimodal, hybrid or an
encoder-decoder), never its weights or tokenizer, so each model is a hand-written ``config.json``
with the architecture and the sizes the scheduler sees, laid out as ``huggingface_hub`` caches a
download (``models--ORG--NAME/snapshots/REV/config.json`` and ``refs/main``). With
``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` pointing there, ``ModelConfig(model="facebook/opt-125m")``
resolves without network. A test whose model needs more than its config (a processor, a
tokenizer) fails in the baseline run too, and is excluded there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REVISION = "0" * 40

_OPT = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "do_layer_norm_before": True,
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "max_position_embeddings": 2048,
    "vocab_size": 50272,
    "torch_dtype": "float16",
}

MODELS: dict[str, dict[str, Any]] = {
    "facebook/opt-125m": {
        **_OPT,
        "hidden_size": 768,
        "word_embed_proj_dim": 768,
        "ffn_dim": 3072,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
    },
    "facebook/opt-350m": {
        **_OPT,
        "hidden_size": 1024,
        "word_embed_proj_dim": 512,
        "ffn_dim": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "do_layer_norm_before": False,
    },
    "llava-hf/llava-1.5-7b-hf": {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": 32000,
        "pad_token_id": 32001,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "torch_dtype": "float16",
        "text_config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "vocab_size": 32064,
            "torch_dtype": "float16",
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 1024,
            "image_size": 336,
            "intermediate_size": 4096,
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "projection_dim": 768,
        },
    },
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_attention_heads": 16,
        "num_hidden_layers": 36,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vocab_size": 151936,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vision_config": {
            "depth": 32,
            "hidden_act": "silu",
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "in_chans": 3,
            "out_hidden_size": 2048,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2,
            "temporal_patch_size": 2,
        },
    },
    "Qwen/Qwen3-Next-80B-A3B-Instruct": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "max_position_embeddings": 262144,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000,
        "rms_norm_eps": 1e-6,
        "vocab_size": 151936,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 28,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "vocab_size": 151936,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen1.5-7B": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "vocab_size": 151936,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    },
}


_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# What a multimodal model's processor needs besides its config: its image processor's
# configuration and the placeholder tokens its prompts use (vLLM sizes its encoder budget from
# them at start-up).
EXTRAS: dict[str, dict[str, Any]] = {
    "llava-hf/llava-1.5-7b-hf": {
        "tokens": {"<image>": 32000, "<pad>": 32001},
        "files": {
            "preprocessor_config.json": {
                "image_processor_type": "CLIPImageProcessor",
                "processor_class": "LlavaProcessor",
                "crop_size": {"height": 336, "width": 336},
                "size": {"shortest_edge": 336},
                "do_center_crop": True,
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": _CLIP_MEAN,
                "image_std": _CLIP_STD,
                "resample": 3,
                "rescale_factor": 1 / 255,
            },
            "processor_config.json": {
                "processor_class": "LlavaProcessor",
                "image_token": "<image>",
                "patch_size": 14,
                "vision_feature_select_strategy": "default",
                "num_additional_image_tokens": 1,
            },
        },
    },
    "Qwen/Qwen2.5-VL-3B-Instruct": {
        "tokens": {
            "<|endoftext|>": 151643,
            "<|im_end|>": 151645,
            "<|vision_start|>": 151652,
            "<|vision_end|>": 151653,
            "<|image_pad|>": 151655,
            "<|video_pad|>": 151656,
        },
        "files": {
            "preprocessor_config.json": {
                "image_processor_type": "Qwen2VLImageProcessor",
                "processor_class": "Qwen2_5_VLProcessor",
                "min_pixels": 3136,
                "max_pixels": 50176,  # 224 x 224: the budget check processes a dummy image this big
                "patch_size": 14,
                "temporal_patch_size": 2,
                "merge_size": 2,
                "image_mean": _CLIP_MEAN,
                "image_std": _CLIP_STD,
            },
        },
    },
}

# A word-level tokenizer of three special tokens (and a multimodal model's placeholders), for
# the tests that initialise one (``skip_tokenizer_init=False``): loading it is all they ask.
_SPECIAL = {"<unk>": 0, "<s>": 1, "</s>": 2}


def tokenizer(tokens: dict[str, int]) -> dict[str, Any]:
    """A ``tokenizers`` serialization of a word-level tokenizer of ``tokens``, all special."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for token, i in tokens.items()
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": dict(tokens), "unk_token": "<unk>"},
    }


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
}


def write_hub_cache(cache: Path) -> None:
    """Write every stand-in into ``cache``, laid out as a ``HF_HUB_CACHE`` directory."""
    for repo_id, config in MODELS.items():
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config, indent=1))
        extras = EXTRAS.get(repo_id, {})
        tokens = {**_SPECIAL, **extras.get("tokens", {})}
        (snapshot / "tokenizer.json").write_text(json.dumps(tokenizer(tokens)))
        (snapshot / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
        for name, content in extras.get("files", {}).items():
            (snapshot / name).write_text(json.dumps(content, indent=1))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
