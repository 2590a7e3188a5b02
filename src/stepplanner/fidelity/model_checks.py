"""The checks of what ``harness.ModelSpec`` hands torch and transformers, importable without
them: ``serve-trace`` runs these before it imports the harness, so a bad ``--model-seed``,
``--attn-implementation`` or ``--model`` is a one-line error (exit status 2) at once, torch
installed or not, and never a traceback from deep inside a model's construction.
"""

from __future__ import annotations

import pathlib
from typing import Any

from .._errors import StepPlannerTypeError, StepPlannerValueError

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "SEED_RANGE",
    "attention_implementations",
    "check_attn_implementation",
    "check_model_dir",
    "check_seed",
]

# torch.manual_seed's range: a negative seed is taken modulo 2**64, anything else is an error.
SEED_RANGE = (-(2**63), 2**64 - 1)
# The names transformers 5.18-5.24 (the releases the integration supports) accept, for when
# transformers cannot be imported: its AttentionInterface's names, and "eager", which every model
# implements itself. With transformers importable its own table is read instead.
ATTENTION_IMPLEMENTATIONS = (
    "eager",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
    "flex_attention",
    "sdpa",
    "paged|eager",
    "paged|flash_attention_2",
    "paged|flash_attention_3",
    "paged|flash_attention_4",
    "paged|sdpa",
)
# What from_pretrained(local_files_only=True) loads the weights from, one of them.
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_seed(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise StepPlannerTypeError(f"{field} must be an int, got {type(value).__name__} {value!r}")
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise StepPlannerValueError(
            f"{field}={value} is out of range; allowed: an integer in "
            f"[{low}, {high}] (torch.manual_seed's range)"
        )
    return value


def attention_implementations() -> tuple[str, ...]:
    """The attention names transformers accepts: its own table when it can be imported (a
    kernel registered there counts), else ``ATTENTION_IMPLEMENTATIONS``."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return ATTENTION_IMPLEMENTATIONS
    return tuple(sorted({"eager", *AttentionInterface()}))


def check_attn_implementation(field: str, value: Any) -> str:
    """One of ``attention_implementations()``. A hub kernel (``org/repo``), which transformers
    would download, is refused with the rest: serve-trace downloads nothing."""
    if not isinstance(value, str):
        raise StepPlannerTypeError(f"{field} must be a str, got {type(value).__name__}")
    names = attention_implementations()
    if value not in names:
        raise StepPlannerValueError(
            f"{field}={value!r} is not an attention implementation "
            f"transformers accepts; allowed: {', '.join(names)}"
        )
    return value


def check_model_dir(field: str, path: Any) -> str:
    """A local directory ``save_pretrained`` wrote: its config.json and its weights."""
    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise StepPlannerValueError(
            f"{field}={str(path)!r} is not a directory; allowed: a local "
            "model directory (nothing is downloaded)"
        )
    if not (folder / "config.json").is_file():
        missing = "config.json"
    elif not any((folder / name).is_file() for name in _WEIGHT_FILES):
        missing = f"weights ({' or '.join(_WEIGHT_FILES)})"
    else:
        return str(path)
    raise StepPlannerValueError(
        f"{field}={str(path)!r} is not a model directory: it holds no "
        f"{missing}; allowed: a directory save_pretrained wrote"
    )
